"""cfg -> Faster R-CNN with FPN or on a C4 body (MODEL.TYPE generalized_rcnn): the model, its training batches
(Detectron's scale/flip/im_info minibatches) and its test-time detector (box decoding, NMS,
soft-NMS or KL-Loss's variance voting); also Detectron's RPN-only models (MODEL.RPN_ONLY: proposals
and their recall) and Fast R-CNN on precomputed proposals (MODEL.FASTER_RCNN False: TRAIN/TEST.PROPOSAL_FILES); with
MODEL.MASK_ON / MODEL.KEYPOINTS_ON the mask and keypoint heads."""
import dataclasses
import functools
import logging

import numpy as np
import torch

from detectron.checkpoint.c2_weights import load_weights, load_weights_and_momentum
from detectron.datasets.json_dataset_evaluator import DETECTRON_RESULTS
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.datasets.test_results import ProposalResults
from detectron.modeling import ResNet, keypoint_rcnn_builder, rcnn_export, rcnn_inference, test_time_aug
from detectron.modeling.fast_rcnn_heads import FastRCNNOutputs, Roi2MLPHead, RoiXConv1FCGNHead
from detectron.modeling.generalized_rcnn import GeneralizedRCNN, MaskParams, ProposalParams, RCNNParams
from detectron.modeling.keypoint_rcnn_builder import build_keypoint_head, keypoint_params, num_keypoints
from detectron.modeling.mask_rcnn_heads import MASK_HEADS, SHARED_RES5_MASK_HEAD, MaskRCNNHead
from detectron.modeling.rcnn_checks import (C4_BOX_HEAD, C4_STRIDE, CONV_BODIES, box_head_name, check_supported,
                                          has_rpn, is_c4, reads_proposal_files)
from detectron.modeling.model_type import (Exporter, ModelType, batch_setting, checkpoint_setting, register_model_type,
                                          train_cuda_graphs)
from detectron.modeling.norm import group_norm_groups
from detectron.modeling.rpn_heads import FPNRPNHead
from detectron.roi_data.fast_rcnn import fg_rois_per_image
from detectron.roi_data.keypoint_rcnn import invalid_keypoint_minibatch, with_keypoint_priority
from detectron.roi_data.loader import TrainingDataset, aspect_ratio_groups, image_only, to_device
from detectron.roi_data.minibatch import (PROPOSAL_KEYS, TRAINING_KEYS, UnresizedImages, collate_minibatch,
                                          collate_unresized, prepare_training_entry, prepare_unresized_training_entry)
from detectron.utils import blob as blob_utils
from detectron.utils.errors import ConfigValueError

logger = logging.getLogger(__name__)

