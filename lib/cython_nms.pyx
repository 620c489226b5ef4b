# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Detectron's greedy NMS and soft-NMS kernels, and KL-Loss's soft-NMS with variance voting.

Boxes are float32 rows (x1, y1, x2, y2, score) with Detectron's "+1" side lengths. The arithmetic
of `nms` and `soft_nms` reproduces the generated C of Detectron's kernels: the "+ 1" terms are C
doubles, so box sides, areas and unions are formed in double and rounded to float32 where
Detectron stores them, while intersections, IoUs and scores stay float32.
`soft_nms_with_variance_voting` follows KL-Loss's numpy instead (every box op in float32).
"""
import numpy as np

from libc.math cimport exp

SOFT_NMS_METHODS = {'hard': 0, 'linear': 1, 'gaussian': 2}


cdef inline float _max(float a, float b) noexcept nogil:
    return a if a >= b else b


cdef inline float _min(float a, float b) noexcept nogil:
    return a if a <= b else b


def nms(dets, float thresh):
    """Greedy NMS of dets (N, 5) = (x1, y1, x2, y2, score).

    Boxes are visited by descending score (NumPy's `argsort()[::-1]`, so ties follow NumPy's
    unstable sort) and a lower-scored box is suppressed when its IoU with a kept box is >= thresh.
    Returns the indices of the kept boxes in ascending index order (not score order).
    """
    dets = np.ascontiguousarray(dets, dtype=np.float32)
    cdef const float[:, ::1] d = dets
    cdef Py_ssize_t n = dets.shape[0]
    cdef const float[::1] areas = np.ascontiguousarray(
        (dets[:, 2] - dets[:, 0] + 1) * (dets[:, 3] - dets[:, 1] + 1))
    cdef const Py_ssize_t[::1] order = np.ascontiguousarray(
        dets[:, 4].argsort()[::-1], dtype=np.intp)
    suppressed_arr = np.zeros(n, dtype=np.uint8)
    cdef unsigned char[::1] suppressed = suppressed_arr
    cdef Py_ssize_t oi, oj, i, j
    cdef float w, h, inter, ovr

    with nogil:
        for oi in range(n):
            i = order[oi]
            if suppressed[i]:
                continue
            for oj in range(oi + 1, n):
                j = order[oj]
                if suppressed[j]:
                    continue
                w = _max(0.0, _min(d[i, 2], d[j, 2]) - _max(d[i, 0], d[j, 0]) + 1.0)
                h = _max(0.0, _min(d[i, 3], d[j, 3]) - _max(d[i, 1], d[j, 1]) + 1.0)
                inter = w * h
                ovr = inter / (areas[i] + areas[j] - inter)
                if ovr >= thresh:
                    suppressed[j] = 1

    return np.flatnonzero(suppressed_arr == 0)


def soft_nms(boxes_in, float sigma=0.5, float Nt=0.3, float threshold=0.001, unsigned int method=0,
             bint in_place=False):
    """Soft-NMS (Bodla et al. 2017) of boxes_in (N, 5) = (x1, y1, x2, y2, score).

    Works on a float32 copy, like Detectron's kernel: at step i the first highest-scored box among
    rows i..N-1 is swapped into row i; every later row whose box intersects it (positive +1 sides)
    has its score multiplied by a weight of the IoU `ov`:
    method 0 (hard) 0 if ov > Nt else 1; 1 (linear) 1 - ov if ov > Nt else 1;
    2 (gaussian) exp(-ov^2 / sigma). A rescored row whose score falls below `threshold` is
    replaced by the last live row and the live count N shrinks.
    Returns (boxes[:N], indices[:N]): rescored rows in selection order and their input indices.

    With in_place, boxes_in itself (a writable C-contiguous float32 ndarray) is worked on, as
    CenterNet's external/nms.pyx soft_nms does: its rows N.. are then left as the steps left them
    (stale copies of rows moved to a discarded position, with their score from before that step,
    and the last discarded row), which CenterNet's merge_outputs keeps.
    """
    if method > 2:
        raise ValueError(f'soft_nms method must be 0 (hard), 1 (linear) or 2 (gaussian), got {method}')
    if in_place:
        if not (isinstance(boxes_in, np.ndarray) and boxes_in.dtype == np.float32
                and boxes_in.flags.c_contiguous and boxes_in.flags.writeable):
            raise ValueError('soft_nms in_place needs a writable C-contiguous float32 ndarray')
        boxes = boxes_in
    else:
        boxes = np.array(boxes_in, dtype=np.float32, order='C', copy=True)
    inds = np.arange(boxes.shape[0], dtype=np.intp)
    cdef float[:, ::1] b = boxes
    cdef Py_ssize_t[::1] ind = inds
    cdef Py_ssize_t n = boxes.shape[0]
    cdef Py_ssize_t i = 0, pos, best
    cdef float tx1, ty1, tx2, ty2, area, iw, ih, ua, ov, weight

    with nogil:
        while i < n:
            best = i
            for pos in range(i + 1, n):
                if b[best, 4] < b[pos, 4]:
                    best = pos
            _swap_rows(b, ind, i, best)
            tx1, ty1, tx2, ty2 = b[i, 0], b[i, 1], b[i, 2], b[i, 3]

            pos = i + 1
            while pos < n:
                area = (b[pos, 2] - b[pos, 0] + 1.0) * (b[pos, 3] - b[pos, 1] + 1.0)
                iw = _min(tx2, b[pos, 2]) - _max(tx1, b[pos, 0]) + 1.0
                if iw > 0:
                    ih = _min(ty2, b[pos, 3]) - _max(ty1, b[pos, 1]) + 1.0
                    if ih > 0:
                        ua = (tx2 - tx1 + 1.0) * (ty2 - ty1 + 1.0) + area - iw * ih
                        ov = iw * ih / ua
                        weight = _soft_weight(ov, sigma, Nt, method)
                        b[pos, 4] = weight * b[pos, 4]
                        if b[pos, 4] < threshold:
                            # The last live row moves here and is examined at this same position.
                            _copy_row(b, ind, n - 1, pos)
                            n -= 1
                            continue
                pos += 1
            i += 1

    return boxes[:n], inds[:n]


cdef inline float _soft_weight(float ov, float sigma, float Nt, unsigned int method) noexcept nogil:
    if method == 2:
        # Exponent in float32, exp in double, weight rounded to float32, as in Detectron.
        return exp(-(ov * ov) / sigma)
    if ov <= Nt:
        return 1.0
    if method == 1:
        return 1.0 - ov
    return 0.0


cdef inline void _copy_row(float[:, ::1] b, Py_ssize_t[::1] ind, Py_ssize_t src, Py_ssize_t dst) noexcept nogil:
    cdef Py_ssize_t c
    for c in range(5):
        b[dst, c] = b[src, c]
    ind[dst] = ind[src]


cdef inline void _swap_rows(float[:, ::1] b, Py_ssize_t[::1] ind, Py_ssize_t r, Py_ssize_t s) noexcept nogil:
    cdef Py_ssize_t c
    cdef float tmp
    cdef Py_ssize_t tmp_ind
    for c in range(5):
        tmp = b[r, c]
        b[r, c] = b[s, c]
        b[s, c] = tmp
    tmp_ind = ind[r]
    ind[r] = ind[s]
    ind[s] = tmp_ind


# KL-Loss's py_cpu_nms.soft constants: Gaussian decay exp(-IoU^2 / 0.5); a rescored box below
# 0.001 is dropped.
cdef double _KL_SOFT_NMS_SIGMA = 0.5
cdef double _KL_DROP_SCORE = 0.001


cdef struct _KLSettings:
    double vote_thresh
    double iou_sigma
    bint vote
    bint hard
    double hard_nms_thresh


cdef struct _KLWork:
    # One box set's state by current position, swapped like the rows of KL-Loss's arrays.
    float* x1
    float* y1
    float* x2
    float* y2
    float* area
    float* score
    float* iou
    Py_ssize_t* row


def soft_nms_with_variance_voting(boxes, scores, sigmas, counts, double vote_thresh,
                                  double iou_sigma, bint vote=True, hard_nms_thresh=None):
    """KL-Loss's `py_cpu_nms.soft` (variance voting + soft-NMS) on one box set or C padded sets.

    boxes (C, N, 4) float32 (x1, y1, x2, y2), scores (C, N), sigmas (C, N, 4) matched to the box
    columns, counts (C,): set c uses its first counts[c] rows (None: all N). One set may also be
    given as boxes (N, 4), scores (N,), sigmas (N, 4); the outputs then have no set axis.

    Per set, literally as `soft`: position i takes the first highest score among the live
    positions i.. (swapping); with `vote` its box becomes the average of the live boxes with
    IoU > vote_thresh (itself included), weighted per column by exp(-(1 - IoU)^2 / iou_sigma) /
    sigma^2; every later live box with IoU > 0 is rescored by exp(-IoU^2 / 0.5) (or to 0 if
    IoU > hard_nms_thresh when that is given) and, below 0.001, swapped with the last live
    position, which is examined next. IoUs are those of the original boxes in float32 (+1 sides);
    box / sigma^2 and 1 / sigma^2 are float32; weights, sums and decays are float64, and a decayed
    score is float32(float64(score) * weight).

    Returns order (C, N) int64 (input row at each output position: the selection order, then the
    rows not kept in increasing row order), num_kept (C,) int64, voted boxes (C, N, 4) float32 by
    output position (the original box beyond num_kept), final scores (C, N) float32 by input row.
    The GIL is released while the sets are processed.
    """
    one_set = np.ndim(scores) == 1
    boxes = np.ascontiguousarray(boxes, dtype=np.float32)
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    sigmas = np.ascontiguousarray(sigmas, dtype=np.float32)
    if one_set:
        boxes, scores, sigmas = boxes[None], scores[None], sigmas[None]
    cdef Py_ssize_t num_sets = scores.shape[0], width = scores.shape[1]
    if boxes.shape != (num_sets, width, 4) or sigmas.shape != boxes.shape:
        raise ValueError(f'boxes and sigmas must have shape {(num_sets, width, 4)} for scores of '
                         f'shape {(num_sets, width)}, got {boxes.shape} and {sigmas.shape}')
    if counts is None:
        counts = np.full(num_sets, width, dtype=np.intp)
    counts = np.ascontiguousarray(np.reshape(counts, -1), dtype=np.intp)
    if counts.shape != (num_sets,) or np.any(counts < 0) or np.any(counts > width):
        raise ValueError(f'counts must hold {num_sets} values in [0, {width}], got {counts}')

    cdef _KLSettings settings
    settings.vote_thresh = vote_thresh
    settings.iou_sigma = iou_sigma
    settings.vote = vote
    settings.hard = hard_nms_thresh is not None
    settings.hard_nms_thresh = hard_nms_thresh if settings.hard else 0.0

    order = np.empty((num_sets, width), dtype=np.int64)
    num_kept = np.empty(num_sets, dtype=np.int64)
    voted = np.empty((num_sets, width, 4), dtype=np.float32)
    final_scores = scores.copy()
    # Vote terms of every row: box / sigma^2 (cols 0-3) and 1 / sigma^2 (cols 4-7), float32 as in
    # KL-Loss.
    variances = sigmas * sigmas
    vote_terms = np.concatenate([boxes / variances, np.float32(1) / variances], axis=2)
    floats = np.empty((7, max(width, 1)), dtype=np.float32)
    rows = np.empty(max(width, 1), dtype=np.intp)
    selected = np.empty(max(width, 1), dtype=np.uint8)

    cdef const float[:, :, ::1] b = boxes
    cdef const float[:, :, ::1] t = vote_terms
    cdef const Py_ssize_t[::1] cnt = counts
    cdef long long[:, ::1] out_order = order
    cdef long long[::1] out_kept = num_kept
    cdef float[:, :, ::1] out_voted = voted
    cdef float[:, ::1] out_scores = final_scores
    cdef float[:, ::1] f = floats
    cdef Py_ssize_t[::1] r = rows
    cdef unsigned char[::1] sel = selected
    cdef _KLWork work
    work.x1, work.y1, work.x2, work.y2 = &f[0, 0], &f[1, 0], &f[2, 0], &f[3, 0]
    work.area, work.score, work.iou, work.row = &f[4, 0], &f[5, 0], &f[6, 0], &r[0]
    cdef Py_ssize_t c
    with nogil:
        for c in range(num_sets):
            _kl_soft_one_set(b[c], t[c], cnt[c], &settings, &work, &sel[0], out_order[c],
                             &out_kept[c], out_voted[c], out_scores[c])
    if one_set:
        return order[0], int(num_kept[0]), voted[0], final_scores[0]
    return order, num_kept, voted, final_scores


cdef void _kl_soft_one_set(const float[:, ::1] boxes, const float[:, ::1] vote_terms,
                           Py_ssize_t n, const _KLSettings* settings, _KLWork* w,
                           unsigned char* selected, long long[::1] order, long long* num_kept,
                           float[:, ::1] voted, float[::1] final_scores) noexcept nogil:
    """KL-Loss's `soft` on the first n rows of one set; writes that set's outputs."""
    cdef Py_ssize_t width = final_scores.shape[0]
    cdef Py_ssize_t count = n, i, pos, best, k
    cdef float one = 1.0
    cdef double sums[8]
    for pos in range(n):
        w.x1[pos], w.y1[pos] = boxes[pos, 0], boxes[pos, 1]
        w.x2[pos], w.y2[pos] = boxes[pos, 2], boxes[pos, 3]
        w.area[pos] = (w.x2[pos] - w.x1[pos] + one) * (w.y2[pos] - w.y1[pos] + one)
        w.score[pos] = final_scores[pos]
        w.row[pos] = pos
    best = _kl_first_best(w, n)
    i = 0
    while i < n:
        _kl_swap(w, i, best)
        _kl_ious_with(w, i, n)
        for k in range(8):
            sums[k] = 0.0
        if settings.vote:
            _kl_add_vote(w, vote_terms, i, settings, sums)
        # One pass over the later live positions votes, rescores, drops, and finds the next best
        # box: a position is final once the scan moves past it, so the first strict maximum met
        # is the first best in position order. A box swapped in from the end is examined (and
        # votes) at the position it lands on; a dropped box has voted already.
        best = -1  # none yet
        pos = i + 1
        while pos < n:
            if settings.vote:
                _kl_add_vote(w, vote_terms, pos, settings, sums)
            if w.iou[pos] > 0:
                w.score[pos] = _kl_decayed(w.score[pos], w.iou[pos], settings)
                if w.score[pos] < _KL_DROP_SCORE:
                    # The last live box moves here and is examined at this same position.
                    n -= 1
                    _kl_swap(w, pos, n)
                    continue
            if best < 0 or w.score[pos] > w.score[best]:
                best = pos
            pos += 1
        for k in range(4):
            voted[i, k] = (<float>(sums[k] / sums[k + 4]) if settings.vote
                           else boxes[w.row[i], k])
        i += 1

    num_kept[0] = n
    for pos in range(count):
        final_scores[w.row[pos]] = w.score[pos]
    for pos in range(width):
        selected[pos] = 0
    for pos in range(n):
        order[pos] = w.row[pos]
        selected[w.row[pos]] = 1
    i = n
    for pos in range(width):
        if not selected[pos]:
            order[i] = pos
            for k in range(4):
                voted[i, k] = boxes[pos, k]
            i += 1


cdef inline void _kl_ious_with(_KLWork* w, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """IoUs of the box at position i with those at positions i.. n - 1, as box_iou_t computes them
    (float32, +1 sides, 0 without a positive intersection), from the original boxes.

    KL-Loss computes the whole matrix up front, but a pair is needed at most once (when the first
    of its boxes is selected, if the other is still live), so computing it then gives the same
    values for less work."""
    cdef Py_ssize_t pos
    cdef float one = 1.0, zero = 0.0
    cdef float ix1 = w.x1[i], iy1 = w.y1[i], ix2 = w.x2[i], iy2 = w.y2[i], iarea = w.area[i]
    cdef float iw, ih, inter, ratio
    cdef const float* x1 = w.x1
    cdef const float* y1 = w.y1
    cdef const float* x2 = w.x2
    cdef const float* y2 = w.y2
    cdef const float* area = w.area
    cdef float* iou = w.iou
    # Branch-free so that the compiler vectorizes it.
    for pos in range(i, n):
        iw = _min(ix2, x2[pos]) - _max(ix1, x1[pos]) + one
        ih = _min(iy2, y2[pos]) - _max(iy1, y1[pos]) + one
        inter = _max(iw, zero) * _max(ih, zero)
        ratio = inter / (iarea + area[pos] - inter)
        iou[pos] = ratio if inter > zero else zero


cdef inline Py_ssize_t _kl_first_best(_KLWork* w, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t best = 0, pos
    for pos in range(1, n):
        if w.score[pos] > w.score[best]:
            best = pos
    return best


cdef inline void _kl_add_vote(_KLWork* w, const float[:, ::1] vote_terms, Py_ssize_t pos,
                              const _KLSettings* settings, double* sums) noexcept nogil:
    """Adds the box at `pos` to the vote sums if its IoU with the selected box exceeds
    vote_thresh: weight * (box / sigma^2) to sums[0:4], weight / sigma^2 to sums[4:8]."""
    cdef double iou = w.iou[pos]
    cdef double gap, weight
    cdef Py_ssize_t k
    if iou > settings.vote_thresh:
        gap = 1.0 - iou
        weight = exp(-(gap * gap) / settings.iou_sigma)
        for k in range(8):
            sums[k] += weight * vote_terms[w.row[pos], k]


cdef inline float _kl_decayed(float score, float iou_f, const _KLSettings* settings) noexcept nogil:
    cdef double iou = iou_f
    if settings.hard:
        return 0.0 if iou > settings.hard_nms_thresh else score
    # float32 score times a float64 weight, stored as float32, as numpy does in KL-Loss.
    return <float>(<double>score * exp(-(iou * iou) / _KL_SOFT_NMS_SIGMA))


cdef inline void _kl_swap(_KLWork* w, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    if a == b:
        return
    _swap_float(w.x1, a, b)
    _swap_float(w.y1, a, b)
    _swap_float(w.x2, a, b)
    _swap_float(w.y2, a, b)
    _swap_float(w.area, a, b)
    _swap_float(w.score, a, b)
    _swap_float(w.iou, a, b)
    w.row[a], w.row[b] = w.row[b], w.row[a]


cdef inline void _swap_float(float* values, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    values[a], values[b] = values[b], values[a]
