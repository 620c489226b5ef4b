"""R-CNN test-time augmentation: Detectron's `im_detect_bbox_aug`, `im_detect_mask_aug` and
`im_detect_keypoints_aug` (core/test.py) with plain arguments.

An augmentation is a `Transform` (a test scale and max size, optionally a width-relative aspect ratio,
then optionally a horizontal flip): Detectron's `im_detect_bbox_hflip`, `im_detect_bbox_scale` and
`im_detect_bbox_aspect_ratio` (and their mask twins) are its cases. `transforms` lists one TEST.*_AUG
set's augmentations in Detectron's order; the image, the boxes into its frame and the detections back
to the original frame go through `transformed_image`, `boxes_to_transformed` and `boxes_to_original`,
so the mask and keypoint heads' augmentations (TEST.MASK_AUG, TEST.KPS_AUG) reuse them with their own
combinations. A Fast R-CNN's proposals go through boxes_to_transformed as its detections do.

KL-Loss' learned sigmas (PRED_STD) travel with their boxes. They are in the head's normalised delta
units (an edge offset divided by the RoI's width or height), which a rescaled or width-stretched image
leaves unchanged; a flip exchanges the x1 and x2 edges, so the XYXY head's (x1, x2, y1, y2) sigma
columns of a flipped prediction exchange their x columns (centre-size sigmas (dx, dy, dw, dh) keep
theirs). UNION stacks them with their boxes, so STD_NMS votes over the union with each box's own
sigma; AVG averages their variances (the root mean square of the sigmas); ID keeps the identity's.
"""
import dataclasses
from dataclasses import dataclass

import cv2
import torch

from detectron.modeling import keypoint_inference, mask_inference, rcnn_inference
from detectron.utils import boxes as box_utils
from detectron.utils.keypoints import flip_heatmaps
from detectron.utils.cuda_graphs import DEFAULT_MAX_GRAPHS

BOX_HEURISTICS = ('ID', 'AVG', 'UNION')
MASK_HEURISTICS = ('SOFT_AVG', 'SOFT_MAX', 'LOGIT_AVG')
KEYPOINT_HEURISTICS = ('HM_AVG', 'HM_MAX')


@dataclass(frozen=True)
class AugTransforms:
    """One TEST.*_AUG set of augmentations (H_FLIP, SCALES, MAX_SIZE, SCALE_H_FLIP, ASPECT_RATIOS,
    ASPECT_RATIO_H_FLIP)."""
    h_flip: bool = False
    scales: tuple = ()
    max_size: int = 4000
    scale_h_flip: bool = False
    aspect_ratios: tuple = ()
    aspect_ratio_h_flip: bool = False


@dataclass(frozen=True)
class BoxAug:
    """TEST.BBOX_AUG: the augmentations and how their scores and coordinates combine."""
    transforms: AugTransforms = AugTransforms()
    score_heur: str = 'UNION'
    coord_heur: str = 'UNION'


@dataclass(frozen=True)
class MaskAug:
    """TEST.MASK_AUG: the augmentations and how their soft masks combine."""
    transforms: AugTransforms = AugTransforms()
    heur: str = 'SOFT_AVG'


@dataclass(frozen=True)
class KpsAug:
    """TEST.KPS_AUG: the augmentations, how their heatmaps combine (heur; with scale_size_dep, objects of
    area below area_th ignore the downscaled ones and the others the upscaled ones) and flip_order
    (keypoints.flip_order of the dataset's keypoints) for the mirrored heatmaps."""
    transforms: AugTransforms = AugTransforms()
    heur: str = 'HM_AVG'
    scale_size_dep: bool = False
    area_th: float = 180 ** 2
    flip_order: tuple = ()


@dataclass(frozen=True)
class Augmentations:
    """Which parts of R-CNN inference are augmented (None: that part runs once, unaugmented)."""
    bbox: BoxAug = None
    mask: MaskAug = None
    keypoints: KpsAug = None


@dataclass(frozen=True)
class Transform:
    """The image at `scale` / `max_size`, its width first stretched by aspect_ratio (None: kept), then
    mirrored when hflip."""
    scale: int
    max_size: int
    hflip: bool = False
    aspect_ratio: float = None


