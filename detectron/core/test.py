"""Inference on one image by a model of the model type it is handed (Detectron's core/test.py API).

`im_detect_all` runs a model of the model type it is handed and returns Detectron's `cls_boxes`
(with `cls_segms` beside them for a Mask R-CNN, and `cls_keyps` for a Keypoint R-CNN). `im_detect_bbox`,
`im_detect_bbox_aug`, `im_detect_mask_aug`, `im_detect_keypoints_aug`, `box_results_with_nms_and_limit`, `segm_results` and
`keypoint_results` are Detectron's R-CNN functions of those names (with KL-Loss's variance voting when
STD_NMS), with the model type as their first argument: they take their settings from the cfg the model type
is bound to (model_type.cfg), not the global one, and call the plain-argument implementations in
detectron/modeling/rcnn_inference.py, mask_inference.py and keypoint_inference.py.
"""
import dataclasses

import numpy as np

import torch

from detectron.modeling import (keypoint_inference, keypoint_rcnn_builder, mask_inference, rcnn_builder, rcnn_checks,
                                rcnn_inference, test_time_aug)
from detectron.utils.errors import ConfigValueError


def im_detect_all(model_type, model, im):
    """`cls_boxes` of one BGR image (H, W, 3) by model, a model of model_type: cls_boxes[j] is a
    float32 (N_j, 5) array (x1, y1, x2, y2, score) for class j >= 1; class 0 is empty. A model with
    masks returns (cls_boxes, cls_segms), cls_segms[j][k] the COCO RLE of detection cls_boxes[j][k]; a model
    with keypoints (cls_boxes, cls_segms or None, cls_keyps), cls_keyps[j][k] its (4, K) keypoints."""
    return model_type.detector()(model, model_type.test_inputs()(im))


def im_detect_bbox(model_type, model, im, target_scale, target_max_size, boxes=None):
    """Detectron's `im_detect_bbox`: run a Faster R-CNN (a model of model_type) on one BGR image at
    one scale, with the rest of the image and decode settings of model_type.cfg.

    Returns, as KL-Loss's: numpy `scores` (R, K), `pred_boxes` (R, 4K) decoded and clipped to the
    original image and `im_scale`, and with STD_NMS a fourth, `confs` (R, 4K): float32 sigmas =
    exp(alpha / 2) in the head's delta layout. `boxes` (R, 4): a Fast R-CNN's precomputed proposals in the
    image's coordinates (deduplicated at DEDUP_BOXES as Detectron; the rows are those of boxes).
    """
    cfg = model_type.cfg
    if boxes is not None and rcnn_checks.has_rpn(cfg):
        raise ConfigValueError('im_detect_bbox got boxes (precomputed proposals), which only a Fast R-CNN '
                               '(MODEL.FASTER_RCNN False) takes: a model with an RPN makes its own; call it without boxes')
    proposals = {} if boxes is None else {'proposals': boxes, 'dedup_boxes': cfg.DEDUP_BOXES}
    image_params = dataclasses.replace(rcnn_builder.image_params(cfg), scale=target_scale, max_size=target_max_size)
    scores, pred_boxes, confs, im_scale = rcnn_inference.detect_boxes(
        model, im, image_params, rcnn_builder.decode_params(cfg), **rcnn_builder.test_graphs(cfg), **proposals)
    if confs is None:
        return scores.cpu().numpy(), pred_boxes.cpu().numpy(), im_scale
    return scores.cpu().numpy(), pred_boxes.cpu().numpy(), im_scale, confs.cpu().numpy()


def im_detect_bbox_aug(model_type, model, im, box_proposals=None):
    """Detectron's `im_detect_bbox_aug`: im_detect_bbox's results (numpy; sigmas fourth with STD_NMS)
    under TEST.BBOX_AUG's augmentations combined by its heuristics (modeling/test_time_aug.py); box_proposals
    (R, 4): a Fast R-CNN's precomputed proposals in the image's coordinates, as im_detect_bbox's boxes."""
    cfg = model_type.cfg
    if (box_proposals is not None) == rcnn_checks.has_rpn(cfg):
        raise ConfigValueError('im_detect_bbox_aug takes box_proposals (precomputed proposals) for a Fast R-CNN '
                               '(MODEL.FASTER_RCNN False) and only for it: a model with an RPN makes its own')
    proposals = {} if box_proposals is None else {'proposals': box_proposals, 'dedup_boxes': cfg.DEDUP_BOXES}
    scores, boxes, confs, im_scale, _ = test_time_aug.im_detect_bbox_aug(
        model, im, rcnn_builder.image_params(cfg), rcnn_builder.decode_params(cfg), rcnn_builder.box_aug(cfg),
        **rcnn_builder.test_graphs(cfg), **proposals)
    if confs is None:
        return scores.cpu().numpy(), boxes.cpu().numpy(), im_scale
    return scores.cpu().numpy(), boxes.cpu().numpy(), im_scale, confs.cpu().numpy()


