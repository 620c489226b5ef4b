"""Keypoint helpers (Detectron's utils/keypoints.py): COCO's keypoint names and flip pairs, flipping,
heatmap training labels (batched torch) and heatmaps -> keypoints at test time.

Keypoints travel as Detectron stores them: (N, 3, K) arrays of (x, y, visibility) rows per object,
visibility 0 (not labelled, x = y = 0), 1 (labelled, not visible) or 2 (visible).
"""
import cv2
import numpy as np
import torch

_COCO_KEYPOINTS = (
    'nose', 'left_eye', 'right_eye', 'left_ear', 'right_ear', 'left_shoulder', 'right_shoulder', 'left_elbow',
    'right_elbow', 'left_wrist', 'right_wrist', 'left_hip', 'right_hip', 'left_knee', 'right_knee', 'left_ankle',
    'right_ankle')

# Skeleton edges of COCO's person keypoints, as Detectron's kp_connections draws them.
_COCO_CONNECTIONS = (
    ('left_eye', 'right_eye'), ('left_eye', 'nose'), ('right_eye', 'nose'), ('right_eye', 'right_ear'),
    ('left_eye', 'left_ear'), ('right_shoulder', 'right_elbow'), ('right_elbow', 'right_wrist'),
    ('left_shoulder', 'left_elbow'), ('left_elbow', 'left_wrist'), ('right_hip', 'right_knee'),
    ('right_knee', 'right_ankle'), ('left_hip', 'left_knee'), ('left_knee', 'left_ankle'),
    ('right_shoulder', 'left_shoulder'), ('right_hip', 'left_hip'))

# The per-keypoint OKS sigmas of COCO's person keypoints (pycocotools' and Detectron's compute_oks).
COCO_OKS_SIGMAS = tuple(s / 10.0 for s in (.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87,
                                           .87, .89, .89))


def get_keypoints():
    """COCO's person keypoint names (list) and Detectron's left -> right flip map (dict)."""
    names = list(_COCO_KEYPOINTS)
    return names, flip_map_of(names)


def flip_map_of(names):
    """{'left_<x>': 'right_<x>'} for every pair of names the dataset has: for COCO's names exactly
    Detectron's hard-coded keypoint_flip_map."""
    return {name: 'right_' + name[len('left_'):] for name in names
            if name.startswith('left_') and 'right_' + name[len('left_'):] in names}


def kp_connections(names):
    """Detectron's kp_connections: index pairs of the skeleton edges among `names` (COCO's person
    skeleton; for other names, each left keypoint joined to its right one)."""
    edges = _COCO_CONNECTIONS if set(names) >= set(_COCO_KEYPOINTS) else tuple(flip_map_of(names).items())
    return [(names.index(a), names.index(b)) for a, b in edges]


def flip_order(keypoints, keypoint_flip_map):
    """The keypoint index each heatmap channel of a mirrored image takes its map from: every flip pair's
    two indices exchanged, the others kept."""
    order = list(range(len(keypoints)))
    for left, right in keypoint_flip_map.items():
        lid, rid = keypoints.index(left), keypoints.index(right)
        order[lid], order[rid] = rid, lid
    return tuple(order)


def flip_heatmaps(heatmaps, order):
    """Detectron's flip_heatmaps on (R, K, M, M) heatmaps (a tensor) of a mirrored image: the channels of each
    flip pair exchanged (order: flip_order) and every map mirrored left-right."""
    return heatmaps[:, list(order)].flip(-1)


def flip_keypoints(keypoints, keypoint_flip_map, keypoint_coords, width):
    """Detectron's flip_keypoints: (N, 3, K) coordinates of an image of `width` mirrored left-right
    (x -> width - x - 1), the columns of each flip pair swapped, x of unlabelled keypoints kept 0."""
    flipped = keypoint_coords[:, :, list(flip_order(keypoints, keypoint_flip_map))]  # a copy
    flipped[:, 0, :] = width - flipped[:, 0, :] - 1
    flipped[:, 0, :][flipped[:, 2, :] == 0] = 0  # COCO's convention: visibility 0 has x = y = 0
    return flipped


