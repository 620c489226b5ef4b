"""Which R-CNN configurations this port builds (Detectron's bodies, forms and heads): one error line
for any setting it does not, checked once before a process starts."""
from detectron.modeling import FPN, ResNet, test_time_aug
from detectron.modeling.keypoint_rcnn_builder import check_keypoint_head
from detectron.modeling.mask_rcnn_heads import CONV_INITS, MASK_HEADS, SHARED_RES5_MASK_HEAD
from detectron.ops.roi_pooling import ROI_XFORM_METHODS
from detectron.utils.derived_keys import leaf_value
from detectron.utils.errors import ConfigValueError

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
CONV_BODIES = {**_FPN_BODIES, **_C4_BODIES}
_BOX_HEADS = ('fast_rcnn_heads.add_roi_2mlp_head', 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head')
C4_BOX_HEAD = 'ResNet.add_ResNet_roi_conv5_head'
C4_STRIDE = 16
# Detectron's modeling/name_compat.py: the old name its keypoint configs still use for the 2mlp head.
_OLD_BOX_HEAD_NAMES = {'head_builder.add_roi_2mlp_head': 'fast_rcnn_heads.add_roi_2mlp_head'}

# Detectron features this port does not build: refused loudly rather than silently ignored.
_UNSUPPORTED = {'RETINANET.RETINANET_ON': 'RetinaNet (MODEL.TYPE retinanet)'}
# MRCNN values of Detectron's other mask heads, which this port does not build: key -> the one value built.
_MRCNN_BUILT = {'MRCNN.ROI_XFORM_METHOD': 'RoIAlign', 'MRCNN.DILATION': 1, 'MRCNN.UPSAMPLE_RATIO': 1,
                'MRCNN.USE_FC_OUTPUT': False}



def reads_proposal_files(cfg):
    """Detectron's TEST.PRECOMPUTED_PROPOSALS as assert_and_infer_cfg infers it (read before it runs
    too): a model with neither an RPN nor RetinaNet's dense head detects on proposal files."""
    return not (has_rpn(cfg) or cfg.RETINANET.RETINANET_ON)


def has_rpn(cfg):
    """Whether the model has an RPN (end-to-end or RPN-only), else it is a Fast R-CNN on proposal files
    (RPN.RPN_ON as assert_and_infer_cfg infers it, read before it runs too)."""
    return cfg.MODEL.FASTER_RCNN or cfg.MODEL.RPN_ONLY


def is_c4(cfg):
    """Whether MODEL.CONV_BODY is one of Detectron's conv4 bodies (single-scale RPN, res5 RoI head)."""
    return cfg.MODEL.CONV_BODY in _C4_BODIES



def _check_test_aug(cfg):
    """Detectron's assertions of im_detect_bbox_aug: UNION for scores and coordinates together, and
    for a Faster R-CNN (its proposals, so its rows, differ from one augmentation to the next); the
    heuristics of TEST.MASK_AUG and TEST.KPS_AUG."""
    box = cfg.TEST.BBOX_AUG
    mask = cfg.TEST.MASK_AUG
    for key, value, choices in (('TEST.BBOX_AUG.SCORE_HEUR', box.SCORE_HEUR, test_time_aug.BOX_HEURISTICS),
                                ('TEST.BBOX_AUG.COORD_HEUR', box.COORD_HEUR, test_time_aug.BOX_HEURISTICS),
                                ('TEST.MASK_AUG.HEUR', mask.HEUR, test_time_aug.MASK_HEURISTICS),
                                ('TEST.KPS_AUG.HEUR', cfg.TEST.KPS_AUG.HEUR, test_time_aug.KEYPOINT_HEURISTICS)):
        if value not in choices:
            raise ConfigValueError('{} must be one of {}, got {!r}'.format(key, ', '.join(map(repr, choices)), value))
    if not box.ENABLED:
        return
    if cfg.MODEL.RPN_ONLY:
        raise ConfigValueError('TEST.BBOX_AUG.ENABLED True is built for Faster / Mask / Keypoint R-CNN and Fast R-CNN '
                               'on proposal files; test this RPN-only model without it')
    heurs = 'TEST.BBOX_AUG.SCORE_HEUR {} and COORD_HEUR {}'.format(box.SCORE_HEUR, box.COORD_HEUR)
    if (box.SCORE_HEUR == 'UNION') != (box.COORD_HEUR == 'UNION'):
        raise ConfigValueError(heurs + ': UNION combines scores and coordinates together; set both to UNION or '
                               'neither')
    if cfg.MODEL.FASTER_RCNN and box.SCORE_HEUR != 'UNION':
        raise ConfigValueError(heurs + ': a Faster R-CNN has other proposals under each augmentation, so only '
                               'UNION combines them (as Detectron asserts); set both to UNION')



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
    _check_test_aug(cfg)


def _check_c4(cfg):
    """A conv4 body: Detectron's single-scale RPN on res4 and the res5 RoI head (and its v0upshare mask head)."""
    flags = {key: leaf_value(cfg, key) for key in ('FPN.FPN_ON', 'FPN.MULTILEVEL_RPN', 'FPN.MULTILEVEL_ROIS')}
    if any(flags.values()):
        raise ConfigValueError('MODEL.CONV_BODY {} is a conv4 body (one map, stride 16): set FPN.FPN_ON, '
                               'FPN.MULTILEVEL_RPN, FPN.MULTILEVEL_ROIS False'.format(cfg.MODEL.CONV_BODY))
    if cfg.FAST_RCNN.ROI_BOX_HEAD != C4_BOX_HEAD and not cfg.MODEL.RPN_ONLY:
        raise ConfigValueError("FAST_RCNN.ROI_BOX_HEAD '{}' does not fit the conv4 body {}: use '{}'".format(
            cfg.FAST_RCNN.ROI_BOX_HEAD, cfg.MODEL.CONV_BODY, C4_BOX_HEAD))
    if cfg.RPN.STRIDE != C4_STRIDE:
        raise ConfigValueError('RPN.STRIDE {} must be the conv4 body\'s stride {}: Detectron lays the training anchors '
                               'out at RPN.STRIDE and the proposals at the body\'s stride'.format(cfg.RPN.STRIDE,
                                                                                                 C4_STRIDE))
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
    if cfg.MODEL.CONV_BODY not in CONV_BODIES:
        raise ConfigValueError("MODEL.CONV_BODY '{}' is not supported; use one of {}".format(
            cfg.MODEL.CONV_BODY, sorted(CONV_BODIES)))
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

