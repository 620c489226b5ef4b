"""Region Proposal Network: the head, its anchors, proposal generation and losses.

Mirrors Detectron's `modeling/FPN.py` (add_fpn_rpn_outputs / add_fpn_rpn_losses), `modeling/rpn_heads.py`
(add_single_scale_rpn_outputs / _losses: the C4 models' RPN on res4) and the Python ops
`ops/generate_proposals.py` and `ops/collect_and_distribute_fpn_rpn_proposals.py` (collect part).
Everything runs batched on the device of its inputs.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from detectron.modeling.generate_anchors import generate_anchors
from detectron.ops import nms as nms_ops
from detectron.roi_data.rpn import RPN_BBOX_REG_WEIGHTS
from detectron.utils import boxes as box_utils

# Level of the first feature map the RPN sees (Detectron's FPN.RPN_MIN_LEVEL): losses are named
# after their level, loss_rpn_cls_fpn2 ... loss_rpn_cls_fpn6.
FIRST_RPN_LEVEL = 2

# SmoothL1 transition point of the RPN box loss (FPN.add_fpn_rpn_losses).
RPN_SMOOTH_L1_BETA = 1.0 / 9.0


class FPNRPNHead(nn.Module):
    """3x3 conv + ReLU, then per-anchor objectness logits and box deltas; one set of weights for
    every FPN level (Detectron defines them on fpn2 and shares them with fpn3..fpn6). On the one map
    of a C4 body it is Detectron's single-scale head (blobs `conv_rpn`, `rpn_cls_logits`,
    `rpn_bbox_pred`, the same layers and init)."""

    def __init__(self, dim_in=256, num_anchors=3):
        super().__init__()
        self.conv_rpn = nn.Conv2d(dim_in, dim_in, kernel_size=3, padding=1)
        self.rpn_cls_logits = nn.Conv2d(dim_in, num_anchors, kernel_size=1)
        self.rpn_bbox_pred = nn.Conv2d(dim_in, 4 * num_anchors, kernel_size=1)
        for conv in (self.conv_rpn, self.rpn_cls_logits, self.rpn_bbox_pred):
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.zeros_(conv.bias)

    def forward(self, features):
        """features: list of (B, C, H, W), finest level first.
        Returns (logits list of (B, A, H, W), deltas list of (B, 4A, H, W))."""
        logits, deltas = [], []
        for feature in features:
            hidden = F.relu(self.conv_rpn(feature))
            logits.append(self.rpn_cls_logits(hidden))
            deltas.append(self.rpn_bbox_pred(hidden))
        return logits, deltas


@functools.lru_cache(maxsize=None)
def _cell_anchors(stride, sizes, aspect_ratios, device):
    # Cached per device so a training step does not copy the (A, 4) table host-to-device again.
    cell = generate_anchors(stride=stride, sizes=sizes, aspect_ratios=aspect_ratios)
    return torch.as_tensor(cell, dtype=torch.float32, device=device)


# Levels of about 32 padded image sizes (5 levels each): a step or an image then launches no kernel
# for its anchors; at 800x1344 the five levels hold 4.3 MB.
_CACHED_LEVELS = 160


@functools.lru_cache(maxsize=_CACHED_LEVELS)
def _level_anchors(height, width, stride, sizes, aspect_ratios, device):
    return grid_anchors(_cell_anchors(stride, sizes, aspect_ratios, device), height, width, stride)


def grid_anchors(cell, height, width, stride):
    """(H, W, A, 4): the (A, 4) cell anchors shifted by (x * stride, y * stride) for every cell."""
    device = cell.device
    shift_x = torch.arange(width, device=device, dtype=torch.float32) * stride
    shift_y = torch.arange(height, device=device, dtype=torch.float32) * stride
    shift_y, shift_x = torch.meshgrid(shift_y, shift_x, indexing='ij')
    shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=-1)
    return shifts.unsqueeze(2) + cell


def fpn_anchors(feature_shapes, strides=(4, 8, 16, 32, 64), sizes=(32, 64, 128, 256, 512),
                aspect_ratios=(0.5, 1, 2), device='cpu'):
    """Anchors of every FPN level, as Detectron's GenerateProposals enumerates them.

    feature_shapes: list of (H, W) per level; sizes: per level, one size (FPN) or a tuple of sizes
    (the single-scale RPN of a C4 body puts every RPN.SIZES on its one level, ratio-major as
    generate_anchors). Returns a list of (H, W, A, 4) float32 tensors: the cell anchors shifted by
    (x * stride, y * stride). `.reshape(-1, 4)` gives Detectron's
    (H*W*A, 4) row order; the grid shape is kept so the RPN targets can be laid out like the logits.
    The tensors are cached per level shape and shared between calls: read them, never write them.
    """
    device = torch.device(device)
    return [_level_anchors(int(height), int(width), stride, tuple(size) if isinstance(size, tuple) else (size,),
                           tuple(aspect_ratios), device)
            for (height, width), stride, size in zip(feature_shapes, strides, sizes)]


def _scores_in_anchor_order(logits):
    """(B, A, H, W) logits -> (B, H*W*A) objectness probabilities, rows ordered like the anchors."""
    return torch.sigmoid(logits).permute(0, 2, 3, 1).reshape(logits.shape[0], -1)


def _deltas_in_anchor_order(deltas):
    """(B, 4A, H, W) deltas, channels ordered (anchor, coord) -> (B, H*W*A, 4)."""
    return deltas.permute(0, 2, 3, 1).reshape(deltas.shape[0], -1, 4)


def _top_anchors(logits, deltas, anchors, pre_nms_top_n):
    """One level: the pre_nms_top_n best-scoring anchors of each image, best first, as their
    scores (B, k), deltas (B, k, 4) and anchor boxes (B, k, 4)."""
    # float32 whatever the head ran in (e.g. autocast): box decoding needs the precision.
    scores = _scores_in_anchor_order(logits.float())
    num_anchors = scores.shape[1]
    k = num_anchors if pre_nms_top_n <= 0 else min(pre_nms_top_n, num_anchors)
    top_scores, top_idx = scores.topk(k, dim=1, sorted=True)
    top_deltas = torch.gather(
        _deltas_in_anchor_order(deltas.float()), 1, top_idx.unsqueeze(-1).expand(-1, -1, 4))
    return top_scores, top_deltas, anchors.reshape(-1, 4)[top_idx]


def _decoded_and_clipped(anchors, deltas, im_info, xyxy, clips):
    """(B, k, 4) anchors and deltas -> boxes in network-input coordinates, clipped to each image's
    im_info height and width; every level at once (one decode, element by element as per level).
    clips: (BBOX_XFORM_CLIP, BBOX_XFORM_CLIPe), which KL-Loss's proposal decode reads from its cfg."""
    boxes = box_utils.bbox_transform_t(anchors.reshape(-1, 4), deltas.reshape(-1, 4), RPN_BBOX_REG_WEIGHTS,
                                       xyxy=xyxy, clip=clips[0], clip_xyxy=clips[1]).reshape(deltas.shape)
    return box_utils.clip_tiled_boxes_t(boxes, im_info[:, 0].view(-1, 1, 1), im_info[:, 1].view(-1, 1, 1))


