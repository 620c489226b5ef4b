"""Mask R-CNN inference on one image: the mask head run on the final detections (Detectron's
`im_detect_mask`) and its M x M masks pasted into the image as COCO RLEs (Detectron's `segm_results`).

Plain-argument versions: core/test.py keeps the Detectron-named wrappers that read cfg, and
rcnn_inference.im_detect_all calls these on the boxes left after NMS / soft-NMS / variance voting
(as KL-Loss's core/test.py computes masks on the voted boxes).
"""
import cv2
import numpy as np
import pycocotools.mask as mask_util
import torch

from detectron.utils import boxes as box_utils


def detect_masks(model, features, boxes, classes, im_scale):
    """Soft masks (R, M, M) float32 of the detections `boxes` (R, 4) (original-image coordinates,
    a tensor on the features' device) of `classes` (R,): model.mask_logits on the boxes scaled to
    the network input (Detectron's `_get_rois_blob`), then the sigmoid of each box's class channel
    (channel 0 of a class-agnostic head). `features`: the FPN maps of the same forward."""
    # Scaled in float64, then float32, as Detectron's _project_im_rois and rois blob.
    rois = torch.cat([boxes.new_zeros(len(boxes), 1), (boxes.double() * im_scale).float()], dim=1)
    logits = model.mask_logits(features, rois)
    channels = classes if logits.shape[1] > 1 else torch.zeros_like(classes)
    return torch.sigmoid(logits[torch.arange(len(boxes), device=logits.device), channels].float())


def segm_results(cls_boxes, masks, ref_boxes, im_h, im_w, thresh_binarize):
    """Detectron's `segm_results` for masks already taken at each box's class channel: per-class
    lists of RLEs (cls_segms[j][k] belongs to cls_boxes[j][k]; class 0 empty).

    masks (R, M, M) and ref_boxes (R, 4) in cls_boxes' order (class by class); im_h, im_w: the
    original image size."""
    rles = paste_masks(masks, ref_boxes, im_h, im_w, thresh_binarize)
    ends = np.cumsum([len(b) for b in cls_boxes])
    if ends[-1] != len(rles):
        raise ValueError(f'{len(rles)} masks for {ends[-1]} detections')
    return [rles[end - len(b):end] for b, end in zip(cls_boxes, ends)]


def paste_masks(masks, ref_boxes, im_h, im_w, thresh_binarize):
    """One COCO RLE of the image per soft mask, pasted as Detectron does: the M x M mask
    zero-padded by one pixel (no border "top hat" from cv2.resize), its box grown by (M + 2) / M
    and truncated to int32, cv2.resize of the padded mask to that box's inclusive size, values
    > thresh_binarize kept, the part inside the image placed there.

    The RLE is built from the box's columns alone (the rest of the image is zeros), which equals
    pycocotools' encoding of the whole image mask without filling one per detection."""
    masks = np.asarray(masks, dtype=np.float32)
    m = masks.shape[-1]
    boxes = box_utils.expand_boxes(np.asarray(ref_boxes, dtype=np.float32), (m + 2.0) / m).astype(np.int32)
    padded = np.zeros((m + 2, m + 2), dtype=np.float32)
    rles = []
    for mask, box in zip(masks, boxes):
        padded[1:-1, 1:-1] = mask
        w = max(box[2] - box[0] + 1, 1)
        h = max(box[3] - box[1] + 1, 1)
        binary = (cv2.resize(padded, (int(w), int(h))) > thresh_binarize).astype(np.uint8)
        x0, x1 = max(box[0], 0), min(box[2] + 1, im_w)
        y0, y1 = max(box[1], 0), min(box[3] + 1, im_h)
        inside = binary[y0 - box[1]:y1 - box[1], x0 - box[0]:x1 - box[0]] if x1 > x0 and y1 > y0 else None
        rles.append(_encode_window(inside, int(x0), int(y0), im_h, im_w))
    return rles


def _encode_window(window, x0, y0, im_h, im_w):
    """pycocotools' compressed RLE of an im_h x im_w mask that is zero outside `window` (placed at
    column x0, row y0; None when the box lies outside the image)."""
    boundaries = []
    if window is not None and window.any():
        # The window's columns, each between a zero row above and below (the image is zero there,
        # and between one column's end and the next one's start): every value change in this
        # column-major order is one in the whole image's, at the same pixel.
        h = window.shape[0]
        columns = np.zeros((window.shape[1], h + 2), dtype=np.uint8)
        columns[:, 1:-1] = window.T
        flat = columns.ravel()
        changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
        column, row = np.divmod(changes, h + 2)
        pixels, repeats = np.unique((x0 + column) * im_h + (y0 - 1 + row), return_counts=True)
        # A column ending on the image's last row and the next one starting on its first row meet
        # at the same pixel (no change there); the image ends after its last pixel.
        boundaries = pixels[(repeats == 1) & (pixels < im_h * im_w)].tolist()
    runs = np.diff([0] + boundaries + [im_h * im_w]).tolist()
    return mask_util.frPyObjects({'counts': runs, 'size': [im_h, im_w]}, im_h, im_w)
