import math

import numpy as np
import pytest
import torch
from pycocotools import mask as coco_mask

from detectron.ops import nms as nms_ops
from detectron.utils import boxes as box_utils

F32 = np.float32
BOX_REG_WEIGHTS = (10.0, 10.0, 5.0, 5.0)


def random_boxes(rng, mean_box, stdev, n):
    return (rng.standard_normal((n, 4)) * stdev + mean_box).astype(F32)


def valid_random_boxes(rng, n, dtype=np.float64):
    xy = rng.uniform(0, 100, (n, 2))
    return np.hstack([xy, xy + rng.uniform(1, 60, (n, 2))]).astype(dtype)


# --- Detectron coding: vectors verified by running Detectron's boxes.py -------------------------

def test_zero_deltas_return_the_box():
    out = box_utils.bbox_transform(np.array([[0, 0, 9, 9]], F32), np.zeros((1, 4), F32), BOX_REG_WEIGHTS)
    np.testing.assert_array_equal(out, [[0, 0, 9, 9]])


def test_shift_and_doubling_deltas():
    deltas = np.array([[10, 0, 5 * math.log(2), 0]], F32)  # dx = 1 width, dw = log 2
    out = box_utils.bbox_transform(np.array([[0, 0, 9, 9]], F32), deltas, BOX_REG_WEIGHTS)
    np.testing.assert_allclose(out, [[5, 0, 24, 9]], rtol=0, atol=1e-5)


def test_inverse_of_one_pixel_shift():
    targets = box_utils.bbox_transform_inv(np.array([[0, 0, 9, 9]], F32), np.array([[1, 1, 10, 10]], F32),
                                           BOX_REG_WEIGHTS)
    assert targets.dtype == F32
    np.testing.assert_allclose(targets, [[1, 1, 0, 0]], atol=1e-7)


def test_size_deltas_are_clamped_above_at_log_1000_over_16():
    box = np.array([[0, 0, 9, 9]], np.float64)
    out = box_utils.bbox_transform(box, np.array([[0, 0, 100, 100]], np.float64))
    # Width 10 * 1000/16 = 625 around centre 5: [5 - 312.5, 5 + 312.5 - 1].
    np.testing.assert_allclose(out, [[-307.5, -307.5, 316.5, 316.5]], rtol=1e-12)
    out32 = box_utils.bbox_transform(box.astype(F32), np.array([[0, 0, 100, 100]], F32))
    np.testing.assert_allclose(out32, [[-307.5, -307.5, 316.5, 316.5]], rtol=1e-6)
    # Shrinking is not clamped: exp(-100) * 10 is a zero-size box at the centre.
    out = box_utils.bbox_transform(box, np.array([[0, 0, -100, -100]], np.float64))
    np.testing.assert_allclose(out, [[5, 5, 4, 4]], atol=1e-12)


def test_iou_of_one_pixel_shift_is_81_over_119():
    a, b = np.array([[0, 0, 9, 9]], F32), np.array([[1, 1, 10, 10]], F32)
    np.testing.assert_allclose(box_utils.bbox_overlaps(a, b), [[81 / 119]], rtol=1e-7)
    np.testing.assert_allclose(box_utils.box_iou_t(torch.from_numpy(a), torch.from_numpy(b)).numpy(),
                               [[81 / 119]], rtol=1e-7)


