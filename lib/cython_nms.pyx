# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Detectron's greedy NMS and soft-NMS kernels, and KL-Loss's soft-NMS with variance voting.

Boxes are float32 rows (x1, y1, x2, y2, score) with Detectron's "+1" side lengths. The arithmetic
of `nms` and `soft_nms` reproduces the generated C of Detectron's kernels: the "+ 1" terms are C
doubles, so box sides, areas and unions are formed in double and rounded to float32 where
Detectron stores them, while intersections, IoUs and scores stay float32.
`soft_nms_with_variance_voting` follows KL-Loss's numpy instead (every box op in float32).
"""
import numpy as np

from cython.parallel cimport parallel, threadid
from libc.math cimport exp
from libc.string cimport memcpy


cdef extern from *:
    """
    #if defined(_MSC_VER)
    #include <intrin.h>
    static inline int _lowest_set_bit(unsigned long long x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
    #else
    #define _lowest_set_bit(x) __builtin_ctzll(x)
    #endif
    """
    int _lowest_set_bit(unsigned long long x) noexcept nogil


cdef extern from *:
    """
    /* Shared state of the workers of soft_nms_with_variance_voting_grouped: acquire loads and
       release stores (a set's rows change hands with its claim), a compare-and-swap to claim. */
    #if defined(_MSC_VER)
    #include <intrin.h>
    static inline int _kl_load_int(const int* p) { int v = *(const volatile int*)p; _ReadWriteBarrier(); return v; }
    static inline void _kl_store_int(int* p, int v) { _ReadWriteBarrier(); *(volatile int*)p = v; }
    static inline Py_ssize_t _kl_load_size(const Py_ssize_t* p) { Py_ssize_t v = *(const volatile Py_ssize_t*)p; _ReadWriteBarrier(); return v; }
    static inline void _kl_store_size(Py_ssize_t* p, Py_ssize_t v) { _ReadWriteBarrier(); *(volatile Py_ssize_t*)p = v; }
    static inline float _kl_load_float(const float* p) { return *(const volatile float*)p; }
    static inline void _kl_store_float(float* p, float v) { *(volatile float*)p = v; }
    static inline int _kl_claim(int* p, int expected, int desired) {
        return _InterlockedCompareExchange((volatile long*)p, desired, expected) == expected; }
    #else
    #define _kl_load_int(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    #define _kl_store_int(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    #define _kl_load_size(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    #define _kl_store_size(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    static inline float _kl_load_float(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
    static inline void _kl_store_float(float* p, float v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }
    static inline int _kl_claim(int* p, int expected, int desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE); }
    #endif
    """
    int _kl_load_int(const int* p) noexcept nogil
    void _kl_store_int(int* p, int v) noexcept nogil
    Py_ssize_t _kl_load_size(const Py_ssize_t* p) noexcept nogil
    void _kl_store_size(Py_ssize_t* p, Py_ssize_t v) noexcept nogil
    float _kl_load_float(const float* p) noexcept nogil
    void _kl_store_float(float* p, float v) noexcept nogil
    bint _kl_claim(int* p, int expected, int desired) noexcept nogil


cdef extern from *:
    """
    /* One row of greedy NMS in visiting order: every box from `start` on whose IoU with box
       (ix1, iy1, ix2, iy2) of area iarea is >= thresh gets its flag set. Branch-free over
       contiguous float32 columns, so the compiler vectorizes it; min / max are the kernels' own
       selects (_min / _max). */
    static void _nms_suppress_row(const float* __restrict x1, const float* __restrict y1,
                                  const float* __restrict x2, const float* __restrict y2,
                                  const float* __restrict area, int* __restrict suppressed,
                                  Py_ssize_t start, Py_ssize_t n, float ix1, float iy1, float ix2,
                                  float iy2, float iarea, float thresh) {
        for (Py_ssize_t j = start; j < n; ++j) {
            float left = ix1 >= x1[j] ? ix1 : x1[j], right = ix2 <= x2[j] ? ix2 : x2[j];
            float top = iy1 >= y1[j] ? iy1 : y1[j], bottom = iy2 <= y2[j] ? iy2 : y2[j];
            float w = right - left + 1.0f, h = bottom - top + 1.0f;
            w = 0.0f >= w ? 0.0f : w;
            h = 0.0f >= h ? 0.0f : h;
            float inter = w * h;
            suppressed[j] |= inter / (iarea + area[j] - inter) >= thresh;
        }
    }

    /* The vote sums of `count` rows, added in order from 0: weights[v] * terms[8 * rows[v] + k]
       to sums[k] (each row's terms: box / sigma^2, then 1 / sigma^2), held in registers. */
    static void _kl_vote_sums(const float* __restrict terms, const Py_ssize_t* __restrict rows,
                              const double* __restrict weights, Py_ssize_t count, double* sums) {
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0;
        for (Py_ssize_t v = 0; v < count; ++v) {
            const float* t = terms + 8 * rows[v];
            double weight = weights[v];
            s0 += weight * t[0]; s1 += weight * t[1]; s2 += weight * t[2]; s3 += weight * t[3];
            s4 += weight * t[4]; s5 += weight * t[5]; s6 += weight * t[6]; s7 += weight * t[7];
        }
        sums[0] = s0; sums[1] = s1; sums[2] = s2; sums[3] = s3;
        sums[4] = s4; sums[5] = s5; sums[6] = s6; sums[7] = s7;
    }

    /* The IoU of box (ix1, iy1, ix2, iy2) of area iarea with every box from `start` on, as _kl_iou
       computes it (0 without a positive intersection), and whether they intersect. Sides of the
       form d + 1 are 0 or at least 2^-25, so their product is positive exactly when both are. */
    static void _kl_iou_row(const float* __restrict x1, const float* __restrict y1,
                            const float* __restrict x2, const float* __restrict y2,
                            const float* __restrict area, float* __restrict ious,
                            unsigned char* __restrict flags, Py_ssize_t start, Py_ssize_t n, float ix1,
                            float iy1, float ix2, float iy2, float iarea) {
        for (Py_ssize_t j = start; j < n; ++j) {
            float left = ix1 >= x1[j] ? ix1 : x1[j], right = ix2 <= x2[j] ? ix2 : x2[j];
            float top = iy1 >= y1[j] ? iy1 : y1[j], bottom = iy2 <= y2[j] ? iy2 : y2[j];
            float w = right - left + 1.0f, h = bottom - top + 1.0f;
            float inter = (w >= 0.0f ? w : 0.0f) * (h >= 0.0f ? h : 0.0f);
            float ratio = inter / (iarea + area[j] - inter);
            ious[j] = inter > 0.0f ? ratio : 0.0f;
            flags[j] = (w > 0.0f) & (h > 0.0f);
        }
    }
    """
    void _kl_vote_sums(const float* terms, const Py_ssize_t* rows, const double* weights, Py_ssize_t count,
                       double* sums) noexcept nogil
    void _kl_iou_row(const float* x1, const float* y1, const float* x2, const float* y2, const float* area,
                     float* ious, unsigned char* flags, Py_ssize_t start, Py_ssize_t n, float ix1,
                     float iy1, float ix2, float iy2, float iarea) noexcept nogil
    void _nms_suppress_row(const float* x1, const float* y1, const float* x2, const float* y2,
                           const float* area, int* suppressed, Py_ssize_t start, Py_ssize_t n,
                           float ix1, float iy1, float ix2, float iy2, float iarea, float thresh) noexcept nogil

cdef extern from *:
    """
    #include <math.h>
    /* glibc's exp (x86-64) is a wrapper that calls __exp_finite, resolved to the CPU's variant,
       and only sets errno on overflow and underflow: calling __exp_finite directly returns the same
       values (equal on 10^8 inputs over [-700, 700]) for 17% less time in the voting kernel. */
    #if defined(__GLIBC__) && defined(__x86_64__)
    double _kl_exp_finite(double);
    __asm__(".symver _kl_exp_finite, __exp_finite@GLIBC_2.15");
    #define _kl_exp _kl_exp_finite
    #else
    #define _kl_exp exp
    #endif
    """
    double _kl_exp(double x) noexcept nogil


cdef extern from *:
    """
    #ifdef _OPENMP
    #define _NMS_OPENMP 1
    #else
    #define _NMS_OPENMP 0
    #endif
    """
    int _NMS_OPENMP

SOFT_NMS_METHODS = {'hard': 0, 'linear': 1, 'gaussian': 2}
# Whether the module was built with OpenMP (setup.py probes the compiler): without it the
# variance-voting kernels step on one thread.
OPENMP = bool(_NMS_OPENMP)


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
    areas = (dets[:, 2] - dets[:, 0] + 1) * (dets[:, 3] - dets[:, 1] + 1)
    order = dets[:, 4].argsort()[::-1]
    # The boxes copied in visiting order: the inner loop then reads contiguous memory without
    # branches (every later box is tested, a suppressed one again to no effect), which the compiler
    # vectorizes; the kept set is the same.
    sorted_boxes = np.ascontiguousarray(np.concatenate([dets[order, :4], areas[order, None]], axis=1).T)
    cdef const float[::1] x1 = sorted_boxes[0]
    cdef const float[::1] y1 = sorted_boxes[1]
    cdef const float[::1] x2 = sorted_boxes[2]
    cdef const float[::1] y2 = sorted_boxes[3]
    cdef const float[::1] area = sorted_boxes[4]
    cdef Py_ssize_t n = dets.shape[0]
    suppressed_arr = np.zeros(n, dtype=np.int32)  # as wide as the floats, for the vectorizer
    cdef int[::1] suppressed = suppressed_arr
    cdef Py_ssize_t oi
    with nogil:
        for oi in range(n):
            if not suppressed[oi]:
                # Detectron adds a C double 1.0 to each side and rounds it to float32: that double
                # sum of a float32 and 1 is exact, so the float32 sum there rounds to the same value.
                _nms_suppress_row(&x1[0], &y1[0], &x2[0], &y2[0], &area[0], &suppressed[0], oi + 1, n,
                                  x1[oi], y1[oi], x2[oi], y2[oi], area[oi], thresh)
    kept = np.ones(n, dtype=bool)
    kept[order] = suppressed_arr == 0
    return np.flatnonzero(kept)


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
    # A negative vote threshold lets boxes of IoU 0 vote: then every live box is examined.
    bint examine_all


cdef struct _KLWork:
    # A box set's state by current position, swapped like the rows of KL-Loss's arrays, and each
    # input row's vote terms (8 per row).
    float* x1
    float* y1
    float* x2
    float* y2
    float* area
    float* score
    Py_ssize_t* row
    float* terms
    # Scratch of one step: the IoU with the selected box by position, the positions it examines
    # and their IoUs, vote weights and decays; the kept rows.
    Py_ssize_t* examined
    unsigned char* flags
    float* position_ious
    float* ious
    double* weights
    double* decays
    # The rows that vote in a step and their weights, in the order they are added.
    Py_ssize_t* vote_rows
    double* vote_weights
    unsigned char* selected


cdef struct _KLSet:
    Py_ssize_t count  # rows
    Py_ssize_t n  # live boxes
    Py_ssize_t i  # boxes selected
    Py_ssize_t best  # position of the next selection


cdef _KLSettings _kl_settings(double vote_thresh, double iou_sigma, bint vote, hard_nms_thresh):
    cdef _KLSettings settings
    settings.vote_thresh = vote_thresh
    settings.iou_sigma = iou_sigma
    settings.vote = vote
    settings.hard = hard_nms_thresh is not None
    settings.hard_nms_thresh = hard_nms_thresh if settings.hard else 0.0
    settings.examine_all = vote and vote_thresh < 0
    return settings


cdef class _KLBuffers:
    """The arrays behind a _KLWork: state for `total` rows, and for each of `workers` (1 or 2)
    scratch for sets of up to `width` (work[k] shares the state, with worker k's scratch)."""
    cdef object floats, indices, terms_arr, flags_arr, ious_arr, doubles, selected_arr
    cdef _KLWork work[2]

    def __cinit__(self, Py_ssize_t total, Py_ssize_t width, Py_ssize_t workers=1):
        total, width = max(total, 1), max(width, 1)
        self.floats = np.empty((6, total), dtype=np.float32)
        self.indices = np.empty(total + 2 * workers * width, dtype=np.intp)
        self.terms_arr = np.empty((total, 8), dtype=np.float32)
        self.flags_arr = np.empty((workers, width + 8), dtype=np.uint8)
        self.ious_arr = np.empty((workers, 2, width), dtype=np.float32)
        self.doubles = np.empty((workers, 3, width), dtype=np.float64)
        self.selected_arr = np.empty(width, dtype=np.uint8)
        cdef float[:, ::1] f = self.floats
        cdef Py_ssize_t[::1] r = self.indices
        cdef float[:, ::1] t = self.terms_arr
        cdef unsigned char[:, ::1] fl = self.flags_arr
        cdef float[:, :, ::1] io = self.ious_arr
        cdef double[:, :, ::1] d = self.doubles
        cdef unsigned char[::1] s = self.selected_arr
        cdef Py_ssize_t k
        for k in range(workers):
            self.work[k].x1, self.work[k].y1, self.work[k].x2 = &f[0, 0], &f[1, 0], &f[2, 0]
            self.work[k].y2, self.work[k].area, self.work[k].score = &f[3, 0], &f[4, 0], &f[5, 0]
            self.work[k].row, self.work[k].terms = &r[0], &t[0, 0]
            self.work[k].examined, self.work[k].flags = &r[total + k * width], &fl[k, 0]
            self.work[k].position_ious, self.work[k].ious = &io[k, 0, 0], &io[k, 1, 0]
            self.work[k].weights, self.work[k].decays = &d[k, 0, 0], &d[k, 1, 0]
            self.work[k].vote_rows, self.work[k].vote_weights = &r[total + (workers + k) * width], &d[k, 2, 0]
            self.work[k].selected = &s[0]


cdef inline _KLWork _kl_rows_from(const _KLWork* w, Py_ssize_t first) noexcept nogil:
    """w with its state arrays starting at row `first` (a set stored after others)."""
    cdef _KLWork view = w[0]
    view.x1, view.y1, view.x2, view.y2 = w.x1 + first, w.y1 + first, w.x2 + first, w.y2 + first
    view.area, view.score, view.row = w.area + first, w.score + first, w.row + first
    view.terms = w.terms + 8 * first
    return view


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

    cdef _KLSettings settings = _kl_settings(vote_thresh, iou_sigma, vote, hard_nms_thresh)
    order = np.empty((num_sets, width), dtype=np.int64)
    num_kept = np.zeros(num_sets, dtype=np.int64)
    voted = np.empty((num_sets, width, 4), dtype=np.float32)
    final_scores = scores.copy()
    cdef _KLBuffers buffers = _KLBuffers(width, width)

    cdef const float[:, :, ::1] b = boxes
    cdef const float[:, :, ::1] sg = sigmas
    cdef const Py_ssize_t[::1] cnt = counts
    cdef long long[:, ::1] out_order = order
    cdef long long[::1] out_kept = num_kept
    cdef float[:, :, ::1] out_voted = voted
    cdef float[:, ::1] out_scores = final_scores
    cdef _KLSet kl_set
    cdef Py_ssize_t c
    if width > 0:
        with nogil:
            for c in range(num_sets):
                _kl_begin(&b[c, 0, 0], &sg[c, 0, 0], &out_scores[c, 0], cnt[c], &settings,
                          &buffers.work[0], &kl_set)
                while kl_set.i < kl_set.n:
                    _kl_step(&kl_set, &settings, &buffers.work[0], &out_voted[c, 0, 0])
                _kl_finish(&kl_set, &buffers.work[0], &b[c, 0, 0], width, &out_order[c, 0],
                           &out_voted[c, 0, 0], &out_scores[c, 0])
                out_kept[c] = kl_set.i
    if one_set:
        return order[0], int(num_kept[0]), voted[0], final_scores[0]
    return order, num_kept, voted, final_scores


def soft_nms_with_variance_voting_grouped(dets, sigmas, counts, double vote_thresh,
                                          double iou_sigma, bint vote=True, hard_nms_thresh=None,
                                          Py_ssize_t max_kept=0, int workers=1, bint kept_only=False,
                                          stats=None):
    """`soft_nms_with_variance_voting` on sets stored one after another, without padding.

    dets (A, 5) float32 (x1, y1, x2, y2, score) and sigmas (A, 4) matched to the box columns;
    set c is the next counts[c] rows. Returns `after` (A, 5) float32: each set's rows as KL-Loss's
    `soft` leaves them, its kept boxes in selection order (voted box, final score), then its
    other rows in increasing row order (original box, final score); and `kept` (A,) bool, true
    at the rows of `after` that are kept. The GIL is released while the sets are processed.

    With max_kept > 0 and finite scores, only the kept boxes that score at least as high as the
    max_kept-th best kept box of all sets are selected (Detectron's per-image limit,
    TEST.DETECTIONS_PER_IM, drops the others): a set is stepped only while its next selection
    scores at least as high as the max_kept-th best selection made so far, the best-scoring set
    first (a set's selected scores never increase). Each set's selections are those of a full
    run, in the same order, with the same boxes and scores; its rows of `after` not kept then hold
    the boxes left unselected, with their scores where its stepping stopped.

    workers=2 steps the sets on 2 OpenMP threads (those of torch's intra-op pool where the module
    is built with OpenMP), each taking the best-scoring set that the other is not stepping, when
    two sets have at least 512 rows: the same selections are kept (the rows not kept may then
    have been stepped further). A list given as `stats` gets the number of selections each
    worker made.

    kept_only=True returns the kept rows alone, as `after[kept]` would list them (K, 5), and the
    set of each (K,) int64, without the rest of `after`.
    """
    dets = np.asarray(dets, dtype=np.float32)
    counts = np.ascontiguousarray(np.reshape(counts, -1), dtype=np.intp)
    cdef Py_ssize_t total = dets.shape[0] if dets.ndim == 2 else -1
    if dets.shape != (total, 5) or np.shape(sigmas) != (total, 4):
        raise ValueError(f'dets must have shape (A, 5) and sigmas (A, 4), got {dets.shape} and '
                         f'{np.shape(sigmas)}')
    if np.any(counts < 0) or counts.sum() != total:
        raise ValueError(f'counts must be at least 0 and add up to the {total} rows, got {counts}')
    boxes = np.ascontiguousarray(dets[:, :4])
    scores = np.ascontiguousarray(dets[:, 4])
    sigmas = np.ascontiguousarray(sigmas, dtype=np.float32)
    if not np.isfinite(scores).all():
        max_kept = 0  # selected scores may then increase: run every set to its end
    workers = 2 if workers > 1 and np.count_nonzero(counts >= _KL_SECOND_WORKER_MIN_ROWS) > 1 else 1

    voted = np.empty((total, 4), dtype=np.float32)
    cdef Py_ssize_t num_sets = len(counts)
    firsts = np.ascontiguousarray(np.cumsum(counts) - counts, dtype=np.intp)
    cdef _KLPool pool = _KLPool(firsts, counts, voted, max_kept, workers)
    pool.shared.settings = _kl_settings(vote_thresh, iou_sigma, vote, hard_nms_thresh)

    cdef const float[:, ::1] b = boxes
    cdef const float[:, ::1] sg = sigmas
    cdef const float[::1] sc = scores
    cdef const Py_ssize_t[::1] first = firsts
    cdef const Py_ssize_t[::1] cnt = counts
    cdef _KLShared* shared = &pool.shared
    cdef _KLSet* sets = shared.sets
    cdef _KLWork view
    cdef Py_ssize_t c
    cdef float threshold
    with nogil:
        for c in range(num_sets):
            view = _kl_rows_from(&pool.buffers.work[0], first[c])
            _kl_begin(&b[first[c], 0], &sg[first[c], 0], &sc[first[c]], cnt[c], &shared.settings,
                      &view, &sets[c])
            shared.tops[c] = view.score[sets[c].best] if sets[c].i < sets[c].n else 0
            shared.claims[c] = _KL_FREE if sets[c].i < sets[c].n else _KL_DONE
    with nogil, parallel(num_threads=workers):
        _kl_work(shared, &pool.buffers.work[threadid()], threadid())
    threshold = pool.kept_threshold()
    if stats is not None:
        stats.extend(pool.picked_count_arr.tolist())
    with nogil:
        for c in range(num_sets):
            view = _kl_rows_from(&pool.buffers.work[0], first[c])
            # Selections below the max_kept-th best, made before that was known (by another
            # worker), are not kept: they end the set's selections, in decreasing order.
            while sets[c].i > 0 and view.score[sets[c].i - 1] < threshold:
                sets[c].i -= 1
    if kept_only:
        return _kl_kept_rows(pool)
    return _kl_after(pool, boxes)


cdef tuple _kl_kept_rows(_KLPool pool):
    """The kept rows of the stepped sets of `pool` (voted box, final score) and their sets."""
    cdef _KLShared* shared = &pool.shared
    cdef Py_ssize_t c, pos, k, out = 0
    cdef Py_ssize_t num_kept = sum([shared.sets[c].i for c in range(shared.num_sets)])
    kept_dets = np.empty((num_kept, 5), dtype=np.float32)
    kept_sets = np.empty(num_kept, dtype=np.int64)
    cdef float[:, ::1] out_dets = kept_dets
    cdef long long[::1] out_sets = kept_sets
    cdef const float[:, ::1] in_voted = pool.voted
    cdef _KLWork view
    with nogil:
        for c in range(shared.num_sets):
            view = _kl_rows_from(&pool.buffers.work[0], shared.first[c])
            for pos in range(shared.sets[c].i):
                for k in range(4):
                    out_dets[out, k] = in_voted[shared.first[c] + pos, k]
                out_dets[out, 4] = view.score[pos]
                out_sets[out] = c
                out += 1
    return kept_dets, kept_sets


cdef tuple _kl_after(_KLPool pool, boxes):
    """`after` and `kept` of `soft_nms_with_variance_voting_grouped` for the stepped sets of pool."""
    cdef _KLShared* shared = &pool.shared
    cdef Py_ssize_t total = len(pool.voted), c, pos, k, start
    order = np.empty(total, dtype=np.int64)
    final_scores = np.empty(total, dtype=np.float32)
    after = np.empty((total, 5), dtype=np.float32)
    kept = np.empty(total, dtype=np.bool_)
    cdef const float[:, ::1] b = boxes
    cdef long long[::1] out_order = order
    cdef float[:, ::1] out_voted = pool.voted
    cdef float[::1] out_scores = final_scores
    cdef float[:, ::1] out_after = after
    cdef unsigned char[::1] out_kept = kept.view(np.uint8)
    cdef _KLSet* sets = shared.sets
    cdef _KLWork view
    with nogil:
        for c in range(shared.num_sets):
            start = shared.first[c]
            view = _kl_rows_from(&pool.buffers.work[0], start)
            _kl_finish(&sets[c], &view, &b[start, 0], sets[c].count, &out_order[start],
                       &out_voted[start, 0], &out_scores[start])
            for pos in range(sets[c].count):
                for k in range(4):
                    out_after[start + pos, k] = out_voted[start + pos, k]
                out_after[start + pos, 4] = out_scores[start + out_order[start + pos]]
                out_kept[start + pos] = pos < sets[c].i
    return after, kept


# A second worker steps sets only where two sets have this many rows: smaller steps take a few
# microseconds, what starting a sleeping thread can take (BENCHMARKS.md "Variance voting").
cdef Py_ssize_t _KL_SECOND_WORKER_MIN_ROWS = 512

# A set's claim: free to step, being stepped by a worker, or done.
cdef enum:
    _KL_FREE = 0
    _KL_CLAIMED = 1
    _KL_DONE = 2


cdef struct _KLShared:
    # What the workers of `soft_nms_with_variance_voting_grouped` share: the sets (state rows from
    # first[c], voted boxes at voted + 4 * first[c]) and the settings.
    _KLSettings settings
    _KLSet* sets
    Py_ssize_t num_sets
    const Py_ssize_t* first
    float* voted
    Py_ssize_t max_kept
    # Per set: its claim, and the score of its next selection (published with a free claim).
    int* claims
    float* tops
    # Per worker: the scores of its selections (picked + worker * stride), and how many.
    float* picked
    Py_ssize_t stride
    Py_ssize_t* picked_count
    int workers


cdef class _KLPool:
    """A _KLShared and the arrays behind it, for `workers` workers (1 or 2); its settings are set
    after construction."""
    cdef _KLShared shared
    cdef _KLBuffers buffers
    cdef object sets_arr, firsts, voted, claims_arr, tops_arr, picked_arr, picked_count_arr

    def __cinit__(self, firsts, counts, voted, Py_ssize_t max_kept, int workers):
        cdef Py_ssize_t num_sets = len(counts), total = int(counts.sum())
        self.buffers = _KLBuffers(total, counts.max() if num_sets else 0, workers)
        self.sets_arr = np.empty(max(num_sets, 1) * sizeof(_KLSet), dtype=np.uint8)
        self.claims_arr = np.full(max(num_sets, 1), _KL_DONE, dtype=np.intc)
        self.tops_arr = np.zeros(max(num_sets, 1), dtype=np.float32)
        self.picked_arr = np.empty((workers, max(total, 1)), dtype=np.float32)
        self.picked_count_arr = np.zeros(workers, dtype=np.intp)
        self.firsts, self.voted = firsts, voted
        cdef unsigned char[::1] set_bytes = self.sets_arr
        cdef const Py_ssize_t[::1] first = firsts
        cdef float[:, ::1] out_voted = voted
        cdef int[::1] claims = self.claims_arr
        cdef float[::1] tops = self.tops_arr
        cdef float[:, ::1] picked = self.picked_arr
        cdef Py_ssize_t[::1] picked_count = self.picked_count_arr
        self.shared.sets = <_KLSet*> &set_bytes[0]
        self.shared.num_sets = num_sets
        self.shared.first = &first[0] if num_sets else NULL
        self.shared.voted = &out_voted[0, 0] if total else NULL
        self.shared.max_kept = max_kept
        self.shared.claims, self.shared.tops = &claims[0], &tops[0]
        self.shared.picked, self.shared.stride = &picked[0, 0], picked.shape[1]
        self.shared.picked_count = &picked_count[0]
        self.shared.workers = workers

    def kept_threshold(self):
        """The max_kept-th best score selected by the workers (-inf without a limit or with fewer)."""
        made = np.concatenate([self.picked_arr[k, :n] for k, n in enumerate(self.picked_count_arr)])
        if self.shared.max_kept <= 0 or len(made) < self.shared.max_kept:
            return -np.inf
        return float(np.partition(made, len(made) - self.shared.max_kept)[len(made) - self.shared.max_kept])


cdef void _kl_work(_KLShared* p, const _KLWork* w, int worker) noexcept nogil:
    """A worker's loop: claims the free set whose next selection scores highest and steps it
    once, until no set is free. With max_kept > 0 a set is done once max_kept selections made by
    the workers score above its next one: that selection and the set's later ones (which score
    no higher) fall below the max_kept-th best."""
    cdef Py_ssize_t c, start
    cdef float top
    cdef _KLSet* kl_set
    cdef _KLWork view
    while True:
        c = _kl_claim_best(p)
        if c < 0:
            return
        kl_set, start = &p.sets[c], p.first[c]
        top = w.score[start + kl_set.best]
        if p.max_kept > 0 and _kl_count_above(p, top) >= p.max_kept:
            _kl_store_int(&p.claims[c], _KL_DONE)
            continue
        view = _kl_rows_from(w, start)
        _kl_step(kl_set, &p.settings, &view, p.voted + 4 * start)
        p.picked[worker * p.stride + p.picked_count[worker]] = top
        _kl_store_size(&p.picked_count[worker], p.picked_count[worker] + 1)
        if kl_set.i >= kl_set.n:
            _kl_store_int(&p.claims[c], _KL_DONE)
        else:
            _kl_store_float(&p.tops[c], view.score[kl_set.best])
            _kl_store_int(&p.claims[c], _KL_FREE)


cdef inline Py_ssize_t _kl_claim_best(_KLShared* p) noexcept nogil:
    """Claims the free set whose next selection scores highest (the lowest index of equals);
    -1 if no set is free."""
    cdef Py_ssize_t c, best_set
    cdef float score, top = 0
    while True:
        best_set = -1
        for c in range(p.num_sets):
            if _kl_load_int(&p.claims[c]) == _KL_FREE:
                score = _kl_load_float(&p.tops[c])
                if best_set < 0 or score > top:
                    best_set, top = c, score
        if best_set < 0 or _kl_claim(&p.claims[best_set], _KL_FREE, _KL_CLAIMED):
            return best_set


cdef inline Py_ssize_t _kl_count_above(const _KLShared* p, float top) noexcept nogil:
    """How many selections made so far score above `top`, counted up to max_kept."""
    cdef Py_ssize_t worker, j, made, above = 0
    cdef const float* picked
    for worker in range(p.workers):
        made = _kl_load_size(&p.picked_count[worker])
        picked = p.picked + worker * p.stride
        for j in range(made):
            above += picked[j] > top
        if above >= p.max_kept:
            break
    return above


cdef void _kl_begin(const float* boxes, const float* sigmas, const float* scores, Py_ssize_t count,
                    const _KLSettings* settings, _KLWork* w, _KLSet* kl_set) noexcept nogil:
    """Starts KL-Loss's `soft` on the `count` rows boxes (count, 4), sigmas (count, 4), scores
    (count,): loads them into w and finds the first selection."""
    _kl_load(boxes, sigmas, scores, count, settings, w)
    kl_set.count, kl_set.n, kl_set.i = count, count, 0
    kl_set.best = _kl_first_best(w.score, 0, count)


cdef void _kl_step(_KLSet* kl_set, const _KLSettings* settings, _KLWork* w,
                   float* voted) noexcept nogil:
    """One step of `soft` (kl_set.i < kl_set.n): the next selection takes position i, gets its
    voted box (voted[i]), rescores and drops the later live boxes; the one after is found.

    A step computes only what it changes: boxes that do not intersect the selected one (IoU 0)
    neither vote nor decay, so it lists those that do (all with a negative vote threshold),
    computes their IoUs, vote weights and decays, then applies them in KL-Loss's order: a box
    dropped at a position is replaced by the last live one, which is examined there if it is
    listed. The next selection is then the first highest score among the later live positions."""
    cdef Py_ssize_t i = kl_set.i, n = kl_set.n, pos, k, entry, next_entry, end, votes = 0
    cdef double sums[8]
    _kl_swap(w, i, kl_set.best)
    if settings.vote:
        votes = _kl_self_vote(w, i, settings)
    end = _kl_intersecting(w, i, n, settings.examine_all)
    _kl_pair_terms(w, i, end, settings)
    next_entry = 0
    while next_entry < end:
        entry = next_entry
        next_entry += 1
        pos = w.examined[entry]
        while _kl_apply_dropped(w, entry, pos, settings, &votes):
            n -= 1
            if n == pos:
                break
            _kl_swap(w, pos, n)
            # The box moved here is examined now if it is listed: it was the last position still
            # to examine.
            if end > next_entry and w.examined[end - 1] == n:
                end -= 1
                entry = end
            else:
                break
    if settings.vote:
        _kl_vote_sums(w.terms, w.vote_rows, w.vote_weights, votes, sums)
        for k in range(4):
            voted[4 * i + k] = <float>(sums[k] / sums[k + 4])
    else:
        voted[4 * i], voted[4 * i + 1], voted[4 * i + 2], voted[4 * i + 3] = w.x1[i], w.y1[i], w.x2[i], w.y2[i]
    kl_set.n, kl_set.i = n, i + 1
    kl_set.best = _kl_first_best(w.score, i + 1, n)


cdef void _kl_finish(const _KLSet* kl_set, _KLWork* w, const float* boxes, Py_ssize_t width,
                     long long* order, float* voted, float* final_scores) noexcept nogil:
    """A set's outputs once its steps are done: order (width,) (the kl_set.i selected rows, then
    the other rows in increasing order), voted (width, 4) beyond the selected ones (the original
    boxes) and the scores of its kl_set.count rows, by row."""
    cdef Py_ssize_t pos, k, kept = kl_set.i, out
    for pos in range(kl_set.count):
        final_scores[w.row[pos]] = w.score[pos]
    for pos in range(width):
        w.selected[pos] = 0
    for pos in range(kept):
        order[pos] = w.row[pos]
        w.selected[w.row[pos]] = 1
    out = kept
    for pos in range(width):
        if not w.selected[pos]:
            order[out] = pos
            for k in range(4):
                voted[4 * out + k] = boxes[4 * pos + k]
            out += 1


cdef inline void _kl_load(const float* boxes, const float* sigmas, const float* scores, Py_ssize_t n,
                          const _KLSettings* settings, _KLWork* w) noexcept nogil:
    """The work arrays of rows 0..n-1 at their input positions, and with voting their float32
    vote terms box / sigma^2 and 1 / sigma^2, as KL-Loss's numpy computes them."""
    cdef Py_ssize_t pos, k
    cdef float one = 1.0, variance
    for pos in range(n):
        w.x1[pos], w.y1[pos] = boxes[4 * pos], boxes[4 * pos + 1]
        w.x2[pos], w.y2[pos] = boxes[4 * pos + 2], boxes[4 * pos + 3]
        w.area[pos] = (w.x2[pos] - w.x1[pos] + one) * (w.y2[pos] - w.y1[pos] + one)
        w.score[pos] = scores[pos]
        w.row[pos] = pos
    if settings.vote:
        for pos in range(n):
            for k in range(4):
                variance = sigmas[4 * pos + k] * sigmas[4 * pos + k]
                w.terms[8 * pos + k] = boxes[4 * pos + k] / variance
                w.terms[8 * pos + 4 + k] = one / variance


cdef inline float _kl_iou(_KLWork* w, Py_ssize_t i, Py_ssize_t pos) noexcept nogil:
    """IoU of the boxes at positions i and pos as box_iou_t computes it (float32, +1 sides, 0
    without a positive intersection), from the original boxes."""
    cdef float one = 1.0, zero = 0.0
    cdef float iw = _min(w.x2[i], w.x2[pos]) - _max(w.x1[i], w.x1[pos]) + one
    cdef float ih = _min(w.y2[i], w.y2[pos]) - _max(w.y1[i], w.y1[pos]) + one
    cdef float inter = _max(iw, zero) * _max(ih, zero)
    cdef float ratio = inter / (w.area[i] + w.area[pos] - inter)
    return ratio if inter > zero else zero


cdef inline Py_ssize_t _kl_intersecting(_KLWork* w, Py_ssize_t i, Py_ssize_t n,
                                        bint examine_all) noexcept nogil:
    """Lists in w.examined, in increasing order, the positions i+1..n-1 whose box intersects the
    one at i (the intersection _kl_iou tests), or all of them; returns how many. Their IoUs with
    the box at i (_kl_iou's) are left in w.position_ious by position."""
    cdef Py_ssize_t pos, found = 0, first = i + 1
    cdef float ix1 = w.x1[i], iy1 = w.y1[i], ix2 = w.x2[i], iy2 = w.y2[i], iarea = w.area[i]
    cdef const float* x1 = w.x1
    cdef const float* y1 = w.y1
    cdef const float* x2 = w.x2
    cdef const float* y2 = w.y2
    cdef const float* area = w.area
    cdef float* ious = w.position_ious
    cdef unsigned char* flags = w.flags
    cdef unsigned long long word
    cdef Py_ssize_t* examined = w.examined
    # The IoUs and intersection flags in a branch-free, vectorized pass (most boxes do not
    # intersect, in no predictable pattern), then the set flags read 8 at a time.
    _kl_iou_row(x1, y1, x2, y2, area, ious, flags, first, n, ix1, iy1, ix2, iy2, iarea)
    if examine_all:
        for pos in range(first, n):
            examined[pos - first] = pos
        return n - first
    for pos in range(n, n + 8):
        flags[pos] = 0
    pos = first
    while pos < n:
        memcpy(&word, flags + pos, 8)
        while word:
            examined[found] = pos + (_lowest_set_bit(word) >> 3)
            found += 1
            word &= word - 1
        pos += 8
    return found


cdef inline void _kl_pair_terms(_KLWork* w, Py_ssize_t i, Py_ssize_t end,
                                const _KLSettings* settings) noexcept nogil:
    """For the listed positions w.examined[:end]: IoU with the box at i (w.ious), vote weight
    exp(-(1 - IoU)^2 / iou_sigma) where it votes (w.weights) and soft decay exp(-IoU^2 / 0.5)
    where it is rescored (w.decays). Independent of one another, so computed in one pass."""
    cdef Py_ssize_t entry
    cdef float iou_f
    cdef double iou, gap
    for entry in range(end):
        iou_f = w.position_ious[w.examined[entry]]
        w.ious[entry] = iou_f
        iou = iou_f
        if settings.vote and iou > settings.vote_thresh:
            gap = 1.0 - iou
            w.weights[entry] = _kl_exp(-(gap * gap) / settings.iou_sigma)
        if not settings.hard and iou_f > 0:
            w.decays[entry] = _kl_exp(-(iou * iou) / _KL_SOFT_NMS_SIGMA)


cdef inline bint _kl_apply_dropped(_KLWork* w, Py_ssize_t entry, Py_ssize_t pos,
                                   const _KLSettings* settings, Py_ssize_t* votes) noexcept nogil:
    """The box at `pos`, listed at `entry`, votes if its IoU exceeds vote_thresh (its row and
    weight are listed after the `votes` before it) and, if positive, is rescored; returns whether
    it falls below the drop score."""
    cdef float iou = w.ious[entry]
    if settings.vote and <double>iou > settings.vote_thresh:
        w.vote_rows[votes[0]], w.vote_weights[votes[0]] = w.row[pos], w.weights[entry]
        votes[0] += 1
    if iou > 0:
        if settings.hard:
            if <double>iou > settings.hard_nms_thresh:
                w.score[pos] = 0.0
        else:
            # float32 score times a float64 weight, stored as float32, as numpy does in KL-Loss.
            w.score[pos] = <float>(<double>w.score[pos] * w.decays[entry])
        return w.score[pos] < _KL_DROP_SCORE
    return False


cdef inline Py_ssize_t _kl_self_vote(_KLWork* w, Py_ssize_t i, const _KLSettings* settings) noexcept nogil:
    """Lists the selected box at `i` as the step's first vote if its IoU with itself exceeds
    vote_thresh (KL-Loss sums it first); returns the votes listed, 0 or 1."""
    cdef double iou = _kl_iou(w, i, i)
    cdef double gap
    if not iou > settings.vote_thresh:
        return 0
    gap = 1.0 - iou
    w.vote_rows[0], w.vote_weights[0] = w.row[i], _kl_exp(-(gap * gap) / settings.iou_sigma)
    return 1


cdef inline Py_ssize_t _kl_first_best(const float* score, Py_ssize_t first, Py_ssize_t n) noexcept nogil:
    """The first position of the highest score among first..n-1 (`first` if its score is NaN):
    the first strict maximum of a scan, found by 4 interleaved scans whose dependency chains
    overlap, then merged (a tie goes to the lower position)."""
    cdef Py_ssize_t pos, lane
    cdef Py_ssize_t at[4]
    cdef float top[4]
    if first >= n:
        return first
    for lane in range(4):
        at[lane], top[lane] = first, score[first]
    pos = first + 1
    while pos + 4 <= n:
        for lane in range(4):
            if score[pos + lane] > top[lane]:
                top[lane], at[lane] = score[pos + lane], pos + lane
        pos += 4
    while pos < n:
        if score[pos] > top[0]:
            top[0], at[0] = score[pos], pos
        pos += 1
    for lane in range(1, 4):
        if top[lane] > top[0] or (top[lane] == top[0] and at[lane] < at[0]):
            top[0], at[0] = top[lane], at[lane]
    return at[0]


cdef inline void _kl_swap(_KLWork* w, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    if a == b:
        return
    _swap_float(w.x1, a, b)
    _swap_float(w.y1, a, b)
    _swap_float(w.x2, a, b)
    _swap_float(w.y2, a, b)
    _swap_float(w.area, a, b)
    _swap_float(w.score, a, b)
    w.row[a], w.row[b] = w.row[b], w.row[a]


cdef inline void _swap_float(float* values, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    values[a], values[b] = values[b], values[a]
