"""Keypoint R-CNN inference on one image: the keypoint head run on the final detections (Detectron's
`im_detect_keypoints`) and its heatmaps turned into keypoints (Detectron's `keypoint_results`).

Plain-argument versions: rcnn_inference.im_detect_all calls these on the boxes left after NMS /
soft-NMS / variance voting, as it does for masks.
"""
from dataclasses import dataclass

import numpy as np
import torch

from detectron.utils import keypoints as keypoint_utils

_NMS_OKS_THRESH = 0.3  # Detectron's keypoint_results


@dataclass(frozen=True)
class KeypointInferenceParams:
    """KRCNN.INFERENCE_MIN_SIZE and KRCNN.NMS_OKS."""
    inference_min_size: int = 0
    nms_oks: bool = False


def detect_keypoint_heatmaps(model, features, boxes, im_scale):
    """Heatmap logits (R, K, M, M) float32 of the detections `boxes` (R, 4) (original-image
    coordinates, on the features' device): model.keypoint_logits on the boxes scaled to the network
    input (Detectron's `_get_rois_blob`). `features`: the FPN maps of the same forward."""
    rois = torch.cat([boxes.new_zeros(len(boxes), 1), (boxes.double() * im_scale).float()], dim=1)
    return model.keypoint_logits(features, rois).float()


def keypoint_results(cls_boxes, heatmaps, ref_boxes, params):
    """Detectron's `keypoint_results` -> (cls_boxes, cls_keyps): cls_keyps[j][k] the (4, K) float32
    (x, y, logit, prob) keypoints (heatmaps_to_keypoints) of detection cls_boxes[j][k].

    heatmaps (R, K, M, M) and ref_boxes (R, 4) in cls_boxes' order (class by class). With
    params.nms_oks, Detectron's OKS NMS at 0.3 over all detections (a person-only model: the
    builder allows it with 2 classes and COCO's 17 keypoints) drops detections from cls_boxes too."""
    xy_preds = keypoint_utils.heatmaps_to_keypoints(heatmaps, ref_boxes, params.inference_min_size)
    counts = [len(b) for b in cls_boxes]
    if params.nms_oks and len(xy_preds):
        keep = np.zeros(len(xy_preds), dtype=bool)
        keep[keypoint_utils.nms_oks(xy_preds, ref_boxes, _NMS_OKS_THRESH, keypoint_utils.COCO_OKS_SIGMAS)] = True
        starts = np.cumsum([0] + counts[:-1])
        cls_boxes = [b[keep[s:s + n]] for b, s, n in zip(cls_boxes, starts, counts)]
        xy_preds = xy_preds[keep]
        counts = [len(b) for b in cls_boxes]
    ends = np.cumsum(counts)
    cls_keyps = [list(xy_preds[end - n:end]) for n, end in zip(counts, ends)]
    return cls_boxes, cls_keyps
