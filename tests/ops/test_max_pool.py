"""The ResNet stem's max-pool: its Triton kernels (compiled on a CUDA machine, else run by Triton's
interpreter in a subprocess) against F.max_pool2d, bit for bit."""
import pytest
import torch
import torch.nn.functional as F
from triton_subprocess import tensor_kernel_results

from detectron.ops import max_pool
from detectron.ops.max_pool import max_pool_3x3_s2

# (height, width): odd and even sides, a 1 x 1 map and thin maps (windows cut by the padding).
SIZES = ((7, 9), (8, 6), (1, 1), (2, 3), (13, 16))


def _pool_case(seed, height, width, channels_last, dtype=torch.float32, device='cpu'):
    """Values from {0, 1, 2, 3} (ties in most windows), a NaN and a -inf, and an upstream gradient."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, (2, 5, height, width), generator=generator).float()
    x[0, 0, 0, 0] = float('nan')
    x[1, 2, -1, -1] = float('-inf')
    x = x.to(device=device, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    upstream = torch.randn((2, 5, (height - 1) // 2 + 1, (width - 1) // 2 + 1), generator=generator)
    return x, upstream.to(device=device, dtype=dtype)


def _pool_and_grad(pool, x, upstream):
    x = x.detach().clone().requires_grad_()
    out = pool(x)
    (out * upstream).sum().backward()
    return out, x.grad


def _torch_pool(x):
    return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


def _assert_bitwise_equal(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(0.0), expected.nan_to_num(0.0))


_KERNEL_SCRIPT = '''
import sys
import torch
from detectron.ops import max_pool
results = {}
for name, (x, upstream) in torch.load(sys.argv[1]).items():
    x = x.clone().requires_grad_()
    out = max_pool._MaxPool3x3S2.apply(x)
    (out * upstream).sum().backward()
    results[name] = (out.detach(), x.grad, x.grad.is_contiguous(memory_format=torch.channels_last))
torch.save(results, sys.argv[2])
'''


@pytest.mark.processes
def test_kernels_give_torch_s_values_and_gradients_bit_for_bit(tmp_path):
    """The kernels' arithmetic (compiled on CUDA, else by Triton's interpreter): the pooled values (ties
    won by the first tap, a NaN by the NaN) and the gradients (an input winning several windows sums
    them in PyTorch's order) equal F.max_pool2d's on the CPU bit for bit, for channels_last and
    contiguous inputs; the gradient keeps the input's layout."""
    cases = {'{}x{}-{}'.format(h, w, 'channels_last' if channels_last else 'contiguous'):
             _pool_case(seed, h, w, channels_last)
             for seed, (h, w) in enumerate(SIZES) for channels_last in (True, False)}
    results = tensor_kernel_results(_KERNEL_SCRIPT, cases, tmp_path,
                                    skip_reason='triton is not installed: PyTorch pools everywhere')
    three_or_more = 0
    for name, (x, upstream) in cases.items():
        out, grad, grad_channels_last = results[name]
        expected_out, expected_grad = _pool_and_grad(_torch_pool, x, upstream)
        _assert_bitwise_equal(out, expected_out)
        _assert_bitwise_equal(grad, expected_grad)
        assert grad_channels_last == x.is_contiguous(memory_format=torch.channels_last), name
        won = _pool_and_grad(_torch_pool, x, torch.ones_like(upstream))[1]
        three_or_more += int((won >= 3).sum())
    assert three_or_more > 10  # inputs that won 3 or 4 windows: the sum's order is exercised


def test_the_kernels_serve_only_cuda_training():
    x = torch.randn(1, 2, 5, 5)
    assert not max_pool._use_kernels(x.requires_grad_())
    if torch.cuda.is_available():
        y = torch.randn(1, 2, 5, 5, device='cuda')
        assert not max_pool._use_kernels(y)  # no gradient wanted
        assert max_pool._use_kernels(y.requires_grad_()) == (max_pool.triton is not None)
        with torch.no_grad():
            assert not max_pool._use_kernels(y)
        assert not max_pool._use_kernels(y.double())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or max_pool.triton is None, reason='needs CUDA and Triton')
@pytest.mark.parametrize('dtype, channels_last', [(torch.bfloat16, True), (torch.float32, False),
                                                  (torch.float16, True)])
def test_cuda_training_pool_equals_torch_s_bit_for_bit(dtype, channels_last):
    """On CUDA, a map of a stem's proportions and the small cases: values and gradients equal
    F.max_pool2d's bit for bit (PyTorch's CUDA backward sums in float32 in the same order)."""
    cases = [_pool_case(seed, h, w, channels_last, dtype, 'cuda') for seed, (h, w) in enumerate(SIZES + ((96, 130),))]
    for x, upstream in cases:
        assert max_pool._use_kernels(x.detach().requires_grad_())
        out, grad = _pool_and_grad(max_pool_3x3_s2, x, upstream)
        expected_out, expected_grad = _pool_and_grad(_torch_pool, x, upstream)
        _assert_bitwise_equal(out, expected_out)
        _assert_bitwise_equal(grad, expected_grad)
