"""Greedy NMS and soft-NMS with Detectron's +1 areas and its order of equal scores, and their dispatch:
torchvision's kernel, Detectron's compiled kernels (detectron.utils.cython_nms) on the CPU, bitmask_nms'
Triton kernels on CUDA, and a matrix iteration in torch as the plain reference."""
import numpy as np
import torch
import torchvision

from detectron.ops import bitmask_nms
from detectron.utils import cython_nms
from detectron.utils.boxes import boxes_area_t

# soft-NMS method name -> kernel code
_SOFT_NMS_METHODS = cython_nms.SOFT_NMS_METHODS


def _plus_one_corners_t(boxes):
    """Move x2, y2 one pixel out, so that torchvision's x2 - x1 sides equal Detectron's +1 sides."""
    return torch.cat([boxes[:, :2], boxes[:, 2:4] + 1.0], dim=1)


def nms_t(boxes, scores, thresh):
    """Greedy NMS of (N, 4) boxes with Detectron's +1 areas, via torchvision.ops.nms.

    Returns kept indices in descending score order (Detectron's nms returns ascending indices).
    Suppresses at IoU >= thresh like Detectron's kernel (see torchvision_nms_thresh); of equal
    scores the later box comes first, as in Detectron's scores.argsort()[::-1].
    """
    return _later_first(lambda rev: torchvision.ops.nms(
        _plus_one_corners_t(boxes[rev]), scores[rev], torchvision_nms_thresh(thresh)), boxes.shape[0], boxes.device)


def _later_first(nms_of_reversed, n, device):
    """Kept indices of an NMS (stable descending sort: of equal scores the earlier box first) run
    on the boxes in reverse order, mapped back: of equal scores the later box comes first, as
    Detectron's kernels order them (a stable ascending argsort, reversed)."""
    rev = torch.arange(n - 1, -1, -1, device=device)
    return n - 1 - nms_of_reversed(rev)


def torchvision_nms_thresh(thresh):
    """The threshold t for which torchvision's rule (suppress IoU > t) suppresses exactly what
    Detectron's kernel suppresses (float32 IoU >= thresh rounded to float32): the float32 just
    below float32(thresh). Without it, an IoU equal to the threshold (common with integer boxes:
    [0,0,9,9] and [0,0,9,19] at 0.5) would survive."""
    return float(np.nextafter(np.float32(thresh), np.float32(-np.inf)))


# Above this many box pairs per call the matrix NMS would hold too much memory: torchvision's kernel.
MATRIX_NMS_MAX_PAIRS = 2 ** 26
_NMS_ROUNDS_PER_CHECK = 8


def batched_nms_t(boxes, scores, idxs, thresh):
    """nms_t run separately for each value of idxs (e.g. class or image); kept indices in
    descending score order. Suppresses at IoU >= thresh, as nms_t.

    On the CPU each group goes through Detectron's own kernel (lib/cython_nms: its IoU arithmetic,
    which torchvision's +1-shifted corners and per-group coordinate offsets round apart near the
    threshold, and its visiting order). On CUDA the same arithmetic by bitmask_nms' two Triton
    kernels for all groups at once (groups of up to MAX_GROUP_SIZE boxes), without torchvision's
    per-group host round trips (its kernel scans the suppression mask once per group, past 20000
    boxes each group a call); without Triton by `matrix_batched_nms_t` while the padded pair matrix
    stays under MATRIX_NMS_MAX_PAIRS; beyond both, torchvision's.
    """
    if not boxes.is_cuda:
        return _detectron_batched_nms(boxes, scores, idxs, thresh)
    torchvision_thresh = torchvision_nms_thresh(thresh)
    if boxes.numel():
        slots, counts = _grouped_by_score(scores, idxs)
        keep = _slots_keep(boxes, slots, counts, torchvision_thresh)
        if keep is not None:
            return _kept_in_score_order(slots, keep, scores)
    return _later_first(lambda rev: torchvision.ops.batched_nms(
        _plus_one_corners_t(boxes[rev]), scores[rev], idxs[rev], torchvision_thresh), boxes.shape[0], boxes.device)


