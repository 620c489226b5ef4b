import logging
import os
import pickle
import runpy
import struct

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

from detectron.checkpoint.c2_weights import (TORCHVISION_PIXEL_MEANS_BGR, TORCHVISION_RGB_MEAN, TORCHVISION_RGB_STD,
                                             convert_detectron_blobs, detectron_blobs_to_state_dict,
                                             key_to_detectron_name, last_block_per_stage, load_detectron_weights,
                                             load_torchvision_resnet, load_weights, read_detectron_pickle,
                                             state_dict_to_detectron_blobs)
from detectron.modeling.FPN import (
    add_fpn_ResNet18_conv5_body, add_fpn_ResNet50_conv5_body, add_fpn_ResNet101_conv5_body)
from detectron.modeling.ResNet import ResNet
from detectron.utils.errors import WeightsError
from detectron.utils.io import save_object

TOOL = os.path.join(os.path.dirname(__file__), '..', '..', 'tools', 'convert_pkl_to_pth.py')
CFG_YAML = 'MODEL:\n  NUM_CLASSES: 81\nPRED_STD: true\n'
# (stage, blocks, bottleneck width, output width) of R-50; Detectron ResNet.py.
R50_STAGES = ((2, 3, 64, 256), (3, 4, 128, 512), (4, 6, 256, 1024), (5, 3, 512, 2048))


def _conv_and_affine(entries, blob, key, shape):
    entries.append((blob + '_w', key + '.weight', shape))
    entries.append((blob + '_bn_s', key + '_bn.weight', shape[:1]))
    entries.append((blob + '_bn_b', key + '_bn.bias', shape[:1]))


def _param(entries, blob, key, shape):
    entries.append((blob + '_w', key + '.weight', shape))
    entries.append((blob + '_b', key + '.bias', shape[:1]))


def kl_loss_r50_fpn_blobs():
    """(Detectron blob, our key, shape) of every parameter of KL-Loss's R-50-FPN Faster R-CNN,
    written out from kl_loss.md section 8 / detectron.md section 6 and docs/DESIGN.md."""
    entries = [('conv1_w', 'conv_body.body.conv1.weight', (64, 3, 7, 7)),
               ('res_conv1_bn_s', 'conv_body.body.res_conv1_bn.weight', (64,)),
               ('res_conv1_bn_b', 'conv_body.body.res_conv1_bn.bias', (64,))]
    dim_in = 64
    for stage, blocks, inner, out in R50_STAGES:
        for i in range(blocks):
            blob, key = 'res{}_{}_'.format(stage, i), 'conv_body.body.res{}.{}.'.format(stage, i)
            block_in = dim_in if i == 0 else out
            _conv_and_affine(entries, blob + 'branch2a', key + 'branch2a', (inner, block_in, 1, 1))
            _conv_and_affine(entries, blob + 'branch2b', key + 'branch2b', (inner, inner, 3, 3))
            _conv_and_affine(entries, blob + 'branch2c', key + 'branch2c', (out, inner, 1, 1))
            if i == 0:
                _conv_and_affine(entries, blob + 'branch1', key + 'branch1', (out, dim_in, 1, 1))
        dim_in = out
    for level, (stage, blocks, _, out) in enumerate(R50_STAGES):
        lateral = '' if stage == 5 else '_lateral'
        _param(entries, 'fpn_inner_res{}_{}_sum{}'.format(stage, blocks - 1, lateral),
               'conv_body.fpn_inner.{}'.format(level), (256, out, 1, 1))
        _param(entries, 'fpn_res{}_{}_sum'.format(stage, blocks - 1),
               'conv_body.fpn_layer.{}'.format(level), (256, 256, 3, 3))
    for name, out, kernel in (('conv_rpn', 256, 3), ('rpn_cls_logits', 3, 1),
                              ('rpn_bbox_pred', 12, 1)):
        _param(entries, name + '_fpn2', 'rpn.' + name, (out, 256, kernel, kernel))
    for module, name, out, dim in (('box_head', 'fc6', 1024, 256 * 7 * 7),
                                   ('box_head', 'fc7', 1024, 1024),
                                   ('box_outs', 'cls_score', 81, 1024),
                                   ('box_outs', 'bbox_pred', 324, 1024),
                                   ('box_outs', 'bbox_pred_std', 324, 1024)):
        _param(entries, name, module + '.' + name, (out, dim))
    return entries


