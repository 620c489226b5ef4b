"""The R-CNN (and Mask R-CNN) inference as one exportable graph, and its host-side ends.

`RCNNGraph` wraps a built GeneralizedRCNN (its own modules, no copy) and runs, as graph ops, what
rcnn_inference runs on one image: body and RPN head, anchors of the input's feature sizes, the
proposals (top-k per level, decode, clip, size filter, NMS per level, top-n), RoIAlign on each
RoI's FPN level, the box head, the box decode and clip to the original image, the per-class NMS
and the per-image cap, and with a mask head the M x M mask probabilities of the final detections.
Its input is the float32 blob Detectron's test prepares (mean subtraction, cv2-equivalent resize,
padding: blob.get_image_blob_t, `graph_inputs`), of any size. Out of the graph: that preparation
and, for masks, pasting them into the image (`graph_detections`).
"""
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from detectron.modeling import mask_inference, rcnn_inference, rpn_heads
from detectron.ops import graph_ops, graph_soft_nms
from detectron.utils import blob as blob_utils
from detectron.utils import boxes as box_utils
from detectron.utils.errors import ConfigValueError

RCNN_INPUT_NAMES = ('blob', 'im_info', 'im_hw')


@dataclass(frozen=True)
class RCNNGraphParams:
    image: rcnn_inference.ImageParams
    decode: rcnn_inference.BoxDecodeParams
    nms: rcnn_inference.NMSParams
    mask_thresh: float = None  # MRCNN.THRESH_BINARIZE of a Mask R-CNN, else None


def output_names(model):
    """The graph's outputs: boxes (D, 4) in original-image pixels, scores (D,), classes (D,) int64,
    sigmas (D, 4) with the KL head (exp(alpha / 2), the head's normalised delta units and column
    order), masks (D, M, M) with a mask head."""
    names = ['boxes', 'scores', 'classes']
    if model.params.pred_std:
        names.append('sigmas')
    if model.mask_head is not None:
        names.append('masks')
    return tuple(names)


def dynamic_axes(output_names):
    """ONNX's dynamic axes: the blob's size and the number of detections."""
    return {'blob': {2: 'height', 3: 'width'}, **{name: {0: 'detections'} for name in output_names}}


class RCNNGraph(nn.Module):
    def __init__(self, model, params):
        super().__init__()
        self.model = model
        self.params = params

    def forward(self, blob, im_info, im_hw):
        """blob (1, 3, H, W) float32, im_info (1, 3) = (H, W, im_scale), im_hw (2,) float32 the
        original image's height and width."""
        model, p = self.model, self.model.params
        flat = model.body_and_rpn_head(blob)
        n = len(flat) // 3
        features, logits, deltas = flat[:n], flat[n:2 * n], flat[2 * n:]
        rois = proposals(logits, deltas, im_info, p)
        pooled = self._pooled(features, rois, p.roi_resolution, p.roi_sampling_ratio)
        out = model.box_outs(model.box_head(pooled))
        result = {'cls_prob': out['cls_prob'].float(), 'bbox_pred': out['bbox_pred'].float()}
        decode = self.params.decode
        scores = result['cls_prob']
        # Back to original-image pixels, as rcnn_inference.decode_detections (a tensor scale here).
        boxes = rcnn_inference._decode_boxes_t(rois[:, 1:5] / im_info[0, 2], result['bbox_pred'], scores.shape[1],
                                               im_hw, decode)
        sigmas = None
        if p.pred_std:
            sigmas = rcnn_inference._per_class_columns(box_utils.exp(out['bbox_pred_std'].float() / 2.0),
                                                       scores.shape[1], decode.cls_agnostic_bbox_reg)
        det_boxes, det_scores, classes, roi_idx = detections(scores, boxes.float(), sigmas, self.params.nms,
                                                             p.test_proposals.post_nms_top_n)
        keep = graph_ops.limit_detections(det_scores, self.params.nms.detections_per_im)
        outputs = [det_boxes[keep], det_scores[keep], classes[keep]]
        if p.pred_std:
            outputs.append(rcnn_inference._class_columns_t(sigmas, roi_idx[keep], classes[keep]))
        if model.mask_head is not None:
            outputs.append(self._masks(features, outputs[0], outputs[2], im_info[0, 2]))
        return tuple(outputs)

    def _pooled(self, features, rois, resolution, sampling_ratio):
        p = self.model.params
        return graph_ops.multilevel_roi_align(
            features[:len(p.roi_spatial_scales)], rois, p.roi_spatial_scales, resolution, sampling_ratio,
            p.roi_canonical_scale, p.roi_canonical_level)

    def _masks(self, features, boxes, classes, im_scale):
        """mask_inference.detect_masks in graph ops: the class channel taken by a gather."""
        m = self.model.params.mask
        rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), (boxes.double() * im_scale.double()).float()], dim=1)
        logits = self.model.mask_head(self._pooled(features, rois, m.roi_resolution, m.roi_sampling_ratio))
        channels = classes if logits.shape[1] > 1 else torch.zeros_like(classes)
        size = logits.shape[-1]
        index = channels.view(-1, 1, 1, 1).expand(-1, 1, size, size)
        return torch.sigmoid(logits.gather(1, index).squeeze(1).float())


