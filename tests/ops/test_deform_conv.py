import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from triton_subprocess import run_kernel_script

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
    kernel = deform_conv.sampled_columns_op(x, offset, mask, 3, 3, stride, 1, deform_conv._columns_dtype(x))
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
def test_sampling_kernel_writes_autocast_s_dtype_and_serves_inference_and_training(monkeypatch):
    x, offset, mask, weight, bias = _kernel_case(4, 'channels_last', 1)
    x, offset = x.bfloat16(), offset.bfloat16()
    with torch.autocast('cuda', dtype=torch.bfloat16):
        kernel = deform_conv.sampled_columns_op(x, offset, mask, 3, 3, 1, 1, deform_conv._columns_dtype(x))
    assert kernel.dtype == torch.bfloat16
    expected = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1).bfloat16()
    # Equal up to the float32 sum's last bits, which may round to the neighbouring bfloat16.
    torch.testing.assert_close(kernel.float(), expected.float(), rtol=8e-3, atol=1e-5)
    assert (kernel == expected).float().mean() > 0.99
    calls = []
    monkeypatch.setattr(deform_conv, '_triton_columns',
                        lambda *a: calls.append(a) or deform_conv.sampled_columns(*a[:7]).to(a[7]))
    with torch.no_grad():
        modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1)
    assert len(calls) == 1
    weight.requires_grad_()  # only the weight learns: the inference op's columns serve
    modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1).sum().backward()
    assert len(calls) == 2 and weight.grad is not None
    backward = []
    monkeypatch.setattr(deform_conv, '_triton_columns_backward', lambda *a: backward.append(a) or (
        torch.zeros_like(a[0]), torch.zeros_like(a[1]), torch.zeros_like(a[2])))
    x.requires_grad_()
    modulated_deform_conv2d(x, offset, mask, weight, bias, padding=1).sum().backward()
    assert len(calls) == 3 and len(backward) == 1 and x.grad is not None
    with torch.no_grad():
        modulated_deform_conv2d(*(t.detach().double() for t in (x, offset, mask, weight, bias)), padding=1)
    assert len(calls) == 3


@pytest.mark.cuda
@needs_triton_gpu
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last'])
@pytest.mark.parametrize('stride', [1, 2])
def test_training_kernels_give_grid_sample_s_gradients(layout, stride):
    """Training on CUDA samples by the kernel and differentiates by the backward kernel: the output
    and the gradients of x, offset, mask, weight and bias equal grid_sample's path in float64."""
    x, offset, mask, weight, bias = _kernel_case(8, layout, stride)
    ours = [t.detach().clone().requires_grad_() for t in (x, offset, mask, weight, bias)]
    reference = [t.detach().double().requires_grad_() for t in (x, offset, mask, weight, bias)]
    out = modulated_deform_conv2d(*ours, stride=stride, padding=1)
    expected = modulated_deform_conv2d(*reference, stride=stride, padding=1)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).cuda()
    (out * upstream).sum().backward()
    (expected * upstream.double()).sum().backward()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)
    for name, a, b in zip(('x', 'offset', 'mask', 'weight', 'bias'), ours, reference):
        assert a.grad.dtype == a.dtype and a.grad.shape == a.shape
        scale = b.grad.abs().max()
        assert (a.grad.double() - b.grad).abs().max() <= 1e-5 * scale, name


_INTERPRETER_SCRIPT = '''
import sys
import torch
from detectron.ops import deform_conv
x, offset, mask, stride = torch.load(sys.argv[1])
torch.save(deform_conv.sampled_columns_op(x, offset, mask, 3, 3, stride, 1, deform_conv._columns_dtype(x)), sys.argv[2])
'''


@pytest.mark.processes
@pytest.mark.parametrize('layout', ['contiguous', 'channels_last', 'permuted'])
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
    if layout == 'permuted':  # offsets and masks from other code, laid out (H, W, N, C) and (W, C, H, N)
        x = x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
        offset = offset.permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)
        mask = mask.permute(3, 1, 2, 0).contiguous().permute(3, 1, 2, 0)
        assert not any(t.is_contiguous() for t in (x, offset, mask))
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


