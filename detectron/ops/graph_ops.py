"""Export-friendly versions of the inference ops whose eager path leaves the graph: NMS (Detectron's
Cython kernel on the CPU), FPN RoIAlign (level counts read on the host), per-group top-n
(searchsorted) and the per-image cap (a Python branch on the detection count).

Each is built from ops that torch's ONNX exporter (TorchScript tracing, opset 18) and torch.export
keep as ops of the graph with shapes read from their inputs: torchvision's `nms` / `batched_nms`
and `roi_align` (they have ONNX symbolics), `nonzero`, `sort`, `gather`, cumulative sums. They run
eagerly too, which is how the tests compare them with the eager ops (equal up to the order of
equal scores and IoUs within float rounding of the threshold).
"""
import math

import torch
import torchvision

from detectron.ops.nms import torchvision_nms_thresh
from detectron.ops.roi_pooling import map_rois_to_fpn_levels


def batched_nms(boxes, scores, groups, thresh):
    """Greedy NMS per group with Detectron's +1 areas, suppressing at IoU >= thresh (as
    nms.batched_nms_t): kept indices by descending score, of equal scores the later box first.
    One torchvision nms over the groups' boxes moved apart (torchvision's coordinate trick, written
    here without its branch on an empty input, on which torch.export cannot guard), so IoUs round
    within a few ulps of the per-group ones (exactly alike for integer boxes)."""
    n = boxes.shape[0]
    rev = torch.arange(n - 1, -1, -1, device=boxes.device)
    shifted = torch.cat([boxes[:, :2], boxes[:, 2:4] + 1.0], dim=1)[rev]
    # The largest coordinate, 0 for no boxes (max of an empty tensor is an error).
    span = torch.cat([shifted.reshape(-1), shifted.new_zeros(1)]).max() + 1
    moved = shifted + (groups[rev].to(shifted.dtype) * span)[:, None]
    keep = torchvision.ops.nms(moved, scores[rev], torchvision_nms_thresh(thresh))
    return n - 1 - keep


def top_n_per_group(groups, num_groups, n):
    """Flags of the first n rows of each group (groups (K,) int64 in [0, num_groups), rows already
    in priority order): a running count per group instead of a sort and searchsorted."""
    one_hot = (groups[:, None] == torch.arange(num_groups, device=groups.device)).to(torch.int64)
    rank = one_hot.cumsum(0).gather(1, groups[:, None]).squeeze(1)
    return rank <= n


def limit_detections(scores, max_per_image):
    """Flags of the scores at least the max_per_image-th best (all when fewer; ties may keep
    more), as rcnn_inference's cap, without a branch on their number."""
    if max_per_image <= 0:
        return torch.ones_like(scores, dtype=torch.bool)
    descending = scores.sort(descending=True).values
    padded = torch.cat([descending, scores.new_full((max_per_image,), float('-inf'))])
    return scores >= padded[max_per_image - 1]


def multilevel_roi_align(features, rois, spatial_scales, output_size, sampling_ratio, canonical_scale,
                         canonical_level):
    """roi_pooling.roi_feature_transform for the graph: each RoI's FPN level picked as there, each
    level's RoIs gathered by nonzero (no host count), pooled by torchvision's roi_align in float32
    (aligned=False) and put back in RoI order."""
    k_min = round(-math.log2(spatial_scales[0]))
    levels = map_rois_to_fpn_levels(rois[:, 1:5], k_min, k_min + len(features) - 1, canonical_scale,
                                    canonical_level) - k_min
    pooled, order = [], []
    for k, (feature, scale) in enumerate(zip(features, spatial_scales)):
        idx = (levels == k).nonzero().squeeze(1)
        order.append(idx)
        pooled.append(torchvision.ops.roi_align(feature.float(), rois[idx].float(), output_size,
                                                spatial_scale=scale, sampling_ratio=sampling_ratio,
                                                aligned=False))
    return torch.cat(pooled)[torch.cat(order).argsort()].to(features[0].dtype)
