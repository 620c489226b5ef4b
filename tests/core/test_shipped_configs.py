"""The configs we ship hold the reference values (KL-Loss's 2x file, CenterNet's experiment lines),
and settings this port cannot honour are refused instead of silently ignored."""
import os
import re

import pytest

from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.core.config_finalize import finalize_cfg
from detectron.datasets import dataset_catalog
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigValueError

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'configs')


def _load(relative_path, *opts):
    merge_cfg_from_file(os.path.join(CONFIGS, relative_path))
    merge_cfg_from_list(list(opts))
    assert_and_infer_cfg()


def test_kl_loss_2x_config_has_the_released_model_settings():
    # ethanhe42/KL-Loss configs/e2e_faster_rcnn_R-50-FPN_2x.yaml (see shared/reference/kl_loss.md 3)
    _load('e2e_faster_rcnn_R-50-FPN_2x.yaml')
    assert (cfg.XYXY, cfg.PRED_STD, cfg.PRED_STD_LOG, cfg.STD_NMS) == (True, True, True, False)
    assert (cfg.NUM_GPUS, cfg.SOLVER.BASE_LR, cfg.SOLVER.MAX_ITER) == (8, 0.02, 180000)
    assert list(cfg.SOLVER.STEPS) == [0, 120000, 160000]
    assert cfg.SOLVER.WEIGHT_DECAY == 0.0001
    assert (tuple(cfg.TRAIN.SCALES), cfg.TRAIN.MAX_SIZE, cfg.TRAIN.BATCH_SIZE_PER_IM) == ((800,), 1333, 512)
    assert cfg.TRAIN.RPN_PRE_NMS_TOP_N == 2000
    assert (cfg.TEST.SCALE, cfg.TEST.MAX_SIZE, cfg.TEST.NMS) == (800, 1333, 0.5)
    assert (cfg.TEST.RPN_PRE_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N) == (1000, 1000)
    assert (tuple(cfg.TRAIN.DATASETS), tuple(cfg.TEST.DATASETS)) == (('coco_2017_train',), ('coco_2017_val',))
    assert (cfg.FAST_RCNN.ROI_XFORM_METHOD, cfg.FAST_RCNN.ROI_XFORM_RESOLUTION,
            cfg.FAST_RCNN.ROI_XFORM_SAMPLING_RATIO) == ('RoIAlign', 7, 2)
    assert cfg.TEST.WEIGHTS.endswith('faster2x_log.pkl')


@pytest.mark.parametrize('name, arch, gpus, batch, master, lr, trunk', [
    # experiments/ctdet_coco_resdcn18.sh; resnet_dcn.py's model_urls
    ('ctdet_coco_resdcn18.yaml', 'resdcn_18', 4, 114, 18, 5e-4,
     'https://download.pytorch.org/models/resnet18-5c106cde.pth'),
    # experiments/ctdet_coco_dla_1x.sh; pose_dla_dcn.py's get_model_url('imagenet', 'dla34', 'ba72cf86')
    ('ctdet_coco_dla_1x.yaml', 'dla_34', 8, 128, 9, 5e-4, 'http://dl.yf.io/dla/models/imagenet/dla34-ba72cf86.pth'),
])
def test_centernet_configs_hold_the_experiment_lines(name, arch, gpus, batch, master, lr, trunk):
    _load(os.path.join('centernet', name))
    assert cfg.TRAIN.WEIGHTS == trunk   # CenterNet always starts from ImageNet weights
    c = cfg.CENTERNET
    assert (cfg.MODEL.TYPE, c.ARCH, cfg.NUM_GPUS) == ('centernet', arch, gpus)
    assert (c.BATCH_SIZE, c.MASTER_BATCH_SIZE, c.LR) == (batch, master, lr)
    assert (c.NUM_EPOCHS, tuple(c.LR_STEP), c.INPUT_RES, c.DOWN_RATIO) == (140, (90, 120), 512, 4)