_BACKWARD_SCRIPT = '''
import sys
import torch
from detectron.ops import deform_conv
(x, offset, mask, upstream), = torch.load(sys.argv[1]).values()
threads, stride = int(sys.argv[3]), int(sys.argv[4])
deform_conv._BACKWARD_THREADS_PER_PROCESSOR = threads
x, offset, mask = (t.requires_grad_() for t in (x, offset, mask))
columns = deform_conv._KernelSampledColumns.apply(x, offset, mask, 3, 3, stride, 1, torch.float32)
(columns * upstream).sum().backward()
torch.save({'grads': (x.grad, offset.grad, mask.grad)}, sys.argv[2])
'''


@pytest.mark.processes
@pytest.mark.parametrize('layout, stride, threads', [('contiguous', 1, 1), ('permuted', 1, 1), ('contiguous', 2, 1),
                                                     ('permuted', 2, 10 ** 6)])
def test_backward_kernel_gives_grid_sample_s_gradients(tmp_path, layout, stride, threads):
    """The backward kernel's arithmetic (compiled on CUDA, else by Triton's interpreter): the gradients
    of x, the offsets and the masks equal those of grid_sample's columns in float64, with samples
    outside the map and offsets and masks read through their strides; the 37 channels in one group,
    or (many threads wanted) in 4 groups of 10, 10, 10 and 7 whose partial sums are added."""
    x, offset, mask, _, _ = _random_dcn_inputs(seed=7, channels=37, height=13, width=17)
    if stride == 2:
        offset, mask = offset[..., ::2, ::2], mask[..., ::2, ::2]
    raw = torch.cat((offset + 0.37, mask), dim=1).float()
    x, offset, mask = x.float(), raw[:, :18], raw[:, 18:]
    if layout == 'permuted':
        x = x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
        offset = offset.permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)
        mask = mask.permute(3, 1, 2, 0).contiguous().permute(3, 1, 2, 0)
    upstream = torch.randn((x.shape[0], 37 * 9, offset.shape[-2] * offset.shape[-1]),
                           generator=torch.Generator().manual_seed(3))
    inputs, results = str(tmp_path / 'inputs.pt'), str(tmp_path / 'results.pt')
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    torch.save({'case': tuple(t.to(device) for t in (x, offset, mask, upstream))}, inputs)
    run_kernel_script(_BACKWARD_SCRIPT, inputs, results, str(threads), str(stride),
                      skip_reason='triton is not installed: grid_sample serves everywhere')
    grads = [t.cpu() for t in torch.load(results)['grads']]
    reference = [t.detach().double().requires_grad_() for t in (x, offset, mask)]
    columns = deform_conv.sampled_columns(*reference, 3, 3, stride, 1)
    assert (columns == 0).float().mean() > 0.05  # samples outside the map
    (columns * upstream.double()).sum().backward()
    for name, got, ref in zip(('x', 'offset', 'mask'), grads, reference):
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert ref.grad.abs().max() > 1
        torch.testing.assert_close(got.double(), ref.grad, rtol=1e-5, atol=1e-5, msg=name)


