import json
import logging
import os
import pickle

import pytest
import torch
import torchvision
from torch import nn

from detectron.checkpoint.centernet_weights import (centernet_key_to_ours, load_centernet_checkpoint,
                                                    load_imagenet_backbone)
from detectron.checkpoint.weights_fit import check_weights_fit
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.utils.errors import ConfigValueError, WeightsError

with open(os.path.join(os.path.dirname(__file__), '..', 'modeling', 'data',
                       'centernet_reference_keys.json')) as _f:
    REFERENCE_KEYS = json.load(_f)  # CenterNet's own state_dict keys and shapes per arch
HEADS = {'hm': 80, 'wh': 2, 'reg': 2}


class _Heads(nn.Module):
    """Stand-in for CenterNetHeads: hm/wh/reg = conv3x3 -> ReLU -> conv1x1."""

    def __init__(self, channels, head_conv, heads=HEADS):
        super().__init__()
        for name, outputs in heads.items():
            setattr(self, name, nn.Sequential(
                nn.Conv2d(channels, head_conv, 3, padding=1), nn.ReLU(inplace=True),
                nn.Conv2d(head_conv, outputs, 1)))


class _CenterNet(nn.Module):
    """Stand-in for CenterNet(backbone, heads): exactly the children `backbone` and `heads`."""

    def __init__(self, arch, heads=HEADS):
        super().__init__()
        self.backbone = build_centernet_backbone(arch)
        head_conv = 256 if arch.startswith('dla') else 64
        self.heads = _Heads(self.backbone.out_channels, head_conv, heads)


def _random_tensors(table, seed=0):
    """{key: random tensor of the table's shape}; BN counters get random integers."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in table:
        if key.endswith('num_batches_tracked'):
            out[key] = torch.randint(1, 10 ** 6, shape, generator=g)
        else:
            out[key] = torch.randn(shape, generator=g)
    return out


def _expected_our_key(reference_key):
    # The rule: CenterNet's heads sit at the model's top level, everything else is the backbone.
    return ('heads.' if reference_key.split('.')[0] in HEADS else 'backbone.') + reference_key


def _zero(model):
    """Zero every tensor, so that a value found after loading came from the file."""
    model.load_state_dict({k: torch.zeros_like(v) for k, v in model.state_dict().items()})


def _save(path, obj, **kwargs):
    torch.save(obj, str(path), **kwargs)
    return str(path)


@pytest.fixture(scope='module')
def reference_state():
    """Random tensors under CenterNet's own keys and shapes, per arch (copy before editing)."""
    return {arch: _random_tensors(REFERENCE_KEYS[arch], seed=seed)
            for seed, arch in enumerate(('resdcn_18', 'dla_34', 'dla34_imagenet'))}


@pytest.fixture(scope='module')
def models():
    torch.manual_seed(0)
    return {arch: _CenterNet(arch) for arch in ('resdcn_18', 'dla_34')}


@pytest.mark.parametrize('arch', ['resdcn_18', 'dla_34'])
@pytest.mark.parametrize('prefix', ['', 'module.'])
def test_reference_checkpoint_lands_tensor_for_tensor(models, reference_state, tmp_path, arch,
                                                      prefix):
    model = models[arch]
    _zero(model)
    reference = reference_state[arch]
    path = _save(tmp_path / 'model_last.pth',
                 {'epoch': 140, 'state_dict': {prefix + k: v for k, v in reference.items()}})
    missing, unused = load_centernet_checkpoint(model, path)
    assert missing == []
    # CenterNet's DLA keeps the ImageNet classifier it never runs; the port has no place for it.
    assert unused == (['base.fc.bias', 'base.fc.weight'] if arch == 'dla_34' else [])
    ours = model.state_dict()
    placed = {_expected_our_key(k) for k in reference} & set(ours)
    assert placed == set(ours)
    for key, value in reference.items():
        if _expected_our_key(key) in ours:
            assert torch.equal(ours[_expected_our_key(key)], value), key


def test_bare_and_legacy_format_state_dicts_load(models, reference_state, tmp_path):
    model = models['resdcn_18']
    reference = reference_state['resdcn_18']
    # CenterNet's zoo files were written by PyTorch 0.4 (no zip container).
    for obj, kwargs in ((reference, {}), ({'epoch': 70, 'state_dict': reference},
                                          {'_use_new_zipfile_serialization': False})):
        path = _save(tmp_path / 'w.pth', obj, **kwargs)
        _zero(model)
        assert load_centernet_checkpoint(model, path) == ([], [])
        assert torch.equal(model.state_dict()['backbone.deconv_layers.0.conv_offset_mask.weight'],
                           reference['deconv_layers.0.conv_offset_mask.weight'])
        assert torch.equal(model.state_dict()['heads.wh.2.bias'], reference['wh.2.bias'])


