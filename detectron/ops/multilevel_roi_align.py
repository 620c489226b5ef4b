"""RoIAlign of every RoI on its own FPN level, as Triton kernels on CUDA (forward and backward).

The eager path (roi_pooling.roi_feature_transform) sorts the RoIs by level, reads the level counts
on the host (a synchronisation), casts every level to float32 and hands torchvision's roi_align
NCHW copies of the channels_last features; its backward zero-fills float32 NCHW gradients, casts
them back and reorders them for the body. These kernels read each RoI's level where it lies, in its
dtype and memory order, keep the RoIs in their order, and accumulate the gradients in float32 in
the features' own layout (BENCHMARKS.md, "Training speed"). The arithmetic is torchvision's
(aligned=False, Detectron's RoIAlign): float32 sample positions, the same boundary rules, the sum
of the samples divided by their count.
"""
from typing import List

import torch
from torchvision.ops import roi_align

from detectron.ops.affine_relu import dense_layout

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path serves them
    triton = None

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE_ELEMENTS = 2048  # bins x channels per program


def kernel_applies(features, rois, sampling_ratio):
    """Whether roi_align_levels can run: up to MAX_LEVELS CUDA features of one kernel dtype, channel
    count, batch and dense layout (NCHW or channels_last), float32 RoIs, a fixed sampling ratio (0,
    torchvision's adaptive grid, takes the eager path)."""
    first = features[0]
    if not (triton is not None and first.is_cuda and rois.is_cuda and sampling_ratio > 0
            and rois.dtype == torch.float32 and first.dtype in _KERNEL_DTYPES and len(features) <= MAX_LEVELS
            and all(f.dim() == 4 for f in features)):
        return False
    layout = dense_layout(first)
    return layout is not None and all(f.is_cuda and f.dtype == first.dtype and f.shape[:2] == first.shape[:2]
                                      and dense_layout(f) == layout for f in features)


def roi_align_levels(features, rois, levels, spatial_scales, output_size, sampling_ratio):
    """(R, C, output_size, output_size) in the features' dtype: RoI r aligned on features[levels[r]]
    (levels: int64 indices into features) at spatial_scales[levels[r]]; rois (R, 5) float32 =
    (batch index, x1, y1, x2, y2) in network-input coordinates. Differentiable in the features."""
    return roi_align_levels_op(rois, levels, [float(s) for s in spatial_scales], output_size, sampling_ratio,
                               list(features))


MAX_LEVELS = 4  # the kernels take one pointer per level (FPN's P2..P5)


# A torch.library custom op (torch.export, torch.compile): the kernels on CUDA with Triton, else the
# plain-torch reference (torchvision's roi_align per level), so that an exported CUDA model also runs
# where Triton is absent.
@torch.library.custom_op('detectron::roi_align_levels', mutates_args=())
def roi_align_levels_op(rois: torch.Tensor, levels: torch.Tensor, spatial_scales: List[float], output_size: int,
                        sampling_ratio: int, features: List[torch.Tensor]) -> torch.Tensor:
    first = features[0]
    if triton is not None and rois.is_cuda:
        out = torch.empty((len(rois), first.shape[1], output_size, output_size), dtype=first.dtype,
                          device=first.device)
        _launch(features, out, rois.contiguous(), levels.contiguous(), spatial_scales, sampling_ratio,
                backward=False)
        return out
    return _reference(rois, levels, spatial_scales, output_size, sampling_ratio, features).to(first.dtype)


@roi_align_levels_op.register_fake
def _(rois, levels, spatial_scales, output_size, sampling_ratio, features):
    return features[0].new_empty((rois.shape[0], features[0].shape[1], output_size, output_size))


def _reference(rois, levels, spatial_scales, output_size, sampling_ratio, features):
    """Float32 (R, C, S, S): RoI r pooled by torchvision's roi_align (aligned=False) on its level."""
    out = rois.new_zeros((rois.shape[0], features[0].shape[1], output_size, output_size))
    for k, (feature, scale) in enumerate(zip(features, spatial_scales)):
        rows = (levels == k).nonzero().squeeze(1)
        out = out.index_put((rows,), roi_align(feature.float(), rois[rows].float(), output_size, spatial_scale=scale,
                                               sampling_ratio=sampling_ratio, aligned=False))
    return out


