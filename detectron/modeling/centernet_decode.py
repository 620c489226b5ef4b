"""CenterNet (ctdet) decoding and test-time post-processing.

Follows CenterNet's models/decode.py (peak NMS, top-K, boxes), utils/post_process.py and
detectors/ctdet.py (inverse affine, flip test, multi-scale merge with soft-NMS). Decoding runs as
batched tensor ops on the model's device; post-processing is host-side numpy, as in the reference.
"""

import numpy as np
import torch
import torch.nn.functional as F

from detectron.ops import nms as nms_ops
from detectron.roi_data.centernet import affine_transform_points, get_affine_transform


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------

def _gather_feat(feat, ind):
    """feat (B, N, D), ind (B, M) -> (B, M, D): rows ind of each image."""
    return feat.gather(1, ind.unsqueeze(2).expand(ind.size(0), ind.size(1), feat.size(2)))


def transpose_and_gather_feat(feat, ind):
    """Map feat (B, C, H, W) read at flat positions ind (B, M) = y * W + x: (B, M, C)."""
    batch, channels = feat.shape[:2]
    return _gather_feat(feat.permute(0, 2, 3, 1).reshape(batch, -1, channels), ind)


def _peak_nms(heat, kernel=3):
    """Zero every score that is not the max of its kernel x kernel window (ties all survive)."""
    hmax = F.max_pool2d(heat, (kernel, kernel), stride=1, padding=(kernel - 1) // 2)
    return heat * (hmax == heat).to(heat.dtype)


def _topk(scores, K):
    """Top K per class over H*W, then top K of those C*K: (score, flat index y*W+x, class, y, x),
    each (B, K); class = candidate // K."""
    batch, cat, height, width = scores.shape
    class_scores, class_inds = torch.topk(scores.reshape(batch, cat, -1), K)
    topk_score, topk_ind = torch.topk(class_scores.reshape(batch, -1), K)
    topk_clses = torch.div(topk_ind, K, rounding_mode='floor')
    topk_inds = class_inds.reshape(batch, -1).gather(1, topk_ind)
    topk_ys = torch.div(topk_inds, width, rounding_mode='floor').float()
    topk_xs = (topk_inds % width).float()
    return topk_score, topk_inds, topk_clses, topk_ys, topk_xs


def ctdet_decode(heat, wh, reg=None, cat_spec_wh=False, K=100):
    """CenterNet's ctdet_decode: (B, K, 6) [x1, y1, x2, y2, score, class] in output-grid pixels.

    heat: sigmoid'd heatmaps (B, C, H, W); wh (B, 2, H, W) or (B, 2C, H, W) with cat_spec_wh;
    reg (B, 2, H, W) or None (centres then at x + 0.5, y + 0.5). 3x3 max-pool peak NMS, top K per
    class then overall, no score threshold: always K rows. Batched tensor ops, no host sync.
    """
    return _decode_positions(*_topk(_peak_nms(heat), K), wh, reg, cat_spec_wh)


def _decode_positions(scores, inds, clses, ys, xs, wh, reg, cat_spec_wh):
    """(B, K, 6) rows of the heat map positions (each (B, K), as _topk gives them)."""
    batch, K = scores.shape
    if reg is not None:
        reg = transpose_and_gather_feat(reg, inds)
        xs = xs.view(batch, K, 1) + reg[:, :, 0:1]
        ys = ys.view(batch, K, 1) + reg[:, :, 1:2]
    else:
        xs = xs.view(batch, K, 1) + 0.5
        ys = ys.view(batch, K, 1) + 0.5
    wh = transpose_and_gather_feat(wh, inds)
    if cat_spec_wh:
        class_pair = clses.view(batch, K, 1, 1).expand(batch, K, 1, 2)
        wh = wh.view(batch, K, -1, 2).gather(2, class_pair).view(batch, K, 2)
    half_w, half_h = wh[..., 0:1] / 2, wh[..., 1:2] / 2
    return torch.cat([xs - half_w, ys - half_h, xs + half_w, ys + half_h,
                      scores.view(batch, K, 1), clses.view(batch, K, 1).float()], dim=2)


def contested_peaks(heat, wh, reg=None, cat_spec_wh=False, tol=1e-3):
    """(1, N, 6) rows, as ctdet_decode's, of the positions of one image's heat map (1, C, H, W)
    whose peak test is decided by less than tol: within tol of the largest of their 3x3 neighbours,
    above or below it. A model whose scores differ from these by up to tol may keep any of them."""
    batch, cat, height, width = heat.shape
    windows = F.unfold(heat.reshape(batch * cat, 1, height, width), 3, padding=1)  # zero padding: heat > 0
    neighbours = torch.cat([windows[:, :4], windows[:, 5:]], 1).amax(1).view(batch, cat, height, width)
    _, classes, ys, xs = ((heat - neighbours).abs() <= tol).nonzero(as_tuple=True)
    inds = ys * width + xs
    return _decode_positions(heat[0, classes, ys, xs][None], inds[None], classes[None], ys[None].float(),
                             xs[None].float(), wh, reg, cat_spec_wh)


def ctdet_test_maps(outputs, flip_test=False, reg_offset=True):
    """(hm, wh, reg) for ctdet_decode from the heads' raw outputs of B images, or with flip_test of
    2B images where each image is followed by its mirrored copy (as prepare_test_image stacks them):
    hm = sigmoid (not clamped, as the reference's test); with flip_test hm and wh are averaged with
    the mirrored pass flipped back, reg is the unflipped pass's only (CenterNet does not average it).
    reg is None without reg_offset."""
    hm = outputs['hm'].sigmoid()
    wh = outputs['wh']
    reg = outputs['reg'] if reg_offset else None
    if flip_test:
        hm = (hm[0::2] + torch.flip(hm[1::2], [3])) / 2
        wh = (wh[0::2] + torch.flip(wh[1::2], [3])) / 2
        reg = reg[0::2] if reg is not None else None
    return hm, wh, reg


# ------------------------------------------------------------------------------------------------
# Post-processing (host side)
# ------------------------------------------------------------------------------------------------

def ctdet_post_process(dets, c, s, h, w, num_classes):
    """CenterNet's ctdet_post_process: decoded dets (B, K, 6) in output-grid pixels -> one dict per
    image {class + 1: float32 (n, 5) [x1, y1, x2, y2, score]} in input-image pixels, each class's
    rows in decode order.

    Both corners go through get_affine_transform(c[i], s[i], 0, (w, h), inv=1) and are stored back
    as float32 (dets are float32, as the decoder's output). c, s: per-image centres and scales
    (meta['c'], meta['s']); h, w: the output grid (meta['out_height'], meta['out_width']).
    """
    dets = np.asarray(dets, dtype=np.float32)
    return [_class_dict(split_by_class(_input_image_boxes(d, c[i], s[i], h, w), d[:, 5], num_classes))
            for i, d in enumerate(dets)]


def image_detections(dets, meta, scale):
    """One image's decoded dets (K, 6) (or (1, K, 6)) at test scale `scale`, with its meta from
    ctdet_test_inputs -> (boxes float32 (K, 5) [x1, y1, x2, y2, score] in original-image pixels,
    classes (K,) as decoded): ctdet_post_process, then the boxes divided by scale
    (CtdetDetector.post_process), before the split into classes."""
    dets = np.asarray(dets, dtype=np.float32).reshape(-1, 6)
    boxes = _input_image_boxes(dets, meta['c'], meta['s'], meta['out_height'], meta['out_width'])
    boxes[:, :4] /= scale
    return boxes, dets[:, 5]


def _input_image_boxes(dets, c, s, h, w):
    """Decoded dets (K, 6) of one image -> float32 (K, 5) [x1, y1, x2, y2, score], both corners
    through the inverse affine of (c, s) and the (w, h) output grid."""
    trans = _inverse_affine(c, s, w, h)
    boxes = np.empty((dets.shape[0], 5), dtype=np.float32)
    boxes[:, :4] = _affine_corners(dets[:, :4], trans)
    boxes[:, 4] = dets[:, 4]
    return boxes


# get_affine_transform(c, s, 0, (w, h), inv=1) by its arguments' values: a test set has few image
# sizes, and cv2's solve costs about a third of an image's host post-processing.
_INVERSE_AFFINES = {}
_MAX_INVERSE_AFFINES = 4096


def _inverse_affine(c, s, w, h):
    """get_affine_transform(c, s, 0, (w, h), inv=1), the same array for the same values (read-only)."""
    c, s = np.asarray(c), np.asarray(s)
    key = (c.dtype.str, c.shape, c.tobytes(), s.dtype.str, s.shape, s.tobytes(), w, h)
    trans = _INVERSE_AFFINES.get(key)
    if trans is None:
        if len(_INVERSE_AFFINES) >= _MAX_INVERSE_AFFINES:
            _INVERSE_AFFINES.clear()
        trans = get_affine_transform(c, s, 0, (w, h), inv=1)
        trans.flags.writeable = False
        _INVERSE_AFFINES[key] = trans
    return trans


def _affine_corners(corners, trans):
    """Both points of each row of float32 corners (N, 4) through the 2x3 affine trans: float64 (N, 4),
    bit for bit CenterNet's one np.dot per point (see affine_transform_points)."""
    return affine_transform_points(corners.reshape(-1, 2), trans).reshape(-1, 4)


def split_by_class(rows, classes, num_classes):
    """[rows of class j, in their order, for j in 0..num_classes - 1]: what rows[classes == j] gives
    for each j (rows of any other class value are left out), from one stable sort by class.
    The arrays are views of one copy of rows."""
    order = np.argsort(classes, kind='stable')
    sorted_classes = classes[order]
    rows = rows[order]
    ids = np.arange(num_classes, dtype=sorted_classes.dtype)
    starts = np.searchsorted(sorted_classes, ids, side='left').tolist()
    ends = np.searchsorted(sorted_classes, ids, side='right').tolist()
    return [rows[a:b] for a, b in zip(starts, ends)]


def _class_dict(per_class):
    return {j + 1: rows for j, rows in enumerate(per_class)}


def gaussian_soft_nms_(boxes, sigma=0.5, threshold=0.001):
    """CenterNet's external/nms.pyx soft_nms with method 2 (Gaussian), IN PLACE on float32 boxes
    (N, 5) [x1, y1, x2, y2, score] (C-contiguous); returns the number of live rows n.

    Detectron's compiled soft-NMS kernel (ops/nms.soft_nms_, lib/cython_nms.pyx), whose arithmetic
    is CenterNet's (float32 storage, +1 sides and unions in double, exp in double), run in place:
    rows [n, N) are left as the kernel left them, which is what CenterNet's merge_outputs keeps,
    since it ignores the returned keep list: stale copies of moved rows (with the score they had
    before that step) and the last discarded one.
    """
    return nms_ops.soft_nms_(boxes, sigma=sigma, score_thresh=threshold, method='gaussian')


def merge_outputs(detections, num_classes, max_per_image=100, use_soft_nms=False):
    """CtdetDetector.merge_outputs: per-scale results [{class + 1: (n, 5)}] -> one dict.

    Per class the scales are concatenated (float32); with use_soft_nms (CenterNet: more than one
    test scale, or --nms) Gaussian soft-NMS (sigma 0.5, threshold 0.001) runs in place and its
    keep list is ignored as in the reference, so stale tail rows stay (gaussian_soft_nms_). Then
    over all classes only scores >= the max_per_image-th best are kept (ties may keep more).
    """
    results = {}
    for j in range(1, num_classes + 1):
        results[j] = np.concatenate([d[j] for d in detections], axis=0).astype(np.float32)
        if use_soft_nms:
            gaussian_soft_nms_(results[j])
    thresh = _cap_threshold(np.hstack([results[j][:, 4] for j in range(1, num_classes + 1)]), max_per_image)
    if thresh is not None:
        for j in range(1, num_classes + 1):
            results[j] = results[j][results[j][:, 4] >= thresh]
    return results


def merge_image_detections(per_scale, num_classes, max_per_image=100, use_soft_nms=False):
    """to_cls_boxes(merge_outputs(...)) of one image from its per-scale (boxes, classes) pairs
    (image_detections), the same arrays.

    Without soft-NMS nothing needs per-class arrays before the end: concatenating each class over
    the scales is one stable sort by class of all the scales' rows, and the cap does not depend on
    the order of the scores.
    """
    if use_soft_nms:
        detections = [_class_dict(split_by_class(boxes, classes, num_classes)) for boxes, classes in per_scale]
        return to_cls_boxes(merge_outputs(detections, num_classes, max_per_image, use_soft_nms=True), num_classes)
    boxes = np.concatenate([b for b, _ in per_scale]) if len(per_scale) > 1 else per_scale[0][0]
    classes = np.concatenate([c for _, c in per_scale]) if len(per_scale) > 1 else per_scale[0][1]
    if len(boxes) > max_per_image:
        # Only the rows split_by_class keeps take part in the cap, as in merge_outputs.
        counted = np.isin(classes, np.arange(num_classes))
        thresh = _cap_threshold(boxes[counted, 4], max_per_image)
        if thresh is not None:
            keep = boxes[:, 4] >= thresh
            boxes, classes = boxes[keep], classes[keep]
    return [_no_boxes()] + split_by_class(boxes, classes, num_classes)


def _cap_threshold(scores, max_per_image):
    """The max_per_image-th best of scores, or None when there are no more than max_per_image."""
    if len(scores) <= max_per_image:
        return None
    kth = len(scores) - max_per_image
    return np.partition(scores, kth)[kth]


def _no_boxes():
    return np.zeros((0, 5), dtype=np.float32)


def to_cls_boxes(results, num_classes):
    """Detectron's cls_boxes from a {class + 1: (n, 5)} dict: index 0 (background) an empty
    (0, 5) float32 array, index j the detections of class j - 1 as float32 (n, 5)."""
    return [_no_boxes()] + [
        np.asarray(results.get(j, np.zeros((0, 5))), dtype=np.float32).reshape(-1, 5)
        for j in range(1, num_classes + 1)]
