"""Fast R-CNN training RoIs: sample proposals (plus gt boxes) into fg/bg RoIs with their targets.

Mirrors what Detectron's CollectAndDistributeFpnRpnProposals op does in training:
`json_dataset.add_proposals` (crowd_thresh=0), `roidb.add_bbox_regression_targets` and
`roi_data/fast_rcnn.py` (_sample_rois, _expand_bbox_targets), batched on the proposals' device.
"""

from typing import NamedTuple, Optional

import torch

from detectron.utils import boxes as box_utils


class SampledRoIs(NamedTuple):
    rois: torch.Tensor                  # (S, 5) batch index, box in network-input coordinates
    labels: torch.Tensor                # (S,) int64 class, 0 = background
    bbox_targets: torch.Tensor          # (S, 4K) target in the 4 columns of its regression class
    bbox_inside_weights: torch.Tensor   # (S, 4K) 1 on those columns
    bbox_outside_weights: torch.Tensor  # (S, 4K) inside_weights > 0
    valid: Optional[torch.Tensor] = None  # (S,) bool, fixed-size sampling only: the row is a sampled RoI


def sample_rois(proposals, im_scales, gt_boxes, gt_classes, gt_is_crowd, num_classes,
                batch_size_per_im, fg_fraction=0.25, fg_thresh=0.5, bg_thresh_hi=0.5,
                bg_thresh_lo=0.0, bbox_reg_weights=(10.0, 10.0, 5.0, 5.0), bbox_thresh=0.5,
                cls_agnostic=False, xyxy=False, generator=None, proposal_valid=None, candidates=None):
    """Detectron's Fast R-CNN minibatch RoIs for a batch of images.

    proposals (R, 5): (batch index, box) in network-input coordinates; im_scales (B,);
    gt_boxes / gt_classes / gt_is_crowd: per image (G, 4) ORIGINAL-coordinate boxes, (G,) int64
    classes 1..K-1, (G,) bool. As in Detectron, per image:
    - candidates are the gt boxes (crowd included) followed by the proposals / im_scale;
    - a non-crowd gt row has max overlap 1 with its own class, a crowd row -1 (never sampled);
      a proposal takes its best IoU over ALL gt, crowd included, and that gt's class when the IoU
      is > 0 (so proposals on a crowd region can be fg of the crowd's class), else 0 / class 0;
    - candidates with max overlap >= bbox_thresh (and an image with non-crowd gt) regress towards
      their best NON-crowd gt, in original coordinates with bbox_reg_weights (XYXY edge coding when
      xyxy), under their max class (class 1 when cls_agnostic); this holds even for sampled bg;
    - fg (max overlap >= fg_thresh) up to round(fg_fraction * batch_size_per_im) and bg
      ([bg_thresh_lo, bg_thresh_hi)) filling the batch, both uniformly without replacement.
    Returns SampledRoIs concatenated over images in image order, each image's fg before its bg
    (rows within each part in candidate order; Detectron's order there is random). K =
    num_classes, or 2 when cls_agnostic. `generator` seeds the sampling: each candidate's draw is a
    function of the seeds drawn from it and of the candidate (its image and gt index, or its proposal
    index), not of how the candidates are laid out (random_subset).

    With proposal_valid (R,) bool (rpn_heads.collected_proposals_fixed_size's padding flags) the
    invalid proposals are never sampled and the result has a fixed number of rows S = min(B x
    batch_size_per_im, candidates), so nothing waits for the GPU: the sampled RoIs in the order above,
    then rows of zeros with label 0, flagged by `valid`. candidates: candidate_assignments of the same
    arguments when the caller has them already (Keypoint R-CNN samples its RoIs from them too).
    """
    c = candidate_assignments(proposals, im_scales, gt_boxes, gt_classes, gt_is_crowd) if candidates is None else candidates
    real = None
    if proposal_valid is not None:
        real = torch.cat((torch.ones(len(c.boxes) - len(proposal_valid), dtype=torch.bool, device=c.boxes.device),
                          proposal_valid))
    return _sample(c, real, im_scales, num_classes, batch_size_per_im, fg_fraction, fg_thresh, bg_thresh_hi,
                   bg_thresh_lo, bbox_reg_weights, bbox_thresh, cls_agnostic, xyxy, generator)


