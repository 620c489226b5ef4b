"""CenterNet decoding, post-processing and the multi-scale merge.

Expected values are hand-computed (derivations in the comments) or come from plain loops written
from the reference's formulas (tests/support/centernet_reference.py transcribes CenterNet's per-point
post-processing, merge and soft-NMS, which the vectorised code must match bit for bit).
"""
import math

import numpy as np
import pytest
import torch

from detectron.modeling import centernet_decode
from detectron.roi_data.centernet import get_affine_transform
from detectron.utils import cython_nms
from support.centernet_reference import (assert_same_arrays, reference_cls_boxes, reference_merge,
                                         reference_post_process, reference_scale_detections, soft_nms_loop)


# ------------------------------------------------------------------------------------------------
# decode
# ------------------------------------------------------------------------------------------------

def test_transpose_and_gather_feat_reads_flat_positions():
    feat = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).view(2, 3, 4, 5)
    ind = torch.tensor([[0, 7, 19], [13, 13, 2]])
    out = centernet_decode.transpose_and_gather_feat(feat, ind)
    assert out.shape == (2, 3, 3)
    for b in range(2):
        for m in range(3):
            y, x = divmod(ind[b, m].item(), 5)
            torch.testing.assert_close(out[b, m], feat[b, :, y, x])


def _heat():
    heat = torch.zeros(2, 2, 4, 5)
    heat[0, 0, 1, 1] = 0.9
    heat[0, 0, 1, 2] = 0.8    # next to 0.9: suppressed by the 3x3 peak NMS
    heat[0, 0, 3, 4] = 0.7
    heat[0, 1, 0, 0] = 0.6    # plateau of two equal values: both survive
    heat[0, 1, 0, 1] = 0.6
    heat[0, 1, 2, 3] = 0.5
    heat[1] = heat[0].flip(0)  # image 2: classes swapped
    return heat


def test_decode_peaks_order_classes_and_boxes():
    heat = _heat()
    wh = torch.zeros(2, 2, 4, 5)
    wh[:, :, 1, 1] = torch.tensor([4.0, 2.0])
    reg = torch.zeros(2, 2, 4, 5)
    reg[:, :, 1, 1] = torch.tensor([0.25, 0.5])
    dets = centernet_decode.ctdet_decode(heat, wh, reg=reg, K=5)
    assert dets.shape == (2, 5, 6)
    d = dets[0]
    # 0.9 at (y 1, x 1), class 0: centre (1.25, 1.5), box +- (2, 1)
    torch.testing.assert_close(d[0], torch.tensor([-0.75, 0.5, 3.25, 2.5, 0.9, 0]))
    torch.testing.assert_close(d[1], torch.tensor([4, 3, 4, 3, 0.7, 0]))   # wh 0 at (3, 4)
    torch.testing.assert_close(d[4], torch.tensor([3, 2, 3, 2, 0.5, 1]))
    plateau = sorted(map(tuple, d[2:4].tolist()))
    assert plateau == [(0, 0, 0, 0, pytest.approx(0.6), 1), (1, 0, 1, 0, pytest.approx(0.6), 1)]
    assert not torch.any(torch.isclose(d[:, 4], torch.tensor(0.8)))
    # image 2: the same detections with the classes swapped
    torch.testing.assert_close(dets[1][:, 5], 1 - d[:, 5])
    torch.testing.assert_close(dets[1][[0, 1, 4], :5], d[[0, 1, 4], :5])


def test_decode_without_reg_uses_pixel_centres_and_always_returns_k():
    dets = centernet_decode.ctdet_decode(_heat(), torch.full((2, 2, 4, 5), 2.0), reg=None, K=7)
    assert dets.shape == (2, 7, 6)
    torch.testing.assert_close(dets[0, 0], torch.tensor([0.5, 0.5, 2.5, 2.5, 0.9, 0]))
    assert dets[0, 5, 4] == 0 and dets[0, 6, 4] == 0   # no score threshold: zero-score rows too