def _keep_min_size_and_center_inside(boxes, box_im_info, min_size):
    """Detectron's _filter_boxes: both sides measured in ORIGINAL pixels must be >= max(min_size, 1)
    (avoids empty boxes once the RoIs are divided by the image scale) and the box centre must lie
    inside im_info's height/width."""
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    scale = box_im_info[:, 2]
    min_size = max(min_size, 1)
    x_ctr = boxes[:, 0] + (widths + 1) / 2.
    y_ctr = boxes[:, 1] + (heights + 1) / 2.
    return ((widths / scale + 1 >= min_size) & (heights / scale + 1 >= min_size)
            & (x_ctr < box_im_info[:, 1]) & (y_ctr < box_im_info[:, 0]))


def _top_n_per_group(scores, groups, n):
    """Indices of the n best scores of every group, ordered by group then by descending score.

    n <= 0 keeps everything (Detectron's GenerateProposals skips its cap for post_nms_top_n <= 0;
    its collect step would instead keep no RoI for 0, which no config wants).
    """
    by_score = scores.argsort(descending=True, stable=True)
    order = by_score[groups[by_score].argsort(stable=True)]
    if n <= 0:
        return order
    sorted_groups = groups[order]
    # The first position of each row's group in the sorted groups (no host sync, unlike bincount).
    group_starts = torch.searchsorted(sorted_groups, sorted_groups)
    rank = torch.arange(order.numel(), device=order.device) - group_starts
    return order[rank < n]