@pytest.mark.parametrize('spelling, dtype', [('fp16', 'float16'), ('half', 'float16'), ('bf16', 'bfloat16'),
                                             ('bfloat16', 'bfloat16')])
def test_amp_dtype_short_spellings(spelling, dtype):
    _load(os.path.join('getting_started', 'shapes_demo_R-18-FPN.yaml'), 'SOLVER.AMP.DTYPE', spelling)
    assert cfg.SOLVER.AMP.DTYPE == dtype


def test_amp_dtype_unknown_spelling_is_refused():
    with pytest.raises(ConfigValueError, match="SOLVER.AMP.DTYPE must be one of 'float16', 'bfloat16'"):
        _load(os.path.join('getting_started', 'shapes_demo_R-18-FPN.yaml'), 'SOLVER.AMP.DTYPE', 'int8')


def test_unsupported_detectron_features_are_refused_by_the_builder():
    _load(os.path.join('getting_started', 'shapes_demo_R-18-FPN.yaml'), 'RETINANET.RETINANET_ON', 'True')
    with pytest.raises(ConfigValueError, match=r'RETINANET.RETINANET_ON True asks for RetinaNet \(MODEL.TYPE retinanet\)'):
        model_builder.create(cfg)


@pytest.mark.parametrize('key, value, message', [
    ('MRCNN.ROI_MASK_HEAD', 'mask_rcnn_heads.mask_rcnn_fcn_head_v0up', "MRCNN.ROI_MASK_HEAD 'mask_rcnn_heads"),
    ('MRCNN.DILATION', '2', 'MRCNN.DILATION 2 is not supported'),
    ('MRCNN.USE_FC_OUTPUT', 'True', 'MRCNN.USE_FC_OUTPUT True is not supported'),
    ('MRCNN.RESOLUTION', '28', 'MRCNN.RESOLUTION 28 must be twice MRCNN.ROI_XFORM_RESOLUTION 7'),
])
def test_mask_heads_not_built_are_refused(key, value, message):
    _load(os.path.join('getting_started', 'shapes_demo_mask_R-18-FPN.yaml'), key, value)
    with pytest.raises(ConfigValueError, match=message):
        model_builder.create(cfg)


# Detectron's own configs are walked by tests/core/test_detectron_zoo_configs.py (built or refused).
_DETECTRON_FOLDERS = ('12_2017_baselines/', '04_2018_gn_baselines/', 'test_time_aug/', 'getting_started/tutorial_')
_OURS = sorted(name for name in (os.path.relpath(os.path.join(d, f), CONFIGS) for d, _, files in os.walk(CONFIGS)
                                 for f in files if f.endswith('.yaml'))
               if not name.startswith(_DETECTRON_FOLDERS))


@pytest.mark.parametrize('name', _OURS)
def test_every_config_of_ours_finalizes(name):
    finalize_cfg(os.path.join(CONFIGS, name), [])
    assert cfg.is_frozen()


@pytest.mark.parametrize('name, mask', [('e2e_faster_rcnn_R-50-C4_1x.yaml', False), ('e2e_mask_rcnn_R-50-C4_2x.yaml', True)])
def test_c4_baselines_hold_detectrons_values(name, mask):
    _load(os.path.join('12_2017_baselines', name))
    assert (cfg.MODEL.CONV_BODY, cfg.FAST_RCNN.ROI_BOX_HEAD) == ('ResNet.add_ResNet50_conv4_body',
                                                                  'ResNet.add_ResNet_roi_conv5_head')
    assert (tuple(cfg.RPN.SIZES), cfg.RPN.STRIDE, cfg.FPN.FPN_ON, cfg.MODEL.MASK_ON) == ((32, 64, 128, 256, 512), 16,
                                                                                         False, mask)
    assert (cfg.TEST.RPN_PRE_NMS_TOP_N, cfg.TEST.RPN_POST_NMS_TOP_N, cfg.TRAIN.IMS_PER_BATCH) == (6000, 1000, 1)
    assert cfg.TRAIN.WEIGHTS == 'https://dl.fbaipublicfiles.com/detectron/ImageNetPretrained/MSRA/R-50.pkl'
    if mask:
        assert (cfg.MRCNN.ROI_MASK_HEAD, cfg.MRCNN.RESOLUTION) == ('mask_rcnn_heads.mask_rcnn_fcn_head_v0upshare', 14)


