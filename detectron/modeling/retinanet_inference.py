"""RetinaNet inference on one image (Detectron's core/test_retinanet.py im_detect_bbox) with plain
arguments: per level the PRE_NMS_TOP_N best (anchor, class) scores above INFERENCE_TH (0 on the
coarsest level, as Detectron, so that small images keep candidates), their anchors decoded with
unit weights, class-wise NMS (or soft-NMS) at TEST.NMS, then the DETECTIONS_PER_IM best over all
classes. Everything stays on the model's device until the final detections come back as numpy.
"""
from dataclasses import dataclass

import numpy as np
import torch

from detectron.modeling.rcnn_inference import model_device
from detectron.modeling.retinanet_heads import anchor_major, class_probabilities
from detectron.ops import nms as nms_ops
from detectron.roi_data.retinanet import RETINANET_BBOX_REG_WEIGHTS
from detectron.utils import blob as blob_utils
from detectron.utils import boxes as box_utils
from detectron.utils.cuda_graphs import DEFAULT_MAX_GRAPHS, graphed_method

# Detectron's test_retinanet soft-NMS drops boxes below this score.
_SOFT_NMS_SCORE_THRESH = 0.0001


@dataclass(frozen=True)
class RetinaNetTestParams:
    """RETINANET.PRE_NMS_TOP_N / INFERENCE_TH / CLASS_SPECIFIC_BBOX / SOFTMAX, TEST.BBOX_REG / NMS / SOFT_NMS /
    DETECTIONS_PER_IM, BBOX_XFORM_CLIP and MODEL.NUM_CLASSES (with background)."""
    num_classes: int
    pre_nms_top_n: int = 1000
    inference_th: float = 0.05
    class_specific_bbox: bool = False
    softmax: bool = False
    bbox_reg: bool = True
    bbox_xform_clip: float = box_utils.DEFAULT_XFORM_CLIP
    nms: float = 0.5
    soft_nms: bool = False
    soft_nms_method: str = 'linear'
    soft_nms_sigma: float = 0.5
    detections_per_im: int = 100


def im_detect_bbox(model, im, image_params, params, cuda_graphs=False, max_graph_shapes=DEFAULT_MAX_GRAPHS):
    """cls_boxes of one BGR image (H, W, 3): cls_boxes[j] (N_j, 5) float32 (x1, y1, x2, y2, score) in
    original image coordinates, cls_boxes[0] empty. image_params: rcnn_inference.ImageParams.
    cuda_graphs [TEST.CUDA_GRAPHS]: on a GPU, replay the body and head from a CUDA graph per padded
    size, for max_graph_shapes [TEST.CUDA_GRAPHS_MAX_SHAPES] sizes."""
    if model.training:
        raise ValueError('im_detect_bbox needs the model in eval mode: call model.eval() first')
    blob, im_scale, im_info = blob_utils.get_image_blob_t(
        im, image_params.scale, image_params.max_size, image_params.pixel_means, image_params.stride,
        model_device(model))
    graphed = {}
    if cuda_graphs and blob.is_cuda:
        graphed['body'] = graphed_method(model, 'body_and_head', type(model).body_and_head, max_graphs=max_graph_shapes)
    with torch.no_grad():
        out = model(blob, im_info, **graphed)
    boxes, scores, classes = candidate_detections(out['anchors'], out['logits'], out['deltas'], params)
    boxes = box_utils.clip_tiled_boxes_t(box_utils.divide(boxes, im_scale), im.shape[0], im.shape[1])
    dets, det_classes = class_wise_nms(boxes, scores, classes, params)
    return cls_boxes_of(dets, det_classes, params.num_classes)


