"""Compiled NMS / soft-NMS kernels and their torch counterparts, against plain-Python transcriptions
of Detectron's kernels (detectron/utils/cython_nms.pyx) with the same float32/double steps."""
import math

import numpy as np
import pytest
import torch

from detectron.ops import nms as nms_ops
from detectron.utils import boxes as box_utils
from detectron.utils import cython_nms

F32 = np.float32
IOU_9x9_SHIFTED_BY_1 = 81.0 / 119.0  # [0,0,9,9] vs [1,1,10,10]: 9x9 overlap, two 10x10 boxes


def random_dets(rng, n, integer_coords=False, score_levels=None):
    xy = rng.uniform(0, 80, (n, 2))
    wh = rng.uniform(2, 50, (n, 2))
    if integer_coords:
        xy, wh = np.round(xy), np.round(wh)
    scores = rng.uniform(0, 1, (n, 1))
    if score_levels:
        scores = np.round(scores * score_levels) / score_levels
    return np.hstack([xy, xy + wh, scores]).astype(F32)


def greedy_nms_by_loops(dets, thresh):
    """Detectron's greedy NMS step by step in float32 scalars; survivors in ascending index order."""
    x1, y1, x2, y2, scores = (dets[:, c] for c in range(5))
    areas = (x2 - x1 + F32(1)) * (y2 - y1 + F32(1))
    order = scores.argsort()[::-1]
    suppressed = [False] * len(dets)
    for pos_i, i in enumerate(order):
        if suppressed[i]:
            continue
        for j in order[pos_i + 1:]:
            if suppressed[j]:
                continue
            w = max(F32(0), min(x2[i], x2[j]) - max(x1[i], x1[j]) + F32(1))
            h = max(F32(0), min(y2[i], y2[j]) - max(y1[i], y1[j]) + F32(1))
            inter = w * h
            if inter / (areas[i] + areas[j] - inter) >= F32(thresh):
                suppressed[j] = True
    return [k for k in range(len(dets)) if not suppressed[k]]


def soft_nms_by_loops(dets, sigma, nt, threshold, method):
    """Detectron's soft-NMS kernel transcribed: lists of float32 rows, doubles where its C has them."""
    rows = [[F32(v) for v in row] for row in dets]
    inds = list(range(len(rows)))
    sigma, nt, threshold = F32(sigma), F32(nt), F32(threshold)
    n, i = len(rows), 0
    while i < n:
        best = i
        for pos in range(i + 1, n):
            if rows[best][4] < rows[pos][4]:
                best = pos
        rows[i], rows[best] = rows[best], rows[i]
        inds[i], inds[best] = inds[best], inds[i]
        tx1, ty1, tx2, ty2 = rows[i][:4]
        pos = i + 1
        while pos < n:
            x1, y1, x2, y2, score = rows[pos]
            area = F32((float(x2 - x1) + 1.0) * (float(y2 - y1) + 1.0))
            iw = F32(float(min(tx2, x2) - max(tx1, x1)) + 1.0)
            if iw > 0:
                ih = F32(float(min(ty2, y2) - max(ty1, y1)) + 1.0)
                if ih > 0:
                    ua = F32((float(tx2 - tx1) + 1.0) * (float(ty2 - ty1) + 1.0)
                             + float(area) - float(iw * ih))
                    ov = (iw * ih) / ua
                    if method == 'gaussian':
                        weight = F32(math.exp(float(-(ov * ov) / sigma)))
                    elif ov > nt:
                        weight = F32(1.0 - float(ov)) if method == 'linear' else F32(0)
                    else:
                        weight = F32(1)
                    rows[pos][4] = weight * score
                    if rows[pos][4] < threshold:
                        rows[pos], inds[pos] = list(rows[n - 1]), inds[n - 1]
                        n -= 1
                        continue
            pos += 1
        i += 1
    return np.array(rows[:n], dtype=F32).reshape(-1, 5), np.array(inds[:n])


# --- greedy NMS ---------------------------------------------------------------------------------

def test_nms_suppresses_at_equal_iou_and_returns_ascending_indices():
    dets = np.array([[50, 50, 60, 60, 0.3],
                     [1, 1, 10, 10, 0.8],
                     [0, 0, 9, 9, 0.9]], dtype=F32)
    thresh = F32(IOU_9x9_SHIFTED_BY_1)  # the float32 IoU of boxes 1 and 2 equals it exactly
    np.testing.assert_array_equal(nms_ops.nms(dets, thresh), [0, 2])
    np.testing.assert_array_equal(nms_ops.nms(dets, np.nextafter(thresh, F32(1))), [0, 1, 2])


def test_nms_of_empty_input_is_empty_list():
    assert nms_ops.nms(np.zeros((0, 5), dtype=F32), 0.5) == []


