"""RoIAlign on the CPU as sparse matrix products, every FPN level at once (forward and backward).

torchvision's CPU roi_align recomputes each sample's bilinear weights for every channel and runs its
backward on one thread, which made it the largest operator of the CPU demos' step (BENCHMARKS.md,
"CPU demos"). Here the k-th sample of every bin is one sparse matrix, whose (RoI, bin) row holds
the sample's 4 corner weights over the pixels of all levels, computed as torchvision computes them
(aligned=False: float32 sample positions, its boundary rules), times the levels' (pixels x
channels); a bin is the sum of its samples in torchvision's order divided by their count, so the
pooled features are torchvision's bit for bit where the sparse product adds each row's 4 products in
order, as it does on the CPUs measured. The features' gradient is the transposed weights times the
output's gradient over the count: torchvision's additions in its order (bit for bit when the count
is a power of two).
"""
import warnings

import torch


def applies(features, rois, sampling_ratio):
    """Float32 CPU features (NCHW, any memory order) and RoIs, a fixed sampling ratio (0, torchvision's
    adaptive grid, takes the per-level path), in training: the gain is the backward, while without
    gradients torchvision's forward is as fast or faster (dev/roi_align_cpu_bench.py); outside export
    and compilation (they trace graph ops)."""
    return (sampling_ratio > 0 and rois.device.type == 'cpu' and rois.dtype == torch.float32
            and torch.is_grad_enabled() and any(f.requires_grad for f in features)
            and all(f.device.type == 'cpu' and f.dtype == torch.float32 and f.dim() == 4 for f in features)
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling())


def roi_align_levels(features, rois, levels, spatial_scales, output_size, sampling_ratio):
    """(R, C, output_size, output_size): RoI r (rois (R, 5) = batch index, x1, y1, x2, y2 in
    network-input coordinates) aligned on features[levels[r]] at spatial_scales[levels[r]].
    Differentiable in the features."""
    columns, weights, pixels = sampling_weights(rois, levels, [f.shape for f in features], spatial_scales,
                                                output_size, sampling_ratio)
    pooled = _SampledPool.apply(columns, weights, pixels, *features)
    channels = features[0].shape[1]
    return pooled.view(len(rois), output_size, output_size, channels).permute(0, 3, 1, 2).contiguous()


def sampling_weights(rois, levels, shapes, spatial_scales, output_size, sampling_ratio):
    """columns, weights (R, S, S, grid * grid, 4) and the pixel count of all levels: the 4 corners of
    sample (iy, ix) of bin (ph, pw) of RoI r, at column level offset + ((n * H) + y) * W + x, and their
    bilinear weights (0 for a sample outside the map)."""
    s, grid = output_size, sampling_ratio
    offsets = torch.tensor([0] + [n * h * w for n, _, h, w in shapes]).cumsum(0)
    heights = torch.tensor([h for _, _, h, _ in shapes])[levels]
    widths = torch.tensor([w for _, _, _, w in shapes])[levels]
    base = offsets[levels] + rois[:, 0].long() * heights * widths
    # torchvision multiplies the float32 coordinate by the double scale, then stores a float32.
    scales = torch.tensor(spatial_scales, dtype=torch.float64)[levels, None]
    x1, y1, x2, y2 = (rois[:, 1:5].double() * scales).float().unbind(1)
    rows_y = _axis_samples(y1, y2, heights, s, grid)
    cols_x = _axis_samples(x1, x2, widths, s, grid)
    valid = rows_y[0][:, :, None, :, None] & cols_x[0][:, None, :, None, :]  # (R, ph, pw, iy, ix)
    pixel = base[:, None, None, None, None]
    width = widths[:, None, None, None, None]
    columns, weights = [], []
    for y, wy in ((rows_y[1], rows_y[3]), (rows_y[2], rows_y[4])):  # low, high rows
        for x, wx in ((cols_x[1], cols_x[3]), (cols_x[2], cols_x[4])):
            columns.append(pixel + y[:, :, None, :, None] * width + x[:, None, :, None, :])
            weights.append(wy[:, :, None, :, None] * wx[:, None, :, None, :])
    shape = (len(rois), s, s, grid * grid, 4)
    columns = torch.stack(columns, -1).reshape(shape)
    weights = torch.where(valid[..., None], torch.stack(weights, -1), 0.0).reshape(shape)
    return columns, weights, int(offsets[-1])


