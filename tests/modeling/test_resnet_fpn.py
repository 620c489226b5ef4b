import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from detectron.modeling.FPN import (
    FPNBody, add_fpn_ResNet18_conv5_body, add_fpn_ResNet34_conv5_body,
    add_fpn_ResNet50_conv5_body, add_fpn_ResNet101_conv5_body)
from detectron.modeling.norm import AffineChannel, group_norm_groups
from detectron.modeling.ResNet import ResNet
from detectron.utils.errors import ConfigValueError


def _randomize_affines(model, generator):
    for module in model.modules():
        if isinstance(module, AffineChannel):
            module.weight.uniform_(0.5, 1.5, generator=generator)
            module.bias.normal_(0.0, 0.1, generator=generator)


def _relative_error(actual, expected):
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# --- an independent, functional transcription of Detectron's ResNet.py (stem, bottleneck) ---

def _affine(x, sd, prefix):
    return x * sd[prefix + '.weight'].view(1, -1, 1, 1) + sd[prefix + '.bias'].view(1, -1, 1, 1)


def _reference_bottleneck(x, sd, p, stride, stride_1x1, projection):
    s1, s3 = (stride, 1) if stride_1x1 else (1, stride)
    y = F.relu(_affine(F.conv2d(x, sd[p + 'branch2a.weight'], stride=s1), sd, p + 'branch2a_bn'))
    y = F.relu(_affine(F.conv2d(y, sd[p + 'branch2b.weight'], stride=s3, padding=1), sd,
                       p + 'branch2b_bn'))
    y = _affine(F.conv2d(y, sd[p + 'branch2c.weight']), sd, p + 'branch2c_bn')
    shortcut = (_affine(F.conv2d(x, sd[p + 'branch1.weight'], stride=stride), sd, p + 'branch1_bn')
                if projection else x)
    return F.relu(y + shortcut)


def _reference_resnet50(image, sd, stride_1x1):
    x = F.relu(_affine(F.conv2d(image, sd['conv1.weight'], stride=2, padding=3), sd,
                       'res_conv1_bn'))
    x = F.max_pool2d(x, 3, stride=2, padding=1)
    outputs = []
    for stage, count in zip((2, 3, 4, 5), (3, 4, 6, 3)):
        for i in range(count):
            stride = 2 if (i == 0 and stage > 2) else 1
            x = _reference_bottleneck(x, sd, 'res{}.{}.'.format(stage, i), stride, stride_1x1,
                                      projection=(i == 0))
        outputs.append(x)
    return outputs


@pytest.mark.parametrize('stride_1x1', [True, False])
def test_resnet50_equals_functional_transcription(stride_1x1):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = ResNet(50, stride_1x1=stride_1x1).eval()
    with torch.no_grad():
        _randomize_affines(model, gen)
        image = torch.randn(1, 3, 64, 96, generator=gen) * 50
        outputs = model(image)
        expected = _reference_resnet50(image, model.state_dict(), stride_1x1)
    assert [tuple(o.shape) for o in outputs] == [
        (1, 256, 16, 24), (1, 512, 8, 12), (1, 1024, 4, 6), (1, 2048, 2, 3)]
    for out, ref in zip(outputs, expected):
        assert _relative_error(out, ref) < 1e-5


def test_resnet_channels_strides_and_block_counts():
    r18, r34, r101 = ResNet(18), ResNet(34), ResNet(101)
    assert r18.out_channels == (64, 128, 256, 512) == r34.out_channels
    assert r101.out_channels == (256, 512, 1024, 2048)
    assert r18.strides == (4, 8, 16, 32)
    assert [len(getattr(r34, s)) for s in ('res2', 'res3', 'res4', 'res5')] == [3, 4, 6, 3]
    assert [len(getattr(r101, s)) for s in ('res2', 'res3', 'res4', 'res5')] == [3, 4, 23, 3]
    # Basic blocks: projection only where the width changes; the stride sits on branch2a.
    assert not hasattr(r18.res2[0], 'branch1')
    assert r18.res3[0].branch1.stride == (2, 2) and r18.res3[0].branch2a.stride == (2, 2)
    assert r18.res3[0].branch2a.weight.shape == (128, 64, 3, 3)


def test_resnet_conv_init_is_caffe2_xavier():
    torch.manual_seed(0)
    conv = ResNet(50).res4[0].branch2b  # 256 x 256 x 3 x 3
    bound = math.sqrt(3.0 / (256 * 9))
    assert conv.weight.abs().max() <= bound
    assert conv.weight.abs().max() > 0.99 * bound
    assert conv.bias is None