def _torchvision_case(batch_sz, contiguous, seed=0):
    """torchvision's own TestDeformConv.get_fn_args (test/test_ops.py): 6 input and 2 output channels,
    2 weight groups, 3 offset groups, a 3 x 2 kernel, stride (2, 1), padding (1, 0), dilation (2, 1) on
    5 x 4 inputs; its non-contiguous variant permutes x, offset, mask and weight the same way."""
    generator = torch.Generator().manual_seed(seed)
    stride, padding, dilation = (2, 1), (1, 0), (2, 1)
    out_h = (5 + 2 * 1 - (2 * (3 - 1) + 1)) // 2 + 1
    out_w = (4 + 2 * 0 - (1 * (2 - 1) + 1)) // 1 + 1
    x = torch.rand(batch_sz, 6, 5, 4, dtype=torch.float64, generator=generator)
    offset = torch.randn(batch_sz, 3 * 2 * 3 * 2, out_h, out_w, dtype=torch.float64, generator=generator)
    mask = torch.randn(batch_sz, 3 * 3 * 2, out_h, out_w, dtype=torch.float64, generator=generator)
    weight = torch.randn(2, 6 // 2, 3, 2, dtype=torch.float64, generator=generator)
    bias = torch.randn(2, dtype=torch.float64, generator=generator)
    if not contiguous:
        x = x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
        offset = offset.permute(1, 3, 0, 2).contiguous().permute(2, 0, 3, 1)
        mask = mask.permute(1, 3, 0, 2).contiguous().permute(2, 0, 3, 1)
        weight = weight.permute(3, 2, 0, 1).contiguous().permute(2, 3, 1, 0)
    return (x, offset, mask, weight, bias), dict(stride=stride, padding=padding, dilation=dilation)


def _assert_equals_torchvision(inputs, geometry, use_mask=True, tol=1e-10):
    """Values and the gradients of every input equal torchvision.ops.deform_conv2d's on the same
    tensors (strides kept: each side gets views of the same storage layout)."""
    from torchvision.ops import deform_conv2d
    ours = [t.detach().clone().requires_grad_() if t.is_contiguous() else _same_layout_leaf(t) for t in inputs]
    theirs = [t.detach().clone().requires_grad_() if t.is_contiguous() else _same_layout_leaf(t) for t in inputs]
    for a, t in zip(ours, inputs):
        assert a.stride() == t.stride()
    x, offset, mask, weight, bias = ours
    out = modulated_deform_conv2d(x, offset, mask if use_mask else None, weight, bias, **geometry)
    x, offset, mask, weight, bias = theirs
    expected = deform_conv2d(x, offset, weight, bias, mask=mask if use_mask else None, **geometry)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=tol, atol=tol)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for name, a, b in zip(('x', 'offset', 'mask', 'weight', 'bias'), ours, theirs):
        if name == 'mask' and not use_mask:
            continue
        assert a.grad is not None and a.grad.shape == a.shape, name
        torch.testing.assert_close(a.grad, b.grad, rtol=100 * tol, atol=100 * tol, msg=name)
    return out


def _same_layout_leaf(t):
    """A leaf tensor with t's values and t's strides (a permuted copy, as torchvision's test makes)."""
    leaf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    with torch.no_grad():
        leaf.copy_(t)
    return leaf.requires_grad_()


@pytest.mark.parametrize('use_mask', [True, False], ids=['mask', 'no_mask'])
@pytest.mark.parametrize('contiguous', [True, False], ids=['contiguous', 'permuted'])
@pytest.mark.parametrize('batch_sz', [0, 33])
def test_torchvision_s_test_shapes_give_torchvision_s_values_and_gradients(batch_sz, contiguous, use_mask):
    """torchvision's TestDeformConv inputs (both batch sizes, its permuted layout, with and without a
    mask): weight and offset groups, unequal stride / padding / dilation, an empty batch."""
    inputs, geometry = _torchvision_case(batch_sz, contiguous)
    if not contiguous:  # (tensors of 0 elements count as contiguous whatever their strides)
        assert not any(t.is_contiguous() for t in inputs[:4 if batch_sz else 0] + inputs[3:4])
    out = _assert_equals_torchvision(inputs, geometry, use_mask)
    assert out.shape == (batch_sz, 2, 2, 3)


def test_an_empty_batch_gives_an_empty_output_and_gradients_through_dcn():
    """CenterNet test batches can be empty after filtering: DCN of a (0, C, H, W) batch is (0, O, H, W)
    (was 'cannot reshape tensor of 0 elements'), in float32 as the model runs, and backward works."""
    torch.manual_seed(0)
    dcn = DCN(4, 3, stride=2)
    x = torch.randn(0, 4, 9, 7, requires_grad=True)
    out = dcn(x)
    assert out.shape == (0, 3, 5, 4) and out.dtype == torch.float32
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in dcn.parameters())
    # The zero-size offsets and masks of such a batch, given to the op directly, as torchvision takes them.
    x, offset, mask, weight, bias = _random_dcn_inputs(seed=2, n=0)
    _assert_equals_torchvision((x, offset, mask, weight, bias), dict(stride=1, padding=1))
    columns = deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
    assert columns.shape == (0, 3 * 9, 9 * 11)


