"""Faster R-CNN with FPN or on a C4 body (Detectron's `generalized_rcnn`), optionally with the KL-Loss
box head.

The model is assembled from small modules (body, RPN head, box head, box outputs) plus the
target/proposal functions; all hyper-parameters arrive as plain values from `model_builder`.
"""
from dataclasses import dataclass

import torch
from torch import nn

from detectron.modeling import fast_rcnn_heads, keypoint_rcnn_heads, mask_rcnn_heads, rpn_heads
from detectron.ops.roi_pooling import roi_feature_transform, single_level_roi_transform
from detectron.roi_data.fast_rcnn import (candidate_assignments, fg_rois_per_image, padded_gt_columns, sample_rois,
                                          sample_rois_of_padded_gt, SampledRoIs)
from detectron.roi_data.keypoint_rcnn import keypoint_targets
from detectron.roi_data.mask_rcnn import mask_targets
from detectron.roi_data.rpn import RPNTargets, rpn_targets, rpn_targets_of_padded_gt
from detectron.utils import boxes as box_utils
from detectron.utils.cuda_graphs import graphed_method, graphed_training_method


@dataclass(frozen=True)
class ProposalParams:
    pre_nms_top_n: int
    post_nms_top_n: int
    nms_thresh: float
    min_size: float


@dataclass(frozen=True)
class MaskParams:
    """Detectron's MRCNN values the mask branch needs besides its head module."""
    resolution: int = 28  # MRCNN.RESOLUTION: the side of the targets (twice the pooled side)
    roi_resolution: int = 14
    roi_sampling_ratio: int = 2
    cls_specific: bool = True
    weight_loss: float = 1.0
    roi_xform_method: str = 'RoIAlign'  # MRCNN.ROI_XFORM_METHOD (a C4 body's one map; FPN pools with RoIAlign)
    # v0upshare: the mask head runs on the box head's res5 (its map of the fg RoIs in training, recomputed
    # on the detections at test time) instead of pooled features
    shares_box_head: bool = False


@dataclass(frozen=True)
class KeypointParams:
    """Detectron's KRCNN values the keypoint branch needs besides its head module."""
    heatmap_size: int = 56
    roi_resolution: int = 14
    roi_sampling_ratio: int = 2
    loss_weight: float = 1.0
    normalize_by_visible_keypoints: bool = True


@dataclass(frozen=True)
class RCNNParams:
    """Everything the R-CNN needs besides its modules (Detectron's cfg values, read by the builder)."""
    num_classes: int
    anchor_strides: tuple = (4, 8, 16, 32, 64)
    anchor_sizes: tuple = (32, 64, 128, 256, 512)  # per level, a size or a tuple of sizes (rpn_heads.fpn_anchors)
    aspect_ratios: tuple = (0.5, 1.0, 2.0)
    train_proposals: ProposalParams = ProposalParams(12000, 2000, 0.7, 0.0)
    test_proposals: ProposalParams = ProposalParams(1000, 1000, 0.7, 0.0)
    rpn_positive_overlap: float = 0.7
    rpn_negative_overlap: float = 0.3
    rpn_fg_fraction: float = 0.5
    rpn_batch_size_per_im: int = 256
    rpn_straddle_thresh: float = 0.0
    batch_size_per_im: int = 512
    fg_fraction: float = 0.25
    fg_thresh: float = 0.5
    bg_thresh_hi: float = 0.5
    bg_thresh_lo: float = 0.0
    bbox_reg_weights: tuple = (10.0, 10.0, 5.0, 5.0)
    cls_agnostic_bbox_reg: bool = False
    xyxy: bool = False
    bbox_xform_clips: tuple = (box_utils.DEFAULT_XFORM_CLIP, box_utils.DEFAULT_XFORM_CLIP_XYXY)  # the RPN decode's
    bbox_thresh: float = 0.5  # TRAIN.BBOX_THRESH: RoIs at least this close to a gt box get regression targets
    pred_std: bool = False
    roi_resolution: int = 7
    roi_sampling_ratio: int = 2
    roi_spatial_scales: tuple = (1 / 4, 1 / 8, 1 / 16, 1 / 32)
    roi_canonical_scale: int = 224
    roi_canonical_level: int = 4
    # Detectron's single-scale RPN (C4 bodies): the proposals of each image on their own (no collect
    # across the batch) and the losses loss_rpn_cls / loss_rpn_bbox
    single_scale_rpn: bool = False
    roi_xform_method: str = 'RoIAlign'  # FAST_RCNN.ROI_XFORM_METHOD, with one RoI level (C4)
    train_cuda_graphs: bool = False  # on a GPU, replay body_and_rpn_head's forward and backward in training
    # Padded batch shapes that get graphs (the rest run eagerly). All shapes share one memory pool,
    # so a shape costs about its static outputs and gradients.
    train_max_graphs: int = 8
    mask: MaskParams = MaskParams()  # read only when the model has a mask head
    keypoints: KeypointParams = KeypointParams()  # read only when the model has a keypoint head


