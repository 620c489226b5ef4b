"""cfg -> Faster R-CNN with FPN (MODEL.TYPE generalized_rcnn): the model, its training batches
(Detectron's scale/flip/im_info minibatches) and its test-time detector (box decoding, NMS,
soft-NMS or KL-Loss's variance voting)."""
import dataclasses
import functools

import torch

from detectron.checkpoint.c2_weights import load_weights, load_weights_and_momentum
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.datasets.json_dataset_evaluator import DETECTRON_RESULTS, KEYPOINT_CONFIDENCES
from detectron.modeling import FPN, rcnn_inference
from detectron.modeling.fast_rcnn_heads import FastRCNNOutputs, Roi2MLPHead, RoiXConv1FCGNHead
from detectron.modeling.generalized_rcnn import GeneralizedRCNN, KeypointParams, MaskParams, ProposalParams, RCNNParams
from detectron.modeling.keypoint_inference import KeypointInferenceParams
from detectron.modeling.keypoint_rcnn_heads import KEYPOINT_HEADS, KeypointRCNNHead
from detectron.modeling.mask_rcnn_heads import CONV_INITS, MASK_HEADS, MaskRCNNHead
from detectron.modeling.model_type import ModelType, batch_setting, checkpoint_setting, register_model_type
from detectron.modeling.norm import group_norm_groups
from detectron.modeling.rpn_heads import FPNRPNHead
from detectron.roi_data.loader import TrainingDataset, aspect_ratio_groups, image_only, to_device
from detectron.roi_data.minibatch import (TRAINING_KEYS, UnresizedImages, collate_minibatch, collate_unresized,
                                          prepare_training_entry, prepare_unresized_training_entry)
from detectron.utils import blob as blob_utils
from detectron.utils.derived_keys import leaf_value
from detectron.utils.errors import ConfigValueError

_CONV_BODIES = {
    'FPN.add_fpn_ResNet50_conv5_body': FPN.add_fpn_ResNet50_conv5_body,
    'FPN.add_fpn_ResNet101_conv5_body': FPN.add_fpn_ResNet101_conv5_body,
    'FPN.add_fpn_ResNet18_conv5_body': FPN.add_fpn_ResNet18_conv5_body,
    'FPN.add_fpn_ResNet34_conv5_body': FPN.add_fpn_ResNet34_conv5_body,
}
_BOX_HEADS = ('fast_rcnn_heads.add_roi_2mlp_head', 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head')
# Detectron's modeling/name_compat.py: the old name its keypoint configs still use for the 2mlp head.
_OLD_BOX_HEAD_NAMES = {'head_builder.add_roi_2mlp_head': 'fast_rcnn_heads.add_roi_2mlp_head'}

# Detectron features this port does not build: refused loudly rather than silently ignored.
# (RetinaNet and test-time augmentation are refused for every model: core/config.py's _NOT_ACTED_ON.)
_UNSUPPORTED = {'MODEL.RPN_ONLY': 'RPN-only models'}
# MRCNN values of Detectron's other mask heads, which this port does not build: key -> the one value built.
_MRCNN_BUILT = {'MRCNN.ROI_XFORM_METHOD': 'RoIAlign', 'MRCNN.DILATION': 1, 'MRCNN.UPSAMPLE_RATIO': 1,
                'MRCNN.USE_FC_OUTPUT': False}


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
            return '; '.join(['lower TEST.SCALE {} / TEST.MAX_SIZE {}'.format(cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)]
                             + graphs)
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
                                            segms=cfg.MODEL.MASK_ON, num_keypoints=num_keypoints(cfg))
        for dataset in {id(entry['dataset']): entry['dataset'] for entry in roidb}.values():
            dataset.check_model_classes(cfg.MODEL.NUM_CLASSES, at_least=True)
        return roidb

    def validation_dataset(self, device):
        # The training losses on the validation images: unflipped, at the test scale.
        cfg = self.cfg
        roidb = combined_roidb_for_training(cfg.TEST.DATASETS, False, cfg.TRAIN.GT_MIN_AREA, segms=cfg.MODEL.MASK_ON,
                                            num_keypoints=num_keypoints(cfg))
        return self._samples(roidb, device, scales=(cfg.TEST.SCALE,), max_size=cfg.TEST.MAX_SIZE)

    def validation_losses(self):
        return _validation_losses

    def training_groups(self, roidb):
        return aspect_ratio_groups(roidb) if self.cfg.TRAIN.ASPECT_GROUPING else [True] * len(roidb)

    def training_dataset(self, roidb, device):
        return self._samples(roidb, device, scales=tuple(self.cfg.TRAIN.SCALES), max_size=self.cfg.TRAIN.MAX_SIZE)

    def _samples(self, roidb, device, scales, max_size):
        cfg = self.cfg
        if resizes_on_device(cfg, device):
            prepare = functools.partial(prepare_unresized_training_entry, scales=scales, max_size=max_size)
        else:
            prepare = functools.partial(prepare_training_entry, scales=scales, max_size=max_size,
                                        pixel_means=cfg.PIXEL_MEANS)
        keys = (TRAINING_KEYS + (('segms',) if cfg.MODEL.MASK_ON else ())
                + (('gt_keypoints',) if cfg.MODEL.KEYPOINTS_ON else ()))
        return TrainingDataset(roidb, prepare, seed=cfg.RNG_SEED, keys=keys)

    def collate(self, device):
        if resizes_on_device(self.cfg, device):
            return collate_unresized
        return functools.partial(collate_minibatch, stride=self.cfg.FPN.COARSEST_STRIDE)

    def batch_to_device(self, device):
        return functools.partial(_batch_to_device, device=device, pixel_means=tuple(self.cfg.PIXEL_MEANS),
                                 stride=self.cfg.FPN.COARSEST_STRIDE)

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
        return functools.partial(_detect, image_params=image_params(cfg), decode_params=decode_params(cfg),
                                 nms_params=nms_params(cfg), mask_thresh=mask_thresh(cfg), graphs=test_graphs(cfg),
                                 keypoint_params=keypoint_params(cfg))

    def results_format(self):
        return dataclasses.replace(DETECTRON_RESULTS, keypoint_confidence=self.cfg.KRCNN.KEYPOINT_CONFIDENCE)


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