class DetectorContainer(nn.Module):
    """The parameter layout of the port's Faster R-CNN (docs/DESIGN.md), from plain layers."""

    def __init__(self):
        super().__init__()
        self.conv_body = add_fpn_ResNet50_conv5_body()
        self.rpn = nn.Module()
        self.rpn.conv_rpn = nn.Conv2d(256, 256, 3, padding=1)
        self.rpn.rpn_cls_logits = nn.Conv2d(256, 3, 1)
        self.rpn.rpn_bbox_pred = nn.Conv2d(256, 12, 1)
        self.box_head = nn.Module()
        self.box_head.fc6 = nn.Linear(256 * 7 * 7, 1024)
        self.box_head.fc7 = nn.Linear(1024, 1024)
        self.box_outs = nn.Module()
        self.box_outs.cls_score = nn.Linear(1024, 81)
        self.box_outs.bbox_pred = nn.Linear(1024, 324)
        self.box_outs.bbox_pred_std = nn.Linear(1024, 324)


ENTRIES = kl_loss_r50_fpn_blobs()


@pytest.fixture(scope='module')
def blobs():
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape, dtype=np.float32) for name, _, shape in ENTRIES}


@pytest.fixture(scope='module')
def model_final_pkl(tmp_path_factory, blobs):
    """A Detectron model_final.pkl: params, momentum of trainable params, ImageNet leftovers."""
    file_blobs = dict(blobs)
    for name, _, shape in ENTRIES:
        if not (name.startswith(('conv1', 'res2_')) or '_bn_' in name):
            file_blobs[name + '_momentum'] = np.zeros(shape, np.float32)
    file_blobs.update(fc1000_w=np.zeros((1000, 2048), np.float32),
                      fc1000_b=np.zeros(1000, np.float32), conv1_b=np.zeros(64, np.float32))
    path = tmp_path_factory.mktemp('weights') / 'model_final.pkl'
    save_object({'blobs': file_blobs, 'cfg': CFG_YAML}, str(path))
    return str(path)


@pytest.fixture(scope='module')
def container():
    return DetectorContainer()


def _assert_holds_blobs(model, blobs):
    state = model.state_dict()
    for name, key, _ in ENTRIES:
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), key


def test_reference_list_has_the_documented_counts():
    assert len(ENTRIES) == 191
    assert sum(int(np.prod(shape)) for _, _, shape in ENTRIES) == 42089256


def test_model_final_pkl_loads_every_blob(container, model_final_pkl, blobs):
    assert sorted(container.state_dict()) == sorted(key for _, key, _ in ENTRIES)
    missing, unused = load_detectron_weights(container, model_final_pkl)
    assert missing == [] and unused == []
    _assert_holds_blobs(container, blobs)
    # The inverse gives back exactly the Detectron blobs.
    back = state_dict_to_detectron_blobs(container.state_dict())
    assert sorted(back) == sorted(name for name, _, _ in ENTRIES)
    for name, array in back.items():
        np.testing.assert_array_equal(array, blobs[name])


def test_every_blob_converts_to_its_key_without_a_model(blobs):
    state, ignored, unconverted = convert_detectron_blobs(
        dict(blobs, fc1000_w=np.zeros(2, np.float32), res5_2_branch2c_w_momentum=np.zeros(1),
             mask_fcn1_w=np.zeros(1)))
    assert list(state) == [key for _, key, _ in ENTRIES]
    assert ignored == ['fc1000_w', 'res5_2_branch2c_w_momentum'] and unconverted == ['mask_fcn1_w']
    assert state['box_outs.bbox_pred_std.bias'].dtype == torch.float32


def _rpn_only_model():
    model = nn.Module()
    model.rpn = nn.Module()
    model.rpn.conv_rpn = nn.Conv2d(256, 256, 3, padding=1)
    model.rpn.rpn_cls_logits = nn.Conv2d(256, 3, 1)
    model.rpn.rpn_bbox_pred = nn.Conv2d(256, 12, 1)
    return model


