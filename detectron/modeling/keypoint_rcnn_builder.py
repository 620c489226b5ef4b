"""The Keypoint R-CNN part of rcnn_builder (MODEL.KEYPOINTS_ON): KRCNN's checks, the keypoint head, its
training parameters and test settings, read from cfg."""
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.json_dataset_evaluator import KEYPOINT_CONFIDENCES
from detectron.modeling.generalized_rcnn import KeypointParams
from detectron.modeling.keypoint_inference import KeypointInferenceParams
from detectron.modeling.keypoint_rcnn_heads import KEYPOINT_HEADS, KeypointRCNNHead
from detectron.modeling.mask_rcnn_heads import CONV_INITS
from detectron.modeling.test_time_aug import AugTransforms, KpsAug
from detectron.utils import keypoints as keypoint_utils
from detectron.utils.errors import ConfigValueError


def keypoint_params(cfg):
    """rcnn_inference.im_detect_all's keypoint_params: KRCNN's test settings of a Keypoint R-CNN, else None."""
    if not cfg.MODEL.KEYPOINTS_ON:
        return None
    return KeypointInferenceParams(inference_min_size=cfg.KRCNN.INFERENCE_MIN_SIZE, nms_oks=cfg.KRCNN.NMS_OKS)


def num_keypoints(cfg):
    """The keypoints per object of a Keypoint R-CNN's training data (KRCNN.NUM_KEYPOINTS), 0 without keypoints."""
    return cfg.KRCNN.NUM_KEYPOINTS if cfg.MODEL.KEYPOINTS_ON else 0


def keypoint_heatmap_size(krcnn):
    """The side of the keypoint head's heatmaps: the pooled side, doubled by each stride-2 transposed
    convolution (USE_DECONV, USE_DECONV_OUTPUT), times UP_SCALE."""
    return (krcnn.ROI_XFORM_RESOLUTION * (2 if krcnn.USE_DECONV else 1) * (2 if krcnn.USE_DECONV_OUTPUT else 1)
            * max(krcnn.UP_SCALE, 1))


def check_keypoint_head(cfg):
    """ConfigValueError unless the KRCNN keys ask for the keypoint head this port builds."""
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


def build_keypoint_head(cfg, dim_in):
    k = cfg.KRCNN
    return KeypointRCNNHead(dim_in, k.NUM_KEYPOINTS, num_convs=k.NUM_STACKED_CONVS, conv_dim=k.CONV_HEAD_DIM,
                            kernel=k.CONV_HEAD_KERNEL, conv_init=k.CONV_INIT, use_deconv=k.USE_DECONV,
                            deconv_dim=k.DECONV_DIM, deconv_kernel=k.DECONV_KERNEL,
                            use_deconv_output=k.USE_DECONV_OUTPUT, up_scale=k.UP_SCALE)


def keypoint_training_params(cfg):
    """GeneralizedRCNN's KeypointParams: the KRCNN training settings."""
    k = cfg.KRCNN
    return KeypointParams(heatmap_size=k.HEATMAP_SIZE, roi_resolution=k.ROI_XFORM_RESOLUTION,
                          roi_sampling_ratio=k.ROI_XFORM_SAMPLING_RATIO, loss_weight=k.LOSS_WEIGHT,
                          normalize_by_visible_keypoints=k.NORMALIZE_BY_VISIBLE_KEYPOINTS)


def kps_aug(cfg):
    """test_time_aug.KpsAug of TEST.KPS_AUG, with the flip order of the test data's keypoints when a flip is
    asked for (keypoint_names)."""
    kps = cfg.TEST.KPS_AUG
    transforms = AugTransforms(h_flip=kps.H_FLIP, scales=tuple(kps.SCALES), max_size=kps.MAX_SIZE,
                               scale_h_flip=kps.SCALE_H_FLIP, aspect_ratios=tuple(kps.ASPECT_RATIOS),
                               aspect_ratio_h_flip=kps.ASPECT_RATIO_H_FLIP)
    flips = kps.H_FLIP or kps.SCALES and kps.SCALE_H_FLIP or kps.ASPECT_RATIOS and kps.ASPECT_RATIO_H_FLIP
    order = ()
    if flips:
        names = keypoint_names(cfg)
        order = keypoint_utils.flip_order(names, keypoint_utils.flip_map_of(names))
    return KpsAug(transforms, kps.HEUR, kps.SCALE_SIZE_DEP, kps.AREA_TH, order)


def keypoint_names(cfg):
    """The keypoint names of the first TEST.DATASETS entry (which a flipped heatmap's channels exchange by),
    or COCO's person keypoints (Detectron's get_keypoints) without one."""
    names = JsonDataset(cfg.TEST.DATASETS[0]).keypoints if cfg.TEST.DATASETS else keypoint_utils.get_keypoints()[0]
    if names is None or len(names) != cfg.KRCNN.NUM_KEYPOINTS:
        raise ConfigValueError('TEST.KPS_AUG flips heatmaps by the keypoint names of TEST.DATASETS {}, which has {} '
                               'keypoints, not KRCNN.NUM_KEYPOINTS {}'.format(
                                   tuple(cfg.TEST.DATASETS), len(names or ()), cfg.KRCNN.NUM_KEYPOINTS))
    return list(names)