def _detect(model, sample, image_params, decode_params, nms_params, mask_thresh, graphs, keypoint_params):
    return rcnn_inference.im_detect_all(model, sample['image'], image_params, decode_params, nms_params,
                                        mask_thresh=mask_thresh, keypoint_params=keypoint_params, **graphs)


def keypoint_params(cfg):
    """rcnn_inference.im_detect_all's keypoint_params: KRCNN's test settings of a Keypoint R-CNN, else None."""
    if not cfg.MODEL.KEYPOINTS_ON:
        return None
    return KeypointInferenceParams(inference_min_size=cfg.KRCNN.INFERENCE_MIN_SIZE, nms_oks=cfg.KRCNN.NMS_OKS)


def num_keypoints(cfg):
    """The keypoints per object of a Keypoint R-CNN's training data (KRCNN.NUM_KEYPOINTS), 0 without keypoints."""
    return cfg.KRCNN.NUM_KEYPOINTS if cfg.MODEL.KEYPOINTS_ON else 0


def mask_thresh(cfg):
    """rcnn_inference.im_detect_all's mask_thresh: MRCNN.THRESH_BINARIZE of a Mask R-CNN, else None."""
    return cfg.MRCNN.THRESH_BINARIZE if cfg.MODEL.MASK_ON else None


def test_graphs(cfg):
    """The CUDA-graph keyword arguments of rcnn_inference's detection functions."""
    return {'cuda_graphs': cfg.TEST.CUDA_GRAPHS, 'max_graph_shapes': cfg.TEST.CUDA_GRAPHS_MAX_SHAPES}


# Detectron's FPN levels (RPN on P2..P6, RoIs pooled from P2..P5): what the FPN body builds.
_FPN_LEVELS = (2, 6, 2, 5)


