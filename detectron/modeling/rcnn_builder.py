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
from detectron.modeling import FPN, ResNet, keypoint_rcnn_builder, rcnn_inference
from detectron.modeling.fast_rcnn_heads import FastRCNNOutputs, Roi2MLPHead, RoiXConv1FCGNHead
from detectron.modeling.generalized_rcnn import GeneralizedRCNN, MaskParams, ProposalParams, RCNNParams
from detectron.modeling.keypoint_rcnn_builder import build_keypoint_head, check_keypoint_head, keypoint_params, num_keypoints
from detectron.modeling.mask_rcnn_heads import CONV_INITS, MASK_HEADS, SHARED_RES5_MASK_HEAD, MaskRCNNHead
from detectron.modeling.model_type import ModelType, batch_setting, checkpoint_setting, register_model_type
from detectron.modeling.norm import group_norm_groups
from detectron.modeling.rpn_heads import FPNRPNHead
from detectron.ops.roi_pooling import ROI_XFORM_METHODS
from detectron.roi_data.loader import TrainingDataset, aspect_ratio_groups, image_only, to_device
from detectron.roi_data.minibatch import (PROPOSAL_KEYS, TRAINING_KEYS, UnresizedImages, collate_minibatch,
                                          collate_unresized, prepare_training_entry, prepare_unresized_training_entry)
from detectron.utils import blob as blob_utils
from detectron.utils.derived_keys import leaf_value
from detectron.utils.errors import ConfigValueError

logger = logging.getLogger(__name__)

_FPN_BODIES = {
    'FPN.add_fpn_ResNet50_conv5_body': FPN.add_fpn_ResNet50_conv5_body,
    'FPN.add_fpn_ResNet101_conv5_body': FPN.add_fpn_ResNet101_conv5_body,
    'FPN.add_fpn_ResNet152_conv5_body': FPN.add_fpn_ResNet152_conv5_body,
    'FPN.add_fpn_ResNet18_conv5_body': FPN.add_fpn_ResNet18_conv5_body,
    'FPN.add_fpn_ResNet34_conv5_body': FPN.add_fpn_ResNet34_conv5_body,
}
# Detectron's conv4 bodies: one map (res4, stride 16) for the single-scale RPN and the res5 RoI head.
_C4_BODIES = {
    'ResNet.add_ResNet50_conv4_body': ResNet.add_ResNet50_conv4_body,
    'ResNet.add_ResNet101_conv4_body': ResNet.add_ResNet101_conv4_body,
}
_CONV_BODIES = {**_FPN_BODIES, **_C4_BODIES}
_BOX_HEADS = ('fast_rcnn_heads.add_roi_2mlp_head', 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head')
_C4_BOX_HEAD = 'ResNet.add_ResNet_roi_conv5_head'
_C4_STRIDE = 16
# Detectron's modeling/name_compat.py: the old name its keypoint configs still use for the 2mlp head.
_OLD_BOX_HEAD_NAMES = {'head_builder.add_roi_2mlp_head': 'fast_rcnn_heads.add_roi_2mlp_head'}

# Detectron features this port does not build: refused loudly rather than silently ignored.
# (Test-time augmentation is refused for every model: core/config.py's _NOT_ACTED_ON.)
_UNSUPPORTED = {'RETINANET.RETINANET_ON': 'RetinaNet (MODEL.TYPE retinanet)'}
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
                + (('gt_keypoints',) if cfg.MODEL.KEYPOINTS_ON else ()) + (() if has_rpn(cfg) else PROPOSAL_KEYS))
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
        proposals = {} if has_rpn(cfg) else {'dedup_boxes': cfg.DEDUP_BOXES}
        return functools.partial(_detect, image_params=image_params(cfg), decode_params=decode_params(cfg),
                                 nms_params=nms_params(cfg), mask_thresh=mask_thresh(cfg), graphs=test_graphs(cfg),
                                 keypoint_params=keypoint_params(cfg), **proposals)

    def results_format(self):
        return dataclasses.replace(DETECTRON_RESULTS, keypoint_confidence=self.cfg.KRCNN.KEYPOINT_CONFIDENCE)

    def test_results(self):
        if self.cfg.MODEL.RPN_ONLY:
            return ProposalResults(class_specific_ar=self.cfg.TEST.CLASS_SPECIFIC_AR)
        return super().test_results()

    def test_proposal_files(self):
        cfg = self.cfg
        if has_rpn(cfg):
            return {}
        files, names = tuple(cfg.TEST.PROPOSAL_FILES), tuple(cfg.TEST.DATASETS)
        if len(files) != len(names):
            raise ConfigValueError('TEST.PROPOSAL_FILES {} must name one proposal file per TEST.DATASETS entry {} for '
                                   'a Fast R-CNN (MODEL.FASTER_RCNN False; an RPN-only model\'s test_net writes '
                                   'rpn_proposals.pkl)'.format(files, names))
        return dict(zip(names, files))

    def best_metric(self):
        return ('box_proposal/AR@1000', 'max') if self.cfg.MODEL.RPN_ONLY else super().best_metric()


