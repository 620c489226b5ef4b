"""fine + coarse upsampled 2x by nearest neighbour: the FPN's top-down sum (Detectron's
UpsampleNearest, then Sum), as one Triton kernel each way on CUDA.

Under CUDA autocast F.interpolate runs in float32, so the eager top-down path casts, upsamples and
sums twice the bytes forward and backward; a broadcast add in the activation dtype instead runs on
PyTorch's non-vectorised kernels and reduces its gradient as slowly (BENCHMARKS.md, "Training
speed"). The kernels read and write each tensor once, in its own layout, with the eager arithmetic:
forward, the sum of the two values rounded once to the output dtype; backward, each 2x2 block of the
gradient summed in float32 in row-major order, as upsample_nearest2d's backward does. Other devices
and mixed dtypes take the eager path.
"""
import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path serves them
    triton = None

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE_ELEMENTS = 4096  # elements per program: pixels x channels of the tile


def upsample_add(fine, coarse):
    """fine + F.interpolate(coarse, scale_factor=2, mode='nearest') for fine (N, C, 2H, 2W) and
    coarse (N, C, H, W), in fine's layout."""
    if _use_kernel(fine, coarse):
        return _UpsampleAdd.apply(fine, coarse)
    return fine + F.interpolate(coarse, scale_factor=2, mode='nearest')


def _use_kernel(fine, coarse):
    n, c, h, w = coarse.shape
    return (triton is not None and fine.is_cuda and coarse.device == fine.device
            and fine.dtype == coarse.dtype and fine.dtype in _KERNEL_DTYPES
            and fine.shape == (n, c, 2 * h, 2 * w))


def _launch(kernel, like, *tensors):
    """Run kernel over the pixels x channels of `like` (N, C, H, W); each tensor after the first
    pointer is passed with its four strides."""
    n, channels, height, width = like.shape
    pixels = n * height * width
    block_c = min(triton.next_power_of_2(channels), 128)
    block_p = _TILE_ELEMENTS // block_c
    grid = (triton.cdiv(pixels, block_p), triton.cdiv(channels, block_c))
    args = [a for t in tensors for a in (t, *t.stride())]
    kernel[grid](*args, pixels, channels, height, width, BLOCK_P=block_p, BLOCK_C=block_c)


class _UpsampleAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fine, coarse):
        out = torch.empty_like(fine)
        _launch(_forward_kernel, fine, fine, coarse, out)
        ctx.coarse_layout = _memory_format(coarse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        n, c, height, width = grad_out.shape
        grad_coarse = torch.empty((n, c, height // 2, width // 2), dtype=grad_out.dtype,
                                  device=grad_out.device, memory_format=ctx.coarse_layout)
        _launch(_backward_kernel, grad_coarse, grad_out, grad_coarse)
        return grad_out, grad_coarse


def _memory_format(x):
    return torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format


if triton is not None:
    @triton.jit
    def _tile(pixels, channels, height, width, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's pixels as (n, y, x) in int64, its channels, and the in-bounds mask."""
        p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        x = p % width
        y = (p // width) % height
        n = p // (width * height)
        mask = (p < pixels)[:, None] & (c < channels)[None, :]
        return n, y, x, c, mask

    @triton.jit
    def _offsets(n, y, x, c, sn, sc, sh, sw):
        return (n * sn + y * sh + x * sw)[:, None] + (c * sc)[None, :]

    @triton.jit
    def _forward_kernel(fine_ptr, f_sn, f_sc, f_sh, f_sw, coarse_ptr, c_sn, c_sc, c_sh, c_sw,
                        out_ptr, o_sn, o_sc, o_sh, o_sw, pixels, channels, height, width,
                        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        n, y, x, c, mask = _tile(pixels, channels, height, width, BLOCK_P, BLOCK_C)
        fine = tl.load(fine_ptr + _offsets(n, y, x, c, f_sn, f_sc, f_sh, f_sw), mask=mask)
        coarse = tl.load(coarse_ptr + _offsets(n, y // 2, x // 2, c, c_sn, c_sc, c_sh, c_sw), mask=mask)
        total = fine.to(tl.float32) + coarse.to(tl.float32)
        tl.store(out_ptr + _offsets(n, y, x, c, o_sn, o_sc, o_sh, o_sw), total.to(fine.dtype), mask=mask)

    @triton.jit
    def _backward_kernel(grad_ptr, g_sn, g_sc, g_sh, g_sw, grad_coarse_ptr, gc_sn, gc_sc, gc_sh, gc_sw,
                         pixels, channels, height, width, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        n, y, x, c, mask = _tile(pixels, channels, height, width, BLOCK_P, BLOCK_C)
        top_left = grad_ptr + _offsets(n, 2 * y, 2 * x, c, g_sn, g_sc, g_sh, g_sw)
        total = tl.load(top_left, mask=mask).to(tl.float32)
        total += tl.load(top_left + g_sw, mask=mask).to(tl.float32)
        total += tl.load(top_left + g_sh, mask=mask).to(tl.float32)
        total += tl.load(top_left + g_sh + g_sw, mask=mask).to(tl.float32)
        tl.store(grad_coarse_ptr + _offsets(n, y, x, c, gc_sn, gc_sc, gc_sh, gc_sw),
                 total.to(grad_coarse_ptr.dtype.element_ty), mask=mask)