def grouped_nms_keep(boxes, slots, thresh):
    """Greedy NMS keep flags (G, M) of each row of slots: indices into boxes (N, 4), a row's boxes
    by descending score, then -1 to the row's end. Suppresses at IoU >= thresh, as nms_t. On CUDA
    by bitmask_nms' kernels, without a host synchronisation; elsewhere by `_matrix_keep` while its
    pair matrix stays under MATRIX_NMS_MAX_PAIRS; beyond both, by batched_nms_t on the rows'
    boxes (reading their number from the device)."""
    keep = _slots_keep(boxes, slots, (slots >= 0).sum(dim=1), torchvision_nms_thresh(thresh))
    if keep is not None:
        return keep
    positions = (slots >= 0).reshape(-1).nonzero().squeeze(1)
    # Scores falling with the position: batched_nms_t then visits each row in its slots' order.
    kept = batched_nms_t(boxes[slots.reshape(-1)[positions]], -positions.to(torch.float64),
                         positions // slots.shape[1], thresh)
    keep = torch.zeros(slots.numel(), dtype=torch.bool, device=slots.device)
    keep[positions[kept]] = True
    return keep.view_as(slots)


def _slots_keep(boxes, slots, counts, torchvision_thresh):
    """Greedy keep flags (G, M) of grouped boxes (slots, counts as _grouped_by_score's) by the
    bitmask kernels (CUDA, groups of up to MAX_GROUP_SIZE) or the matrix iteration (while its pair
    matrix stays under MATRIX_NMS_MAX_PAIRS); None when neither takes them."""
    if bitmask_nms.available(boxes.device) and slots.shape[1] <= bitmask_nms.MAX_GROUP_SIZE:
        return _bitmask_keep(boxes, slots, counts, torchvision_thresh)
    if slots.numel() * slots.shape[1] <= MATRIX_NMS_MAX_PAIRS:
        return _matrix_keep(boxes, slots, torchvision_thresh)
    return None


def _detectron_batched_nms(boxes, scores, idxs, thresh):
    """Detectron's greedy NMS (cython_nms.nms on float32 dets) per value of idxs; kept indices in
    descending score order, of equal scores the later first."""
    dets = torch.cat([boxes, scores[:, None]], dim=1).float().numpy()
    groups = idxs.numpy()
    kept = [np.flatnonzero(groups == g)[nms(dets[groups == g], thresh)] for g in np.unique(groups)]
    kept = torch.from_numpy(np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, np.int64)).sort().values
    return kept[_descending_later_first(scores[kept])]


def matrix_batched_nms_t(boxes, scores, idxs, thresh):
    """Greedy NMS per group as tensor operations: the same kept set as torchvision's batched_nms
    (IoU > thresh with +1 areas), in descending score order, of equal scores the later box first
    (Detectron's order)."""
    slots, _ = _grouped_by_score(scores, idxs)
    return _kept_in_score_order(slots, _matrix_keep(boxes, slots, thresh), scores)


def _bitmask_keep(boxes, slots, counts, thresh):
    """Greedy keep flags (G, M) of the grouped boxes by bitmask_nms' kernels."""
    return greedy_keep_op(boxes[slots.clamp(min=0)], counts, thresh)


# A torch.library custom op (torch.export, torch.compile): bitmask_nms' kernels on CUDA with Triton,
# else the matrix iteration, so that an exported CUDA model also runs where Triton is absent.
@torch.library.custom_op('detectron::greedy_keep', mutates_args=())
def greedy_keep_op(grouped: torch.Tensor, counts: torch.Tensor, thresh: float) -> torch.Tensor:
    """bitmask_nms.greedy_keep's flags (G, M): suppression at IoU > thresh within each group."""
    if bitmask_nms.available(grouped.device):
        return bitmask_nms.greedy_keep(grouped, counts, thresh)
    num_groups, size = grouped.shape[:2]
    positions = torch.arange(num_groups * size, device=grouped.device).view(num_groups, size)
    slots = torch.where(positions % size < counts[:, None], positions, -1)
    return _matrix_keep(grouped.float().reshape(-1, 4), slots, thresh)


@greedy_keep_op.register_fake
def _(grouped, counts, thresh):
    return grouped.new_empty(grouped.shape[:2], dtype=torch.bool)