@register_model_type('generalized_rcnn')
class GeneralizedRCNNType(ModelType):
    def check(self):
        cfg = self.cfg
        check_supported(cfg)
        if cfg.TEST.IMS_PER_BATCH != 1:
            raise ConfigValueError('TEST.IMS_PER_BATCH {} asks R-CNN to detect on several images per call; it tests '
                                   'one image at a time, as Detectron: set it to 1'.format(cfg.TEST.IMS_PER_BATCH))

    def build(self):
        return build_model(self.cfg)

    def output_classes(self):
        return self.cfg.MODEL.NUM_CLASSES

    def load_weights(self, model, path):
        return load_weights(model, path)

    def memory_settings(self, training):
        cfg = self.cfg
        if not training:
            graphs = ['TEST.CUDA_GRAPHS False'] if cfg.TEST.CUDA_GRAPHS else []
            aug = cfg.TEST.BBOX_AUG
            scales = (['lower the largest TEST.BBOX_AUG.SCALES {} / TEST.BBOX_AUG.MAX_SIZE {}'.format(
                tuple(aug.SCALES), aug.MAX_SIZE)] if aug.ENABLED and aug.SCALES else [])
            return '; '.join(['lower TEST.SCALE {} / TEST.MAX_SIZE {}'.format(cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)]
                             + scales + graphs)
        batch = ('TRAIN.RANK_IMS_PER_BATCH {}'.format(tuple(cfg.TRAIN.RANK_IMS_PER_BATCH))
                 if cfg.TRAIN.RANK_IMS_PER_BATCH else 'TRAIN.IMS_PER_BATCH {}'.format(cfg.TRAIN.IMS_PER_BATCH))
        return '; '.join([batch_setting(cfg, batch)] + checkpoint_setting(cfg)
                         + ['lower TRAIN.BATCH_SIZE_PER_IM {} (RoIs per image)'.format(cfg.TRAIN.BATCH_SIZE_PER_IM)])

    def load_training_weights(self, model, path):
        # Detectron's model_final.pkl files hold `<blob>_momentum` (KL-Loss fine-tunes from one).
        return load_weights_and_momentum(model, path)

    def training_roidb(self):
        cfg = self.cfg
        roidb = combined_roidb_for_training(cfg.TRAIN.DATASETS, cfg.TRAIN.USE_FLIPPED, cfg.TRAIN.GT_MIN_AREA,
                                            segms=cfg.MODEL.MASK_ON, num_keypoints=num_keypoints(cfg),
                                            **_training_proposals(cfg))
        for dataset in {id(entry['dataset']): entry['dataset'] for entry in roidb}.values():
            dataset.check_model_classes(cfg.MODEL.NUM_CLASSES, at_least=True)
        return roidb

    def validation_dataset(self, device):
        # The training losses on the validation images: unflipped, at the test scale.
        cfg = self.cfg
        proposals = _training_proposals(cfg, cfg.TEST.PROPOSAL_FILES)
        roidb = combined_roidb_for_training(cfg.TEST.DATASETS, False, cfg.TRAIN.GT_MIN_AREA, segms=cfg.MODEL.MASK_ON,
                                            num_keypoints=num_keypoints(cfg), **proposals)
        return self._samples(roidb, device, scales=(cfg.TEST.SCALE,), max_size=cfg.TEST.MAX_SIZE)

    def validation_losses(self):
        return _validation_losses

    def training_groups(self, roidb):
        return aspect_ratio_groups(roidb) if self.cfg.TRAIN.ASPECT_GROUPING else [True] * len(roidb)

    def training_batch_check(self, roidb):
        # Detectron's loader redraws the minibatches of a Keypoint R-CNN on precomputed proposals that
        # finalize_keypoint_minibatch calls invalid; end to end its RPN's proposals are never judged.
        cfg = self.cfg
        if not _judges_keypoint_minibatches(cfg):
            return None
        return functools.partial(
            invalid_keypoint_minibatch, roidb=roidb, min_count=cfg.KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH,
            seed=cfg.RNG_SEED, scales=tuple(cfg.TRAIN.SCALES), max_size=cfg.TRAIN.MAX_SIZE,
            fg_thresh=cfg.TRAIN.FG_THRESH,
            fg_rois_per_image=fg_rois_per_image(cfg.TRAIN.FG_FRACTION, cfg.TRAIN.BATCH_SIZE_PER_IM),
            heatmap_size=cfg.KRCNN.HEATMAP_SIZE)

    def training_dataset(self, roidb, device):
        return self._samples(roidb, device, scales=tuple(self.cfg.TRAIN.SCALES), max_size=self.cfg.TRAIN.MAX_SIZE)

    def _samples(self, roidb, device, scales, max_size):
        cfg = self.cfg
        if resizes_on_device(cfg, device):
            prepare = functools.partial(prepare_unresized_training_entry, scales=scales, max_size=max_size)
        else:
            prepare = functools.partial(prepare_training_entry, scales=scales, max_size=max_size,
                                        pixel_means=cfg.PIXEL_MEANS)
        if _judges_keypoint_minibatches(cfg):
            prepare = functools.partial(with_keypoint_priority, prepare=prepare)
        keys = (TRAINING_KEYS + (('segms',) if cfg.MODEL.MASK_ON else ())
                + (('gt_keypoints',) if cfg.MODEL.KEYPOINTS_ON else ())
                + (PROPOSAL_KEYS if reads_proposal_files(cfg) else ()))
        return TrainingDataset(roidb, prepare, seed=cfg.RNG_SEED, keys=keys)

    def collate(self, device):
        if resizes_on_device(self.cfg, device):
            return collate_unresized
        return functools.partial(collate_minibatch, stride=image_stride(self.cfg))

    def batch_to_device(self, device):
        return functools.partial(_batch_to_device, device=device, pixel_means=tuple(self.cfg.PIXEL_MEANS),
                                 stride=image_stride(self.cfg))

    def test_inputs(self):
        # The image is resized on the model's device (blob.get_image_blob_t), not in the workers.
        return image_only

    def prepare_for_training(self, model):
        # Under bf16 autocast on CUDA, channels_last spares cuDNN's layout conversions around each
        # convolution (GeneralizedRCNN.use_channels_last; BENCHMARKS.md, "Training speed"); float32
        # training and the CPU keep NCHW (on the CPU the kernels round differently in NHWC).
        if self.cfg.SOLVER.AMP.ENABLED and next(model.parameters()).device.type == 'cuda':
            model.use_channels_last()
        return model

    def detector(self):
        cfg = self.cfg
        if cfg.MODEL.RPN_ONLY:
            return functools.partial(_detect_proposals, image_params=image_params(cfg), graphs=test_graphs(cfg))
        proposals = {'dedup_boxes': cfg.DEDUP_BOXES} if reads_proposal_files(cfg) else {}
        aug = test_aug(cfg)
        return functools.partial(_detect, image_params=image_params(cfg), decode_params=decode_params(cfg),
                                 nms_params=nms_params(cfg), mask_thresh=mask_thresh(cfg), graphs=test_graphs(cfg),
                                 aug=aug if aug.bbox or aug.mask or aug.keypoints else None,
                                 keypoint_params=keypoint_params(cfg),
                                 **proposals)

    def results_format(self):
        return dataclasses.replace(DETECTRON_RESULTS, keypoint_confidence=self.cfg.KRCNN.KEYPOINT_CONFIDENCE)

    def test_results(self):
        if self.cfg.MODEL.RPN_ONLY:
            return ProposalResults(class_specific_ar=self.cfg.TEST.CLASS_SPECIFIC_AR)
        return super().test_results()

    def test_proposal_files(self):
        cfg = self.cfg
        if not reads_proposal_files(cfg):
            return {}
        files, names = tuple(cfg.TEST.PROPOSAL_FILES), tuple(cfg.TEST.DATASETS)
        if len(files) != len(names):
            raise ConfigValueError('TEST.PROPOSAL_FILES {} must name one proposal file per TEST.DATASETS entry {} for '
                                   'a Fast R-CNN (MODEL.FASTER_RCNN False; an RPN-only model\'s test_net writes '
                                   'rpn_proposals.pkl)'.format(files, names))
        return dict(zip(names, files))

    def best_metric(self):
        return ('box_proposal/AR@1000', 'max') if self.cfg.MODEL.RPN_ONLY else super().best_metric()

    def exporter(self, model):
        cfg = self.cfg
        if cfg.MODEL.RPN_ONLY or not has_rpn(cfg) or is_c4(cfg) or cfg.MODEL.KEYPOINTS_ON:
            raise ConfigValueError('export builds end-to-end Faster / Mask R-CNN with an FPN body; this model (RPN-only, '
                                   'Fast R-CNN on proposal files, a C4 body or keypoints) has no export')
        params = rcnn_export.RCNNGraphParams(image_params(cfg), decode_params(cfg), nms_params(cfg), mask_thresh(cfg))
        rcnn_export.check_exportable(params)
        names = rcnn_export.output_names(model)
        return Exporter(rcnn_export.RCNNGraph(model, params), functools.partial(rcnn_export.graph_inputs, params=params),
                        functools.partial(rcnn_export.graph_detections, params=params,
                                          num_classes=cfg.MODEL.NUM_CLASSES),
                        rcnn_export.RCNN_INPUT_NAMES, names, rcnn_export.dynamic_axes(names))