def check_supported(cfg):
    """ConfigValueError unless cfg asks for an R-CNN this port builds."""
    for key, feature in _UNSUPPORTED.items():
        if leaf_value(cfg, key):
            raise ConfigValueError('{} True asks for {}, which this port does not support; set it to False'
                                   .format(key, feature))
    if not (cfg.MODEL.FASTER_RCNN and cfg.FPN.FPN_ON and cfg.FPN.MULTILEVEL_RPN and cfg.FPN.MULTILEVEL_ROIS):
        raise ConfigValueError('only end-to-end Faster R-CNN with FPN is supported: set MODEL.FASTER_RCNN, '
                               'FPN.FPN_ON, FPN.MULTILEVEL_RPN and FPN.MULTILEVEL_ROIS to True')
    if cfg.MODEL.CONV_BODY not in _CONV_BODIES:
        raise ConfigValueError("MODEL.CONV_BODY '{}' is not supported; use one of {}".format(
            cfg.MODEL.CONV_BODY, sorted(_CONV_BODIES)))
    if box_head_name(cfg) not in _BOX_HEADS:
        raise ConfigValueError("FAST_RCNN.ROI_BOX_HEAD '{}' is not supported; use one of {}".format(
            cfg.FAST_RCNN.ROI_BOX_HEAD, _BOX_HEADS))
    levels = (cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL, cfg.FPN.ROI_MIN_LEVEL, cfg.FPN.ROI_MAX_LEVEL)
    if levels != _FPN_LEVELS:
        raise ConfigValueError('FPN.RPN_MIN_LEVEL / RPN_MAX_LEVEL / ROI_MIN_LEVEL / ROI_MAX_LEVEL {} are not supported: '
                               'the FPN body gives P2..P6; use {}'.format(levels, _FPN_LEVELS))
    if cfg.PRED_STD and not cfg.PRED_STD_LOG:
        raise ConfigValueError('PRED_STD_LOG False (a head predicting sigma^2 itself, KL-Loss\'s other variant) is not '
                               'ported: training and variance voting read the head as alpha = log(sigma^2); set '
                               'PRED_STD_LOG True, as KL-Loss\'s configs do')
    _check_one_norm(cfg.RESNETS)
    if cfg.FAST_RCNN.ROI_XFORM_METHOD != 'RoIAlign':
        raise ConfigValueError("FAST_RCNN.ROI_XFORM_METHOD '{}' is not supported; use 'RoIAlign'".format(
            cfg.FAST_RCNN.ROI_XFORM_METHOD))
    if cfg.MODEL.MASK_ON:
        _check_mask_head(cfg)
    if cfg.MODEL.KEYPOINTS_ON:
        _check_keypoint_head(cfg)


def box_head_name(cfg):
    """FAST_RCNN.ROI_BOX_HEAD, an old Detectron name mapped to its new one as Detectron's get_func does."""
    return _OLD_BOX_HEAD_NAMES.get(cfg.FAST_RCNN.ROI_BOX_HEAD, cfg.FAST_RCNN.ROI_BOX_HEAD)


def _check_mask_head(cfg):
    mrcnn = cfg.MRCNN
    if mrcnn.ROI_MASK_HEAD not in MASK_HEADS:
        raise ConfigValueError(f"MRCNN.ROI_MASK_HEAD '{mrcnn.ROI_MASK_HEAD}' is not supported; "
                               f'use one of {sorted(MASK_HEADS)}')
    for key, value in _MRCNN_BUILT.items():
        if leaf_value(cfg, key) != value:
            raise ConfigValueError(f'{key} {leaf_value(cfg, key)!r} is not supported: the v1up4convs heads are built '
                                   f'with {value!r}')
    if mrcnn.CONV_INIT not in CONV_INITS:
        raise ConfigValueError(f"MRCNN.CONV_INIT '{mrcnn.CONV_INIT}' is not supported; use one of {list(CONV_INITS)}")
    if mrcnn.RESOLUTION != 2 * mrcnn.ROI_XFORM_RESOLUTION:
        raise ConfigValueError(f'MRCNN.RESOLUTION {mrcnn.RESOLUTION} must be twice MRCNN.ROI_XFORM_RESOLUTION '
                               f'{mrcnn.ROI_XFORM_RESOLUTION}: the head upsamples its pooled features once by 2')