def keypoints_to_heatmap_labels(keypoints, rois, heatmap_size):
    """Detectron's keypoints_to_heatmap_labels, batched: keypoints (N, 3, K) and rois (N, 4)
    (x1, y1, x2, y2) tensors in one coordinate frame -> (labels (N, K) int64, the linear index
    y * M + x of each keypoint's cell on the M x M heatmap, M = heatmap_size; weights (N, K) float32,
    1 where the keypoint is visible (v > 0) and falls inside the heatmap, labels 0 elsewhere).

    A keypoint at continuous x maps to cell floor((x - x1) * M / (x2 - x1)) (Heckbert's d = floor(c));
    one exactly on the right (bottom) edge goes to the last cell. Computed in float32 as Detectron."""
    rois = rois.float()
    x, y = keypoints[:, 0].float(), keypoints[:, 1].float()
    cell = []
    for coord, lo, hi in ((x, rois[:, 0:1], rois[:, 2:3]), (y, rois[:, 1:2], rois[:, 3:4])):
        scale = heatmap_size / (hi - lo)
        c = torch.floor((coord - lo) * scale)
        cell.append(torch.where(coord == hi, float(heatmap_size - 1), c))
    cx, cy = cell
    valid = (cx >= 0) & (cy >= 0) & (cx < heatmap_size) & (cy < heatmap_size) & (keypoints[:, 2] > 0)
    labels = torch.where(valid, cy * heatmap_size + cx, 0.0).long()
    return labels, valid.float()


def heatmaps_to_keypoints(maps, rois, min_size=0):
    """Detectron's heatmaps_to_keypoints: heatmap logits maps (R, K, M, M) of boxes rois (R, 4) in
    image coordinates -> (R, 4, K) float32 rows (x, y, logit, probability) per keypoint.

    Each box's maps are resized bicubically (cv2.INTER_CUBIC) to its ceil'd width x height (at
    least min_size [KRCNN.INFERENCE_MIN_SIZE] when > 0); a keypoint is the first maximum of its map,
    at the cell's centre (Heckbert's c = d + 0.5) scaled back to the box; its probability is the
    softmax over the resized map's cells."""
    maps = np.asarray(maps, dtype=np.float32)
    rois = np.asarray(rois, dtype=np.float32)
    widths = np.maximum(rois[:, 2] - rois[:, 0], 1)
    heights = np.maximum(rois[:, 3] - rois[:, 1], 1)
    widths_ceil, heights_ceil = np.ceil(widths), np.ceil(heights)
    num_keypoints = maps.shape[1]
    xy_preds = np.zeros((len(rois), 4, num_keypoints), dtype=np.float32)
    for i in range(len(rois)):  # one cv2.resize per box: each box has its own size
        map_w = int(max(widths_ceil[i], min_size)) if min_size > 0 else int(widths_ceil[i])
        map_h = int(max(heights_ceil[i], min_size)) if min_size > 0 else int(heights_ceil[i])
        resized = cv2.resize(maps[i].transpose(1, 2, 0), (map_w, map_h), interpolation=cv2.INTER_CUBIC)
        resized = resized.reshape(map_h, map_w, num_keypoints).transpose(2, 0, 1).reshape(num_keypoints, -1)
        best = resized.argmax(axis=1)
        logits = resized[np.arange(num_keypoints), best]
        probs = 1.0 / np.exp(resized - logits[:, None]).sum(axis=1)
        x_int, y_int = best % map_w, best // map_w
        xy_preds[i, 0] = (x_int + 0.5) * (widths[i] / map_w) + rois[i, 0]
        xy_preds[i, 1] = (y_int + 0.5) * (heights[i] / map_h) + rois[i, 1]
        xy_preds[i, 2] = logits
        xy_preds[i, 3] = probs
    return xy_preds


def compute_oks(src_keypoints, src_roi, dst_keypoints, sigmas):
    """Detectron's compute_oks: object keypoint similarity of one prediction src_keypoints (4, K)
    with box src_roi (4,) against dst_keypoints (N, 4, K), per-keypoint sigmas (K,)."""
    variances = (np.asarray(sigmas) * 2) ** 2
    area = (src_roi[2] - src_roi[0] + 1) * (src_roi[3] - src_roi[1] + 1)
    dx = dst_keypoints[:, 0, :] - src_keypoints[0, :]
    dy = dst_keypoints[:, 1, :] - src_keypoints[1, :]
    e = (dx ** 2 + dy ** 2) / variances / (area + np.spacing(1)) / 2
    return np.sum(np.exp(-e), axis=1) / e.shape[1]


def nms_oks(kp_predictions, rois, thresh, sigmas):
    """Detectron's nms_oks: indices kept by greedy NMS on OKS (mean keypoint logit as the score)."""
    order = np.mean(kp_predictions[:, 2, :], axis=1).argsort()[::-1]
    keep = []
    while order.size > 0:
        i = order[0]
        keep.append(i)
        overlap = compute_oks(kp_predictions[i], rois[i], kp_predictions[order[1:]], sigmas)
        order = order[np.where(overlap <= thresh)[0] + 1]
    return keep
