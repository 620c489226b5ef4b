# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Detectron's greedy NMS and soft-NMS kernels.

Boxes are float32 rows (x1, y1, x2, y2, score) with Detectron's "+1" side lengths. The arithmetic
reproduces the generated C of Detectron's kernels: the "+ 1" terms are C doubles, so box sides,
areas and unions are formed in double and rounded to float32 where Detectron stores them, while
intersections, IoUs and scores stay float32.
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


def soft_nms(boxes_in, float sigma=0.5, float Nt=0.3, float threshold=0.001, unsigned int method=0):
    """Soft-NMS (Bodla et al. 2017) of boxes_in (N, 5) = (x1, y1, x2, y2, score).

    Works on a float32 copy, like Detectron's kernel: at step i the first highest-scored box among
    rows i..N-1 is swapped into row i; every later row whose box intersects it (positive +1 sides)
    has its score multiplied by a weight of the IoU `ov`:
    method 0 (hard) 0 if ov > Nt else 1; 1 (linear) 1 - ov if ov > Nt else 1;
    2 (gaussian) exp(-ov^2 / sigma). A rescored row whose score falls below `threshold` is
    replaced by the last live row and the live count N shrinks.
    Returns (boxes[:N], indices[:N]): rescored rows in selection order and their input indices.
    """
    if method > 2:
        raise ValueError(f'soft_nms method must be 0 (hard), 1 (linear) or 2 (gaussian), got {method}')
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
