"""numpy transcriptions of Detectron's bbox_overlaps and KL-Loss's bbox_transform_inv, shared by
tests/roi_data/test_rpn_targets.py and test_fast_rcnn_targets.py."""
import numpy as np


def np_bbox_overlaps(boxes, query_boxes):
    """utils/cython_bbox.pyx bbox_overlaps in float32, one query box at a time."""
    boxes = boxes.astype(np.float32)
    query_boxes = query_boxes.astype(np.float32)
    one = np.float32(1)
    overlaps = np.zeros((boxes.shape[0], query_boxes.shape[0]), dtype=np.float32)
    for k, q in enumerate(query_boxes):
        box_area = (q[2] - q[0] + one) * (q[3] - q[1] + one)
        iw = np.minimum(boxes[:, 2], q[2]) - np.maximum(boxes[:, 0], q[0]) + one
        ih = np.minimum(boxes[:, 3], q[3]) - np.maximum(boxes[:, 1], q[1]) + one
        ua = (boxes[:, 2] - boxes[:, 0] + one) * (boxes[:, 3] - boxes[:, 1] + one) + box_area - iw * ih
        positive = (iw > 0) & (ih > 0)
        overlaps[positive, k] = (iw * ih)[positive] / ua[positive]
    return overlaps


def np_bbox_transform_inv(boxes, gt_boxes, weights, xyxy):
    """KL-Loss utils/boxes.py bbox_transform_inv / bbox_transform_inv_xyxy."""
    wx, wy, ww, wh = weights
    ex_widths = boxes[:, 2] - boxes[:, 0] + 1.0
    ex_heights = boxes[:, 3] - boxes[:, 1] + 1.0
    if xyxy:
        return np.vstack((wx * (gt_boxes[:, 0] - boxes[:, 0]) / ex_widths,
                          wy * (gt_boxes[:, 2] - boxes[:, 2]) / ex_widths,
                          wx * (gt_boxes[:, 1] - boxes[:, 1]) / ex_heights,
                          wy * (gt_boxes[:, 3] - boxes[:, 3]) / ex_heights)).transpose()
    ex_ctr_x = boxes[:, 0] + 0.5 * ex_widths
    ex_ctr_y = boxes[:, 1] + 0.5 * ex_heights
    gt_widths = gt_boxes[:, 2] - gt_boxes[:, 0] + 1.0
    gt_heights = gt_boxes[:, 3] - gt_boxes[:, 1] + 1.0
    gt_ctr_x = gt_boxes[:, 0] + 0.5 * gt_widths
    gt_ctr_y = gt_boxes[:, 1] + 0.5 * gt_heights
    return np.vstack((wx * (gt_ctr_x - ex_ctr_x) / ex_widths,
                      wy * (gt_ctr_y - ex_ctr_y) / ex_heights,
                      ww * np.log(gt_widths / ex_widths),
                      wh * np.log(gt_heights / ex_heights))).transpose()