def sample_rois_of_padded_gt(proposals, proposal_valid, im_scales, gt_boxes, gt_classes, gt_is_crowd, gt_present,
                             num_classes, batch_size_per_im, fg_fraction=0.25, fg_thresh=0.5, bg_thresh_hi=0.5,
                             bg_thresh_lo=0.0, bbox_reg_weights=(10.0, 10.0, 5.0, 5.0), bbox_thresh=0.5,
                             cls_agnostic=False, xyxy=False, generator=None):
    """sample_rois with fixed-size proposals (proposal_valid) of the gt padded to G columns: gt_boxes (B, G,
    4), gt_classes, gt_is_crowd and gt_present (B, G), the columns past an image's gt not present. The
    same RoIs from the same seeds; every shape is fixed by the arguments' shapes (no host synchronisation)."""
    c = _padded_candidate_assignments(proposals, im_scales, gt_boxes, gt_classes, gt_is_crowd, gt_present)
    real = torch.cat((gt_present.reshape(-1), proposal_valid))
    return _sample(c, real, im_scales, num_classes, batch_size_per_im, fg_fraction, fg_thresh, bg_thresh_hi,
                   bg_thresh_lo, bbox_reg_weights, bbox_thresh, cls_agnostic, xyxy, generator)


def _sample(c, real, im_scales, num_classes, batch_size_per_im, fg_fraction, fg_thresh, bg_thresh_hi, bg_thresh_lo,
            bbox_reg_weights, bbox_thresh, cls_agnostic, xyxy, generator):
    """sample_rois from the candidates c; real (M,) bool: the candidates that may be sampled, the result then
    of fixed size (None: all, compact)."""
    boxes, image_ids = c.boxes, c.image_ids
    max_overlap, max_class = c.max_overlap, c.max_class
    regression_class, targets = _regression_targets(
        boxes, image_ids, c.overlaps, c.gt, c.present & ~c.gt_crowd, max_overlap, max_class,
        bbox_thresh, cls_agnostic, bbox_reg_weights, xyxy)

    num_images = len(c.gt)
    fg = max_overlap >= fg_thresh
    bg = (max_overlap < bg_thresh_hi) & (max_overlap >= bg_thresh_lo)
    num_slots = None
    if real is not None:
        fg, bg = fg & real, bg & real
        # A row is sampled at most once, or twice when the fg and bg ranges overlap.
        num_slots = min(num_images * int(batch_size_per_im), len(boxes) * (2 if bg_thresh_hi > fg_thresh else 1))
    fg_per_image = count_per_image(fg, image_ids, num_images).clamp(
        max=fg_rois_per_image(fg_fraction, batch_size_per_im))
    bg_per_image = torch.minimum(count_per_image(bg, image_ids, num_images),
                                 int(batch_size_per_im) - fg_per_image)
    fg = random_subset(fg, image_ids, fg_per_image, generator, row_keys=c.row_keys)
    bg = random_subset(bg, image_ids, bg_per_image, generator, row_keys=c.row_keys)

    rows, sampled_as_bg, valid = _fg_then_bg_per_image(fg, bg, image_ids, num_slots)
    rois = torch.cat((image_ids[rows].unsqueeze(1).to(boxes.dtype),
                      boxes[rows] * im_scales[image_ids[rows]].unsqueeze(1)), dim=1)
    labels = torch.where(sampled_as_bg, 0, max_class[rows])
    num_reg_classes = 2 if cls_agnostic else num_classes
    bbox_targets, inside_weights = _expand_bbox_targets(
        regression_class[rows], targets[rows], num_reg_classes)
    if valid is not None:
        rois, bbox_targets, inside_weights = (x * valid.unsqueeze(1) for x in (rois, bbox_targets, inside_weights))
        labels = labels * valid
    return SampledRoIs(rois, labels, bbox_targets, inside_weights, (inside_weights > 0).to(inside_weights.dtype),
                       valid)


