# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Detectron's box IoU matrix kernel (+1 side lengths, float32 results)."""
import numpy as np


def bbox_overlaps(boxes, query_boxes):
    """IoU of every box in boxes (N, 4) with every box in query_boxes (K, 4) -> float32 (N, K).

    Inputs are converted to float32 (Detectron's kernel accepted only float32). Pairs without a
    positive +1 intersection width and height get 0. As in Detectron's generated C, areas and the
    union are formed in double and rounded to float32; the IoU quotient is float32.
    """
    cdef const float[:, ::1] b = np.ascontiguousarray(boxes, dtype=np.float32)
    cdef const float[:, ::1] q = np.ascontiguousarray(query_boxes, dtype=np.float32)
    overlaps_arr = np.zeros((b.shape[0], q.shape[0]), dtype=np.float32)
    cdef float[:, ::1] overlaps = overlaps_arr
    cdef Py_ssize_t n, k
    cdef float query_area, iw, ih, ua

    with nogil:
        for k in range(q.shape[0]):
            query_area = (q[k, 2] - q[k, 0] + 1.0) * (q[k, 3] - q[k, 1] + 1.0)
            for n in range(b.shape[0]):
                iw = min(b[n, 2], q[k, 2]) - max(b[n, 0], q[k, 0]) + 1.0
                if iw <= 0:
                    continue
                ih = min(b[n, 3], q[k, 3]) - max(b[n, 1], q[k, 1]) + 1.0
                if ih <= 0:
                    continue
                ua = (b[n, 2] - b[n, 0] + 1.0) * (b[n, 3] - b[n, 1] + 1.0) + query_area - iw * ih
                overlaps[n, k] = iw * ih / ua
    return overlaps_arr
