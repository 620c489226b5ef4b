"""The ResNet stem's 3 x 3, stride 2, padding 1 max-pool, with a Triton forward and backward for training
on CUDA.

PyTorch's channels_last max-pool keeps an int64 index per output and its backward makes a second pass
to zero the gradient before scattering into it; in CenterNet's resdcn_18 training step at batch 32 the
stem's pool took 1.6 ms of about 28 (BENCHMARKS.md "CenterNet speed"). Here the forward keeps the
winning tap of each window in one byte and the backward gathers each input's gradient from the (at most
four) windows that hold it. Values and gradients are PyTorch's bit for bit: the first maximum of a
window in row-major tap order wins, a NaN wins over any number (the last NaN, as PyTorch's scan), and an
input's gradient is summed in float32 over its windows in row-major output order, then rounded once.
"""
import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # PyTorch's pool everywhere
    triton = None

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK = 1024


def max_pool_3x3_s2(x):
    """F.max_pool2d(x, kernel_size=3, stride=2, padding=1) of an (N, C, H, W) tensor. Where a gradient
    is wanted on CUDA (16- or 32-bit), by the Triton kernels; elsewhere (the CPU, inference, export),
    by PyTorch."""
    if _use_kernels(x):
        return _MaxPool3x3S2.apply(x)
    return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


def _use_kernels(x):
    return (triton is not None and x.is_cuda and x.dim() == 4 and x.dtype in _KERNEL_DTYPES
            and torch.is_grad_enabled() and x.requires_grad and min(x.shape[-2:]) > 0
            and x.numel() < 2 ** 31 and _reach(x) < 2 ** 31)


def _reach(x):
    """The largest element offset of x: the kernels index in int32 (64-bit division is slow)."""
    return sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()))


def _output_size(size):
    return (size - 1) // 2 + 1


class _MaxPool3x3S2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n, channels, height, width = x.shape
        out_h, out_w = _output_size(height), _output_size(width)
        out = torch.empty((n, channels, out_h, out_w), dtype=x.dtype, device=x.device,
                          memory_format=torch.channels_last)
        taps = torch.empty((n, out_h, out_w, channels), dtype=torch.int8, device=x.device)
        if out.numel():
            _forward_kernel[(triton.cdiv(out.numel(), _BLOCK),)](
                x, out, taps, out.numel(), channels, height, width, out_h, out_w, *x.stride(), *out.stride(),
                BLOCK=_BLOCK)
        ctx.save_for_backward(taps)
        ctx.input_shape = x.shape
        ctx.input_layout = torch.channels_last if x.is_contiguous(memory_format=torch.channels_last) \
            else torch.contiguous_format
        return out

    @staticmethod
    def backward(ctx, grad_out):
        taps, = ctx.saved_tensors
        n, channels, height, width = ctx.input_shape
        grad_x = torch.empty(ctx.input_shape, dtype=grad_out.dtype, device=grad_out.device,
                             memory_format=ctx.input_layout)
        if grad_x.numel():
            _backward_kernel[(triton.cdiv(grad_x.numel(), _BLOCK),)](
                grad_out, taps, grad_x, grad_x.numel(), channels, height, width, taps.shape[1], taps.shape[2],
                *grad_out.stride(), *grad_x.stride(), BLOCK=_BLOCK)
        return grad_x


if triton is not None:
    @triton.jit
    def _block_positions(total, channels, height, width, BLOCK: tl.constexpr):
        """A program's block of elements of an (N, H, W, C)-ordered walk (c fastest: coalesced for
        channels_last): their flat index, whether it is below total, and (n, y, x, c)."""
        index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        c = index % channels
        x = (index // channels) % width
        y = (index // (channels * width)) % height
        return index, index < total, index // (channels * width * height), y, x, c

    @triton.jit
    def _forward_kernel(x_ptr, out_ptr, taps_ptr, total, channels, height, width, out_h, out_w,
                        x_sn, x_sc, x_sh, x_sw, o_sn, o_sc, o_sh, o_sw, BLOCK: tl.constexpr):
        """One block of outputs in (n, oh, ow, c) order: the window's maximum and its tap (3 * i + j)
        in PyTorch's scan order."""
        index, valid, n, oh, ow, c = _block_positions(total, channels, out_h, out_w, BLOCK)
        top, left = oh * 2 - 1, ow * 2 - 1
        best = tl.full([BLOCK], float('-inf'), tl.float32)
        # PyTorch starts from the window's first position inside the map.
        tap = tl.where(top < 0, 3, 0) + tl.where(left < 0, 1, 0)
        base = x_ptr + n * x_sn + c * x_sc
        for i in tl.static_range(3):
            for j in tl.static_range(3):
                y, x = top + i, left + j
                inside = valid & (y >= 0) & (y < height) & (x >= 0) & (x < width)
                value = tl.load(base + y * x_sh + x * x_sw, mask=inside, other=float('-inf')).to(tl.float32)
                take = inside & ((value > best) | (value != value))
                best = tl.where(take, value, best)
                tap = tl.where(take, 3 * i + j, tap)
        tl.store(out_ptr + n * o_sn + c * o_sc + oh * o_sh + ow * o_sw, best.to(out_ptr.dtype.element_ty), mask=valid)
        tl.store(taps_ptr + index, tap.to(tl.int8), mask=valid)

    @triton.jit
    def _backward_kernel(grad_out_ptr, taps_ptr, grad_x_ptr, total, channels, height, width, out_h, out_w,
                         g_sn, g_sc, g_sh, g_sw, x_sn, x_sc, x_sh, x_sw, BLOCK: tl.constexpr):
        """One block of inputs in (n, y, x, c) order: the sum, in float32 and row-major output order,
        of the output gradients of the windows whose winning tap is this input."""
        _, valid, n, y, x, c = _block_positions(total, channels, height, width, BLOCK)
        # The windows (rows 2 oh - 1 .. 2 oh + 1) holding row y: oh from y // 2 to (y + 1) // 2, below out_h.
        first_h, first_w = y // 2, x // 2
        last_h = tl.minimum((y + 1) // 2, out_h - 1)
        last_w = tl.minimum((x + 1) // 2, out_w - 1)
        total_grad = tl.zeros([BLOCK], dtype=tl.float32)
        for dh in tl.static_range(2):
            for dw in tl.static_range(2):
                oh, ow = first_h + dh, first_w + dw
                held = valid & (oh <= last_h) & (ow <= last_w)
                window = (n * out_h + oh) * out_w + ow
                winner = tl.load(taps_ptr + window * channels + c, mask=held, other=-1).to(tl.int32)
                mine = held & (winner == (y - (oh * 2 - 1)) * 3 + (x - (ow * 2 - 1)))
                grad = tl.load(grad_out_ptr + n * g_sn + c * g_sc + oh * g_sh + ow * g_sw, mask=mine, other=0.0)
                total_grad += tl.where(mine, grad.to(tl.float32), 0.0)
        tl.store(grad_x_ptr + n * x_sn + c * x_sc + y * x_sh + x * x_sw, total_grad.to(grad_x_ptr.dtype.element_ty),
                 mask=valid)