def test_missing_and_unused_are_reported_and_logged(models, reference_state, tmp_path, caplog):
    model = models['resdcn_18']
    _zero(model)
    reference = dict(reference_state['resdcn_18'])
    for key in ('hm.2.bias', 'deconv_layers.1.running_var', 'layer1.0.bn1.num_batches_tracked'):
        del reference[key]
    reference['extra_head.weight'] = torch.zeros(3)
    reference['module.reg.0.weight'] = reference.pop('reg.0.weight')
    path = _save(tmp_path / 'w.pth', {'epoch': 1, 'state_dict': reference})
    with caplog.at_level(logging.INFO, logger='detectron.checkpoint.centernet_weights'):
        missing, unused = load_centernet_checkpoint(model, path)
    # In model order; BN step counters are never reported.
    assert missing == ['backbone.deconv_layers.1.running_var', 'heads.hm.2.bias']
    assert unused == ['extra_head.weight']
    ours = model.state_dict()
    assert torch.count_nonzero(ours['heads.hm.2.bias']) == 0  # kept its value
    assert torch.count_nonzero(ours['backbone.deconv_layers.1.running_var']) == 0
    assert torch.equal(ours['heads.reg.0.weight'], reference['module.reg.0.weight'])
    # 177 reference tensors - 3 removed = 174 loaded.
    assert ('Loaded 174 tensors of CenterNet checkpoint {} (epoch 1); 2 model tensors not in it '
            '(keep their init): backbone.deconv_layers.1.running_var, heads.hm.2.bias; 1 file '
            'tensors unused: extra_head.weight'.format(path)) in caplog.text


@pytest.mark.parametrize('key,shape,cause', [
    ('hm.2.weight', (20, 64, 1, 1), 'a different number of classes (20 in the file, 80 in the '
                                    'model): check CENTERNET.NUM_CLASSES'),
    ('wh.2.bias', (160,), 'CENTERNET.CAT_SPEC_WH'),
    ('reg.0.weight', (256, 64, 3, 3), 'CENTERNET.HEAD_CONV'),
    ('layer1.0.conv1.weight', (64, 64, 1, 1), 'a checkpoint of another backbone: check '
                                              'CENTERNET.ARCH'),
])
def test_a_tensor_of_another_shape_is_skipped_with_one_warning_as_load_model_does(
        models, reference_state, tmp_path, caplog, key, shape, cause):
    # CenterNet's load_model: "Skip loading parameter ..." and the model's own tensor stays (how a
    # COCO model is fine-tuned to other classes); every other tensor loads.
    model = models['resdcn_18']
    ours_key = _expected_our_key(key)
    before = model.state_dict()[ours_key].clone()
    reference = dict(reference_state['resdcn_18'])
    model_shape = tuple(reference[key].shape)
    reference[key] = torch.zeros(shape)
    path = _save(tmp_path / 'w.pth', {'epoch': 1, 'state_dict': reference})
    with caplog.at_level(logging.WARNING, logger='detectron.checkpoint.centernet_weights'):
        missing, unused = load_centernet_checkpoint(model, path)
    assert (missing, unused) == ([ours_key], [])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and '\n' not in warnings[0]
    assert warnings[0].startswith('{}: {} has shape {} in the file but {} in the model ({}); likely'.format(
        path, key, shape, model_shape, ours_key))
    assert cause in warnings[0] and warnings[0].endswith(': skipped, it keeps its init')
    ours = model.state_dict()
    assert torch.equal(ours[ours_key], before)
    assert all(torch.equal(ours[_expected_our_key(k)], v) for k, v in reference.items() if k != key
               and _expected_our_key(k) in ours)


def test_unreadable_files_are_one_line_weights_errors(models, tmp_path):
    model = models['resdcn_18']
    text = tmp_path / 'notes.pth'
    text.write_text('not a checkpoint\n')
    listed = _save(tmp_path / 'list.pth', [torch.zeros(1)])
    with open(tmp_path / 'unsafe.pkl', 'wb') as f:
        # A global that weights_only refuses to unpickle.
        pickle.dump({'weight': os.getcwd}, f, protocol=2)
    # The reader of every weights file (checkpoint/torch_file.py), with its wording.
    cases = [(str(text), 'is not a readable torch file'),
             (str(tmp_path / 'unsafe.pkl'), 'contains code objects'),
             (str(tmp_path / 'absent.pth'), 'does not exist'),
             (listed, 'does not hold a CenterNet checkpoint')]
    for path, expected in cases:
        with pytest.raises(WeightsError) as err:
            load_centernet_checkpoint(model, path)
        assert expected in str(err.value) and path in str(err.value)
        assert '\n' not in str(err.value)


