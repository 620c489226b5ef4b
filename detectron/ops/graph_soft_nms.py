"""The sequential NMS variants of the R-CNN test as graph ops, for the exported R-CNN: KL-Loss's
soft-NMS with variance voting (`py_cpu_nms.soft`, ops/variance_voting.py), Detectron's soft-NMS
(cython_nms.soft_nms) and Detectron's box voting (boxes.box_voting).

A soft-NMS is a loop whose every step depends on the last, but each box set's selected scores never
increase (a rescoring factor is at most 1), so with a per-image limit of D detections only a set's
first D selections can pass it. `soft_nms_selections` unrolls those D steps, each step on all sets
at once (C sets padded to N rows, a mask of the live ones): the first highest live score (first in
the positions that the kernels' swaps give the boxes, tracked here so that equal scores are
selected in the kernels' order), its row of IoUs, the optional vote, the rescoring and the drops.
Every op traces to ONNX (opset 18) and torch.export with shapes read from the inputs.
"""
import torch

from detectron.utils.boxes import box_iou_pairs_t, box_iou_t

# The kernels' drop scores: KL-Loss's `soft` drops below 0.001; Detectron's soft-NMS at test below
# 0.0001 (its score_thresh argument, modeling/rcnn_inference.py).
KL_DROP_SCORE = 0.001
# KL-Loss's Gaussian soft-NMS sigma (its `soft` hard-codes it).
_KL_SOFT_SIGMA = 0.5


def soft_nms_selections(boxes, scores, live, steps, rescore, drop_below, vote=None):
    """The first `steps` selections of a soft-NMS on each of C box sets.

    boxes (C, N, 4) float32, scores (C, N) float32, live (C, N) bool: the set's boxes (a set's
    live rows keep their relative order as its rows in the kernels). rescore(scores, iou) gives
    the decayed scores of the boxes given their IoUs with the selected box (iou_fn's); a
    rescored box below drop_below is dropped. With vote(iou, voters, chosen) -> (C, 4) the
    selected box is replaced by its vote over the live boxes `voters` (itself included). The
    IoUs of the selected box with its set's boxes are KL-Loss's float32 ones (kl_iou_t) when
    rescore.kl, else those of Detectron's soft-NMS (boxes.box_iou_pairs_t).

    Returns rows (C, S) int64 (the selected rows, in selection order), valid (C, S) bool, the
    selected scores (C, S) (their scores when selected, which they keep) and boxes (C, S, 4).
    """
    num_sets, width = scores.shape
    arange = torch.arange(width, device=scores.device).expand(num_sets, width)
    # Positions as the kernels' arrays hold the rows: the live rows first, in row order.
    num_live = live.sum(1, keepdim=True)
    positions = torch.where(live, live.long().cumsum(1) - 1, num_live + (~live).long().cumsum(1) - 1)
    # The end of the live positions: selected boxes take positions 0.., live ones up to `end`.
    end = num_live
    out_rows, out_valid, out_scores, out_boxes = [], [], [], []
    for step in range(steps):
        top = torch.where(live, scores, float('-inf')).max(1, keepdim=True).values
        any_live = live.any(1, keepdim=True)
        tied = live & (scores == top)
        first = torch.where(tied, positions, width).min(1, keepdim=True).values
        is_chosen = tied & (positions == first)
        chosen = (is_chosen.long() * arange).sum(1, keepdim=True)
        chosen_box = boxes.gather(1, chosen[:, :, None].expand(-1, 1, 4))
        iou = kl_iou_t(chosen_box, boxes) if rescore.kl else box_iou_pairs_t(chosen_box, boxes)
        out_rows.append(chosen)
        out_valid.append(any_live)
        out_scores.append(top)
        out_boxes.append(vote(iou, live, chosen) if vote is not None else chosen_box[:, 0])
        # The selected box swaps places with the box at position `step`.
        positions = torch.where(is_chosen, step, torch.where((positions == step) & any_live, first, positions))
        live = live & ~is_chosen
        touched = live & (iou > 0)
        scores = torch.where(touched, rescore(scores, iou), scores)
        dropped = touched & (scores < drop_below)
        live = live & ~dropped
        end = end - dropped.long().sum(1, keepdim=True)
        positions = _fill_holes(positions, dropped, live, end, arange)
    return (torch.cat(out_rows, 1), torch.cat(out_valid, 1), torch.cat(out_scores, 1),
            torch.stack(out_boxes, 1))


