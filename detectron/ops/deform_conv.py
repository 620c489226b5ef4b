"""Modulated deformable convolution (DCNv2) as CenterNet's backbones use it.

CenterNet ships a compiled DCNv2 extension (`DCN` in its `networks/DCNv2/dcn_v2.py`); this module
computes the same function from torch ops (bilinear sampling by `grid_sample`, then one matmul), so
nothing has to be compiled and the CPU works too. Parameter names and shapes are CenterNet's
(`weight`, `bias`, `conv_offset_mask.weight`, `conv_offset_mask.bias`), so its checkpoints load tensor
for tensor.

Why not `torchvision.ops.deform_conv2d`, which computes the same function: it replays wrong values from
a CUDA graph (torchvision 0.26, BENCHMARKS.md "CenterNet speed"), so a detector with it cannot be graphed at batch 1, and
under autocast it runs its im2col / col2im and the matmul in float32. Here the sampling positions and
the bilinear sampling stay in float32 (a bfloat16 position would be off by up to half a pixel at 128)
and the matmul follows autocast like any convolution. tests/ops/test_deform_conv.py checks both against a
loop-by-loop DCNv2.

Inference on CUDA (no gradient asked) samples by one Triton kernel with DCNv2's own bilinear
arithmetic instead, writing the masked columns once in the matmul's dtype: grid_sample's path passes
three times over the columns, the largest tensor of the up-sampling path.

The offset/mask layout is DCNv2's: for kernel tap t = i * kw + j, offset channel 2t is the vertical
and 2t + 1 the horizontal displacement and mask channel t the modulation; a sample at (y, x) is the
bilinear interpolation of its four neighbours, those outside the image reading zero (zero unless
-1 < y < H and -1 < x < W).
"""

import functools

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # grid_sample does the sampling everywhere
    triton = None

# The kernel computes in float32: float64 inputs keep grid_sample's float64 path.
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_KERNEL_BLOCK_CHANNELS = 8
_KERNEL_BLOCK_PIXELS = 128


def modulated_deform_conv2d(x, offset, mask, weight, bias, stride=1, padding=0):
    """DCNv2 of x (N, C, H, W) with offsets (N, 2 * taps, Ho, Wo), masks (N, taps, Ho, Wo) and a
    (O, C, kh, kw) weight -> (N, O, Ho, Wo); one offset group, dilation 1."""
    n = x.shape[0]
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[-2:]
    if _use_sampling_kernel(x, offset, mask, weight):
        columns = sampled_columns_triton(x, offset, mask, kh, kw, stride, padding)
    else:
        columns = sampled_columns(x, offset, mask, kh, kw, stride, padding)
    out = torch.matmul(weight.reshape(out_channels, -1), columns)
    return (out + bias.view(-1, 1).to(out.dtype)).view(n, out_channels, out_h, out_w)


def sampled_columns(x, offset, mask, kh, kw, stride, padding):
    """DCNv2's masked im2col columns (N, C * taps, Ho * Wo), row c * taps + t: channel c of x
    sampled bilinearly at tap t's displaced positions, times tap t's mask; float32 (float64 for
    float64 inputs), by grid_sample (differentiable)."""
    n, channels, height, width = x.shape
    out_h, out_w = offset.shape[-2:]
    taps = kh * kw
    sample_dtype = torch.promote_types(x.dtype, torch.float32)
    offset = offset.to(sample_dtype).reshape(n, taps, 2, out_h, out_w)
    tap_y, tap_x = _tap_positions(kh, kw, out_h, out_w, stride, padding, x.device, sample_dtype)
    sample_y = tap_y + offset[:, :, 0]
    sample_x = tap_x + offset[:, :, 1]
    # grid_sample's coordinates for align_corners=False: pixel p <-> (2p + 1) / size - 1.
    grid = torch.stack(((2 * sample_x + 1) / width - 1, (2 * sample_y + 1) / height - 1), dim=-1)
    columns = F.grid_sample(x.to(sample_dtype), grid.view(n, taps * out_h, out_w, 2), mode='bilinear',
                            padding_mode='zeros', align_corners=False)
    columns = columns.view(n, channels, taps, out_h * out_w) * mask.to(sample_dtype).view(n, 1, taps, -1)
    return columns.view(n, channels * taps, -1)


def _tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype):
    """Where each tap t = i * kw + j of each output pixel reads without offset: (taps, Ho, 1) rows
    and (taps, 1, Wo) columns. Made once per shape and device (about ten small kernels, a sizeable
    share of a batch-1 forward); a CUDA graph capture makes its own, since tensors made while
    capturing hold their values only in the graph's replays."""
    if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():
        return _make_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype)
    return _cached_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype)


def _make_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype):
    rows = torch.arange(out_h, device=device, dtype=dtype) * stride - padding
    cols = torch.arange(out_w, device=device, dtype=dtype) * stride - padding
    tap_i = torch.arange(kh, device=device, dtype=dtype).repeat_interleave(kw)
    tap_j = torch.arange(kw, device=device, dtype=dtype).repeat(kh)
    return rows.view(1, -1, 1) + tap_i.view(-1, 1, 1), cols.view(1, 1, -1) + tap_j.view(-1, 1, 1)


_cached_tap_positions = functools.lru_cache(maxsize=256)(_make_tap_positions)


