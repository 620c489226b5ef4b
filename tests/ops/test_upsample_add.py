"""The FPN's top-down sum: its Triton kernels (compiled on a CUDA machine, else run by Triton's
interpreter in a subprocess) against nearest-neighbour upsampling written out by index, and the eager
path against F.interpolate."""
import pytest
import torch
import torch.nn.functional as F
from triton_subprocess import tensor_kernel_results

from detectron.ops import upsample_add as ua

_SCRIPT = '''
import sys
import torch
from detectron.ops.upsample_add import _UpsampleAdd
results = {}
for name, (fine, coarse, grad_out, grad_transposed) in torch.load(sys.argv[1]).items():
    fine = fine.contiguous(memory_format=torch.channels_last).requires_grad_()
    coarse = coarse.contiguous(memory_format=torch.channels_last).requires_grad_()
    if bool(grad_transposed):  # a gradient in neither layout
        grad_out = grad_out.transpose(2, 3).contiguous().transpose(2, 3)
    out = _UpsampleAdd.apply(fine, coarse)
    grad_fine, grad_coarse = torch.autograd.grad(out, (fine, coarse), grad_out)
    results[name] = (out.detach(), grad_fine, grad_coarse, out.stride() == fine.stride(),
                     grad_coarse.is_contiguous(memory_format=torch.channels_last))
torch.save(results, sys.argv[2])
'''


def _case(seed, dtype, channels=5, height=3, width=4, grad_transposed=False):
    g = torch.Generator().manual_seed(seed)
    fine = torch.randn(2, channels, 2 * height, 2 * width, generator=g).to(dtype)
    coarse = torch.randn(2, channels, height, width, generator=g).to(dtype)
    grad_out = torch.randn(2, channels, 2 * height, 2 * width, generator=g).to(dtype)
    return fine, coarse, grad_out, torch.tensor(grad_transposed)


CASES = {  # channels_last, the layout the kernels serve
    'float32': _case(0, torch.float32),
    'float32, 200 channels': _case(1, torch.float32, channels=200, height=5, width=3),
    'bfloat16': _case(2, torch.bfloat16),
    'bfloat16, a gradient in neither layout': _case(3, torch.bfloat16, grad_transposed=True),
    'float16, 1x1 coarse': _case(4, torch.float16, height=1, width=1),
}


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    return tensor_kernel_results(_SCRIPT, CASES, tmp_path_factory.mktemp('upsample_add'),
                                 skip_reason='triton is not installed: the FPN top-down kernels cannot run')


def _rounded(x, dtype):
    """x (float64) stored in dtype as the kernels store it: compiled, to nearest; Triton's
    interpreter converts float32 to bfloat16 by dropping the low 16 bits."""
    if dtype != torch.bfloat16 or torch.cuda.is_available():
        return x.to(dtype)
    return (x.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)


def _by_index(fine, coarse, grad_out):
    """Output pixel (y, x) reads coarse pixel (y // 2, x // 2); coarse's gradient at (y, x) sums
    its 2x2 block of the output gradient. Both in float64 (exact for these half-precision values),
    then rounded once."""
    rows = torch.arange(fine.shape[2]) // 2
    cols = torch.arange(fine.shape[3]) // 2
    out = fine.double() + coarse.double()[:, :, rows][:, :, :, cols]
    n, c, h, w = coarse.shape
    blocks = grad_out.double().view(n, c, h, 2, w, 2)
    grad_coarse = (blocks[:, :, :, 0, :, 0] + blocks[:, :, :, 0, :, 1]
                   + blocks[:, :, :, 1, :, 0] + blocks[:, :, :, 1, :, 1])
    return _rounded(out, fine.dtype), grad_coarse


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', sorted(CASES))
def test_kernels_sum_the_upsampled_level_and_its_gradient_blocks(results, name):
    fine, coarse, grad_out, _ = CASES[name]
    out, grad_fine, grad_coarse, same_strides, coarse_layout = results[name]
    expected_out, expected_grad = _by_index(fine, coarse, grad_out)
    assert out.dtype == fine.dtype and same_strides and coarse_layout
    assert torch.equal(out, expected_out)  # one rounding of an exact sum of two values
    assert torch.equal(grad_fine, grad_out)
    assert grad_coarse.dtype == fine.dtype
    if fine.dtype == torch.float32:  # float32 sums in another order than float64's
        torch.testing.assert_close(grad_coarse.double(), expected_grad, rtol=1e-6, atol=1e-6)
    else:  # four half-precision values sum exactly in float32: one rounding
        assert torch.equal(grad_coarse, _rounded(expected_grad, fine.dtype))


@pytest.mark.cuda
def test_eager_path_is_interpolate_then_sum_and_the_kernel_is_used_only_where_it_can_run():
    fine, coarse, _, _ = _case(5, torch.float32)
    expected = fine + F.interpolate(coarse, scale_factor=2, mode='nearest')
    assert torch.equal(ua.upsample_add(fine, coarse), expected)
    fine, coarse = (t.contiguous(memory_format=torch.channels_last) for t in (fine, coarse))
    assert not ua._use_kernel(fine, coarse)  # the CPU
    if torch.cuda.is_available() and ua.triton is not None:
        fine, coarse = fine.cuda(), coarse.cuda()
        assert ua._use_kernel(fine, coarse)
        assert not ua._use_kernel(fine, coarse.double())
        assert not ua._use_kernel(fine.contiguous(), coarse.contiguous())  # NCHW
        assert not ua._use_kernel(fine, coarse[:, :, :2])  # not half the size
