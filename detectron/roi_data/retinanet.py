"""RetinaNet training targets: each anchor's class label (or background, or ignored) and its box target.

Mirrors Detectron's `roi_data/retinanet.py` (_get_retinanet_blobs), computed batched on the anchors'
device instead of in the data loader, and laid out like the head's outputs. Detectron labels a square
"field of anchors" (TRAIN.MAX_SIZE on each side) and crops the labels to the feature map of the
padded image; here only the feature map's anchors exist. The two differ only where an anchor of that
field outside the feature map (below or right of the padded image) overlaps a gt box: Detectron
counts it in retnet_fg_num, and it may be the best anchor of that gt.
"""
from typing import List, NamedTuple

import torch

from detectron.roi_data.rpn import RPN_BBOX_REG_WEIGHTS, eligible_overlaps, inside_image, padded_gt
from detectron.utils import boxes as box_utils

# RetinaNet codes its boxes with unit weights, as the RPN (data_utils.compute_targets, and
# test_retinanet's bbox_transform with its default weights).
RETINANET_BBOX_REG_WEIGHTS = RPN_BBOX_REG_WEIGHTS


class RetinaNetTargets(NamedTuple):
    """Over the anchors of all levels, finest first, each level's rows in its (H, W, A) order."""
    labels: torch.Tensor        # (B, N) int64: class 1..C fg, 0 bg, -1 ignored
    bbox_targets: torch.Tensor  # (B, N, 4): the fg anchors' targets, 0 elsewhere
    fg_num: torch.Tensor        # () float32: Detectron's retnet_fg_num, the losses' normaliser
    level_sizes: List[int]      # the anchors of each level (H * W * A), summing to N


def retinanet_targets(anchors, gt_boxes, gt_classes, gt_is_crowd, im_info, positive_overlap=0.5,
                      negative_overlap=0.4, straddle_thresh=-1):
    """Detectron's RetinaNet anchor labels and box targets for a batch.

    anchors: per level (H, W, A, 4) in network-input coordinates; gt_boxes / gt_classes /
    gt_is_crowd: per image (G, 4) boxes in ORIGINAL image coordinates, (G,) classes >= 1 and (G,)
    bool; im_info (B, 3) = (unpadded height, width, scale). Crowd boxes are not ground truth.
    Over the anchors of all levels of an image:
    - fg (the class of the anchor's best gt): IoU >= positive_overlap, plus for each gt every
      anchor tying its best IoU;
    - bg: max IoU < negative_overlap, which turns a low-IoU "best anchor" back to bg (Detectron's
      order), although it stays counted in fg_num;
    - ignored: the rest, and (straddle_thresh >= 0, TRAIN.RPN_STRADDLE_THRESH) anchors leaving the
      image by more than straddle_thresh; Detectron's RetinaNet keeps them all, as -1 does.
    fg_num = sum over images of (fg anchors + 1), counted before the bg rule, as Detectron's.
    """
    flat_anchors = torch.cat([level.reshape(-1, 4) for level in anchors])
    gt, gt_valid = padded_gt(gt_boxes, gt_is_crowd, im_info[:, 2])
    classes = _padded_classes(gt_classes, gt_valid)
    inside = inside_image(flat_anchors, im_info, straddle_thresh)
    overlaps = eligible_overlaps(flat_anchors, gt, gt_valid, inside)
    max_overlap, gt_assignment = overlaps.max(dim=2)

    best_for_a_gt = (overlaps == overlaps.max(dim=1, keepdim=True).values) & gt_valid.unsqueeze(1)
    fg = inside & (best_for_a_gt.any(dim=2) | (max_overlap >= positive_overlap))
    fg_num = (fg.sum(dim=1) + 1).sum().to(torch.float32)
    labels = torch.where(fg, torch.gather(classes, 1, gt_assignment), -1)
    labels = torch.where(inside & (max_overlap < negative_overlap), 0, labels)

    num_images, num_anchors = labels.shape
    assigned_gt = torch.gather(gt, 1, gt_assignment.unsqueeze(2).expand(-1, -1, 4))
    targets = box_utils.bbox_transform_inv_t(
        flat_anchors.expand(num_images, -1, -1).reshape(-1, 4), assigned_gt.reshape(-1, 4),
        RETINANET_BBOX_REG_WEIGHTS).view(num_images, num_anchors, 4)
    targets = torch.where((labels > 0).unsqueeze(2), targets, torch.zeros_like(targets))
    sizes = [level.shape[0] * level.shape[1] * level.shape[2] for level in anchors]
    return RetinaNetTargets(labels, targets, fg_num, sizes)


def _padded_classes(gt_classes, gt_valid):
    """(B, G) int64 classes laid out like padded_gt's boxes (0 in the padding)."""
    padded = torch.zeros(gt_valid.shape, dtype=torch.int64, device=gt_valid.device)
    for i, classes in enumerate(gt_classes):
        padded[i, :len(classes)] = classes
    return padded
