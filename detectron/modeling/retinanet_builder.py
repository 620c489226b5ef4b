"""cfg -> RetinaNet (MODEL.TYPE retinanet, Detectron's RETINANET.*): the model and its test-time detector.

RetinaNet trains on R-CNN's minibatches (Detectron's roi_data/minibatch.py makes both: scale, flip,
im_info, the roidb's boxes) and loads Detectron .pkl files by blob name as R-CNN does, so its model
type is the R-CNN one with its own model, settings and detector.
"""
import functools

import torch

from detectron.modeling import retinanet_inference
from detectron.modeling.model_type import ModelType, register_model_type, train_cuda_graphs
from detectron.modeling.rcnn_builder import GeneralizedRCNNType, build_conv_body, image_params, test_graphs
from detectron.modeling.rcnn_checks import check_conv_body
from detectron.modeling.retinanet import RetinaNet, RetinaNetParams
from detectron.modeling.retinanet_heads import RetinaNetHead
from detectron.utils.derived_keys import leaf_value
from detectron.utils.errors import ConfigValueError

# Detectron's RetinaNet levels: the head runs on P3..P7 (its blobs are named after fpn3).
_LEVELS = (3, 7)
# R-CNN features a RetinaNet does not have: refused rather than ignored.
_NOT_RETINANET = {
    'MODEL.MASK_ON': 'a mask head', 'MODEL.KEYPOINTS_ON': 'keypoint heads', 'PRED_STD': 'the KL-Loss head',
    'STD_NMS': 'variance voting', 'XYXY': "KL-Loss's XYXY box coding", 'TEST.BBOX_VOTE.ENABLED': 'box voting'}


@register_model_type('retinanet')
class RetinaNetType(GeneralizedRCNNType):
    def check(self):
        cfg = self.cfg
        if not cfg.RETINANET.RETINANET_ON:
            raise ConfigValueError('MODEL.TYPE retinanet needs RETINANET.RETINANET_ON True, as Detectron\'s '
                                   'retinanet configs set it')
        for key, feature in _NOT_RETINANET.items():
            if leaf_value(cfg, key):
                raise ConfigValueError('{} True asks for {}, which RetinaNet does not have; set it to False'.format(
                    key, feature))
        levels = (cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL)
        if not (cfg.FPN.FPN_ON and cfg.FPN.MULTILEVEL_RPN and cfg.FPN.EXTRA_CONV_LEVELS) or levels != _LEVELS:
            raise ConfigValueError('RetinaNet is built on FPN levels P3..P7 with the extra P6/P7 convolutions: set '
                                   'FPN.FPN_ON, FPN.MULTILEVEL_RPN and FPN.EXTRA_CONV_LEVELS True and FPN.RPN_MIN_LEVEL '
                                   '/ RPN_MAX_LEVEL {} (got {})'.format(_LEVELS, levels))
        if cfg.TEST.IMS_PER_BATCH != 1:
            raise ConfigValueError('TEST.IMS_PER_BATCH {} asks RetinaNet to detect on several images per call; it tests '
                                   'one image at a time, as Detectron: set it to 1'.format(cfg.TEST.IMS_PER_BATCH))
        check_conv_body(cfg)

    def build(self):
        return build_model(self.cfg)

    def prepare_for_inference(self, model):
        # On the GPU the body and head run channels_last, as in training: cuDNN's bf16 convolutions
        # are NHWC, and NCHW tensors cost two layout conversions per convolution.
        if next(model.parameters()).device.type == 'cuda':
            model.use_channels_last()
        return model

    def memory_settings(self, training):
        if not training:
            graphs = '; TEST.CUDA_GRAPHS False' if self.cfg.TEST.CUDA_GRAPHS else ''
            return 'lower TEST.SCALE {} / TEST.MAX_SIZE {}{}'.format(self.cfg.TEST.SCALE, self.cfg.TEST.MAX_SIZE, graphs)
        return ModelType.memory_settings(self, training)

    def validation_losses(self):
        return _validation_losses

    exporter = ModelType.exporter  # not exported (yet): the R-CNN graph does not fit it

    def detector(self):
        return functools.partial(_detect, image_params=image_params(self.cfg), params=inference_params(self.cfg),
                                 graphs=test_graphs(self.cfg))


def _validation_losses(model, batch):
    """Training-mode losses with the eager body and head (a CUDA-graphed training body keeps its
    buffers for the backward)."""
    with torch.no_grad():
        return model(*batch, body=model.body_and_head)


def _detect(model, sample, image_params, params, graphs):
    return retinanet_inference.im_detect_bbox(model, sample['image'], image_params, params, **graphs)


def build_model(cfg):
    r = cfg.RETINANET
    conv_body = build_conv_body(cfg, min_level=cfg.FPN.RPN_MIN_LEVEL, max_level=cfg.FPN.RPN_MAX_LEVEL)
    params = retinanet_params(cfg)
    head = RetinaNetHead(conv_body.out_channels, cfg.MODEL.NUM_CLASSES - 1, params.num_anchors, num_convs=r.NUM_CONVS,
                         share_tower=r.SHARE_CLS_BBOX_TOWER, class_specific_bbox=r.CLASS_SPECIFIC_BBOX,
                         prior_prob=r.PRIOR_PROB, softmax=r.SOFTMAX)
    return RetinaNet(conv_body, head, params)


def retinanet_params(cfg):
    r = cfg.RETINANET
    return RetinaNetParams(
        levels=tuple(range(cfg.FPN.RPN_MIN_LEVEL, cfg.FPN.RPN_MAX_LEVEL + 1)),
        scales_per_octave=r.SCALES_PER_OCTAVE, aspect_ratios=tuple(r.ASPECT_RATIOS), anchor_scale=r.ANCHOR_SCALE,
        positive_overlap=r.POSITIVE_OVERLAP, negative_overlap=r.NEGATIVE_OVERLAP,
        straddle_thresh=cfg.TRAIN.RPN_STRADDLE_THRESH, loss_gamma=r.LOSS_GAMMA, loss_alpha=r.LOSS_ALPHA,
        bbox_reg_beta=r.BBOX_REG_BETA, bbox_reg_weight=r.BBOX_REG_WEIGHT, class_specific_bbox=r.CLASS_SPECIFIC_BBOX,
        softmax=r.SOFTMAX,
        train_cuda_graphs=train_cuda_graphs(cfg),
        train_max_graphs=cfg.TRAIN.CUDA_GRAPHS_MAX_SHAPES)


def inference_params(cfg):
    r, test = cfg.RETINANET, cfg.TEST
    return retinanet_inference.RetinaNetTestParams(
        num_classes=cfg.MODEL.NUM_CLASSES, pre_nms_top_n=r.PRE_NMS_TOP_N, inference_th=r.INFERENCE_TH,
        class_specific_bbox=r.CLASS_SPECIFIC_BBOX, softmax=r.SOFTMAX, bbox_reg=test.BBOX_REG,
        bbox_xform_clip=cfg.BBOX_XFORM_CLIP, nms=test.NMS, soft_nms=test.SOFT_NMS.ENABLED,
        soft_nms_method=test.SOFT_NMS.METHOD, soft_nms_sigma=test.SOFT_NMS.SIGMA, detections_per_im=test.DETECTIONS_PER_IM)