def _grouped_by_score(scores, idxs):
    """(slots, counts): slots (G, M) holds each group's box indices by descending score (of equal
    scores the later first), padded with -1; counts (G,) the group sizes. Groups in idxs order."""
    order = _descending_later_first(scores)
    order = order[idxs[order].argsort(stable=True)]
    _, group, counts = torch.unique_consecutive(idxs[order], return_inverse=True, return_counts=True)
    rank = torch.arange(order.numel(), device=order.device) - (counts.cumsum(0) - counts)[group]
    slots = torch.full((counts.numel(), int(counts.max())), -1, dtype=torch.long, device=order.device)
    slots[group, rank] = order
    return slots, counts


def _kept_in_score_order(slots, keep, scores):
    kept = slots[keep].sort().values
    return kept[_descending_later_first(scores[kept])]


def _matrix_keep(boxes, slots, thresh):
    """Greedy keep flags (G, M) of the grouped boxes. S[g, j, i] says that box j, earlier in score
    order, would suppress box i. Greedy NMS keeps i iff no KEPT earlier box suppresses it, a
    recursion over positions; iterating keep <- not any_j(S[j, i] and keep[j]) from "all kept"
    fixes one more position per round, so it reaches the greedy result in at most (longest
    suppression chain) rounds, each one batched matrix reduction."""
    valid = slots >= 0
    grouped = boxes[slots.clamp(min=0)]
    lo = torch.maximum(grouped[:, :, None, :2], grouped[:, None, :, :2])
    hi = torch.minimum(grouped[:, :, None, 2:4], grouped[:, None, :, 2:4])
    inter = (hi - lo + 1).clamp(min=0).prod(dim=3)
    area = boxes_area_t(grouped.reshape(-1, 4)).reshape(valid.shape)
    iou = inter / (area[:, :, None] + area[:, None, :] - inter)
    earlier = torch.ones(valid.shape[1], valid.shape[1], dtype=torch.bool, device=slots.device).triu(1)
    suppresses = (iou > thresh) & earlier & valid[:, :, None]
    # Each convergence check is a host synchronisation: check after 1, 2, 4, then every 8 rounds
    # (rounds past the fixed point change nothing).
    keep, rounds = valid, 1
    while True:
        for _ in range(rounds):
            previous, keep = keep, valid & ~(suppresses & keep[:, :, None]).any(dim=1)
        if torch.equal(previous, keep):
            return keep
        rounds = min(2 * rounds, _NMS_ROUNDS_PER_CHECK)


def _descending_later_first(scores):
    """Indices by descending score, of equal scores the later first: Detectron's argsort()[::-1]."""
    return scores.argsort(stable=True).flip(0)


def nms(dets, thresh):
    """Detectron's greedy NMS of dets (N, 5); kept indices in ascending order, [] if N = 0."""
    if dets.shape[0] == 0:
        return []
    return cython_nms.nms(dets, thresh)


def soft_nms(dets, sigma=0.5, overlap_thresh=0.3, score_thresh=0.001, method='linear'):
    """Detectron's soft-NMS of dets (N, 5) -> (rescored dets in selection order, their indices).

    method is 'hard', 'linear' or 'gaussian' (see cython_nms.soft_nms); the input is not modified.
    """
    if method not in _SOFT_NMS_METHODS:
        raise ValueError(f'Unknown soft-NMS method {method!r}; use one of {", ".join(_SOFT_NMS_METHODS)}')
    if dets.shape[0] == 0:
        return dets, []
    return cython_nms.soft_nms(np.ascontiguousarray(dets, dtype=np.float32), np.float32(sigma),
                               np.float32(overlap_thresh), np.float32(score_thresh),
                               _SOFT_NMS_METHODS[method])


def soft_nms_(dets, sigma=0.5, overlap_thresh=0.3, score_thresh=0.001, method='linear'):
    """soft_nms IN PLACE on dets, a writable C-contiguous float32 (N, 5) array, as CenterNet's
    external/nms.pyx soft_nms works: returns the number n of live rows, dets[:n] being soft_nms's
    rescored dets; rows [n, N) are left as the kernel's steps left them (cython_nms.soft_nms,
    in_place)."""
    if method not in _SOFT_NMS_METHODS:
        raise ValueError(f'Unknown soft-NMS method {method!r}; use one of {", ".join(_SOFT_NMS_METHODS)}')
    kept, _ = cython_nms.soft_nms(dets, np.float32(sigma), np.float32(overlap_thresh), np.float32(score_thresh),
                                  _SOFT_NMS_METHODS[method], in_place=True)
    return len(kept)
