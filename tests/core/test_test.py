import math

import numpy as np
import pytest
import torch
from torch import nn

from detectron.core import test as test_lib
from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.modeling.rcnn_builder import GeneralizedRCNNType
from detectron.ops import nms as nms_ops
from detectron.ops.variance_voting import soft_nms_with_variance_voting
from detectron.utils import boxes as box_utils
from detectron.utils.errors import ConfigValueError


# ---------------------------------------------------------------------------------------------
# Independent references: numpy loops following KL-Loss's py_cpu_nms.soft and Detectron's /
# KL-Loss's box_results_with_nms_and_limit step by step.
# ---------------------------------------------------------------------------------------------

def _rcnn():
    """The R-CNN model type bound to the global cfg the tests set: core/test's functions read their
    settings from model_type.cfg."""
    return GeneralizedRCNNType(cfg)


def _swap_rows(array, a, b):
    array[[a, b]] = array[[b, a]]


def _swap_rows_and_cols(matrix, a, b):
    _swap_rows(matrix, a, b)
    matrix[:, [a, b]] = matrix[:, [b, a]]


def reference_kl_soft(dets, confidence, std_th, method, soft, iou_sigma, test_nms):
    """KL-Loss's soft(): works in place on float32 dets (N, 5) and confidence (N, 4)."""
    vote_th = 0.01 if method == 'stdiou' and std_th > 0.1 else std_th
    n = len(dets)
    x1, y1, x2, y2 = (dets[:, c].copy() for c in range(4))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    ious = np.zeros((n, n))  # float64 holding float32 IoUs
    for r in range(n):
        w = np.maximum(0.0, np.minimum(x2[r], x2) - np.maximum(x1[r], x1) + 1.)
        h = np.maximum(0.0, np.minimum(y2[r], y2) - np.maximum(y1[r], y1) + 1.)
        inter = w * h
        ious[r, :] = inter / (areas[r] + areas - inter)
    i = 0
    while i < n:
        best = i + dets[i:n, 4].argmax()
        _swap_rows(dets, best, i)
        _swap_rows(confidence, best, i)
        _swap_rows_and_cols(ious, best, i)
        if method == 'stdiou':
            voters = i + np.where(ious[i, i:n] > vote_th)[0]
            p = np.exp(-(1 - ious[i, voters]) ** 2 / iou_sigma)
            num = p.dot(dets[voters, :4] / confidence[voters] ** 2)
            dets[i, :4] = num / p.dot(1. / confidence[voters] ** 2)
        pos = i + 1
        while pos < n:
            if ious[i, pos] > 0:
                if soft == 'hard':
                    if ious[i, pos] > test_nms:
                        dets[pos, 4] = 0
                else:
                    dets[pos, 4] *= np.exp(-(ious[i, pos] * ious[i, pos]) / 0.5)
                if dets[pos, 4] < 0.001:
                    _swap_rows(dets, pos, n - 1)
                    _swap_rows(confidence, pos, n - 1)
                    _swap_rows_and_cols(ious, pos, n - 1)
                    n -= 1
                    pos -= 1
            pos += 1
        i += 1
    return dets[:n], list(range(n))


