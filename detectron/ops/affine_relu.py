"""relu(x * weight + bias [+ residual]) per channel, the frozen AffineChannel followed by its ReLU
(and, at the end of a residual block, the shortcut's sum), as one Triton kernel on CUDA.

Eager PyTorch runs these as two or three element-wise passes over the body's largest tensors
(addcmul, add, clamp), each reading and writing the whole activation; the affine's per-channel
broadcast also keeps them off the vectorised kernels, a large share of the graphed body's time in
the training step (BENCHMARKS.md, "Training speed"). The kernel makes one pass forward and one backward, with
the eager path's arithmetic: float32 products and sums, each eager step's rounding to the
activation dtype kept (the affine's result is rounded before the shortcut is added), NaN
propagated by the ReLU as torch's. Other devices, layouts and dtypes take the eager path.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path serves them
    triton = None

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE_ELEMENTS = 4096  # elements per program: rows x columns of the tile


def affine_relu(x, weight, bias, residual=None, residual_affine=None):
    """relu(x * weight[c] + bias[c] (+ residual)) for x of shape (N, C, H, W); weight and bias
    (C,) are constants (no gradient flows to them), already in x's dtype. residual_affine, a
    (weight, bias) pair like them, is applied to residual first (a projection shortcut's affine)."""
    if _use_kernel(x, weight, residual):
        return affine_relu_op(x, weight, bias, residual, *(residual_affine or (None, None)))
    return eager_affine_relu(x, weight, bias, residual, residual_affine)


def affine(x, weight, bias):
    """x * weight[c] + bias[c] for x of shape (N, C, ...): AffineChannel's operation."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    return torch.addcmul(bias.view(shape), x, weight.view(shape))


def eager_affine_relu(x, weight, bias, residual=None, residual_affine=None):
    """affine_relu with PyTorch's element-wise operations (addcmul, add, relu)."""
    if residual_affine is not None:
        residual = affine(residual, *residual_affine)
    return sum_relu(affine(x, weight, bias), residual)


def sum_relu(y, residual=None):
    """relu(y (+ residual)); y may be overwritten."""
    if residual is not None:
        y = y + residual
    return F.relu(y, inplace=True)


def _use_kernel(x, weight, residual):
    if triton is None or not x.is_cuda or x.dim() != 4 or x.dtype not in _KERNEL_DTYPES:
        return False
    if weight.dtype != x.dtype or dense_layout(x) is None:
        return False
    return residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                and dense_layout(residual) == dense_layout(x))


def dense_layout(x):
    """'channels_last' or 'nchw' for a dense 4-D tensor in one of those orders, else None."""
    if x.is_contiguous(memory_format=torch.channels_last):
        return 'channels_last'  # checked first: a tensor with H = W = 1 is both
    return 'nchw' if x.is_contiguous() else None