def _axis_samples(start, end, size, output_size, grid):
    """Along one axis, per RoI (R,), bin p (S) and sample i (grid): whether the sample counts, the low
    and high pixel and their weights, by torchvision's rules."""
    length = torch.clamp(end - start, min=1.0)
    bin_size = length / output_size
    p = torch.arange(output_size, dtype=torch.float32)[None, :, None]
    i = torch.arange(grid, dtype=torch.float32)[None, None, :]
    bin_size = bin_size[:, None, None]
    position = (start[:, None, None] + p * bin_size) + ((i + 0.5) * bin_size) / grid
    size = size[:, None, None]
    valid = (position >= -1.0) & (position <= size.float())
    position = torch.clamp(position, min=0.0)
    low = position.long()
    at_edge = low >= size - 1
    low = torch.where(at_edge, size - 1, low)
    high = torch.where(at_edge, low, low + 1)
    fraction = torch.where(at_edge, low.float(), position) - low.float()
    return valid, low, high, 1.0 - fraction, fraction


def _csr(crow, columns, values, size):
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='Sparse CSR tensor support is in beta')
        return torch.sparse_csr_tensor(crow, columns, values, size=size, check_invariants=False)


def _sample_matrix(columns, weights, k, pixels):
    """(bins, pixels) CSR of sample k of every bin: its 4 corners per row."""
    bins = columns.shape[0] * columns.shape[1] * columns.shape[2]
    crow = torch.arange(0, 4 * bins + 1, 4)
    return _csr(crow, columns[:, :, :, k].reshape(-1), weights[:, :, :, k].reshape(-1), (bins, pixels))


def _bins_transpose(columns, weights, pixels):
    """(pixels, bins) CSR of all the weights, each in the column of its bin; the entries sorted by
    pixel stably, so that each pixel adds its terms in torchvision's order (RoI, bin, sample, corner)."""
    bins = columns.shape[0] * columns.shape[1] * columns.shape[2]
    flat = columns.reshape(-1)
    order = torch.argsort(flat, stable=True)
    crow = torch.zeros(pixels + 1, dtype=torch.long)
    crow[1:] = torch.bincount(flat, minlength=pixels).cumsum(0)
    entries_per_bin = columns.shape[3] * columns.shape[4]
    return _csr(crow, order // entries_per_bin, weights.reshape(-1)[order], (pixels, bins))


class _SampledPool(torch.autograd.Function):
    """(bins, C): each bin the sum of its samples in order, over their count; sample k of every bin
    is its matrix (bins, pixels) times the levels' pixels (pixels, C)."""

    @staticmethod
    def forward(ctx, columns, weights, pixels, *features):
        channels = features[0].shape[1]
        values = torch.cat([f.permute(0, 2, 3, 1).reshape(-1, channels) for f in features])
        samples = columns.shape[3]
        pooled = torch.sparse.mm(_sample_matrix(columns, weights, 0, pixels), values)
        for k in range(1, samples):
            pooled += torch.sparse.mm(_sample_matrix(columns, weights, k, pixels), values)
        ctx.save_for_backward(columns, weights)
        ctx.pixels, ctx.shapes = pixels, [f.shape for f in features]
        return pooled.div_(float(samples))

    @staticmethod
    def backward(ctx, grad):
        columns, weights = ctx.saved_tensors
        transpose = _bins_transpose(columns, weights, ctx.pixels)
        grad_pixels = torch.sparse.mm(transpose, grad.contiguous() / float(columns.shape[3]))
        grads, start = [], 0
        for n, c, h, w in ctx.shapes:
            grads.append(grad_pixels[start:start + n * h * w].view(n, h, w, c).permute(0, 3, 1, 2))
            start += n * h * w
        return (None, None, None, *grads)