def test_convert_tool_writes_a_pth_that_loads(blobs, tmp_path, capsys):
    rpn_blobs = {n: blobs[n] for n, key, _ in ENTRIES if key.startswith('rpn.')}
    file_blobs = dict(rpn_blobs, conv_rpn_fpn2_w_momentum=np.zeros((256, 256, 3, 3), np.float32),
                      fc1000_b=np.zeros(1000, np.float32), mask_fcn1_w=np.zeros(1, np.float32))
    pkl, pth = str(tmp_path / 'rpn.pkl'), str(tmp_path / 'rpn.pth')
    save_object({'blobs': file_blobs, 'cfg': CFG_YAML}, pkl)
    runpy.run_path(TOOL, run_name='convert')['main']([pkl, pth])
    printed = capsys.readouterr().out
    assert 'converted 6 blobs' in printed and 'ignored 2 blobs' in printed
    assert 'not converted (1, no counterpart in the port): mask_fcn1_w' in printed
    content = torch.load(pth, weights_only=True)
    assert content['cfg'] == CFG_YAML
    model = _rpn_only_model()
    assert load_weights(model, pth) == ([], [])
    assert torch.equal(model.rpn.rpn_bbox_pred.bias, torch.from_numpy(blobs['rpn_bbox_pred_fpn2_b']))


def test_missing_and_unused_blobs_are_reported(container, blobs):
    partial = {n: b for n, b in blobs.items() if n != 'bbox_pred_std_w'}
    partial['mask_fcn1_w'] = np.zeros((256, 256, 3, 3), np.float32)
    missing, unused = load_detectron_weights(container, {'blobs': partial, 'cfg': CFG_YAML})
    assert missing == ['box_outs.bbox_pred_std.weight']
    assert unused == ['mask_fcn1_w']


def test_shape_mismatch_names_our_key_and_the_blob(container):
    with pytest.raises(WeightsError, match=r'box_head.fc7.weight \(blob fc7_w\) \(2, 1024\) in file vs '
                                           r'\(1024, 1024\) in model'):
        load_detectron_weights(container, {'fc7_w': np.zeros((2, 1024), np.float32)})


def test_imagenet_pkl_loads_into_a_bare_body(blobs):
    body = ResNet(50)
    flat = {name: blobs[name] for name, key, _ in ENTRIES if key.startswith('conv_body.body.')}
    flat.update(fc1000_w=np.zeros((1000, 2048), np.float32), fc1000_b=np.zeros(1000, np.float32),
                conv1_b=np.zeros(64, np.float32))
    assert load_detectron_weights(body, flat) == ([], [])
    assert torch.equal(body.res4[5].branch2c_bn.bias, torch.from_numpy(flat['res4_5_branch2c_bn_b']))


def test_r101_fpn_names_use_the_last_block_of_res4():
    model = nn.Module()
    model.conv_body = add_fpn_ResNet101_conv5_body()
    keys = list(model.state_dict())
    last = last_block_per_stage(keys)
    assert last == {2: 2, 3: 3, 4: 22, 5: 2}
    names = {key_to_detectron_name(k, last) for k in keys if 'fpn' in k}
    assert names == {
        'fpn_inner_res5_2_sum_w', 'fpn_inner_res5_2_sum_b',
        'fpn_inner_res4_22_sum_lateral_w', 'fpn_inner_res4_22_sum_lateral_b',
        'fpn_inner_res3_3_sum_lateral_w', 'fpn_inner_res3_3_sum_lateral_b',
        'fpn_inner_res2_2_sum_lateral_w', 'fpn_inner_res2_2_sum_lateral_b',
        'fpn_res5_2_sum_w', 'fpn_res5_2_sum_b', 'fpn_res4_22_sum_w', 'fpn_res4_22_sum_b',
        'fpn_res3_3_sum_w', 'fpn_res3_3_sum_b', 'fpn_res2_2_sum_w', 'fpn_res2_2_sum_b'}
    # An R-50 name does not load into R-101.
    state, unused = detectron_blobs_to_state_dict(
        {'fpn_inner_res4_5_sum_lateral_w': np.zeros((256, 1024, 1, 1), np.float32)}, keys)
    assert state == {} and unused == ['fpn_inner_res4_5_sum_lateral_w']


