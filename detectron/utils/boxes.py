"""Box utilities with Detectron's legacy numerics.

Boxes are (x1, y1, x2, y2) in pixels and, as in Detectron, a box's width is x2 - x1 + 1 (its
height y2 - y1 + 1): coordinates started life as integer pixel indices, and Detectron-trained
weights expect every area, IoU and regression target computed this way.

Each box formula has one implementation, written in torch (the `*_t` functions, used by the model
on CPU or GPU tensors). Detectron's numpy API (`bbox_transform`, `clip_tiled_boxes`, ...) keeps its
names and behaviour and wraps those functions: numpy in, numpy out, in the input's float dtype
(integer input is computed in float32). The IoU matrix of the numpy API is Detectron's compiled
kernel (detectron.utils.cython_bbox); greedy NMS, soft-NMS and their dispatch are ops/nms.py.

Box coding: Detectron codes a box by centre and log size; KL-Loss (cfg.XYXY) codes it by the
offsets of its four edges. `bbox_transform` and `bbox_transform_inv` take the coding as their
`xyxy=` argument; the builders pass cfg.XYXY, which in KL-Loss switches the coding of the RPN and
of the Fast R-CNN head together.
"""
import math

import numpy as np
import torch

from detectron.utils import cython_bbox

# (N, 4) x (K, 4) IoU matrix, Detectron's compiled kernel (float32).
bbox_overlaps = cython_bbox.bbox_overlaps

# Defaults of cfg.BBOX_XFORM_CLIP (upper clamp of the log-size deltas) and KL-Loss'
# cfg.BBOX_XFORM_CLIPe (symmetric clamp of the edge deltas): both keep a box below 1000 px when
# decoded against a 16 px reference box.
DEFAULT_XFORM_CLIP = math.log(1000.0 / 16.0)
DEFAULT_XFORM_CLIP_XYXY = 1000.0 / 16.0


# ---------------------------------------------------------------------------------------------
# torch implementation
# ---------------------------------------------------------------------------------------------

def _sides_t(boxes):
    """+1 widths and heights of (..., 4) boxes."""
    return boxes[..., 2] - boxes[..., 0] + 1.0, boxes[..., 3] - boxes[..., 1] + 1.0


def boxes_area_t(boxes):
    """(N,) areas (x2 - x1 + 1) * (y2 - y1 + 1) of (N, 4) boxes; inverted boxes give signed areas."""
    widths, heights = _sides_t(boxes)
    return widths * heights


def box_iou_t(boxes_a, boxes_b):
    """(N, K) IoU of (N, 4) boxes with (K, 4) query boxes (+1 sides), bit for bit Detectron's
    bbox_overlaps(boxes_a, boxes_b) on float32 boxes.

    Its Cython `... + 1` compiles to `+ 1.0`, a double: each +1 side is formed in double from
    the float32 coordinate difference; a query box's area and the intersection's sides are then
    rounded to float32, a box's area and the union stay double until the union is stored as
    float32; the intersection (side times side) and the quotient are float32 (all float32 steps,
    as torch's, were 1-2 ulp apart on a few pairs in a hundred). Pairs without a positive
    intersection width and height get 0.
    """
    return box_iou_pairs_t(boxes_a[:, None], boxes_b[None])


def box_iou_pairs_t(boxes_a, boxes_b):
    """box_iou_t's IoU of the pairs of broadcast (..., 4) boxes boxes_a and query boxes boxes_b
    (the same arithmetic: Detectron's soft-NMS computes its IoUs this way too)."""
    single = boxes_a.dtype
    width_a, height_a = _double_sides_t(boxes_a)
    width_b, height_b = _double_sides_t(boxes_b)
    area_b = (width_b * height_b).to(single)
    inter_w = _double_plus_one(torch.minimum(boxes_a[..., 2], boxes_b[..., 2])
                               - torch.maximum(boxes_a[..., 0], boxes_b[..., 0])).to(single)
    inter_h = _double_plus_one(torch.minimum(boxes_a[..., 3], boxes_b[..., 3])
                               - torch.maximum(boxes_a[..., 1], boxes_b[..., 1])).to(single)
    inter = inter_w * inter_h
    # All pairs: in-place steps (each exact in double) keep one double matrix alive at a time.
    union = ((width_a * height_a) + area_b).sub_(inter).to(single)
    overlapping = (inter_w > 0) & (inter_h > 0)
    return torch.where(overlapping, inter / torch.where(overlapping, union, 1.0), 0.0)


