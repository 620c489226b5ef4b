import json
import math
import os
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from detectron.modeling.centernet_backbones import CENTERNET_ARCHS, build_centernet_backbone
from detectron.modeling.centernet_layers import bilinear_kernel
from detectron.modeling.dcn import DCN
from detectron.utils.errors import ConfigValueError

DATA = os.path.join(os.path.dirname(__file__), 'data')
HEAD_NAMES = ('hm', 'wh', 'reg')


def _load(name):
    with open(os.path.join(DATA, name)) as f:
        return json.load(f)


REFERENCE_KEYS = _load('centernet_reference_keys.json')
REFERENCE_OUTPUTS = _load('centernet_reference_outputs.json')


def reference_backbone_shapes(arch):
    """{key: shape} of the reference model's backbone, i.e. without heads and without the
    ImageNet classifier that CenterNet's DLA keeps in `base.fc` but never runs."""
    return {key: tuple(shape) for key, shape in REFERENCE_KEYS[arch]
            if key.split('.')[0] not in HEAD_NAMES and not key.startswith('base.fc.')}


def reference_style_values(key, shape):
    """The deterministic tensor the reference outputs were computed with, a function of the key:
    BN statistics and affines near 1 / 0, weights U(+-sqrt(3 / fan)) (4 taps per output for the
    even-sized transposed-conv kernels), offset predictors 5x smaller so that offsets stay
    O(0.1)."""
    u = np.random.default_rng(zlib.crc32(key.encode())).random(tuple(shape))
    if key.endswith('running_var'):
        value = 0.5 + u
    elif key.endswith('running_mean'):
        value = (u - 0.5) * 0.2
    elif len(shape) == 1:
        value = 0.5 + u if key.endswith('.weight') else (u - 0.5) * 0.2
    else:
        fan = u.size // shape[0]
        if shape[-1] % 2 == 0:
            fan = 4 * (shape[0] if shape[1] > 1 else 1)
        gain = 0.2 if 'conv_offset_mask' in key else 1.0
        value = (2 * u - 1) * (math.sqrt(3.0 / fan) * gain)
    return torch.from_numpy(value)


@pytest.fixture(scope='module')
def backbones():
    torch.manual_seed(0)
    return {arch: build_centernet_backbone(arch) for arch in CENTERNET_ARCHS}


def test_supported_archs():
    assert CENTERNET_ARCHS == ('resdcn_18', 'resdcn_34', 'resdcn_50', 'resdcn_101', 'res_18',
                               'res_34', 'res_50', 'res_101', 'dla_34')
    # Every supported arch has a reference table (and vice versa, apart from the ImageNet file).
    assert set(REFERENCE_KEYS) - {'_about', 'dla34_imagenet'} == set(CENTERNET_ARCHS)


@pytest.mark.parametrize('arch', CENTERNET_ARCHS)
def test_state_dict_keys_and_shapes_are_the_references(backbones, arch):
    ours = {k: tuple(v.shape) for k, v in backbones[arch].state_dict().items()}
    assert ours == reference_backbone_shapes(arch)


@pytest.mark.parametrize('arch', ['resdcn_18', 'resdcn_101', 'res_18', 'dla_34'])
def test_output_is_the_stride_4_map(backbones, arch):
    expected_channels = 256 if arch.startswith('res_') else 64
    model = backbones[arch].eval()
    assert model.out_channels == expected_channels
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 96))
    assert out.shape == (1, expected_channels, 8, 24)


@pytest.mark.parametrize('arch,dcn_layers', [('resdcn_18', 3), ('resdcn_101', 3), ('res_18', 0),
                                             ('dla_34', 16)])
def test_number_of_deformable_convs(backbones, arch, dcn_layers):
    dcns = [m for m in backbones[arch].modules() if isinstance(m, DCN)]
    assert len(dcns) == dcn_layers
    assert all(m.kernel_size == 3 and m.stride == 1 and m.padding == 1 for m in dcns)


