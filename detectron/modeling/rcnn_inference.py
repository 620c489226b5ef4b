"""Faster R-CNN inference on one image: blob, forward, box decoding, then per-class detections.

Plain-argument versions of Detectron's `im_detect_bbox` and `box_results_with_nms_and_limit`
(with KL-Loss's soft-NMS + variance voting). `core/test.py` keeps the Detectron-named wrappers
that read cfg; `rcnn_builder` configures these from cfg for the test engine. Tensors stay on the
model's device until the final per-class arrays are handed back as numpy.
"""
from dataclasses import dataclass

import numpy as np
import torch

from detectron.modeling import keypoint_inference, mask_inference
from detectron.ops import nms as nms_ops
from detectron.ops.variance_voting import soft_nms_with_variance_voting, soft_nms_with_variance_voting_grouped_cpu
from detectron.utils import blob as blob_utils
from detectron.utils import boxes as box_utils
from detectron.utils.cuda_graphs import DEFAULT_MAX_GRAPHS, graphed_method
from detectron.utils.errors import ConfigValueError

# Detectron's own soft-NMS drops boxes below this score at test time (KL-Loss's `soft` uses 0.001,
# see ops/variance_voting.py).
_DETECTRON_SOFT_NMS_SCORE_THRESH = 0.0001
# 'corrected' sigma order: the head's (x1, x2, y1, y2) sigma columns rearranged to (x1, y1, x2, y2).
_SIGMA_COLUMNS_FOR_BOX_COLUMNS = {'reference': [0, 1, 2, 3], 'corrected': [0, 2, 1, 3]}


@dataclass(frozen=True)
class BoxDecodeParams:
    """How raw box-head outputs become boxes (cfg.TEST.BBOX_REG, MODEL.*, XYXY, BBOX_XFORM_CLIP*)."""
    bbox_reg: bool = True
    cls_agnostic_bbox_reg: bool = False
    bbox_reg_weights: tuple = (10.0, 10.0, 5.0, 5.0)
    xyxy: bool = False
    bbox_xform_clip: float = box_utils.DEFAULT_XFORM_CLIP
    bbox_xform_clip_e: float = box_utils.DEFAULT_XFORM_CLIP_XYXY
    std_nms: bool = False  # also return the predicted sigmas


@dataclass(frozen=True)
class NMSParams:
    """cfg.TEST's score threshold, NMS variants and cap, and KL-Loss's STD_NMS settings."""
    score_thresh: float = 0.05
    nms: float = 0.3
    detections_per_im: int = 100
    soft_nms: bool = False
    soft_nms_method: str = 'linear'
    soft_nms_sigma: float = 0.5
    bbox_vote: bool = False
    bbox_vote_th: float = 0.8
    bbox_vote_scoring_method: str = 'ID'
    bbox_vote_scoring_beta: float = 1.0
    std_nms: bool = False
    std_method: str = 'stdiou'
    std_soft: str = 'soft'
    std_iou_sigma: float = 0.01
    std_th: float = 0.9
    sigma_column_order: str = 'reference'


@dataclass(frozen=True)
class ImageParams:
    """Test-time image preparation (cfg.TEST.SCALE / MAX_SIZE, PIXEL_MEANS, FPN.COARSEST_STRIDE)."""
    scale: int = 600
    max_size: int = 1000
    pixel_means: tuple = (102.9801, 115.9465, 122.7717)
    stride: int = 32


def model_device(model):
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None else torch.device('cpu')


def detect_boxes(model, im, image_params, decode_params, cuda_graphs=False, max_graph_shapes=DEFAULT_MAX_GRAPHS,
                 proposals=None, dedup_boxes=0):
    """Run an R-CNN in eval mode on one BGR image: (scores, boxes, confs, im_scale) as tensors
    on the model's device (see decode_detections). cuda_graphs: on a GPU, replay the body and RPN
    head from one CUDA graph per padded input size (the first max_graph_shapes sizes met twice;
    others run eagerly): at batch 1 launching their few hundred kernels costs more host time than
    the GPU spends on them. proposals, dedup_boxes: a Fast R-CNN's (see im_detect_all)."""
    return forward_and_decode(model, im, image_params, decode_params, cuda_graphs, max_graph_shapes, proposals,
                              dedup_boxes)[1:]