def keypoint_heatmap_size(krcnn):
    """The side of the keypoint head's heatmaps: the pooled side, doubled by each stride-2 transposed
    convolution (USE_DECONV, USE_DECONV_OUTPUT), times UP_SCALE."""
    return (krcnn.ROI_XFORM_RESOLUTION * (2 if krcnn.USE_DECONV else 1) * (2 if krcnn.USE_DECONV_OUTPUT else 1)
            * max(krcnn.UP_SCALE, 1))


def _check_keypoint_head(cfg):
    krcnn = cfg.KRCNN
    if krcnn.ROI_KEYPOINTS_HEAD not in KEYPOINT_HEADS:
        raise ConfigValueError(f"KRCNN.ROI_KEYPOINTS_HEAD '{krcnn.ROI_KEYPOINTS_HEAD}' is not supported; "
                               f'use one of {list(KEYPOINT_HEADS)}')
    if krcnn.NUM_KEYPOINTS < 1:
        raise ConfigValueError('MODEL.KEYPOINTS_ON needs KRCNN.NUM_KEYPOINTS (17 for COCO, 5 for the keypoint shapes)')
    if krcnn.ROI_XFORM_METHOD != 'RoIAlign':
        raise ConfigValueError(f"KRCNN.ROI_XFORM_METHOD '{krcnn.ROI_XFORM_METHOD}' is not supported; use 'RoIAlign'")
    if krcnn.CONV_INIT not in CONV_INITS:
        raise ConfigValueError(f"KRCNN.CONV_INIT '{krcnn.CONV_INIT}' is not supported; use one of {list(CONV_INITS)}")
    if krcnn.KEYPOINT_CONFIDENCE not in KEYPOINT_CONFIDENCES:
        raise ConfigValueError(f"KRCNN.KEYPOINT_CONFIDENCE '{krcnn.KEYPOINT_CONFIDENCE}' is not one of "
                               f'{list(KEYPOINT_CONFIDENCES)}')
    if krcnn.CONV_HEAD_KERNEL % 2 == 0 or (krcnn.USE_DECONV or krcnn.USE_DECONV_OUTPUT) and krcnn.DECONV_KERNEL % 2:
        raise ConfigValueError(f'KRCNN.CONV_HEAD_KERNEL {krcnn.CONV_HEAD_KERNEL} must be odd and KRCNN.DECONV_KERNEL '
                               f'{krcnn.DECONV_KERNEL} even: the head keeps (convolutions) or doubles (transposed '
                               'convolutions) the pooled side')
    if krcnn.UP_SCALE > 1 and krcnn.UP_SCALE % 2:
        raise ConfigValueError(f"KRCNN.UP_SCALE {krcnn.UP_SCALE} must be even (Detectron's bilinear upsampling)")
    if krcnn.HEATMAP_SIZE != keypoint_heatmap_size(krcnn):
        raise ConfigValueError(f'KRCNN.HEATMAP_SIZE {krcnn.HEATMAP_SIZE} must be the side of the head\'s heatmaps, '
                               f'{keypoint_heatmap_size(krcnn)}: KRCNN.ROI_XFORM_RESOLUTION x 2 per transposed '
                               'convolution (USE_DECONV, USE_DECONV_OUTPUT) x UP_SCALE')
    if krcnn.NMS_OKS and (cfg.MODEL.NUM_CLASSES != 2 or krcnn.NUM_KEYPOINTS != 17 or cfg.MODEL.MASK_ON):
        raise ConfigValueError("KRCNN.NMS_OKS True is Detectron's person-only OKS NMS: it needs MODEL.NUM_CLASSES 2, "
                               'KRCNN.NUM_KEYPOINTS 17 (COCO\'s sigmas) and MODEL.MASK_ON False')


def _check_one_norm(resnets):
    """The body normalises one way: Detectron's GN configs name the GN stem, transformation and shortcut."""
    funcs = {'RESNETS.STEM_FUNC': resnets.STEM_FUNC, 'RESNETS.TRANS_FUNC': resnets.TRANS_FUNC,
             'RESNETS.SHORTCUT_FUNC': resnets.SHORTCUT_FUNC}
    if len({'_gn_' in f for f in funcs.values()}) > 1:
        raise ConfigValueError('{} mix GroupNorm and affine/BatchNorm functions; for GroupNorm set all three: '
                               'basic_gn_stem, bottleneck_gn_transformation (basic_gn_transformation for R-18/34) '
                               'and basic_gn_shortcut'.format(', '.join('{} {}'.format(k, v) for k, v in funcs.items())))