def decode_center_size_by_loops(boxes, deltas, weights, clip):
    out = np.zeros_like(deltas)
    for n, (x1, y1, x2, y2) in enumerate(boxes):
        w, h = x2 - x1 + 1, y2 - y1 + 1
        cx, cy = x1 + 0.5 * w, y1 + 0.5 * h
        for c in range(deltas.shape[1] // 4):
            dx, dy, dw, dh = (deltas[n, 4 * c + k] / weights[k] for k in range(4))
            pcx, pcy = cx + dx * w, cy + dy * h
            pw, ph = math.exp(min(dw, clip)) * w, math.exp(min(dh, clip)) * h
            out[n, 4 * c:4 * c + 4] = [pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw - 1, pcy + 0.5 * ph - 1]
    return out


def test_center_size_decode_matches_loop_transcription_for_all_classes():
    rng = np.random.default_rng(0)
    boxes = valid_random_boxes(rng, 12)
    deltas = rng.normal(0, 3, (12, 12))
    deltas[0, 2] = 80.0  # beyond the clamp
    expected = decode_center_size_by_loops(boxes, deltas, BOX_REG_WEIGHTS, math.log(1000 / 16))
    np.testing.assert_allclose(box_utils.bbox_transform(boxes, deltas, BOX_REG_WEIGHTS), expected, rtol=1e-12)
    out_t = box_utils.bbox_transform_t(torch.from_numpy(boxes), torch.from_numpy(deltas), BOX_REG_WEIGHTS)
    assert out_t.dtype == torch.float64
    np.testing.assert_allclose(out_t.numpy(), expected, rtol=1e-12)


def test_empty_boxes_decode_to_empty():
    out = box_utils.bbox_transform(np.zeros((0, 4), F32), np.zeros((0, 8), F32))
    assert out.shape == (0, 8) and out.dtype == F32


# --- Detectron's tests/test_bbox_transform.py ---------------------------------------------------

def test_transform_then_inverse_round_trip():
    rng = np.random.default_rng(1)
    weights = (5, 5, 10, 10)
    src, dst = random_boxes(rng, [10, 10, 20, 20], 1, 10), random_boxes(rng, [10, 10, 20, 20], 1, 10)
    deltas = box_utils.bbox_transform_inv(src, dst, weights=weights)
    np.testing.assert_array_almost_equal(box_utils.bbox_transform(src, deltas, weights=weights), dst, decimal=5)


def test_dataset_box_to_prediction_round_trip_has_coco_iou_one():
    rng = np.random.default_rng(2)
    weights = (5, 5, 10, 10)
    gt_xywh = [10, 20, 100, 150]
    gt_xyxy = box_utils.xywh_to_xyxy(gt_xywh)
    assert gt_xyxy == (10, 20, 109, 169)
    proposals = random_boxes(rng, gt_xyxy, 10, 10)
    deltas = box_utils.bbox_transform_inv(proposals, np.array([gt_xyxy]), weights=weights)
    pred_xywh = box_utils.xyxy_to_xywh(box_utils.bbox_transform(proposals, deltas, weights=weights))
    ious = coco_mask.iou(pred_xywh, np.array([gt_xywh], np.float64), [0])
    np.testing.assert_array_almost_equal(ious, np.ones(ious.shape))


@pytest.mark.parametrize('mean_box, stdev', [([10, 10, 20, 20], 5), ([10, 10, 110, 20], 20)])
def test_bbox_overlaps_match_coco_iou(mean_box, stdev):
    rng = np.random.default_rng(3)
    b1, b2 = random_boxes(rng, mean_box, stdev, 10), random_boxes(rng, mean_box, stdev, 10)
    coco_ious = coco_mask.iou(box_utils.xyxy_to_xywh(b1).astype(np.float64),
                              box_utils.xyxy_to_xywh(b2).astype(np.float64), [0] * len(b2))
    np.testing.assert_array_almost_equal(box_utils.bbox_overlaps(b1, b2), coco_ious, decimal=5)
    iou_t = box_utils.box_iou_t(torch.from_numpy(b1), torch.from_numpy(b2)).numpy()
    np.testing.assert_array_almost_equal(iou_t, coco_ious, decimal=5)


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_box_iou_t_is_the_cython_kernel_bit_for_bit(device):
    """Proposal-like fractional boxes (some inverted) against jittered copies as gt: Detectron's
    kernel forms +1 sides, a box's area and the union in double, which all-float32 arithmetic
    rounds apart on about 3% of these pairs (28465 of 10^6 in a check against Detectron's own
    compiled .pyx)."""
    rng = np.random.default_rng(4)
    xy = rng.uniform(0, 500, (4000, 2))
    a = np.hstack([xy, xy + rng.uniform(-5, 200, (4000, 2))]).astype(F32)
    b = (a[:40] + rng.normal(0, 3, (40, 4))).astype(F32)
    expected = box_utils.bbox_overlaps(a, b)
    got = box_utils.box_iou_t(torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)).cpu().numpy()
    assert (expected == 0).any() and (expected > 0.5).any()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


# --- KL-Loss edge (XYXY) coding -----------------------------------------------------------------

def encode_edges_by_loops(boxes, gt_boxes, weights):
    wx, wy = weights[0], weights[1]
    out = np.zeros((len(boxes), 4))
    for n, ((x1, y1, x2, y2), (gx1, gy1, gx2, gy2)) in enumerate(zip(boxes, gt_boxes)):
        w, h = x2 - x1 + 1, y2 - y1 + 1
        out[n] = [wx * (gx1 - x1) / w, wy * (gx2 - x2) / w, wx * (gy1 - y1) / h, wy * (gy2 - y2) / h]
    return out


