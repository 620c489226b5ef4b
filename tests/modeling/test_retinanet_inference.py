"""RetinaNet's test-time decode (Detectron's test_retinanet.im_detect_bbox) on hand-made head outputs."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from detectron.modeling.rcnn_inference import ImageParams
from detectron.modeling.retinanet_inference import (RetinaNetTestParams, candidate_detections, class_wise_nms,
                                                    im_detect_bbox)
from tests.support.retinanet_reference import np_decode


def _logit(p):
    return math.log(p / (1 - p))


def _hand_made_outputs():
    """Two levels, C = 2 classes, A = 1 anchor per cell. Level 0 (1 x 2 cells): cell 0 scores (0.9, 0.02),
    cell 1 (0.04, 0.6); level 1, the coarsest (1 cell): (0.01, 0.03), below INFERENCE_TH but kept there."""
    anchors = [torch.tensor([[[[0, 0, 15, 15]], [[8, 0, 23, 15]]]], dtype=torch.float32),
               torch.tensor([[[[0, 0, 31, 31]]]], dtype=torch.float32)]
    probs = [[[0.9, 0.04], [0.02, 0.6]], [[0.01], [0.03]]]  # per level: (class, x)
    logits = [torch.tensor([[[[_logit(p) for p in row]] for row in level]]) for level in probs]
    deltas = [torch.tensor([[[[0.1, 0.0]], [[0.0, 0.2]], [[0.0, math.log(2)]], [[0.0, 0.0]]]]),
              torch.tensor([[[[0.0]], [[0.0]], [[0.0]], [[0.5]]]])]
    return anchors, logits, deltas


def test_candidates_per_level_top_k_over_the_threshold_then_decode():
    anchors, logits, deltas = _hand_made_outputs()
    params = RetinaNetTestParams(num_classes=3, pre_nms_top_n=1, inference_th=0.05)
    boxes, scores, classes = candidate_detections(anchors, logits, deltas, params)
    # Level 0: the best (anchor, class) is (0, class 1) at 0.9; level 1: its best, class 2 at 0.03 (threshold 0).
    np.testing.assert_allclose(scores.numpy(), [0.9, 0.03], rtol=1e-6)
    assert classes.tolist() == [1, 2]
    expected = np_decode(np.array([[0, 0, 15, 15], [0, 0, 31, 31]], float),
                         np.array([[0.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]]))
    np.testing.assert_allclose(boxes.numpy(), expected, atol=1e-4)

    wider = RetinaNetTestParams(num_classes=3, pre_nms_top_n=10, inference_th=0.05)
    boxes, scores, classes = candidate_detections(anchors, logits, deltas, wider)
    # 0.04 and 0.02 fall under the threshold on level 0; the coarsest level keeps both of its scores.
    np.testing.assert_allclose(sorted(scores.tolist()), [0.01, 0.03, 0.6, 0.9], rtol=1e-6)
    second = scores.tolist().index(max(s for s in scores.tolist() if s < 0.8))
    expected = np_decode(np.array([[8, 0, 23, 15]], float), np.array([[0.0, 0.2, math.log(2), 0.0]]))
    np.testing.assert_allclose(boxes[second].numpy(), expected[0], atol=1e-4)
    assert classes[second].item() == 2


def test_class_wise_nms_and_the_cap_over_all_classes():
    boxes = torch.tensor([[0, 0, 9, 9], [1, 0, 10, 9], [0, 0, 9, 9], [50, 50, 59, 59]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    classes = torch.tensor([1, 1, 2, 1])
    # Box 1 overlaps box 0 (IoU 0.82) in class 1 -> suppressed; box 2, the same box in class 2, stays.
    dets, det_classes = class_wise_nms(boxes, scores, classes, RetinaNetTestParams(num_classes=3, nms=0.5))
    assert det_classes.tolist() == [1, 1, 2]
    np.testing.assert_allclose(dets[:, 4].numpy(), [0.9, 0.6, 0.7])
    capped, capped_classes = class_wise_nms(boxes, scores, classes,
                                            RetinaNetTestParams(num_classes=3, nms=0.5, detections_per_im=2))
    assert capped_classes.tolist() == [1, 2]
    np.testing.assert_allclose(capped[:, 4].numpy(), [0.9, 0.7], rtol=1e-6)


class _Stub(nn.Module):
    """A 'model' answering the hand-made outputs, to check the image side of im_detect_bbox."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, blob, im_info):
        anchors, logits, deltas = _hand_made_outputs()
        return {'anchors': anchors, 'logits': logits, 'deltas': deltas}


