"""Keypoint helpers against Detectron's formulas re-implemented here in plain numpy loops, and hand-made cases."""
import numpy as np
import pytest
import torch

from detectron.utils import keypoints as keypoint_utils

# Detectron's keypoint_flip_map of COCO's person keypoints, written out as json_dataset.py has it.
DETECTRON_FLIP_MAP = {'left_eye': 'right_eye', 'left_ear': 'right_ear', 'left_shoulder': 'right_shoulder',
                      'left_elbow': 'right_elbow', 'left_wrist': 'right_wrist', 'left_hip': 'right_hip',
                      'left_knee': 'right_knee', 'left_ankle': 'right_ankle'}


def _reference_heatmap_labels(keypoints, rois, m):
    """Detectron's keypoints_to_heatmap_labels, one keypoint of one RoI at a time."""
    n, _, k = keypoints.shape
    labels, weights = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    for i in range(n):
        x1, y1, x2, y2 = rois[i].astype(np.float32)
        for j in range(k):
            x, y, v = keypoints[i, :, j].astype(np.float32)
            cx = m - 1 if x == x2 else np.floor((x - x1) * np.float32(m / (x2 - x1)))
            cy = m - 1 if y == y2 else np.floor((y - y1) * np.float32(m / (y2 - y1)))
            if v > 0 and 0 <= cx < m and 0 <= cy < m:
                labels[i, j], weights[i, j] = int(cy * m + cx), 1.0
    return labels, weights


def test_heatmap_labels_match_detectrons_formula():
    rng = np.random.RandomState(0)
    rois = np.array([[10, 20, 66, 100], [0, 0, 31, 17], [5.5, 7.25, 40.75, 90.5]], np.float32)
    keypoints = np.zeros((3, 3, 9), np.float32)
    for i, (x1, y1, x2, y2) in enumerate(rois):
        keypoints[i, 0] = rng.randint(int(x1) - 5, int(x2) + 6, size=9)
        keypoints[i, 1] = rng.randint(int(y1) - 5, int(y2) + 6, size=9)
        keypoints[i, 2] = rng.randint(0, 3, size=9)
    keypoints[0, :, 0] = (66, 100, 2)  # on the right and bottom edges: the last cell
    keypoints[1, :, 1] = (0, 0, 2)     # on the top-left corner: the first cell
    labels, weights = keypoint_utils.keypoints_to_heatmap_labels(torch.from_numpy(keypoints), torch.from_numpy(rois), 56)
    ref_labels, ref_weights = _reference_heatmap_labels(keypoints, rois, 56)
    np.testing.assert_array_equal(labels.numpy(), ref_labels)
    np.testing.assert_array_equal(weights.numpy(), ref_weights)
    assert labels[0, 0] == 56 * 56 - 1 and labels[1, 1] == 0
    assert 0 < weights.sum() < weights.numel()  # some keypoints outside or unlabelled


def test_heatmaps_to_keypoints_on_hand_made_heatmaps():
    # Boxes exactly M = 8 pixels wide and high: the bicubic resize keeps the map, cell (c, r) is at
    # box corner + (c + 0.5, r + 0.5).
    m = 8
    maps = np.zeros((2, 2, m, m), np.float32)
    maps[0, 0, 3, 5] = 4.0
    maps[0, 1, 7, 0] = 2.0
    maps[1, 0, 0, 0] = 1.0
    maps[1, 1, 6, 2] = 3.0
    rois = np.array([[10, 20, 18, 28], [0.5, 1.5, 8.5, 9.5]], np.float32)
    out = keypoint_utils.heatmaps_to_keypoints(maps, rois)
    np.testing.assert_allclose(out[0, :2, 0], [10 + 5.5, 20 + 3.5])
    np.testing.assert_allclose(out[0, :2, 1], [10 + 0.5, 20 + 7.5])
    np.testing.assert_allclose(out[1, :2, 1], [0.5 + 2.5, 1.5 + 6.5])
    np.testing.assert_allclose(out[0, 2], [4.0, 2.0])
    # The softmax over the 64 cells at the maximum: e^v / (e^v + 63).
    np.testing.assert_allclose(out[0, 3], [np.exp(4) / (np.exp(4) + 63), np.exp(2) / (np.exp(2) + 63)], rtol=1e-6)