class Candidates(NamedTuple):
    """Detectron's roidb of one batch after _merge_proposal_boxes_into_roidb, on the proposals' device."""
    boxes: torch.Tensor        # (M, 4) every image's gt rows, then the proposals / im_scale (original coordinates)
    image_ids: torch.Tensor    # (M,)
    is_gt_row: torch.Tensor    # (M,) bool
    overlaps: torch.Tensor     # (M, G) IoU with the padded gt of the own image
    gt: torch.Tensor           # (B, G, 4) the gt boxes padded to G columns
    gt_crowd: torch.Tensor     # (B, G) bool
    present: torch.Tensor      # (B, G) bool: a real gt column
    max_overlap: torch.Tensor  # (M,) Detectron's max_overlaps
    max_class: torch.Tensor    # (M,) Detectron's max_classes
    row_keys: torch.Tensor     # (M,) int64 what a row is (image and gt index, or proposal index), whatever the layout


def fg_rois_per_image(fg_fraction, batch_size_per_im):
    """Detectron's fg_rois_per_image: the most foreground RoIs an image's minibatch takes."""
    return int(round(fg_fraction * batch_size_per_im))


def candidate_assignments(proposals, im_scales, gt_boxes, gt_classes, gt_is_crowd):
    """The candidate RoIs of sample_rois (its arguments) with their overlaps and class assignments."""
    device = proposals.device
    gt, gt_class, gt_crowd, gt_present = padded_gt_columns(gt_boxes, gt_classes, gt_is_crowd, proposals)
    gt_rows = (torch.cat([b.to(device=device, dtype=proposals.dtype) for b in gt_boxes]),
               torch.cat([torch.full((len(b),), i, dtype=torch.long, device=device) for i, b in enumerate(gt_boxes)]),
               torch.cat([torch.arange(len(b), device=device) for b in gt_boxes]),
               torch.cat([c.to(device=device, dtype=torch.bool) for c in gt_is_crowd]),
               torch.cat([c.to(device=device, dtype=torch.long) for c in gt_classes]))
    return _assigned(proposals, im_scales, gt_rows, gt, gt_class, gt_crowd, gt_present)


def _padded_candidate_assignments(proposals, im_scales, gt, gt_class, gt_crowd, gt_present):
    """candidate_assignments with the gt padded to G columns ((B, G, 4) and (B, G)): every image's G gt slots,
    then the proposals (the slots of absent gt are candidates the caller leaves out)."""
    num_images, num_gt = gt_present.shape
    gt = gt.to(proposals.dtype)
    slots = torch.arange(num_gt, device=gt.device)
    gt_rows = (gt.reshape(-1, 4), torch.arange(num_images, device=gt.device).repeat_interleave(num_gt),
               slots.repeat(num_images), gt_crowd.reshape(-1), gt_class.reshape(-1))
    return _assigned(proposals, im_scales, gt_rows, gt, gt_class, gt_crowd, gt_present)


# A candidate's key: a gt row's image x 2^24 + its index among the image's gt, or 2^48 + a proposal's index.
_IMAGE_KEY_STRIDE = 1 << 24
_PROPOSAL_KEY_BASE = 1 << 48


def _assigned(proposals, im_scales, gt_rows, gt, gt_class, gt_crowd, gt_present):
    """The Candidates of Detectron's roidb: the gt rows (boxes, image, index in the image, crowd, class; in
    original coordinates), then the proposals / im_scale, with their overlaps with the padded gt (B, G) of
    their own image and their class assignments. A row's key is the same in the compact and the padded layout."""
    gt_row_boxes, gt_row_image, gt_row_index, gt_row_crowd, gt_row_class = gt_rows
    device = proposals.device
    num_proposals = len(proposals)
    proposal_image_ids = proposals[:, 0].long()
    # Detectron multiplies by the inverse scale (json_dataset.add_proposals).
    proposal_boxes = proposals[:, 1:5] * (1.0 / im_scales)[proposal_image_ids].unsqueeze(1)
    no_proposals = torch.zeros(num_proposals, dtype=torch.bool, device=device)
    boxes = torch.cat((gt_row_boxes, proposal_boxes))
    image_ids = torch.cat((gt_row_image, proposal_image_ids))
    is_gt_row = torch.cat((torch.ones_like(gt_row_crowd), no_proposals))
    row_crowd = torch.cat((gt_row_crowd, no_proposals))
    row_class = torch.cat((gt_row_class, torch.zeros(num_proposals, dtype=torch.long, device=device)))
    row_keys = torch.cat((gt_row_image * _IMAGE_KEY_STRIDE + gt_row_index,
                          _PROPOSAL_KEY_BASE + torch.arange(num_proposals, device=device)))
    overlaps = _own_image_overlaps(boxes, image_ids, gt)
    max_overlap, max_class = _class_assignments(
        overlaps.masked_fill(~gt_present[image_ids], -1.0), gt_class[image_ids],
        is_gt_row, row_crowd, row_class)
    return Candidates(boxes, image_ids, is_gt_row, overlaps, gt, gt_crowd, gt_present, max_overlap, max_class,
                      row_keys)