def test_im_detect_bbox_maps_boxes_back_to_the_image_and_fills_cls_boxes():
    image = np.zeros((10, 20, 3), np.uint8)  # scale 2 at TEST.SCALE 20: boxes are halved, then clipped
    params = RetinaNetTestParams(num_classes=3, pre_nms_top_n=10, inference_th=0.05, nms=0.5)
    cls_boxes = im_detect_bbox(_Stub().eval(), image, ImageParams(scale=20, max_size=100, stride=32), params)
    assert len(cls_boxes) == 3 and len(cls_boxes[0]) == 0
    assert cls_boxes[1].dtype == np.float32 and cls_boxes[1].shape[1] == 5
    first = np_decode(np.array([[0, 0, 15, 15]], float), np.array([[0.1, 0.0, 0.0, 0.0]]))[0] / 2
    np.testing.assert_allclose(cls_boxes[1][0], [first[0], first[1], first[2], first[3], 0.9], atol=1e-4)
    assert (cls_boxes[2][:, [0, 2]] <= 19).all() and (cls_boxes[2][:, [1, 3]] <= 9).all()


def test_class_specific_deltas_are_read_for_the_candidates_class():
    anchors = [torch.tensor([[[[0, 0, 15, 15]]]], dtype=torch.float32)]
    logits = [torch.tensor([[[[_logit(0.1)]], [[_logit(0.8)]]]])]  # A = 1, C = 2: class 2 wins
    deltas = torch.zeros(1, 8, 1, 1)
    deltas[0, 4] = 0.5  # class 2's dx (channels: class-major, then coordinate)
    params = RetinaNetTestParams(num_classes=3, pre_nms_top_n=1, inference_th=0.05, class_specific_bbox=True)
    boxes, _, classes = candidate_detections(anchors, logits, [deltas], params)
    assert classes.tolist() == [2]
    np.testing.assert_allclose(boxes.numpy(), np_decode(np.array([[0, 0, 15, 15]], float),
                                                        np.array([[0.5, 0, 0, 0]])), atol=1e-4)


def test_softmax_scores_are_the_class_columns_of_one_softmax_per_anchor():
    # A = 1, 2 cells, C = 2: logits (bg, class 1, class 2) per cell; the background column never becomes a candidate.
    cell_logits = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 2.5]])
    probs = np.exp(cell_logits) / np.exp(cell_logits).sum(axis=1, keepdims=True)
    anchors = [torch.tensor([[[[0, 0, 15, 15]], [[8, 0, 23, 15]]]], dtype=torch.float32)]
    logits = [torch.tensor(cell_logits.T[None, :, None, :], dtype=torch.float32)]  # (1, A*K, 1, 2)
    deltas = [torch.zeros(1, 4, 1, 2)]
    params = RetinaNetTestParams(num_classes=3, pre_nms_top_n=10, inference_th=0.0, softmax=True)
    boxes, scores, classes = candidate_detections(anchors, logits, deltas, params)
    np.testing.assert_allclose(sorted(scores.tolist()), sorted(probs[:, 1:].ravel()), rtol=1e-6)
    best = int(scores.argmax())
    assert classes[best].item() == 2 and scores[best].item() == pytest.approx(probs[1, 2], rel=1e-6)
    np.testing.assert_allclose(boxes[best].numpy(), [8, 0, 23, 15], atol=1e-4)
