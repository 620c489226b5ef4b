"""numpy transcriptions of Detectron's RetinaNet algorithms, for tests/modeling and tests/roi_data:
the anchors (test_retinanet._create_cell_anchors over the feature map's cells), the labels and box
targets of roi_data/retinanet._get_retinanet_blobs, the SigmoidFocalLoss op's value and gradient, and
test_retinanet.im_detect_bbox's per-level candidate selection and decode."""
import math

import numpy as np

from tests.support.numpy_boxes import np_bbox_overlaps, np_bbox_transform_inv


def np_cell_anchor(stride, size, ratio):
    """One anchor of Detectron's generate_anchors, step by step: the stride x stride window reshaped to
    ratio (rounded sides), scaled to size, about the window centre."""
    center = (stride - 1) / 2.0
    w = float(np.round(math.sqrt(stride * stride / ratio)))
    h = float(np.round(w * ratio))
    sw, sh = w * size / stride, h * size / stride
    return [center - (sw - 1) / 2, center - (sh - 1) / 2, center + (sw - 1) / 2, center + (sh - 1) / 2]


def np_level_anchors(level, height, width, scales_per_octave, ratios, anchor_scale):
    """(height * width * A, 4) anchors of one level in (y, x, anchor) order, anchor = octave * R + ratio."""
    stride = 2.0 ** level
    cell = [np_cell_anchor(stride, stride * 2 ** (octave / float(scales_per_octave)) * anchor_scale, ratio)
            for octave in range(scales_per_octave) for ratio in ratios]
    out = []
    for y in range(height):
        for x in range(width):
            for box in cell:
                out.append([box[0] + x * stride, box[1] + y * stride, box[2] + x * stride, box[3] + y * stride])
    return np.array(out)


def np_retinanet_labels(anchors, gt_boxes, gt_classes, positive_overlap, negative_overlap):
    """_get_retinanet_blobs on (N, 4) anchors and (G, 4) gt in network-input coordinates:
    (labels (N,), bbox_targets (N, 4), num_fg) with Detectron's statement order."""
    labels = -np.ones(len(anchors))
    overlaps = np_bbox_overlaps(anchors, gt_boxes)
    argmax = overlaps.argmax(axis=1)
    anchor_max = overlaps[np.arange(len(anchors)), argmax]
    gt_max = overlaps[overlaps.argmax(axis=0), np.arange(len(gt_boxes))]
    with_max = np.where(overlaps == gt_max)[0]
    labels[with_max] = gt_classes[argmax[with_max]]
    above = anchor_max >= positive_overlap
    labels[above] = gt_classes[argmax[above]]
    fg = np.where(labels >= 1)[0]
    labels[anchor_max < negative_overlap] = 0
    targets = np.zeros((len(anchors), 4))
    targets[fg] = np_bbox_transform_inv(anchors[fg], gt_boxes[argmax[fg]], (1.0, 1.0, 1.0, 1.0), False)
    targets[labels <= 0] = 0  # only the remaining fg anchors are regressed (SelectSmoothL1's locations)
    return labels, targets, len(fg)


def np_focal_loss_and_grad(logits, labels, normalizer, gamma, alpha):
    """The SigmoidFocalLoss op: (sum of the losses / normalizer, d loss / d logits) of (N, C) logits and
    (N,) labels in {-1, 0, 1..C}, by the closed forms of the op's kernels."""
    p = 1 / (1 + np.exp(-logits))
    classes = np.arange(1, logits.shape[1] + 1)
    pos = (labels[:, None] == classes).astype(float)
    neg = ((labels[:, None] >= 0) & (labels[:, None] != classes)).astype(float)
    loss = -alpha * pos * (1 - p) ** gamma * np.log(p) - (1 - alpha) * neg * p ** gamma * np.log(1 - p)
    grad = (alpha * pos * (1 - p) ** gamma * (gamma * p * np.log(p) - (1 - p))
            + (1 - alpha) * neg * p ** gamma * (p - gamma * (1 - p) * np.log(1 - p)))
    return loss.sum() / normalizer, grad / normalizer


def np_decode(anchors, deltas, clip=math.log(1000.0 / 16.0)):
    """Detectron's bbox_transform with unit weights (the +1 box convention)."""
    widths = anchors[:, 2] - anchors[:, 0] + 1.0
    heights = anchors[:, 3] - anchors[:, 1] + 1.0
    ctr_x, ctr_y = anchors[:, 0] + 0.5 * widths, anchors[:, 1] + 0.5 * heights
    dw, dh = np.minimum(deltas[:, 2], clip), np.minimum(deltas[:, 3], clip)
    px, py = deltas[:, 0] * widths + ctr_x, deltas[:, 1] * heights + ctr_y
    pw, ph = np.exp(dw) * widths, np.exp(dh) * heights
    return np.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw - 1, py + 0.5 * ph - 1], axis=1)


def np_softmax_focal_loss_and_grad(logits, labels, normalizer, gamma, alpha):
    """The SoftmaxFocalLoss op: (sum of the losses / max(normalizer, 1), d loss / d logits) of (N, C + 1)
    logits (background first) and (N,) labels in {-1, 0, 1..C}, by the closed forms of its kernels: per
    labelled anchor z (1 - p_t)^gamma (-log p_t) with z = alpha for a class, 1 - alpha for background,
    and the gradient z (gamma (1 - p_t)^(gamma - 1) p_t log p_t - (1 - p_t)^gamma) (1[c = t] - p_c)."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = shifted / shifted.sum(axis=1, keepdims=True)
    labelled = labels >= 0
    z = np.where(labels > 0, alpha, 1 - alpha) * labelled / max(normalizer, 1.0)
    p_t = p[np.arange(len(labels)), np.maximum(labels, 0)]
    loss = -(z * (1 - p_t) ** gamma * np.log(p_t)).sum()
    weight = z * (gamma * (1 - p_t) ** (gamma - 1) * p_t * np.log(p_t) - (1 - p_t) ** gamma)
    one_hot = (np.arange(logits.shape[1])[None, :] == labels[:, None]).astype(float)
    return loss, weight[:, None] * (one_hot - p)