def padded_gt_columns(gt_boxes, gt_classes, gt_is_crowd, like, num_columns=1):
    """Per image gt padded to G columns, G at least num_columns and the most gt boxes of an image (and
    >= 1): boxes (B, G, 4) of like's dtype and device, class, crowd, present (B, G)."""
    num_images = len(gt_boxes)
    num_gt = max([1, num_columns] + [len(b) for b in gt_boxes])
    boxes = like.new_zeros(num_images, num_gt, 4)
    classes = torch.zeros(num_images, num_gt, dtype=torch.long, device=like.device)
    crowd = torch.zeros(num_images, num_gt, dtype=torch.bool, device=like.device)
    present = torch.zeros(num_images, num_gt, dtype=torch.bool, device=like.device)
    for i, (b, c, k) in enumerate(zip(gt_boxes, gt_classes, gt_is_crowd)):
        boxes[i, :len(b)] = b
        classes[i, :len(b)] = c
        crowd[i, :len(b)] = k.to(torch.bool)
        present[i, :len(b)] = True
    return boxes, classes, crowd, present


def _own_image_overlaps(boxes, image_ids, gt):
    """(M, G) IoU of each candidate with the (padded) gt of its own image."""
    num_images, num_gt = gt.shape[:2]
    overlaps = box_utils.box_iou_t(boxes, gt.reshape(-1, 4)).view(-1, num_images, num_gt)
    return overlaps[torch.arange(len(boxes), device=boxes.device), image_ids]


def _class_assignments(overlaps, candidate_gt_classes, is_gt_row, gt_row_crowd, gt_row_class):
    """Detectron's max_overlaps / max_classes (roidb gt_overlaps after _merge_proposal_boxes)."""
    best, best_gt = overlaps.max(dim=1)
    best_class = torch.gather(candidate_gt_classes, 1, best_gt.unsqueeze(1)).squeeze(1)
    proposal_overlap = torch.where(best > 0, best, torch.zeros_like(best))
    proposal_class = torch.where(best > 0, best_class, torch.zeros_like(best_class))
    gt_row_overlap = torch.where(gt_row_crowd, -1.0, 1.0).to(overlaps.dtype)
    gt_row_class = torch.where(gt_row_crowd, torch.zeros_like(gt_row_class), gt_row_class)
    return (torch.where(is_gt_row, gt_row_overlap, proposal_overlap),
            torch.where(is_gt_row, gt_row_class, proposal_class))


def _regression_targets(boxes, image_ids, overlaps, gt, gt_regressable, max_overlap, max_class,
                        bbox_thresh, cls_agnostic, weights, xyxy):
    """Detectron's compute_bbox_regression_targets: (M,) regression class (0 = none), (M, 4)."""
    regressable = gt_regressable[image_ids]
    best_gt = overlaps.masked_fill(~regressable, -1.0).argmax(dim=1)
    assigned_gt = gt[image_ids, best_gt]
    has_target = (max_overlap >= bbox_thresh) & regressable.any(dim=1)
    regression_class = torch.where(
        has_target, torch.ones_like(max_class) if cls_agnostic else max_class,
        torch.zeros_like(max_class))
    targets = box_utils.bbox_transform_inv_t(boxes, assigned_gt, weights, xyxy=xyxy)
    return regression_class, torch.where(has_target.unsqueeze(1), targets, torch.zeros_like(targets))


def count_per_image(mask, image_ids, num_images):
    return torch.zeros(num_images, dtype=torch.long, device=mask.device).index_add_(
        0, image_ids, mask.long())