def reference_box_results(scores, boxes, confs=None):
    """Detectron's box_results_with_nms_and_limit with KL-Loss's STD_NMS branch, reading cfg."""
    num_classes = scores.shape[1]
    cls_boxes = [np.zeros((0, 5), np.float32) for _ in range(num_classes)]
    for j in range(1, num_classes):
        inds = np.where(scores[:, j] > cfg.TEST.SCORE_THRESH)[0]
        dets_j = np.hstack((boxes[inds, 4 * j:4 * j + 4], scores[inds, j][:, None])).astype(np.float32)
        if cfg.STD_NMS:
            confs_j = confs[inds, 4 * j:4 * j + 4]
            if cfg.STD.SIGMA_COLUMN_ORDER == 'corrected':
                confs_j = confs_j[:, [0, 2, 1, 3]]  # (x1, x2, y1, y2) sigmas -> box columns
            nms_dets, _ = reference_kl_soft(dets_j, confs_j, cfg.STD_TH, cfg.STD.METHOD, cfg.STD.SOFT,
                                            cfg.STD.IOU_SIGMA, cfg.TEST.NMS)
        elif cfg.TEST.SOFT_NMS.ENABLED:
            nms_dets, _ = nms_ops.soft_nms(dets_j, sigma=cfg.TEST.SOFT_NMS.SIGMA,
                                           overlap_thresh=cfg.TEST.NMS, score_thresh=0.0001,
                                           method=cfg.TEST.SOFT_NMS.METHOD)
        else:
            nms_dets = dets_j[nms_ops.nms(dets_j, cfg.TEST.NMS), :]
        if cfg.TEST.BBOX_VOTE.ENABLED:
            nms_dets = box_utils.box_voting(nms_dets, dets_j, cfg.TEST.BBOX_VOTE.VOTE_TH,
                                            scoring_method=cfg.TEST.BBOX_VOTE.SCORING_METHOD)
        cls_boxes[j] = nms_dets
    image_scores = np.hstack([cls_boxes[j][:, -1] for j in range(1, num_classes)])
    if len(image_scores) > cfg.TEST.DETECTIONS_PER_IM > 0:
        image_thresh = np.sort(image_scores)[-cfg.TEST.DETECTIONS_PER_IM]
        for j in range(1, num_classes):
            cls_boxes[j] = cls_boxes[j][cls_boxes[j][:, -1] >= image_thresh]
    return cls_boxes


def _head_outputs(seed, num_rois=150, num_classes=4, num_objects=6, image_size=600):
    """Scores, per-class boxes and sigmas like a detector's: clustered around a few objects."""
    rng = np.random.RandomState(seed)
    centers = rng.uniform(50, image_size - 50, size=(num_objects, 2))
    sizes = rng.uniform(20, 200, size=(num_objects, 2))
    owner = rng.randint(num_objects, size=num_rois)
    boxes = np.zeros((num_rois, 4 * num_classes), np.float32)
    for j in range(num_classes):
        jitter = rng.randn(num_rois, 4) * np.tile(sizes[owner] * 0.15, 2)
        half = sizes[owner] / 2
        boxes[:, 4 * j:4 * j + 4] = np.hstack([centers[owner] - half, centers[owner] + half]) + jitter
    logits = rng.randn(num_rois, num_classes) * 2.0
    scores = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
    confs = np.exp(rng.randn(num_rois, 4 * num_classes) * 0.5).astype(np.float32) * 0.2
    return scores, boxes, confs


def _assert_same_cls_boxes(actual, expected, box_atol=1e-4):
    assert len(actual) == len(expected)
    for j, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == np.float32 and a.shape == e.shape, (j, a.shape, e.shape)
        np.testing.assert_allclose(a[:, :4], e[:, :4], rtol=0, atol=box_atol, err_msg=f'class {j}')
        np.testing.assert_allclose(a[:, 4], e[:, 4], rtol=1e-6, atol=0, err_msg=f'class {j}')


def _set_std_nms(method='stdiou', soft='soft', order='reference', std_th=0.9, iou_sigma=0.01):
    cfg.STD_NMS = True
    cfg.STD.METHOD = method
    cfg.STD.SOFT = soft
    cfg.STD.SIGMA_COLUMN_ORDER = order
    cfg.STD_TH = std_th
    cfg.STD.IOU_SIGMA = iou_sigma


# ---------------------------------------------------------------------------------------------
# KL-Loss variance voting + soft-NMS
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('method', ['stdiou', 'soft'])
@pytest.mark.parametrize('soft', ['soft', 'hard'])
@pytest.mark.parametrize('order', ['reference', 'corrected'])
def test_std_nms_matches_kl_soft_transcription(method, soft, order):
    _set_std_nms(method, soft, order)
    cfg.TEST.NMS = 0.5
    for seed in range(3):
        scores, boxes, confs = _head_outputs(seed)
        expected = reference_box_results(scores, boxes, confs.copy())
        out_scores, out_boxes, cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)
        _assert_same_cls_boxes(cls_boxes, expected)
        np.testing.assert_array_equal(out_scores, np.concatenate(cls_boxes[1:])[:, 4])
        np.testing.assert_array_equal(out_boxes, np.concatenate(cls_boxes[1:])[:, :4])