def detections(scores, boxes, sigmas, nms, max_rois=0):
    """rcnn_inference.final_detections_t before the cap, in graph ops: boxes (D, 4), scores (D,),
    classes (D,) and RoI index (D,) of the detections that NMS (greedy, Detectron's soft-NMS or
    KL-Loss's soft-NMS with variance voting) and box voting leave. scores (R, K), boxes and
    sigmas (R, 4K) (sigmas None without PRED_STD); max_rois > 0: R's bound (see _soft_nms)."""
    roi_idx, classes = rcnn_inference._candidates_t(scores, nms.score_thresh)
    all_boxes = rcnn_inference._class_columns_t(boxes, roi_idx, classes)
    all_scores = scores[roi_idx, classes].float()
    if nms.std_nms or nms.soft_nms:
        det_boxes, det_scores, classes_kept, roi_kept = _soft_nms(scores, boxes, sigmas, nms, max_rois)
    else:
        keep = graph_ops.batched_nms(all_boxes, all_scores, classes, nms.nms)
        det_boxes, det_scores, classes_kept, roi_kept = all_boxes[keep], all_scores[keep], classes[keep], roi_idx[keep]
    if nms.bbox_vote:
        voted = graph_soft_nms.box_voting(torch.cat([det_boxes, det_scores[:, None]], 1), classes_kept,
                                          torch.cat([all_boxes, all_scores[:, None]], 1), classes, nms.bbox_vote_th,
                                          nms.bbox_vote_scoring_method, nms.bbox_vote_scoring_beta)
        det_boxes, det_scores = voted[:, :4], voted[:, 4]
    return det_boxes, det_scores, classes_kept, roi_kept


def _soft_nms(scores, boxes, sigmas, nms, max_rois=0):
    """The first DETECTIONS_PER_IM selections of the soft-NMS of each class (all that its cap can
    keep: graph_soft_nms), the class's candidates in RoI order as the eager path's sets. With
    max_rois > 0 (at least R) the sets are padded to that static width: torch.export then traces
    the unrolled steps with static shapes instead of reasoning about R's symbol in every op."""
    num_rois, num_classes = scores.shape
    if max_rois > 0:
        if not torch.jit.is_tracing():  # torch.export's R is a symbol (the ONNX tracer's a tensor)
            torch._check(num_rois <= max_rois)
        padding = max_rois - num_rois
        scores = torch.cat([scores, scores.new_zeros(padding, num_classes)])
        boxes = torch.cat([boxes, boxes.new_zeros(padding, boxes.shape[1])])
        sigmas = None if sigmas is None else torch.cat([sigmas, sigmas.new_ones(padding, sigmas.shape[1])])
        num_rois = max_rois
    set_boxes = boxes.reshape(num_rois, num_classes, 4)[:, 1:].transpose(0, 1)
    set_scores = scores[:, 1:].T.float()
    # Padded rows score 0, never above the threshold (at least 0).
    live = set_scores > nms.score_thresh
    vote = None
    if nms.std_nms:
        settings = rcnn_inference._kl_soft_settings(nms)
        rescore = graph_soft_nms.KLRescore(settings['hard_nms_thresh'])
        drop_below = graph_soft_nms.KL_DROP_SCORE
        if settings['vote']:
            if sigmas is None:
                raise ConfigValueError('STD_NMS True needs a model with the bbox_pred_std head: set PRED_STD True')
            columns = rcnn_inference._SIGMA_COLUMNS_FOR_BOX_COLUMNS[nms.sigma_column_order]
            set_sigmas = sigmas.reshape(num_rois, num_classes, 4)[:, 1:, columns].transpose(0, 1)
            vote = graph_soft_nms.KLVote(set_boxes, set_sigmas, settings['vote_thresh'], settings['iou_sigma'])
    else:
        rescore = graph_soft_nms.DetectronRescore(nms.soft_nms_method, nms.soft_nms_sigma, nms.nms)
        drop_below = rcnn_inference._DETECTRON_SOFT_NMS_SCORE_THRESH
    rows, valid, sel_scores, sel_boxes = graph_soft_nms.soft_nms_selections(
        set_boxes, set_scores, live, nms.detections_per_im, rescore, drop_below, vote)
    sets, steps = valid.nonzero(as_tuple=True)
    return sel_boxes[sets, steps], sel_scores[sets, steps], sets + 1, rows[sets, steps]