def _use_sampling_kernel(x, offset, mask, weight):
    """The Triton kernel serves CUDA inference: no gradient asked, 16- or 32-bit inputs."""
    if triton is None or not x.is_cuda:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, offset, mask, weight)):
        return False
    return all(t.dtype in _KERNEL_DTYPES for t in (x, offset, mask))


def sampled_columns_triton(x, offset, mask, kh, kw, stride, padding):
    """sampled_columns of CUDA tensors by one Triton kernel, without gradient: DCNv2's own
    arithmetic (dmcn_im2col_bilinear: positions in pixels, float32 weights and sum, times the mask),
    the columns written once in the dtype the matmul takes them in (autocast's, else float32).
    grid_sample's path writes float32 columns, multiplies them by the mask and autocast casts them:
    three passes over the largest tensor of the up-sampling path."""
    x = x.contiguous()  # the kernel reads along a channel's rows
    n, channels, height, width = x.shape
    out_h, out_w = offset.shape[-2:]
    pixels = out_h * out_w
    if torch.is_autocast_enabled('cuda'):
        dtype = torch.get_autocast_dtype('cuda')
    else:
        dtype = torch.promote_types(x.dtype, torch.float32)
    columns = torch.empty((n, channels * kh * kw, pixels), dtype=dtype, device=x.device)
    grid = (triton.cdiv(pixels, _KERNEL_BLOCK_PIXELS), triton.cdiv(channels, _KERNEL_BLOCK_CHANNELS), n)
    _sampled_columns_kernel[grid](x, offset, mask, columns, channels, height, width, out_w, pixels,
                                  *x.stride(), *offset.stride(), *mask.stride(), stride, padding,
                                  KH=kh, KW=kw, BLOCK_C=_KERNEL_BLOCK_CHANNELS, BLOCK_P=_KERNEL_BLOCK_PIXELS)
    return columns


if triton is not None:
    @triton.jit
    def _sampled_columns_kernel(x_ptr, offset_ptr, mask_ptr, out_ptr, channels, height, width, out_w, pixels,
                                x_sn, x_sc, x_sh, x_sw, o_sn, o_sc, o_sh, o_sw, m_sn, m_sc, m_sh, m_sw,
                                stride, padding, KH: tl.constexpr, KW: tl.constexpr,
                                BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
        """out[n, c * taps + t, p] for one image's tile of channels x output pixels. As grid_sample
        does, neighbouring threads take neighbouring pixels of one channel plane. The taps are a
        loop the compiler keeps (not unrolled): unrolled taps x channels made Triton's first
        compile of this kernel much slower (BENCHMARKS.md, "Start-up")."""
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        n = tl.program_id(2).to(tl.int64)
        p_in = p < pixels
        c_in = (c < channels)[:, None]
        oy, ox = p // out_w, p % out_w
        offsets = offset_ptr + n * o_sn + oy * o_sh + ox * o_sw
        masks = mask_ptr + n * m_sn + oy * m_sh + ox * m_sw
        planes = x_ptr + n * x_sn + c.to(tl.int64)[:, None] * x_sc
        out_rows = out_ptr + n * channels * (KH * KW * pixels) + c.to(tl.int64)[:, None] * (KH * KW * pixels) + p[None, :]
        for t in range(KH * KW):
            dy = tl.load(offsets + (2 * t) * o_sc, mask=p_in, other=0.0).to(tl.float32)
            dx = tl.load(offsets + (2 * t + 1) * o_sc, mask=p_in, other=0.0).to(tl.float32)
            m = tl.load(masks + t * m_sc, mask=p_in, other=0.0).to(tl.float32)
            y = (oy * stride - padding + t // KW).to(tl.float32) + dy
            x = (ox * stride - padding + t % KW).to(tl.float32) + dx
            # DCNv2 samples only inside -1 < y < H, -1 < x < W (NaN positions fail too).
            inside = p_in & (y > -1.0) & (x > -1.0) & (y < height) & (x < width)
            y_low, x_low = tl.floor(y), tl.floor(x)
            ly, lx = y - y_low, x - x_low
            hy, hx = 1.0 - ly, 1.0 - lx
            w1, w2, w3, w4 = hy * hx, hy * lx, ly * hx, ly * lx
            y0 = tl.where(inside, y_low, 0.0).to(tl.int64)
            x0 = tl.where(inside, x_low, 0.0).to(tl.int64)
            top, bottom = inside & (y0 >= 0), inside & (y0 + 1 < height)
            left, right = x0 >= 0, x0 + 1 < width
            corner = planes + (y0 * x_sh + x0 * x_sw)[None, :]
            v1 = tl.load(corner, mask=c_in & (top & left)[None, :], other=0.0).to(tl.float32)
            v2 = tl.load(corner + x_sw, mask=c_in & (top & right)[None, :], other=0.0).to(tl.float32)
            v3 = tl.load(corner + x_sh, mask=c_in & (bottom & left)[None, :], other=0.0).to(tl.float32)
            v4 = tl.load(corner + x_sh + x_sw, mask=c_in & (bottom & right)[None, :], other=0.0).to(tl.float32)
            value = w1[None, :] * v1 + w2[None, :] * v2 + w3[None, :] * v3 + w4[None, :] * v4
            value = tl.where(inside[None, :], value, 0.0) * m[None, :]
            tl.store(out_rows + t * pixels, value.to(out_ptr.dtype.element_ty), mask=c_in & p_in[None, :])