def test_std_nms_many_boxes_one_class_hard_drops():
    # Dense overlapping boxes: many drops, swaps and compactions per step.
    _set_std_nms('stdiou', 'hard', std_th=0.9, iou_sigma=0.05)
    cfg.TEST.NMS = 0.3
    cfg.TEST.DETECTIONS_PER_IM = 0
    scores, boxes, confs = _head_outputs(7, num_rois=400, num_classes=2, num_objects=3)
    expected = reference_box_results(scores, boxes, confs.copy())
    assert len(expected[1]) > 5
    _assert_same_cls_boxes(test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)[2], expected)


@pytest.mark.parametrize('std_th,c_votes', [(0.9, True), (0.5, True), (0.1, False), (0.02, False)])
def test_std_th_above_point_one_is_replaced_by_point_01(std_th, c_votes):
    # A = [0, 0, 9, 9] selected first; IoU(A, B = [1, 2, 11, 13]) = 72 / 160 = 0.45 and
    # IoU(A, C = [7, 7, 26, 26]) = 9 / 491 = 0.0183. STD_TH > 0.1 becomes 0.01, so C votes for A.
    _set_std_nms('stdiou', 'soft', std_th=std_th, iou_sigma=0.3025)
    rows = [([0, 0, 9, 9], 0.9), ([1, 2, 11, 13], 0.8), ([7, 7, 26, 26], 0.7)]
    boxes = np.array([[0, 0, 0, 0] + b for b, _ in rows], np.float32)
    scores = np.array([[1 - s, s] for _, s in rows], np.float32)
    cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, np.ones((3, 8), np.float32))[2]
    voters = [(np.array(rows[0][0], float), 1.0),
              (np.array(rows[1][0], float), math.exp(-(1 - 72 / 160) ** 2 / 0.3025))]
    if c_votes:
        voters.append((np.array(rows[2][0], float), math.exp(-(1 - 9 / 491) ** 2 / 0.3025)))
    expected = sum(p * box for box, p in voters) / sum(p for _, p in voters)
    np.testing.assert_allclose(cls_boxes[1][0, :4], expected, rtol=1e-6)


def _two_box_example():
    # A = [0, 0, 9, 9] (area 100) and B = [1, 2, 11, 13] (area 132): intersection 9 x 8 = 72,
    # IoU = 72 / (232 - 72) = 0.45. One RoI per box, class 1 only.
    scores = np.array([[0.1, 0.9], [0.2, 0.8]], np.float32)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 9, 9], [0, 0, 0, 0, 1, 2, 11, 13]], np.float32)
    confs = np.ones((2, 8), np.float32)
    confs[1, 4:] = [1.0, 1.0, 1000.0, 1.0]  # sigma of B's third head column (y1 in XYXY layout)
    return scores, boxes, confs


@pytest.mark.parametrize('order', ['reference', 'corrected'])
def test_variance_voting_by_hand(order):
    # IOU_SIGMA = 0.55^2 makes B's vote weight p = exp(-(1 - 0.45)^2 / 0.3025) = e^-1.
    _set_std_nms('stdiou', 'soft', order, std_th=0.9, iou_sigma=0.3025)
    scores, boxes, confs = _two_box_example()
    cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)[2]
    a, b, p = np.array([0, 0, 9, 9.]), np.array([1, 2, 11, 13.]), math.exp(-1)
    voted = (a + p * b) / (1 + p)
    # 'reference' weighs box column 2 (x2) by sigma column 2; 'corrected' weighs y1 (column 1) by it.
    frozen_column = 2 if order == 'reference' else 1
    voted[frozen_column] = a[frozen_column] + p * 1e-6 * (b - a)[frozen_column] / (1 + p * 1e-6)
    expected = np.array([list(voted) + [0.9], [1, 2, 11, 13, 0.8 * math.exp(-0.45 ** 2 / 0.5)]])
    np.testing.assert_allclose(cls_boxes[1], expected, rtol=1e-6, atol=1e-5)
    assert cls_boxes[0].shape == (0, 5)