def proposals(logits, deltas, im_info, p):
    """rpn_heads.generate_proposals of one image at test time, in graph ops: rois (R, 5)."""
    pp = p.test_proposals
    top_scores, top_deltas, top_anchors, levels = [], [], [], []
    for level, (level_logits, level_deltas) in enumerate(zip(logits, deltas)):
        stride, size = p.anchor_strides[level], p.anchor_sizes[level]
        scores = rpn_heads._scores_in_anchor_order(level_logits.float())[0]
        order = scores.sort(descending=True).indices
        if pp.pre_nms_top_n > 0:
            order = order[:pp.pre_nms_top_n]
        top_scores.append(scores[order])
        top_deltas.append(rpn_heads._deltas_in_anchor_order(level_deltas.float())[0][order])
        top_anchors.append(anchors(level_logits, stride, size, p.aspect_ratios)[order])
        levels.append(torch.full_like(order, level))
    scores, levels = torch.cat(top_scores), torch.cat(levels)
    boxes = rpn_heads._decoded_and_clipped(torch.cat(top_anchors)[None], torch.cat(top_deltas)[None], im_info,
                                           p.xyxy, p.bbox_xform_clips)[0]
    passes = rpn_heads._keep_min_size_and_center_inside(boxes, im_info.expand(boxes.shape[0], 3), pp.min_size)
    keep = passes.nonzero().squeeze(1)
    boxes, scores, levels = boxes[keep], scores[keep], levels[keep]
    if pp.nms_thresh > 0:
        keep = graph_ops.batched_nms(boxes, scores, levels, pp.nms_thresh)
        if pp.post_nms_top_n > 0:
            keep = keep[graph_ops.top_n_per_group(levels[keep], len(logits), pp.post_nms_top_n)]
    else:
        keep = scores.sort(descending=True).indices
    if pp.post_nms_top_n > 0:
        keep = keep[:pp.post_nms_top_n]
    return torch.cat([boxes.new_zeros(keep.shape[0], 1), boxes[keep]], dim=1)


def anchors(level_logits, stride, size, aspect_ratios):
    """(H * W * A, 4) anchors of a level in Detectron's order (rpn_heads.fpn_anchors), from the
    level's map size as the graph reads it."""
    height, width = level_logits.shape[-2:]
    cell = rpn_heads._cell_anchors(stride, size, tuple(aspect_ratios), level_logits.device)
    shift_x = torch.arange(width, device=cell.device, dtype=torch.float32) * stride
    shift_y = torch.arange(height, device=cell.device, dtype=torch.float32) * stride
    shift_x = shift_x[None, :].expand(shift_y.shape[0], -1)
    shift_y = shift_y[:, None].expand(-1, shift_x.shape[1])
    shifts = torch.stack((shift_x, shift_y, shift_x, shift_y), dim=-1)
    return (shifts[:, :, None, :] + cell).reshape(-1, 4)


def graph_inputs(sample, params):
    """The graph's inputs for one test sample ({'image': BGR uint8 (H, W, 3)}): the blob and
    im_info the eager test makes (blob.get_image_blob_t), and the image's size."""
    ip = params.image
    im = sample['image']
    blob, _, im_info = blob_utils.get_image_blob_t(im, ip.scale, ip.max_size, ip.pixel_means, ip.stride,
                                                   torch.device('cpu'))
    return blob, im_info, torch.tensor(im.shape[:2], dtype=torch.float32)


def graph_detections(outputs, sample, params, num_classes):
    """The graph's outputs (numpy, in output_names' order) -> Detectron's cls_boxes, and for a
    Mask R-CNN (cls_boxes, cls_segms) with the masks pasted into the image as the eager test does
    (mask_inference.segm_results)."""
    boxes, scores, classes = outputs[:3]
    order = np.argsort(classes, kind='stable')
    dets = np.hstack([boxes, scores[:, None]]).astype(np.float32)[order]
    cls_boxes = rcnn_inference._split_by_class(dets, classes[order], num_classes)
    if params.mask_thresh is None:
        return cls_boxes
    masks = np.asarray(outputs[-1])[order]
    im = sample['image']
    if not len(dets):
        return cls_boxes, [[] for _ in cls_boxes]
    return cls_boxes, mask_inference.segm_results(cls_boxes, masks, dets[:, :4], im.shape[0], im.shape[1],
                                                  params.mask_thresh)


def check_exportable(params):
    """ConfigValueError for test settings the graph does not run (they stay on the eager path)."""
    nms = params.nms
    if not (nms.std_nms or nms.soft_nms):
        return
    if nms.detections_per_im <= 0:
        raise ConfigValueError('the exported R-CNN runs soft-NMS for the detections that TEST.DETECTIONS_PER_IM '
                               'can keep; set it above 0 to export')
    if nms.bbox_vote and (nms.std_nms or nms.bbox_vote_scoring_method != 'ID'):
        raise ConfigValueError('the exported R-CNN votes boxes after soft-NMS only with '
                               "TEST.BBOX_VOTE.SCORING_METHOD 'ID' and STD_NMS False (they need the "
                               'whole soft-NMS run); set TEST.BBOX_VOTE.ENABLED False to export')