def has_rpn(cfg):
    """Whether the model has an RPN (end-to-end or RPN-only), else it is a Fast R-CNN on proposal files
    (RPN.RPN_ON as assert_and_infer_cfg infers it, read before it runs too)."""
    return cfg.MODEL.FASTER_RCNN or cfg.MODEL.RPN_ONLY



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
    if has_rpn(cfg):
        return {}
    return {'proposal_files': tuple(cfg.TRAIN.PROPOSAL_FILES if files is None else files),
            'crowd_filter_thresh': cfg.TRAIN.CROWD_FILTER_THRESH, 'cache_dir': cfg.DOWNLOAD_CACHE,
            'roi_thresholds': (cfg.TRAIN.FG_THRESH, cfg.TRAIN.BG_THRESH_HI, cfg.TRAIN.BG_THRESH_LO)}


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


def _detect(model, sample, image_params, decode_params, nms_params, mask_thresh, graphs, keypoint_params,
            dedup_boxes=None):
    if dedup_boxes is None:
        return rcnn_inference.im_detect_all(model, sample['image'], image_params, decode_params, nms_params,
                                            mask_thresh=mask_thresh, keypoint_params=keypoint_params, **graphs)
    if 'proposals' not in sample:
        raise ConfigValueError('a Fast R-CNN (MODEL.FASTER_RCNN False) detects on precomputed proposals: test it with '
                               'tools/test_net.py and TEST.PROPOSAL_FILES; it cannot detect on an image alone')
    if not len(sample['proposals']):  # Detectron's test_engine skips an image without proposals
        cls_boxes = [np.zeros((0, 5), np.float32) for _ in range(model.params.num_classes)]
        return cls_boxes if mask_thresh is None else (cls_boxes, [[] for _ in cls_boxes])
    # No keypoint_params: a Keypoint R-CNN on proposals is refused (_check_form).
    return rcnn_inference.im_detect_all(model, sample['image'], image_params, decode_params, nms_params,
                                        mask_thresh=mask_thresh, proposals=sample['proposals'],
                                        dedup_boxes=dedup_boxes, **graphs)


def _detect_proposals(model, sample, image_params, graphs):
    return rcnn_inference.im_proposals(model, sample['image'], image_params, **graphs)


def image_stride(cfg):
    """The multiple image blobs are padded to: FPN.COARSEST_STRIDE, or none (1) for a C4 body (which
    needs FPN.FPN_ON False: Detectron's get_max_shape pads only with FPN)."""
    return 1 if is_c4(cfg) else cfg.FPN.COARSEST_STRIDE


def is_c4(cfg):
    """Whether MODEL.CONV_BODY is one of Detectron's conv4 bodies (single-scale RPN, res5 RoI head)."""
    return cfg.MODEL.CONV_BODY in _C4_BODIES


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
    check_conv_body(cfg)
    if cfg.PRED_STD and not cfg.PRED_STD_LOG:
        raise ConfigValueError('PRED_STD_LOG False (a head predicting sigma^2 itself, KL-Loss\'s other variant) is not '
                               'ported: training and variance voting read the head as alpha = log(sigma^2); set '
                               'PRED_STD_LOG True, as KL-Loss\'s configs do')
    _check_form(cfg)
    if is_c4(cfg):
        _check_c4(cfg)
    else:
        _check_fpn(cfg)