def im_detect_mask_aug(model_type, model, im, boxes, classes):
    """Detectron's `im_detect_mask_aug` for the detections boxes (R, 4) of classes (R,): soft masks
    (R, M, M) at each detection's class channel under TEST.MASK_AUG's augmentations, combined by its HEUR."""
    cfg = model_type.cfg
    device = rcnn_inference.model_device(model)
    masks = test_time_aug.im_detect_mask_aug(
        model, im, torch.as_tensor(boxes, device=device), torch.as_tensor(classes, device=device),
        rcnn_builder.image_params(cfg), rcnn_builder.mask_aug(cfg), **rcnn_builder.test_graphs(cfg))
    return masks.cpu().numpy()


def im_detect_keypoints_aug(model_type, model, im, boxes):
    """Detectron's `im_detect_keypoints_aug` for the detections boxes (R, 4): heatmap logits (R, K, M, M) under
    TEST.KPS_AUG's augmentations, combined by its HEUR (and SCALE_SIZE_DEP)."""
    cfg = model_type.cfg
    device = rcnn_inference.model_device(model)
    heatmaps = test_time_aug.im_detect_keypoints_aug(
        model, im, torch.as_tensor(boxes, device=device), rcnn_builder.image_params(cfg),
        keypoint_rcnn_builder.kps_aug(cfg), **rcnn_builder.test_graphs(cfg))
    return heatmaps.cpu().numpy()


def box_results_with_nms_and_limit(model_type, scores, boxes, confs=None):
    """Detectron's `box_results_with_nms_and_limit` (KL-Loss version) with the TEST settings of
    model_type.cfg; see rcnn_inference.box_results_with_nms_and_limit. Returns (scores, boxes, cls_boxes)."""
    return rcnn_inference.box_results_with_nms_and_limit(scores, boxes, confs, rcnn_builder.nms_params(model_type.cfg))


def segm_results(model_type, cls_boxes, masks, ref_boxes, im_h, im_w):
    """Detectron's `segm_results`: per-class lists of COCO RLEs of the soft masks (R, C, M, M) of
    the detections ref_boxes (R, 4), listed class by class as in cls_boxes, pasted into the im_h x
    im_w image (each box's class channel with MRCNN.CLS_SPECIFIC_MASK, else channel 0, binarised
    at MRCNN.THRESH_BINARIZE; both of model_type.cfg)."""
    cfg = model_type.cfg
    masks = np.asarray(masks)
    classes = np.repeat(np.arange(len(cls_boxes)), [len(b) for b in cls_boxes])
    channels = classes if cfg.MRCNN.CLS_SPECIFIC_MASK else np.zeros_like(classes)
    return mask_inference.segm_results(cls_boxes, masks[np.arange(len(masks)), channels], ref_boxes, im_h, im_w,
                                       cfg.MRCNN.THRESH_BINARIZE)


def keypoint_results(model_type, cls_boxes, pred_heatmaps, ref_boxes):
    """Detectron's `keypoint_results`: cls_keyps, per class the (4, K) (x, y, logit, prob) keypoints of the
    detections ref_boxes (R, 4), listed class by class as in cls_boxes, from their heatmap logits
    pred_heatmaps (R, K, M, M), with KRCNN.INFERENCE_MIN_SIZE and KRCNN.NMS_OKS of model_type.cfg (OKS NMS
    drops detections from cls_boxes in place, as Detectron's)."""
    kept, cls_keyps = keypoint_inference.keypoint_results(cls_boxes, pred_heatmaps, ref_boxes,
                                                          keypoint_rcnn_builder.keypoint_params(model_type.cfg))
    cls_boxes[:] = kept
    return cls_keyps
