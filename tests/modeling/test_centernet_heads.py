"""CenterNet heads: layout, state dict keys, forward and initialisation."""

import pytest
import torch
import torch.nn.functional as F

from detectron.modeling import centernet_heads as ch
from detectron.utils.errors import ConfigValueError


HEADS = {'hm': 80, 'wh': 2, 'reg': 2}


# ------------------------------------------------------------------------------------------------
# heads
# ------------------------------------------------------------------------------------------------

def test_head_layout_and_state_dict_keys():
    heads = ch.CenterNetHeads(64, HEADS, 64, 'resdcn')
    shapes = {k: tuple(v.shape) for k, v in heads.state_dict().items()}
    assert shapes == {
        'hm.0.weight': (64, 64, 3, 3), 'hm.0.bias': (64,), 'hm.2.weight': (80, 64, 1, 1), 'hm.2.bias': (80,),
        'wh.0.weight': (64, 64, 3, 3), 'wh.0.bias': (64,), 'wh.2.weight': (2, 64, 1, 1), 'wh.2.bias': (2,),
        'reg.0.weight': (64, 64, 3, 3), 'reg.0.bias': (64,), 'reg.2.weight': (2, 64, 1, 1), 'reg.2.bias': (2,),
    }
    single = ch.CenterNetHeads(256, HEADS, 0, 'dla')
    assert {k: tuple(v.shape) for k, v in single.state_dict().items()} == {
        'hm.weight': (80, 256, 1, 1), 'hm.bias': (80,), 'wh.weight': (2, 256, 1, 1), 'wh.bias': (2,),
        'reg.weight': (2, 256, 1, 1), 'reg.bias': (2,)}


def test_forward_is_conv3x3_relu_conv1x1_logits():
    torch.manual_seed(0)
    heads = ch.CenterNetHeads(8, {'hm': 3, 'wh': 2}, 5, 'dla')
    x = torch.randn(2, 8, 6, 7)
    out = heads(x)
    assert list(out) == ['hm', 'wh']
    for name in ('hm', 'wh'):
        conv0, conv2 = getattr(heads, name)[0], getattr(heads, name)[2]
        expected = F.conv2d(torch.relu(F.conv2d(x, conv0.weight, conv0.bias, padding=1)),
                            conv2.weight, conv2.bias)
        torch.testing.assert_close(out[name], expected)
    assert out['hm'].shape == (2, 3, 6, 7) and out['hm'].min() < 0   # raw logits, no sigmoid


def _std(t):
    return t.detach().float().std().item()


def test_resdcn_init():
    torch.manual_seed(0)
    heads = ch.CenterNetHeads(64, HEADS, 64, 'resdcn')
    assert torch.all(heads.hm[2].bias == -2.19)
    # hm's other tensors keep PyTorch's default U(+-1/sqrt(fan_in)): fan_in 576 -> std 0.024
    assert _std(heads.hm[0].weight) > 0.01 and heads.hm[0].bias.abs().sum() > 0
    for name in ('wh', 'reg'):
        head = getattr(heads, name)
        assert 0.0008 < _std(head[0].weight) < 0.0012   # N(0, 0.001), 36864 samples
        assert 0.0006 < _std(head[2].weight) < 0.0014   # 128 samples
        assert torch.all(head[0].bias == 0) and torch.all(head[2].bias == 0)


def test_msra_init_touches_only_the_output_conv():
    torch.manual_seed(0)
    heads = ch.CenterNetHeads(256, HEADS, 64, 'msra')
    assert [name for name, _ in heads.named_children()] == ['hm', 'reg', 'wh']   # sorted, as res_*
    assert torch.all(heads.hm[2].bias == -2.19) and _std(heads.hm[2].weight) > 0.01
    for name in ('wh', 'reg'):
        head = getattr(heads, name)
        assert _std(head[0].weight) > 0.005 and head[0].bias.abs().sum() > 0   # default init
        assert 0.0006 < _std(head[2].weight) < 0.0014 and torch.all(head[2].bias == 0)
    # The rule is "output channels == the head's channels": with head_conv equal to it, both convs.
    same = ch.CenterNetHeads(16, {'wh': 64}, 64, 'msra')
    assert _std(same.wh[0].weight) < 0.0012 and torch.all(same.wh[0].bias == 0)


def test_dla_init_zeroes_biases_only():
    torch.manual_seed(0)
    heads = ch.CenterNetHeads(64, HEADS, 256, 'dla')
    assert torch.all(heads.hm[2].bias == -2.19) and heads.hm[0].bias.abs().sum() > 0
    for name in ('wh', 'reg'):
        head = getattr(heads, name)
        assert _std(head[0].weight) > 0.01 and _std(head[2].weight) > 0.01
        assert torch.all(head[0].bias == 0) and torch.all(head[2].bias == 0)


def test_single_conv_heads_init():
    torch.manual_seed(0)
    resdcn = ch.CenterNetHeads(64, HEADS, 0, 'resdcn')
    assert torch.all(resdcn.hm.bias == -2.19) and _std(resdcn.hm.weight) > 0.01
    assert _std(resdcn.wh.weight) < 0.0015 and torch.all(resdcn.wh.bias == 0)
    dla = ch.CenterNetHeads(64, HEADS, -1, 'dla')
    assert _std(dla.wh.weight) > 0.01 and torch.all(dla.wh.bias == 0)


def test_unknown_init_is_a_config_error():
    with pytest.raises(ConfigValueError, match='resdcn'):
        ch.CenterNetHeads(64, HEADS, 64, 'resnet')