def _check_c4(cfg):
    """A conv4 body: Detectron's single-scale RPN on res4 and the res5 RoI head (and its v0upshare mask head)."""
    flags = {key: leaf_value(cfg, key) for key in ('FPN.FPN_ON', 'FPN.MULTILEVEL_RPN', 'FPN.MULTILEVEL_ROIS')}
    if any(flags.values()):
        raise ConfigValueError('MODEL.CONV_BODY {} is a conv4 body (one map, stride 16): set FPN.FPN_ON, '
                               'FPN.MULTILEVEL_RPN, FPN.MULTILEVEL_ROIS False'.format(cfg.MODEL.CONV_BODY))
    if cfg.FAST_RCNN.ROI_BOX_HEAD != _C4_BOX_HEAD and not cfg.MODEL.RPN_ONLY:
        raise ConfigValueError("FAST_RCNN.ROI_BOX_HEAD '{}' does not fit the conv4 body {}: use '{}'".format(
            cfg.FAST_RCNN.ROI_BOX_HEAD, cfg.MODEL.CONV_BODY, _C4_BOX_HEAD))
    if cfg.RPN.STRIDE != _C4_STRIDE:
        raise ConfigValueError('RPN.STRIDE {} must be the conv4 body\'s stride {}: Detectron lays the training anchors '
                               'out at RPN.STRIDE and the proposals at the body\'s stride'.format(cfg.RPN.STRIDE,
                                                                                                 _C4_STRIDE))
    _check_choice(cfg, 'FAST_RCNN.ROI_XFORM_METHOD', ROI_XFORM_METHODS)
    if cfg.MODEL.KEYPOINTS_ON:
        raise ConfigValueError('MODEL.KEYPOINTS_ON True on the conv4 body {} is not supported: the keypoint head is '
                               'built on FPN bodies only'.format(cfg.MODEL.CONV_BODY))
    if cfg.MODEL.MASK_ON:
        mrcnn = cfg.MRCNN
        if mrcnn.ROI_MASK_HEAD != SHARED_RES5_MASK_HEAD:
            raise ConfigValueError(f"MRCNN.ROI_MASK_HEAD '{mrcnn.ROI_MASK_HEAD}' is not supported on a conv4 body; "
                                   f"use '{SHARED_RES5_MASK_HEAD}'")
        _check_choice(cfg, 'MRCNN.ROI_XFORM_METHOD', ROI_XFORM_METHODS)
        _check_mrcnn_built(cfg, {key: value for key, value in _MRCNN_BUILT.items() if key != 'MRCNN.ROI_XFORM_METHOD'},
                           'v0upshare')
        if mrcnn.ROI_XFORM_RESOLUTION != cfg.FAST_RCNN.ROI_XFORM_RESOLUTION:
            raise ConfigValueError(f'MRCNN.ROI_XFORM_RESOLUTION {mrcnn.ROI_XFORM_RESOLUTION} must equal '
                                   f'FAST_RCNN.ROI_XFORM_RESOLUTION {cfg.FAST_RCNN.ROI_XFORM_RESOLUTION}: the v0upshare '
                                   f'mask head shares the box head\'s res5')
        masks = 2 * ResNet.ROI_CONV5_POOLED_SIZE
        if mrcnn.RESOLUTION != masks:
            raise ConfigValueError(f'MRCNN.RESOLUTION {mrcnn.RESOLUTION} must be {masks}: the v0upshare head upsamples '
                                   f'the 7 x 7 res5 map once by 2')


def _check_choice(cfg, key, choices):
    if leaf_value(cfg, key) not in choices:
        raise ConfigValueError("{} '{}' is not supported; use one of {}".format(key, leaf_value(cfg, key), choices))


def _check_fpn(cfg):
    missing = [key for key in _fpn_flags_needed(cfg) if not leaf_value(cfg, key)]
    if missing:
        raise ConfigValueError('only FPN bodies are built: set {} True'.format(', '.join(missing)))
    if box_head_name(cfg) not in _BOX_HEADS and not cfg.MODEL.RPN_ONLY:  # RPN-only: no box head
        raise ConfigValueError("FAST_RCNN.ROI_BOX_HEAD '{}' is not supported; use one of {}".format(
            cfg.FAST_RCNN.ROI_BOX_HEAD, _BOX_HEADS))
    levels = (cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL, cfg.FPN.ROI_MIN_LEVEL, cfg.FPN.ROI_MAX_LEVEL)
    if levels != _FPN_LEVELS:
        raise ConfigValueError('FPN.RPN_MIN_LEVEL / RPN_MAX_LEVEL / ROI_MIN_LEVEL / ROI_MAX_LEVEL {} are not supported: '
                               'the FPN body gives P2..P6; use {}'.format(levels, _FPN_LEVELS))
    if cfg.FAST_RCNN.ROI_XFORM_METHOD != 'RoIAlign' and not cfg.MODEL.RPN_ONLY:
        raise ConfigValueError("FAST_RCNN.ROI_XFORM_METHOD '{}' is not supported; use 'RoIAlign'".format(
            cfg.FAST_RCNN.ROI_XFORM_METHOD))
    if cfg.MODEL.MASK_ON:
        _check_mask_head(cfg)
    if cfg.MODEL.KEYPOINTS_ON:
        check_keypoint_head(cfg)


def box_head_name(cfg):
    """FAST_RCNN.ROI_BOX_HEAD, an old Detectron name mapped to its new one as Detectron's get_func does."""
    return _OLD_BOX_HEAD_NAMES.get(cfg.FAST_RCNN.ROI_BOX_HEAD, cfg.FAST_RCNN.ROI_BOX_HEAD)


def check_conv_body(cfg):
    """ConfigValueError unless MODEL.CONV_BODY and the RESNETS functions name a body this port builds."""
    if cfg.MODEL.CONV_BODY not in _CONV_BODIES:
        raise ConfigValueError("MODEL.CONV_BODY '{}' is not supported; use one of {}".format(
            cfg.MODEL.CONV_BODY, sorted(_CONV_BODIES)))
    _check_one_norm(cfg.RESNETS)


