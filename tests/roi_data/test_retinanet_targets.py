"""RetinaNet anchor labels and box targets: a hand-made case, and random boxes against a numpy transcription of
Detectron's _get_retinanet_blobs (tests/support/retinanet_reference.py)."""
import numpy as np
import pytest
import torch

from detectron.modeling.retinanet_heads import retinanet_anchors
from detectron.roi_data.retinanet import retinanet_targets
from tests.support.retinanet_reference import np_retinanet_labels


def _targets(anchors, boxes, classes, crowd=None, im_info=((64.0, 64.0, 1.0),), **kwargs):
    crowd = [torch.zeros(len(b), dtype=torch.bool) for b in boxes] if crowd is None else crowd
    return retinanet_targets(anchors, [torch.tensor(b, dtype=torch.float32).reshape(-1, 4) for b in boxes],
                             [torch.tensor(c) for c in classes], crowd, torch.tensor(im_info), **kwargs)


def test_hand_made_labels_and_targets():
    # One level of four anchors of 16x16 px, as a (2, 2, 1, 4) grid.
    anchors = [torch.tensor([[[[0, 0, 15, 15]], [[16, 0, 31, 15]]],
                             [[[0, 16, 15, 31]], [[16, 16, 31, 31]]]], dtype=torch.float32)]
    # gt 1 (class 2) is anchor 0 shifted by 2 px; gt 2 (class 1) is the right half of anchor 3.
    gt = [[2, 0, 17, 15], [24, 16, 31, 31]]
    t = _targets(anchors, [gt], [[2, 1]])
    labels = t.labels[0].tolist()
    # anchor 0: IoU 14*16 / (2*256 - 14*16) = 0.78 with gt 1 -> class 2; anchor 1: IoU 2*16 / (2*256 - 2*16)
    # = 0.067 with gt 1 -> bg; anchor 2: no overlap -> bg; anchor 3: IoU 8*16 / 256 = 0.5 with gt 2 -> class 1.
    assert labels == [2, 0, 0, 1]
    assert t.fg_num.item() == 2 + 1
    # Targets with unit weights: anchor 0 -> gt 1: dx = 2 / 16, widths equal; anchor 3 -> gt 2: centre x 28 vs
    # 24, width 8 vs 16.
    np.testing.assert_allclose(t.bbox_targets[0, 0].numpy(), [2 / 16, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(t.bbox_targets[0, 3].numpy(), [4 / 16, 0, np.log(0.5), 0], atol=1e-6)
    assert not t.bbox_targets[0, 1:3].any()


def test_best_anchor_below_the_negative_overlap_is_bg_but_counted():
    anchors = [torch.tensor([[[[0, 0, 15, 15]], [[16, 0, 31, 15]]]], dtype=torch.float32)]
    t = _targets(anchors, [[[0, 0, 3, 3]]], [[1]])  # IoU 16 / 256 with anchor 0, its best
    assert t.labels[0].tolist() == [0, 0]
    assert t.fg_num.item() == 1 + 1


def test_crowd_boxes_are_not_ground_truth_and_an_image_without_gt_is_bg():
    anchors = [torch.tensor([[[[0, 0, 15, 15]], [[16, 0, 31, 15]]]], dtype=torch.float32)]
    crowd = [torch.tensor([True]), torch.zeros(0, dtype=torch.bool)]
    t = _targets(anchors, [[[0, 0, 15, 15]], []], [[1], []], crowd=crowd, im_info=((16.0, 32.0, 1.0),) * 2)
    assert t.labels.tolist() == [[0, 0], [0, 0]]
    assert t.fg_num.item() == 2  # (0 + 1) per image


def test_straddle_thresh_ignores_anchors_leaving_the_image():
    anchors = [torch.tensor([[[[-8, 0, 7, 15]], [[16, 0, 31, 15]]]], dtype=torch.float32)]
    t = _targets(anchors, [[[16, 0, 31, 15]]], [[1]], im_info=((16.0, 32.0, 1.0),), straddle_thresh=0)
    assert t.labels[0].tolist() == [-1, 1]
    kept = _targets(anchors, [[[16, 0, 31, 15]]], [[1]], im_info=((16.0, 32.0, 1.0),), straddle_thresh=-1)
    assert kept.labels[0].tolist() == [0, 1]


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_random_boxes_match_detectrons_blobs(seed):
    rng = np.random.RandomState(seed)
    shapes = [(16, 16), (8, 8), (4, 4)]  # P3..P5 of a 128 x 128 blob
    anchors = retinanet_anchors(shapes, (8, 16, 32), 3, (1.0, 2.0, 0.5), 2)
    xy = rng.uniform(0, 90, size=(5, 2))
    wh = rng.uniform(8, 60, size=(5, 2))
    gt = np.round(np.hstack([xy, np.minimum(xy + wh, 127)]))
    classes = rng.randint(1, 4, size=5)
    scale = 0.5  # the roidb's boxes are in original coordinates, im_info's scale brings them to the blob
    t = _targets(anchors, [gt / scale], [classes], im_info=((128.0, 128.0, scale),))
    flat = torch.cat([a.reshape(-1, 4) for a in anchors]).double().numpy()
    labels, targets, num_fg = np_retinanet_labels(flat, gt, classes, 0.5, 0.4)
    assert (labels > 0).any() and (labels == -1).any() and (labels == 0).any()
    np.testing.assert_array_equal(t.labels[0].numpy(), labels)
    np.testing.assert_allclose(t.bbox_targets[0].numpy(), targets, atol=1e-5)
    assert t.fg_num.item() == num_fg + 1
    assert t.level_sizes == [16 * 16 * 9, 8 * 8 * 9, 4 * 4 * 9]