# Detectron's deprecated MODEL.TYPE names (its model_builder.py): each builds generalized_rcnn, said once
# with the keys that choose the form today; outputs still go under .../<MODEL.TYPE>/ as Detectron's did.
_DEPRECATED_TYPES = {
    'fast_rcnn': '', 'faster_rcnn': ' with MODEL.FASTER_RCNN True', 'mask_rcnn': ' with MODEL.MASK_ON True',
    'keypoint_rcnn': ' with MODEL.KEYPOINTS_ON True', 'rpn': ' with MODEL.RPN_ONLY True',
    'mask_and_keypoint_rcnn': ' with MODEL.MASK_ON True and MODEL.KEYPOINTS_ON True',
    'fpn_rpn': ' with MODEL.RPN_ONLY True and FPN enabled via configs',
}


def _register_deprecated_type(name, advice):
    class DeprecatedRCNNType(GeneralizedRCNNType):
        deprecated = True

        def check(self):
            logger.warning('Deprecated: use MODEL.TYPE generalized_rcnn%s (MODEL.TYPE %s builds the same model)',
                           advice, name)
            super().check()
    DeprecatedRCNNType.__qualname__ = 'DeprecatedRCNNType[{}]'.format(name)
    register_model_type(name)(DeprecatedRCNNType)


