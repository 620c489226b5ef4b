"""Draw detections on images (Detectron's vis_one_image, with OpenCV instead of matplotlib)."""
import os

import cv2
import numpy as np
import pycocotools.mask as mask_util

from detectron.utils.keypoints import get_keypoints, kp_connections

_BOX_COLOR = (18, 127, 15)  # BGR, Detectron's green
_TEXT_COLOR = (218, 227, 218)
_MASK_ALPHA = 0.4  # Detectron's vis_mask blend
_MASK_BORDER_COLOR = (255, 255, 255)
# Detectron's colormap (utils/colormap.py) starts with these; masks cycle through them (BGR).
_MASK_COLORS = ((189, 114, 0), (25, 83, 217), (32, 177, 237), (142, 47, 126), (48, 172, 119), (238, 190, 77),
                (47, 20, 162))
_KP_THRESH = 2  # Detectron's vis_keypoints kp_thresh: a keypoint is drawn when its heatmap logit exceeds it


def convert_from_cls_format(cls_boxes):
    """cls_boxes[j] (N_j, 5) per class -> (boxes (N, 5), classes (N,)) over all classes j >= 1."""
    parts = [(np.asarray(b, np.float32).reshape(-1, 5), j) for j, b in enumerate(cls_boxes) if j > 0 and len(b)]
    if not parts:
        return np.zeros((0, 5), np.float32), np.zeros(0, np.int64)
    boxes = np.concatenate([b for b, _ in parts])
    classes = np.concatenate([np.full(len(b), j, np.int64) for b, j in parts])
    return boxes, classes


def convert_segms_from_cls_format(cls_segms):
    """cls_segms[j] RLE lists per class -> one list over all classes j >= 1 (convert_from_cls_format's order)."""
    return [rle for j, segms in enumerate(cls_segms) if j > 0 for rle in segms]


def vis_one_image(im, cls_boxes, class_names, thresh=0.5, cls_segms=None, cls_keyps=None, keypoint_names=None):
    """Return a copy of BGR `im` with each detection scoring >= thresh boxed and labelled, its mask
    (cls_segms, a model with masks) blended in and outlined as Detectron's vis_mask, its keypoints
    (cls_keyps, (4, K) per detection, named keypoint_names) drawn with their skeleton as vis_keypoints."""
    out = im.copy()
    boxes, classes = convert_from_cls_format(cls_boxes)
    segms = convert_segms_from_cls_format(cls_segms) if cls_segms is not None else None
    keyps = convert_segms_from_cls_format(cls_keyps) if cls_keyps is not None else None
    order = np.argsort(-boxes[:, 4], kind='stable')
    for rank, i in enumerate(order):
        x1, y1, x2, y2, score = boxes[i]
        if score < thresh:
            continue
        if segms is not None:
            _draw_mask(out, mask_util.decode(segms[i]), _MASK_COLORS[rank % len(_MASK_COLORS)])
        if keyps is not None:
            _draw_keypoints(out, np.asarray(keyps[i]), keypoint_names)
        p1, p2 = (int(round(x1)), int(round(y1))), (int(round(x2)), int(round(y2)))
        cv2.rectangle(out, p1, p2, _BOX_COLOR, 1)
        name = class_names[classes[i]] if class_names is not None else 'id{}'.format(classes[i])
        text = '{} {:.2f}'.format(name, score)
        (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.35, 1)
        top = max(p1[1] - th - 3, 0)
        cv2.rectangle(out, (p1[0], top), (p1[0] + tw + 2, top + th + 3), _BOX_COLOR, -1)
        cv2.putText(out, text, (p1[0] + 1, top + th + 1), cv2.FONT_HERSHEY_SIMPLEX, 0.35, _TEXT_COLOR, 1,
                    cv2.LINE_AA)
    return out


def _draw_mask(out, mask, color):
    """Blend color into out where mask is set and outline the mask (in place)."""
    inside = mask.astype(bool)
    out[inside] = (out[inside] * (1 - _MASK_ALPHA) + np.asarray(color) * _MASK_ALPHA).astype(np.uint8)
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_CCOMP, cv2.CHAIN_APPROX_NONE)
    cv2.drawContours(out, contours, -1, _MASK_BORDER_COLOR, 1, cv2.LINE_AA)


def _draw_keypoints(out, kps, names):
    """Detectron's vis_keypoints (in place): each skeleton edge (kp_connections) whose two keypoints'
    logits exceed _KP_THRESH as a line, each such keypoint as a dot. Without names, 17 keypoints are
    COCO's person keypoints."""
    if names is None:
        names = get_keypoints()[0] if kps.shape[1] == 17 else ['kp{}'.format(k) for k in range(kps.shape[1])]
    point = [(int(round(x)), int(round(y))) for x, y in zip(kps[0], kps[1])]
    shown = kps[2] > _KP_THRESH
    for n, (a, b) in enumerate(kp_connections(list(names))):
        if shown[a] and shown[b]:
            cv2.line(out, point[a], point[b], _MASK_COLORS[n % len(_MASK_COLORS)], 2, cv2.LINE_AA)
    for k in np.flatnonzero(shown):
        cv2.circle(out, point[k], 3, _MASK_BORDER_COLOR, -1, cv2.LINE_AA)


def write_vis_image(output_dir, image_path, im, cls_boxes, class_names, thresh, cls_segms=None, cls_keyps=None,
                    keypoint_names=None):
    """Write vis_one_image's drawing as <output_dir>/<image name>.png; returns that path."""
    out_path = os.path.join(output_dir, os.path.splitext(os.path.basename(image_path))[0] + '.png')
    cv2.imwrite(out_path, vis_one_image(im, cls_boxes, class_names, thresh, cls_segms=cls_segms, cls_keyps=cls_keyps,
                                        keypoint_names=keypoint_names))
    return out_path
