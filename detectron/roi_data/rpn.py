"""RPN training targets: which anchors are objects, which are background, and where the objects are.

Mirrors Detectron's `roi_data/rpn.py` (_get_rpn_blobs), computed batched on the anchors' device
instead of in the data loader. Detectron labels a square "field of anchors" and narrows it to the
feature map; with the default straddle threshold (0) every anchor outside the feature map is
also outside the image and ignored, so labelling the feature map's anchors directly is the same.
(With straddle_thresh < 0, Detectron would also draw background among field anchors that the
narrowing then drops; here only the feature map's anchors exist.)
"""

from typing import List, NamedTuple

import torch

from detectron.utils import boxes as box_utils

# RPN boxes are coded with unit weights (data_utils.compute_targets, GenerateProposals).
RPN_BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)


class RPNTargets(NamedTuple):
    """Per FPN level, laid out like the RPN outputs they supervise."""
    labels: List[torch.Tensor]                # (B, A, H, W) int64: 1 fg, 0 bg, -1 ignored
    bbox_targets: List[torch.Tensor]          # (B, 4A, H, W), channels (anchor, coord)
    bbox_inside_weights: List[torch.Tensor]   # (B, 4A, H, W): 1 on fg anchors
    bbox_outside_weights: List[torch.Tensor]  # (B, 4A, H, W): 1 / labelled anchors of the image


def rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, positive_overlap=0.7,
                negative_overlap=0.3, fg_fraction=0.5, batch_size_per_im=256, straddle_thresh=0,
                xyxy=False, generator=None):
    """Detectron's RPN anchor labels and regression targets for a batch.

    anchors: per level (H, W, A, 4) from rpn_heads.fpn_anchors; gt_boxes / gt_is_crowd: per image
    (G, 4) boxes in ORIGINAL image coordinates and (G,) bool; im_info (B, 3) = (unpadded height,
    width, scale). Crowd boxes are not RPN ground truth. Anchors leaving the image by more than
    straddle_thresh are ignored (straddle_thresh < 0 keeps all). Labels are computed over the
    anchors of all levels of an image together:
    - fg: IoU >= positive_overlap, plus for each gt every anchor tying its best IoU (even when
      that IoU is 0, as in Detectron); a random fg_fraction * batch_size_per_im of them are kept;
    - bg: max IoU < negative_overlap, batch_size_per_im - #fg draws WITH replacement
      (Detectron's npr.randint), so fewer distinct anchors may result, and a drawn "best match"
      fg anchor with IoU < negative_overlap becomes bg (its regression target stays computed,
      but its weights are 0, as in Detectron).
    An image without non-crowd gt (Detectron filters such images out of training; its code would
    fail on them) gets bg only: every eligible anchor has max IoU 0.
    Targets use unit weights (XYXY edge coding when xyxy); outside weights are
    1 / (number of labelled anchors of the image). `generator` seeds the sampling.
    """
    gt, gt_valid = padded_gt(gt_boxes, gt_is_crowd, im_info[:, 2])
    return rpn_targets_of_padded_gt(anchors, gt, gt_valid, im_info, positive_overlap, negative_overlap,
                                    fg_fraction, batch_size_per_im, straddle_thresh, xyxy, generator)


def rpn_targets_of_padded_gt(anchors, gt, gt_valid, im_info, positive_overlap=0.7, negative_overlap=0.3,
                             fg_fraction=0.5, batch_size_per_im=256, straddle_thresh=0, xyxy=False,
                             generator=None):
    """rpn_targets of padded_gt's (gt, gt_valid), with shapes that depend on the anchors and the number of
    gt columns only (no host synchronisation). Padding columns are below every real overlap, so any
    number of them gives the same labels and targets."""
    flat_anchors = torch.cat([level.reshape(-1, 4) for level in anchors])
    inside = inside_image(flat_anchors, im_info, straddle_thresh)
    overlaps = eligible_overlaps(flat_anchors, gt, gt_valid, inside)
    max_overlap, gt_assignment = overlaps.max(dim=2)

    best_for_a_gt = (overlaps == overlaps.max(dim=1, keepdim=True).values) & gt_valid.unsqueeze(1)
    fg = inside & (best_for_a_gt.any(dim=2) | (max_overlap >= positive_overlap))
    fg = _random_fg_subset(fg, int(fg_fraction * batch_size_per_im), generator)
    num_bg = batch_size_per_im - fg.sum(dim=1)
    bg = _bg_drawn_with_replacement(
        inside & (max_overlap < negative_overlap), num_bg, batch_size_per_im, generator)
    labels = torch.where(bg, 0, torch.where(fg, 1, -1))

    targets = _regression_targets(flat_anchors, gt, gt_assignment, fg, xyxy)
    inside_weights = (labels == 1).unsqueeze(2).expand(-1, -1, 4).to(targets.dtype)
    labelled = (labels >= 0).unsqueeze(2).expand(-1, -1, 4).to(targets.dtype)
    outside_weights = labelled / labelled[:, :, 0].sum(dim=1).clamp(min=1).view(-1, 1, 1)
    return _per_level(anchors, labels, targets, inside_weights, outside_weights)