def transforms(aug, test_scale, test_max_size):
    """The augmentations of `aug` (an AugTransforms) in Detectron's order, the identity left out: the
    flip at the test scale, each scale (then its flip), each aspect ratio at the test scale (then its flip)."""
    out = [Transform(test_scale, test_max_size, hflip=True)] if aug.h_flip else []
    for scale in aug.scales:
        out.append(Transform(scale, aug.max_size))
        if aug.scale_h_flip:
            out.append(Transform(scale, aug.max_size, hflip=True))
    for ratio in aug.aspect_ratios:
        out.append(Transform(test_scale, test_max_size, aspect_ratio=ratio))
        if aug.aspect_ratio_h_flip:
            out.append(Transform(test_scale, test_max_size, hflip=True, aspect_ratio=ratio))
    return out


def transformed_image(im, t):
    """The BGR image (H, W, 3) under Transform t (before its scaling, which the blob does)."""
    if t.aspect_ratio is not None:
        im = aspect_ratio_rel(im, t.aspect_ratio)
    return im[:, ::-1, :] if t.hflip else im


def aspect_ratio_rel(im, aspect_ratio):
    """Detectron's width-relative aspect ratio transformation: the width times aspect_ratio, rounded."""
    return cv2.resize(im, dsize=(int(round(aspect_ratio * im.shape[1])), im.shape[0]))


def boxes_to_transformed(boxes, t, transformed_width):
    """(N, 4k) boxes of the original image in the frame of its Transform t (transformed_width: the
    transformed image's width)."""
    if t.aspect_ratio is not None:
        boxes = box_utils.aspect_ratio_t(boxes, t.aspect_ratio)
    return box_utils.flip_boxes_t(boxes, transformed_width) if t.hflip else boxes


def boxes_to_original(boxes, t, transformed_width):
    """(N, 4k) boxes found on the image under Transform t, back in the original image's frame."""
    if t.hflip:
        boxes = box_utils.flip_boxes_t(boxes, transformed_width)
    return box_utils.aspect_ratio_t(boxes, 1.0 / t.aspect_ratio) if t.aspect_ratio is not None else boxes


def flip_sigmas(confs, xyxy):
    """(R, 4k) sigmas of boxes found on a mirrored image, for the mirrored-back boxes: the XYXY head's
    (x1, x2, y1, y2) columns exchange x1 and x2; centre-size (dx, dy, dw, dh) sigmas are unchanged."""
    if not xyxy:
        return confs
    flipped = confs.clone()
    flipped[:, 0::4], flipped[:, 1::4] = confs[:, 1::4], confs[:, 0::4]
    return flipped


def combine_heuristic_results(heur, values_ts, value_i):
    """Detectron's combination of per-augmentation predictions: 'ID' the identity's (value_i), 'AVG'
    their mean (rows aligned: the same proposals), 'UNION' their rows stacked in values_ts' order."""
    if heur == 'ID':
        return value_i
    if heur == 'AVG':
        return torch.stack(values_ts).mean(dim=0)
    if heur == 'UNION':
        return torch.cat(values_ts)
    raise ValueError('heuristic {} not supported; use one of {}'.format(heur, BOX_HEURISTICS))


def combine_sigmas(coord_heur, confs_ts, confs_i):
    """The sigmas of combine_heuristic_results(coord_heur, boxes_ts, boxes_i): AVG averages the variances."""
    if coord_heur == 'AVG':
        return torch.stack(confs_ts).square().mean(dim=0).sqrt()
    return combine_heuristic_results(coord_heur, confs_ts, confs_i)


def combine_masks(heur, masks_ts):
    """Detectron's combination of soft masks (each (R, M, M), in [0, 1]): SOFT_AVG their mean, SOFT_MAX
    their maximum, LOGIT_AVG the sigmoid of their mean logit (probabilities floored at 1e-20)."""
    stacked = torch.stack(masks_ts)
    if heur == 'SOFT_AVG':
        return stacked.mean(dim=0)
    if heur == 'SOFT_MAX':
        return stacked.amax(dim=0)
    if heur == 'LOGIT_AVG':
        logits = -torch.log((1.0 - stacked) / stacked.clamp(min=1e-20))
        return torch.sigmoid(logits.mean(dim=0))
    raise ValueError('mask heuristic {} not supported; use one of {}'.format(heur, MASK_HEURISTICS))