for _name, _advice in _DEPRECATED_TYPES.items():
    _register_deprecated_type(_name, _advice)


def _training_proposals(cfg, files=None):
    """combined_roidb_for_training's proposal arguments: a Fast R-CNN's files (TRAIN.PROPOSAL_FILES)."""
    if not reads_proposal_files(cfg):
        return {}
    return {'proposal_files': tuple(cfg.TRAIN.PROPOSAL_FILES if files is None else files),
            'crowd_filter_thresh': cfg.TRAIN.CROWD_FILTER_THRESH, 'cache_dir': cfg.DOWNLOAD_CACHE,
            'roi_thresholds': (cfg.TRAIN.FG_THRESH, cfg.TRAIN.BG_THRESH_HI, cfg.TRAIN.BG_THRESH_LO)}


def _judges_keypoint_minibatches(cfg):
    """A Keypoint R-CNN on precomputed proposals: its sampler judges each minibatch's keypoint RoIs."""
    return cfg.MODEL.KEYPOINTS_ON and reads_proposal_files(cfg)


def resizes_on_device(cfg, device):
    """TRAIN.RESIZE_ON_DEVICE on a GPU: the loader workers read and flip, the device does the rest.
    At batch 2 the training step is host-bound, and the workers' float32 blobs (11.7 MB per COCO
    image, copied into pinned memory by the main process) slowed it (BENCHMARKS.md, "Real loops")."""
    return cfg.TRAIN.RESIZE_ON_DEVICE and device.type == 'cuda'


def _batch_to_device(batch, device, pixel_means, stride):
    images, im_info, targets = batch
    if isinstance(images, UnresizedImages):
        uploaded = [to_device(image, device) for image in images.images]
        images = blob_utils.images_blob_t(uploaded, images.scales, pixel_means, stride)
    return to_device((images, im_info, targets), device)


def _validation_losses(model, batch):
    """Training-mode losses (RPN and RoI sampling as in training) with the eager body: a CUDA-graphed
    training body keeps its buffers for the backward."""
    with torch.no_grad():
        return model(*batch, body=model.body_and_rpn_head)


def _detect(model, sample, image_params, decode_params, nms_params, mask_thresh, graphs, aug, keypoint_params,
            dedup_boxes=None):
    proposals = {}
    if dedup_boxes is not None:
        if 'proposals' not in sample:
            raise ConfigValueError('a Fast R-CNN (MODEL.FASTER_RCNN False) detects on precomputed proposals: test it '
                                   'with tools/test_net.py and TEST.PROPOSAL_FILES; it cannot detect on an image alone')
        if not len(sample['proposals']):  # Detectron's test_engine skips an image without proposals
            return _no_detections(model.params.num_classes, mask_thresh, keypoint_params)
        proposals = {'proposals': sample['proposals'], 'dedup_boxes': dedup_boxes}
    detect = rcnn_inference.im_detect_all if aug is None else functools.partial(test_time_aug.im_detect_all, aug=aug)
    return detect(model, sample['image'], image_params, decode_params, nms_params, mask_thresh=mask_thresh,
                  keypoint_params=keypoint_params, **proposals, **graphs)