def test_decode_cat_spec_wh_reads_the_class_pair():
    wh = torch.zeros(2, 4, 4, 5)
    wh[:, 0:2, 2, 3] = torch.tensor([8.0, 8.0])    # class 0's pair
    wh[:, 2:4, 2, 3] = torch.tensor([2.0, 4.0])    # class 1's pair
    dets = centernet_decode.ctdet_decode(_heat(), wh, cat_spec_wh=True, K=5)
    torch.testing.assert_close(dets[0, 4], torch.tensor([2.5, 0.5, 4.5, 4.5, 0.5, 1]))


def test_test_maps_flip_averages_hm_and_wh_not_reg():
    logits = torch.zeros(2, 1, 2, 3)
    logits[0, 0, 0, 0] = 2.0
    logits[1, 0, 0, 2] = -1.0    # the mirrored pass: column 2 is column 0 of the image
    wh = torch.zeros(2, 2, 2, 3)
    wh[0, :, 0, 0], wh[1, :, 0, 2] = 4.0, 2.0
    reg = torch.stack([torch.full((2, 2, 3), 0.25), torch.full((2, 2, 3), 0.75)])
    hm, wh_m, reg_m = centernet_decode.ctdet_test_maps({'hm': logits, 'wh': wh, 'reg': reg}, flip_test=True)
    assert hm.shape == (1, 1, 2, 3)
    s = lambda v: 1 / (1 + math.exp(-v))
    assert hm[0, 0, 0, 0].item() == pytest.approx((s(2.0) + s(-1.0)) / 2)
    assert hm[0, 0, 1, 1].item() == pytest.approx(0.5)
    assert wh_m[0, 0, 0, 0].item() == 3.0 and wh_m[0, 1, 0, 2].item() == 0.0
    assert torch.all(reg_m == 0.25)
    hm1, _, reg1 = centernet_decode.ctdet_test_maps({'hm': logits[:1], 'wh': wh[:1]}, reg_offset=False)
    assert hm1[0, 0, 0, 0].item() == pytest.approx(s(2.0)) and reg1 is None   # plain sigmoid


def test_test_maps_flip_pairs_of_a_batch():
    # 3 images, each followed by its mirrored pass: image b averages rows 2b and 2b + 1 only.
    gen = torch.Generator().manual_seed(0)
    logits, wh, reg = (torch.randn(6, c, 3, 4, generator=gen) for c in (2, 2, 2))
    hm_b, wh_b, reg_b = centernet_decode.ctdet_test_maps({'hm': logits, 'wh': wh, 'reg': reg}, flip_test=True)
    assert hm_b.shape == (3, 2, 3, 4) and reg_b.shape == (3, 2, 3, 4)
    # The sigmoid of the whole tensor: torch's CPU kernel rounds a vector loop's scalar tail
    # differently, so the sigmoid of one image's slice alone may differ in the last bit.
    prob = torch.sigmoid(logits)
    for b in range(3):
        img, mirrored = 2 * b, 2 * b + 1
        expected_hm = (prob[img] + prob[mirrored].flip(2)) / 2
        assert torch.equal(hm_b[b], expected_hm)
        assert torch.equal(wh_b[b], (wh[img] + wh[mirrored].flip(2)) / 2)
        assert torch.equal(reg_b[b], reg[img])


# ------------------------------------------------------------------------------------------------
# post-processing
# ------------------------------------------------------------------------------------------------