class GeneralizedRCNN(nn.Module):
    """`model(images, im_info, targets)` -> losses in training; raw head outputs in inference.

    Detectron's three R-CNN forms: end-to-end (body, RPN, box head), RPN-only (box_head and box_outs
    None: the RPN losses, and proposals with their scores at test: 'rois', 'rpn_scores'), and Fast
    R-CNN on precomputed proposals (rpn None: each target's 'proposals' in training, the `proposals`
    rois argument at test).

    `body_and_rpn_head(images)` is the part of the forward with fixed shapes for a given image size
    (no host synchronisation), so the test path can replay it from a CUDA graph: `model(images,
    im_info, body=...)` takes its outputs from `body` instead. With params.train_cuda_graphs,
    training replays it (forward and backward) from graphs per padded batch shape.
    """

    def __init__(self, conv_body, rpn, box_head, box_outs, params: RCNNParams, mask_head=None, keypoint_head=None):
        super().__init__()
        self.conv_body = conv_body
        self.rpn = rpn
        self.box_head = box_head
        self.box_outs = box_outs
        self.mask_head = mask_head  # Mask R-CNN (MODEL.MASK_ON) or None
        self.keypoint_head = keypoint_head  # Keypoint R-CNN (MODEL.KEYPOINTS_ON) or None
        self.params = params
        self.channels_last = False

    def use_channels_last(self):
        """Store the body (ResNet and FPN) and the RPN head channels_last; images enter the body in
        that layout. cuDNN runs bfloat16 convolutions in NHWC and converts NCHW tensors around each
        one, a sizeable part of the training step's kernels; stored NHWC they need none, and the
        losses of the step are the same bit for bit (BENCHMARKS.md, "Training speed"). RoIAlign and the box head
        read the features as they come."""
        self.conv_body.to(memory_format=torch.channels_last)
        if self.rpn is not None:
            self.rpn.to(memory_format=torch.channels_last)
        self.channels_last = True

    def forward(self, images, im_info, targets=None, body=None, proposals=None):
        """proposals: a Fast R-CNN's test rois (R, 5) (batch index, box in network-input coordinates)."""
        if body is None and self.training and self.params.train_cuda_graphs:
            body = graphed_training_method(self, 'body_and_rpn_head', GeneralizedRCNN.body_and_rpn_head,
                                           max_graphs=self.params.train_max_graphs)
        flat = (body or self.body_and_rpn_head)(images)
        if self.rpn is None:
            features, logits, deltas, anchors = list(flat), None, None, None
        else:
            features, logits, deltas = _split_in_three(flat)
            anchors = rpn_heads.fpn_anchors(
                [f.shape[-2:] for f in features], self.params.anchor_strides, self.params.anchor_sizes,
                self.params.aspect_ratios, device=images.device)
        if self.training:
            return self._losses(features, logits, deltas, anchors, im_info, targets)
        return self._inference(features, logits, deltas, anchors, im_info, proposals)

    def body_and_rpn_head(self, images):
        """The FPN features, RPN logits and RPN deltas of every level, as one flat tuple (the three
        lists one after the other, equally long: the RPN sees every FPN level)."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        features = self.conv_body(images)
        if self.rpn is None:
            return tuple(features)
        logits, deltas = self.rpn(features)
        return tuple(features) + tuple(logits) + tuple(deltas)

    def _proposals(self, logits, deltas, anchors, im_info, proposal_params, training):
        """(rois, valid): the RPN proposals, collected over the batch in training; with
        fixed_size_training_rois in fixed-size tensors whose real rows valid flags, else valid is None
        (at test: their scores)."""
        args = ([x.detach() for x in logits], [x.detach() for x in deltas], anchors, im_info,
                proposal_params.pre_nms_top_n, proposal_params.post_nms_top_n, proposal_params.nms_thresh,
                proposal_params.min_size)
        # The single-scale RPN keeps each image's proposals apart, which the fixed-size path does not.
        collect = training and not self.params.single_scale_rpn
        with torch.no_grad():
            if collect and fixed_size_training_rois(im_info.device):
                rois, _, valid = rpn_heads.collected_proposals_fixed_size(
                    *args, xyxy=self.params.xyxy, clips=self.params.bbox_xform_clips)
                return rois, valid
            rois, scores = rpn_heads.generate_proposals(*args, xyxy=self.params.xyxy, collect_across_batch=collect,
                                                        clips=self.params.bbox_xform_clips)
        return rois, None if training else scores

    def _box_outputs(self, features, rois, keep_conv5=False):
        """The box outputs of rois; with keep_conv5 also the res5 RoI head's map under 'conv5'."""
        p = self.params
        box_features = self._pooled(features, rois, p.roi_resolution, p.roi_sampling_ratio, p.roi_xform_method)
        if not keep_conv5:
            return self.box_outs(self.box_head(box_features))
        conv5 = self.box_head.conv5(box_features)
        return dict(self.box_outs(self.box_head.pool(conv5)), conv5=conv5)

    def _pooled(self, features, rois, resolution, sampling_ratio, method='RoIAlign'):
        p = self.params
        if len(p.roi_spatial_scales) == 1:
            return single_level_roi_transform(features[0], rois, method, p.roi_spatial_scales[0], resolution,
                                              sampling_ratio)
        return roi_feature_transform(
            features[:len(p.roi_spatial_scales)], rois, spatial_scales=p.roi_spatial_scales,
            output_size=resolution, sampling_ratio=sampling_ratio,
            canonical_scale=p.roi_canonical_scale, canonical_level=p.roi_canonical_level)

    def mask_logits(self, features, rois):
        """Mask logits (R, C, M, M) of `rois` (R, 5) (batch index, x1, y1, x2, y2 in network-input
        coordinates): the features (the list the box head pools from) pooled at MRCNN.ROI_XFORM_RESOLUTION
        (FPN: RoIAligned on each RoI's level), through the mask head (v0upshare: through the box head's
        res5 first, as Detectron's test net). C is MODEL.NUM_CLASSES with MRCNN.CLS_SPECIFIC_MASK, else 1."""
        m = self.params.mask
        pooled = self._pooled(features, rois, m.roi_resolution, m.roi_sampling_ratio, m.roi_xform_method)
        return self.mask_head(self.box_head.conv5(pooled) if m.shares_box_head else pooled)

    def keypoint_logits(self, features, rois):
        """Keypoint heatmap logits (R, K, M, M) of `rois` (R, 5) as mask_logits, pooled at
        KRCNN.ROI_XFORM_RESOLUTION, through the keypoint head."""
        k = self.params.keypoints
        return self.keypoint_head(self._pooled(features, rois, k.roi_resolution, k.roi_sampling_ratio))

    def _keypoint_targets(self, proposals, proposal_valid, im_info, targets, candidates):
        p = self.params
        return keypoint_targets(proposals, im_info[:, 2], targets, fg_thresh=p.fg_thresh,
                                fg_rois_per_image=fg_rois_per_image(p.fg_fraction, p.batch_size_per_im),
                                heatmap_size=p.keypoints.heatmap_size, proposal_valid=proposal_valid,
                                candidates=candidates)

    def _keypoint_loss(self, features, kt, num_images):
        p = self.params
        normalizer = None
        if not p.keypoints.normalize_by_visible_keypoints:
            # Detectron's keypoint_loss_normalizer: the visible count over a full batch of fg RoIs' keypoints.
            normalizer = kt.weights.sum() / (num_images * p.batch_size_per_im * p.fg_fraction * kt.weights.shape[1])
        return keypoint_rcnn_heads.keypoint_loss(self.keypoint_logits(features, kt.rois), kt.labels, kt.weights,
                                                 loss_weight=p.keypoints.loss_weight, normalizer=normalizer)

    def _losses(self, features, logits, deltas, anchors, im_info, targets):
        p = self.params
        gt_boxes = [t['boxes'] for t in targets]
        gt_classes = [t['classes'] for t in targets]
        gt_crowd = [t['is_crowd'] for t in targets]
        if self.rpn is None:  # Fast R-CNN: the proposals of the roidb (proposal_files.proposal_rows)
            losses, proposals, proposal_valid, sampled = {}, _target_rois(targets, im_info[:, 2]), None, None
        else:
            rpn_t, proposals, proposal_valid, sampled = self._rpn_and_roi_targets(
                logits, deltas, anchors, im_info, gt_boxes, gt_classes, gt_crowd)
            if p.single_scale_rpn:
                losses = rpn_heads.single_scale_rpn_losses(logits, deltas, rpn_t)
            else:
                losses = rpn_heads.rpn_losses(logits, deltas, rpn_t, ims_per_batch=len(targets),
                                              batch_size_per_im=p.rpn_batch_size_per_im)
            if self.box_head is None:  # RPN-only
                return losses
        # The keypoint RoIs are drawn from the same candidates as the box head's: their overlaps computed once.
        candidates = (candidate_assignments(proposals, im_info[:, 2], gt_boxes, gt_classes, gt_crowd)
                      if self.keypoint_head is not None else None)
        if sampled is None:
            sampled = sample_rois(proposals, im_info[:, 2], gt_boxes, gt_classes, gt_crowd, **self._sampling_args(),
                                  proposal_valid=proposal_valid, candidates=candidates)
        if self.mask_head is not None:
            # The compact targets' host sync comes before the box head is queued, so it waits for little.
            mt = mask_targets(sampled.rois, sampled.labels, im_info[:, 2], targets, resolution=p.mask.resolution,
                              cls_specific=p.mask.cls_specific,
                              max_rows=fixed_size_mask_rows(len(targets), p, sampled.valid is not None))
        if self.keypoint_head is not None:
            kt = self._keypoint_targets(proposals, proposal_valid, im_info, targets, candidates)
        shares_res5 = self.mask_head is not None and p.mask.shares_box_head
        out = self._box_outputs(features, sampled.rois, keep_conv5=shares_res5)
        box_targets = (sampled.bbox_targets, sampled.bbox_inside_weights, sampled.bbox_outside_weights)
        losses.update(fast_rcnn_heads.fast_rcnn_losses(
            out['cls_score'], out['bbox_pred'], sampled.labels, *box_targets, valid=sampled.valid))
        if p.pred_std:
            losses['loss_bbox'] = fast_rcnn_heads.kl_loss(
                out['bbox_pred'], out['bbox_pred_std'], *box_targets, valid=sampled.valid)
        if self.mask_head is not None:
            # v0upshare trains on the box head's res5 map of the mask RoIs (Detectron's SampleAs).
            logits = self.mask_head(out['conv5'][mt.rows]) if shares_res5 else self.mask_logits(features, mt.rois)
            losses['loss_mask'] = mask_rcnn_heads.mask_loss(logits, mt.classes, mt.masks, weight=p.mask.weight_loss)
        if self.keypoint_head is not None:
            losses['loss_kps'] = self._keypoint_loss(features, kt, len(targets))
        return losses

    def _rpn_and_roi_targets(self, logits, deltas, anchors, im_info, gt_boxes, gt_classes, gt_crowd):
        """The RPN targets and, with a box head, the training proposals (rois, valid) and RoIs (SampledRoIs,
        None when the caller samples them: a keypoint head samples its RoIs from the same candidates); None
        for what the model lacks. With training CUDA graphs on a GPU (the fixed-size proposals) they are
        replayed from a graph per padded batch shape and number of gt columns: launched op by op, the RPN
        targets and the RoI sampling took 3.1 and 3.9 ms of the 25 ms host time of a batch-2 step
        (BENCHMARKS.md, "Training speed"). Only up to _GRAPHED_RPN_PAIRS (image, anchor, gt column)
        triples: the graphs' pool keeps the stage's overlap tensors reserved, and the larger the batch,
        the less of its step is host time (batch 16 is GPU-bound)."""
        p = self.params
        columns = _gt_columns(gt_boxes)
        pairs = len(gt_boxes) * columns * sum(level.shape[:3].numel() for level in anchors)
        if (p.train_cuda_graphs and not p.single_scale_rpn and fixed_size_training_rois(im_info.device)
                and pairs <= _GRAPHED_RPN_PAIRS):
            gt = padded_gt_columns(gt_boxes, gt_classes, gt_crowd, im_info, num_columns=columns)
            stage = graphed_method(self, 'rpn_and_roi_targets', GeneralizedRCNN._fixed_size_rpn_and_roi_targets,
                                   max_graphs=2 * p.train_max_graphs, replaces=True, draws_random=True)
            flat = stage(*[x.detach() for x in logits + deltas], im_info, *gt)
            num_levels = len(logits)
            rpn_t = RPNTargets(*(list(flat[i * num_levels:(i + 1) * num_levels]) for i in range(4)))
            rois, valid, *sampled = flat[4 * num_levels:] or (None, None)
            return rpn_t, rois, valid, SampledRoIs(*sampled) if sampled else None
        rpn_t = rpn_targets(anchors, gt_boxes, gt_crowd, im_info, **self._rpn_target_args())
        if self.box_head is None:
            return rpn_t, None, None, None
        return (rpn_t,) + self._proposals(logits, deltas, anchors, im_info, p.train_proposals, training=True) + (None,)

    def _fixed_size_rpn_and_roi_targets(self, *tensors):
        """_rpn_and_roi_targets' fixed-size path as one flat tuple of tensors, from (logits of each
        level, deltas of each level, im_info, and the gt padded to G columns: boxes (B, G, 4), classes,
        crowd and present (B, G)): shapes fixed by theirs, no host synchronisation."""
        p = self.params
        num_levels = (len(tensors) - 5) // 2
        logits, deltas = list(tensors[:num_levels]), list(tensors[num_levels:2 * num_levels])
        im_info, gt_boxes, gt_classes, gt_crowd, gt_present = tensors[2 * num_levels:]
        anchors = rpn_heads.fpn_anchors([x.shape[-2:] for x in logits], p.anchor_strides, p.anchor_sizes,
                                        p.aspect_ratios, device=im_info.device)
        rpn_gt = gt_boxes * im_info[:, 2].view(-1, 1, 1)  # network-input coordinates, as rpn_targets
        rpn_t = rpn_targets_of_padded_gt(anchors, rpn_gt, gt_present & ~gt_crowd, im_info, **self._rpn_target_args())
        flat = tuple(rpn_t.labels + rpn_t.bbox_targets + rpn_t.bbox_inside_weights + rpn_t.bbox_outside_weights)
        if self.box_head is None:
            return flat
        rois, valid = self._proposals(logits, deltas, anchors, im_info, p.train_proposals, training=True)
        if self.keypoint_head is not None:
            return flat + (rois, valid)
        sampled = sample_rois_of_padded_gt(rois, valid, im_info[:, 2], gt_boxes, gt_classes, gt_crowd, gt_present,
                                           **self._sampling_args())
        return flat + (rois, valid) + tuple(sampled)

    def _rpn_target_args(self):
        p = self.params
        return dict(positive_overlap=p.rpn_positive_overlap, negative_overlap=p.rpn_negative_overlap,
                    fg_fraction=p.rpn_fg_fraction, batch_size_per_im=p.rpn_batch_size_per_im,
                    straddle_thresh=p.rpn_straddle_thresh, xyxy=p.xyxy)

    def _sampling_args(self):
        p = self.params
        return dict(num_classes=p.num_classes, batch_size_per_im=p.batch_size_per_im, fg_fraction=p.fg_fraction,
                    fg_thresh=p.fg_thresh, bg_thresh_hi=p.bg_thresh_hi, bg_thresh_lo=p.bg_thresh_lo,
                    bbox_reg_weights=p.bbox_reg_weights, bbox_thresh=p.bbox_thresh, cls_agnostic=p.cls_agnostic_bbox_reg,
                    xyxy=p.xyxy)

    def _inference(self, features, logits, deltas, anchors, im_info, proposals):
        if self.rpn is None:
            rois = proposals
        else:
            rois, scores = self._proposals(logits, deltas, anchors, im_info, self.params.test_proposals,
                                           training=False)
            if self.box_head is None:
                return {'rois': rois, 'rpn_scores': scores}
        out = self._box_outputs(features, rois)
        result = {'rois': rois, 'cls_prob': out['cls_prob'].float(),
                  'bbox_pred': out['bbox_pred'].float()}
        if 'bbox_pred_std' in out:
            result['bbox_pred_std'] = out['bbox_pred_std'].float()
        if self.mask_head is not None or self.keypoint_head is not None:
            # For mask_logits / keypoint_logits on the final detections. Replayed from a CUDA graph, these are the
            # graph's buffers: the caller uses them before the next forward.
            result['features'] = features
        return result


