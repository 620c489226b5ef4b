"""keypoint_results (Detectron's core/test.py) on hand-made heatmaps: keypoints per detection, class by class, and
the person-only OKS NMS."""
import numpy as np

from detectron.modeling.keypoint_inference import KeypointInferenceParams, keypoint_results

M = 8


def _heatmaps(peaks):
    """(R, K, M, M) logits with a peak of 5 at each (row, col) of peaks[r][k]."""
    maps = np.zeros((len(peaks), len(peaks[0]), M, M), np.float32)
    for r, per_roi in enumerate(peaks):
        for k, (row, col) in enumerate(per_roi):
            maps[r, k, row, col] = 5.0
    return maps


def test_keypoints_follow_the_detections_class_by_class():
    # Class 1 has two detections, class 2 one; boxes M pixels wide: a peak at (row, col) is corner + (col, row) + 0.5.
    cls_boxes = [np.zeros((0, 5), np.float32), np.array([[0, 0, 8, 8, .9], [20, 10, 28, 18, .8]], np.float32),
                 np.array([[40, 40, 48, 48, .7]], np.float32)]
    ref_boxes = np.concatenate(cls_boxes[1:])[:, :4]
    heatmaps = _heatmaps([[(1, 2), (3, 4)], [(0, 0), (7, 7)], [(5, 6), (2, 2)]])
    kept, cls_keyps = keypoint_results(cls_boxes, heatmaps, ref_boxes, KeypointInferenceParams())
    assert kept is cls_boxes and [len(k) for k in cls_keyps] == [0, 2, 1]
    np.testing.assert_allclose(cls_keyps[1][0][:2], [[2.5, 4.5], [1.5, 3.5]])
    np.testing.assert_allclose(cls_keyps[1][1][:2], [[20.5, 27.5], [10.5, 17.5]])
    np.testing.assert_allclose(cls_keyps[2][0][:2], [[46.5, 42.5], [45.5, 42.5]])
    assert cls_keyps[2][0].shape == (4, 2) and (cls_keyps[2][0][2] == 5).all()


def test_nms_oks_drops_a_person_whose_keypoints_repeat_a_better_one():
    boxes = np.array([[0, 0, 8, 8, .9], [0, 0, 8, 8, .8], [30, 30, 38, 38, .7]], np.float32)
    peaks = [[(k % M, (3 * k) % M) for k in range(17)]] * 2 + [[((k + 3) % M, k % M) for k in range(17)]]
    heatmaps = _heatmaps(peaks)
    heatmaps[1] *= 0.5  # the copy scores lower: its mean logit is the smaller
    kept, cls_keyps = keypoint_results([np.zeros((0, 5), np.float32), boxes], heatmaps, boxes[:, :4],
                                       KeypointInferenceParams(nms_oks=True))
    np.testing.assert_array_equal(kept[1], boxes[[0, 2]])
    assert len(cls_keyps[1]) == 2
    np.testing.assert_allclose(cls_keyps[1][1][0, 0], 30 + 0.5)