_SHIPPED = sorted(os.path.relpath(os.path.join(d, f), CONFIGS) for d, _, files in os.walk(CONFIGS)
                  for f in files if f.endswith('.yaml'))
# Detectron's RPN-only and two-stage (precomputed proposals) families, as it ships them.
_PROPOSAL_FAMILIES = [n for n in _SHIPPED if os.path.basename(n).startswith(('rpn_', 'fast_rcnn_', 'mask_rcnn_'))]


def test_the_proposal_families_are_shipped_with_detectrons_files(restore_global_cfg):
    assert len([n for n in _PROPOSAL_FAMILIES if n.startswith('12_2017_baselines')]) == 29
    for name in _PROPOSAL_FAMILIES:
        _load(name)
        rpn_only = os.path.basename(name).startswith('rpn_')
        assert (cfg.MODEL.RPN_ONLY, cfg.MODEL.FASTER_RCNN) == (rpn_only, False), name
        files = tuple(cfg.TRAIN.PROPOSAL_FILES) + tuple(cfg.TEST.PROPOSAL_FILES)
        assert all(f.startswith('https://dl.fbaipublicfiles.com/detectron/') for f in files + (cfg.TRAIN.WEIGHTS,))
        if not rpn_only:  # one file per dataset, each the rpn_proposals.pkl of an RPN-only run on that dataset
            assert len(cfg.TRAIN.PROPOSAL_FILES) == len(cfg.TRAIN.DATASETS), name
            assert len(cfg.TEST.PROPOSAL_FILES) == len(cfg.TEST.DATASETS), name
            for dataset, path in zip(tuple(cfg.TRAIN.DATASETS) + tuple(cfg.TEST.DATASETS), files):
                # under the RPN-only run's MODEL.TYPE: generalized_rcnn, or rpn (Detectron's deprecated name)
                assert re.search('/{}/(generalized_rcnn|rpn)/rpn_proposals.pkl$'.format(dataset), path), name
        restore_global_cfg()


@pytest.mark.parametrize('name', ['12_2017_baselines/rpn_R-50-FPN_1x.yaml', '12_2017_baselines/fast_rcnn_R-50-FPN_1x.yaml',
                                  '04_2018_gn_baselines/mask_rcnn_R-50-FPN_1x_gn.yaml'])
def test_proposal_family_models_build(name):
    finalize_cfg(os.path.join(CONFIGS, name), [])
    model = model_builder.create(cfg)
    assert (model.rpn is None) == (not cfg.MODEL.RPN_ONLY)
    assert (model.box_head is None) == cfg.MODEL.RPN_ONLY
    assert (model.mask_head is not None) == cfg.MODEL.MASK_ON


def test_mask_configs_hold_the_reference_values():
    _load('e2e_mask_rcnn_R-50-FPN_2x_log.yaml')  # KL-Loss's file
    assert (cfg.MODEL.MASK_ON, cfg.XYXY, cfg.PRED_STD, cfg.PRED_STD_LOG, cfg.STD_NMS) == (True, True, True, True, False)
    assert (cfg.MRCNN.RESOLUTION, cfg.MRCNN.ROI_XFORM_RESOLUTION, cfg.MRCNN.CONV_INIT) == (28, 14, 'MSRAFill')
    assert cfg.MRCNN.ROI_MASK_HEAD == 'mask_rcnn_heads.mask_rcnn_fcn_head_v1up4convs'
    assert '35859007/12_2017_baselines/e2e_mask_rcnn_R-50-FPN_2x' in cfg.TRAIN.WEIGHTS


