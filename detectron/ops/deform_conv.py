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

On CUDA one Triton kernel samples with DCNv2's own bilinear arithmetic instead, writing the masked
columns once in the matmul's dtype (grid_sample's path passes three times over the columns, the
largest tensor of the up-sampling path); in training a second kernel reads the columns' gradient
once and gives those of x, the offsets and the masks (DCNv2's backward arithmetic).

The offset/mask layout is DCNv2's: for kernel tap t = i * kw + j, offset channel 2t is the vertical
and 2t + 1 the horizontal displacement and mask channel t the modulation; a sample at (y, x) is the
bilinear interpolation of its four neighbours, those outside the image reading zero (zero unless
-1 < y < H and -1 < x < W). Beyond DCN's geometry the op takes torchvision's: offset groups (channel
group g of x sampled at offset group g's positions), weight groups, and (h, w) stride / padding /
dilation; the Triton kernels serve DCN's geometry, grid_sample the rest.
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


def modulated_deform_conv2d(x, offset, mask, weight, bias, stride=1, padding=0, dilation=1):
    """DCNv2 of x (N, C, H, W) with offsets (N, 2 * G * taps, Ho, Wo), masks (N, G * taps, Ho, Wo) and a
    (O, C / groups, kh, kw) weight -> (N, O, Ho, Wo): torchvision.ops.deform_conv2d's function and layout.
    The G offset groups and the weight groups follow from the shapes, as there; stride, padding and
    dilation are an int or an (h, w) pair; mask None is all ones, bias None zero. Inputs of any strides
    (permuted, channels_last, slices of one predictor output) are read as they are where a view can
    (no copy in the contiguous case); an empty batch gives an empty (0, O, Ho, Wo) output."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    n, channels = x.shape[:2]
    out_channels, group_channels, kh, kw = weight.shape
    out_h, out_w = _check_shapes(x, offset, mask, weight, bias, stride, padding, dilation)
    if not _use_sampling_kernel(x, offset, mask, stride, padding, dilation):
        columns = sampled_columns(x, offset, mask, kh, kw, stride, padding, dilation)
    elif torch.is_grad_enabled() and any(t.requires_grad for t in (x, offset, mask)):
        columns = _KernelSampledColumns.apply(x, offset, mask, kh, kw, stride[0], padding[0], _columns_dtype(x))
    else:
        columns = sampled_columns_op(x, offset, mask, kh, kw, stride[0], padding[0], _columns_dtype(x))
    groups = channels // group_channels
    if groups == 1:  # bmm of the broadcast weight: matmul copies the columns (BENCHMARKS.md "CenterNet speed")
        out = torch.bmm(weight.reshape(1, out_channels, group_channels * kh * kw).expand(n, -1, -1), columns)
    else:  # group g's outputs from group g's rows of the columns
        out = torch.matmul(weight.reshape(groups, out_channels // groups, group_channels * kh * kw),
                           columns.reshape(n, groups, group_channels * kh * kw, out_h * out_w))
        out = out.reshape(n, out_channels, out_h * out_w)
    if bias is not None:
        out = out + bias.reshape(out_channels, 1).to(out.dtype)
    return out.reshape(n, out_channels, out_h, out_w)


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


def _check_shapes(x, offset, mask, weight, bias, stride, padding, dilation):
    """The output size (Ho, Wo); a ValueError naming the shapes where they do not fit each other (as
    torchvision refuses them), rather than a reshape error or a silently wrong result."""
    n, channels, height, width = x.shape
    out_channels, group_channels, kh, kw = weight.shape
    taps = kh * kw
    out_h = (height + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    out_w = (width + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    offset_groups = offset.shape[1] // (2 * taps) if offset.dim() == 4 and taps else 0
    problem = None
    if x.dim() != 4 or weight.dim() != 4 or offset.dim() != 4:
        problem = 'x, offset and weight must be 4-d'
    elif min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        problem = 'stride and dilation must be >= 1 and padding >= 0'
    elif taps == 0 or group_channels == 0 or channels % group_channels or out_channels % (channels // group_channels):
        problem = 'the weight does not divide the input channels and its outputs into groups'
    elif out_h < 1 or out_w < 1:
        problem = 'the output would be {} x {} pixels'.format(out_h, out_w)
    elif offset_groups == 0 or offset.shape[1] != 2 * taps * offset_groups or channels % offset_groups:
        problem = 'offset needs 2 * G * {} channels for G offset groups dividing the {} input channels'.format(
            taps, channels)
    elif tuple(offset.shape) != (n, offset.shape[1], out_h, out_w):
        problem = 'offset must be (N, 2 * G * taps, Ho, Wo) = ({}, {}, {}, {})'.format(n, offset.shape[1], out_h, out_w)
    elif mask is not None and tuple(mask.shape) != (n, offset_groups * taps, out_h, out_w):
        problem = 'mask must be (N, G * taps, Ho, Wo) = ({}, {}, {}, {})'.format(n, offset_groups * taps, out_h, out_w)
    elif bias is not None and tuple(bias.shape) != (out_channels,):
        problem = 'bias must hold one value per output channel ({})'.format(out_channels)
    if problem:
        raise ValueError('deformable conv of x {}, offset {}, mask {}, weight {} (stride {}, padding {}, dilation {}): '
                         '{}'.format(tuple(x.shape), tuple(offset.shape), None if mask is None else tuple(mask.shape),
                                     tuple(weight.shape), stride, padding, dilation, problem))
    return out_h, out_w


def sampled_columns(x, offset, mask, kh, kw, stride, padding, dilation=1):
    """DCNv2's masked im2col columns (N, C * taps, Ho * Wo), row c * taps + t: channel c of x
    sampled bilinearly at tap t's displaced positions (those of c's offset group), times tap t's mask
    (None: not masked); float32 (float64 for float64 inputs), by grid_sample (differentiable). Inputs
    of any strides; every reshape is a view where the layout allows one (the contiguous case, DCN's
    channel slices of its predictor output), a copy only where it does not."""
    n, channels, height, width = x.shape
    out_h, out_w = offset.shape[-2:]
    taps = kh * kw
    groups = offset.shape[1] // (2 * taps)
    pixels = out_h * out_w
    sample_dtype = torch.promote_types(x.dtype, torch.float32)
    offset = offset.to(sample_dtype).reshape(n, groups, taps, 2, out_h, out_w)
    tap_y, tap_x = _tap_positions(kh, kw, out_h, out_w, _pair(stride), _pair(padding), _pair(dilation),
                                  x.device, sample_dtype)
    sample_y = tap_y + offset[:, :, :, 0]
    sample_x = tap_x + offset[:, :, :, 1]
    # grid_sample's coordinates for align_corners=False: pixel p <-> (2p + 1) / size - 1.
    grid = torch.stack(((2 * sample_x + 1) / width - 1, (2 * sample_y + 1) / height - 1), dim=-1)
    x = x.to(sample_dtype)
    if groups > 1:  # each offset group's channels sampled at its own positions
        x = x.reshape(n * groups, channels // groups, height, width)
    columns = F.grid_sample(x, grid.reshape(n * groups, taps * out_h, out_w, 2), mode='bilinear',
                            padding_mode='zeros', align_corners=False)
    columns = columns.reshape(n, groups, channels // groups, taps, pixels)
    if mask is not None:
        columns = columns * mask.to(sample_dtype).reshape(n, groups, 1, taps, pixels)
    return columns.reshape(n, channels * taps, pixels)


def _tap_positions(kh, kw, out_h, out_w, stride, padding, dilation, device, dtype):
    """Where each tap t = i * kw + j of each output pixel reads without offset: (taps, Ho, 1) rows
    and (taps, 1, Wo) columns. Made once per shape and device (about ten small kernels, a sizeable
    share of a batch-1 forward); a CUDA graph capture makes its own, since tensors made while
    capturing hold their values only in the graph's replays."""
    if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():
        return _make_tap_positions(kh, kw, out_h, out_w, stride, padding, dilation, device, dtype)
    return _cached_tap_positions(kh, kw, out_h, out_w, stride, padding, dilation, device, dtype)


def _make_tap_positions(kh, kw, out_h, out_w, stride, padding, dilation, device, dtype):
    """stride, padding and dilation are (h, w) pairs."""
    rows = torch.arange(out_h, device=device, dtype=dtype) * stride[0] - padding[0]
    cols = torch.arange(out_w, device=device, dtype=dtype) * stride[1] - padding[1]
    tap_i = (torch.arange(kh, device=device, dtype=dtype) * dilation[0]).repeat_interleave(kw)
    tap_j = (torch.arange(kw, device=device, dtype=dtype) * dilation[1]).repeat(kh)
    return rows.view(1, -1, 1) + tap_i.view(-1, 1, 1), cols.view(1, 1, -1) + tap_j.view(-1, 1, 1)


_cached_tap_positions = functools.lru_cache(maxsize=256)(_make_tap_positions)


def _use_sampling_kernel(x, offset, mask, stride, padding, dilation):
    """The Triton kernels serve CUDA's 16- or 32-bit inputs of DCN's geometry: one offset group, a
    mask, dilation 1, the same stride and padding along both axes."""
    if triton is None or not x.is_cuda or mask is None:
        return False
    if (offset.shape[1] != 2 * mask.shape[1] or dilation != (1, 1) or stride[0] != stride[1]
            or padding[0] != padding[1]):
        return False
    return all(t.dtype in _KERNEL_DTYPES for t in (x, offset, mask))


def _columns_dtype(x):
    """The dtype the matmul takes the columns in: autocast's, else float32 (float64 for float64)."""
    if torch.is_autocast_enabled('cuda'):
        return torch.get_autocast_dtype('cuda')
    return torch.promote_types(x.dtype, torch.float32)


# A torch.library custom op (torch.export, torch.compile): the Triton kernel on CUDA where Triton is
# installed, else the grid_sample reference, so that an exported CUDA model also runs without Triton.
@torch.library.custom_op('detectron::dcn_sampled_columns', mutates_args=())
def sampled_columns_op(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, kh: int, kw: int, stride: int,
                       padding: int, dtype: torch.dtype) -> torch.Tensor:
    """sampled_columns' columns in `dtype` (no gradient: inference only)."""
    if triton is not None and x.is_cuda:
        return _triton_columns(x, offset, mask, kh, kw, stride, padding, dtype)
    return sampled_columns(x, offset, mask, kh, kw, stride, padding).to(dtype)


@sampled_columns_op.register_fake
def _(x, offset, mask, kh, kw, stride, padding, dtype):
    return x.new_empty((x.shape[0], x.shape[1] * kh * kw, offset.shape[-2] * offset.shape[-1]), dtype=dtype)


def _triton_columns(x, offset, mask, kh, kw, stride, padding, dtype):
    """sampled_columns of CUDA tensors by one Triton kernel, without gradient: DCNv2's own
    arithmetic (dmcn_im2col_bilinear: positions in pixels, float32 weights and sum, times the mask),
    the columns written once in `dtype`, the one the matmul takes them in (autocast's, else float32).
    grid_sample's path writes float32 columns, multiplies them by the mask and autocast casts them:
    three passes over the largest tensor of the up-sampling path. One offset group; offset and mask
    are read through their strides (any layout), x made contiguous (the kernel reads along a
    channel's rows); an empty batch or map launches nothing."""
    x = x.contiguous()
    n, channels, height, width = x.shape
    out_h, out_w = offset.shape[-2:]
    pixels = out_h * out_w
    columns = torch.empty((n, channels * kh * kw, pixels), dtype=dtype, device=x.device)
    if columns.numel() == 0:  # a grid of 0 programs is not a launch
        return columns
    grid = (triton.cdiv(pixels, _KERNEL_BLOCK_PIXELS), triton.cdiv(channels, _KERNEL_BLOCK_CHANNELS), n)
    _sampled_columns_kernel[grid](x, offset, mask, columns, channels, height, width, out_w, pixels,
                                  *x.stride(), *offset.stride(), *mask.stride(), stride, padding,
                                  KH=kh, KW=kw, BLOCK_C=_KERNEL_BLOCK_CHANNELS, BLOCK_P=_KERNEL_BLOCK_PIXELS)
    return columns


class _KernelSampledColumns(torch.autograd.Function):
    """sampled_columns_op's columns with gradients for x, offset and mask (training on CUDA): the
    forward is the inference kernel; the backward one Triton kernel reading the columns' gradient
    once. grid_sample's path costs a float32 copy of the columns, the mask's product and its
    gradient, and a reduction for the mask's gradient: passes over the up-sampling path's largest
    tensors (BENCHMARKS.md "CenterNet speed")."""

    @staticmethod
    def forward(ctx, x, offset, mask, kh, kw, stride, padding, dtype):
        x = x.contiguous()
        ctx.save_for_backward(x, offset, mask)
        ctx.geometry = (kh, kw, stride, padding)
        return _triton_columns(x, offset, mask, kh, kw, stride, padding, dtype)

    @staticmethod
    def backward(ctx, grad_columns):
        x, offset, mask = ctx.saved_tensors
        grad_x, grad_offset, grad_mask = _triton_columns_backward(x, offset, mask, grad_columns, *ctx.geometry)
        return grad_x, grad_offset, grad_mask, None, None, None, None, None


def _triton_columns_backward(x, offset, mask, grad_columns, kh, kw, stride, padding):
    """The gradients of _triton_columns' columns for x (contiguous), offset and mask, in their
    dtypes; DCNv2's own backward arithmetic (dmcn_col2im for x, dmcn_col2im_coord for the offsets,
    the sampled values for the mask) in float32. A thread takes one output pixel and loops over a
    group of channels, as grid_sample's backward does; the groups' partial offset and mask gradients
    are summed afterwards in a fixed order, x's by atomic adds as grid_sample's and DCNv2's are."""
    n, channels, height, width = x.shape
    out_h, out_w = offset.shape[-2:]
    pixels = out_h * out_w
    taps = kh * kw
    groups = _backward_channel_groups(n * pixels, channels, x.device)
    group_channels = triton.cdiv(channels, groups)
    groups = triton.cdiv(channels, group_channels)
    grad_x = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    partial = torch.empty((groups, n, 3 * taps, out_h, out_w), dtype=torch.float32, device=x.device)
    if grad_columns.numel():
        grid = (triton.cdiv(pixels, _BACKWARD_BLOCK_PIXELS), groups, n)
        _sampled_columns_backward_kernel[grid](
            x, offset, mask, grad_columns.contiguous(), grad_x, partial, channels, group_channels, height, width,
            out_w, pixels, *offset.stride(), *mask.stride(), stride, padding, n * 3 * taps * pixels,
            KH=kh, KW=kw, BLOCK_P=_BACKWARD_BLOCK_PIXELS)
    grads = partial.sum(0) if groups > 1 else partial[0]
    return (grad_x.to(x.dtype), grads[:, :2 * taps].to(offset.dtype), grads[:, 2 * taps:].to(mask.dtype))


_BACKWARD_BLOCK_PIXELS = 128
_BACKWARD_THREADS_PER_PROCESSOR = 2048


def _backward_channel_groups(pixel_count, channels, device):
    """How many channel groups the backward splits the channels into: enough threads (one per
    pixel and group) to fill the GPU, at least 8 channels a group. A small map with many channels
    (resdcn's first DCN: 32 images x 16 x 16 pixels x 512 channels) would else loop over all its
    channels on a few thousand threads."""
    processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == 'cuda' else 1
    wanted = triton.cdiv(processors * _BACKWARD_THREADS_PER_PROCESSOR, max(pixel_count, 1))
    return max(1, min(wanted, channels // 8))


if triton is not None:
    @triton.jit
    def _tap_sample(offsets, masks, o_sc, m_sc, t, oy, ox, p_in, stride, padding, height, width, KW: tl.constexpr):
        """Tap t of a row of output pixels: its modulation m, whether its sample lies where DCNv2
        samples (-1 < y < H, -1 < x < W; NaN positions fail too), the sample's bilinear fractions
        (ly, lx), its top-left neighbour (y0, x0; 0 outside) and which neighbour rows and columns
        lie inside the map (top, bottom include `inside`; left, right do not)."""
        dy = tl.load(offsets + (2 * t) * o_sc, mask=p_in, other=0.0).to(tl.float32)
        dx = tl.load(offsets + (2 * t + 1) * o_sc, mask=p_in, other=0.0).to(tl.float32)
        m = tl.load(masks + t * m_sc, mask=p_in, other=0.0).to(tl.float32)
        y = (oy * stride - padding + t // KW).to(tl.float32) + dy
        x = (ox * stride - padding + t % KW).to(tl.float32) + dx
        inside = p_in & (y > -1.0) & (x > -1.0) & (y < height) & (x < width)
        y_low, x_low = tl.floor(y), tl.floor(x)
        y0 = tl.where(inside, y_low, 0.0).to(tl.int64)
        x0 = tl.where(inside, x_low, 0.0).to(tl.int64)
        top, bottom = inside & (y0 >= 0), inside & (y0 + 1 < height)
        left, right = x0 >= 0, x0 + 1 < width
        return m, inside, y - y_low, x - x_low, y0, x0, top, bottom, left, right

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
            m, inside, ly, lx, y0, x0, top, bottom, left, right = _tap_sample(
                offsets, masks, o_sc, m_sc, t, oy, ox, p_in, stride, padding, height, width, KW)
            hy, hx = 1.0 - ly, 1.0 - lx
            w1, w2, w3, w4 = hy * hx, hy * lx, ly * hx, ly * lx
            corner = planes + (y0 * x_sh + x0 * x_sw)[None, :]
            v1 = tl.load(corner, mask=c_in & (top & left)[None, :], other=0.0).to(tl.float32)
            v2 = tl.load(corner + x_sw, mask=c_in & (top & right)[None, :], other=0.0).to(tl.float32)
            v3 = tl.load(corner + x_sh, mask=c_in & (bottom & left)[None, :], other=0.0).to(tl.float32)
            v4 = tl.load(corner + x_sh + x_sw, mask=c_in & (bottom & right)[None, :], other=0.0).to(tl.float32)
            value = w1[None, :] * v1 + w2[None, :] * v2 + w3[None, :] * v3 + w4[None, :] * v4
            value = tl.where(inside[None, :], value, 0.0) * m[None, :]
            tl.store(out_rows + t * pixels, value.to(out_ptr.dtype.element_ty), mask=c_in & p_in[None, :])

    @triton.jit
    def _sampled_columns_backward_kernel(x_ptr, offset_ptr, mask_ptr, grad_ptr, grad_x_ptr, partial_ptr, channels,
                                         group_channels, height, width, out_w, pixels,
                                         o_sn, o_sc, o_sh, o_sw, m_sn, m_sc, m_sh, m_sw, stride, padding,
                                         group_stride, KH: tl.constexpr, KW: tl.constexpr, BLOCK_P: tl.constexpr):
        """One image's tile of output pixels, every tap, one group of channels: each thread sums its
        pixel's offset and mask gradients over the group's channels in registers and writes them to
        the group's partial rows (offsets' 2 * taps rows, then the masks' taps rows); x's gradient goes
        to the four neighbours of each sample by atomic adds. x, the columns' gradient and the
        buffers are contiguous; offset and mask are read through their strides."""
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        group = tl.program_id(1)
        n = tl.program_id(2).to(tl.int64)
        p_in = p < pixels
        oy, ox = p // out_w, p % out_w
        taps = KH * KW
        plane = height * width
        c_start = (group * group_channels).to(tl.int64)  # the rows below in int64, as n
        c_end = tl.minimum(c_start + group_channels, channels)
        offsets = offset_ptr + n * o_sn + oy * o_sh + ox * o_sw
        masks = mask_ptr + n * m_sn + oy * m_sh + ox * m_sw
        x_image = x_ptr + n * channels * plane
        grad_x_image = grad_x_ptr + n * channels * plane
        grad_rows = grad_ptr + n * channels * (taps * pixels) + p
        partial_rows = partial_ptr + group * group_stride + n * (3 * taps * pixels) + p
        for t in range(taps):
            m, inside, ly, lx, y0, x0, top, bottom, left, right = _tap_sample(
                offsets, masks, o_sc, m_sc, t, oy, ox, p_in, stride, padding, height, width, KW)
            hy, hx = 1.0 - ly, 1.0 - lx
            w1, w2, w3, w4 = hy * hx, hy * lx, ly * hx, ly * lx
            in1, in2, in3, in4 = top & left, top & right, bottom & left, bottom & right
            corner = y0 * width + x0
            sum_dy = tl.zeros([BLOCK_P], dtype=tl.float32)
            sum_dx = tl.zeros([BLOCK_P], dtype=tl.float32)
            sum_m = tl.zeros([BLOCK_P], dtype=tl.float32)
            for c in range(c_start, c_end):
                g = tl.load(grad_rows + (c * taps + t) * pixels, mask=p_in, other=0.0).to(tl.float32)
                values = x_image + c * plane + corner
                v1 = tl.load(values, mask=in1, other=0.0).to(tl.float32)
                v2 = tl.load(values + 1, mask=in2, other=0.0).to(tl.float32)
                v3 = tl.load(values + width, mask=in3, other=0.0).to(tl.float32)
                v4 = tl.load(values + width + 1, mask=in4, other=0.0).to(tl.float32)
                sum_m += g * (w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4)
                gm = g * m
                sum_dy += gm * (hx * (v3 - v1) + lx * (v4 - v2))
                sum_dx += gm * (hy * (v2 - v1) + ly * (v4 - v3))
                grads = grad_x_image + c * plane + corner
                tl.atomic_add(grads, gm * w1, mask=in1, sem='relaxed')
                tl.atomic_add(grads + 1, gm * w2, mask=in2, sem='relaxed')
                tl.atomic_add(grads + width, gm * w3, mask=in3, sem='relaxed')
                tl.atomic_add(grads + width + 1, gm * w4, mask=in4, sem='relaxed')
            tl.store(partial_rows + (2 * t) * pixels, tl.where(inside, sum_dy, 0.0), mask=p_in)
            tl.store(partial_rows + (2 * t + 1) * pixels, tl.where(inside, sum_dx, 0.0), mask=p_in)
            tl.store(partial_rows + (2 * taps + t) * pixels, tl.where(inside, sum_m, 0.0), mask=p_in)