def _double_plus_one(difference):
    return difference.to(torch.float64).add_(1.0)


def _double_sides_t(boxes):
    """+1 widths and heights in double of (..., 4) boxes (from their own-dtype differences)."""
    return _double_plus_one(boxes[..., 2] - boxes[..., 0]), _double_plus_one(boxes[..., 3] - boxes[..., 1])


def clip_tiled_boxes_t(boxes, height, width):
    """Clip (..., 4k) boxes to the image: x to [0, width - 1], y to [0, height - 1].

    height and width may be numbers or tensors that broadcast against boxes[..., :1] (e.g. a row
    of im_info, or a column of them viewed as (B, 1, 1) for (B, k, 4) boxes; kept on the device: no
    host sync). Returns a new tensor.
    """
    if boxes.shape[-1] % 4 != 0:
        raise ValueError(f'boxes must have 4k columns (x1, y1, x2, y2 per box), got shape {tuple(boxes.shape)}')
    # Upper bound first, then 0, in Detectron's order. Columns alternate x, y.
    x = boxes[..., 0::2].clamp(max=width - 1).clamp(min=0)
    y = boxes[..., 1::2].clamp(max=height - 1).clamp(min=0)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def bbox_transform_t(boxes, deltas, weights, xyxy=False, clip=DEFAULT_XFORM_CLIP,
                     clip_xyxy=DEFAULT_XFORM_CLIP_XYXY):
    """Decode class-specific deltas (N, 4k) against reference boxes (N, 4) -> (N, 4k) boxes.

    Deltas are divided by weights = (wx, wy, ww, wh) first.
    Detectron coding (xyxy=False), per class (dx, dy, dw, dh): centre cx = x1 + 0.5 w moves by
    dx * w, the width becomes exp(min(dw, clip)) * w, and x2 = cx' + 0.5 w' - 1 (the -1 undoes +1).
    KL-Loss edge coding (xyxy=True), per class the edge offsets (x1, x2, y1, y2), divided by
    (wx, wy, wx, wy) (ww and wh are unused, as in KL-Loss) and clamped to [-clip_xyxy, clip_xyxy]:
    x1' = x1 + d0 w, x2' = x2 + d1 w, y1' = y1 + d2 h, y2' = y2 + d3 h.
    Output columns are (x1, y1, x2, y2) per class, in deltas' dtype.
    """
    boxes = boxes.to(deltas.dtype)
    widths, heights = (side[:, None] for side in _sides_t(boxes))
    decode = _decode_edges_t if xyxy else _decode_center_size_t
    x1, y1, x2, y2 = decode(boxes, deltas, widths, heights, weights, clip_xyxy if xyxy else clip)
    return torch.stack((x1, y1, x2, y2), dim=2).reshape(deltas.shape)


def flip_boxes_t(boxes, im_width):
    """Mirror (N, 4k) boxes horizontally in an image of width im_width: x -> im_width - x - 1."""
    flipped = boxes.clone()
    flipped[:, 0::4] = im_width - boxes[:, 2::4] - 1
    flipped[:, 2::4] = im_width - boxes[:, 0::4] - 1
    return flipped


def aspect_ratio_t(boxes, aspect_ratio):
    """Scale the x coordinates of (N, 4k) boxes by aspect_ratio (width-relative transform)."""
    scaled = boxes.clone()
    scaled[:, 0::4] = aspect_ratio * boxes[:, 0::4]
    scaled[:, 2::4] = aspect_ratio * boxes[:, 2::4]
    return scaled


def divide(x, value):
    """x / value (a Python number) as numpy divides: CUDA kernels divide by a host scalar as a
    multiplication by its reciprocal, 1 ulp off in about a fifth of the values; a device scalar is
    divided by."""
    return x / torch.full((), value, dtype=x.dtype, device=x.device)