@torch.library.custom_op('detectron::roi_align_levels_backward', mutates_args=())
def roi_align_levels_backward_op(grad_out: torch.Tensor, rois: torch.Tensor, levels: torch.Tensor,
                                 spatial_scales: List[float], sampling_ratio: int, sizes: List[int],
                                 strides: List[int], dtype: torch.dtype) -> List[torch.Tensor]:
    """The levels' gradients (level k of sizes[4k:4k+4], strides[4k:4k+4]): float32 sums in the
    levels' own layouts, rounded to dtype once."""
    layouts = [(sizes[i:i + 4], strides[i:i + 4]) for i in range(0, len(sizes), 4)]
    grads = [torch.empty_strided(size, stride, dtype=torch.float32, device=grad_out.device).zero_()
             for size, stride in layouts]
    if triton is not None and grad_out.is_cuda:
        _launch(grads, grad_out.contiguous(), rois.contiguous(), levels.contiguous(), spatial_scales,
                sampling_ratio, backward=True)
    else:  # torchvision's roi_align backward on each level's RoIs
        size = grad_out.shape[-1]
        for k, (grad, scale) in enumerate(zip(grads, spatial_scales)):
            rows = (levels == k).nonzero().squeeze(1)
            grad.copy_(torch.ops.torchvision._roi_align_backward(
                grad_out[rows].float(), rois[rows].float(), scale, size, size, *grad.shape, sampling_ratio, False))
    return [grad.to(dtype) for grad in grads]


@roi_align_levels_backward_op.register_fake
def _(grad_out, rois, levels, spatial_scales, sampling_ratio, sizes, strides, dtype):
    return [grad_out.new_empty(sizes[i:i + 4], dtype=dtype) for i in range(0, len(sizes), 4)]


def _op_setup_context(ctx, inputs, output):
    rois, levels, spatial_scales, _, sampling_ratio, features = inputs
    ctx.save_for_backward(rois, levels)
    ctx.spatial_scales, ctx.sampling_ratio = spatial_scales, sampling_ratio
    ctx.sizes = [n for f in features for n in f.shape]
    ctx.strides = [n for f in features for n in f.stride()]
    ctx.dtype = features[0].dtype


def _op_backward(ctx, grad_out):
    rois, levels = ctx.saved_tensors
    grads = roi_align_levels_backward_op(grad_out, rois, levels, ctx.spatial_scales, ctx.sampling_ratio, ctx.sizes,
                                         ctx.strides, ctx.dtype)
    return None, None, None, None, None, grads


roi_align_levels_op.register_autograd(_op_backward, setup_context=_op_setup_context)