def test_affine_channel_is_frozen_state():
    model = ResNet(18)
    names = dict(model.named_parameters())
    assert not any('_bn' in n for n in names)
    state = model.state_dict()
    assert state['res2.0.branch2a_bn.weight'].shape == (64,)
    layer = AffineChannel(2)
    layer.weight.copy_(torch.tensor([2.0, -1.0]))
    layer.bias.copy_(torch.tensor([0.5, 3.0]))
    x = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    assert layer(x).flatten().tolist() == [2.5, 1.0]


@pytest.mark.parametrize('freeze_at, frozen', [
    (0, ()), (2, ('conv1', 'res2')), (4, ('conv1', 'res2', 'res3', 'res4')),
    (5, ('conv1', 'res2', 'res3', 'res4', 'res5'))])
def test_freeze_at_sets_requires_grad(freeze_at, frozen):
    model = ResNet(18, freeze_at=freeze_at)
    for name, param in model.named_parameters():
        assert param.requires_grad == (name.split('.')[0] not in frozen), name


def test_freeze_at_2_gives_no_gradient_to_conv1_and_res2():
    model = ResNet(18, freeze_at=2)
    sum(o.sum() for o in model(torch.randn(1, 3, 32, 32))).backward()
    assert model.conv1.weight.grad is None and model.res2[1].branch2b.weight.grad is None
    assert model.res3[0].branch2a.weight.grad is not None


def test_invalid_freeze_at_and_norm_are_config_errors():
    with pytest.raises(ConfigValueError, match='FREEZE_AT'):
        ResNet(18, freeze_at=1)
    with pytest.raises(ConfigValueError, match="unknown norm kind 'sync'"):
        ResNet(18, norm='sync')
    with pytest.raises(ConfigValueError, match='depth 26'):
        ResNet(26)


def test_group_norm_groups_follows_detectron_get_group_gn():
    assert group_norm_groups(256, 32, -1) == 32
    assert group_norm_groups(256, -1, 16) == 16
    with pytest.raises(ConfigValueError):
        group_norm_groups(256, 32, 16)
    with pytest.raises(ConfigValueError):
        group_norm_groups(48, 32, -1)


def test_gn_body_uses_group_norm_settings_and_trains():
    torch.manual_seed(0)
    model = ResNet(18, norm='gn', gn_num_groups=-1, gn_dim_per_group=16, gn_eps=1e-3, freeze_at=0)
    norm = model.res3[0].branch2a_bn
    assert isinstance(norm, nn.GroupNorm)
    assert (norm.num_groups, norm.num_channels, norm.eps) == (128 // 16, 128, 1e-3)
    assert norm.weight.requires_grad
    _assert_training_reduces_loss(model)


def test_bn_body_trains_and_frozen_stages_keep_running_stats():
    torch.manual_seed(0)
    model = ResNet(18, norm='bn', freeze_at=2).train()
    assert isinstance(model.res2[0].branch2a_bn, nn.BatchNorm2d)
    frozen_mean = model.res2[0].branch2a_bn.running_mean.clone()
    trained_mean = model.res3[0].branch2a_bn.running_mean.clone()
    _assert_training_reduces_loss(model)
    assert not model.res2[0].branch2a_bn.training and model.res3[0].branch2a_bn.training
    assert torch.equal(model.res2[0].branch2a_bn.running_mean, frozen_mean)
    assert not torch.equal(model.res3[0].branch2a_bn.running_mean, trained_mean)


def _assert_training_reduces_loss(model):
    """One small SGD step on a batch lowers the loss on that batch: gradients reach every
    trainable parameter, norm layers included."""
    images = torch.randn(2, 3, 64, 64)

    def loss():
        return sum((out - 1.0).pow(2).mean() for out in model(images))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    before = loss()
    optimizer.zero_grad()
    before.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    optimizer.step()
    with torch.no_grad():
        assert loss().item() < before.item()


def test_checkpointed_stages_give_same_outputs_and_gradients():
    torch.manual_seed(0)
    plain = ResNet(18, norm='gn', freeze_at=0)
    checkpointed = ResNet(18, norm='gn', freeze_at=0, checkpoint_stages=True)
    checkpointed.load_state_dict(plain.state_dict())
    image = torch.randn(1, 3, 32, 32)
    grads = []
    for model in (plain, checkpointed):
        outputs = model(image)
        sum(o.square().mean() for o in outputs).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g_plain, g_ckpt in zip(*grads):
        assert torch.allclose(g_plain, g_ckpt, rtol=1e-4, atol=1e-6)


# --- FPN ---

def _nearest_2x(x):
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)