def test_hard_drop_swaps_with_last_and_ties_take_first_position():
    # Class 1: A (0.9); A' overlapping A with IoU 0.9 (dropped by hard NMS at 0.5); two far
    # boxes F1, F2 with equal scores 0.3, F1 first in RoI order. Dropping A' swaps F2 into its
    # position, ahead of F1, so the tie picks F2 first.
    _set_std_nms('soft', 'hard')
    cfg.TEST.NMS = 0.5
    rows = [([0, 0, 9, 9], 0.9), ([0, 0, 9, 8], 0.8), ([100, 100, 109, 109], 0.3),
            ([200, 200, 209, 209], 0.3)]
    boxes = np.array([[0, 0, 0, 0] + b for b, _ in rows], np.float32)
    scores = np.array([[1 - s, s] for _, s in rows], np.float32)
    cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, np.ones((4, 8), np.float32))[2]
    np.testing.assert_array_equal(cls_boxes[1], np.array(
        [[0, 0, 9, 9, 0.9], [200, 200, 209, 209, 0.3], [100, 100, 109, 109, 0.3]], np.float32))


def test_soft_nms_with_variance_voting_t_empty_and_padding():
    boxes = torch.tensor([[[0, 0, 9, 9], [1, 1, 10, 10], [0, 0, 0, 0]],
                          [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]], dtype=torch.float32)
    scores = torch.tensor([[0.5, 0.7, 0.0], [0.0, 0.0, 0.0]])
    order, num_kept, voted, final = soft_nms_with_variance_voting(
        boxes, scores, torch.ones(2, 3, 4), torch.tensor([2, 0]), vote_thresh=0.01,
        iou_sigma=0.01, vote=False)
    assert num_kept.tolist() == [2, 0]
    assert order[0, :2].tolist() == [1, 0]
    iou = 81 / (200 - 81)  # IoU of the two boxes, as the verified Detectron vector
    assert final[0].tolist()[:2] == pytest.approx([0.5 * math.exp(-iou ** 2 / 0.5), 0.7], rel=1e-6)
    torch.testing.assert_close(voted[0, :2], boxes[0, [1, 0]])


def test_std_nms_without_confs_is_a_clear_error():
    _set_std_nms()
    scores, boxes, _ = _two_box_example()
    with pytest.raises(ConfigValueError, match='STD_NMS'):
        test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)


# ---------------------------------------------------------------------------------------------
# Detectron post-processing (STD_NMS False)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('nms', [0.3, 0.5, 0.7])
def test_plain_nms_matches_detectron_cython_nms(nms):
    cfg.TEST.NMS = nms
    for seed in range(3):
        scores, boxes, _ = _head_outputs(seed)
        expected = reference_box_results(scores, boxes)
        _, _, cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)
        for a, e in zip(cls_boxes, expected):
            np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize('method', ['linear', 'gaussian', 'hard'])
def test_detectron_soft_nms(method):
    cfg.TEST.SOFT_NMS.ENABLED = True
    cfg.TEST.SOFT_NMS.METHOD = method
    cfg.TEST.SOFT_NMS.SIGMA = 0.5
    cfg.TEST.NMS = 0.4
    scores, boxes, _ = _head_outputs(3)
    expected = reference_box_results(scores, boxes)
    _assert_same_cls_boxes(test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)[2], expected, 0)