def test_bn_model_round_trips_through_a_detectron_file(tmp_path):
    torch.manual_seed(0)
    source = nn.Module()
    source.conv_body = add_fpn_ResNet18_conv5_body(norm='bn')
    with torch.no_grad():
        for tensor in source.state_dict().values():
            tensor.copy_(torch.randint_like(tensor, 1, 100))
    blobs = state_dict_to_detectron_blobs(source.state_dict())
    assert 'res3_1_branch2b_bn_s' in blobs and 'fpn_inner_res5_1_sum_w' in blobs
    # BatchNorm statistics have no Detectron name and keep their own.
    assert 'conv_body.body.res3.1.branch2b_bn.running_var' in blobs
    path = str(tmp_path / 'model.pkl')
    save_object({'blobs': blobs, 'cfg': CFG_YAML}, path)
    file_blobs, cfg_yaml = read_detectron_pickle(path)
    assert cfg_yaml == CFG_YAML and sorted(file_blobs) == sorted(blobs)
    target = nn.Module()
    target.conv_body = add_fpn_ResNet18_conv5_body(norm='bn')
    assert load_weights(target, path) == ([], [])
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, ('touch {}'.format(self.marker),)


def test_code_running_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pkl'
    path.write_bytes(pickle.dumps({'blobs': {'conv1_w': _RunsShell(marker)}}, protocol=2))
    for load in (load_weights, load_detectron_weights):
        with pytest.raises(WeightsError, match=r'refusing to unpickle (posix|nt)\.system'):
            load(ResNet(18), str(path))
    assert not marker.exists()


def test_python2_numpy_pickle_loads(tmp_path):
    data = struct.pack('<3f', 1.5, -2.0, 0.25)  # bytes >= 0x80 exercise the latin1 decoding
    # What Python 2 numpy wrote: numpy.core module path, array data as a byte string.
    pkl = (b'\x80\x02}U\x0bres_conv1_bcnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n'
           b'K\x00\x85U\x01b\x87R(K\x01K\x03\x85cnumpy\ndtype\nU\x02f4K\x00K\x01\x87R'
           b'(K\x03U\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89U\x0c' + data + b'tbs.')
    path = tmp_path / 'py2.pkl'
    path.write_bytes(pkl)
    blobs, cfg_yaml = read_detectron_pickle(str(path))
    assert cfg_yaml is None
    np.testing.assert_array_equal(blobs['res_conv1_b'], np.array([1.5, -2.0, 0.25], np.float32))


def _randomize_batch_norms(model, generator):
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0.0, 0.1, generator=generator)
                module.running_mean.normal_(0.0, 0.1, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)