def _no_detections(num_classes, mask_thresh, keypoint_params):
    """im_detect_all's result for an image without detections."""
    cls_boxes = [np.zeros((0, 5), np.float32) for _ in range(num_classes)]
    cls_segms = None if mask_thresh is None else [[] for _ in cls_boxes]
    if keypoint_params is not None:
        return cls_boxes, cls_segms, [[] for _ in cls_boxes]
    return cls_boxes if cls_segms is None else (cls_boxes, cls_segms)


def _detect_proposals(model, sample, image_params, graphs):
    return rcnn_inference.im_proposals(model, sample['image'], image_params, **graphs)


def image_stride(cfg):
    """The multiple image blobs are padded to: FPN.COARSEST_STRIDE, or none (1) for a C4 body (which
    needs FPN.FPN_ON False: Detectron's get_max_shape pads only with FPN)."""
    return 1 if is_c4(cfg) else cfg.FPN.COARSEST_STRIDE


def test_aug(cfg):
    """test_time_aug.Augmentations of TEST.BBOX_AUG, TEST.MASK_AUG and TEST.KPS_AUG (a part's None when not
    ENABLED; masks only with MODEL.MASK_ON, keypoints only with MODEL.KEYPOINTS_ON)."""
    return test_time_aug.Augmentations(
        bbox=box_aug(cfg) if cfg.TEST.BBOX_AUG.ENABLED else None,
        mask=mask_aug(cfg) if cfg.TEST.MASK_AUG.ENABLED and cfg.MODEL.MASK_ON else None,
        keypoints=keypoint_rcnn_builder.kps_aug(cfg) if cfg.TEST.KPS_AUG.ENABLED and cfg.MODEL.KEYPOINTS_ON else None)


def box_aug(cfg):
    """test_time_aug.BoxAug of TEST.BBOX_AUG."""
    box = cfg.TEST.BBOX_AUG
    return test_time_aug.BoxAug(test_time_aug.AugTransforms(
        h_flip=box.H_FLIP, scales=tuple(box.SCALES), max_size=box.MAX_SIZE, scale_h_flip=box.SCALE_H_FLIP,
        aspect_ratios=tuple(box.ASPECT_RATIOS), aspect_ratio_h_flip=box.ASPECT_RATIO_H_FLIP), box.SCORE_HEUR,
        box.COORD_HEUR)


def mask_aug(cfg):
    """test_time_aug.MaskAug of TEST.MASK_AUG."""
    mask = cfg.TEST.MASK_AUG
    return test_time_aug.MaskAug(test_time_aug.AugTransforms(
        h_flip=mask.H_FLIP, scales=tuple(mask.SCALES), max_size=mask.MAX_SIZE, scale_h_flip=mask.SCALE_H_FLIP,
        aspect_ratios=tuple(mask.ASPECT_RATIOS), aspect_ratio_h_flip=mask.ASPECT_RATIO_H_FLIP), mask.HEUR)


def mask_thresh(cfg):
    """rcnn_inference.im_detect_all's mask_thresh: MRCNN.THRESH_BINARIZE of a Mask R-CNN, else None."""
    return cfg.MRCNN.THRESH_BINARIZE if cfg.MODEL.MASK_ON else None


def test_graphs(cfg):
    """The CUDA-graph keyword arguments of rcnn_inference's detection functions."""
    return {'cuda_graphs': cfg.TEST.CUDA_GRAPHS, 'max_graph_shapes': cfg.TEST.CUDA_GRAPHS_MAX_SHAPES}