def padded_gt(gt_boxes, gt_is_crowd, scales):
    """(B, G, 4) gt boxes in network-input coordinates and (B, G) "is RPN gt" (not crowd, not
    padding); G >= 1 so reductions over gt are defined for images without any."""
    num_gt = max([1] + [len(boxes) for boxes in gt_boxes])
    padded = scales.new_zeros(len(gt_boxes), num_gt, 4)
    valid = torch.zeros(len(gt_boxes), num_gt, dtype=torch.bool, device=scales.device)
    for i, (boxes, crowd) in enumerate(zip(gt_boxes, gt_is_crowd)):
        padded[i, :len(boxes)] = boxes
        valid[i, :len(boxes)] = ~crowd.to(torch.bool)
    return padded * scales.view(-1, 1, 1), valid


def inside_image(anchors, im_info, straddle_thresh):
    """(B, N): anchor within the unpadded image, allowing straddle_thresh pixels outside."""
    if straddle_thresh < 0:
        return torch.ones(len(im_info), len(anchors), dtype=torch.bool, device=anchors.device)
    height, width = im_info[:, 0:1], im_info[:, 1:2]
    return ((anchors[:, 0] >= -straddle_thresh) & (anchors[:, 1] >= -straddle_thresh)
            & (anchors[:, 2] < width + straddle_thresh) & (anchors[:, 3] < height + straddle_thresh))


def eligible_overlaps(anchors, gt, gt_valid, inside):
    """(B, N, G) IoU of each image's anchors with its gt; -1 for ignored anchors and non-gt columns,
    below every real IoU, so maxima over anchors or gt only see eligible pairs."""
    num_images, num_gt = gt_valid.shape
    overlaps = box_utils.box_iou_t(anchors, gt.reshape(-1, 4))
    overlaps = overlaps.view(-1, num_images, num_gt).transpose(0, 1)
    eligible = inside.unsqueeze(2) & gt_valid.unsqueeze(1)
    return overlaps.masked_fill(~eligible, -1.0)


def _random_fg_subset(fg, max_fg, generator):
    """Keep a uniformly random max_fg of each image's fg anchors (all if fewer), without
    replacement, as Detectron's npr.choice; no host sync."""
    priority = torch.rand(fg.shape, generator=generator, device=fg.device).masked_fill(~fg, 2.0)
    chosen = priority.topk(min(max_fg, fg.shape[1]), dim=1, largest=False).indices
    return torch.zeros_like(fg).scatter_(1, chosen, True) & fg


def _bg_drawn_with_replacement(candidates, num_bg, max_draws, generator):
    """Each image's bg anchors: when it has more candidates than num_bg, num_bg uniform draws
    with replacement among them (Detectron's npr.randint), otherwise all candidates."""
    num_images, num_anchors = candidates.shape
    running_count = candidates.cumsum(dim=1)
    num_candidates = running_count[:, -1:]
    draws = torch.randint(2 ** 62, (num_images, max_draws), generator=generator,
                          device=candidates.device) % num_candidates.clamp(min=1)
    # The k-th candidate (0-based) is the first anchor whose running count reaches k + 1.
    drawn_anchor = torch.searchsorted(running_count, draws + 1)
    wanted = torch.arange(max_draws, device=candidates.device) < num_bg.unsqueeze(1)
    sink = num_anchors  # unwanted draws land in an extra column that is dropped
    drawn = torch.zeros(num_images, num_anchors + 1, dtype=torch.bool, device=candidates.device)
    drawn.scatter_(1, torch.where(wanted, drawn_anchor, sink), True)
    return torch.where(num_candidates > num_bg.unsqueeze(1), drawn[:, :num_anchors], candidates)


def _regression_targets(anchors, gt, gt_assignment, fg, xyxy):
    """(B, N, 4) targets of fg anchors towards their best gt; 0 elsewhere."""
    num_images, num_anchors = fg.shape
    assigned_gt = torch.gather(gt, 1, gt_assignment.unsqueeze(2).expand(-1, -1, 4))
    targets = box_utils.bbox_transform_inv_t(
        anchors.expand(num_images, -1, -1).reshape(-1, 4), assigned_gt.reshape(-1, 4),
        RPN_BBOX_REG_WEIGHTS, xyxy=xyxy).view(num_images, num_anchors, 4)
    return torch.where(fg.unsqueeze(2), targets, torch.zeros_like(targets))


def _per_level(anchors, labels, targets, inside_weights, outside_weights):
    """Split (B, N, ...) rows back into levels, shaped (B, A, H, W) / (B, 4A, H, W)."""
    sizes = [level.shape[0] * level.shape[1] * level.shape[2] for level in anchors]
    out = RPNTargets([], [], [], [])
    for level, lvl_labels, lvl_targets, lvl_inside, lvl_outside in zip(
            anchors, labels.split(sizes, 1), targets.split(sizes, 1),
            inside_weights.split(sizes, 1), outside_weights.split(sizes, 1)):
        height, width, num_cell_anchors = level.shape[:3]
        out.labels.append(
            lvl_labels.reshape(-1, height, width, num_cell_anchors).permute(0, 3, 1, 2))
        for per_coord, dest in ((lvl_targets, out.bbox_targets),
                                (lvl_inside, out.bbox_inside_weights),
                                (lvl_outside, out.bbox_outside_weights)):
            dest.append(per_coord.reshape(-1, height, width, 4 * num_cell_anchors).permute(0, 3, 1, 2))
    return out