def random_subset(eligible, image_ids, quotas, generator, priority=None, row_keys=None):
    """Per image i, a uniformly random quotas[i] of its eligible rows, without replacement
    (Detectron's npr.choice(..., replace=False)); a bool mask, computed without host sync. priority:
    the rows' uniform [0, 1) draws when the caller made them (the eligible rows of lowest priority are
    taken), else keyed_uniform of the rows' keys (row_keys, default their positions) and a seed drawn
    here from generator: a row's draw depends on its key, not on the rows around it."""
    num_rows = len(eligible)
    if priority is None:
        seed = torch.randint(2 ** 62, (1,), generator=generator, device=eligible.device)
        keys = torch.arange(num_rows, device=eligible.device) if row_keys is None else row_keys
        priority = keyed_uniform(keys, seed)
    # Sort image-major with the eligible rows of an image first, in random order.
    order = (image_ids.double() * 2 + (~eligible).double() + priority).argsort()
    sorted_ids = image_ids[order]
    first_row = torch.searchsorted(sorted_ids, sorted_ids)  # of each row's image (no host sync)
    rank_in_image = torch.arange(num_rows, device=eligible.device) - first_row
    chosen = eligible[order] & (rank_in_image < quotas[sorted_ids])
    return torch.zeros_like(eligible).scatter_(0, order, chosen)


def _as_int64(unsigned):
    """The int64 with the bits of a 64-bit unsigned constant."""
    return unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned


# SplitMix64 (Steele, Lea and Flood, 2014): the golden-ratio step and the two multipliers of its finaliser.
_GOLDEN = _as_int64(0x9E3779B97F4A7C15)
_MIX1 = _as_int64(0xBF58476D1CE4E5B9)
_MIX2 = _as_int64(0x94D049BB133111EB)


def _shifted_right(x, bits):
    """x >> bits as unsigned 64-bit integers (torch shifts int64 arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def keyed_uniform(keys, seed):
    """(N,) float64 uniform in [0, 1): SplitMix64's output for the state seed + key x golden ratio (int64
    arithmetic wraps as unsigned), its top 53 bits. Distinct keys give independent draws; the same key and
    seed the same draw on any device."""
    z = keys * _GOLDEN + seed
    z = (z ^ _shifted_right(z, 30)) * _MIX1
    z = (z ^ _shifted_right(z, 27)) * _MIX2
    z = z ^ _shifted_right(z, 31)
    return _shifted_right(z, 11).double() * 2.0 ** -53


_UNSAMPLED = torch.iinfo(torch.int64).max  # the sort key of a row not sampled: after every sampled one


def _fg_then_bg_per_image(fg, bg, image_ids, num_slots=None):
    """Row indices of the sampled RoIs, image by image, fg rows before bg rows, a flag telling
    which were sampled as bg (a row may be both when bg_thresh_hi > fg_thresh), and None; with
    num_slots, num_slots rows (the sampled ones, then row 0 repeated) and the flags of the sampled."""
    num_rows = len(fg)
    rows = torch.arange(num_rows, device=fg.device)
    key = image_ids * (2 * num_rows) + rows
    keys, sampled = torch.cat((key, key + num_rows)), torch.cat((fg, bg))
    if num_slots is None:  # the boolean selection is a host synchronisation (its size)
        keys = keys[sampled].sort().values
        return keys % num_rows, (keys // num_rows) % 2 == 1, None
    keys = torch.where(sampled, keys, _UNSAMPLED).sort().values[:num_slots]
    valid = keys != _UNSAMPLED
    keys = keys * valid
    return keys % num_rows, (keys // num_rows) % 2 == 1, valid


def _expand_bbox_targets(regression_class, targets, num_reg_classes):
    """Compact (class, 4 targets) -> (S, 4K) blobs with the 4 values in columns 4c..4c+3 of class
    c > 0, and inside weights 1 there."""
    # A comparison, not one_hot, which checks the class range on the host (a sync).
    on_class = regression_class.unsqueeze(1) == torch.arange(num_reg_classes, device=regression_class.device)
    on_class[:, 0] = False
    on_class = on_class.unsqueeze(2).expand(-1, -1, 4)
    expanded = torch.where(on_class, targets.unsqueeze(1), torch.zeros_like(targets).unsqueeze(1))
    shape = (len(targets), 4 * num_reg_classes)
    return expanded.reshape(shape), on_class.to(targets.dtype).reshape(shape)