def _launch(kernel, x, weight, *tensors, **flags):
    """Run kernel over x viewed as a matrix: rows of pixels by channels (channels_last) or rows of
    channel planes by pixels (NCHW)."""
    n, channels, height, width = x.shape
    channels_last = dense_layout(x) == 'channels_last'
    rows, cols = (n * height * width, channels) if channels_last else (n * channels, height * width)
    block_cols = min(triton.next_power_of_2(cols), 256 if channels_last else 1024)
    block_rows = max(1, _TILE_ELEMENTS // block_cols)
    grid = (triton.cdiv(rows, block_rows), triton.cdiv(cols, block_cols))
    kernel[grid](*tensors, weight, rows, cols, channels, CHANNELS_LAST=channels_last,
                 BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, **flags)


def _kernel_forward(x, weight, bias, residual, residual_weight, residual_bias):
    y = torch.empty_like(x)
    has_residual, residual_affine = residual is not None, residual_weight is not None
    _launch(_forward_kernel, x, weight, x, residual if has_residual else x, bias, y,
            residual_weight if residual_affine else weight, residual_bias if residual_affine else bias,
            HAS_RESIDUAL=has_residual, RESIDUAL_AFFINE=residual_affine)
    return y


def _kernel_backward(grad_y, y, weight, residual_weight, has_residual, residual_affine):
    """[grad_x] or [grad_x, grad_residual] of the kernel's output y."""
    grad_y = grad_y.contiguous(memory_format=_memory_format(y))
    grad_x = torch.empty_like(y)
    grad_residual = torch.empty_like(y) if has_residual else None
    _launch(_backward_kernel, y, weight, grad_y, y, grad_x, grad_residual if has_residual else grad_x,
            residual_weight, HAS_RESIDUAL=has_residual, RESIDUAL_AFFINE=residual_affine)
    return [grad_x, grad_residual] if has_residual else [grad_x]


class _AffineReLU(torch.autograd.Function):
    """The kernels as an autograd Function (the custom op below is their traceable form)."""
    @staticmethod
    def forward(ctx, x, weight, bias, residual, residual_weight, residual_bias):
        y = _kernel_forward(x, weight, bias, residual, residual_weight, residual_bias)
        ctx.has_residual, ctx.residual_affine = residual is not None, residual_weight is not None
        ctx.save_for_backward(y, weight, residual_weight if ctx.residual_affine else weight)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        y, weight, residual_weight = ctx.saved_tensors
        grads = _kernel_backward(grad_y, y, weight, residual_weight, ctx.has_residual, ctx.residual_affine)
        return grads[0], None, None, grads[1] if ctx.has_residual else None, None, None


# torch.library custom ops (torch.export, torch.compile): the kernels on CUDA with Triton, else the
# plain-torch reference, so that an exported CUDA model also runs where Triton is absent.
@torch.library.custom_op('detectron::affine_relu', mutates_args=())
def affine_relu_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor],
                   residual_weight: Optional[torch.Tensor], residual_bias: Optional[torch.Tensor]) -> torch.Tensor:
    if triton is not None and x.is_cuda:
        return _kernel_forward(x, weight, bias, residual, residual_weight, residual_bias)
    residual_affine = None if residual_weight is None else (residual_weight, residual_bias)
    return eager_affine_relu(x, weight, bias, residual, residual_affine)


@affine_relu_op.register_fake
def _(x, weight, bias, residual, residual_weight, residual_bias):
    return torch.empty_like(x)


@torch.library.custom_op('detectron::affine_relu_backward', mutates_args=())
def affine_relu_backward_op(grad_y: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                            residual_weight: torch.Tensor, has_residual: bool,
                            residual_affine: bool) -> List[torch.Tensor]:
    """[grad_x] or [grad_x, grad_residual]: the backward kernel, or the reference's gradients."""
    if triton is not None and y.is_cuda:
        return _kernel_backward(grad_y, y, weight, residual_weight, has_residual, residual_affine)
    passed = grad_y * (y > 0)
    shape = (1, -1) + (1,) * (y.dim() - 2)
    grads = [passed * weight.view(shape)]
    if has_residual:
        grads.append(passed * residual_weight.view(shape) if residual_affine else passed.clone())
    return grads


@affine_relu_backward_op.register_fake
def _(grad_y, y, weight, residual_weight, has_residual, residual_affine):
    return [torch.empty_like(y) for _ in range(2 if has_residual else 1)]


def _op_setup_context(ctx, inputs, output):
    _, weight, _, residual, residual_weight, _ = inputs
    ctx.has_residual, ctx.residual_affine = residual is not None, residual_weight is not None
    ctx.save_for_backward(output, weight, residual_weight if ctx.residual_affine else weight)


def _op_backward(ctx, grad_y):
    y, weight, residual_weight = ctx.saved_tensors
    grads = affine_relu_backward_op(grad_y, y, weight, residual_weight, ctx.has_residual, ctx.residual_affine)
    return grads[0], None, None, grads[1] if ctx.has_residual else None, None, None


affine_relu_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def _memory_format(x):
    return torch.channels_last if dense_layout(x) == 'channels_last' else torch.contiguous_format