def _check_form(cfg):
    """End-to-end Faster R-CNN, RPN-only, or Fast R-CNN on proposal files (neither)."""
    if cfg.MODEL.RPN_ONLY and (cfg.MODEL.MASK_ON or cfg.MODEL.KEYPOINTS_ON):
        raise ConfigValueError('MODEL.RPN_ONLY True builds no box, mask or keypoint head: set MODEL.MASK_ON and '
                               'MODEL.KEYPOINTS_ON False')
    if not cfg.MODEL.RPN_ONLY and not cfg.MODEL.FASTER_RCNN and cfg.RPN.RPN_ON:
        raise ConfigValueError('RPN.RPN_ON True with MODEL.FASTER_RCNN and MODEL.RPN_ONLY False (an RPN beside a '
                               'Fast R-CNN that does not use its proposals) is not supported: set MODEL.FASTER_RCNN '
                               'True, or RPN.RPN_ON False for a Fast R-CNN on TRAIN/TEST.PROPOSAL_FILES')
    if cfg.MODEL.KEYPOINTS_ON and not has_rpn(cfg):
        raise ConfigValueError('MODEL.KEYPOINTS_ON True on precomputed proposals (MODEL.FASTER_RCNN False, Detectron\'s '
                               'two-stage keypoint_rcnn_*) is not supported: Detectron redraws its minibatches with at '
                               'most KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH visible keypoints, which is not '
                               'ported; train end to end (MODEL.FASTER_RCNN True, as e2e_keypoint_rcnn_*)')
    files = {'TRAIN.PROPOSAL_FILES': cfg.TRAIN.PROPOSAL_FILES, 'TEST.PROPOSAL_FILES': cfg.TEST.PROPOSAL_FILES}
    given = [key for key, value in files.items() if value]
    if has_rpn(cfg) and given:
        raise ConfigValueError('{} {} serve a Fast R-CNN (MODEL.FASTER_RCNN False), but this model makes its own '
                               'proposals with an RPN: remove {}'.format(given[0], tuple(files[given[0]]),
                                                                        ' and '.join(given)))


def _fpn_flags_needed(cfg):
    """The FPN flags an FPN body's model needs: the RPN's levels and/or the RoIs' levels."""
    if cfg.MODEL.RPN_ONLY:
        return ('FPN.FPN_ON', 'FPN.MULTILEVEL_RPN')
    if cfg.MODEL.FASTER_RCNN:
        return ('FPN.FPN_ON', 'FPN.MULTILEVEL_RPN', 'FPN.MULTILEVEL_ROIS')
    return ('FPN.FPN_ON', 'FPN.MULTILEVEL_ROIS')


def _check_mask_head(cfg):
    mrcnn = cfg.MRCNN
    if mrcnn.ROI_MASK_HEAD not in MASK_HEADS:
        raise ConfigValueError(f"MRCNN.ROI_MASK_HEAD '{mrcnn.ROI_MASK_HEAD}' is not supported; "
                               f'use one of {sorted(MASK_HEADS)}')
    _check_mrcnn_built(cfg, _MRCNN_BUILT, 'v1up4convs')
    if mrcnn.RESOLUTION != 2 * mrcnn.ROI_XFORM_RESOLUTION:
        raise ConfigValueError(f'MRCNN.RESOLUTION {mrcnn.RESOLUTION} must be twice MRCNN.ROI_XFORM_RESOLUTION '
                               f'{mrcnn.ROI_XFORM_RESOLUTION}: the head upsamples its pooled features once by 2')


def _check_mrcnn_built(cfg, built, heads):
    for key, value in built.items():
        if leaf_value(cfg, key) != value:
            raise ConfigValueError(f'{key} {leaf_value(cfg, key)!r} is not supported: the {heads} heads are built '
                                   f'with {value!r}')
    if cfg.MRCNN.CONV_INIT not in CONV_INITS:
        raise ConfigValueError(f"MRCNN.CONV_INIT '{cfg.MRCNN.CONV_INIT}' is not supported; use one of "
                               f"{list(CONV_INITS)}")


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
    if fast.ROI_BOX_HEAD == _C4_BOX_HEAD:
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
    body = _CONV_BODIES[cfg.MODEL.CONV_BODY](
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
                    aspect_ratios=tuple(cfg.RPN.ASPECT_RATIOS), roi_spatial_scales=(1.0 / _C4_STRIDE,),
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
        # Checkpointed stages recompute their forward inside the backward: left to run eagerly.
        train_cuda_graphs=cfg.TRAIN.CUDA_GRAPHS and not cfg.TRAIN.CHECKPOINT_ACTIVATIONS,
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