def generate_proposals(logits, deltas, anchors, im_info, pre_nms_top_n, post_nms_top_n,
                       nms_thresh, min_size, xyxy=False, *, collect_across_batch,
                       clips=(box_utils.DEFAULT_XFORM_CLIP, box_utils.DEFAULT_XFORM_CLIP_XYXY)):
    """RPN proposals of a batch: Detectron's GenerateProposals on every level, then Collect.

    logits/deltas: per level (B, A, H, W) / (B, 4A, H, W); anchors: per level (H, W, A, 4) from
    fpn_anchors; im_info (B, 3) = (height, width, scale) used for clipping and the size filter.
    Per image and level: top pre_nms_top_n by sigmoid score, decode with unit weights (XYXY edge
    coding when xyxy), clip, drop boxes smaller than min_size original pixels or centred outside
    the image, NMS at nms_thresh, keep post_nms_top_n. Collect: all levels together, the best
    post_nms_top_n of the whole batch when collect_across_batch (Detectron's training behaviour,
    its issue 459), otherwise of each image (test).

    nms_thresh <= 0 skips NMS and the per-level cap, as Detectron; post_nms_top_n <= 0 means no cap.
    NMS suppresses at IoU >= thresh as Detectron's (nms_ops.batched_nms_t). clips: the decode's
    (BBOX_XFORM_CLIP, BBOX_XFORM_CLIPe).

    Returns rois (R, 5) float32 = (batch index, x1, y1, x2, y2) in network-input coordinates and
    their scores (R,): with collect_across_batch sorted by descending score over the batch,
    otherwise grouped by image (in image order) and by descending score within an image.
    """
    boxes, scores, levels, image_ids, passes, _ = _candidate_boxes(
        logits, deltas, anchors, im_info, pre_nms_top_n, min_size, xyxy, clips)
    keep = passes.nonzero().squeeze(1)
    boxes, scores, levels, image_ids = boxes[keep], scores[keep], levels[keep], image_ids[keep]

    if nms_thresh > 0:
        image_level = image_ids * len(logits) + levels
        keep = nms_ops.batched_nms_t(boxes, scores, image_level, nms_thresh)
        keep = keep[_top_n_per_group(scores[keep], image_level[keep], post_nms_top_n)]
        boxes, scores, image_ids = boxes[keep], scores[keep], image_ids[keep]

    collect_groups = torch.zeros_like(image_ids) if collect_across_batch else image_ids
    keep = _top_n_per_group(scores, collect_groups, post_nms_top_n)
    rois = torch.cat((image_ids[keep].unsqueeze(1).to(boxes.dtype), boxes[keep]), dim=1)
    return rois, scores[keep]