def exp(x):
    """exp rounded once to x's dtype (computed in float64): what numpy's float32 exp returned in
    Detectron's day (glibc's expf) in all but ~0.06% of values; torch's float32 exp is 1 ulp off
    in about 40%, and differently on the CPU and the GPU."""
    return torch.exp(x.double()).to(x.dtype)


def log(x):
    """log rounded once to x's dtype (computed in float64), for the same reason as exp: glibc
    2.36's logf (numpy's float32 log in Detectron's day) gave it in all but 0.5% of 2e5 values
    in 0.2..5, torch's float32 log on the CPU in all but 8% (and today's numpy in all but 17%
    on an AVX2 machine: its SIMD kernels round differently per CPU)."""
    return torch.log(x.double()).to(x.dtype)


def _decode_center_size_t(boxes, deltas, widths, heights, weights, clip):
    wx, wy, ww, wh = weights
    ctr_x = boxes[:, 0:1] + 0.5 * widths
    ctr_y = boxes[:, 1:2] + 0.5 * heights
    pred_ctr_x = divide(deltas[:, 0::4], wx) * widths + ctr_x
    pred_ctr_y = divide(deltas[:, 1::4], wy) * heights + ctr_y
    # Only growth is clamped, so that exp() cannot overflow.
    pred_w = exp(torch.clamp(divide(deltas[:, 2::4], ww), max=clip)) * widths
    pred_h = exp(torch.clamp(divide(deltas[:, 3::4], wh), max=clip)) * heights
    return (pred_ctr_x - 0.5 * pred_w, pred_ctr_y - 0.5 * pred_h,
            pred_ctr_x + 0.5 * pred_w - 1, pred_ctr_y + 0.5 * pred_h - 1)


def _decode_edges_t(boxes, deltas, widths, heights, weights, clip):
    wx, wy = weights[0], weights[1]
    edge_delta = lambda column, weight: torch.clamp(divide(deltas[:, column::4], weight), min=-clip, max=clip)
    return (edge_delta(0, wx) * widths + boxes[:, 0:1],
            edge_delta(2, wx) * heights + boxes[:, 1:2],
            edge_delta(1, wy) * widths + boxes[:, 2:3],
            edge_delta(3, wy) * heights + boxes[:, 3:4])


def bbox_transform_inv_t(boxes, gt_boxes, weights, xyxy=False):
    """Encode gt_boxes (N, 4) (or (1, 4), broadcast) against reference boxes (N, 4) -> (N, 4).

    Exact inverse of bbox_transform_t, with weights (wx, wy, ww, wh):
    Detectron: (wx (gcx - cx) / w, wy (gcy - cy) / h, ww log(gw / w), wh log(gh / h));
    KL-Loss edges: (wx (gx1 - x1) / w, wy (gx2 - x2) / w, wx (gy1 - y1) / h, wy (gy2 - y2) / h).
    """
    wx, wy, ww, wh = weights
    widths, heights = _sides_t(boxes)
    if xyxy:
        targets = (wx * (gt_boxes[:, 0] - boxes[:, 0]) / widths,
                   wy * (gt_boxes[:, 2] - boxes[:, 2]) / widths,
                   wx * (gt_boxes[:, 1] - boxes[:, 1]) / heights,
                   wy * (gt_boxes[:, 3] - boxes[:, 3]) / heights)
    else:
        gt_widths, gt_heights = _sides_t(gt_boxes)
        ctr_x = boxes[:, 0] + 0.5 * widths
        ctr_y = boxes[:, 1] + 0.5 * heights
        gt_ctr_x = gt_boxes[:, 0] + 0.5 * gt_widths
        gt_ctr_y = gt_boxes[:, 1] + 0.5 * gt_heights
        targets = (wx * (gt_ctr_x - ctr_x) / widths,
                   wy * (gt_ctr_y - ctr_y) / heights,
                   ww * log(gt_widths / widths),
                   wh * log(gt_heights / heights))
    return torch.stack(torch.broadcast_tensors(*targets), dim=1)


# ---------------------------------------------------------------------------------------------
# Detectron's numpy API
# ---------------------------------------------------------------------------------------------