def build_model(cfg):
    conv_body = build_conv_body(cfg)
    num_rpn_levels = cfg.FPN.RPN_MAX_LEVEL - cfg.FPN.RPN_MIN_LEVEL + 1
    num_anchors = (len(cfg.RPN.SIZES) * len(cfg.RPN.ASPECT_RATIOS) if is_c4(cfg)
                   else len(cfg.FPN.RPN_ASPECT_RATIOS))
    rpn = FPNRPNHead(conv_body.out_channels, num_anchors=num_anchors) if has_rpn(cfg) else None
    box_head = box_outs = None
    if not cfg.MODEL.RPN_ONLY:
        box_head = build_box_head(cfg, conv_body.out_channels)
        box_outs = FastRCNNOutputs(box_head.dim_out, cfg.MODEL.NUM_CLASSES,
                                   cls_agnostic_bbox_reg=cfg.MODEL.CLS_AGNOSTIC_BBOX_REG,
                                   pred_std=cfg.PRED_STD)
    mask_head = build_mask_head(cfg, box_head.dim_out if is_c4(cfg) else conv_body.out_channels) \
        if cfg.MODEL.MASK_ON else None
    keypoint_head = build_keypoint_head(cfg, conv_body.out_channels) if cfg.MODEL.KEYPOINTS_ON else None
    return GeneralizedRCNN(conv_body, rpn, box_head, box_outs, rcnn_params(cfg, num_rpn_levels), mask_head=mask_head,
                           keypoint_head=keypoint_head)


def _gn_groups(cfg):
    """dim -> GroupNorm groups, Detectron's get_group_gn on GROUP_NORM.NUM_GROUPS / DIM_PER_GP."""
    return functools.partial(group_norm_groups, num_groups=cfg.GROUP_NORM.NUM_GROUPS,
                             dim_per_group=cfg.GROUP_NORM.DIM_PER_GP)


def build_box_head(cfg, dim_in):
    fast = cfg.FAST_RCNN
    if fast.ROI_BOX_HEAD == C4_BOX_HEAD:
        return ResNet.ResNetRoIConv5Head(dim_in, roi_size=fast.ROI_XFORM_RESOLUTION, **_resnet_block_kwargs(cfg))
    if box_head_name(cfg) == 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head':
        return RoiXConv1FCGNHead(dim_in, roi_size=fast.ROI_XFORM_RESOLUTION, conv_dim=fast.CONV_HEAD_DIM,
                                 num_convs=fast.NUM_STACKED_CONVS, hidden_dim=fast.MLP_HEAD_DIM,
                                 gn_groups=_gn_groups(cfg), gn_eps=cfg.GROUP_NORM.EPSILON)
    return Roi2MLPHead(dim_in, roi_size=fast.ROI_XFORM_RESOLUTION, hidden_dim=fast.MLP_HEAD_DIM)


def build_mask_head(cfg, dim_in):
    """The mask head on dim_in channels: pooled features, or the res5 map of the C4 box head (v0upshare)."""
    num_convs, use_gn = (0, False) if is_c4(cfg) else MASK_HEADS[cfg.MRCNN.ROI_MASK_HEAD]
    return MaskRCNNHead(dim_in, cfg.MODEL.NUM_CLASSES if cfg.MRCNN.CLS_SPECIFIC_MASK else 1, num_convs=num_convs,
                        dim_reduced=cfg.MRCNN.DIM_REDUCED, use_gn=use_gn, gn_groups=_gn_groups(cfg),
                        gn_eps=cfg.GROUP_NORM.EPSILON, conv_init=cfg.MRCNN.CONV_INIT)


def _norm_kind(cfg):
    funcs = (cfg.RESNETS.TRANS_FUNC, cfg.RESNETS.STEM_FUNC, cfg.RESNETS.SHORTCUT_FUNC)
    if any('_gn_' in f for f in funcs):
        return 'gn'
    if any(f.startswith(('bottleneck_bn_', 'basic_bn_transformation')) for f in funcs):
        return 'bn'
    return 'affine'