def im_detect_bbox_aug(model, im, image_params, decode_params, aug, cuda_graphs=False,
                       max_graph_shapes=DEFAULT_MAX_GRAPHS, proposals=None, dedup_boxes=0):
    """Detectron's `im_detect_bbox_aug` on one BGR image: the augmentations of aug (a BoxAug), then
    the identity at image_params' scale, last, combined by aug's heuristics; a Fast R-CNN's proposals
    ((R, 4) in the image) are carried into each augmentation's frame.

    Returns (scores, boxes, confs, im_scale, out): combined scores (R, K), boxes (R, 4K) in the
    original image, their sigmas (None unless decode_params.std_nms), and the identity's scale and
    inference dict (its 'features' serve an unaugmented mask head)."""
    graphs = {'cuda_graphs': cuda_graphs, 'max_graph_shapes': max_graph_shapes}
    if proposals is not None:
        proposals = torch.as_tensor(proposals, dtype=torch.float32).reshape(-1, 4)
    scores_ts, boxes_ts, confs_ts = [], [], []
    for t in transforms(aug.transforms, image_params.scale, image_params.max_size):
        im_t = transformed_image(im, t)
        proposals_t = None if proposals is None else boxes_to_transformed(proposals, t, im_t.shape[1])
        _, scores, boxes, confs, _ = rcnn_inference.forward_and_decode(
            model, im_t, _at_scale(image_params, t), decode_params, proposals=proposals_t, dedup_boxes=dedup_boxes,
            **graphs)
        scores_ts.append(scores)
        boxes_ts.append(boxes_to_original(boxes, t, im_t.shape[1]))
        confs_ts.append(flip_sigmas(confs, decode_params.xyxy) if confs is not None and t.hflip else confs)
    out, scores_i, boxes_i, confs_i, im_scale_i = rcnn_inference.forward_and_decode(
        model, im, image_params, decode_params, proposals=proposals, dedup_boxes=dedup_boxes, **graphs)
    scores_ts.append(scores_i)
    boxes_ts.append(boxes_i)
    confs_ts.append(confs_i)
    scores = combine_heuristic_results(aug.score_heur, scores_ts, scores_i)
    boxes = combine_heuristic_results(aug.coord_heur, boxes_ts, boxes_i)
    confs = None if confs_i is None else combine_sigmas(aug.coord_heur, confs_ts, confs_i)
    return scores, boxes, confs, im_scale_i, out


def im_detect_mask_aug(model, im, boxes, classes, image_params, aug, cuda_graphs=False,
                       max_graph_shapes=DEFAULT_MAX_GRAPHS):
    """Detectron's `im_detect_mask_aug`: soft masks (R, M, M) of the detections `boxes` (R, 4, original
    image, on the model's device) of `classes` (R,), computed on the identity first, then on each
    augmentation of aug (a MaskAug) from its own body features, flipped masks mirrored back, combined
    by aug.heur."""
    masks_ts = []
    for t, features, boxes_t, im_scale in _identity_then_transforms(model, im, boxes, image_params, aug.transforms,
                                                                    cuda_graphs, max_graph_shapes):
        with torch.no_grad():
            masks = mask_inference.detect_masks(model, features, boxes_t, classes, im_scale)
        masks_ts.append(masks.flip(-1) if t.hflip else masks)
    return combine_masks(aug.heur, masks_ts)


def _identity_then_transforms(model, im, boxes, image_params, aug_transforms, cuda_graphs, max_graph_shapes):
    """Per Transform (the identity, then those of aug_transforms): (t, the body features of the image under t,
    boxes in its frame, its scale), for a head run on the detections of every augmentation."""
    identity = Transform(image_params.scale, image_params.max_size)
    for t in [identity] + transforms(aug_transforms, image_params.scale, image_params.max_size):
        im_t = transformed_image(im, t)
        features, im_scale = rcnn_inference.body_features(model, im_t, _at_scale(image_params, t), cuda_graphs,
                                                          max_graph_shapes)
        yield t, features, boxes_to_transformed(boxes, t, im_t.shape[1]), im_scale