def test_gn_baseline_holds_detectrons_values():
    _load(os.path.join('04_2018_gn_baselines', 'e2e_mask_rcnn_R-50-FPN_2x_gn.yaml'))
    assert cfg.FAST_RCNN.ROI_BOX_HEAD == 'fast_rcnn_heads.add_roi_Xconv1fc_gn_head'
    assert cfg.TRAIN.WEIGHTS.endswith('47261647/R-50-GN.pkl')
    assert (cfg.SOLVER.MAX_ITER, list(cfg.SOLVER.STEPS)) == (180000, [0, 120000, 160000])


def test_voc_2007_trainval_is_a_catalog_name():
    assert dataset_catalog.contains('voc_2007_trainval')
    assert dataset_catalog.get_ann_fn('voc_2007_trainval').endswith('VOC2007/annotations/voc_2007_trainval.json')


# Each one's model is built, trained and its keypoint head's shapes checked in tests/core/test_detectron_zoo_configs.py.
_KEYPOINT_CONFIGS = sorted(n for n in _SHIPPED if os.path.basename(n).startswith('e2e_keypoint_rcnn_'))


def test_detectrons_eight_end_to_end_keypoint_configs_are_shipped():
    assert [os.path.basename(n) for n in _KEYPOINT_CONFIGS] == [
        f'e2e_keypoint_rcnn_{body}-FPN_{schedule}.yaml'
        for body in ('R-101', 'R-50', 'X-101-32x8d', 'X-101-64x4d') for schedule in ('1x', 's1x')]


def test_keypoint_config_holds_detectrons_values():
    _load(os.path.join('12_2017_baselines', 'e2e_keypoint_rcnn_R-50-FPN_s1x.yaml'))
    k = cfg.KRCNN
    assert (cfg.MODEL.KEYPOINTS_ON, cfg.MODEL.NUM_CLASSES, k.NUM_KEYPOINTS, k.HEATMAP_SIZE) == (True, 2, 17, 56)
    assert (k.NUM_STACKED_CONVS, k.CONV_HEAD_DIM, k.UP_SCALE, k.USE_DECONV_OUTPUT) == (8, 512, 2, True)
    assert (k.ROI_XFORM_RESOLUTION, k.CONV_INIT, k.KEYPOINT_CONFIDENCE) == (14, 'MSRAFill', 'bbox')
    assert tuple(cfg.TRAIN.DATASETS) == ('keypoints_coco_2014_train', 'keypoints_coco_2014_valminusminival')
    assert cfg.TRAIN.WEIGHTS == 'https://dl.fbaipublicfiles.com/detectron/ImageNetPretrained/MSRA/R-50.pkl'


@pytest.mark.parametrize('key, value, message', [
    ('KRCNN.ROI_KEYPOINTS_HEAD', 'keypoint_rcnn_heads.add_ResNet_roi_conv5_head_for_keypoints',
     "KRCNN.ROI_KEYPOINTS_HEAD 'keypoint_rcnn_heads.add_ResNet_roi_conv5_head_for_keypoints' is not supported"),
    ('KRCNN.HEATMAP_SIZE', '56', 'KRCNN.HEATMAP_SIZE 56 must be the side of the head\'s heatmaps, 28'),
    ('KRCNN.NMS_OKS', 'True', 'KRCNN.NMS_OKS True is Detectron\'s person-only OKS NMS'),
    ('KRCNN.KEYPOINT_CONFIDENCE', 'mean', "KRCNN.KEYPOINT_CONFIDENCE 'mean' is not one of"),
    ('KRCNN.DILATION', '2', 'KRCNN.DILATION'),
])
def test_keypoint_settings_not_built_are_refused(key, value, message):
    with pytest.raises(ConfigValueError, match=message):
        _load(os.path.join('getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml'), key, value)
        model_builder.create(cfg)


def test_keypoints_need_a_box_head():
    with pytest.raises(ConfigValueError, match='MODEL.RPN_ONLY True builds no box, mask or keypoint head'):
        _load(os.path.join('getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml'), 'MODEL.RPN_ONLY', 'True')
        model_builder.create(cfg)