def _resnet_block_kwargs(cfg):
    """The ResNet block settings shared by the bodies and the res5 RoI head."""
    return dict(gn_num_groups=cfg.GROUP_NORM.NUM_GROUPS, gn_dim_per_group=cfg.GROUP_NORM.DIM_PER_GP,
                gn_eps=cfg.GROUP_NORM.EPSILON, stride_1x1=cfg.RESNETS.STRIDE_1X1, norm=_norm_kind(cfg),
                num_groups=cfg.RESNETS.NUM_GROUPS, width_per_group=cfg.RESNETS.WIDTH_PER_GROUP)


def build_conv_body(cfg, **fpn_levels):
    """The body cfg names; fpn_levels: an FPN body's min_level / max_level (P2..P6 by default)."""
    fpn_kwargs = {} if is_c4(cfg) else dict(
        fpn_dim=cfg.FPN.DIM, fpn_use_gn=cfg.FPN.USE_GN, zero_init_lateral=cfg.FPN.ZERO_INIT_LATERAL,
        coarsest_stride=cfg.FPN.COARSEST_STRIDE, extra_conv_levels=cfg.FPN.EXTRA_CONV_LEVELS, **fpn_levels)
    body = CONV_BODIES[cfg.MODEL.CONV_BODY](
        freeze_at=cfg.TRAIN.FREEZE_AT, checkpoint_stages=cfg.TRAIN.CHECKPOINT_ACTIVATIONS,
        **_resnet_block_kwargs(cfg), **fpn_kwargs)
    if cfg.TRAIN.FREEZE_CONV_BODY:  # Detectron's StopGradient on the body's outputs: ResNet and FPN stay as loaded
        body.requires_grad_(False)
    return body


def _levels(cfg, num_rpn_levels):
    """RCNNParams' anchor and RoI-level fields: FPN's levels, or the one map of a C4 body with every
    RPN.SIZES on it (Detectron's add_single_scale_rpn_outputs)."""
    if is_c4(cfg):
        return dict(anchor_strides=(cfg.RPN.STRIDE,), anchor_sizes=(tuple(cfg.RPN.SIZES),),
                    aspect_ratios=tuple(cfg.RPN.ASPECT_RATIOS), roi_spatial_scales=(1.0 / C4_STRIDE,),
                    single_scale_rpn=True)
    rpn_levels = range(cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL + 1)
    roi_levels = range(cfg.FPN.ROI_MIN_LEVEL, cfg.FPN.ROI_MAX_LEVEL + 1)
    start = cfg.FPN.RPN_ANCHOR_START_SIZE
    return dict(anchor_strides=tuple(2 ** lvl for lvl in rpn_levels),
                anchor_sizes=tuple(start * 2 ** i for i in range(num_rpn_levels)),
                aspect_ratios=tuple(cfg.FPN.RPN_ASPECT_RATIOS),
                roi_spatial_scales=tuple(1.0 / 2 ** lvl for lvl in roi_levels))