def test_a_file_matching_nothing_is_refused_by_the_fit_check(models, tmp_path):
    path = _save(tmp_path / 'w.pth', {'fc.weight': torch.zeros(2)})
    model = models['resdcn_18']
    missing, unused = load_centernet_checkpoint(model, path)
    assert unused == ['fc.weight']
    total = sum(not k.endswith('num_batches_tracked') for k in model.state_dict())
    assert len(missing) == total
    with pytest.raises(WeightsError) as err:
        check_weights_fit(model, path, missing, unused, 'centernet')
    assert str(err.value).startswith('{} fills 0 of the {} tensors of the centernet model: it holds tensors '
                                     'such as fc.weight; set TRAIN.WEIGHTS'.format(path, total))


def test_key_mapping_rule():
    assert centernet_key_to_ours('module.hm.0.weight') == 'heads.hm.0.weight'
    assert centernet_key_to_ours('reg.2.bias') == 'heads.reg.2.bias'
    assert centernet_key_to_ours('wh.0.bias') == 'heads.wh.0.bias'
    assert centernet_key_to_ours('base.level0.0.weight') == 'backbone.base.level0.0.weight'
    assert centernet_key_to_ours('module.deconv_layers.0.bias') == 'backbone.deconv_layers.0.bias'
    # Only a top-level head name is a head.
    assert centernet_key_to_ours('hmx.0.weight') == 'backbone.hmx.0.weight'


# ---------------------------------------------------------------------------------------------
# ImageNet files
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('arch,tv_model', [('resdcn_18', 'resnet18'), ('res_18', 'resnet18'),
                                           ('resdcn_50', 'resnet50')])
def test_torchvision_resnet_loads_into_resnet_backbones(tmp_path, arch, tv_model):
    torch.manual_seed(1)
    tv_state = getattr(torchvision.models, tv_model)(weights=None).state_dict()
    # torchvision's files of 2017 (resnet18-5c106cde.pth) have no BN step counters.
    tv_state = {k: v for k, v in tv_state.items() if not k.endswith('num_batches_tracked')}
    path = _save(tmp_path / '{}.pth'.format(tv_model), tv_state)
    backbone = build_centernet_backbone(arch)
    missing, unused = load_imagenet_backbone(backbone, path, arch)
    assert unused == ['fc.bias', 'fc.weight']
    ours = backbone.state_dict()
    assert missing == [k for k in ours if k.startswith('deconv_layers.')
                       and not k.endswith('num_batches_tracked')]
    # Per stage: DCN (weight, bias, offset conv weight and bias) + BN (4) + deconv + BN (4) = 13,
    # or deconv + BN = 5; BN counters are not reported.
    assert len(missing) == (3 * 13 if arch.startswith('resdcn') else 3 * 5)
    for key, value in tv_state.items():
        if not key.startswith('fc.'):
            assert torch.equal(ours[key], value), key


def test_wrong_depth_imagenet_files_are_errors(tmp_path):
    path = _save(tmp_path / 'resnet18.pth', torchvision.models.resnet18(weights=None).state_dict())
    # ResNet-34 has 8 more BasicBlocks (1 + 2 + 4 + 1) of 10 tensors each, counters aside.
    with pytest.raises(WeightsError, match=r'lacks 80 tensors of the resdcn_34 ImageNet trunk '
                                           r'\(e\.g\. layer1\.2\.conv1\.weight\)'):
        load_imagenet_backbone(build_centernet_backbone('resdcn_34'), path, 'resdcn_34')
    with pytest.raises(WeightsError) as err:
        load_imagenet_backbone(build_centernet_backbone('resdcn_50'), path, 'resdcn_50')
    assert 'layer1.0.conv1.weight has shape (64, 64, 3, 3) in the file but (64, 64, 1, 1)' in \
        str(err.value)
    assert "ImageNet weights of another trunk than resdcn_50's: check CENTERNET.ARCH" in \
        str(err.value)


def test_dla34_imagenet_file_loads_into_the_dla_base(reference_state, tmp_path, caplog):
    imagenet = reference_state['dla34_imagenet']
    assert {'fc.weight', 'fc.bias', 'base_layer.0.weight', 'level5.root.conv.weight'} <= \
        set(imagenet)
    path = _save(tmp_path / 'dla34-ba72cf86.pth', imagenet)
    backbone = build_centernet_backbone('dla_34')
    with caplog.at_level(logging.INFO, logger='detectron.checkpoint.centernet_weights'):
        missing, unused = load_imagenet_backbone(backbone, path, 'dla_34')
    assert unused == ['fc.bias', 'fc.weight']
    ours = backbone.state_dict()
    assert missing == [k for k in ours if k.startswith(('dla_up.', 'ida_up.'))
                       and not k.endswith('num_batches_tracked')]
    for key, value in imagenet.items():
        if not key.startswith('fc.'):
            assert torch.equal(ours['base.' + key], value), key
    assert '2 file tensors unused: fc.bias, fc.weight' in caplog.text


def test_imagenet_loader_rejects_an_unknown_arch(tmp_path):
    with pytest.raises(ConfigValueError, match='CENTERNET.ARCH'):
        load_imagenet_backbone(nn.Conv2d(1, 1, 1), str(tmp_path / 'x.pth'), 'hourglass')