def _to_tensor(array):
    """Zero-copy CPU tensor view of a numpy array; non-float input becomes float32."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if tensor.is_floating_point() else tensor.float()


def boxes_area(boxes):
    """Areas of (N, 4) boxes. Like KL-Loss, the absolute value (Detectron asserted >= 0)."""
    return np.abs(boxes_area_t(_to_tensor(boxes)).numpy())


def xywh_to_xyxy(xywh):
    """[x1, y1, w, h] -> [x1, y1, x2, y2] with x2 = x1 + max(0, w - 1).

    Accepts one box as a list/tuple (returns a tuple) or an (N, 4) array (returns an array).
    """
    if isinstance(xywh, (list, tuple)):
        return tuple(xywh_to_xyxy(np.array([_single_box(xywh)], dtype=float))[0].tolist())
    if isinstance(xywh, np.ndarray):
        return np.hstack((xywh[:, 0:2], xywh[:, 0:2] + np.maximum(0, xywh[:, 2:4] - 1)))
    raise TypeError(f'xywh_to_xyxy takes a list, tuple or numpy array, got {type(xywh).__name__}')


def xyxy_to_xywh(xyxy):
    """[x1, y1, x2, y2] -> [x1, y1, w, h] with w = x2 - x1 + 1; list/tuple or (N, 4) array."""
    if isinstance(xyxy, (list, tuple)):
        return tuple(xyxy_to_xywh(np.array([_single_box(xyxy)], dtype=float))[0].tolist())
    if isinstance(xyxy, np.ndarray):
        return np.hstack((xyxy[:, 0:2], xyxy[:, 2:4] - xyxy[:, 0:2] + 1))
    raise TypeError(f'xyxy_to_xywh takes a list, tuple or numpy array, got {type(xyxy).__name__}')


def _single_box(box):
    if len(box) != 4:
        raise ValueError(f'a single box needs 4 coordinates, got {len(box)}: {box!r}')
    return box


def filter_small_boxes(boxes, min_size):
    """Indices of the boxes whose +1 width and height both exceed min_size."""
    widths, heights = _sides_t(_to_tensor(boxes))
    return torch.nonzero((widths > min_size) & (heights > min_size)).flatten().numpy()


def clip_boxes_to_image(boxes, height, width):
    """Clip the (x1, y1, x2, y2) columns of boxes to the image, in place; returns boxes."""
    boxes[:, :4] = clip_tiled_boxes_t(_to_tensor(boxes[:, :4]), height, width).numpy()
    return boxes


def clip_xyxy_to_image(x1, y1, x2, y2, height, width):
    """Clip coordinates (numbers or same-shape arrays) to the image; returns (x1, y1, x2, y2)."""
    coords = np.stack(np.broadcast_arrays(x1, y1, x2, y2), axis=-1)
    if not np.issubdtype(coords.dtype, np.floating):
        coords = coords.astype(np.float64)
    clipped = clip_tiled_boxes_t(_to_tensor(coords), height, width).numpy()
    return tuple(clipped[..., i][()] for i in range(4))


def clip_tiled_boxes(boxes, im_shape):
    """Clip (N, 4k) boxes in place to an image of shape (height, width, ...); returns boxes."""
    boxes[...] = clip_tiled_boxes_t(_to_tensor(boxes), im_shape[0], im_shape[1]).numpy()
    return boxes


def bbox_transform(boxes, deltas, weights=(1.0, 1.0, 1.0, 1.0), xyxy=False, clip=DEFAULT_XFORM_CLIP,
                   clip_xyxy=DEFAULT_XFORM_CLIP_XYXY):
    """Decode deltas (N, 4k) against boxes (N, 4), numpy in and out; see bbox_transform_t. The
    coding and clamps are Detectron's cfg.XYXY / BBOX_XFORM_CLIP / BBOX_XFORM_CLIPe, passed in by
    the caller (Detectron's function reads them from the config itself)."""
    return bbox_transform_t(_to_tensor(boxes), _to_tensor(deltas), weights, xyxy=xyxy, clip=clip,
                            clip_xyxy=clip_xyxy).numpy()


def bbox_transform_inv(boxes, gt_boxes, weights=(1.0, 1.0, 1.0, 1.0), xyxy=False):
    """Regression targets (N, 4) of gt_boxes w.r.t. boxes, numpy in and out; xyxy as cfg.XYXY."""
    return bbox_transform_inv_t(_to_tensor(boxes), _to_tensor(gt_boxes), weights, xyxy=xyxy).numpy()


def flip_boxes(boxes, im_width):
    """Mirror (N, 4k) boxes horizontally in an image of width im_width: x -> im_width - x - 1."""
    return flip_boxes_t(torch.from_numpy(np.array(boxes)), im_width).numpy()


def aspect_ratio(boxes, aspect_ratio):
    """Scale the x coordinates of (N, 4k) boxes by aspect_ratio (width-relative transform)."""
    return aspect_ratio_t(torch.from_numpy(np.array(boxes)), aspect_ratio).numpy()


def expand_boxes(boxes, scale):
    """Scale (N, 4) boxes about their centres; float64. Like Detectron's mask code, no +1 here."""
    half_w = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale
    half_h = (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    ctr_x = (boxes[:, 2] + boxes[:, 0]) * 0.5
    ctr_y = (boxes[:, 3] + boxes[:, 1]) * 0.5
    return np.stack([ctr_x - half_w, ctr_y - half_h, ctr_x + half_w, ctr_y + half_h], axis=1).astype(np.float64)


def box_voting(top_dets, all_dets, thresh, scoring_method='ID', beta=1.0):
    """Refine top_dets (K, 5) by voting with all_dets (N, 5) (Gidaris & Komodakis, 2015), one top
    box at a time with numpy's own reductions, as KL-Loss' box_voting (so bit for bit).

    Each top box becomes np.average of the all_dets boxes with IoU >= thresh (its voters) weighted
    by their scores; one whose weights sum to 0 keeps its box (KL-Loss' try/except). Its score is
    rescored by scoring_method from its voters' scores: 'ID' (kept), 'TEMP_AVG' (mean of the
    scores tempered by 1/beta against their complements), 'AVG' (mean), 'IOU_AVG' (IoU-weighted
    mean; kept when the IoUs sum to 0, KL-Loss' guard), 'GENERALIZED_AVG' (power mean with
    exponent beta) or 'QUASI_SUM' (sum / count^beta).
    """
    if scoring_method not in _VOTE_SCORERS:
        raise ValueError(f'Unknown box voting scoring method {scoring_method!r}; '
                         f'use one of {", ".join(_VOTE_SCORERS)}')
    scorer = _VOTE_SCORERS[scoring_method]
    out = top_dets.copy()
    all_boxes, all_scores = all_dets[:, :4], all_dets[:, 4]
    overlaps = bbox_overlaps(top_dets[:, :4], all_boxes)
    for k in range(len(out)):
        voters = np.where(overlaps[k] >= thresh)[0]
        weights = all_scores[voters]
        box = _weighted_average(all_boxes[voters], weights, axis=0)
        if box is not None:
            out[k, :4] = box
        score = scorer(weights, overlaps[k, voters], beta) if scorer else None
        if score is not None:
            out[k, 4] = score
    return out


def _weighted_average(values, weights, axis=None):
    """np.average, or None when the weights sum to 0 (which KL-Loss' try/except skips)."""
    try:
        return np.average(values, axis=axis, weights=weights)
    except ZeroDivisionError:
        return None


def _temperature_avg_score(scores, ious, beta):
    # Each voter's (p, 1 - p) pair is re-normalised after tempering its log-ratio by 1/beta;
    # log(0) = -inf is intended (it tempers to probability 0).
    probs = np.vstack((scores, 1.0 - scores))
    with np.errstate(divide='ignore'):
        tempered = np.exp(np.log(probs / np.max(probs, axis=0)) / beta)
    return (tempered / np.sum(tempered, axis=0))[0].mean()


_VOTE_SCORERS = {
    'ID': None,
    'TEMP_AVG': _temperature_avg_score,
    'AVG': lambda scores, ious, beta: scores.mean(),
    'IOU_AVG': lambda scores, ious, beta: _weighted_average(scores, ious),
    'GENERALIZED_AVG': lambda scores, ious, beta: np.mean(scores ** beta) ** (1.0 / beta),
    'QUASI_SUM': lambda scores, ious, beta: scores.sum() / float(len(scores)) ** beta,
}