def forward_and_decode(model, im, image_params, decode_params, cuda_graphs=False,
                       max_graph_shapes=DEFAULT_MAX_GRAPHS, proposals=None, dedup_boxes=0):
    """detect_boxes' (scores, boxes, confs, im_scale) after the model's inference dict of that
    forward (its 'features' feed the mask head)."""
    out, im_scale = _forward(model, im, image_params, cuda_graphs, max_graph_shapes, proposals, dedup_boxes)
    scores, boxes, confs = decode_detections(out, im_scale, im.shape[:2], decode_params)
    return out, scores, boxes, confs, im_scale


def body_features(model, im, image_params, cuda_graphs=False, max_graph_shapes=DEFAULT_MAX_GRAPHS):
    """Detectron's `im_conv_body_only`: the FPN features of one BGR image (the list the mask head
    pools from) and its scale, without proposals or box head."""
    blob, im_scale, _ = _image_blob(model, im, image_params)
    body = _graphed_body(model, blob, cuda_graphs, max_graph_shapes).get('body', model.body_and_rpn_head)
    with torch.no_grad():
        flat = body(blob)
    # body_and_rpn_head's flat tuple: features, RPN logits, RPN deltas, three equally long lists (the features
    # alone without an RPN: a Fast R-CNN).
    return list(flat if model.rpn is None else flat[:len(flat) // 3]), im_scale


def _forward(model, im, image_params, cuda_graphs, max_graph_shapes, proposals=None, dedup_boxes=0):
    """The model's inference dict on one BGR image, and the image's scale; with proposals (a Fast R-CNN's,
    (R, 4) in the image's coordinates) the dict's rows are those of the proposals again
    (dedup_rois' inverse) and 'im_boxes' holds the proposal each row decodes from."""
    blob, im_scale, im_info = _image_blob(model, im, image_params)
    graphed = _graphed_body(model, blob, cuda_graphs, max_graph_shapes)
    if proposals is None:
        with torch.no_grad():
            return model(blob, im_info, **graphed), im_scale
    proposals = torch.as_tensor(proposals, dtype=torch.float32, device=blob.device).reshape(-1, 4)
    # float64 rois, as Detectron's numpy projection (_project_im_rois), for the dedup hash.
    rois = torch.cat((proposals.new_zeros(len(proposals), 1, dtype=torch.float64), proposals.double() * im_scale), dim=1)
    index, inverse = dedup_rois(rois, dedup_boxes)
    with torch.no_grad():
        out = model(blob, im_info, proposals=rois[index].float(), **graphed)
    out = {k: v[inverse] if k in _PER_ROI_OUTPUTS else v for k, v in out.items()}
    # As Detectron, a proposal decodes from the first proposal of its duplicates.
    out['im_boxes'] = proposals[index][inverse]
    return out, im_scale


def _image_blob(model, im, image_params):
    if model.training:
        raise ValueError('im_detect_bbox needs the model in eval mode: call model.eval() first')
    # The image goes to the model's device as uint8; mean subtraction, resize and padding run there.
    return blob_utils.get_image_blob_t(im, image_params.scale, image_params.max_size, image_params.pixel_means,
                                       image_params.stride, model_device(model))


def _graphed_body(model, blob, cuda_graphs, max_graph_shapes):
    """{'body': the CUDA-graphed body_and_rpn_head} when replayed, else {}: any model callable as
    model(images, im_info) still runs here."""
    if cuda_graphs and blob.is_cuda:
        return {'body': graphed_method(model, 'body_and_rpn_head', type(model).body_and_rpn_head,
                                       max_graphs=max_graph_shapes)}
    return {}


# The per-RoI entries of the inference dict that dedup_rois' inverse maps back to every proposal.
_PER_ROI_OUTPUTS = ('rois', 'cls_prob', 'bbox_pred', 'bbox_pred_std')
_DEDUP_HASH = (1.0, 1e3, 1e6, 1e9, 1e12)


def dedup_rois(rois, dedup_boxes):
    """Detectron's DEDUP_BOXES for a Fast R-CNN: (index, inverse) of the rois (R, 5) that differ once
    rounded at dedup_boxes (1/16: one cell of the stride-16 feature map), the unique ones ordered by their
    hash as np.unique orders them; rois[index][inverse] is every roi again. dedup_boxes <= 0: all kept."""
    if dedup_boxes <= 0:
        every = torch.arange(len(rois), device=rois.device)
        return every, every
    # float64 as Detectron's numpy: the hash of 5 coordinates needs more than float32's digits.
    hashes = torch.round(rois.double() * dedup_boxes) @ torch.tensor(_DEDUP_HASH, dtype=torch.float64,
                                                                    device=rois.device)
    unique, inverse = torch.unique(hashes, sorted=True, return_inverse=True)
    # The first roi of each hash, as np.unique's return_index.
    first = torch.full((len(unique),), len(rois), dtype=torch.long, device=rois.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(rois), device=rois.device), reduce='amin')
    return first, inverse


def im_detect_all(model, im, image_params, decode_params, nms_params, mask_thresh=None, cuda_graphs=False,
                  max_graph_shapes=DEFAULT_MAX_GRAPHS, keypoint_params=None, proposals=None, dedup_boxes=0):
    """Detectron's `im_detect_all` for Faster R-CNN: `cls_boxes` of one BGR image (H, W, 3). For a
    Mask R-CNN, mask_thresh is MRCNN.THRESH_BINARIZE and the result is (cls_boxes, cls_segms):
    cls_segms[j][k] the RLE of detection cls_boxes[j][k], its mask computed on that final box (after
    NMS or variance voting, as KL-Loss). For a Keypoint R-CNN (keypoint_params given) the result is
    (cls_boxes, cls_segms or None, cls_keyps), cls_keyps[j][k] the (4, K) keypoints of cls_boxes[j][k].
    The detections stay on the model's device from NMS to the mask and keypoint heads; they come back
    to the host once, with the masks and heatmaps, for cls_boxes, the pasting and the keypoints.
    A Fast R-CNN (no RPN) detects on proposals (R, 4) in the image's coordinates, those whose rois
    differ at dedup_boxes (Detectron's DEDUP_BOXES) through the heads once (dedup_rois)."""
    out, scores, boxes, confs, im_scale = forward_and_decode(model, im, image_params, decode_params, cuda_graphs,
                                                             max_graph_shapes, proposals, dedup_boxes)
    dets, det_classes = final_detections_t(scores, boxes, confs, nms_params)
    num_classes = scores.shape[1]

    def soft_masks(boxes, classes):
        return mask_inference.detect_masks(model, out['features'], boxes, classes, im_scale)

    if keypoint_params is not None:
        def heatmaps_of(boxes):
            return keypoint_inference.detect_keypoint_heatmaps(model, out['features'], boxes, im_scale)
        return keypoint_image_results(dets, det_classes, num_classes, im.shape[:2], mask_thresh, soft_masks,
                                      heatmaps_of, keypoint_params)
    return image_results(dets, det_classes, num_classes, im.shape[:2], mask_thresh, soft_masks)


def image_results(dets, det_classes, num_classes, im_hw, mask_thresh, soft_masks):
    """im_detect_all's result from the final detections (dets (M, 5), det_classes (M,), grouped by
    class, on the model's device): cls_boxes, or with mask_thresh (cls_boxes, cls_segms), the soft
    masks (M, MR, MR) of soft_masks(boxes, classes) pasted into the im_hw image."""
    if mask_thresh is None:
        return _cls_boxes(dets, det_classes, num_classes)
    if dets.shape[0] == 0:
        cls_boxes = _cls_boxes(dets, det_classes, num_classes)
        return cls_boxes, [[] for _ in cls_boxes]
    with torch.no_grad():
        # det_classes: each detection's class, grouped by ascending class as cls_boxes lists them.
        masks = soft_masks(dets[:, :4], det_classes)
    dets, det_classes, masks = dets.cpu().numpy(), det_classes.cpu().numpy(), masks.cpu().numpy()
    cls_boxes = _split_by_class(dets, det_classes, num_classes)
    return cls_boxes, mask_inference.segm_results(cls_boxes, masks, dets[:, :4], im_hw[0], im_hw[1], mask_thresh)


def keypoint_image_results(dets, det_classes, num_classes, im_hw, mask_thresh, soft_masks, heatmaps_of,
                           keypoint_params):
    """image_results of a Keypoint R-CNN: (cls_boxes, cls_segms or None, cls_keyps), the keypoints from the
    heatmap logits (R, K, M, M) of heatmaps_of(boxes)."""
    with torch.no_grad():
        masks = soft_masks(dets[:, :4], det_classes) if mask_thresh is not None and len(dets) else None
        heatmaps = heatmaps_of(dets[:, :4]) if len(dets) else None
    dets, det_classes = dets.cpu().numpy(), det_classes.cpu().numpy()
    cls_boxes = _split_by_class(dets, det_classes, num_classes)
    if heatmaps is None:
        return cls_boxes, [[] for _ in cls_boxes] if mask_thresh is not None else None, [[] for _ in cls_boxes]
    cls_segms = None
    if masks is not None:
        cls_segms = mask_inference.segm_results(cls_boxes, masks.cpu().numpy(), dets[:, :4], im_hw[0], im_hw[1],
                                                mask_thresh)
    kept_boxes, cls_keyps = keypoint_inference.keypoint_results(cls_boxes, heatmaps.cpu().numpy(), dets[:, :4],
                                                                keypoint_params)
    return kept_boxes, cls_segms, cls_keyps


def im_proposals(model, im, image_params, cuda_graphs=False, max_graph_shapes=DEFAULT_MAX_GRAPHS):
    """Detectron's rpn_generator.im_proposals for an RPN-only model: (boxes (R, 4) float32 in the image's
    coordinates, scores (R,) float32) of one BGR image, numpy, by descending score (the best
    TEST.RPN_POST_NMS_TOP_N of every level together, as the model collects them)."""
    out, im_scale = _forward(model, im, image_params, cuda_graphs, max_graph_shapes)
    boxes = box_utils.divide(out['rois'][:, 1:5], im_scale)
    return boxes.float().cpu().numpy(), out['rpn_scores'].float().cpu().numpy()


def decode_detections(out, im_scale, im_hw, params):
    """The model's inference dict -> (scores (R, K), boxes (R, 4K) decoded and clipped to the original
    image of size im_hw, confs (R, 4K) sigmas = exp(alpha / 2) in the head's delta layout when
    params.std_nms else None), all tensors on the model's device."""
    scores = out['cls_prob']
    num_classes = scores.shape[1]
    # Back to original image coordinates (float32 division, as Detectron's numpy); a Fast R-CNN's are
    # its proposals as given.
    rois = out['im_boxes'] if 'im_boxes' in out else box_utils.divide(out['rois'][:, 1:5], im_scale)
    pred_boxes = _decode_boxes_t(rois, out['bbox_pred'], num_classes, im_hw, params)
    confs = None
    if params.std_nms:
        if 'bbox_pred_std' not in out:
            raise ConfigValueError(
                'STD_NMS True needs a model with the bbox_pred_std head: set PRED_STD True')
        # alpha = log(sigma^2) -> sigma, still in normalized-delta units and layout.
        confs = _per_class_columns(box_utils.exp(out['bbox_pred_std'] / 2.0), num_classes,
                                   params.cls_agnostic_bbox_reg)
    return scores, pred_boxes, confs


def _per_class_columns(per_reg_class, num_classes, cls_agnostic):
    # A class-agnostic head has (bg, fg) columns; like Detectron, every class uses the fg ones.
    if cls_agnostic:
        return per_reg_class[:, -4:].repeat(1, num_classes)
    return per_reg_class


def _decode_boxes_t(rois, bbox_pred, num_classes, im_hw, p):
    if not p.bbox_reg:
        return rois.repeat(1, num_classes)
    deltas = bbox_pred[:, -4:] if p.cls_agnostic_bbox_reg else bbox_pred
    pred_boxes = box_utils.bbox_transform_t(
        rois, deltas, p.bbox_reg_weights, xyxy=p.xyxy, clip=p.bbox_xform_clip, clip_xyxy=p.bbox_xform_clip_e)
    pred_boxes = box_utils.clip_tiled_boxes_t(pred_boxes, im_hw[0], im_hw[1])
    return _per_class_columns(pred_boxes, num_classes, p.cls_agnostic_bbox_reg)


def box_results_with_nms_and_limit(scores, boxes, confs, params):
    """Detectron's `box_results_with_nms_and_limit` (KL-Loss version), for numpy arrays or tensors.

    For each class j >= 1: detections with score > score_thresh, then KL-Loss's soft-NMS with
    variance voting (params.std_nms, sigmas `confs` (R, 4K)), or else Detectron's soft-NMS
    (params.soft_nms) or greedy NMS at params.nms, then optional box voting. Over all classes only
    detections scoring at least the detections_per_im-th best score are kept (ties may keep
    more). Returns numpy (scores (M,), boxes (M, 4), cls_boxes) with cls_boxes[j] (N_j, 5) float32,
    cls_boxes[0] empty.

    Greedy NMS (nms_ops.batched_nms_t) suppresses at IoU >= params.nms as Detectron's kernel; it
    can differ from it only when equal scores tie.
    """
    dets, det_classes = final_detections_t(scores, boxes, confs, params)
    dets = dets.cpu().numpy()
    cls_boxes = _split_by_class(dets, det_classes.cpu().numpy(), scores.shape[1])
    return dets[:, 4], dets[:, :4], cls_boxes


def _cls_boxes(dets, det_classes, num_classes):
    return _split_by_class(dets.cpu().numpy(), det_classes.cpu().numpy(), num_classes)


def final_detections_t(scores, boxes, confs, params):
    """box_results_with_nms_and_limit's detections before they leave the device: (dets (M, 5)
    float32 [x1, y1, x2, y2, score], det_classes (M,) int64), grouped by ascending class, tensors
    on the scores' device."""
    p = params
    scores, boxes = torch.as_tensor(scores), torch.as_tensor(boxes)
    num_classes = scores.shape[1]
    roi_idx, classes = _candidates_t(scores, p.score_thresh)
    # float32 like Detectron's dets_j = hstack((boxes_j, scores_j)).astype(np.float32)
    all_dets = torch.cat([_class_columns_t(boxes, roi_idx, classes),
                          scores[roi_idx, classes][:, None]], dim=1).float()
    if p.std_nms:
        if confs is None:
            raise ConfigValueError(
                'STD_NMS True needs the per-box sigmas (confs) of a PRED_STD model')
        sigmas = _class_columns_t(torch.as_tensor(confs, device=scores.device), roi_idx, classes)
        dets, det_classes, after_soft = _kl_soft_nms_t(all_dets, classes, sigmas.float(), num_classes, p,
                                                       with_candidates=p.bbox_vote)
        all_dets = all_dets if after_soft is None else after_soft
    elif p.soft_nms:
        dets, det_classes = _detectron_soft_nms(all_dets, classes, num_classes, p)
    else:
        keep = nms_ops.batched_nms_t(all_dets[:, :4], all_dets[:, 4], classes, p.nms)
        # Detectron's NMS lists the survivors of a class in RoI order, i.e. candidate order.
        keep = keep.sort().values
        dets, det_classes = all_dets[keep], classes[keep]
    if p.bbox_vote:
        # all_dets keeps its per-class row counts through every branch, so `classes` still labels it.
        dets = _box_voting(dets, det_classes, all_dets, classes, num_classes, p)
    return _limit_detections_t(dets, det_classes, p.detections_per_im)


def _candidates_t(scores, score_thresh):
    """RoI and class (>= 1) of every score above score_thresh, grouped by ascending class and in
    RoI order within a class, as Detectron's per-class `np.where`."""
    class_idx, roi_idx = torch.nonzero(scores[:, 1:].T > score_thresh, as_tuple=True)
    return roi_idx, class_idx + 1


def _class_columns_t(per_class, roi_idx, classes):
    """The 4 columns of each candidate's class in an (R, 4K) array."""
    return per_class.reshape(per_class.shape[0], per_class.shape[1] // 4, 4)[roi_idx, classes]


def _limit_detections_t(dets, classes, max_per_image):
    if max_per_image <= 0 or dets.shape[0] <= max_per_image:
        return dets, classes
    image_thresh = torch.topk(dets[:, 4], max_per_image).values[-1]
    keep = dets[:, 4] >= image_thresh
    return dets[keep], classes[keep]


def _split_by_class(dets, classes, num_classes):
    """cls_boxes list from detections grouped by ascending class."""
    counts = np.bincount(classes, minlength=num_classes)
    return np.split(dets, np.cumsum(counts)[:-1])


def _per_class_numpy(dets, classes, num_classes):
    dets_np, classes_np = dets.cpu().numpy(), classes.cpu().numpy()
    return _split_by_class(dets_np, classes_np, num_classes)


def _detectron_soft_nms(all_dets, classes, num_classes, p):
    """Detectron's soft-NMS (compiled kernel, host side) for each class."""
    kept = [nms_ops.soft_nms(class_dets, sigma=p.soft_nms_sigma, overlap_thresh=p.nms,
                             score_thresh=_DETECTRON_SOFT_NMS_SCORE_THRESH, method=p.soft_nms_method)[0]
            for class_dets in _per_class_numpy(all_dets, classes, num_classes)]
    return _concat_per_class(kept, all_dets.device)


def _box_voting(dets, det_classes, all_dets, classes, num_classes, p):
    """Detectron's box voting (host side) of each class's kept detections with its candidates."""
    voted = [box_utils.box_voting(top, pool, p.bbox_vote_th, scoring_method=p.bbox_vote_scoring_method,
                                  beta=p.bbox_vote_scoring_beta)
             for top, pool in zip(_per_class_numpy(dets, det_classes, num_classes),
                                  _per_class_numpy(all_dets, classes, num_classes))]
    return torch.from_numpy(np.concatenate(voted)).to(dets.device)


def _concat_per_class(per_class_dets, device):
    counts = torch.tensor([len(d) for d in per_class_dets], device=device)
    classes = torch.repeat_interleave(torch.arange(len(per_class_dets), device=device), counts)
    dets = torch.from_numpy(np.concatenate(per_class_dets).astype(np.float32, copy=False))
    return dets.to(device), classes


def _kl_soft_nms_t(all_dets, classes, sigmas, num_classes, p, with_candidates):
    """KL-Loss's `soft` on every class at once, configured like KL-Loss.

    Returns the kept detections (voted boxes, decayed scores, each class in selection order),
    their classes, and (with_candidates, else None) every candidate as `soft` leaves it (kept rows
    first, then the dropped ones with their decayed scores), which is what KL-Loss's TEST.BBOX_VOTE
    votes with since `soft` works in place on the class's detections.
    """
    columns = _SIGMA_COLUMNS_FOR_BOX_COLUMNS[p.sigma_column_order]
    if columns != _SIGMA_COLUMNS_FOR_BOX_COLUMNS['reference']:
        sigmas = sigmas[:, columns]
    counts = torch.bincount(classes - 1, minlength=num_classes - 1)
    if not all_dets.is_cuda:
        # The host kernel takes the candidates as they are grouped, without padding; without box
        # voting it selects only what the per-image limit can keep, and returns only those.
        if not with_candidates:
            kept_dets, kept_sets = soft_nms_with_variance_voting_grouped_cpu(
                all_dets, sigmas, counts, **_kl_soft_settings(p), max_kept=p.detections_per_im, kept_only=True)
            return kept_dets, kept_sets + 1, None
        after_soft, kept = soft_nms_with_variance_voting_grouped_cpu(all_dets, sigmas, counts, **_kl_soft_settings(p))
        return after_soft[kept], classes[kept], after_soft
    width = int(counts.max())
    padded_dets = _pad_by_class(all_dets, classes, counts, width, fill=0.0)
    # Padding sigmas of 1 keep the (zero-weighted) vote terms of padded rows finite.
    padded_sigmas = _pad_by_class(sigmas, classes, counts, width, fill=1.0)
    order, num_kept, voted_boxes, final_scores = soft_nms_with_variance_voting(
        padded_dets[..., :4], padded_dets[..., 4], padded_sigmas, counts, **_kl_soft_settings(p))

    positions = torch.arange(width, device=classes.device)
    kept = positions < num_kept[:, None]
    # One nonzero (one host sync) picks the kept positions, class by class in selection order.
    kept_set, kept_position = kept.nonzero(as_tuple=True)
    kept_row = order[kept_set, kept_position]
    kept_dets = torch.cat([voted_boxes[kept_set, kept_position],
                           final_scores[kept_set, kept_row][:, None]], dim=1)
    kept_classes = kept_set + 1
    if not with_candidates:
        return kept_dets, kept_classes, None
    # Positions beyond num_kept may repeat rows, so only kept positions mark their row.
    selected = torch.zeros_like(kept)
    selected[kept_set, kept_row] = True
    dropped_set, dropped_row = ((positions < counts[:, None]) & ~selected).nonzero(as_tuple=True)
    dropped_dets = torch.cat([padded_dets[dropped_set, dropped_row, :4],
                              final_scores[dropped_set, dropped_row][:, None]], dim=1)
    after_soft = torch.cat([kept_dets, dropped_dets])
    regroup = torch.sort(torch.cat([kept_classes, dropped_set + 1]), stable=True).indices
    return kept_dets, kept_classes, after_soft[regroup]


def _kl_soft_settings(p):
    vote = p.std_method == 'stdiou'
    vote_thresh = p.std_th
    if vote and vote_thresh > 0.1:
        # KL-Loss's py_cpu_nms.soft overrides STD_TH this way; the effective default is 0.01.
        vote_thresh = 0.01
    return {'vote': vote, 'vote_thresh': vote_thresh, 'iou_sigma': p.std_iou_sigma,
                'hard_nms_thresh': p.nms if p.std_soft == 'hard' else None}


def _pad_by_class(values, classes, counts, width, fill):
    """(A, D) rows grouped by class 1..C -> (C, width, D), each class's rows first, then fill."""
    class_rows = classes - 1
    first_of_class = counts.cumsum(0) - counts
    slots = torch.arange(classes.shape[0], device=classes.device) - first_of_class[class_rows]
    padded = values.new_full((counts.shape[0], width, values.shape[1]), fill)
    padded[class_rows, slots] = values
    return padded