@pytest.mark.parametrize('which', ['mask', 'offset', 'x', 'all', 'channels_last'])
def test_non_contiguous_inputs_give_torchvision_s_result(which):
    """A modulation mask that arrives permuted from other code (was 'view size is not compatible'), a
    permuted offset or input, all three, and channels_last tensors: the contiguous inputs' values and
    torchvision's values and gradients."""
    inputs = list(_random_dcn_inputs(seed=8, n=3))
    contiguous_out = modulated_deform_conv2d(*inputs, stride=1, padding=1)
    names = ('x', 'offset', 'mask')
    for i, name in enumerate(names):
        if which == 'channels_last':
            inputs[i] = inputs[i].contiguous(memory_format=torch.channels_last)
        elif which in (name, 'all'):
            inputs[i] = inputs[i].permute(1, 3, 0, 2).contiguous().permute(2, 0, 3, 1)
    assert any(not t.is_contiguous() for t in inputs[:3])
    out = _assert_equals_torchvision(tuple(inputs), dict(stride=1, padding=1))
    torch.testing.assert_close(out, contiguous_out, rtol=1e-12, atol=1e-12)


class _RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_contiguous_inputs_and_dcn_s_channel_slices_are_sampled_without_a_copy():
    """The common case copies nothing: DCN's offsets are a channel slice of the predictor output and
    its mask a fresh tensor; both are reshaped as views. A permuted mask is copied once."""
    x, offset, mask, _, _ = _random_dcn_inputs(seed=9)
    raw = torch.cat((offset, mask), dim=1)
    offset, mask = raw[:, :18], raw[:, 18:]
    copies = ('aten.clone.default', 'aten.copy_.default', 'aten._to_copy.default')
    with torch.no_grad():  # the shape's tap positions made (and cached) outside the record
        deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
    with torch.no_grad(), _RecordOps() as recorded:
        deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1)
    assert not [op for op in recorded.ops if op in copies], recorded.ops
    permuted = mask.permute(1, 3, 0, 2).contiguous().permute(2, 0, 3, 1)
    with torch.no_grad(), _RecordOps() as recorded:
        deform_conv.sampled_columns(x, offset, permuted, 3, 3, 1, 1)
    assert [op for op in recorded.ops if op in copies] == ['aten.clone.default']


@pytest.mark.parametrize('case, message', [
    ('no_output', 'the output would be 0 x 0 pixels'),
    ('offset_size', 'offset must be'),
    ('mask_channels', 'mask must be'),
    ('offset_channels', 'offset needs 2 \\* G \\* 9 channels'),
])
def test_inputs_that_do_not_fit_each_other_are_one_value_error_naming_the_shapes(case, message):
    """Zero-size offsets of a map smaller than the kernel (torchvision refuses them too), and offsets or
    masks of another size than the output: a ValueError with the shapes, not a reshape error or a result
    computed at the offset's size."""
    x, offset, mask, weight, bias = _random_dcn_inputs(seed=10)
    padding = 1
    if case == 'no_output':
        x, offset, mask, padding = x[:, :, :2, :2], offset[:, :, :0, :0], mask[:, :, :0, :0], 0
    elif case == 'offset_size':
        offset = offset[:, :, :-1]
    elif case == 'mask_channels':
        mask = mask[:, :8]
    else:
        offset = offset[:, :17]
    with pytest.raises(ValueError, match=message) as err:
        modulated_deform_conv2d(x, offset, mask, weight, bias, padding=padding)
    assert 'x {}'.format(tuple(x.shape)) in str(err.value)


def test_the_kernel_wrapper_launches_nothing_for_an_empty_batch(monkeypatch):
    """The Triton columns of an empty batch: the (0, C * taps, Ho * Wo) columns, no kernel launch
    (a grid of 0 programs); runs on the CPU since nothing reaches the kernel."""
    if deform_conv.triton is None:
        pytest.skip('triton is not installed')

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError('launched with grid {}'.format(grid))
    monkeypatch.setattr(deform_conv, '_sampled_columns_kernel', NoLaunch())
    x, offset, mask, _, _ = (t.float() for t in _random_dcn_inputs(seed=12, n=0))
    mask = mask.permute(1, 3, 0, 2).contiguous().permute(2, 0, 3, 1)
    columns = deform_conv.sampled_columns_op(x, offset, mask, 3, 3, 1, 1, deform_conv._columns_dtype(x))
    assert columns.shape == (0, 27, 99) and columns.dtype == torch.float32