@pytest.mark.parametrize('std_nms', [False, True])
@pytest.mark.parametrize('scoring', ['ID', 'AVG'])
def test_box_voting(std_nms, scoring):
    # With STD_NMS, KL-Loss votes with the class's detections as soft() left them (in place).
    if std_nms:
        _set_std_nms('stdiou', 'soft')
    cfg.TEST.BBOX_VOTE.ENABLED = True
    cfg.TEST.BBOX_VOTE.VOTE_TH = 0.6
    cfg.TEST.BBOX_VOTE.SCORING_METHOD = scoring
    cfg.TEST.NMS = 0.5
    cfg.TEST.DETECTIONS_PER_IM = 0  # so that rescoring cannot change which rows survive
    scores, boxes, confs = _head_outputs(5)
    expected = reference_box_results(scores, boxes, confs.copy())
    actual = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)[2]
    # After soft() the dropped rows sit in another order than in KL-Loss's array: the float32
    # sums of box_voting then round differently (up to ~2e-4 px on 600 px boxes).
    _assert_same_cls_boxes(actual, expected, box_atol=1e-3 if std_nms else 0)
    # Voting moved boxes: compare against the result without it.
    cfg.TEST.BBOX_VOTE.ENABLED = False
    unvoted = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)[2]
    assert max(np.abs(a[:, :4] - u[:, :4]).max() for a, u in zip(actual[1:], unvoted[1:]) if len(a)) > 0.1


def test_detections_per_image_cap_keeps_ties():
    # 3 classes x 70 disjoint boxes (NMS keeps everything) with scores on a 0.01 grid:
    # 210 detections, the 100th best score is shared, so more than 100 survive.
    rng = np.random.RandomState(0)
    num_rois, num_classes = 70, 4
    grid = np.arange(num_rois, dtype=np.float32)[:, None] * 20
    boxes = np.tile(np.hstack([grid, grid, grid + 10, grid + 10]), (1, num_classes))
    scores = np.zeros((num_rois, num_classes), np.float32)
    scores[:, 1:] = rng.randint(6, 30, size=(num_rois, num_classes - 1)) / np.float32(100)
    cfg.TEST.DETECTIONS_PER_IM = 100
    out_scores, _, cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)
    expected = reference_box_results(scores, boxes)
    for a, e in zip(cls_boxes, expected):
        np.testing.assert_array_equal(a, e)
    hundredth = np.sort(scores[:, 1:].ravel())[-100]
    assert len(out_scores) == np.sum(scores[:, 1:] >= hundredth) > 100
    cfg.TEST.DETECTIONS_PER_IM = 0
    assert len(test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)[0]) == 210


def test_score_threshold_is_strict():
    # float32 0.05 against SCORE_THRESH 0.05 compares in float32, as numpy does: equal, dropped.
    scores = np.array([[0.95, 0.05], [0.9, 0.1]], np.float32)
    boxes = np.array([[0, 0, 0, 0, 0, 0, 9, 9], [0, 0, 0, 0, 50, 50, 59, 59]], np.float32)
    assert cfg.TEST.SCORE_THRESH == 0.05
    cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes)[2]
    np.testing.assert_array_equal(cls_boxes[1], np.array([[50, 50, 59, 59, 0.1]], np.float32))


# ---------------------------------------------------------------------------------------------
# im_detect_bbox / im_detect_all with a fake model
# ---------------------------------------------------------------------------------------------

class FakeHead(nn.Module):
    """Returns fixed raw outputs and records what it was called with."""

    def __init__(self, rois, cls_prob, bbox_pred, bbox_pred_std=None):
        super().__init__()
        self.outputs = {'rois': rois, 'cls_prob': cls_prob, 'bbox_pred': bbox_pred}
        if bbox_pred_std is not None:
            self.outputs['bbox_pred_std'] = bbox_pred_std
        self.calls = []

    def forward(self, images, im_info):
        self.calls.append((images.clone(), im_info.clone(), torch.is_grad_enabled()))
        return dict(self.outputs)


def _image():
    # 20 x 30 BGR image; TEST scale 40 -> im_scale 2, resized 40 x 60, padded to 64 x 64.
    return np.full((20, 30, 3), 100, np.uint8)