def test_contested_peaks_are_the_positions_whose_peak_test_is_within_tol():
    """Positions whose score is within tol of their largest 3x3 neighbour (either side), by numpy loops over
    a heat map with near-ties of 1e-7 and 2e-3 beside each other; their rows are ctdet_decode's boxes."""
    rng = np.random.RandomState(0)
    heat = rng.uniform(0.1, 0.2, size=(1, 2, 6, 7)).astype(np.float32)
    heat[0, 0, 2, 3], heat[0, 0, 2, 4] = 0.5, np.float32(0.5) - np.float32(1e-7)   # contested both ways
    heat[0, 1, 0, 0], heat[0, 1, 1, 1] = 0.6, 0.598                                 # 2e-3 apart: not within 1e-3
    wh = torch.from_numpy(rng.uniform(1, 3, size=(1, 2, 6, 7)).astype(np.float32))
    reg = torch.from_numpy(rng.uniform(0, 1, size=(1, 2, 6, 7)).astype(np.float32))
    tol = 1e-3
    expected = set()
    for c, y, x in np.ndindex(2, 6, 7):
        neighbours = [heat[0, c, y + dy, x + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)
                      if (dy or dx) and 0 <= y + dy < 6 and 0 <= x + dx < 7]
        if abs(float(heat[0, c, y, x]) - max(neighbours)) <= tol:
            expected.add((c, y, x))
    assert (0, 2, 3) in expected and (0, 2, 4) in expected and (1, 0, 0) not in expected
    # Without wh and reg a row's box is its position (x, y, x, y).
    positions = centernet_decode.contested_peaks(torch.from_numpy(heat), torch.zeros_like(wh), None, tol=tol)[0]
    got = [(int(r[5]), int(r[1] - 0.5), int(r[0] - 0.5)) for r in positions]
    assert sorted(got) == sorted(expected)
    rows = centernet_decode.contested_peaks(torch.from_numpy(heat), wh, reg, tol=tol)[0]
    peaks = centernet_decode.ctdet_decode(torch.from_numpy(heat), wh, reg, K=2)[0]
    torch.testing.assert_close(rows[rows[:, 4] == 0.5], peaks[peaks[:, 4] == 0.5])


def test_post_process_by_hand():
    # c = (100, 50), s = 200, grid 128 x 96: x = (x' - 64) / 0.64 + 100, y = (y' - 48) / 0.64 + 50.
    # Image 2 (keep_res meta): c = (50, 30), s = (128, 64), grid 32 x 16: x = 4 (x' - 16) + 50.
    dets = np.array([[[64, 48, 128, 96, 0.9, 1], [0, 0, 32, 16, 0.5, 0], [10, 20, 30, 40, 0.3, 1]],
                     [[16, 8, 17, 9, 0.8, 2], [0, 0, 1, 1, 0.1, 2], [4, 4, 8, 8, 0.2, 0]]], np.float32)
    c = [np.array([100, 50], np.float32), np.array([50, 30], np.float32)]
    s = [200.0, np.array([128, 64], np.float32)]
    res = centernet_decode.ctdet_post_process(dets, c, s, 96, 128, 3)
    assert len(res) == 2 and sorted(res[0]) == [1, 2, 3]
    np.testing.assert_allclose(res[0][2], [[100, 50, 200, 125, 0.9], [15.625, 6.25, 46.875, 37.5, 0.3]],
                               rtol=1e-6)
    np.testing.assert_allclose(res[0][1], [[0, -25, 50, 0, 0.5]], atol=1e-5)
    assert res[0][3].shape == (0, 5) and res[0][3].dtype == np.float32
    res2 = centernet_decode.ctdet_post_process(dets[1:], c[1:], s[1:], 16, 32, 3)[0]
    np.testing.assert_allclose(res2[3], [[50, 30, 54, 34, 0.8], [-14, -2, -10, 2, 0.1]], atol=1e-5)
    np.testing.assert_allclose(res2[1], [[-14 + 16, -2 + 16, -14 + 32, -2 + 32, 0.2]], atol=1e-5)
    assert all(v.dtype == np.float32 for v in res[0].values())


def _random_decoded(rng, batch, K, num_classes, grid):
    """Decoded-looking dets (batch, K, 6): boxes around random centres (some off the grid), scores
    rounded so that many tie, classes drawn from a subset so that some classes are empty."""
    centres = rng.uniform(-3, grid + 3, (batch, K, 2))
    half = rng.uniform(0, grid / 4, (batch, K, 2))
    scores = np.round(rng.uniform(0, 1, (batch, K, 1)), 1)
    classes = rng.choice(np.arange(num_classes)[::2], (batch, K, 1)).astype(np.float64)
    return np.concatenate([centres - half, centres + half, scores, classes], axis=2).astype(np.float32)