if triton is not None:
    @triton.jit
    def _tile(rows, cols, CHANNELS_LAST: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
        """This program's row and column indices, element offsets and in-bounds mask."""
        r = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        c = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        offsets = r.to(tl.int64)[:, None] * cols + c[None, :]
        inside = (r < rows)[:, None] & (c < cols)[None, :]
        return r, c, offsets, inside

    @triton.jit
    def _per_channel(ptr, r, c, rows, cols, channels, CHANNELS_LAST: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     BLOCK_COLS: tl.constexpr):
        """The tile's per-channel values as float32: one per column (channels_last) or one per row
        (NCHW: row r is the plane of channel r % C)."""
        if CHANNELS_LAST:
            values = tl.load(ptr + c, mask=c < cols, other=0.0).to(tl.float32)[None, :]
        else:
            values = tl.load(ptr + r % channels, mask=r < rows, other=0.0).to(tl.float32)[:, None]
        return tl.broadcast_to(values, (BLOCK_ROWS, BLOCK_COLS))

    # The pixel count (rows, channels_last) changes with every image size: specialising on its
    # divisibility would compile a kernel per new combination (BENCHMARKS.md, "Start-up").
    @triton.jit(do_not_specialize=['rows'])
    def _forward_kernel(x_ptr, residual_ptr, bias_ptr, y_ptr, residual_weight_ptr, residual_bias_ptr, weight_ptr,
                        rows, cols, channels, CHANNELS_LAST: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                        BLOCK_COLS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, RESIDUAL_AFFINE: tl.constexpr):
        r, c, offsets, inside = _tile(rows, cols, CHANNELS_LAST, BLOCK_ROWS, BLOCK_COLS)
        dtype = y_ptr.dtype.element_ty
        x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        w = _per_channel(weight_ptr, r, c, rows, cols, channels, CHANNELS_LAST, BLOCK_ROWS, BLOCK_COLS)
        b = _per_channel(bias_ptr, r, c, rows, cols, channels, CHANNELS_LAST, BLOCK_ROWS, BLOCK_COLS)
        y = (x * w + b).to(dtype)  # addcmul's result, rounded as it stores it
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
            if RESIDUAL_AFFINE:  # the shortcut's addcmul, rounded as it stores it
                rw = _per_channel(residual_weight_ptr, r, c, rows, cols, channels, CHANNELS_LAST, BLOCK_ROWS,
                                  BLOCK_COLS)
                rb = _per_channel(residual_bias_ptr, r, c, rows, cols, channels, CHANNELS_LAST, BLOCK_ROWS,
                                  BLOCK_COLS)
                residual = (residual * rw + rb).to(dtype).to(tl.float32)
            y = (y.to(tl.float32) + residual).to(dtype)
        y = tl.maximum(y.to(tl.float32), 0.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(y_ptr + offsets, y.to(dtype), mask=inside)

    @triton.jit(do_not_specialize=['rows'])
    def _backward_kernel(grad_y_ptr, y_ptr, grad_x_ptr, grad_residual_ptr, residual_weight_ptr, weight_ptr, rows,
                         cols, channels, CHANNELS_LAST: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                         BLOCK_COLS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, RESIDUAL_AFFINE: tl.constexpr):
        r, c, offsets, inside = _tile(rows, cols, CHANNELS_LAST, BLOCK_ROWS, BLOCK_COLS)
        dtype = grad_x_ptr.dtype.element_ty
        grad = tl.load(grad_y_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        grad = tl.where(y <= 0.0, 0.0, grad)  # threshold_backward's rule (a NaN output passes the gradient)
        if HAS_RESIDUAL:
            grad_residual = grad
            if RESIDUAL_AFFINE:  # addcmul's backward: the gradient times the shortcut's weight
                grad_residual = grad * _per_channel(residual_weight_ptr, r, c, rows, cols, channels, CHANNELS_LAST,
                                                    BLOCK_ROWS, BLOCK_COLS)
            tl.store(grad_residual_ptr + offsets, grad_residual.to(dtype), mask=inside)
        w = _per_channel(weight_ptr, r, c, rows, cols, channels, CHANNELS_LAST, BLOCK_ROWS, BLOCK_COLS)
        tl.store(grad_x_ptr + offsets, (grad * w).to(dtype), mask=inside)
