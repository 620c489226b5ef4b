"""The PASCAL VOC devkit's AP in Python, as Detectron's datasets/voc_eval.py computes it: detections of
one class (a results file of `<image> <score> <x1> <y1> <x2> <y2>` lines, 1-based) matched greedily in
descending score order to the ground truth of the devkit's xml annotations at IoU > 0.5 (+1 widths);
a detection on a `difficult` object counts neither way, a second one on a found object is a false
positive. AP is VOC2007's 11-point interpolation or, from VOC2010 on, the area under the precision
envelope (`voc_ap`'s use_07_metric)."""
import xml.etree.ElementTree as ET

import numpy as np


def parse_rec(filename):
    """The objects of one VOC xml annotation: dicts with name, difficult (int) and bbox [x1, y1, x2, y2]
    (the devkit's 1-based integer pixels)."""
    objects = []
    for obj in ET.parse(filename).findall('object'):
        box = obj.find('bndbox')
        objects.append({'name': obj.findtext('name'), 'difficult': int(obj.findtext('difficult', '0')),
                        'bbox': [int(float(box.findtext(k))) for k in ('xmin', 'ymin', 'xmax', 'ymax')]})
    return objects


def voc_ap(rec, prec, use_07_metric=False):
    """AP of a precision / recall curve: VOC2007's mean of the best precision at recall >= 0, 0.1, ...,
    1 (use_07_metric), else the area under the precision envelope, summed where the recall changes."""
    if use_07_metric:
        return sum(np.max(prec[rec >= t]) if np.any(rec >= t) else 0.0 for t in np.arange(0.0, 1.1, 0.1)) / 11.0
    recall = np.concatenate(([0.0], rec, [1.0]))
    envelope = np.maximum.accumulate(np.concatenate(([0.0], prec, [0.0]))[::-1])[::-1]
    steps = np.flatnonzero(recall[1:] != recall[:-1])
    return np.sum((recall[steps + 1] - recall[steps]) * envelope[steps + 1])


def voc_eval(detpath, annopath, imagesetfile, classname, ovthresh=0.5, use_07_metric=False):
    """(rec, prec, ap) of class `classname`: its detections in detpath.format(classname), the images of
    imagesetfile (one name a line), their annotations in annopath.format(image name)."""
    with open(imagesetfile) as f:
        image_names = [line.strip() for line in f]
    gt = {}
    npos = 0
    for name in image_names:
        objects = [o for o in parse_rec(annopath.format(name)) if o['name'] == classname]
        difficult = np.array([o['difficult'] for o in objects], dtype=bool)
        gt[name] = {'bbox': np.array([o['bbox'] for o in objects], dtype=float).reshape(-1, 4),
                    'difficult': difficult, 'found': np.zeros(len(objects), dtype=bool)}
        npos += int(np.sum(~difficult))
    image_ids, scores, boxes = _read_detections(detpath.format(classname))
    order = np.argsort(-scores)  # the devkit's (unstable) sort, so equal scores tie as in Detectron
    tp, fp = np.zeros(len(order)), np.zeros(len(order))
    for d, k in enumerate(order):
        truth = gt[image_ids[k]]
        overlaps = _overlaps(boxes[k], truth['bbox'])
        if overlaps.size == 0 or overlaps.max() <= ovthresh:
            fp[d] = 1.0
            continue
        j = int(np.argmax(overlaps))
        if truth['difficult'][j]:
            continue
        if truth['found'][j]:
            fp[d] = 1.0
        else:
            tp[d] = 1.0
            truth['found'][j] = True
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    rec = tp / float(npos)
    # The floor keeps a first detection on a difficult object from dividing by zero.
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return rec, prec, voc_ap(rec, prec, use_07_metric)


def _read_detections(path):
    with open(path) as f:
        fields = [line.strip().split(' ') for line in f if line.strip()]
    image_ids = [x[0] for x in fields]
    scores = np.array([float(x[1]) for x in fields])
    boxes = np.array([[float(v) for v in x[2:6]] for x in fields]).reshape(-1, 4)
    return image_ids, scores, boxes


def _overlaps(box, gt_boxes):
    """IoU of one box with each gt box, +1 widths."""
    iw = np.maximum(np.minimum(gt_boxes[:, 2], box[2]) - np.maximum(gt_boxes[:, 0], box[0]) + 1.0, 0.0)
    ih = np.maximum(np.minimum(gt_boxes[:, 3], box[3]) - np.maximum(gt_boxes[:, 1], box[1]) + 1.0, 0.0)
    inters = iw * ih
    union = ((box[2] - box[0] + 1.0) * (box[3] - box[1] + 1.0)
             + (gt_boxes[:, 2] - gt_boxes[:, 0] + 1.0) * (gt_boxes[:, 3] - gt_boxes[:, 1] + 1.0) - inters)
    return inters / union