def _fill_holes(positions, dropped, live, end, arange):
    """The kernels' removal of dropped boxes: a dropped box swaps with the last live one, which is
    examined in its place. Net effect: the holes that dropped boxes leave before the new `end`
    are filled, in increasing position, by the live boxes beyond it in decreasing position, and
    the dropped boxes take the movers' places (positions stay a permutation)."""
    width = positions.shape[1]
    row_at = torch.zeros_like(positions).scatter(1, positions, arange)
    holes = (dropped & (positions < end)).gather(1, row_at)
    movers = (live & (positions >= end)).gather(1, row_at)
    hole_rank = torch.where(holes, holes.long().cumsum(1) - 1, width)
    mover_rank = torch.where(movers, movers.long().flip(1).cumsum(1).flip(1) - 1, width)
    spare = positions.new_zeros(positions.shape[0], width + 1)
    hole_at = spare.scatter(1, hole_rank, arange)
    mover_at = spare.scatter(1, mover_rank, arange)
    moved = torch.where(movers, hole_at.gather(1, mover_rank),
                        torch.where(holes, mover_at.gather(1, hole_rank), arange))
    return torch.zeros_like(positions).scatter(1, row_at, moved)


def kl_iou_t(boxes_a, boxes_b):
    """KL-Loss's soft IoU of broadcast (..., 4) boxes (ops/variance_voting's kernels): float32,
    +1 sides, union = (area_a + area_b) - intersection, 0 without a positive intersection."""
    width_a, height_a = boxes_a[..., 2] - boxes_a[..., 0] + 1.0, boxes_a[..., 3] - boxes_a[..., 1] + 1.0
    width_b, height_b = boxes_b[..., 2] - boxes_b[..., 0] + 1.0, boxes_b[..., 3] - boxes_b[..., 1] + 1.0
    inter_w = (torch.minimum(boxes_a[..., 2], boxes_b[..., 2]) - torch.maximum(boxes_a[..., 0], boxes_b[..., 0])) + 1.0
    inter_h = (torch.minimum(boxes_a[..., 3], boxes_b[..., 3]) - torch.maximum(boxes_a[..., 1], boxes_b[..., 1])) + 1.0
    inter = inter_w.clamp(min=0) * inter_h.clamp(min=0)
    union = (width_a * height_a + width_b * height_b) - inter
    return torch.where(inter > 0, inter / torch.where(inter > 0, union, 1.0), 0.0)


class KLRescore:
    """KL-Loss's rescoring: float32(score * exp(-IoU^2 / 0.5)) in float64, or with a hard
    threshold 0 above it."""
    kl = True

    def __init__(self, hard_nms_thresh=None):
        self.hard_nms_thresh = hard_nms_thresh

    def __call__(self, scores, iou):
        iou = iou.double()
        if self.hard_nms_thresh is not None:
            return torch.where(iou > self.hard_nms_thresh, 0.0, scores)
        return (scores.double() * torch.exp(-(iou * iou) / _KL_SOFT_SIGMA)).float()