def _candidate_boxes(logits, deltas, anchors, im_info, pre_nms_top_n, min_size, xyxy, clips):
    """Every image's pre_nms_top_n best anchors of each level, decoded and clipped: boxes (B*K, 4),
    scores, levels and image ids (K the levels' counts summed; image by image, level by level, best
    first), whether each passes Detectron's size and centre filter, and the levels' counts."""
    num_images = logits[0].shape[0]
    top = [_top_anchors(*level, pre_nms_top_n) for level in zip(logits, deltas, anchors)]
    top_scores, top_deltas, top_anchors = (torch.cat(parts, dim=1) for parts in zip(*top))
    boxes = _decoded_and_clipped(top_anchors, top_deltas, im_info, xyxy, clips).reshape(-1, 4)
    scores = top_scores.reshape(-1)
    levels = torch.cat([torch.full_like(lvl_scores, level, dtype=torch.long)
                        for level, (lvl_scores, _, _) in enumerate(top)], dim=1).reshape(-1)
    image_ids = torch.arange(num_images, device=boxes.device).repeat_interleave(scores.numel() // num_images)
    passes = _keep_min_size_and_center_inside(boxes, im_info[image_ids], min_size)
    return boxes, scores, levels, image_ids, passes, [lvl_scores.shape[1] for lvl_scores, _, _ in top]


def collected_proposals_fixed_size(logits, deltas, anchors, im_info, pre_nms_top_n, post_nms_top_n,
                                   nms_thresh, min_size, xyxy=False,
                                   clips=(box_utils.DEFAULT_XFORM_CLIP, box_utils.DEFAULT_XFORM_CLIP_XYXY)):
    """generate_proposals(..., collect_across_batch=True), the training proposals, in tensors whose
    sizes do not depend on the data, so the host never waits for the GPU: returns rois (N, 5),
    scores (N,) and valid (N,) bool, N = post_nms_top_n (the number of candidates when that is
    smaller or post_nms_top_n <= 0). The valid rows come first and are generate_proposals' rois and
    scores, in its order; the rest are zeros. Each (image, level) group is one row of candidates by
    descending score (of equal scores the later first, as batched_nms_t), those failing the size
    filter last."""
    num_images = logits[0].shape[0]
    boxes, scores, _, image_ids, passes, counts = _candidate_boxes(
        logits, deltas, anchors, im_info, pre_nms_top_n, min_size, xyxy, clips)
    slots = _group_slots(num_images, counts, boxes.device)
    ranked = torch.where(slots >= 0, torch.where(passes, scores, float('-inf'))[slots.clamp(min=0)], float('-inf'))
    slots = slots.flip(1).gather(1, ranked.flip(1).sort(dim=1, descending=True, stable=True).indices)
    candidate = (slots >= 0) & passes[slots.clamp(min=0)]
    slots = torch.where(candidate, slots, -1)
    keep = candidate
    if nms_thresh > 0:
        keep = nms_ops.grouped_nms_keep(boxes, slots, nms_thresh)
        if post_nms_top_n > 0:
            keep = keep & (keep.cumsum(dim=1) <= post_nms_top_n)
    # Collect: the best of the batch, by score, of equal scores in group order (a stable sort).
    keep, slots = keep.reshape(-1), slots.reshape(-1).clamp(min=0)
    kept_scores = torch.where(keep, scores[slots], float('-inf'))
    num = len(boxes) if post_nms_top_n <= 0 else min(post_nms_top_n, len(boxes))  # padding slots sort last
    order = kept_scores.sort(descending=True, stable=True).indices[:num]
    valid, chosen = keep[order], slots[order]
    rois = torch.cat((image_ids[chosen].unsqueeze(1).to(boxes.dtype), boxes[chosen]), dim=1)
    return rois * valid.unsqueeze(1), scores[chosen] * valid, valid


def _group_slots(num_images, counts, device):
    """(B * L, M) indices of the candidates of each (image, level) group, in _candidate_boxes'
    order, -1 after a level's counts[l] (M = the largest count); made from arange, not from a host
    list, whose copy to the device would wait for the GPU."""
    total, width = sum(counts), max(counts)
    columns = torch.arange(width, device=device)
    image_starts = torch.arange(num_images, device=device).unsqueeze(1) * total
    rows, start = [], 0
    for count in counts:
        rows.append(torch.where(columns < count, image_starts + start + columns, -1))
        start += count
    return torch.stack(rows, dim=1).reshape(-1, width)


def _sigmoid_cross_entropy_sum(logits, labels):
    """Caffe2 SigmoidCrossEntropyLoss with normalize=0 before its scale: summed over labels >= 0."""
    losses = F.binary_cross_entropy_with_logits(
        logits, labels.clamp(min=0).to(logits.dtype), reduction='none')
    return (losses * (labels >= 0)).sum()


def _weighted_smooth_l1_sum(pred, target, inside_weights, outside_weights, beta):
    """Caffe2 SmoothL1Loss before its scale and 1/N: sum(out_w * smoothL1(in_w * (pred - target)))."""
    losses = F.smooth_l1_loss(inside_weights * pred, inside_weights * target,
                              reduction='none', beta=beta)
    return (outside_weights * losses).sum()


def rpn_losses(logits, deltas, rpn_targets, ims_per_batch, batch_size_per_im=256):
    """Detectron's FPN RPN losses, per level: `loss_rpn_cls_fpn{l}` and `loss_rpn_bbox_fpn{l}`.

    rpn_targets: detectron.roi_data.rpn.RPNTargets (per-level lists shaped like logits/deltas).
    cls: summed sigmoid CE over labelled anchors / (batch_size_per_im * ims_per_batch);
    bbox: SmoothL1 (beta 1/9) weighted by the targets' inside/outside weights (outside =
    1 / labelled anchors of the image), summed and divided by the number of images.
    Per process, without Detectron's 1/NUM_GPUS (DDP's gradient averaging supplies it).
    """
    losses = {}
    levels = zip(logits, deltas, rpn_targets.labels, rpn_targets.bbox_targets,
                 rpn_targets.bbox_inside_weights, rpn_targets.bbox_outside_weights)
    for i, (lvl_logits, lvl_deltas, labels, targets, inside_w, outside_w) in enumerate(levels):
        level = FIRST_RPN_LEVEL + i
        losses[f'loss_rpn_cls_fpn{level}'] = _sigmoid_cross_entropy_sum(
            lvl_logits, labels) / (batch_size_per_im * ims_per_batch)
        losses[f'loss_rpn_bbox_fpn{level}'] = _weighted_smooth_l1_sum(
            lvl_deltas, targets, inside_w, outside_w, RPN_SMOOTH_L1_BETA) / lvl_deltas.shape[0]
    return losses


def single_scale_rpn_losses(logits, deltas, rpn_targets):
    """Detectron's add_single_scale_rpn_losses on the one level: `loss_rpn_cls`, the sigmoid CE
    averaged over the labelled anchors of the batch (Caffe2's SigmoidCrossEntropyLoss with its
    default normalize=1, at least 1e-5), and `loss_rpn_bbox`, SmoothL1 (beta 1/9) with the targets'
    weights summed and divided by the number of images. Per process, as rpn_losses."""
    (level_logits,), (level_deltas,) = logits, deltas
    labels, targets = rpn_targets.labels[0], rpn_targets.bbox_targets[0]
    num_labelled = (labels >= 0).sum().clamp(min=1e-5)
    return {'loss_rpn_cls': _sigmoid_cross_entropy_sum(level_logits, labels) / num_labelled,
            'loss_rpn_bbox': _weighted_smooth_l1_sum(
                level_deltas, targets, rpn_targets.bbox_inside_weights[0], rpn_targets.bbox_outside_weights[0],
                RPN_SMOOTH_L1_BETA) / level_deltas.shape[0]}