def rcnn_params(cfg, num_rpn_levels):
    return RCNNParams(
        num_classes=cfg.MODEL.NUM_CLASSES,
        **_levels(cfg, num_rpn_levels),
        train_proposals=ProposalParams(cfg.TRAIN.RPN_PRE_NMS_TOP_N, cfg.TRAIN.RPN_POST_NMS_TOP_N,
                                       cfg.TRAIN.RPN_NMS_THRESH, cfg.TRAIN.RPN_MIN_SIZE),
        test_proposals=ProposalParams(cfg.TEST.RPN_PRE_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N,
                                      cfg.TEST.RPN_NMS_THRESH, cfg.TEST.RPN_MIN_SIZE),
        rpn_positive_overlap=cfg.TRAIN.RPN_POSITIVE_OVERLAP,
        rpn_negative_overlap=cfg.TRAIN.RPN_NEGATIVE_OVERLAP,
        rpn_fg_fraction=cfg.TRAIN.RPN_FG_FRACTION,
        rpn_batch_size_per_im=cfg.TRAIN.RPN_BATCH_SIZE_PER_IM,
        rpn_straddle_thresh=cfg.TRAIN.RPN_STRADDLE_THRESH,
        batch_size_per_im=cfg.TRAIN.BATCH_SIZE_PER_IM,
        fg_fraction=cfg.TRAIN.FG_FRACTION,
        fg_thresh=cfg.TRAIN.FG_THRESH,
        bg_thresh_hi=cfg.TRAIN.BG_THRESH_HI,
        bg_thresh_lo=cfg.TRAIN.BG_THRESH_LO,
        bbox_reg_weights=tuple(cfg.MODEL.BBOX_REG_WEIGHTS),
        cls_agnostic_bbox_reg=cfg.MODEL.CLS_AGNOSTIC_BBOX_REG,
        xyxy=cfg.XYXY,
        bbox_xform_clips=(cfg.BBOX_XFORM_CLIP, cfg.BBOX_XFORM_CLIPe),
        bbox_thresh=cfg.TRAIN.BBOX_THRESH,
        pred_std=cfg.PRED_STD,
        roi_resolution=cfg.FAST_RCNN.ROI_XFORM_RESOLUTION,
        roi_sampling_ratio=cfg.FAST_RCNN.ROI_XFORM_SAMPLING_RATIO,
        roi_xform_method=cfg.FAST_RCNN.ROI_XFORM_METHOD,
        roi_canonical_scale=cfg.FPN.ROI_CANONICAL_SCALE,
        roi_canonical_level=cfg.FPN.ROI_CANONICAL_LEVEL,
        train_cuda_graphs=train_cuda_graphs(cfg),
        train_max_graphs=cfg.TRAIN.CUDA_GRAPHS_MAX_SHAPES,
        mask=MaskParams(resolution=cfg.MRCNN.RESOLUTION, roi_resolution=cfg.MRCNN.ROI_XFORM_RESOLUTION,
                        roi_sampling_ratio=cfg.MRCNN.ROI_XFORM_SAMPLING_RATIO,
                        cls_specific=cfg.MRCNN.CLS_SPECIFIC_MASK, weight_loss=cfg.MRCNN.WEIGHT_LOSS_MASK,
                        roi_xform_method=cfg.MRCNN.ROI_XFORM_METHOD,
                        shares_box_head=cfg.MRCNN.ROI_MASK_HEAD == SHARED_RES5_MASK_HEAD),
        keypoints=keypoint_rcnn_builder.keypoint_training_params(cfg),
    )


def image_params(cfg):
    return rcnn_inference.ImageParams(scale=cfg.TEST.SCALE, max_size=cfg.TEST.MAX_SIZE,
                                      pixel_means=cfg.PIXEL_MEANS, stride=image_stride(cfg))


def decode_params(cfg):
    return rcnn_inference.BoxDecodeParams(
        bbox_reg=cfg.TEST.BBOX_REG, cls_agnostic_bbox_reg=cfg.MODEL.CLS_AGNOSTIC_BBOX_REG,
        bbox_reg_weights=tuple(cfg.MODEL.BBOX_REG_WEIGHTS), xyxy=cfg.XYXY, bbox_xform_clip=cfg.BBOX_XFORM_CLIP,
        bbox_xform_clip_e=cfg.BBOX_XFORM_CLIPe, std_nms=cfg.STD_NMS)


def nms_params(cfg):
    test = cfg.TEST
    return rcnn_inference.NMSParams(
        score_thresh=test.SCORE_THRESH, nms=test.NMS, detections_per_im=test.DETECTIONS_PER_IM,
        soft_nms=test.SOFT_NMS.ENABLED, soft_nms_method=test.SOFT_NMS.METHOD, soft_nms_sigma=test.SOFT_NMS.SIGMA,
        bbox_vote=test.BBOX_VOTE.ENABLED, bbox_vote_th=test.BBOX_VOTE.VOTE_TH,
        bbox_vote_scoring_method=test.BBOX_VOTE.SCORING_METHOD,
        bbox_vote_scoring_beta=test.BBOX_VOTE.SCORING_METHOD_BETA, std_nms=cfg.STD_NMS, std_method=cfg.STD.METHOD,
        std_soft=cfg.STD.SOFT, std_iou_sigma=cfg.STD.IOU_SIGMA, std_th=cfg.STD_TH,
        sigma_column_order=cfg.STD.SIGMA_COLUMN_ORDER)