class DetectronRescore:
    """Detectron's soft-NMS weights in its float32 steps: 'linear' 1 - IoU above the overlap
    threshold, 'gaussian' exp(-IoU^2 / sigma) (exponent float32, exp in double), 'hard' 0 above
    it; the score is weight * score in float32."""
    kl = False

    def __init__(self, method, sigma, overlap_thresh):
        self.method = method
        # The kernel's float32 arguments (a Python float divides and compares as one).
        self.sigma = torch.tensor(sigma, dtype=torch.float32).item()
        self.overlap_thresh = torch.tensor(overlap_thresh, dtype=torch.float32).item()

    def __call__(self, scores, iou):
        if self.method == 'gaussian':
            weight = torch.exp((-(iou * iou) / self.sigma).double()).float()
        elif self.method == 'linear':
            weight = torch.where(iou > self.overlap_thresh, 1.0 - iou, 1.0)
        else:
            weight = torch.where(iou > self.overlap_thresh, 0.0, 1.0)
        return weight * scores


class KLVote:
    """KL-Loss's variance voting of the selected box: per column, the average of the voters'
    boxes with IoU above vote_thresh weighted by exp(-(1 - IoU)^2 / iou_sigma) / sigma^2, float32
    vote terms summed in float64."""

    def __init__(self, boxes, sigmas, vote_thresh, iou_sigma):
        variances = sigmas * sigmas
        self.terms = torch.cat([boxes / variances, 1.0 / variances], dim=2).double()
        self.vote_thresh = vote_thresh
        self.iou_sigma = iou_sigma

    def __call__(self, iou, voters, chosen):
        iou = iou.double()
        gap = 1.0 - iou
        weight = torch.exp(-(gap * gap) / self.iou_sigma)
        votes = (voters & (iou > self.vote_thresh))[:, :, None]
        sums = torch.where(votes, weight[:, :, None] * self.terms, 0.0).sum(1)
        return (sums[:, :4] / sums[:, 4:]).float()


def box_voting(top_dets, top_groups, all_dets, all_groups, thresh, scoring_method='ID', beta=1.0):
    """boxes.box_voting of each group's top_dets (K, 5) with that group's all_dets (A, 5), all
    groups at once: each top box the score-weighted average of the boxes with IoU >= thresh
    (kept when the weights sum to 0), its score by scoring_method (boxes._VOTE_SCORERS), float32
    (the sums in another order than numpy's: within float32 rounding)."""
    top_boxes, all_boxes, all_scores = top_dets[:, :4], all_dets[:, :4], all_dets[:, 4]
    iou = box_iou_t(top_boxes, all_boxes)
    voters = (iou >= thresh) & (top_groups[:, None] == all_groups[None, :])
    weights = torch.where(voters, all_scores[None, :], 0.0)
    total = weights.sum(1, keepdim=True)
    averaged = (weights[:, :, None] * all_boxes[None]).sum(1) / total
    boxes = torch.where(total != 0, averaged, top_boxes)
    scores = _vote_scores(top_dets[:, 4], voters, all_scores, iou, scoring_method, beta)
    return torch.cat([boxes, scores[:, None]], dim=1)


def _vote_scores(top_scores, voters, all_scores, iou, method, beta):
    count = voters.sum(1).float()

    def voter_sum(values):
        return torch.where(voters, values, 0.0).sum(1)

    scores = all_scores[None, :].expand_as(iou)
    if method == 'ID':
        return top_scores
    if method == 'AVG':
        return voter_sum(scores) / count
    if method == 'IOU_AVG':
        ious = voter_sum(iou)
        return torch.where(ious != 0, voter_sum(scores * iou) / ious, top_scores)
    if method == 'GENERALIZED_AVG':
        return (voter_sum(scores ** beta) / count) ** (1.0 / beta)
    if method == 'QUASI_SUM':
        return voter_sum(scores) / count ** beta
    if method == 'TEMP_AVG':
        probs = torch.stack([scores, 1.0 - scores])
        tempered = torch.exp(torch.log(probs / probs.max(0).values) / beta)
        return voter_sum(tempered[0] / tempered.sum(0)) / count
    raise ValueError(f'Unknown box voting scoring method {method!r}')