@pytest.mark.parametrize('integer_coords, score_levels', [(False, None), (True, None), (True, 4)])
def test_nms_matches_loop_transcription(integer_coords, score_levels):
    rng = np.random.default_rng(7)
    for _ in range(20):
        dets = random_dets(rng, 40, integer_coords, score_levels)
        for thresh in (0.3, 0.5, 0.7):
            np.testing.assert_array_equal(cython_nms.nms(dets, thresh), greedy_nms_by_loops(dets, thresh))


@pytest.mark.parametrize('n', [203, 517])
def test_nms_of_long_rows_matches_loop_transcription(n):
    # The kernel tests a kept box against every later box in vectorized blocks plus a remainder:
    # rows of every length, many boxes kept (spread out) and many suppressed (clustered).
    rng = np.random.default_rng(n)
    dets = random_dets(rng, n, integer_coords=True, score_levels=50)
    dets[: n // 2, :4] *= 6
    for thresh in (0.3, 0.7):
        kept = cython_nms.nms(dets, thresh)
        assert list(kept) == greedy_nms_by_loops(dets, thresh)
        assert n // 4 < len(kept) < n


def test_nms_t_matches_cython_nms_without_ties():
    rng = np.random.default_rng(3)
    for _ in range(20):
        dets = random_dets(rng, 60)
        for thresh in (0.3, 0.5, 0.7):
            keep_t = nms_ops.nms_t(torch.from_numpy(dets[:, :4]), torch.from_numpy(dets[:, 4]), thresh)
            scores_kept = dets[keep_t.numpy(), 4]
            assert np.all(np.diff(scores_kept) <= 0), 'nms_t returns kept boxes best first'
            np.testing.assert_array_equal(np.sort(keep_t.numpy()), nms_ops.nms(dets, thresh))


@pytest.mark.parametrize('second_box, thresh', [
    ([1, 1, 10, 10], float(F32(IOU_9x9_SHIFTED_BY_1))),
    ([0, 0, 9, 19], 0.5),  # 100 / 200
    ([0, 0, 9, 2], 0.3),   # 30 / 100
    ([0, 0, 9, 6], 0.7),   # 70 / 100: float32 0.7 is below 0.7, like the float32 threshold
])
def test_nms_t_suppresses_at_exactly_thresh_like_detectron(second_box, thresh):
    dets = np.array([[0, 0, 9, 9, 0.9], second_box + [0.8]], dtype=F32)
    keep_t = nms_ops.nms_t(torch.from_numpy(dets[:, :4]), torch.from_numpy(dets[:, 4]), thresh)
    assert keep_t.tolist() == [0]
    assert nms_ops.nms(dets, thresh).tolist() == [0]


def test_torchvision_nms_thresh_is_the_float32_below_the_threshold():
    # Detectron's kernel takes thresh as float32 and compares float32 IoUs with >=.
    for thresh in (0.3, 0.5, 0.7):
        below = nms_ops.torchvision_nms_thresh(thresh)
        assert below < float(F32(thresh)) and F32(below) == np.nextafter(F32(thresh), F32(0))


@pytest.mark.parametrize('thresh', [0.3, 0.5, 0.7])
def test_nms_t_equals_cython_nms_with_integer_iou_ties(thresh):
    # Boxes 10 px wide at x 0..9 with integer rows: IoUs are ratios of row counts, often exactly
    # 3/10, 1/2 or 7/10.
    rng = np.random.default_rng(5)
    ties = 0
    for _ in range(30):
        y1 = rng.integers(0, 6, 30)
        y2 = y1 + rng.integers(0, 20, 30)
        dets = np.stack([np.zeros(30), y1, np.full(30, 9), y2, rng.permutation(30) / 30.0], 1).astype(F32)
        overlaps = box_utils.bbox_overlaps(dets[:, :4].astype(np.float64), dets[:, :4].astype(np.float64))
        ties += int(np.sum(overlaps == thresh))
        boxes, scores = torch.from_numpy(dets[:, :4]), torch.from_numpy(dets[:, 4])
        expected = nms_ops.nms(dets, thresh)
        np.testing.assert_array_equal(np.sort(nms_ops.nms_t(boxes, scores, thresh).numpy()), expected)
        one_group = torch.zeros(30, dtype=torch.long)
        np.testing.assert_array_equal(
            np.sort(nms_ops.batched_nms_t(boxes, scores, one_group, thresh).numpy()), expected)
        matrix = nms_ops.matrix_batched_nms_t(boxes, scores, one_group,
                                              nms_ops.torchvision_nms_thresh(thresh))
        np.testing.assert_array_equal(np.sort(matrix.numpy()), expected)
    assert ties > 0, 'the boxes must produce IoUs equal to the threshold'


def test_batched_nms_t_equals_per_class_cython_nms():
    rng = np.random.default_rng(11)
    dets = random_dets(rng, 90)
    classes = rng.integers(0, 3, 90)
    keep_t = nms_ops.batched_nms_t(torch.from_numpy(dets[:, :4]), torch.from_numpy(dets[:, 4]),
                                   torch.from_numpy(classes), 0.5)
    expected = np.concatenate([np.flatnonzero(classes == c)[nms_ops.nms(dets[classes == c], 0.5)]
                               for c in range(3)])
    np.testing.assert_array_equal(np.sort(keep_t.numpy()), np.sort(expected))


# --- soft-NMS -----------------------------------------------------------------------------------

def test_soft_nms_hand_values():
    dets = np.array([[1, 1, 10, 10, 0.8],
                     [0, 0, 9, 9, 0.9],
                     [40, 40, 49, 49, 0.5]], dtype=F32)
    iou = IOU_9x9_SHIFTED_BY_1
    for method, rescored in [('linear', 0.8 * (1 - iou)), ('gaussian', 0.8 * math.exp(-iou ** 2 / 0.5))]:
        out, keep = nms_ops.soft_nms(dets, sigma=0.5, overlap_thresh=0.3, method=method)
        np.testing.assert_array_equal(keep, [1, 2, 0])  # selection order: 0.9, then 0.5 > rescored
        np.testing.assert_allclose(out[:, 4], [0.9, 0.5, rescored], rtol=1e-6)
        np.testing.assert_array_equal(out[:, :4], dets[[1, 2, 0], :4])
    out, keep = nms_ops.soft_nms(dets, overlap_thresh=0.3, method='hard')
    np.testing.assert_array_equal(keep, [1, 2])  # score 0 < score_thresh: dropped
    # Linear re-weighting applies only above the overlap threshold.
    out, keep = nms_ops.soft_nms(dets, overlap_thresh=0.7, method='linear')
    np.testing.assert_allclose(out[:, 4], [0.9, 0.8, 0.5])


def test_soft_nms_drops_only_rescored_boxes_and_keeps_input():
    # Box 2 starts below score_thresh but overlaps nothing: it is never rescored, so it survives.
    dets = np.array([[0, 0, 9, 9, 0.9], [1, 1, 10, 10, 0.0015], [40, 40, 49, 49, 0.0005]], dtype=F32)
    original = dets.copy()
    out, keep = nms_ops.soft_nms(dets, overlap_thresh=0.3, score_thresh=0.001, method='linear')
    np.testing.assert_array_equal(keep, [0, 2])  # 0.0015 * (1 - 0.68) < 0.001: dropped
    np.testing.assert_array_equal(dets, original)


@pytest.mark.parametrize('method', ['hard', 'linear', 'gaussian'])
@pytest.mark.parametrize('integer_coords, score_levels', [(False, None), (True, 4)])
def test_soft_nms_matches_loop_transcription(method, integer_coords, score_levels):
    rng = np.random.default_rng(5)
    for _ in range(10):
        dets = random_dets(rng, 30, integer_coords, score_levels)
        for nt, score_thresh in [(0.3, 0.001), (0.5, 0.2)]:
            out, keep = nms_ops.soft_nms(dets, 0.5, nt, score_thresh, method)
            expected_out, expected_keep = soft_nms_by_loops(dets, 0.5, nt, score_thresh, method)
            np.testing.assert_array_equal(keep, expected_keep)
            np.testing.assert_array_equal(out, expected_out)


def test_soft_nms_rejects_unknown_method():
    with pytest.raises(ValueError, match='hard, linear, gaussian'):
        nms_ops.soft_nms(np.zeros((1, 5), dtype=F32), method='linaer')
    with pytest.raises(ValueError, match='method'):
        cython_nms.soft_nms(np.zeros((1, 5), dtype=F32), method=3)


def test_soft_nms_of_empty_input():
    dets = np.zeros((0, 5), dtype=F32)
    out, keep = nms_ops.soft_nms(dets)
    assert out.shape == (0, 5) and keep == []


@pytest.mark.parametrize('method', ['hard', 'linear', 'gaussian'])
def test_soft_nms_in_place_keeps_the_copy_results_in_its_live_rows(method):
    """soft_nms_ (CenterNet's in-place use of the one kernel): the first n rows are soft_nms's
    rescored dets, the input array itself is the one written."""
    rng = np.random.default_rng(11)
    for _ in range(10):
        dets = random_dets(rng, 30, False, None)
        out, _ = nms_ops.soft_nms(dets, 0.5, 0.3, 0.001, method)
        work = dets.copy()
        n = nms_ops.soft_nms_(work, 0.5, 0.3, 0.001, method)
        assert n == len(out)
        np.testing.assert_array_equal(work[:n], out)


def test_soft_nms_in_place_refuses_an_array_it_cannot_write_as_float32():
    for dets in (np.zeros((2, 5), dtype=np.float64), np.zeros((5, 2), dtype=F32).T, [[0, 0, 1, 1, 1.0]]):
        with pytest.raises(ValueError, match='in_place'):
            cython_nms.soft_nms(dets, method=2, in_place=True)
