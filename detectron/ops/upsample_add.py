"""fine + coarse upsampled 2x by nearest neighbour: the FPN's top-down sum (Detectron's
UpsampleNearest, then Sum), as one Triton kernel each way on CUDA.

Under CUDA autocast F.interpolate runs in float32, so the eager top-down path casts, upsamples and
sums twice the bytes forward and backward; a broadcast add in the activation dtype instead runs on
PyTorch's non-vectorised kernels and reduces its gradient as slowly (BENCHMARKS.md, "Training
speed"). The kernels read and write each tensor once: forward, the sum of the two values rounded
once to the inputs' dtype (under autocast the eager path carries the sums down the levels in
float32, each level's 3x3 conv rounding its input to bf16); backward, each 2x2 block of the
gradient summed in float32 in row-major order. They serve channels_last tensors of one dtype on
CUDA (the training body under autocast); other layouts, dtypes and devices take the eager path,
F.interpolate's.
"""
import torch
import torch.nn.functional as F

from detectron.ops.affine_relu import dense_layout

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path serves them
    triton = None

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE_ELEMENTS = 4096  # elements per program: pixels x channels of the tile


def upsample_add(fine, coarse):
    """fine + F.interpolate(coarse, scale_factor=2, mode='nearest') for fine (N, C, 2H, 2W) and
    coarse (N, C, H, W)."""
    if _use_kernel(fine, coarse):
        return upsample_add_op(fine, coarse)
    return fine + F.interpolate(coarse, scale_factor=2, mode='nearest')


def _use_kernel(fine, coarse):
    n, c, h, w = coarse.shape
    return (triton is not None and fine.is_cuda and coarse.device == fine.device
            and fine.dtype == coarse.dtype and fine.dtype in _KERNEL_DTYPES
            and fine.shape == (n, c, 2 * h, 2 * w)
            and dense_layout(fine) == 'channels_last' and dense_layout(coarse) == 'channels_last')


def _launch(kernel, like, *tensors):
    """Run kernel over the pixels x channels of `like` (N, C, H, W), channels_last."""
    n, channels, height, width = like.shape
    pixels = n * height * width
    block_c = min(triton.next_power_of_2(channels), 128)
    grid = (triton.cdiv(pixels, _TILE_ELEMENTS // block_c), triton.cdiv(channels, block_c))
    kernel[grid](*tensors, pixels, channels, height, width,
                 BLOCK_P=_TILE_ELEMENTS // block_c, BLOCK_C=block_c)


def _kernel_forward(fine, coarse):
    out = torch.empty_like(fine)
    _launch(_forward_kernel, fine, fine, coarse, out)
    return out


def _kernel_backward(grad_out):
    """(grad_fine, grad_coarse), channels_last."""
    grad_out = grad_out.contiguous(memory_format=torch.channels_last)
    n, c, height, width = grad_out.shape
    grad_coarse = torch.empty((n, c, height // 2, width // 2), dtype=grad_out.dtype,
                              device=grad_out.device, memory_format=torch.channels_last)
    _launch(_backward_kernel, grad_coarse, grad_out, grad_coarse)
    return grad_out, grad_coarse


class _UpsampleAdd(torch.autograd.Function):
    """The kernels as an autograd Function (the custom op below is their traceable form)."""
    @staticmethod
    def forward(ctx, fine, coarse):
        return _kernel_forward(fine, coarse)

    @staticmethod
    def backward(ctx, grad_out):
        return _kernel_backward(grad_out)


# torch.library custom ops (torch.export, torch.compile): the kernels on CUDA with Triton, else the
# plain-torch reference, so that an exported CUDA model also runs where Triton is absent.
@torch.library.custom_op('detectron::upsample_add', mutates_args=())
def upsample_add_op(fine: torch.Tensor, coarse: torch.Tensor) -> torch.Tensor:
    if triton is not None and fine.is_cuda:
        return _kernel_forward(fine, coarse)
    return fine + F.interpolate(coarse, scale_factor=2, mode='nearest')


@upsample_add_op.register_fake
def _(fine, coarse):
    return torch.empty_like(fine)


@torch.library.custom_op('detectron::upsample_add_backward', mutates_args=())
def upsample_add_backward_op(grad_out: torch.Tensor) -> torch.Tensor:
    """The coarse input's gradient: each 2x2 block of grad_out summed in float32."""
    if triton is not None and grad_out.is_cuda:
        return _kernel_backward(grad_out)[1]
    n, c, height, width = grad_out.shape
    blocks = grad_out.float().reshape(n, c, height // 2, 2, width // 2, 2)
    return blocks.sum(dim=(3, 5)).to(grad_out.dtype).contiguous(memory_format=torch.channels_last)


@upsample_add_backward_op.register_fake
def _(grad_out):
    n, c, height, width = grad_out.shape
    return grad_out.new_empty((n, c, height // 2, width // 2)).contiguous(memory_format=torch.channels_last)


def _op_backward(ctx, grad_out):
    return grad_out, upsample_add_backward_op(grad_out)


upsample_add_op.register_autograd(_op_backward)


if triton is not None:
    @triton.jit
    def _tile(pixels, channels, height, width, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's pixel indices (int64) and their image, row and column, its channels and
        the in-bounds mask."""
        p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        n, y, x = p // (width * height), (p // width) % height, p % width
        return p, n, y, x, c, (p < pixels)[:, None] & (c < channels)[None, :]

    # The sizes change with every image size: specialising on their divisibility would compile a
    # kernel per new combination (BENCHMARKS.md, "Start-up").
    @triton.jit(do_not_specialize=['pixels', 'height', 'width'])
    def _forward_kernel(fine_ptr, coarse_ptr, out_ptr, pixels, channels, height, width,
                        BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """Over fine's pixels (height x width each image)."""
        p, n, y, x, c, mask = _tile(pixels, channels, height, width, BLOCK_P, BLOCK_C)
        coarse_p = (n * (height // 2) + y // 2) * (width // 2) + x // 2
        offsets = p[:, None] * channels + c[None, :]
        fine = tl.load(fine_ptr + offsets, mask=mask)
        coarse = tl.load(coarse_ptr + coarse_p[:, None] * channels + c[None, :], mask=mask)
        total = fine.to(tl.float32) + coarse.to(tl.float32)
        tl.store(out_ptr + offsets, total.to(fine.dtype), mask=mask)

    @triton.jit(do_not_specialize=['pixels', 'height', 'width'])
    def _backward_kernel(grad_ptr, grad_coarse_ptr, pixels, channels, height, width,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """Over coarse's pixels (height x width each image); grad holds 2 height x 2 width."""
        p, n, y, x, c, mask = _tile(pixels, channels, height, width, BLOCK_P, BLOCK_C)
        row = 2 * width * channels  # one row of grad
        top_left = grad_ptr + ((n * 2 * height + 2 * y) * 2 * width + 2 * x)[:, None] * channels + c[None, :]
        total = tl.load(top_left, mask=mask).to(tl.float32)
        total += tl.load(top_left + channels, mask=mask).to(tl.float32)
        total += tl.load(top_left + row, mask=mask).to(tl.float32)
        total += tl.load(top_left + row + channels, mask=mask).to(tl.float32)
        tl.store(grad_coarse_ptr + p[:, None] * channels + c[None, :],
                 total.to(grad_coarse_ptr.dtype.element_ty), mask=mask)
