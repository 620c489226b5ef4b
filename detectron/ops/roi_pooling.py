"""Detectron's RoIFeatureTransform: FPN RoI level assignment and multi-level RoIAlign, and the
single-level RoIAlign / RoIPoolF of the C4 models."""
import math

import torch
from torchvision.ops import roi_align, roi_pool

from detectron.ops import multilevel_roi_align, sparse_roi_align
from detectron.utils.boxes import boxes_area_t, divide


def map_rois_to_fpn_levels(boxes, k_min=2, k_max=5, canonical_scale=224, canonical_level=4):
    """FPN level of each box (R, 4), Detectron's `map_rois_to_fpn_levels` (FPN paper eq. 1).

    level = floor(canonical_level + log2(sqrt(area) / canonical_scale + 1e-6)), clipped to
    [k_min, k_max]; area uses +1 widths and, as KL-Loss's boxes_area, its absolute value.
    Boxes are in network-input (scaled) coordinates. Returns int64 (R,).
    """
    scales = torch.sqrt(boxes_area_t(boxes).abs())
    # divide: numpy's float32 division on CUDA too (a level flips only within an ulp of a boundary).
    levels = torch.floor(canonical_level + torch.log2(divide(scales, canonical_scale) + 1e-6))
    return levels.clamp(k_min, k_max).to(torch.int64)


def roi_feature_transform(features, rois, spatial_scales=(1 / 4, 1 / 8, 1 / 16, 1 / 32),
                          output_size=7, sampling_ratio=2, canonical_scale=224, canonical_level=4):
    """RoIAlign each RoI on its FPN level; returns (R, C, output_size, output_size) in `rois` order.

    `features` are the levels in `spatial_scales` order (P2..P5 by default; level k has scale
    2^-k); `rois` (R, 5) are (batch index, x1, y1, x2, y2) in network-input coordinates.
    RoIAlign uses aligned=False, the Caffe2 convention (no half-pixel offset, RoI sides at least
    1 bin). canonical_scale / canonical_level are FPN.ROI_CANONICAL_SCALE / _LEVEL. On CUDA, with
    a fixed sampling ratio, Triton kernels pool every RoI on its level in place
    (multilevel_roi_align); in float32 CPU training, sparse matrix products pool every level at once
    (sparse_roi_align); elsewhere torchvision's roi_align runs per level.
    """
    k_min = round(-math.log2(spatial_scales[0]))
    levels = map_rois_to_fpn_levels(rois[:, 1:5], k_min, k_min + len(features) - 1,
                                    canonical_scale, canonical_level)
    if multilevel_roi_align.kernel_applies(features, rois, sampling_ratio):
        return multilevel_roi_align.roi_align_levels(features, rois, levels - k_min, spatial_scales[:len(features)],
                                                     output_size, sampling_ratio)
    if sparse_roi_align.applies(features, rois, sampling_ratio):
        return sparse_roi_align.roi_align_levels(features, rois, levels - k_min, spatial_scales[:len(features)],
                                                 output_size, sampling_ratio)
    first = features[0]
    # Pool in at least float32: half-precision RoI coordinates would be off by up to a pixel.
    compute_dtype = torch.promote_types(first.dtype, torch.float32)
    # RoIs grouped by level (index order kept within a level); the counts are the one host sync.
    order = levels.argsort(stable=True)
    counts = torch.zeros(len(features), dtype=torch.long, device=levels.device).index_add_(
        0, levels - k_min, torch.ones_like(levels)).tolist()
    level_rois = rois.to(compute_dtype)[order].split(counts)
    pooled = torch.cat([
        roi_align(feature.to(compute_dtype), level_rois[k], output_size, spatial_scale=scale,
                  sampling_ratio=sampling_ratio, aligned=False)
        for k, (feature, scale) in enumerate(zip(features, spatial_scales))
    ]).to(first.dtype)
    return torch.empty_like(pooled).index_copy(0, order, pooled)


ROI_XFORM_METHODS = ('RoIAlign', 'RoIPoolF')


def single_level_roi_transform(feature, rois, method, spatial_scale, output_size, sampling_ratio):
    """(R, C, output_size, output_size) features of `rois` (R, 5) on one map (Detectron's
    RoIFeatureTransform without FPN): method 'RoIAlign' (aligned=False; sampling_ratio 0 is the
    adaptive grid) or 'RoIPoolF' (Caffe2's max pooling over rounded bins, which ignores
    sampling_ratio; torchvision's roi_pool computes the same bins)."""
    if method == 'RoIAlign':
        # One level: the level assignment clamps every RoI to it.
        return roi_feature_transform([feature], rois, (spatial_scale,), output_size, sampling_ratio)
    compute_dtype = torch.promote_types(feature.dtype, torch.float32)
    pooled = roi_pool(feature.to(compute_dtype), rois.to(compute_dtype), output_size, spatial_scale=spatial_scale)
    return pooled.to(feature.dtype)