def _fake_model(bbox_pred, bbox_pred_std=None):
    # RoI 0 in input coordinates (scale 2): [10, 10, 30, 30] -> original [5, 5, 15, 15] (11 x 11).
    # RoI 1: [20, 0, 58, 38] -> original [10, 0, 29, 19].
    rois = torch.tensor([[0, 10, 10, 30, 30], [0, 20, 0, 58, 38]], dtype=torch.float32)
    cls_prob = torch.tensor([[0.1, 0.6, 0.3], [0.7, 0.2, 0.1]])
    return FakeHead(rois, cls_prob, bbox_pred, bbox_pred_std).eval()


def test_im_detect_bbox_scales_decodes_and_clips():
    bbox_pred = torch.zeros(2, 12)
    # RoI 0, class 2: dx = 0.1 (x weight 10), dw = ln 2 (w weight 5): width 11 -> 22,
    # centre 5 + 5.5 + 0.1 * 11 = 11.6 -> x1 = 0.6, x2 = 21.6.
    bbox_pred[0, 8:12] = torch.tensor([1.0, 0.0, 5 * math.log(2.0), 0.0])
    # RoI 1, class 1: dx = 0.5 -> centre 20 + 10 = 30 -> [20, 39] clipped to x <= 29 (width 30).
    bbox_pred[1, 4:8] = torch.tensor([5.0, 0.0, 0.0, 0.0])
    model = _fake_model(bbox_pred)
    scores, pred_boxes, im_scale = test_lib.im_detect_bbox(_rcnn(), model, _image(), 40, 1000)  # KL-Loss's 3 without STD_NMS
    images, im_info, grad_enabled = model.calls[0]
    assert images.shape == (1, 3, 64, 64) and not grad_enabled
    np.testing.assert_allclose(im_info.numpy(), [[64, 64, 2.0]])
    np.testing.assert_allclose(images[0, :, 0, 0].numpy(), 100 - np.array(cfg.PIXEL_MEANS).ravel(),
                               rtol=1e-6)
    assert images[0, :, 40:, :].abs().sum() == 0 and images[0, :, :, 60:].abs().sum() == 0
    assert im_scale == 2.0
    np.testing.assert_allclose(scores, [[0.1, 0.6, 0.3], [0.7, 0.2, 0.1]])
    expected = np.array([[5, 5, 15, 15, 5, 5, 15, 15, 0.6, 5, 21.6, 15],
                         [10, 0, 29, 19, 20, 0, 29, 19, 10, 0, 29, 19]], np.float32)
    np.testing.assert_allclose(pred_boxes, expected, rtol=0, atol=1e-4)
    assert pred_boxes.dtype == np.float32


def test_im_detect_bbox_xyxy_coding_and_sigmas():
    cfg.XYXY = True
    cfg.STD_NMS = True
    bbox_pred = torch.zeros(2, 12)
    # Edge deltas (x1, x2, y1, y2) divided by (10, 10, 10, 10): RoI 0 class 1 (11 x 11):
    # x1 + 0.1 * 11, x2 - 0.2 * 11, y1 + 0.2 * 11, y2 - 0.1 * 11.
    bbox_pred[0, 4:8] = torch.tensor([1.0, -2.0, 2.0, -1.0])
    alpha = torch.full((2, 12), 2 * math.log(3.0))
    model = _fake_model(bbox_pred, bbox_pred_std=alpha)
    _, pred_boxes, _, confs = test_lib.im_detect_bbox(_rcnn(), model, _image(), 40, 1000)
    np.testing.assert_allclose(pred_boxes[0, 4:8], [6.1, 7.2, 12.8, 13.9], atol=1e-4)
    # RoI 1 has zero deltas: unchanged in XYXY coding too.
    np.testing.assert_allclose(pred_boxes[1], [10, 0, 29, 19] * 3, atol=1e-4)
    assert confs.dtype == np.float32
    np.testing.assert_allclose(confs, np.full((2, 12), 3.0), rtol=1e-6)