def _random_meta(rng, keep_res):
    if keep_res:   # pure translation: c = (new_w // 2, new_h // 2), s = [inp_w, inp_h]
        w, h = (rng.randint(1, 20, 2) * 32)
        return {'c': np.array([rng.randint(w // 3, w // 2), rng.randint(h // 3, h // 2)], np.float32),
                's': np.array([w, h], np.float32), 'out_height': int(h // 4), 'out_width': int(w // 4)}
    c = rng.uniform(10, 400, 2).astype(np.float32)
    return {'c': c, 's': float(rng.uniform(50, 900)), 'out_height': 128, 'out_width': 128}


@pytest.mark.parametrize('keep_res', [False, True])
def test_post_process_matches_the_per_point_reference_bit_for_bit(keep_res):
    rng = np.random.RandomState(1 + keep_res)
    metas = [_random_meta(rng, keep_res) for _ in range(3)]
    h, w = metas[0]['out_height'], metas[0]['out_width']
    dets = _random_decoded(rng, 3, 100, 80, w)
    c, s = [m['c'] for m in metas], [m['s'] for m in metas]
    got = centernet_decode.ctdet_post_process(dets, c, s, h, w, 80)
    expected = reference_post_process(dets, c, s, h, w, 80)
    assert len(got) == 3
    for g, e in zip(got, expected):
        assert_same_arrays(g, e)
    assert sum(len(v) == 0 for v in got[0].values()) >= 40   # odd classes are empty


def test_affine_corners_match_one_np_dot_per_point_in_float64():
    # The float64 bits, not only the float32 values. With a non-square grid cv2's solve leaves a
    # ~1e-16 off-diagonal term in the inverse affine; then one batched product (gemm) or elementwise
    # arithmetic differs from the per-point np.dot in the last place for some points.
    rng = np.random.RandomState(3)
    off_diagonal = 0
    for trial in range(40):
        if trial % 2:
            c, s = rng.uniform(0, 700, 2).astype(np.float32), float(rng.uniform(50, 1500))
        else:
            c, s = np.floor(rng.uniform(0, 700, 2)).astype(np.float32), rng.randint(32, 1500, 2).astype(np.float32)
        trans = get_affine_transform(c, s, 0, tuple(rng.randint(8, 400, 2)), inv=1)
        off_diagonal += trans[0, 1] != 0 or trans[1, 0] != 0
        corners = rng.uniform(-20, 420, (200, 4)).astype(np.float32)
        expected = np.array([[np.dot(trans, np.array([x, y, 1.], dtype=np.float32)) for x, y in row.reshape(2, 2)]
                             for row in corners]).reshape(-1, 4)
        got = centernet_decode._affine_corners(corners, trans)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got.view(np.int64), expected.view(np.int64))
    assert off_diagonal >= 5


def test_split_by_class_is_one_mask_per_class_in_order():
    rows = np.arange(24, dtype=np.float32).reshape(8, 3)
    classes = np.array([2, 0, 2, np.nan, 1.5, -1, 0, 7], np.float32)   # nan, 1.5, -1 and 7 belong to none
    got = centernet_decode.split_by_class(rows, classes, 3)
    assert len(got) == 3
    np.testing.assert_array_equal(got[0], rows[[1, 6]])
    assert got[1].shape == (0, 3)
    np.testing.assert_array_equal(got[2], rows[[0, 2]])


@pytest.mark.parametrize('scale', [1.0, 0.75, 1.5])
def test_image_detections_and_scale_detections_match_the_reference(scale):
    rng = np.random.RandomState(int(scale * 4))
    meta = _random_meta(rng, keep_res=scale != 1.0)
    dets = _random_decoded(rng, 1, 50, 6, meta['out_width'])
    expected = reference_scale_detections(dets, meta, scale, 6)
    boxes, classes = centernet_decode.image_detections(dets, meta, scale)
    per_class = centernet_decode.split_by_class(boxes, classes, 6)
    assert_same_arrays({j + 1: rows for j, rows in enumerate(per_class)}, expected)
    assert boxes.shape == (50, 5) and boxes.dtype == np.float32
    np.testing.assert_array_equal(classes, dets[0, :, 5])
    for j in range(6):
        np.testing.assert_array_equal(boxes[classes == j].view(np.int32), expected[j + 1].view(np.int32))


def test_scale_detections_divides_boxes_by_scale():
    dets = np.array([[[64, 48, 128, 96, 0.9, 0]]], np.float32)
    meta = {'c': np.array([100, 50], np.float32), 's': 200.0, 'out_height': 96, 'out_width': 128}
    res = dict(enumerate(centernet_decode.split_by_class(*centernet_decode.image_detections(dets, meta, 0.5), 2), 1))
    np.testing.assert_allclose(res[1], [[200, 100, 400, 250, 0.9]], rtol=1e-6)
    assert res[2].shape == (0, 5)


# ------------------------------------------------------------------------------------------------
# soft-NMS and merge
# ------------------------------------------------------------------------------------------------

A = [0, 0, 9, 9, 0.9]
B = [0, 0, 9, 9, 0.0015]      # IoU 1 with A: 0.0015 e^-2 = 0.000203 < 0.001 -> discarded
C = [20, 20, 29, 29, 0.8]     # no overlap with A
D = [0, 0, 9, 19, 0.5]        # IoU with A: 100 / (100 + 200 - 100) = 0.5 -> 0.5 e^-0.5 = 0.303265


def test_soft_nms_discarded_row_leaves_a_stale_copy():
    boxes = np.array([A, B, C], np.float32)
    assert centernet_decode.gaussian_soft_nms_(boxes) == 2
    np.testing.assert_array_equal(boxes, np.array([A, C, C], np.float32))   # row 2: stale C


def test_soft_nms_stale_row_keeps_its_score_from_before_the_step():
    boxes = np.array([A, B, D], np.float32)
    assert centernet_decode.gaussian_soft_nms_(boxes) == 2
    np.testing.assert_allclose(boxes, [A, D[:4] + [0.5 * math.exp(-0.5)], D], rtol=1e-6)


def test_soft_nms_last_row_discarded_in_place():
    boxes = np.array([B, A], np.float32)   # A moves to the top first
    assert centernet_decode.gaussian_soft_nms_(boxes) == 1
    np.testing.assert_allclose(boxes, [A, B[:4] + [0.0015 * math.exp(-2)]], rtol=1e-6)


def _random_dets(rng, n):
    xy = rng.uniform(0, 50, (n, 2))
    wh = rng.uniform(1, 40, (n, 2))
    scores = 10 ** rng.uniform(-3.3, 0, n)
    return np.concatenate([xy, xy + wh, scores[:, None]], axis=1).astype(np.float32)


@pytest.mark.parametrize('seed', range(6))
def test_soft_nms_against_loop_transcription_and_detectron_kernel(seed):
    rng = np.random.RandomState(seed)
    dets = _random_dets(rng, 40)
    if seed % 2:
        dets[:, 4] = np.round(dets[:, 4], 1) + np.float32(0.0004)   # many equal scores
    expected = dets.copy()
    expected_n = soft_nms_loop(expected)
    got = dets.copy()
    n = centernet_decode.gaussian_soft_nms_(got)
    assert n == expected_n and n < len(dets)   # some rows were discarded
    np.testing.assert_array_equal(got, expected)   # stale tail rows included
    kept, _ = cython_nms.soft_nms(dets, sigma=0.5, Nt=0.5, threshold=0.001, method=2)
    np.testing.assert_allclose(got[:n], kept, rtol=1e-6)


def test_soft_nms_empty():
    assert centernet_decode.gaussian_soft_nms_(np.zeros((0, 5), np.float32)) == 0


def _as_dets(rows):
    return np.array(rows, np.float32).reshape(-1, 5)


def test_merge_outputs_keeps_stale_rows_and_limits_with_ties():
    E = [50, 50, 60, 60, 0.4]
    scale_1 = {1: _as_dets([A, B]), 2: _as_dets([E])}
    scale_2 = {1: _as_dets([D]), 2: _as_dets([])}
    merged = centernet_decode.merge_outputs([scale_1, scale_2], 2, max_per_image=3, use_soft_nms=True)
    # class 1 after soft-NMS: [A 0.9, D 0.303, D 0.5 (stale)]; scores over classes
    # [0.9, 0.303, 0.5, 0.4] > 3 -> keep >= the 3rd best 0.4: the rescored D goes, the stale one stays.
    np.testing.assert_allclose(merged[1], [A, D], rtol=1e-6)
    np.testing.assert_allclose(merged[2], [E], rtol=1e-6)
    plain = centernet_decode.merge_outputs([scale_1, scale_2], 2, max_per_image=3)
    np.testing.assert_allclose(plain[1], [A, D], rtol=1e-6)   # B (0.0015) is below 0.4
    ties = centernet_decode.merge_outputs([{1: _as_dets([A, C]), 2: _as_dets([C])}], 2, max_per_image=2)
    assert len(ties[1]) == 2 and len(ties[2]) == 1   # 3 rows: the two 0.8 tie for 2nd place
    few = centernet_decode.merge_outputs([scale_1], 2, max_per_image=100, use_soft_nms=False)
    np.testing.assert_array_equal(few[1], _as_dets([A, B]))
    assert all(v.dtype == np.float32 for v in merged.values())


@pytest.mark.parametrize('scales, max_per_image, soft_nms', [
    (1, 100, False),    # CenterNet's default: exactly K = 100 rows, nothing to cap
    (1, 30, False),     # the cap with ties at the threshold (scores on a 0.1 grid)
    (3, 100, False),    # several scales, --nms off
    (3, 40, True),      # several scales: soft-NMS, stale rows, then the cap
    (2, 500, True),
])
def test_merge_image_detections_matches_thereference_merge(scales, max_per_image, soft_nms):
    rng = np.random.RandomState(scales * 1000 + max_per_image)
    per_scale, dicts = [], []
    for _ in range(scales):
        meta = _random_meta(rng, keep_res=False)
        dets = _random_decoded(rng, 1, 100, 8, meta['out_width'])
        dets[0, :, 4] = np.where(rng.uniform(size=100) < 0.2, np.float32(0.0015), dets[0, :, 4])
        per_scale.append(centernet_decode.image_detections(dets, meta, 1.0))
        dicts.append(reference_scale_detections(dets, meta, 1.0, 8))
    expected = reference_cls_boxes(reference_merge(dicts, 8, max_per_image, soft_nms), 8)
    got = centernet_decode.merge_image_detections(per_scale, 8, max_per_image=max_per_image, use_soft_nms=soft_nms)
    assert_same_arrays(got, expected)
    merged = centernet_decode.merge_outputs(dicts, 8, max_per_image, soft_nms)
    assert_same_arrays(centernet_decode.to_cls_boxes(merged, 8), expected)
    kept = sum(len(b) for b in got)
    if max_per_image >= 100 * scales:
        assert kept == 100 * scales
    elif soft_nms:
        assert kept >= max_per_image
    else:
        assert kept > max_per_image   # ties at the threshold (scores on a 0.1 grid) are all kept


def test_merge_image_detections_caps_only_the_rows_of_known_classes():
    # merge_outputs counts the scores of classes 1..num_classes only: a row of class index 5 with 2
    # classes takes no part in the cap (nor in the output).
    boxes = _as_dets([A, C, [50, 50, 60, 60, 0.4], [1, 1, 2, 2, 0.95]])
    classes = np.array([0, 1, 1, 5], np.float32)
    got = centernet_decode.merge_image_detections([(boxes, classes)], 2, max_per_image=2)
    np.testing.assert_array_equal(got[1], _as_dets([A]))
    np.testing.assert_array_equal(got[2], _as_dets([C]))   # 0.9 and 0.8 are the 2 best, not 0.95


def test_to_cls_boxes():
    cls_boxes = centernet_decode.to_cls_boxes({1: _as_dets([A]), 2: _as_dets([])}, 3)
    assert len(cls_boxes) == 4
    assert cls_boxes[0].shape == (0, 5) and cls_boxes[0].dtype == np.float32
    np.testing.assert_array_equal(cls_boxes[1], _as_dets([A]))
    assert cls_boxes[2].shape == (0, 5) and cls_boxes[3].shape == (0, 5)
    assert all(b.dtype == np.float32 for b in cls_boxes)