def _torchvision_features(tv_model, rgb):
    features = []
    hooks = [getattr(tv_model, 'layer{}'.format(i)).register_forward_hook(
        lambda module, inputs, output: features.append(output)) for i in range(1, 5)]
    mean = torch.tensor(TORCHVISION_RGB_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(TORCHVISION_RGB_STD).view(1, 3, 1, 1)
    tv_model((rgb / 255.0 - mean) / std)
    for hook in hooks:
        hook.remove()
    return features


def _port_input(rgb):
    return rgb.flip(1) - torch.tensor(TORCHVISION_PIXEL_MEANS_BGR).view(1, 3, 1, 1)


def test_torchvision_pixel_means_are_its_mean_in_bgr_255():
    assert TORCHVISION_PIXEL_MEANS_BGR == pytest.approx((103.53, 116.28, 123.675))


def test_torchvision_resnet50_features_are_reproduced():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    tv_model = torchvision.models.resnet50()
    _randomize_batch_norms(tv_model, gen)
    tv_model.eval()
    ours = ResNet(50, stride_1x1=False, freeze_at=0).eval()
    assert load_torchvision_resnet(ours, tv_model.state_dict()) == ([], ['fc.bias', 'fc.weight'])
    rgb = torch.randint(0, 256, (1, 3, 64, 96), generator=gen).float()
    with torch.no_grad():
        expected = _torchvision_features(tv_model, rgb)
        outputs = ours(_port_input(rgb))
    for out, ref in zip(outputs, expected):
        assert out.shape == ref.shape
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-4


def test_torchvision_resnet18_file_loads_into_an_fpn_model(tmp_path):
    gen = torch.Generator().manual_seed(1)
    tv_model = torchvision.models.resnet18()
    _randomize_batch_norms(tv_model, gen)
    tv_model.eval()
    path = str(tmp_path / 'resnet18.pth')
    torch.save(tv_model.state_dict(), path)
    model = nn.Module()
    model.conv_body = add_fpn_ResNet18_conv5_body()
    missing, unused = load_weights(model, path)
    assert missing == [k for k in model.state_dict() if 'fpn_' in k]
    assert unused == ['fc.bias', 'fc.weight']
    # Hand-computed fold of one BatchNorm: scale = gamma / sqrt(var + 1e-5), bias = beta - mean * scale.
    bn = tv_model.layer3[1].bn2
    scale = bn.weight / torch.sqrt(bn.running_var + 1e-5)
    affine = model.conv_body.body.res4[1].branch2b_bn
    assert torch.allclose(affine.weight, scale) and torch.allclose(
        affine.bias, bn.bias - bn.running_mean * scale)
    rgb = torch.randint(0, 256, (1, 3, 64, 64), generator=gen).float()
    with torch.no_grad():
        expected = _torchvision_features(tv_model, rgb)
        outputs = model.conv_body.body.eval()(_port_input(rgb))
    for out, ref in zip(outputs, expected):
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-4


def test_torchvision_batch_norms_copy_into_a_bn_body():
    tv_model = torchvision.models.resnet18()
    _randomize_batch_norms(tv_model, torch.Generator().manual_seed(2))
    ours = ResNet(18, norm='bn')
    load_torchvision_resnet(ours, tv_model.state_dict())
    assert torch.equal(ours.res5[0].branch1_bn.running_var, tv_model.layer4[0].downsample[1].running_var)


def test_torchvision_bottlenecks_need_stride_on_the_3x3():
    with pytest.raises(WeightsError, match='stride_1x1=False'):
        load_torchvision_resnet(ResNet(50), torchvision.models.resnet50().state_dict())


def test_port_checkpoint_loads_by_key_and_bad_files_are_weights_errors(tmp_path):
    source, target = ResNet(18), ResNet(18)
    with torch.no_grad():
        source.res_conv1_bn.bias.fill_(3.0)
    path = str(tmp_path / 'model_iter9.pth')
    torch.save({'model': source.state_dict(), 'iteration': 9}, path)
    assert load_weights(target, path) == ([], [])
    assert torch.equal(target.res_conv1_bn.bias, torch.full((64,), 3.0))
    junk = str(tmp_path / 'junk.pth')
    torch.save([1, 2], junk)
    with pytest.raises(WeightsError, match='neither'):
        load_weights(target, junk)
    with pytest.raises(WeightsError, match='does not exist'):
        load_weights(target, str(tmp_path / 'absent.pkl'))


def test_ignored_blobs_are_logged_with_counts_and_names(container, model_final_pkl, caplog):
    # The fixture's file: a momentum blob for every parameter outside conv1, res2 and the affines,
    # plus ImageNet's fc1000_w, fc1000_b and conv1_b.
    momentum = [name for name, _, _ in ENTRIES if not (name.startswith(('conv1', 'res2_')) or '_bn_' in name)]
    with caplog.at_level(logging.INFO, logger='detectron.checkpoint.c2_weights'):
        assert load_detectron_weights(container, model_final_pkl) == ([], [])
    line = next(r.getMessage() for r in caplog.records if 'not model tensors' in r.getMessage())
    assert line == ('{}: {} blobs are not model tensors: {} SGD momentum blobs (*_momentum; train_net loads them '
                    'into the optimizer, as Detectron), conv1_b, fc1000_b, fc1000_w'.format(
                        model_final_pkl, len(momentum) + 3, len(momentum)))


def r50_gn_fpn_blobs():
    """(Detectron blob, our key, shape) of Detectron's GroupNorm R-50-FPN body (04_2018_gn_baselines):
    ConvGN(prefix) makes `<prefix>_w` (no conv bias) and SpatialGN `<prefix>_gn_s` / `<prefix>_gn_b`
    (Detectron modeling/detector.py ConvGN, ResNet.py basic_gn_stem / bottleneck_gn_transformation /
    basic_gn_shortcut, FPN.py add_fpn with FPN.USE_GN)."""
    def conv_gn(entries, blob, key, norm_key, shape):
        entries.append((blob + '_w', key + '.weight', shape))
        entries.append((blob + '_gn_s', norm_key + '.weight', shape[:1]))
        entries.append((blob + '_gn_b', norm_key + '.bias', shape[:1]))

    entries = []
    conv_gn(entries, 'conv1', 'conv_body.body.conv1', 'conv_body.body.res_conv1_bn', (64, 3, 7, 7))
    dim_in = 64
    for stage, blocks, inner, out in R50_STAGES:
        for i in range(blocks):
            blob, key = 'res{}_{}_'.format(stage, i), 'conv_body.body.res{}.{}.'.format(stage, i)
            block_in = dim_in if i == 0 else out
            for branch, shape in (('branch2a', (inner, block_in, 1, 1)), ('branch2b', (inner, inner, 3, 3)),
                                  ('branch2c', (out, inner, 1, 1))) + ((('branch1', (out, dim_in, 1, 1)),)
                                                                         if i == 0 else ()):
                conv_gn(entries, blob + branch, key + branch, key + branch + '_bn', shape)
        dim_in = out
    for level, (stage, blocks, _, out) in enumerate(R50_STAGES):
        lateral = '' if stage == 5 else '_lateral'
        conv_gn(entries, 'fpn_inner_res{}_{}_sum{}'.format(stage, blocks - 1, lateral),
                'conv_body.fpn_inner.{}'.format(level), 'conv_body.fpn_inner_gn.{}'.format(level),
                (256, out, 1, 1))
        conv_gn(entries, 'fpn_res{}_{}_sum'.format(stage, blocks - 1), 'conv_body.fpn_layer.{}'.format(level),
                'conv_body.fpn_layer_gn.{}'.format(level), (256, 256, 3, 3))
    return entries


def test_group_norm_blobs_load_into_the_gn_modules():
    entries = r50_gn_fpn_blobs()
    model = nn.Module()
    model.conv_body = add_fpn_ResNet50_conv5_body(norm='gn', fpn_use_gn=True)
    assert sorted(model.state_dict()) == sorted(key for _, key, _ in entries)
    rng = np.random.default_rng(1)
    blobs = {name: rng.standard_normal(shape, dtype=np.float32) for name, _, shape in entries}
    assert load_detectron_weights(model, dict(blobs, conv1_b=np.zeros(64, np.float32))) == ([], [])
    state = model.state_dict()
    for name, key, _ in entries:
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), key
    # Without a model (tools/convert_pkl_to_pth.py) and back to Detectron's names.
    converted, ignored, unconverted = convert_detectron_blobs(blobs)
    assert dict(converted.items()).keys() == {key for _, key, _ in entries} and unconverted == []
    back = state_dict_to_detectron_blobs(state, norm='gn')
    assert sorted(back) == sorted(blobs)