def test_fpn_outputs_equal_an_independent_top_down_computation():
    torch.manual_seed(0)
    fpn = add_fpn_ResNet18_conv5_body(fpn_dim=32).eval()
    with torch.no_grad():
        for conv in list(fpn.fpn_inner) + list(fpn.fpn_layer):
            conv.bias.normal_()  # Xavier init leaves biases at 0; make them matter
        image = torch.randn(1, 3, 64, 96)
        outputs = fpn(image)
        c2, c3, c4, c5 = fpn.body(image)
        sd = fpn.state_dict()

        def lateral(i, x):
            return F.conv2d(x, sd['fpn_inner.{}.weight'.format(i)], sd['fpn_inner.{}.bias'.format(i)])

        def output(i, x):
            return F.conv2d(x, sd['fpn_layer.{}.weight'.format(i)], sd['fpn_layer.{}.bias'.format(i)],
                            padding=1)
        inner5 = lateral(3, c5)
        inner4 = lateral(2, c4) + _nearest_2x(inner5)
        inner3 = lateral(1, c3) + _nearest_2x(inner4)
        inner2 = lateral(0, c2) + _nearest_2x(inner3)
        expected = [output(0, inner2), output(1, inner3), output(2, inner4), output(3, inner5)]
    assert [tuple(o.shape) for o in outputs] == [
        (1, 32, 16, 24), (1, 32, 8, 12), (1, 32, 4, 6), (1, 32, 2, 3), (1, 32, 1, 2)]
    for out, ref in zip(outputs[:4], expected):
        assert _relative_error(out, ref) < 1e-5
    assert torch.equal(outputs[4], outputs[3][:, :, ::2, ::2])
    assert fpn.strides == (4, 8, 16, 32, 64) and fpn.out_channels == 32


def test_fpn_convs_use_caffe2_xavier_fill():
    torch.manual_seed(0)
    fpn = add_fpn_ResNet50_conv5_body()
    for conv, fan_in in zip(list(fpn.fpn_inner) + list(fpn.fpn_layer),
                            (256, 512, 1024, 2048) + (256 * 9,) * 4):
        bound = math.sqrt(3.0 / fan_in)
        assert conv.weight.abs().max() <= bound
        assert conv.weight.abs().max() > 0.99 * bound
        # U(-b, b) has std b / sqrt(3).
        assert conv.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
        assert torch.count_nonzero(conv.bias) == 0


def test_fpn_zero_init_lateral_keeps_the_top_1x1():
    fpn = add_fpn_ResNet18_conv5_body(zero_init_lateral=True)
    assert [torch.count_nonzero(c.weight).item() == 0 for c in fpn.fpn_inner] == [
        True, True, True, False]


def test_fpn_group_norm_variant():
    fpn = add_fpn_ResNet18_conv5_body(norm='gn', fpn_use_gn=True, gn_num_groups=16)
    assert fpn.fpn_inner[0].bias is None and fpn.fpn_layer[3].bias is None
    assert isinstance(fpn.fpn_layer_gn[3], nn.GroupNorm) and fpn.fpn_layer_gn[3].num_groups == 16
    outputs = fpn(torch.randn(1, 3, 32, 32))
    sum(o.mean() for o in outputs).backward()
    assert fpn.fpn_inner_gn[0].weight.grad is not None


def test_fpn_rejects_inputs_not_padded_to_32():
    fpn = add_fpn_ResNet18_conv5_body()
    with pytest.raises(ConfigValueError, match='70x64 is not a multiple of 32'):
        fpn(torch.zeros(1, 3, 70, 64))
    with pytest.raises(ConfigValueError, match='COARSEST_STRIDE'):
        FPNBody(ResNet(18), coarsest_stride=16)


def test_fpn_body_parameter_names_match_detectron_layout():
    model = nn.Module()
    model.conv_body = add_fpn_ResNet50_conv5_body()
    keys = list(model.state_dict())
    assert len(keys) == 159 + 16
    assert 'conv_body.body.res5.0.branch1_bn.bias' in keys
    assert 'conv_body.fpn_inner.3.weight' in keys and 'conv_body.fpn_layer.0.bias' in keys
    assert model.conv_body.fpn_inner[3].weight.shape == (256, 2048, 1, 1)


def test_fpn_constructors_build_the_named_depths():
    assert len(add_fpn_ResNet101_conv5_body().body.res4) == 23
    assert add_fpn_ResNet34_conv5_body().body.out_channels == (64, 128, 256, 512)
    assert add_fpn_ResNet18_conv5_body(freeze_at=0).body.conv1.weight.requires_grad