def build_model(cfg):
    conv_body = build_conv_body(cfg)
    num_rpn_levels = cfg.FPN.RPN_MAX_LEVEL - cfg.FPN.RPN_MIN_LEVEL + 1
    rpn = FPNRPNHead(conv_body.out_channels, num_anchors=len(cfg.FPN.RPN_ASPECT_RATIOS))
    box_head = build_box_head(cfg, conv_body.out_channels)
    box_outs = FastRCNNOutputs(box_head.dim_out, cfg.MODEL.NUM_CLASSES,
                               cls_agnostic_bbox_reg=cfg.MODEL.CLS_AGNOSTIC_BBOX_REG,
                               pred_std=cfg.PRED_STD)
    mask_head = build_mask_head(cfg, conv_body.out_channels) if cfg.MODEL.MASK_ON else None
    keypoint_head = build_keypoint_head(cfg, conv_body.out_channels) if cfg.MODEL.KEYPOINTS_ON else None
    return GeneralizedRCNN(conv_body, rpn, box_head, box_outs, rcnn_params(cfg, num_rpn_levels), mask_head=mask_head,
                           keypoint_head=keypoint_head)


def _gn_groups(cfg):
    """dim -> GroupNorm groups, Detectron's get_group_gn on GROUP_NORM.NUM_GROUPS / DIM_PER_GP."""
    return functools.partial(group_norm_groups, num_groups=cfg.GROUP_NORM.NUM_GROUPS,
                             dim_per_group=cfg.GROUP_NORM.DIM_PER_GP)


def build_box_head(cfg, dim_in):
    fast = cfg.FAST_RCNN
    if box_head_name(cfg) == 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head':
        return RoiXConv1FCGNHead(dim_in, roi_size=fast.ROI_XFORM_RESOLUTION, conv_dim=fast.CONV_HEAD_DIM,
                                 num_convs=fast.NUM_STACKED_CONVS, hidden_dim=fast.MLP_HEAD_DIM,
                                 gn_groups=_gn_groups(cfg), gn_eps=cfg.GROUP_NORM.EPSILON)
    return Roi2MLPHead(dim_in, roi_size=fast.ROI_XFORM_RESOLUTION, hidden_dim=fast.MLP_HEAD_DIM)


def build_mask_head(cfg, dim_in):
    num_convs, use_gn = MASK_HEADS[cfg.MRCNN.ROI_MASK_HEAD]
    return MaskRCNNHead(dim_in, cfg.MODEL.NUM_CLASSES if cfg.MRCNN.CLS_SPECIFIC_MASK else 1, num_convs=num_convs,
                        dim_reduced=cfg.MRCNN.DIM_REDUCED, use_gn=use_gn, gn_groups=_gn_groups(cfg),
                        gn_eps=cfg.GROUP_NORM.EPSILON, conv_init=cfg.MRCNN.CONV_INIT)


def build_keypoint_head(cfg, dim_in):
    k = cfg.KRCNN
    return KeypointRCNNHead(dim_in, k.NUM_KEYPOINTS, num_convs=k.NUM_STACKED_CONVS, conv_dim=k.CONV_HEAD_DIM,
                            kernel=k.CONV_HEAD_KERNEL, conv_init=k.CONV_INIT, use_deconv=k.USE_DECONV,
                            deconv_dim=k.DECONV_DIM, deconv_kernel=k.DECONV_KERNEL,
                            use_deconv_output=k.USE_DECONV_OUTPUT, up_scale=k.UP_SCALE)


def _norm_kind(cfg):
    funcs = (cfg.RESNETS.TRANS_FUNC, cfg.RESNETS.STEM_FUNC, cfg.RESNETS.SHORTCUT_FUNC)
    if any('_gn_' in f for f in funcs):
        return 'gn'
    if any(f.startswith(('bottleneck_bn_', 'basic_bn_transformation')) for f in funcs):
        return 'bn'
    return 'affine'