def combine_heatmaps(heur, heatmaps_ts, downscaled, upscaled, boxes, scale_size_dep=False, area_th=0.0):
    """Detectron's combination of keypoint heatmap logits (each (R, K, M, M)): HM_AVG their mean, HM_MAX their
    maximum. With scale_size_dep (combine_heatmaps_size_dep) a box (R, 4) of area (+1 sides) below area_th
    leaves out the augmentations flagged downscaled, the others those flagged upscaled (the identity, never
    flagged, always counts)."""
    stacked = torch.stack(heatmaps_ts)
    keep = torch.ones(stacked.shape[:2], dtype=torch.bool, device=stacked.device)
    if scale_size_dep:
        small = box_utils.boxes_area_t(boxes) < area_th
        down = torch.tensor(downscaled, device=stacked.device).unsqueeze(1)
        up = torch.tensor(upscaled, device=stacked.device).unsqueeze(1)
        keep = ~(small & down) & ~(~small & up)
    keep = keep[:, :, None, None, None]
    if heur == 'HM_AVG':
        return (stacked * keep).sum(dim=0) / keep.sum(dim=0)
    if heur == 'HM_MAX':
        return stacked.masked_fill(~keep, float('-inf')).amax(dim=0)
    raise ValueError('keypoint heuristic {} not supported; use one of {}'.format(heur, KEYPOINT_HEURISTICS))


def im_detect_keypoints_aug(model, im, boxes, image_params, aug, cuda_graphs=False, max_graph_shapes=DEFAULT_MAX_GRAPHS):
    """Detectron's `im_detect_keypoints_aug`: heatmap logits (R, K, M, M) of the detections `boxes` (R, 4,
    original image, on the model's device), computed on the identity first, then on each augmentation of aug
    (a KpsAug) from its own body features, flipped heatmaps mirrored back (flip_heatmaps), combined by
    combine_heatmaps (an augmentation's scale below the test scale flags it downscaled, above it upscaled)."""
    heatmaps_ts, downscaled, upscaled = [], [], []
    for t, features, boxes_t, im_scale in _identity_then_transforms(model, im, boxes, image_params, aug.transforms,
                                                                    cuda_graphs, max_graph_shapes):
        with torch.no_grad():
            heatmaps = keypoint_inference.detect_keypoint_heatmaps(model, features, boxes_t, im_scale)
        heatmaps_ts.append(flip_heatmaps(heatmaps, aug.flip_order) if t.hflip else heatmaps)
        downscaled.append(t.scale < image_params.scale)
        upscaled.append(t.scale > image_params.scale)
    return combine_heatmaps(aug.heur, heatmaps_ts, downscaled, upscaled, boxes, aug.scale_size_dep, aug.area_th)


def im_detect_all(model, im, image_params, decode_params, nms_params, aug, mask_thresh=None, cuda_graphs=False,
                  max_graph_shapes=DEFAULT_MAX_GRAPHS, keypoint_params=None, proposals=None, dedup_boxes=0):
    """rcnn_inference.im_detect_all with test-time augmentation (aug, an Augmentations): the boxes of
    im_detect_bbox_aug when aug.bbox, then NMS / soft-NMS / variance voting and box voting on the
    combined detections as without augmentation, then the masks of im_detect_mask_aug when aug.mask and
    the keypoints of im_detect_keypoints_aug when aug.keypoints (a Keypoint R-CNN: keypoint_params given)."""
    graphs = {'cuda_graphs': cuda_graphs, 'max_graph_shapes': max_graph_shapes}
    given = {'proposals': proposals, 'dedup_boxes': dedup_boxes}
    if aug.bbox is not None:
        scores, boxes, confs, im_scale, out = im_detect_bbox_aug(model, im, image_params, decode_params, aug.bbox,
                                                                 **graphs, **given)
    else:
        out, scores, boxes, confs, im_scale = rcnn_inference.forward_and_decode(model, im, image_params,
                                                                                decode_params, **graphs, **given)
    dets, det_classes = rcnn_inference.final_detections_t(scores, boxes, confs, nms_params)

    def soft_masks(boxes, classes):
        if aug.mask is not None:
            return im_detect_mask_aug(model, im, boxes, classes, image_params, aug.mask, **graphs)
        return mask_inference.detect_masks(model, out['features'], boxes, classes, im_scale)

    if keypoint_params is None:
        return rcnn_inference.image_results(dets, det_classes, scores.shape[1], im.shape[:2], mask_thresh, soft_masks)

    def heatmaps_of(boxes):
        if aug.keypoints is not None:
            return im_detect_keypoints_aug(model, im, boxes, image_params, aug.keypoints, **graphs)
        return keypoint_inference.detect_keypoint_heatmaps(model, out['features'], boxes, im_scale)

    return rcnn_inference.keypoint_image_results(dets, det_classes, scores.shape[1], im.shape[:2], mask_thresh,
                                                 soft_masks, heatmaps_of, keypoint_params)


def _at_scale(image_params, t):
    return dataclasses.replace(image_params, scale=t.scale, max_size=t.max_size)
