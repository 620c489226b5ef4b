"""DetectionResults with keypoints: test_net's per-image results stored as all_boxes / all_segms /
all_keyps, slices merged in order (a slice of no images contributing none) and written to the range file."""
import pickle

import numpy as np

from detectron.datasets.test_results import DetectionResults


def _keypoint_result(rng, counts):
    """(cls_boxes, None, cls_keyps) of 2 classes (background empty) with counts[j] detections of class j."""
    cls_boxes = [np.zeros((n, 5), np.float32) + rng.rand() for n in counts]
    cls_keyps = [[rng.rand(4, 17).astype(np.float32) for _ in range(n)] for n in counts]
    return cls_boxes, None, cls_keyps


def _slice(results, num_classes, per_image):
    stored = results.store(num_classes, [{'id': i} for i in range(len(per_image))])
    for i, result in enumerate(per_image):
        stored.add(i, result)
    return stored.value


def test_keypoints_are_stored_and_merged_in_slice_order(tmp_path):
    rng = np.random.RandomState(0)
    results = DetectionResults()
    first = [_keypoint_result(rng, [0, 2]), _keypoint_result(rng, [0, 1])]
    second = [_keypoint_result(rng, [0, 3])]
    values = [_slice(results, 2, first), _slice(results, 2, []), _slice(results, 2, second)]
    assert values[1] == ([[], []], None, None)
    all_boxes, all_segms, all_keyps = results.merge(values)
    images = first + second
    assert all_segms is None and len(all_keyps[1]) == len(all_boxes[1]) == 3
    for i, (cls_boxes, _, cls_keyps) in enumerate(images):
        assert all_boxes[1][i] is cls_boxes[1] and all_keyps[1][i] is cls_keyps[1]
    results.save_range(values[0], str(tmp_path), (0, 2), 'cfg: 1')
    with open(tmp_path / 'detection_range_0_2.pkl', 'rb') as f:
        saved = pickle.load(f)
    assert [len(k) for k in saved['all_keyps'][1]] == [2, 1] and saved['all_segms'] == []


def test_boxes_only_slices_have_no_keypoints():
    results = DetectionResults()
    boxes = [np.zeros((0, 5), np.float32), np.ones((1, 5), np.float32)]
    merged = results.merge([_slice(results, 2, [boxes]), _slice(results, 2, [boxes])])
    assert merged[1] is None and merged[2] is None and len(merged[0][1]) == 2