def decode_edges_by_loops(boxes, deltas, weights, clip):
    wx, wy = weights[0], weights[1]
    out = np.zeros_like(deltas)
    for n, (x1, y1, x2, y2) in enumerate(boxes):
        w, h = x2 - x1 + 1, y2 - y1 + 1
        for c in range(deltas.shape[1] // 4):
            d_x1, d_x2, d_y1, d_y2 = (min(max(deltas[n, 4 * c + k] / s, -clip), clip)
                                      for k, s in enumerate((wx, wy, wx, wy)))
            out[n, 4 * c:4 * c + 4] = [x1 + d_x1 * w, y1 + d_y1 * h, x2 + d_x2 * w, y2 + d_y2 * h]
    return out


def test_edge_coding_hand_values():
    box = torch.tensor([[0., 0., 9., 19.]])  # w 10, h 20
    gt = torch.tensor([[1., 2., 12., 15.]])
    # (x1, x2, y1, y2) offsets: 10 * 1/10, 10 * 3/10, 10 * 2/20, 10 * -4/20 (ww, wh ignored).
    targets = box_utils.bbox_transform_inv_t(box, gt, (10., 10., 5., 5.), xyxy=True)
    np.testing.assert_allclose(targets.numpy(), [[1.0, 3.0, 1.0, -2.0]], rtol=1e-6)
    decoded = box_utils.bbox_transform_t(box, targets, (10., 10., 5., 5.), xyxy=True)
    np.testing.assert_allclose(decoded.numpy(), gt.numpy(), rtol=1e-6)


def test_edge_coding_matches_loop_transcription_and_round_trips():
    rng = np.random.default_rng(5)
    weights = (10.0, 7.0, 5.0, 5.0)  # distinct wx, wy to catch a swapped weight
    boxes, gt = valid_random_boxes(rng, 20), valid_random_boxes(rng, 20)
    targets = box_utils.bbox_transform_inv_t(torch.from_numpy(boxes), torch.from_numpy(gt), weights, xyxy=True)
    np.testing.assert_allclose(targets.numpy(), encode_edges_by_loops(boxes, gt, weights), rtol=1e-12)
    deltas = rng.normal(0, 5, (20, 8))
    decoded = box_utils.bbox_transform_t(torch.from_numpy(boxes), torch.from_numpy(deltas), weights, xyxy=True)
    np.testing.assert_allclose(decoded.numpy(), decode_edges_by_loops(boxes, deltas, weights, 62.5), rtol=1e-12)
    round_trip = box_utils.bbox_transform_t(torch.from_numpy(boxes), targets, weights, xyxy=True)
    np.testing.assert_allclose(round_trip.numpy(), gt, rtol=1e-12, atol=1e-9)


def test_edge_deltas_are_clamped_symmetrically_at_62_5():
    box = torch.tensor([[0., 0., 9., 9.]], dtype=torch.float64)
    deltas = torch.tensor([[1e4, -1e4, -1e4, 1e4]], dtype=torch.float64)
    out = box_utils.bbox_transform_t(box, deltas, (10., 10., 5., 5.), xyxy=True)
    # Each edge moves at most 62.5 widths (10 px): x1 + 625, y1 - 625, x2 - 625, y2 + 625.
    np.testing.assert_allclose(out.numpy(), [[625, -625, 9 - 625, 9 + 625]])


def test_numpy_coding_follows_xyxy_and_the_edge_clamp():
    rng = np.random.default_rng(6)
    boxes, gt = valid_random_boxes(rng, 6, F32), valid_random_boxes(rng, 6, F32)
    center_targets = box_utils.bbox_transform_inv(boxes, gt, BOX_REG_WEIGHTS)
    edge_targets = box_utils.bbox_transform_inv(boxes, gt, BOX_REG_WEIGHTS, xyxy=True)
    np.testing.assert_allclose(edge_targets, encode_edges_by_loops(boxes, gt, BOX_REG_WEIGHTS), rtol=1e-5)
    assert not np.allclose(edge_targets, center_targets)
    np.testing.assert_allclose(box_utils.bbox_transform(boxes, edge_targets, BOX_REG_WEIGHTS, xyxy=True), gt,
                               atol=1e-3)
    out = box_utils.bbox_transform(np.array([[0, 0, 9, 9]], F32), np.array([[100, 0, 0, 0]], F32), xyxy=True,
                                   clip_xyxy=0.5)
    np.testing.assert_allclose(out, [[5, 0, 9, 9]])  # x1 moves by at most 0.5 widths


# --- clipping, flipping, conversions ------------------------------------------------------------

def test_clip_tiled_boxes_hand_values_and_in_place():
    boxes = np.array([[-5, -3, 120, 50, 1, 2, 3, 300]], F32)
    out = box_utils.clip_tiled_boxes(boxes, (40, 100))
    expected = [[0, 0, 99, 39, 1, 2, 3, 39]]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(boxes, expected)  # Detectron clips in place


def test_clip_tiled_boxes_t_takes_tensor_sizes_and_keeps_dtype():
    boxes = torch.tensor([[-5., -3., 120., 50.], [10., 10., 20., 20.]], dtype=torch.float64)
    out = box_utils.clip_tiled_boxes_t(boxes, torch.tensor(40.), torch.tensor(100.))
    assert out.dtype == torch.float64
    np.testing.assert_array_equal(out.numpy(), [[0, 0, 99, 39], [10, 10, 20, 20]])
    assert box_utils.clip_tiled_boxes_t(torch.zeros(0, 8), 10, 10).shape == (0, 8)
    with pytest.raises(ValueError, match='4k columns'):
        box_utils.clip_tiled_boxes_t(torch.zeros(2, 5), 10, 10)


def test_clip_tiled_boxes_t_clips_each_image_to_its_own_size():
    boxes = torch.tensor([[[-5., -3., 120., 50.], [30., 60., 45., 80.]],
                          [[-5., -3., 120., 50.], [30., 60., 45., 80.]]])
    heights, widths = torch.tensor([40., 70.]), torch.tensor([100., 40.])
    out = box_utils.clip_tiled_boxes_t(boxes, heights.view(-1, 1, 1), widths.view(-1, 1, 1))
    # image 0 is 40 high, 100 wide; image 1 is 70 high, 40 wide
    np.testing.assert_array_equal(out.numpy(), [[[0, 0, 99, 39], [30, 39, 45, 39]],
                                                [[0, 0, 39, 50], [30, 60, 39, 69]]])


def test_clip_boxes_to_image_leaves_score_column():
    dets = np.array([[-1, 5, 70, 90, 0.7]], F32)
    box_utils.clip_boxes_to_image(dets, 60, 50)
    np.testing.assert_allclose(dets, [[0, 5, 49, 59, 0.7]])


def test_clip_xyxy_to_image_numbers_and_arrays():
    assert box_utils.clip_xyxy_to_image(-2.5, 3, 120, 50, 40, 100) == (0, 3, 99, 39)
    x1, y1, x2, y2 = box_utils.clip_xyxy_to_image(np.array([-1., 5.]), np.array([2., 50.]),
                                                  np.array([10., 200.]), np.array([3., 60.]), 40, 100)
    np.testing.assert_array_equal(np.stack([x1, y1, x2, y2]), [[0, 5], [2, 39], [10, 99], [3, 39]])


def test_flip_boxes():
    boxes = np.array([[0, 1, 9, 5, 20, 1, 29, 5]], F32)
    np.testing.assert_array_equal(box_utils.flip_boxes(boxes, 100), [[90, 1, 99, 5, 70, 1, 79, 5]])


def test_xywh_xyxy_conversions():
    xywh = np.array([[10, 20, 100, 150], [5, 5, 0.5, 1]], np.float64)
    xyxy = box_utils.xywh_to_xyxy(xywh)
    np.testing.assert_array_equal(xyxy, [[10, 20, 109, 169], [5, 5, 5, 5]])  # w < 1 gives x2 = x1
    np.testing.assert_array_equal(box_utils.xyxy_to_xywh(xyxy), [[10, 20, 100, 150], [5, 5, 1, 1]])
    assert box_utils.xyxy_to_xywh((10, 20, 109, 169)) == (10, 20, 100, 150)
    with pytest.raises(ValueError, match='4 coordinates'):
        box_utils.xywh_to_xyxy([1, 2, 3])
    with pytest.raises(TypeError):
        box_utils.xyxy_to_xywh('0 0 1 1')


def test_areas_filtering_expansion_and_aspect_ratio():
    boxes = np.array([[0, 0, 9, 4], [0, 0, 2, 30], [5, 5, 4, 4]], F32)
    np.testing.assert_array_equal(box_utils.boxes_area(boxes), [50, 93, 0])
    np.testing.assert_array_equal(box_utils.filter_small_boxes(boxes, 3), [0])
    np.testing.assert_array_equal(box_utils.expand_boxes(np.array([[0, 0, 10, 4]], F32), 2.0), [[-5, -2, 15, 6]])
    np.testing.assert_array_equal(box_utils.aspect_ratio(np.array([[1, 2, 3, 4]], F32), 2.0), [[2, 2, 6, 4]])


# --- box voting ---------------------------------------------------------------------------------

VOTE_TOP = np.array([[0, 0, 9, 9, 0.9]], F32)
VOTE_ALL = np.array([[0, 0, 9, 9, 0.9], [1, 1, 10, 10, 0.6], [50, 50, 60, 60, 0.8]], F32)


@pytest.mark.parametrize('method, beta, score', [
    ('ID', 1.0, 0.9),
    ('AVG', 1.0, (0.9 + 0.6) / 2),
    ('IOU_AVG', 1.0, (0.9 * 1 + 0.6 * 81 / 119) / (1 + 81 / 119)),
    ('GENERALIZED_AVG', 2.0, math.sqrt((0.9 ** 2 + 0.6 ** 2) / 2)),
    ('QUASI_SUM', 2.0, (0.9 + 0.6) / 2 ** 2),
    ('TEMP_AVG', 1.0, (0.9 + 0.6) / 2),
    # beta 2: p = 0.9 tempers to 1 / (1 + sqrt(1/9)), p = 0.6 to 1 / (1 + sqrt(0.4/0.6)).
    ('TEMP_AVG', 2.0, (1 / (1 + 1 / 3) + 1 / (1 + math.sqrt(2 / 3))) / 2),
])
def test_box_voting_hand_values(method, beta, score):
    out = box_utils.box_voting(VOTE_TOP, VOTE_ALL, 0.5, scoring_method=method, beta=beta)
    # Voters: itself (0.9) and the shifted box (IoU 0.68); the far box does not vote.
    np.testing.assert_allclose(out[0, :4], (0.9 * np.array([0, 0, 9, 9]) + 0.6 * np.array([1, 1, 10, 10])) / 1.5,
                               rtol=1e-6)
    np.testing.assert_allclose(out[0, 4], score, rtol=1e-6)


def box_voting_by_loops(top_dets, all_dets, thresh, scoring_method, beta):
    """Detectron's box_voting, one top box at a time."""
    out = top_dets.copy()
    overlaps = box_utils.bbox_overlaps(top_dets[:, :4], all_dets[:, :4])
    for k in range(len(out)):
        idx = np.where(overlaps[k] >= thresh)[0]
        ws = all_dets[idx, 4]
        out[k, :4] = np.average(all_dets[idx, :4], axis=0, weights=ws)
        if scoring_method == 'TEMP_AVG':
            p = np.vstack((ws, 1.0 - ws))
            x_exp = np.exp(np.log(p / np.max(p, axis=0)) / beta)
            out[k, 4] = (x_exp / np.sum(x_exp, axis=0))[0].mean()
        elif scoring_method == 'AVG':
            out[k, 4] = ws.mean()
        elif scoring_method == 'IOU_AVG':
            out[k, 4] = np.average(ws, weights=overlaps[k, idx])
        elif scoring_method == 'GENERALIZED_AVG':
            out[k, 4] = np.mean(ws ** beta) ** (1.0 / beta)
        elif scoring_method == 'QUASI_SUM':
            out[k, 4] = ws.sum() / float(len(ws)) ** beta
    return out


@pytest.mark.parametrize('method', ['ID', 'TEMP_AVG', 'AVG', 'IOU_AVG', 'GENERALIZED_AVG', 'QUASI_SUM'])
def test_box_voting_matches_loop_transcription(method):
    rng = np.random.default_rng(8)
    all_dets = np.hstack([valid_random_boxes(rng, 60), rng.uniform(0.05, 1, (60, 1))]).astype(F32)
    top_dets = all_dets[nms_ops.nms(all_dets, 0.3)]
    out = box_utils.box_voting(top_dets, all_dets, 0.5, scoring_method=method, beta=1.5)
    np.testing.assert_array_equal(out, box_voting_by_loops(top_dets, all_dets, 0.5, method, 1.5))


def test_box_voting_rejects_unknown_method():
    with pytest.raises(ValueError, match='QUASI_SUM'):
        box_utils.box_voting(VOTE_TOP, VOTE_ALL, 0.5, scoring_method='MEDIAN')


def test_exp_is_rounded_once_from_float64():
    x = torch.from_numpy(np.random.default_rng(0).uniform(-8, 4.2, 20000).astype(F32))
    expected = np.array([math.exp(float(v)) for v in x], dtype=np.float64).astype(F32)
    assert torch.equal(box_utils.exp(x), torch.from_numpy(expected))
    assert box_utils.exp(x).dtype == torch.float32


def test_log_is_rounded_once_from_float64():
    x = torch.from_numpy(np.random.default_rng(0).uniform(0.05, 20, 20000).astype(F32))
    expected = np.array([math.log(float(v)) for v in x], dtype=np.float64).astype(F32)
    assert torch.equal(box_utils.log(x), torch.from_numpy(expected))
    assert box_utils.log(x).dtype == torch.float32


def test_float32_center_size_encode_is_detectrons_numpy_with_log_rounded_once():
    # Detectron's bbox_transform_inv on float32 arrays, with its np.log taken as glibc's logf of
    # its day (log rounded once to float32; torch's float32 log is 1 ulp off in some 8%).
    rng = np.random.default_rng(5)
    boxes = valid_random_boxes(rng, 3000).astype(F32)
    gt = (boxes + rng.normal(0, 4, boxes.shape)).astype(F32)
    gt[:, 2:] = np.maximum(gt[:, 2:], gt[:, :2] + 1)
    wx, wy, ww, wh = BOX_REG_WEIGHTS
    widths, heights = boxes[:, 2] - boxes[:, 0] + 1.0, boxes[:, 3] - boxes[:, 1] + 1.0
    gt_widths, gt_heights = gt[:, 2] - gt[:, 0] + 1.0, gt[:, 3] - gt[:, 1] + 1.0
    ctr_x, ctr_y = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
    gt_ctr_x, gt_ctr_y = gt[:, 0] + 0.5 * gt_widths, gt[:, 1] + 0.5 * gt_heights
    rounded_log = lambda v: np.log(v.astype(np.float64)).astype(F32)
    expected = np.stack([wx * (gt_ctr_x - ctr_x) / widths, wy * (gt_ctr_y - ctr_y) / heights,
                         ww * rounded_log(gt_widths / widths), wh * rounded_log(gt_heights / heights)], axis=1)
    got = box_utils.bbox_transform_inv_t(torch.from_numpy(boxes), torch.from_numpy(gt), BOX_REG_WEIGHTS)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


def test_float32_center_size_decode_is_detectrons_numpy_with_exp_rounded_once():
    # Detectron's bbox_transform on float32 arrays, with its np.exp(dw) taken as glibc's expf of
    # its day (exp rounded once to float32).
    rng = np.random.default_rng(3)
    boxes = valid_random_boxes(rng, 50).astype(F32)
    deltas = rng.normal(0, 2, (50, 8)).astype(F32)
    widths, heights = boxes[:, 2] - boxes[:, 0] + 1.0, boxes[:, 3] - boxes[:, 1] + 1.0
    ctr_x, ctr_y = boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = BOX_REG_WEIGHTS
    dx, dy, dw, dh = deltas[:, 0::4] / wx, deltas[:, 1::4] / wy, deltas[:, 2::4] / ww, deltas[:, 3::4] / wh
    clip = np.float32(math.log(1000. / 16))
    dw, dh = np.minimum(dw, clip), np.minimum(dh, clip)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = np.exp(dw.astype(np.float64)).astype(F32) * widths[:, None]
    pred_h = np.exp(dh.astype(np.float64)).astype(F32) * heights[:, None]
    expected = np.zeros_like(deltas)
    expected[:, 0::4], expected[:, 1::4] = pred_ctr_x - 0.5 * pred_w, pred_ctr_y - 0.5 * pred_h
    expected[:, 2::4], expected[:, 3::4] = pred_ctr_x + 0.5 * pred_w - 1, pred_ctr_y + 0.5 * pred_h - 1
    got = box_utils.bbox_transform_t(torch.from_numpy(boxes), torch.from_numpy(deltas), BOX_REG_WEIGHTS)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_divide_is_numpys_float32_division_on_every_device(device):
    # CUDA divides by a host scalar as a multiplication by its reciprocal (1 ulp off numpy's
    # division in about a fifth of the values); box_utils.divide divides.
    x = np.random.default_rng(1).uniform(-300, 900, 100000).astype(F32)
    for value in (10.0, 5.0, 800 / 427):
        got = box_utils.divide(torch.from_numpy(x).to(device), value).cpu().numpy()
        np.testing.assert_array_equal(got.view(np.uint32), (x / value).view(np.uint32))