def candidate_detections(anchors, logits, deltas, params):
    """The first image's candidates over all levels: (boxes (K, 4) decoded in network-input
    coordinates, scores (K,), classes (K,) in 1..C), float32 on the logits' device. Only the top-k
    runs per level; the candidates of all levels are gathered and decoded at once, and the levels'
    thresholds applied at the end: one host synchronisation per image."""
    top_scores, top_rows, kept = [], [], []
    first_row, last = 0, len(logits) - 1
    for i, (level_anchors, level_logits) in enumerate(zip(anchors, logits)):
        probs = class_probabilities(anchor_major(level_logits[:1], level_anchors.shape[2])[0], params.softmax)
        scores, rows = probs.reshape(-1).topk(min(params.pre_nms_top_n, probs.numel()))
        top_scores.append(scores)
        top_rows.append(rows + first_row * probs.shape[1])  # (anchor, class) rows of all levels' anchors
        kept.append(scores > (params.inference_th if i < last else 0.0))
        first_row += probs.shape[0]
    num_fg = probs.shape[1]
    rows = torch.cat(top_rows)
    anchor_idx, cls = rows // num_fg, rows % num_fg
    num_anchors = anchors[0].shape[2]
    box_deltas = torch.cat([anchor_major(x[:1], num_anchors)[0] for x in deltas])[anchor_idx].float()
    if params.class_specific_bbox:
        box_deltas = box_deltas.view(-1, num_fg, 4)[torch.arange(len(cls), device=cls.device), cls]
    boxes = torch.cat([level.reshape(-1, 4) for level in anchors])[anchor_idx]
    if params.bbox_reg:
        boxes = box_utils.bbox_transform_t(boxes, box_deltas, RETINANET_BBOX_REG_WEIGHTS, clip=params.bbox_xform_clip)
    kept = torch.cat(kept).nonzero().squeeze(1)  # the one host synchronisation
    return boxes[kept], torch.cat(top_scores)[kept], cls[kept] + 1


def class_wise_nms(boxes, scores, classes, params):
    """NMS (or Detectron's soft-NMS) of each class's candidates, then the detections_per_im best over all
    classes (all of them when it is 0). Returns (dets (M, 5), classes (M,)) grouped by ascending class,
    by descending score within a class."""
    dets = torch.cat([boxes, scores[:, None]], dim=1)
    if params.soft_nms:
        dets, classes = _soft_nms_per_class(dets, classes, params)
    else:
        keep = nms_ops.batched_nms_t(boxes, scores, classes, params.nms)
        dets, classes = dets[keep], classes[keep]
    order = torch.argsort(dets[:, 4], descending=True, stable=True)
    if params.detections_per_im > 0:
        order = order[:params.detections_per_im]
    dets, classes = dets[order], classes[order]
    by_class = torch.argsort(classes, stable=True)
    return dets[by_class], classes[by_class]


def _soft_nms_per_class(dets, classes, params):
    kept_dets, kept_classes = [], []
    dets_np, classes_np = dets.cpu().numpy(), classes.cpu().numpy()
    for cls in np.unique(classes_np):
        class_dets, _ = nms_ops.soft_nms(dets_np[classes_np == cls], sigma=params.soft_nms_sigma,
                                         overlap_thresh=params.nms, score_thresh=_SOFT_NMS_SCORE_THRESH,
                                         method=params.soft_nms_method)
        kept_dets.append(class_dets)
        kept_classes.append(np.full(len(class_dets), cls))
    if not kept_dets:
        return dets, classes
    return (torch.from_numpy(np.concatenate(kept_dets)).to(dets.device),
            torch.from_numpy(np.concatenate(kept_classes)).to(classes.device))


def cls_boxes_of(dets, classes, num_classes):
    """Detectron's cls_boxes list from detections grouped by ascending class."""
    # One copy to the host: the classes (< 2^24) ride along as float32.
    both = torch.cat([dets.float(), classes[:, None].float()], dim=1).cpu().numpy()
    dets, classes = np.ascontiguousarray(both[:, :5]), both[:, 5].astype(np.int64)
    counts = np.bincount(classes, minlength=num_classes)
    return np.split(dets, np.cumsum(counts)[:-1])