def fixed_size_training_rois(device):
    """Whether training proposals and sampled RoIs come in fixed-size tensors (with validity flags):
    on a GPU, where each host synchronisation of the compact ones leaves it idle while Python
    launches the rest of the step (BENCHMARKS.md, "Training speed"); the CPU runs the compact ones
    and Detectron's own NMS kernel."""
    return device.type == 'cuda'


# Up to 4 images of Detectron's 128 fg RoIs each: the mask head runs on every row of fixed-size mask targets,
# fg or not, and larger batches are GPU-bound (BENCHMARKS.md, "Training speed"), where a host sync costs less.
_FIXED_SIZE_MASK_ROWS = 512


def fixed_size_mask_rows(num_images, params, fixed_size_rois):
    """The rows of fixed-size mask targets (mask_rcnn.mask_targets' max_rows: no host sync) for fixed-size
    training RoIs of num_images images, up to _FIXED_SIZE_MASK_ROWS; else None (the compact targets)."""
    rows = num_images * fg_rois_per_image(params.fg_fraction, params.batch_size_per_im)
    return rows if fixed_size_rois and rows <= _FIXED_SIZE_MASK_ROWS else None


# About 0.5 GB per float32 overlap tensor: 2 images of 800 x 1333 (267k anchors) with up to 128 gt columns.
_GRAPHED_RPN_PAIRS = 2 ** 27


def _gt_columns(gt_boxes):
    """The gt columns of the graphed RPN stage: the most gt boxes of an image rounded up to a power of
    two (at least 16), so that a handful of graphs serve every batch."""
    most = max([1] + [len(boxes) for boxes in gt_boxes])
    return max(16, 1 << (most - 1).bit_length())


def _target_rois(targets, im_scales):
    """The targets' 'proposals' (original coordinates) as rois (R, 5) of the network input."""
    return torch.cat([torch.cat((torch.full_like(t['proposals'][:, :1], i), t['proposals'] * im_scales[i]), dim=1)
                      for i, t in enumerate(targets)])


def _split_in_three(flat):
    n = len(flat) // 3
    return list(flat[:n]), list(flat[n:2 * n]), list(flat[2 * n:])