def test_im_detect_bbox_class_agnostic_tiles_fg_columns():
    cfg.MODEL.CLS_AGNOSTIC_BBOX_REG = True
    cfg.STD_NMS = True
    bbox_pred = torch.zeros(2, 8)
    bbox_pred[0, 4:8] = torch.tensor([1.0, 0.0, 5 * math.log(2.0), 0.0])
    alpha = torch.zeros(2, 8)
    alpha[:, 4:8] = 2 * math.log(2.0)
    model = _fake_model(bbox_pred, bbox_pred_std=alpha)
    _, pred_boxes, _, confs = test_lib.im_detect_bbox(_rcnn(), model, _image(), 40, 1000)
    np.testing.assert_allclose(pred_boxes[0], [0.6, 5, 21.6, 15] * 3, atol=1e-4)
    np.testing.assert_allclose(confs, np.full((2, 12), 2.0), rtol=1e-6)


def test_im_detect_bbox_user_errors():
    model = _fake_model(torch.zeros(2, 12))
    cfg.MODEL.FASTER_RCNN = True
    with pytest.raises(ConfigValueError, match='precomputed proposals'):
        test_lib.im_detect_bbox(_rcnn(), model, _image(), 40, 1000, boxes=np.zeros((1, 4)))
    cfg.STD_NMS = True
    with pytest.raises(ConfigValueError, match='PRED_STD'):
        test_lib.im_detect_bbox(_rcnn(), model, _image(), 40, 1000)
    with pytest.raises(ValueError, match='eval'):
        test_lib.im_detect_bbox(_rcnn(), model.train(), _image(), 40, 1000)


def test_im_detect_all_uses_test_scale_and_post_processing():
    cfg.MODEL.TYPE = 'generalized_rcnn'  # im_detect_all runs the detector of the configured model type
    cfg.MODEL.FASTER_RCNN = True  # the fake model makes its own RoIs, as an RPN
    cfg.TEST.SCALE = 40
    cfg.TEST.MAX_SIZE = 1000
    cfg.TEST.NMS = 0.5
    model = _fake_model(torch.zeros(2, 12))
    cls_boxes = test_lib.im_detect_all(model_builder.build_model_type(cfg), model, _image())
    # Class 1: RoI 0 (0.6) and RoI 1 (0.2), IoU 6 * 11 / (121 + 400 - 66) < 0.5: both kept, in
    # RoI order. Class 2: RoI 0 (0.3) and RoI 1 (0.1 > SCORE_THRESH 0.05).
    np.testing.assert_allclose(cls_boxes[1], [[5, 5, 15, 15, 0.6], [10, 0, 29, 19, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(cls_boxes[2], [[5, 5, 15, 15, 0.3], [10, 0, 29, 19, 0.1]], rtol=1e-6)
    assert cls_boxes[0].shape == (0, 5)


@pytest.mark.parametrize('branch', ['nms', 'soft_nms', 'std_nms', 'bbox_vote'])
def test_no_rois_give_empty_detections_in_every_branch(branch):
    # Detectron's box_results_with_nms_and_limit returns empty classes when no RoI is left (e.g. an
    # RPN whose proposals were all filtered away); the port raised on reshape(0, -1, 4).
    if branch == 'std_nms':
        _set_std_nms('stdiou', 'soft', 'reference')
    cfg.TEST.SOFT_NMS.ENABLED = branch == 'soft_nms'
    cfg.TEST.BBOX_VOTE.ENABLED = branch == 'bbox_vote'
    num_classes = 3
    scores, boxes = np.zeros((0, num_classes), np.float32), np.zeros((0, 4 * num_classes), np.float32)
    confs = np.zeros((0, 4 * num_classes), np.float32) if branch == 'std_nms' else None
    out_scores, out_boxes, cls_boxes = test_lib.box_results_with_nms_and_limit(_rcnn(), scores, boxes, confs)
    assert out_scores.shape == (0,) and out_boxes.shape == (0, 4) and len(cls_boxes) == num_classes
    assert all(len(b) == 0 for b in cls_boxes)