def test_heatmaps_to_keypoints_scales_a_resized_map_back_to_the_box():
    # A 4 x 4 map on a 16 x 8 box: cv2 resizes it to 16 x 8; the maximum of the smooth map sits where
    # the one-hot cell (col 2, row 1) lands, 4 x 2 pixels per cell.
    maps = np.zeros((1, 1, 4, 4), np.float32)
    maps[0, 0, 1, 2] = 10.0
    out = keypoint_utils.heatmaps_to_keypoints(maps, np.array([[0, 0, 16, 8]], np.float32))
    assert 8 <= out[0, 0, 0] <= 12 and 2 <= out[0, 1, 0] <= 4
    # INFERENCE_MIN_SIZE enlarges the map, not the box: the keypoint stays inside the box.
    big = keypoint_utils.heatmaps_to_keypoints(maps, np.array([[0, 0, 16, 8]], np.float32), min_size=64)
    assert abs(big[0, 0, 0] - out[0, 0, 0]) < 1.5 and abs(big[0, 1, 0] - out[0, 1, 0]) < 1.5


def test_coco_flip_map_is_detectrons():
    names, flip_map = keypoint_utils.get_keypoints()
    assert len(names) == 17 and flip_map == DETECTRON_FLIP_MAP


def test_flip_keypoints_swaps_pairs_and_mirrors_x():
    names, flip_map = keypoint_utils.get_keypoints()
    coords = np.zeros((1, 3, 17), np.int32)
    coords[0, :, names.index('left_eye')] = (10, 5, 2)
    coords[0, :, names.index('right_eye')] = (20, 6, 1)
    coords[0, :, names.index('nose')] = (15, 9, 2)
    flipped = keypoint_utils.flip_keypoints(names, flip_map, coords, width=100)
    np.testing.assert_array_equal(flipped[0, :, names.index('left_eye')], (100 - 20 - 1, 6, 1))
    np.testing.assert_array_equal(flipped[0, :, names.index('right_eye')], (100 - 10 - 1, 5, 2))
    np.testing.assert_array_equal(flipped[0, :, names.index('nose')], (84, 9, 2))
    # Unlabelled keypoints keep x = 0 (COCO's convention).
    assert flipped[0, 0, names.index('left_ankle')] == 0
    np.testing.assert_array_equal(keypoint_utils.flip_keypoints(names, flip_map, flipped, 100), coords)


def test_flip_map_of_other_names_pairs_left_and_right():
    assert keypoint_utils.flip_map_of(['left_top', 'right_top', 'centre', 'left_x']) == {'left_top': 'right_top'}


def test_skeleton_of_coco_is_detectrons_edge_count():
    names, _ = keypoint_utils.get_keypoints()
    edges = keypoint_utils.kp_connections(names)
    assert len(edges) == 15 and (names.index('left_eye'), names.index('right_eye')) in edges


@pytest.mark.parametrize('thresh, kept', [(0.3, [0, 2]), (0.9999, [0, 1, 2])])
def test_nms_oks_drops_a_near_copy(thresh, kept):
    kps = np.zeros((3, 4, 17), np.float32)
    kps[:, 0] = np.arange(17) * 3
    kps[:, 1] = 50
    kps[0, 2], kps[1, 2], kps[2, 2] = 3.0, 2.0, 1.0
    kps[1, 0] += 1.0  # one pixel from the first: OKS near 1
    kps[2, 0] += 300.0  # far away: OKS near 0
    rois = np.array([[0, 0, 60, 100]] * 3, np.float32)
    assert keypoint_utils.nms_oks(kps, rois, thresh, keypoint_utils.COCO_OKS_SIGMAS) == kept