def build_conv_body(cfg):
    body = _CONV_BODIES[cfg.MODEL.CONV_BODY](
        fpn_dim=cfg.FPN.DIM, fpn_use_gn=cfg.FPN.USE_GN, zero_init_lateral=cfg.FPN.ZERO_INIT_LATERAL,
        gn_num_groups=cfg.GROUP_NORM.NUM_GROUPS, gn_dim_per_group=cfg.GROUP_NORM.DIM_PER_GP,
        gn_eps=cfg.GROUP_NORM.EPSILON, coarsest_stride=cfg.FPN.COARSEST_STRIDE,
        stride_1x1=cfg.RESNETS.STRIDE_1X1, freeze_at=cfg.TRAIN.FREEZE_AT, norm=_norm_kind(cfg),
        num_groups=cfg.RESNETS.NUM_GROUPS, width_per_group=cfg.RESNETS.WIDTH_PER_GROUP,
        checkpoint_stages=cfg.TRAIN.CHECKPOINT_ACTIVATIONS)
    if cfg.TRAIN.FREEZE_CONV_BODY:  # Detectron's StopGradient on the body's outputs: ResNet and FPN stay as loaded
        body.requires_grad_(False)
    return body


def rcnn_params(cfg, num_rpn_levels):
    rpn_levels = range(cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL + 1)
    roi_levels = range(cfg.FPN.ROI_MIN_LEVEL, cfg.FPN.ROI_MAX_LEVEL + 1)
    start = cfg.FPN.RPN_ANCHOR_START_SIZE
    return RCNNParams(
        num_classes=cfg.MODEL.NUM_CLASSES,
        anchor_strides=tuple(2 ** lvl for lvl in rpn_levels),
        anchor_sizes=tuple(start * 2 ** i for i in range(num_rpn_levels)),
        aspect_ratios=tuple(cfg.FPN.RPN_ASPECT_RATIOS),
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
        pred_std=cfg.PRED_STD,
        roi_resolution=cfg.FAST_RCNN.ROI_XFORM_RESOLUTION,
        roi_sampling_ratio=cfg.FAST_RCNN.ROI_XFORM_SAMPLING_RATIO,
        roi_spatial_scales=tuple(1.0 / 2 ** lvl for lvl in roi_levels),
        roi_canonical_scale=cfg.FPN.ROI_CANONICAL_SCALE,
        roi_canonical_level=cfg.FPN.ROI_CANONICAL_LEVEL,
        # Checkpointed stages recompute their forward inside the backward: left to run eagerly.
        train_cuda_graphs=cfg.TRAIN.CUDA_GRAPHS and not cfg.TRAIN.CHECKPOINT_ACTIVATIONS,
        train_max_graphs=cfg.TRAIN.CUDA_GRAPHS_MAX_SHAPES,
        mask=MaskParams(resolution=cfg.MRCNN.RESOLUTION, roi_resolution=cfg.MRCNN.ROI_XFORM_RESOLUTION,
                        roi_sampling_ratio=cfg.MRCNN.ROI_XFORM_SAMPLING_RATIO,
                        cls_specific=cfg.MRCNN.CLS_SPECIFIC_MASK, weight_loss=cfg.MRCNN.WEIGHT_LOSS_MASK),
        keypoints=KeypointParams(heatmap_size=cfg.KRCNN.HEATMAP_SIZE, roi_resolution=cfg.KRCNN.ROI_XFORM_RESOLUTION,
                                 roi_sampling_ratio=cfg.KRCNN.ROI_XFORM_SAMPLING_RATIO,
                                 loss_weight=cfg.KRCNN.LOSS_WEIGHT,
                                 normalize_by_visible_keypoints=cfg.KRCNN.NORMALIZE_BY_VISIBLE_KEYPOINTS),
    )


def image_params(cfg):
    return rcnn_inference.ImageParams(scale=cfg.TEST.SCALE, max_size=cfg.TEST.MAX_SIZE,
                                      pixel_means=cfg.PIXEL_MEANS, stride=cfg.FPN.COARSEST_STRIDE)


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