def _launch(levels_data, pooled, rois, levels, spatial_scales, sampling_ratio, backward):
    """The kernel over (RoI, block of channels) programs, all levels in one launch: `levels_data` are
    the levels' tensors (backward: their float32 gradients), `pooled` the (R, C, S, S) output
    (backward: its gradient)."""
    num_rois, channels, output_size = pooled.shape[:3]
    if num_rois == 0:
        return
    padding = MAX_LEVELS - len(levels_data)  # unused pointer slots repeat the first level
    data = list(levels_data) + [levels_data[0]] * padding
    heights = [t.shape[2] for t in data]
    widths = [t.shape[3] for t in data]
    scales = [float(s) for s in spatial_scales] + [1.0] * padding
    block_bins = triton.next_power_of_2(output_size * output_size)
    block_c = min(triton.next_power_of_2(channels), max(1, _TILE_ELEMENTS // block_bins))
    grid = (num_rois, triton.cdiv(channels, block_c))
    _kernel[grid](*data, pooled, rois, levels, *heights, *widths, *scales, channels, BACKWARD=backward,
                  CHANNELS_LAST=dense_layout(levels_data[0]) == 'channels_last', POOLED=output_size,
                  SAMPLING=sampling_ratio, BLOCK_BINS=block_bins, BLOCK_C=block_c)


if triton is not None:
    @triton.jit
    def _roi_level(levels_ptr, r, p0, p1, p2, p3, h0, h1, h2, h3, w0, w1, w2, w3, s0, s1, s2, s3):
        """RoI r's level: its tensor, height, width and spatial scale."""
        level = tl.load(levels_ptr + r)
        ptr, height, width, scale = p0, h0, w0, s0
        if level == 1:
            ptr, height, width, scale = p1, h1, w1, s1
        if level == 2:
            ptr, height, width, scale = p2, h2, w2, s2
        if level == 3:
            ptr, height, width, scale = p3, h3, w3, s3
        return ptr, height, width, scale

    @triton.jit
    def _strides(height, width, channels, CHANNELS_LAST: tl.constexpr):
        """Element strides (batch, channel, row, column) of a dense level, as int64."""
        height, width, channels = height.to(tl.int64), width.to(tl.int64), channels.to(tl.int64)
        one = height * 0 + 1  # an int64 1: both branches return one type
        if CHANNELS_LAST:
            return height * width * channels, one, width * channels, channels
        return channels * height * width, height * width, width, one

    @triton.jit
    def _bins_and_channels(channels, POOLED: tl.constexpr, BLOCK_BINS: tl.constexpr, BLOCK_C: tl.constexpr):
        """This program's output bins (index, row, column, in-range) and channels (index, in-range)."""
        bins = tl.arange(0, BLOCK_BINS)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        return bins, bins // POOLED, bins % POOLED, bins < POOLED * POOLED, c, c < channels

    @triton.jit
    def _roi_geometry(rois_ptr, r, scale, POOLED: tl.constexpr):
        """torchvision's aligned=False RoI: batch index, start (y, x) and bin size (h, w) in the
        level's pixels, the RoI's sides at least 1."""
        batch = tl.load(rois_ptr + r * 5).to(tl.int64)
        start_x = tl.load(rois_ptr + r * 5 + 1) * scale
        start_y = tl.load(rois_ptr + r * 5 + 2) * scale
        end_x = tl.load(rois_ptr + r * 5 + 3) * scale
        end_y = tl.load(rois_ptr + r * 5 + 4) * scale
        # div_rn: float32 `/` is approximate on NVIDIA GPUs; torchvision's CUDA division is IEEE.
        bin_h = tl.div_rn(tl.maximum(end_y - start_y, 1.0), POOLED * 1.0)
        bin_w = tl.div_rn(tl.maximum(end_x - start_x, 1.0), POOLED * 1.0)
        return batch, start_y, start_x, bin_h, bin_w

    @triton.jit
    def _sample_position(start, bin_index, bin_size, i, SAMPLING: tl.constexpr):
        """The i-th sample's coordinate in a bin, torchvision's expression and order."""
        return start + bin_index.to(tl.float32) * bin_size + tl.div_rn((i + 0.5) * bin_size, SAMPLING * 1.0)

    @triton.jit
    def _bilinear_corners(y, x, height, width):
        """torchvision's bilinear_interpolate: whether the point counts, its four neighbours' rows and
        columns (low, high) and their weights w1..w4 (top-left, top-right, bottom-left, bottom-right)."""
        valid = (y >= -1.0) & (y <= height.to(tl.float32)) & (x >= -1.0) & (x <= width.to(tl.float32))
        y = tl.maximum(y, 0.0)
        x = tl.maximum(x, 0.0)
        y_low = y.to(tl.int32)
        x_low = x.to(tl.int32)
        y_edge = y_low >= height - 1
        x_edge = x_low >= width - 1
        y_low = tl.where(y_edge, height - 1, y_low)
        x_low = tl.where(x_edge, width - 1, x_low)
        y_high = tl.where(y_edge, y_low, y_low + 1)
        x_high = tl.where(x_edge, x_low, x_low + 1)
        ly = tl.where(y_edge, y_low.to(tl.float32), y) - y_low.to(tl.float32)
        lx = tl.where(x_edge, x_low.to(tl.float32), x) - x_low.to(tl.float32)
        hy = 1.0 - ly
        hx = 1.0 - lx
        return valid, y_low, y_high, x_low, x_high, hy * hx, hy * lx, ly * hx, ly * lx

    @triton.jit
    def _sample(base, start_y, start_x, ph, pw, bin_h, bin_w, iy, ix, height, width, bin_ok, c_ok,
                stride_h, stride_w, SAMPLING: tl.constexpr):
        """Sample (iy, ix) of every bin: which (bin, channel) elements it reads (`inside`), the
        pointers of its four neighbours and their weights (top-left, top-right, bottom-left,
        bottom-right), each (bins, channels) or (bins, 1)."""
        y = _sample_position(start_y, ph, bin_h, iy, SAMPLING)
        x = _sample_position(start_x, pw, bin_w, ix, SAMPLING)
        valid, y_low, y_high, x_low, x_high, w1, w2, w3, w4 = _bilinear_corners(y, x, height, width)
        inside = (valid & bin_ok)[:, None] & c_ok[None, :]
        row_low, row_high = y_low.to(tl.int64) * stride_h, y_high.to(tl.int64) * stride_h
        col_low, col_high = x_low.to(tl.int64) * stride_w, x_high.to(tl.int64) * stride_w
        return (inside, base + (row_low + col_low)[:, None], base + (row_low + col_high)[:, None],
                base + (row_high + col_low)[:, None], base + (row_high + col_high)[:, None],
                w1[:, None], w2[:, None], w3[:, None], w4[:, None])

    @triton.jit
    def _program(levels_ptr, rois_ptr, p0, p1, p2, p3, h0, h1, h2, h3, w0, w1, w2, w3, s0, s1, s2, s3, channels,
                 CHANNELS_LAST: tl.constexpr, POOLED: tl.constexpr, BLOCK_BINS: tl.constexpr, BLOCK_C: tl.constexpr):
        """What a (RoI, block of channels) program works on: the pointer of its channels at the RoI's
        image in the RoI's level (p0..p3: the levels or their gradients), that level's height, width
        and row / column strides, the bins' rows, columns and range, the channels' range, the RoI's
        start and bin size, and the offsets and mask of its (bins, channels) in the pooled tensor."""
        r = tl.program_id(0)
        ptr, height, width, scale = _roi_level(levels_ptr, r, p0, p1, p2, p3, h0, h1, h2, h3,
                                               w0, w1, w2, w3, s0, s1, s2, s3)
        stride_n, stride_c, stride_h, stride_w = _strides(height, width, channels, CHANNELS_LAST)
        bins, ph, pw, bin_ok, c, c_ok = _bins_and_channels(channels, POOLED, BLOCK_BINS, BLOCK_C)
        batch, start_y, start_x, bin_h, bin_w = _roi_geometry(rois_ptr, r, scale, POOLED)
        base = ptr + batch * stride_n + c[None, :].to(tl.int64) * stride_c
        pooled = (r.to(tl.int64) * channels + c[None, :]) * (POOLED * POOLED) + bins[:, None]
        return (base, height, width, stride_h, stride_w, ph, pw, bin_ok, c_ok, start_y, start_x, bin_h, bin_w,
                pooled, bin_ok[:, None] & c_ok[None, :])

    # The level sizes change with every image size: specialising on them would compile a kernel per
    # new size (BENCHMARKS.md, "Start-up").
    @triton.jit(do_not_specialize=['h0', 'h1', 'h2', 'h3', 'w0', 'w1', 'w2', 'w3'])
    def _kernel(p0, p1, p2, p3, pooled_ptr, rois_ptr, levels_ptr, h0, h1, h2, h3, w0, w1, w2, w3,
                s0, s1, s2, s3, channels, BACKWARD: tl.constexpr, CHANNELS_LAST: tl.constexpr, POOLED: tl.constexpr,
                SAMPLING: tl.constexpr, BLOCK_BINS: tl.constexpr, BLOCK_C: tl.constexpr):
        """Forward: pooled[r] from the levels p0..p3. BACKWARD: the gradient pooled[r] added into the
        levels' float32 gradients p0..p3."""
        (base, height, width, stride_h, stride_w, ph, pw, bin_ok, c_ok, start_y, start_x, bin_h, bin_w, pooled,
         pooled_ok) = _program(levels_ptr, rois_ptr, p0, p1, p2, p3, h0, h1, h2, h3, w0, w1, w2, w3, s0, s1, s2, s3,
                               channels, CHANNELS_LAST, POOLED, BLOCK_BINS, BLOCK_C)
        count = SAMPLING * SAMPLING * 1.0
        grad = tl.load(pooled_ptr + pooled, mask=pooled_ok & BACKWARD, other=0.0).to(tl.float32)
        total = tl.zeros((BLOCK_BINS, BLOCK_C), dtype=tl.float32)
        for iy in tl.static_range(SAMPLING):
            for ix in tl.static_range(SAMPLING):
                inside, q1, q2, q3, q4, k1, k2, k3, k4 = _sample(
                    base, start_y, start_x, ph, pw, bin_h, bin_w, iy, ix, height, width, bin_ok, c_ok,
                    stride_h, stride_w, SAMPLING)
                if BACKWARD:  # torchvision's order: (gradient x weight) / count, added to each neighbour
                    tl.atomic_add(q1, tl.div_rn(grad * k1, count), mask=inside, sem='relaxed')
                    tl.atomic_add(q2, tl.div_rn(grad * k2, count), mask=inside, sem='relaxed')
                    tl.atomic_add(q3, tl.div_rn(grad * k3, count), mask=inside, sem='relaxed')
                    tl.atomic_add(q4, tl.div_rn(grad * k4, count), mask=inside, sem='relaxed')
                else:
                    v1 = tl.load(q1, mask=inside, other=0.0).to(tl.float32)
                    v2 = tl.load(q2, mask=inside, other=0.0).to(tl.float32)
                    v3 = tl.load(q3, mask=inside, other=0.0).to(tl.float32)
                    v4 = tl.load(q4, mask=inside, other=0.0).to(tl.float32)
                    total += tl.where(inside, k1 * v1 + k2 * v2 + k3 * v3 + k4 * v4, 0.0)
        if not BACKWARD:
            tl.store(pooled_ptr + pooled, tl.div_rn(total, count).to(pooled_ptr.dtype.element_ty), mask=pooled_ok)