def test_momentum_blobs_start_detectron_sgds_histories(blobs, tmp_path):
    # Detectron's initialize_gpu_from_weights_file feeds `<blob>_momentum` into the parameter's
    # momentum history; the first step is then v = 0.9 v_file + lr g, p -= v (Caffe2's form).
    from detectron.checkpoint.c2_weights import load_weights_and_momentum
    from detectron.modeling.optimizer import DetectronSGD, load_momentum
    rng = np.random.default_rng(1)
    rpn_blobs = {n: blobs[n] for n, key, _ in ENTRIES if key.startswith('rpn.')}
    history = {'conv_rpn_fpn2_w': rng.standard_normal((256, 256, 3, 3), dtype=np.float32),
               'rpn_bbox_pred_fpn2_b': rng.standard_normal(12, dtype=np.float32)}
    file_blobs = dict(rpn_blobs, **{name + '_momentum': value for name, value in history.items()})
    pkl = str(tmp_path / 'model_final.pkl')
    save_object({'blobs': file_blobs, 'cfg': CFG_YAML}, pkl)
    model = _rpn_only_model()
    model.rpn.rpn_bbox_pred.bias.requires_grad_(False)   # frozen: no history to restore
    _, _, momentum = load_weights_and_momentum(model, pkl)
    assert sorted(momentum) == ['rpn.conv_rpn.weight']
    assert torch.equal(momentum['rpn.conv_rpn.weight'], torch.from_numpy(history['conv_rpn_fpn2_w']))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = DetectronSGD([{'params': params}], lr=0.01, momentum=0.9)
    assert load_momentum(optimizer, model, momentum) == 1
    weight = model.rpn.conv_rpn.weight
    before = weight.detach().clone()
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    expected_v = 0.9 * torch.from_numpy(history['conv_rpn_fpn2_w']) + 0.01
    torch.testing.assert_close(weight.detach(), before - expected_v, rtol=0, atol=1e-6)
