import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detectron.modeling.dcn import DCN
from detectron.ops import deform_conv
from detectron.ops.deform_conv import modulated_deform_conv2d

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conv_numpy(x, weight, bias, stride, pad):
    """Plain cross-correlation of x (B, C, H, W) with zero padding."""
    b, c, h, w = x.shape
    k = weight.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = np.zeros((b, weight.shape[0], ho, wo))
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
            out += np.einsum('bchw,oc->bohw', patch, weight[:, :, i, j])
    return out + bias[None, :, None, None]


def _bilinear_zero_outside(img, y, x):
    """DCNv2's sampling of one channel map at real (y, x): zero unless -1 < y < H and -1 < x < W;
    corners outside the image count as zero."""
    h, w = img.shape
    if not (-1 < y < h and -1 < x < w):
        return 0.0
    y0, x0 = math.floor(y), math.floor(x)
    ly, lx = y - y0, x - x0
    value = 0.0
    for yy, xx, weight in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                           (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
        if 0 <= yy < h and 0 <= xx < w:
            value += weight * img[yy, xx]
    return value


def _dcn_v2_numpy(x, offset_mask_raw, weight, bias, stride, pad):
    """DCNv2 (CenterNet's DCN) from the raw 3*k*k-channel predictor output, loop by loop:
    chunks (o1, o2, m), offset = cat(o1, o2) with channel 2t = dy, 2t+1 = dx of tap t = i*k + j,
    mask = sigmoid(m)."""
    b, c, h, w = x.shape
    k = weight.shape[-1]
    taps = k * k
    offset = offset_mask_raw[:, :2 * taps]
    mask = 1.0 / (1.0 + np.exp(-offset_mask_raw[:, 2 * taps:]))
    ho, wo = offset.shape[2:]
    out = np.zeros((b, weight.shape[0], ho, wo))
    for n in range(b):
        for oy in range(ho):
            for ox in range(wo):
                for i in range(k):
                    for j in range(k):
                        t = i * k + j
                        sy = oy * stride - pad + i + offset[n, 2 * t, oy, ox]
                        sx = ox * stride - pad + j + offset[n, 2 * t + 1, oy, ox]
                        samples = np.array([_bilinear_zero_outside(x[n, ch], sy, sx)
                                            for ch in range(c)])
                        out[n, :, oy, ox] += weight[:, :, i, j] @ samples * mask[n, t, oy, ox]
    return out + bias[None, :, None, None]


def _random_dcn(in_ch, out_ch, stride, seed, offset_scale):
    torch.manual_seed(seed)
    dcn = DCN(in_ch, out_ch, stride=stride).double()
    with torch.no_grad():
        dcn.weight.normal_()
        dcn.bias.normal_()
        dcn.conv_offset_mask.weight.normal_(std=offset_scale)
        dcn.conv_offset_mask.bias.normal_(std=offset_scale)
    return dcn


@pytest.mark.parametrize('stride', [1, 2])
def test_dcn_matches_numpy_dcn_v2_with_random_offsets_and_masks(stride):
    dcn = _random_dcn(3, 4, stride, seed=stride, offset_scale=1.0)
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64)
    params = {k: v.detach().numpy() for k, v in dcn.named_parameters()}
    raw = _conv_numpy(x.numpy(), params['conv_offset_mask.weight'],
                      params['conv_offset_mask.bias'], stride, 1)
    offsets = raw[:, :18]
    # The case must exercise fractional and out-of-image samples and masks away from 0.5.
    assert np.abs(offsets).max() > 4 and np.abs(offsets - np.round(offsets)).max() > 0.4
    assert np.ptp(raw[:, 18:]) > 2
    expected = _dcn_v2_numpy(x.numpy(), raw, params['weight'], params['bias'], stride, 1)
    with torch.no_grad():
        got = dcn(x).numpy()
    assert got.shape == expected.shape == (2, 4, (7 - 1) // stride + 1, (6 - 1) // stride + 1)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_dcn_with_zero_offsets_and_unit_mask_is_a_plain_conv():
    dcn = _random_dcn(5, 3, 1, seed=7, offset_scale=0.0)
    with torch.no_grad():
        dcn.conv_offset_mask.bias[18:] = 50.0  # sigmoid(50) == 1 in float64 to 1e-21
    x = torch.randn(2, 5, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        np.testing.assert_allclose(dcn(x).numpy(), F.conv2d(x, dcn.weight, dcn.bias, padding=1),
                                   rtol=1e-12, atol=1e-12)


def test_dcn_init_matches_dcn_v2_and_halves_a_plain_conv():
    torch.manual_seed(0)
    dcn = DCN(64, 32)
    assert dict((k, tuple(v.shape)) for k, v in dcn.state_dict().items()) == {
        'weight': (32, 64, 3, 3), 'bias': (32,),
        'conv_offset_mask.weight': (27, 64, 3, 3), 'conv_offset_mask.bias': (27,)}
    bound = 1 / math.sqrt(64 * 9)
    assert dcn.weight.abs().max() <= bound and dcn.weight.abs().max() > 0.95 * bound
    assert abs(dcn.weight.std().item() - bound / math.sqrt(3)) < 0.02 * bound
    assert torch.count_nonzero(dcn.bias) == 0
    assert torch.count_nonzero(dcn.conv_offset_mask.weight) == 0
    assert torch.count_nonzero(dcn.conv_offset_mask.bias) == 0
    # Zero offsets and sigmoid(0) = 0.5 masks: half the regular conv (the bias is zero).
    x = torch.randn(1, 64, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(dcn(x), 0.5 * F.conv2d(x, dcn.weight, padding=1))


def test_dcn_gradients_reach_weights_and_offset_predictor():
    dcn = _random_dcn(2, 2, 1, seed=3, offset_scale=0.3)
    dcn(torch.randn(1, 2, 5, 5, dtype=torch.float64)).square().sum().backward()
    for name, p in dcn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def _random_dcn_inputs(seed, n=2, channels=3, height=9, width=11, out_channels=4):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, height, width, dtype=torch.float64, generator=generator)
    offset = 3 * torch.randn(n, 18, height, width, dtype=torch.float64, generator=generator)
    mask = torch.rand(n, 9, height, width, dtype=torch.float64, generator=generator)
    weight = torch.randn(out_channels, channels, 3, 3, dtype=torch.float64, generator=generator)
    bias = torch.randn(out_channels, dtype=torch.float64, generator=generator)
    return x, offset, mask, weight, bias


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_modulated_deform_conv2d_gradients_equal_torchvision_deform_conv2d(device):
    from torchvision.ops import deform_conv2d
    inputs = [t.to(device) for t in _random_dcn_inputs(seed=11)]
    ours = [t.clone().requires_grad_() for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    x, offset, mask, weight, bias = ours
    out = modulated_deform_conv2d(x, offset, mask, weight, bias, stride=1, padding=1)
    x, offset, mask, weight, bias = theirs
    expected = deform_conv2d(x, offset, weight, bias, stride=1, padding=1, mask=mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    upstream = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for name, a, b in zip(('x', 'offset', 'mask', 'weight', 'bias'), ours, theirs):
        # Offsets that land exactly on a pixel have a one-sided derivative; random ones do not.
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-8, msg=name)


def test_modulated_deform_conv2d_samples_in_float32_under_bfloat16_autocast():
    """Under autocast the previous layers hand over bfloat16 features and offsets; only the matmul
    may round to bfloat16: the sampling positions (here up to 200 px) stay float32, where bfloat16
    would misplace them by up to half a pixel."""
    x, offset, mask, weight, bias = (t.float() for t in _random_dcn_inputs(seed=5, width=200))
    x, offset = x.bfloat16(), (offset + 0.37).bfloat16()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        mixed = modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1)
    assert mixed.dtype == torch.bfloat16
    reference = modulated_deform_conv2d(x.float(), offset.float(), mask, weight, bias, padding=1)
    error = (mixed.float() - reference).abs().max() / reference.abs().max()
    assert error < 0.02, error


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_cached_tap_positions_give_the_first_call_s_result_bit_for_bit(device):
    """The tap positions are made on a shape's first call and reused: a later call gives the first
    call's bits, and a new shape gets its own positions."""
    x, offset, mask, weight, bias = (t.float().to(device) for t in _random_dcn_inputs(seed=6, width=40))
    offset = offset + 0.37
    deform_conv._cached_tap_positions.cache_clear()
    with torch.no_grad():
        first = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
        second = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
    assert torch.equal(first, second)
    assert deform_conv._cached_tap_positions.cache_info().hits == 1
    x, offset, mask = (t[..., :-3].contiguous() for t in (x, offset, mask))
    narrower = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
    assert narrower.shape[-1] == first.shape[-1] - 3 * x.shape[-2]
    assert deform_conv._cached_tap_positions.cache_info().currsize == 2


needs_triton_gpu = pytest.mark.skipif(not torch.cuda.is_available() or deform_conv.triton is None,
                                      reason='the sampling kernel needs CUDA and Triton')


def _kernel_case(seed, layout, stride):
    """float32 CUDA inputs whose offsets reach up to ~9 px (outside the map too), the offsets and
    masks strided views of one predictor output as DCN passes them."""
    x, offset, mask, weight, bias = (t.float().cuda() for t in _random_dcn_inputs(seed=seed, channels=37,
                                                                                  height=13, width=17))
    if stride == 2:
        offset, mask = offset[..., ::2, ::2], mask[..., ::2, ::2]
    raw = torch.cat((offset + 0.37, mask), dim=1)
    if layout == 'channels_last':
        x, raw = x.contiguous(memory_format=torch.channels_last), raw.contiguous(memory_format=torch.channels_last)
    return x, raw[:, :18], raw[:, 18:], weight, bias


@pytest.mark.cuda
@needs_triton_gpu
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('stride', [1, 2])
def test_sampling_kernel_equals_grid_sample_columns_and_the_loop_dcn_v2(layout, stride):
    x, offset, mask, weight, bias = _kernel_case(3, layout, stride)
    assert not offset.is_contiguous() and offset.abs().max() > 8
    kernel = deform_conv.sampled_columns_triton(x, offset, mask, 3, 3, stride, 1)
    expected = deform_conv.sampled_columns(x, offset, mask, 3, 3, stride, 1)
    assert kernel.dtype == torch.float32 and kernel.shape == expected.shape
    assert (expected == 0).float().mean() > 0.05  # samples outside the map
    torch.testing.assert_close(kernel, expected, rtol=1e-5, atol=1e-5)
    # The whole convolution against the float64 loop-by-loop DCNv2 (its predictor output given).
    logits = torch.log(mask / (1 - mask))
    raw = torch.cat((offset, logits), dim=1).double().cpu().numpy()
    reference = _dcn_v2_numpy(x.double().cpu().numpy(), raw, weight.double().cpu().numpy(),
                              bias.double().cpu().numpy(), stride, 1)
    with torch.no_grad():
        got = modulated_deform_conv2d(x, offset, mask, weight, bias, stride=stride, padding=1)
    np.testing.assert_allclose(got.double().cpu().numpy(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@needs_triton_gpu
def test_sampling_kernel_writes_autocast_s_dtype_and_serves_only_inference(monkeypatch):
    x, offset, mask, weight, bias = _kernel_case(4, 'channels_last', 1)
    x, offset = x.bfloat16(), offset.bfloat16()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        kernel = deform_conv.sampled_columns_triton(x, offset, mask, 3, 3, 1, 1)
    assert kernel.dtype == torch.bfloat16
    expected = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1).bfloat16()
    # Equal up to the float32 sum's last bits, which may round to the neighbouring bfloat16.
    torch.testing.assert_close(kernel.float(), expected.float(), rtol=8e-3, atol=1e-5)
    assert (kernel == expected).float().mean() > 0.99
    calls = []
    monkeypatch.setattr(deform_conv, 'sampled_columns_triton',
                        lambda *a: calls.append(a) or deform_conv.sampled_columns(*a))
    with torch.no_grad():
        modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1)
    assert len(calls) == 1
    weight.requires_grad_()
    modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1).sum().backward()
    assert len(calls) == 1 and weight.grad is not None
    with torch.no_grad():
        modulated_deform_conv2d(*(t.detach().double() for t in (x, offset, mask, weight, bias)), padding=1)
    assert len(calls) == 1


_INTERPRETER_SCRIPT = '''
import sys
import torch
from detectron.ops import deform_conv
x, offset, mask, stride = torch.load(sys.argv[1])
torch.save(deform_conv.sampled_columns_triton(x, offset, mask, 3, 3, stride, 1), sys.argv[2])
'''


@pytest.mark.processes
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('stride', [1, 2])
def test_sampling_kernel_by_tritons_interpreter_equals_grid_sample_columns(tmp_path, layout, stride):
    """The kernel's arithmetic on the CPU (TRITON_INTERPRET=1, set before triton is imported: hence the
    subprocess): 37 channels and 13 x 17 pixels leave partial tiles along both axes."""
    if deform_conv.triton is None:
        pytest.skip('triton is not installed: grid_sample serves everywhere')
    x, offset, mask, _, _ = _random_dcn_inputs(seed=5, channels=37, height=13, width=17)
    if stride == 2:
        offset, mask = offset[..., ::2, ::2], mask[..., ::2, ::2]
    # The offsets and masks as DCN passes them: strided views of one predictor output.
    raw = torch.cat((offset + 0.37, mask), dim=1).float()
    x = x.float()
    if layout == 'channels_last':
        x, raw = x.contiguous(memory_format=torch.channels_last), raw.contiguous(memory_format=torch.channels_last)
    offset, mask = raw[:, :18], raw[:, 18:]
    torch.save((x, offset, mask, stride), tmp_path / 'inputs.pt')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get('PYTHONPATH', '')]),
               TRITON_INTERPRET='1', CUDA_VISIBLE_DEVICES='')
    proc = subprocess.run([sys.executable, '-c', _INTERPRETER_SCRIPT, str(tmp_path / 'inputs.pt'),
                           str(tmp_path / 'columns.pt')], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernel = torch.load(tmp_path / 'columns.pt')
    expected = deform_conv.sampled_columns(x, offset, mask, 3, 3, stride, 1)
    assert kernel.dtype == torch.float32 and kernel.shape == expected.shape
    assert (expected == 0).float().mean() > 0.05  # samples outside the map
    # grid_sample rescales the positions to [-1, 1] and back: last-bit differences of the weights.
    torch.testing.assert_close(kernel, expected, rtol=1e-5, atol=1e-5)