@pytest.mark.parametrize('arch', ['resdcn_18', 'res_50', 'dla_34'])
def test_batch_norms_use_momentum_0_1(backbones, arch):
    bns = [m for m in backbones[arch].modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(m.momentum == 0.1 and m.eps == 1e-5 for m in bns)


def test_bilinear_kernel_hand_values():
    profile4 = torch.tensor([0.25, 0.75, 0.75, 0.25], dtype=torch.float64)
    torch.testing.assert_close(bilinear_kernel(4), torch.outer(profile4, profile4))
    profile8 = torch.tensor([1, 3, 5, 7, 7, 5, 3, 1], dtype=torch.float64) / 8
    torch.testing.assert_close(bilinear_kernel(8), torch.outer(profile8, profile8))
    # Stride k/2 with these kernels interpolates: a constant map stays constant inside.
    for size in (4, 8):
        factor = size // 2
        up = nn.ConvTranspose2d(1, 1, size, stride=factor, padding=factor // 2, bias=False)
        with torch.no_grad():
            up.weight[0, 0] = bilinear_kernel(size)
            out = up(torch.ones(1, 1, 6, 6))
        assert out.shape == (1, 1, 6 * factor, 6 * factor)
        torch.testing.assert_close(out[0, 0, factor:-factor, factor:-factor],
                                   torch.ones(4 * factor, 4 * factor))


def test_resdcn_up_path_init(backbones):
    model = backbones['resdcn_18']
    ups = [(i, m) for i, m in enumerate(model.deconv_layers) if isinstance(m, nn.ConvTranspose2d)]
    assert [i for i, _ in ups] == [3, 9, 15]
    for (_, up), channels in zip(ups, (256, 128, 64)):
        assert up.weight.shape == (channels, channels, 4, 4) and up.bias is None
        assert (up.stride, up.padding, up.output_padding) == ((2, 2), (1, 1), (0, 0))
        # Only output channel 0 of each input channel is bilinear; the rest keeps PyTorch's
        # default U(+-1/sqrt(fan_in)) init, fan_in = channels * 16.
        torch.testing.assert_close(up.weight[:, 0].double(),
                                   bilinear_kernel(4).expand(channels, 4, 4))
        rest = up.weight[:, 1:]
        bound = 1 / math.sqrt(channels * 16)
        assert rest.abs().max() <= bound and rest.std() > 0.5 * bound / math.sqrt(3)
    for m in model.deconv_layers:
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
        if isinstance(m, DCN):
            assert torch.count_nonzero(m.conv_offset_mask.weight) == 0
            assert torch.count_nonzero(m.bias) == 0


def test_res_up_path_init(backbones):
    model = backbones['res_18']
    ups = [m for m in model.deconv_layers if isinstance(m, nn.ConvTranspose2d)]
    assert [tuple(up.weight.shape) for up in ups] == [(512, 256, 4, 4), (256, 256, 4, 4),
                                                      (256, 256, 4, 4)]
    for up in ups:
        assert up.bias is None and abs(up.weight.std().item() - 0.001) < 5e-5
        assert abs(up.weight.mean().item()) < 2e-5


def test_dla_upsampling_is_depthwise_bilinear(backbones):
    ups = {name: m for name, m in backbones['dla_34'].named_modules()
           if isinstance(m, nn.ConvTranspose2d)}
    # (factor) per layer, from DLAUp's scales and IDAUp(64, [64, 128, 256], [1, 2, 4]).
    expected = {'dla_up.ida_0.up_1': (256, 2), 'dla_up.ida_1.up_1': (128, 2),
                'dla_up.ida_1.up_2': (128, 2), 'dla_up.ida_2.up_1': (64, 2),
                'dla_up.ida_2.up_2': (64, 2), 'dla_up.ida_2.up_3': (64, 2),
                'ida_up.up_1': (64, 2), 'ida_up.up_2': (64, 4)}
    assert set(ups) == set(expected)
    for name, (channels, factor) in expected.items():
        up = ups[name]
        assert up.groups == channels and up.bias is None
        assert up.stride == (factor, factor) and up.padding == (factor // 2, factor // 2)
        assert up.weight.shape == (channels, 1, 2 * factor, 2 * factor)
        torch.testing.assert_close(up.weight[:, 0].double(),
                                   bilinear_kernel(2 * factor).expand(channels, -1, -1))


def test_dla_gradients_reach_all_but_the_unused_projections(backbones):
    model = backbones['dla_34'].eval()  # eval: BN on the 1x1 level-5 map needs no batch stats
    model.zero_grad()
    model(torch.randn(1, 3, 32, 32)).square().mean().backward()
    # CenterNet computes these projections, then discards them (a deeper tree projects inside its
    # first subtree): they are frozen, every other parameter gets a gradient.
    unused = ['base.level3.project.0.weight', 'base.level3.project.1.weight',
              'base.level3.project.1.bias', 'base.level4.project.0.weight',
              'base.level4.project.1.weight', 'base.level4.project.1.bias']
    assert [name for name, p in model.named_parameters() if not p.requires_grad] == unused
    assert [name for name, p in model.named_parameters() if p.grad is None] == unused
    assert all(p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
    model.zero_grad()


@pytest.mark.parametrize('arch', ['resdcn_18', 'res_18', 'resdcn_50', 'dla_34'])
def test_forward_matches_the_reference_network(backbones, arch):
    golden = REFERENCE_OUTPUTS[arch]
    model = build_centernet_backbone(arch).double().eval()
    state = {k: v if k.endswith('num_batches_tracked') else reference_style_values(k, v.shape)
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        out = model(x)
    assert list(out.shape) == golden['shape']
    flat = out.flatten()
    assert flat.sum().item() == pytest.approx(golden['sum'], rel=1e-10)
    assert flat.square().sum().item() == pytest.approx(golden['sum_sq'], rel=1e-10)
    torch.testing.assert_close(flat[golden['indices']],
                               torch.tensor(golden['values'], dtype=torch.float64),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize('arch', ['hourglass', 'dla_60', 'resdcn_152', 'resdcn18', ''])
def test_unknown_arch_is_a_config_error(arch):
    with pytest.raises(ConfigValueError) as err:
        build_centernet_backbone(arch)
    message = str(err.value)
    assert 'CENTERNET.ARCH' in message and repr(arch) in message
    assert all(choice in message for choice in CENTERNET_ARCHS)


@pytest.mark.parametrize('arch,filters,up_weights', [
    # ConvTranspose2d weights are (in, out, 4, 4); resdcn's DCN brings the width down before its up-conv.
    ('res_18', (128, 64, 32), [(512, 128, 4, 4), (128, 64, 4, 4), (64, 32, 4, 4)]),
    ('resdcn_18', (32, 16, 8), [(32, 32, 4, 4), (16, 16, 4, 4), (8, 8, 4, 4)])])
def test_deconv_filters_set_the_upsampling_widths(arch, filters, up_weights):
    model = build_centernet_backbone(arch, deconv_filters=filters).eval()
    ups = [m.weight.shape for m in model.deconv_layers if isinstance(m, nn.ConvTranspose2d)]
    assert [tuple(s) for s in ups] == up_weights
    assert model.out_channels == filters[-1]
    with torch.no_grad():
        assert tuple(model(torch.zeros(2, 3, 64, 96)).shape) == (2, filters[-1], 16, 24)


@pytest.mark.parametrize('arch,filters', [('dla_34', (64, 64, 64)), ('res_18', (64, 64)), ('res_18', (64, 64, 64, 64))])
def test_deconv_filters_other_than_three_resnet_widths_are_refused(arch, filters):
    with pytest.raises(ConfigValueError, match='CENTERNET.DECONV_FILTERS'):
        build_centernet_backbone(arch, deconv_filters=filters)
