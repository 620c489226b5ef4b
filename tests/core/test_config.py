"""Config: Detectron's defaults and merge rules, the port's type relaxations, aliases and errors."""

import copy
import errno
import logging
import math

import numpy as np
import pytest
import yaml

from detectron.core import config
from detectron.core.config import (CfgNode, assert_and_infer_cfg, cfg, get_output_dir, images_per_iter,
                                   load_cfg, merge_cfg_from_cfg, merge_cfg_from_file, merge_cfg_from_list,
                                   scale_schedule_to_global_batch)
from detectron.utils.errors import ConfigKeyError, ConfigValueError, OutputDirError

# Every leaf default of Detectron's detectron/core/config.py (HEAD 04155a0), transcribed from its source;
# PIXEL_MEANS, BBOX_XFORM_CLIP and ROOT_DIR are checked separately (ndarray / np.float64 / cwd there).
DETECTRON_DEFAULTS = {
    'TRAIN.WEIGHTS': '',
    'TRAIN.DATASETS': (),
    'TRAIN.SCALES': (600,),
    'TRAIN.MAX_SIZE': 1000,
    'TRAIN.IMS_PER_BATCH': 2,
    'TRAIN.BATCH_SIZE_PER_IM': 64,
    'TRAIN.FG_FRACTION': 0.25,
    'TRAIN.FG_THRESH': 0.5,
    'TRAIN.BG_THRESH_HI': 0.5,
    'TRAIN.BG_THRESH_LO': 0.0,
    'TRAIN.USE_FLIPPED': True,
    'TRAIN.BBOX_THRESH': 0.5,
    'TRAIN.SNAPSHOT_ITERS': 80000,
    'TRAIN.PROPOSAL_FILES': (),
    'TRAIN.ASPECT_GROUPING': True,
    'TRAIN.GENERATE_PROPOSALS_ON_GPU': False,
    'TRAIN.RPN_POSITIVE_OVERLAP': 0.7,
    'TRAIN.RPN_NEGATIVE_OVERLAP': 0.3,
    'TRAIN.RPN_FG_FRACTION': 0.5,
    'TRAIN.RPN_BATCH_SIZE_PER_IM': 256,
    'TRAIN.RPN_NMS_THRESH': 0.7,
    'TRAIN.RPN_PRE_NMS_TOP_N': 12000,
    'TRAIN.RPN_POST_NMS_TOP_N': 2000,
    'TRAIN.RPN_STRADDLE_THRESH': 0,
    'TRAIN.RPN_MIN_SIZE': 0,
    'TRAIN.CROWD_FILTER_THRESH': 0.7,
    'TRAIN.GT_MIN_AREA': -1,
    'TRAIN.FREEZE_CONV_BODY': False,
    'TRAIN.AUTO_RESUME': True,
    'TRAIN.COPY_WEIGHTS': False,
    'TRAIN.FREEZE_AT': 2,
    'DATA_LOADER.NUM_THREADS': 4,
    'DATA_LOADER.MINIBATCH_QUEUE_SIZE': 64,
    'DATA_LOADER.BLOBS_QUEUE_CAPACITY': 8,
    'TEST.WEIGHTS': '',
    'TEST.DATASETS': (),
    'TEST.SCALE': 600,
    'TEST.MAX_SIZE': 1000,
    'TEST.NMS': 0.3,
    'TEST.BBOX_REG': True,
    'TEST.PROPOSAL_FILES': (),
    'TEST.GENERATE_PROPOSALS_ON_GPU': False,
    'TEST.PROPOSAL_LIMIT': 2000,
    'TEST.RPN_NMS_THRESH': 0.7,
    'TEST.RPN_PRE_NMS_TOP_N': 12000,
    'TEST.RPN_POST_NMS_TOP_N': 2000,
    'TEST.RPN_MIN_SIZE': 0,
    'TEST.DETECTIONS_PER_IM': 100,
    'TEST.SCORE_THRESH': 0.05,
    'TEST.COMPETITION_MODE': True,
    'TEST.FORCE_JSON_DATASET_EVAL': False,
    'TEST.PRECOMPUTED_PROPOSALS': True,
    'TEST.CLASS_SPECIFIC_AR': False,
    'TEST.BBOX_AUG.ENABLED': False,
    'TEST.BBOX_AUG.SCORE_HEUR': 'UNION',
    'TEST.BBOX_AUG.COORD_HEUR': 'UNION',
    'TEST.BBOX_AUG.H_FLIP': False,
    'TEST.BBOX_AUG.SCALES': (),
    'TEST.BBOX_AUG.MAX_SIZE': 4000,
    'TEST.BBOX_AUG.SCALE_H_FLIP': False,
    'TEST.BBOX_AUG.SCALE_SIZE_DEP': False,
    'TEST.BBOX_AUG.AREA_TH_LO': 2500,
    'TEST.BBOX_AUG.AREA_TH_HI': 32400,
    'TEST.BBOX_AUG.ASPECT_RATIOS': (),
    'TEST.BBOX_AUG.ASPECT_RATIO_H_FLIP': False,
    'TEST.MASK_AUG.ENABLED': False,
    'TEST.MASK_AUG.HEUR': 'SOFT_AVG',
    'TEST.MASK_AUG.H_FLIP': False,
    'TEST.MASK_AUG.SCALES': (),
    'TEST.MASK_AUG.MAX_SIZE': 4000,
    'TEST.MASK_AUG.SCALE_H_FLIP': False,
    'TEST.MASK_AUG.SCALE_SIZE_DEP': False,
    'TEST.MASK_AUG.AREA_TH': 32400,
    'TEST.MASK_AUG.ASPECT_RATIOS': (),
    'TEST.MASK_AUG.ASPECT_RATIO_H_FLIP': False,
    'TEST.KPS_AUG.ENABLED': False,
    'TEST.KPS_AUG.HEUR': 'HM_AVG',
    'TEST.KPS_AUG.H_FLIP': False,
    'TEST.KPS_AUG.SCALES': (),
    'TEST.KPS_AUG.MAX_SIZE': 4000,
    'TEST.KPS_AUG.SCALE_H_FLIP': False,
    'TEST.KPS_AUG.SCALE_SIZE_DEP': False,
    'TEST.KPS_AUG.AREA_TH': 32400,
    'TEST.KPS_AUG.ASPECT_RATIOS': (),
    'TEST.KPS_AUG.ASPECT_RATIO_H_FLIP': False,
    'TEST.SOFT_NMS.ENABLED': False,
    'TEST.SOFT_NMS.METHOD': 'linear',
    'TEST.SOFT_NMS.SIGMA': 0.5,
    'TEST.BBOX_VOTE.ENABLED': False,
    'TEST.BBOX_VOTE.VOTE_TH': 0.8,
    'TEST.BBOX_VOTE.SCORING_METHOD': 'ID',
    'TEST.BBOX_VOTE.SCORING_METHOD_BETA': 1.0,
    'MODEL.TYPE': '',
    'MODEL.CONV_BODY': '',
    'MODEL.NUM_CLASSES': -1,
    'MODEL.CLS_AGNOSTIC_BBOX_REG': False,
    'MODEL.BBOX_REG_WEIGHTS': (10.0, 10.0, 5.0, 5.0),
    'MODEL.FASTER_RCNN': False,
    'MODEL.MASK_ON': False,
    'MODEL.KEYPOINTS_ON': False,
    'MODEL.RPN_ONLY': False,
    'MODEL.EXECUTION_TYPE': 'dag',
    'RETINANET.RETINANET_ON': False,
    'RETINANET.ASPECT_RATIOS': (0.5, 1.0, 2.0),
    'RETINANET.SCALES_PER_OCTAVE': 3,
    'RETINANET.ANCHOR_SCALE': 4,
    'RETINANET.NUM_CONVS': 4,
    'RETINANET.BBOX_REG_WEIGHT': 1.0,
    'RETINANET.BBOX_REG_BETA': 0.11,
    'RETINANET.PRE_NMS_TOP_N': 1000,
    'RETINANET.POSITIVE_OVERLAP': 0.5,
    'RETINANET.NEGATIVE_OVERLAP': 0.4,
    'RETINANET.LOSS_ALPHA': 0.25,
    'RETINANET.LOSS_GAMMA': 2.0,
    'RETINANET.PRIOR_PROB': 0.01,
    'RETINANET.SHARE_CLS_BBOX_TOWER': False,
    'RETINANET.CLASS_SPECIFIC_BBOX': False,
    'RETINANET.SOFTMAX': False,
    'RETINANET.INFERENCE_TH': 0.05,
    'SOLVER.BASE_LR': 0.001,
    'SOLVER.LR_POLICY': 'step',
    'SOLVER.GAMMA': 0.1,
    'SOLVER.STEP_SIZE': 30000,
    'SOLVER.STEPS': [],
    'SOLVER.LRS': [],
    'SOLVER.MAX_ITER': 40000,
    'SOLVER.MOMENTUM': 0.9,
    'SOLVER.WEIGHT_DECAY': 0.0005,
    'SOLVER.WEIGHT_DECAY_GN': 0.0,
    'SOLVER.WARM_UP_ITERS': 500,
    'SOLVER.WARM_UP_FACTOR': 0.3333333333333333,
    'SOLVER.WARM_UP_METHOD': 'linear',
    'SOLVER.SCALE_MOMENTUM': True,
    'SOLVER.SCALE_MOMENTUM_THRESHOLD': 1.1,
    'SOLVER.LOG_LR_CHANGE_THRESHOLD': 1.1,
    'FAST_RCNN.ROI_BOX_HEAD': '',
    'FAST_RCNN.MLP_HEAD_DIM': 1024,
    'FAST_RCNN.CONV_HEAD_DIM': 256,
    'FAST_RCNN.NUM_STACKED_CONVS': 4,
    'FAST_RCNN.ROI_XFORM_METHOD': 'RoIPoolF',
    'FAST_RCNN.ROI_XFORM_SAMPLING_RATIO': 0,
    'FAST_RCNN.ROI_XFORM_RESOLUTION': 14,
    'RPN.RPN_ON': False,
    'RPN.SIZES': (64, 128, 256, 512),
    'RPN.STRIDE': 16,
    'RPN.ASPECT_RATIOS': (0.5, 1, 2),
    'FPN.FPN_ON': False,
    'FPN.DIM': 256,
    'FPN.ZERO_INIT_LATERAL': False,
    'FPN.COARSEST_STRIDE': 32,
    'FPN.MULTILEVEL_ROIS': False,
    'FPN.ROI_CANONICAL_SCALE': 224,
    'FPN.ROI_CANONICAL_LEVEL': 4,
    'FPN.ROI_MAX_LEVEL': 5,
    'FPN.ROI_MIN_LEVEL': 2,
    'FPN.MULTILEVEL_RPN': False,
    'FPN.RPN_MAX_LEVEL': 6,
    'FPN.RPN_MIN_LEVEL': 2,
    'FPN.RPN_ASPECT_RATIOS': (0.5, 1, 2),
    'FPN.RPN_ANCHOR_START_SIZE': 32,
    'FPN.EXTRA_CONV_LEVELS': False,
    'FPN.USE_GN': False,
    'MRCNN.ROI_MASK_HEAD': '',
    'MRCNN.RESOLUTION': 14,
    'MRCNN.ROI_XFORM_METHOD': 'RoIAlign',
    'MRCNN.ROI_XFORM_RESOLUTION': 7,
    'MRCNN.ROI_XFORM_SAMPLING_RATIO': 0,
    'MRCNN.DIM_REDUCED': 256,
    'MRCNN.DILATION': 2,
    'MRCNN.UPSAMPLE_RATIO': 1,
    'MRCNN.USE_FC_OUTPUT': False,
    'MRCNN.CONV_INIT': 'GaussianFill',
    'MRCNN.CLS_SPECIFIC_MASK': True,
    'MRCNN.WEIGHT_LOSS_MASK': 1.0,
    'MRCNN.THRESH_BINARIZE': 0.5,
    'KRCNN.ROI_KEYPOINTS_HEAD': '',
    'KRCNN.HEATMAP_SIZE': -1,
    'KRCNN.UP_SCALE': -1,
    'KRCNN.USE_DECONV': False,
    'KRCNN.DECONV_DIM': 256,
    'KRCNN.USE_DECONV_OUTPUT': False,
    'KRCNN.DILATION': 1,
    'KRCNN.DECONV_KERNEL': 4,
    'KRCNN.NUM_KEYPOINTS': -1,
    'KRCNN.NUM_STACKED_CONVS': 8,
    'KRCNN.CONV_HEAD_DIM': 256,
    'KRCNN.CONV_HEAD_KERNEL': 3,
    'KRCNN.CONV_INIT': 'GaussianFill',
    'KRCNN.NMS_OKS': False,
    'KRCNN.KEYPOINT_CONFIDENCE': 'bbox',
    'KRCNN.ROI_XFORM_METHOD': 'RoIAlign',
    'KRCNN.ROI_XFORM_RESOLUTION': 7,
    'KRCNN.ROI_XFORM_SAMPLING_RATIO': 0,
    'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH': 20,
    'KRCNN.INFERENCE_MIN_SIZE': 0,
    'KRCNN.LOSS_WEIGHT': 1.0,
    'KRCNN.NORMALIZE_BY_VISIBLE_KEYPOINTS': True,
    'RFCN.PS_GRID_SIZE': 3,
    'RESNETS.NUM_GROUPS': 1,
    'RESNETS.WIDTH_PER_GROUP': 64,
    'RESNETS.STRIDE_1X1': True,
    'RESNETS.TRANS_FUNC': 'bottleneck_transformation',
    'RESNETS.STEM_FUNC': 'basic_bn_stem',
    'RESNETS.SHORTCUT_FUNC': 'basic_bn_shortcut',
    'RESNETS.RES5_DILATION': 1,
    'GROUP_NORM.DIM_PER_GP': -1,
    'GROUP_NORM.NUM_GROUPS': 32,
    'GROUP_NORM.EPSILON': 1e-05,
    'NUM_GPUS': 1,
    'USE_NCCL': False,
    'DEDUP_BOXES': 0.0625,
    'RNG_SEED': 3,
    'EPS': 1e-14,
    'OUTPUT_DIR': '/tmp',
    'MATLAB': 'matlab',
    'MEMONGER': True,
    'MEMONGER_SHARE_ACTIVATIONS': False,
    'VIS': False,
    'VIS_TH': 0.9,
    'EXPECTED_RESULTS': [],
    'EXPECTED_RESULTS_RTOL': 0.1,
    'EXPECTED_RESULTS_ATOL': 0.005,
    'EXPECTED_RESULTS_SIGMA_TOL': 4,
    'EXPECTED_RESULTS_EMAIL': '',
    'DOWNLOAD_CACHE': '/tmp/detectron-download-cache',
    'CLUSTER.ON_CLUSTER': False,
}


def _get(full_key, node=None):
    node = cfg if node is None else node
    for subkey in full_key.split('.'):
        node = node[subkey]
    return node


def _write(tmp_path, text, name='cfg.yaml'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize('full_key, default', sorted(DETECTRON_DEFAULTS.items()))
def test_detectron_default(full_key, default):
    value = _get(full_key)
    assert value == default
    assert type(value) is type(default)


def test_array_and_numpy_defaults_as_plain_values():
    means = np.array(cfg.PIXEL_MEANS)
    assert means.shape == (1, 1, 3)
    np.testing.assert_array_equal(means, [[[102.9801, 115.9465, 122.7717]]])
    assert type(cfg.BBOX_XFORM_CLIP) is float
    assert cfg.BBOX_XFORM_CLIP == pytest.approx(4.135166556742356, abs=1e-15)


KL_LOSS_DEFAULTS = {
    'BBOX_XFORM_CLIPe': 62.5, 'STD_NMS': False, 'STD.SOFT': 'soft', 'STD.METHOD': 'stdiou',
    'STD.IOU_SIGMA': 0.01, 'XYXY': False, 'PRED_STD': False, 'PRED_STD_LOG': True, 'STD_TH': 0.9,
    'STD.SIGMA_COLUMN_ORDER': 'reference',
}

CENTERNET_DEFAULTS = {
    'ARCH': 'resdcn_18', 'NUM_CLASSES': 80, 'CAT_SPEC_WH': False, 'REG_OFFSET': True, 'HEAD_CONV': -1,
    'DECONV_FILTERS': (),
    'INPUT_RES': 512, 'DOWN_RATIO': 4, 'HM_WEIGHT': 1.0, 'WH_WEIGHT': 0.1, 'OFF_WEIGHT': 1.0, 'K': 100,
    'FLIP_TEST': False, 'TEST_SCALES': (1.0,), 'KEEP_RES': False, 'NMS': False, 'NUM_EPOCHS': 140, 'LR_STEP': (90, 120),
    'LR': 1.25e-4, 'BATCH_SIZE': 32, 'MASTER_BATCH_SIZE': -1, 'CHUNK_SIZES': (),
    'MEAN': (0.40789654, 0.44719302, 0.47026115), 'STD': (0.28863828, 0.27408164, 0.27809835),
}

PORT_DEFAULTS = {
    'DATASET_CATALOG': '', 'SOLVER.ITER_SIZE': 1, 'SOLVER.AMP.ENABLED': False, 'SOLVER.AMP.DTYPE': 'float16',
    'SOLVER.AMP.LOSS_SCALE': 0.0, 'SOLVER.REFERENCE_WORLD_BATCH': 0, 'TRAIN.CHECKPOINT_ACTIVATIONS': False,
    'MODEL.SYNC_BN': False, 'TRAIN.CUDA_GRAPHS': True, 'TRAIN.CUDA_GRAPHS_MAX_SHAPES': 8,
    'TEST.CUDA_GRAPHS': True, 'TEST.CUDA_GRAPHS_MAX_SHAPES': 4, 'TEST.IMS_PER_BATCH': 1,
}


@pytest.mark.parametrize('full_key, default', sorted(
    list(KL_LOSS_DEFAULTS.items()) + list(PORT_DEFAULTS.items())
    + [('CENTERNET.' + k, v) for k, v in CENTERNET_DEFAULTS.items()]))
def test_added_key_default(full_key, default):
    value = _get(full_key)
    assert value == default
    assert type(value) is type(default)


# ---------------------------------------------------------------------------------------------
# Detectron's tests/test_cfg.py
# ---------------------------------------------------------------------------------------------
def test_immutability():
    a = CfgNode()
    a.foo = 0
    a.immutable(True)
    with pytest.raises(AttributeError):
        a.foo = 1
    with pytest.raises(AttributeError):
        a.bar = 1
    assert a.is_immutable() and a.foo == 0
    a.immutable(False)
    a.foo = 1
    a.bar = 1
    assert a.foo == 1 and a.bar == 1

    a.level1 = CfgNode()
    a.level1.level2 = CfgNode()
    a.level1.level2.foo = 0
    a.immutable(True)
    with pytest.raises(AttributeError):
        a.level1.level2.foo = 1
    with pytest.raises(AttributeError):
        a.level1.bar = 1
    assert a.level1.level2.foo == 0

    b = load_cfg(yaml.dump(a))
    assert b.is_immutable() and b.level1.level2.is_immutable()
    with pytest.raises(AttributeError):
        b.level1.level2.foo = 1
    assert b.level1.level2.foo == 0
    assert a.is_immutable()


def test_global_cfg_is_frozen_after_assert_and_infer_cfg():
    assert_and_infer_cfg()
    with pytest.raises(AttributeError):
        cfg.MODEL.TYPE = 'foo'
    with pytest.raises(AttributeError):
        cfg.TRAIN.SCALES = (1,)
    assert cfg.MODEL.TYPE == ''
    assert load_cfg(yaml.dump(cfg)).TEST.BBOX_AUG.is_immutable()


def test_copy_cfg():
    cfg2 = copy.deepcopy(cfg)
    cfg2.MODEL.TYPE = 'dummy'
    cfg2.TRAIN.SCALES = (1,)
    assert cfg.MODEL.TYPE == ''
    assert cfg.TRAIN.SCALES == (600,)


def test_merge_cfg_from_cfg():
    cfg2 = copy.deepcopy(cfg)
    cfg2.MODEL.TYPE = 'test'
    merge_cfg_from_cfg(cfg2)
    assert cfg.MODEL.TYPE == 'test'

    cfg2 = load_cfg(yaml.dump(cfg))
    cfg2.MODEL.TYPE = 'test2'
    merge_cfg_from_cfg(cfg2)
    assert cfg.MODEL.TYPE == 'test2'

    merge_cfg_from_cfg({'MODEL': {'TYPE': 'test3'}})
    assert cfg.MODEL.TYPE == 'test3'

    with pytest.raises(KeyError):
        merge_cfg_from_cfg({'FOO': {'BAR': 1}})

    merge_cfg_from_cfg({'TRAIN': {'SCALES': [1]}})
    assert cfg.TRAIN.SCALES == (1,)
    with pytest.raises(ValueError):
        merge_cfg_from_cfg({'TRAIN': {'SCALES': 1}})


def test_merge_cfg_from_file_restores_dumped_values(tmp_path):
    path = _write(tmp_path, cfg.dump())
    cfg.MODEL.TYPE = 'dummy'
    cfg.TRAIN.SCALES = (1, 2)
    merge_cfg_from_file(path)
    assert cfg.MODEL.TYPE == ''
    assert cfg.TRAIN.SCALES == (600,)
    assert np.array(cfg.PIXEL_MEANS).shape == (1, 1, 3)


def test_merge_cfg_from_list():
    merge_cfg_from_list(['TRAIN.SCALES', '(100, )', 'MODEL.TYPE', 'foobar', 'NUM_GPUS', 2])
    assert cfg.TRAIN.SCALES == (100,)
    assert type(cfg.TRAIN.SCALES) is tuple
    assert cfg.MODEL.TYPE == 'foobar'
    assert cfg.NUM_GPUS == 2


@pytest.mark.parametrize('key', ['FINAL_MSG', 'MODEL.DILATION'])
def test_deprecated_key_from_list_is_ignored(key, caplog):
    with caplog.at_level(logging.WARNING):
        merge_cfg_from_list([key, 'foobar'])
    assert 'Deprecated config key (ignoring): ' + key in caplog.text
    with pytest.raises(AttributeError):
        _ = cfg.FINAL_MSG if key == 'FINAL_MSG' else cfg.MODEL.DILATION


def test_deprecated_keys_from_file_are_ignored(tmp_path, caplog):
    path = _write(tmp_path, 'FINAL_MSG: foo\nMODEL:\n  DILATION: 2\n  TYPE: bar\n')
    with caplog.at_level(logging.WARNING):
        merge_cfg_from_file(path)
    assert cfg.MODEL.TYPE == 'bar'
    assert 'FINAL_MSG' not in cfg and 'DILATION' not in cfg.MODEL
    assert 'MODEL.DILATION' in caplog.text


def test_every_detectron_deprecated_key_is_ignored():
    for key in ['FINAL_MSG', 'MODEL.DILATION', 'ROOT_GPU_ID', 'RPN.ON', 'TRAIN.BBOX_NORMALIZE_TARGETS_PRECOMPUTED',
                'TRAIN.DROPOUT', 'USE_GPU_NMS', 'TEST.NUM_TEST_IMAGES']:
        merge_cfg_from_list([key, '1'])
    assert 'ON' not in cfg.RPN and 'DROPOUT' not in cfg.TRAIN


# ---------------------------------------------------------------------------------------------
# Renamed and unknown keys
# ---------------------------------------------------------------------------------------------
def test_renamed_key_from_list():
    with pytest.raises(ConfigKeyError) as err:
        merge_cfg_from_list(['EXAMPLE.RENAMED.KEY', 'foobar'])
    assert str(err.value) == 'Key EXAMPLE.RENAMED.KEY was renamed to EXAMPLE.KEY; please update your config.'
    assert isinstance(err.value, KeyError)


def test_renamed_key_from_file_names_the_new_key(tmp_path):
    path = _write(tmp_path, 'EXAMPLE:\n  RENAMED:\n    KEY: foobar\n')
    with pytest.raises(ConfigKeyError, match='Key EXAMPLE.RENAMED.KEY was renamed to EXAMPLE.KEY'):
        merge_cfg_from_file(path)


def test_renamed_key_with_note():
    with pytest.raises(ConfigKeyError) as err:
        merge_cfg_from_list(['TRAIN.DATASET', 'coco_2014_train'])
    message = str(err.value)
    assert message.startswith('Key TRAIN.DATASET was renamed to TRAIN.DATASETS; please update your config. Note: ')
    assert "('coco_2014_train',)" in message


def test_test_scales_was_renamed(tmp_path):
    path = _write(tmp_path, 'TEST:\n  SCALES: (800,)\n')
    with pytest.raises(ConfigKeyError, match='Key TEST.SCALES was renamed to TEST.SCALE;'):
        merge_cfg_from_file(path)


def test_unknown_key_from_list_names_source_and_closest_key():
    # Detectron's merge_cfg_from_list asserted: AssertionError('Non-existent key: K').
    with pytest.raises(AssertionError) as err:
        merge_cfg_from_list(['SOLVER.BASE_LRR', '0.1'])
    assert isinstance(err.value, ConfigKeyError)
    assert str(err.value) == ('Non-existent key: SOLVER.BASE_LRR (from command line); '
                              'closest valid key: SOLVER.BASE_LR')


def test_unknown_key_from_file_names_the_file(tmp_path):
    path = _write(tmp_path, 'TRAIN:\n  IMS_PER_BATCHES: 4\n')
    with pytest.raises(ConfigKeyError) as err:
        merge_cfg_from_file(path)
    assert str(err.value) == ('Non-existent config key: TRAIN.IMS_PER_BATCHES (from {}); '
                              'closest valid key: TRAIN.IMS_PER_BATCH'.format(path))


def test_unknown_section_from_list_suggests_nothing_unrelated():
    with pytest.raises(ConfigKeyError) as err:
        merge_cfg_from_list(['FOO.BAR', '1'])
    assert str(err.value) == 'Non-existent key: FOO.BAR (from command line)'


def test_a_section_is_not_a_leaf():
    with pytest.raises(ConfigKeyError, match='Non-existent key: SOLVER '):
        merge_cfg_from_list(['SOLVER', '1'])


def test_yaml_boolean_key_is_explained(tmp_path):
    path = _write(tmp_path, 'RPN:\n  ON: True\n')
    with pytest.raises(ConfigKeyError, match='YAML reads bare ON/OFF/YES/NO as booleans'):
        merge_cfg_from_file(path)


def test_odd_length_list():
    with pytest.raises(ConfigValueError, match='odd number of items: TEST.NMS 0.5 NUM_GPUS') as err:
        merge_cfg_from_list(['TEST.NMS', '0.5', 'NUM_GPUS'])
    assert isinstance(err.value, AssertionError)  # Detectron's bare assert


# ---------------------------------------------------------------------------------------------
# Value decoding and type rules (command line strings; YAML values follow the same rules)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize('key, raw, expected', [
    ('TRAIN.DATASETS', 'coco_2014_train', ('coco_2014_train',)),
    ('TRAIN.DATASETS', '(your_dataset_train,)', ('your_dataset_train',)),
    ('TRAIN.DATASETS', '(a, b)', ('a', 'b')),
    ('TRAIN.DATASETS', '[a,b]', ('a', 'b')),
    ('TRAIN.DATASETS', "['coco_2014_train']", ('coco_2014_train',)),
    ('TRAIN.DATASETS', "('a', 'b')", ('a', 'b')),
    ('TEST.DATASETS', 'coco_2014_minival', ('coco_2014_minival',)),
    ('TRAIN.PROPOSAL_FILES', '/data/props.pkl', ('/data/props.pkl',)),
    ('TEST.PROPOSAL_FILES', '(/a.pkl, /b.pkl)', ('/a.pkl', '/b.pkl')),
    ('SOLVER.BASE_LR', '1', 1.0),
    ('SOLVER.BASE_LR', '0.02', 0.02),
    ('SOLVER.BASE_LR', '1e-3', 0.001),
    ('NUM_GPUS', '8', 8),
    ('NUM_GPUS', 8, 8),
    ('SOLVER.STEPS', '(0, 100)', [0, 100]),
    ('SOLVER.STEPS', '[0, 100]', [0, 100]),
    ('TRAIN.SCALES', '[800]', (800,)),
    ('TRAIN.SCALES', '(640, 800)', (640, 800)),
    ('PIXEL_MEANS', '[[[1, 2, 3]]]', (((1.0, 2.0, 3.0),),)),
    ('PIXEL_MEANS', '[1.5, 2, 3]', (((1.5, 2.0, 3.0),),)),
    ('TRAIN.WEIGHTS', 'None', 'None'),
    ('TRAIN.WEIGHTS', '/path/to/model.pkl', '/path/to/model.pkl'),
    ('MODEL.TYPE', '123', '123'),
    ('TRAIN.USE_FLIPPED', 'False', False),
    ('TEST.SCALE', '800', 800),
    ('SOLVER.WARMUP_ITERS', '1000', 1000),
])
def test_value_coercion(key, raw, expected):
    merge_cfg_from_list([key, raw])
    value = _get(config._KEY_ALIASES.get(key, key))
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize('key, raw, expected_words', [
    ('TEST.SCALE', '800.0', 'expects an integer (default: 600) but got float 800.0'),
    ('TRAIN.USE_FLIPPED', '0', 'expects True or False (default: True) but got int 0'),
    ('TRAIN.USE_FLIPPED', 'false', "expects True or False (default: True) but got str 'false'"),
    ('TRAIN.SCALES', '800', 'expects a tuple (default: (600,)) but got int 800'),
    ('NUM_GPUS', 'True', 'expects an integer (default: 1) but got bool True'),
    ('SOLVER.BASE_LR', 'True', 'expects a number (default: 0.001) but got bool True'),
    ('SOLVER.BASE_LR', 'fast', "expects a number (default: 0.001) but got str 'fast'"),
    ('SOLVER.STEPS', '100', 'expects a list (default: []) but got int 100'),
    ('PIXEL_MEANS', '[1, 2]', 'but got list [1, 2]'),
    ('TRAIN.DATASETS', '(1, 2)', 'expects a tuple (default: ()) but got tuple (1, 2)'),
])
def test_type_mismatch_message(key, raw, expected_words):
    with pytest.raises(ConfigValueError) as err:
        merge_cfg_from_list([key, raw])
    message = str(err.value)
    assert message.startswith('Config key {} '.format(key))
    assert expected_words in message
    assert message.endswith('(from command line)')


def test_yaml_values_follow_the_same_rules(tmp_path):
    path = _write(tmp_path, """
TRAIN:
  DATASETS: (your_dataset_train,)
  WEIGHTS: null
SOLVER:
  BASE_LR: 1
  GAMMA: 1e-1
TEST:
  DATASETS: coco_2014_minival
PIXEL_MEANS: [[[103.5, 116.5, 123.5]]]
""")
    merge_cfg_from_file(path)
    assert cfg.TRAIN.DATASETS == ('your_dataset_train',)
    assert cfg.TRAIN.WEIGHTS == 'None'
    assert cfg.SOLVER.BASE_LR == 1.0 and type(cfg.SOLVER.BASE_LR) is float
    assert cfg.SOLVER.GAMMA == 0.1
    assert cfg.TEST.DATASETS == ('coco_2014_minival',)
    np.testing.assert_array_equal(np.array(cfg.PIXEL_MEANS), [[[103.5, 116.5, 123.5]]])


def test_type_error_from_file_names_the_file(tmp_path):
    path = _write(tmp_path, 'TEST:\n  SCALE: 800.0\n')
    with pytest.raises(ConfigValueError, match='Config key TEST.SCALE expects an integer .* \\(from {}\\)'.format(
            path.replace('.', '\\.'))):
        merge_cfg_from_file(path)


# ---------------------------------------------------------------------------------------------
# Aliases
# ---------------------------------------------------------------------------------------------
ALIASES = [
    ('SOLVER.WARMUP_ITERS', '250', 'SOLVER.WARM_UP_ITERS', 250),
    ('SOLVER.WARMUP_FACTOR', '0.001', 'SOLVER.WARM_UP_FACTOR', 0.001),
    ('SOLVER.WARMUP_METHOD', 'constant', 'SOLVER.WARM_UP_METHOD', 'constant'),
    ('SOLVER.CHECKPOINT_PERIOD', '5000', 'TRAIN.SNAPSHOT_ITERS', 5000),
]


@pytest.mark.parametrize('alias, raw, canonical, expected', ALIASES)
def test_alias_from_list(alias, raw, canonical, expected):
    merge_cfg_from_list([alias, raw])
    assert _get(canonical) == expected
    section, leaf = alias.split('.')
    assert leaf not in cfg[section]


@pytest.mark.parametrize('alias, raw, canonical, expected', ALIASES)
def test_alias_from_file(tmp_path, alias, raw, canonical, expected):
    section, leaf = alias.split('.')
    merge_cfg_from_file(_write(tmp_path, '{}:\n  {}: {}\n'.format(section, leaf, raw)))
    assert _get(canonical) == expected
    assert leaf not in cfg[section]


# ---------------------------------------------------------------------------------------------
# YAML files
# ---------------------------------------------------------------------------------------------
def test_missing_yaml_file(tmp_path):
    path = str(tmp_path / 'nope.yaml')
    with pytest.raises(ConfigValueError, match='Cannot read config file {}: No such file'.format(path)):
        merge_cfg_from_file(path)


def test_malformed_yaml_reports_line_and_column(tmp_path):
    path = _write(tmp_path, 'MODEL:\n  TYPE: generalized_rcnn\n   NUM_CLASSES: 81\n')
    with pytest.raises(ConfigValueError) as err:
        merge_cfg_from_file(path)
    message = str(err.value)
    assert message.startswith('Invalid YAML in {}: line 3, column 15: '.format(path))
    assert '\n' not in message


def test_a_binary_file_as_config_is_one_line(tmp_path):
    path = tmp_path / 'model_final.pth'
    path.write_bytes(b'PK\x03\x04\x14\x00\x00\x08\x08\x00\xa0\xb8\xc6')
    with pytest.raises(ConfigValueError) as err:
        merge_cfg_from_file(str(path))
    assert str(err.value) == ('Config file {} is not a YAML text file (the byte at offset 10 is not UTF-8 '
                              'text); pass the .yaml config with --cfg, and weights files with TRAIN.WEIGHTS / '
                              'TEST.WEIGHTS'.format(path))


def test_yaml_that_is_not_a_mapping(tmp_path):
    with pytest.raises(ConfigValueError, match='must be a mapping of keys to values, got list'):
        merge_cfg_from_file(_write(tmp_path, '- 1\n- 2\n'))


def test_yaml_cannot_construct_arbitrary_python_objects(tmp_path):
    path = _write(tmp_path, "MODEL:\n  TYPE: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ConfigValueError, match="refusing to construct Python object 'os.system'"):
        merge_cfg_from_file(path)


class _DetectronAttrDict(dict):
    """Dumps like Detectron's AttrDict: a dict subclass whose __dict__ holds the frozen flag."""


_DetectronAttrDict.__module__ = 'detectron.utils.collections'
_DetectronAttrDict.__name__ = _DetectronAttrDict.__qualname__ = 'AttrDict'


def _detectron_style_dump():
    def attr_dict(items):
        node = _DetectronAttrDict(items)
        node.__dict__['__immutable__'] = True
        return node
    dumped = attr_dict({
        'PIXEL_MEANS': np.array([[[102.9801, 115.9465, 122.7717]]]),
        'BBOX_XFORM_CLIP': np.float64(np.log(1000. / 16.)),
        'MODEL': attr_dict({'TYPE': 'generalized_rcnn', 'NUM_CLASSES': 81}),
        'TRAIN': attr_dict({'SCALES': (800,), 'DATASETS': ('coco_2014_train', 'coco_2014_valminusminival')}),
    })
    # numpy 2 pickles arrays through numpy._core; Detectron's numpy 1 dumps name numpy.core
    return yaml.dump(dumped).replace('numpy._core.', 'numpy.core.')


def test_load_cfg_reads_a_detectron_pkl_config():
    text = _detectron_style_dump()
    assert '!!python/object/new:detectron.utils.collections.AttrDict' in text
    assert 'numpy.core.multiarray._reconstruct' in text
    loaded = load_cfg(text)
    assert isinstance(loaded, CfgNode) and loaded.is_immutable()
    merge_cfg_from_cfg(loaded)
    assert cfg.MODEL.TYPE == 'generalized_rcnn' and cfg.MODEL.NUM_CLASSES == 81
    assert cfg.PIXEL_MEANS == (((102.9801, 115.9465, 122.7717),),)
    assert type(cfg.BBOX_XFORM_CLIP) is float and cfg.BBOX_XFORM_CLIP == math.log(62.5)
    assert cfg.TRAIN.DATASETS == ('coco_2014_train', 'coco_2014_valminusminival')


# ---------------------------------------------------------------------------------------------
# assert_and_infer_cfg
# ---------------------------------------------------------------------------------------------
def test_defaults_pass_and_infer_nothing():
    assert_and_infer_cfg()
    assert cfg.RPN.RPN_ON is False
    assert cfg.TEST.PRECOMPUTED_PROPOSALS is True
    assert cfg.is_frozen() and cfg.SOLVER.AMP.is_frozen()


@pytest.mark.parametrize('key', ['MODEL.FASTER_RCNN', 'MODEL.RPN_ONLY'])
def test_rpn_is_inferred(key):
    merge_cfg_from_list([key, 'True'])
    assert_and_infer_cfg()
    assert cfg.RPN.RPN_ON is True
    assert cfg.TEST.PRECOMPUTED_PROPOSALS is False


def test_retinanet_needs_no_precomputed_proposals():
    merge_cfg_from_list(['RETINANET.RETINANET_ON', 'True'])
    assert_and_infer_cfg()
    assert cfg.RPN.RPN_ON is False
    assert cfg.TEST.PRECOMPUTED_PROPOSALS is False


def test_make_immutable_false():
    assert_and_infer_cfg(make_immutable=False)
    cfg.MODEL.TYPE = 'still_mutable'
    assert cfg.MODEL.TYPE == 'still_mutable'


@pytest.mark.parametrize('overrides, message', [
    (['STD_NMS', 'True'], 'STD_NMS True needs the predicted sigmas: set PRED_STD True as well, with weights '
                      'trained with PRED_STD True (they hold bbox_pred_std)'),
    (['STD_NMS', 'True', 'PRED_STD', 'True', 'STD.METHOD', 'std2'], "STD.METHOD must be one of 'stdiou', 'soft'"),
    (['SOLVER.AMP.DTYPE', 'float8'], "SOLVER.AMP.DTYPE must be one of 'float16', 'bfloat16', got 'float8'"),
    (['STD.SIGMA_COLUMN_ORDER', 'fixed'], "STD.SIGMA_COLUMN_ORDER must be one of 'reference', 'corrected'"),
    (['TRAIN.FREEZE_AT', '1'], 'TRAIN.FREEZE_AT must be one of 0, 2, 3, 4, 5, got 1'),
    (['NUM_GPUS', '0'], 'NUM_GPUS must be at least 1, got 0'),
    (['SOLVER.ITER_SIZE', '0'], 'SOLVER.ITER_SIZE must be at least 1, got 0'),
    (['TRAIN.SNAPSHOT_ITERS', '0'], 'TRAIN.SNAPSHOT_ITERS must be at least 1, got 0'),
    (['TRAIN.CUDA_GRAPHS_MAX_SHAPES', '0'], 'TRAIN.CUDA_GRAPHS_MAX_SHAPES must be at least 1, got 0'),
    (['TEST.CUDA_GRAPHS_MAX_SHAPES', '-2'], 'TEST.CUDA_GRAPHS_MAX_SHAPES must be at least 1, got -2'),
    (['TEST.IMS_PER_BATCH', '0'], 'TEST.IMS_PER_BATCH must be at least 1, got 0'),
    # Solver values no schedule means.
    (['SOLVER.BASE_LR', '-0.02'], 'SOLVER.BASE_LR must be a finite number > 0, got -0.02'),
    (['SOLVER.BASE_LR', '0'], 'SOLVER.BASE_LR must be a finite number > 0, got 0.0'),
    (['SOLVER.BASE_LR', '1e999'], 'SOLVER.BASE_LR must be a finite number > 0, got inf'),
    (['SOLVER.GAMMA', '-0.1'], 'SOLVER.GAMMA must be a finite number > 0, got -0.1'),
    (['SOLVER.MOMENTUM', '1.0'], 'SOLVER.MOMENTUM must be in [0, 1), got 1.0'),
    (['SOLVER.MOMENTUM', '-0.9'], 'SOLVER.MOMENTUM must be in [0, 1), got -0.9'),
    (['SOLVER.WEIGHT_DECAY', '-1e-4'], 'SOLVER.WEIGHT_DECAY must be a finite number >= 0, got -0.0001'),
    (['SOLVER.WEIGHT_DECAY_GN', '-1'], 'SOLVER.WEIGHT_DECAY_GN must be a finite number >= 0, got -1.0'),
    (['SOLVER.WARM_UP_ITERS', '-5'], 'SOLVER.WARM_UP_ITERS must be at least 0, got -5'),
    (['SOLVER.WARM_UP_FACTOR', '3'], 'SOLVER.WARM_UP_FACTOR must be in [0, 1], got 3.0'),
    (['SOLVER.AMP.LOSS_SCALE', '-128'], 'SOLVER.AMP.LOSS_SCALE must be a finite number >= 0 (0: dynamic'),
    (['SOLVER.LR_POLICY', 'step', 'SOLVER.STEP_SIZE', '0'],
     'SOLVER.STEP_SIZE must be at least 1 with LR_POLICY step, got 0'),
    (['SOLVER.LR_POLICY', 'steps_with_lrs', 'SOLVER.STEPS', '[0, 10]', 'SOLVER.LRS', '[0.1, -0.01]'],
     'SOLVER.LRS must be a list of finite numbers > 0, got [0.1, -0.01]'),
])
def test_inconsistent_settings_are_rejected(overrides, message):
    merge_cfg_from_list(overrides)
    with pytest.raises(ConfigValueError) as err:
        assert_and_infer_cfg()
    assert str(err.value).startswith(message)


def test_std_method_is_free_without_std_nms():
    merge_cfg_from_list(['STD.METHOD', 'std2'])
    assert_and_infer_cfg()


# ---------------------------------------------------------------------------------------------
# Output directories
# ---------------------------------------------------------------------------------------------
def test_get_output_dir(tmp_path):
    merge_cfg_from_list(['OUTPUT_DIR', str(tmp_path), 'MODEL.TYPE', 'generalized_rcnn'])
    train_dir = get_output_dir(('coco_2014_train', 'coco_2014_valminusminival'))
    assert train_dir == str(tmp_path / 'train' / 'coco_2014_train:coco_2014_valminusminival' / 'generalized_rcnn')
    test_dir = get_output_dir(('coco_2014_minival',), training=False)
    assert test_dir == str(tmp_path / 'test' / 'coco_2014_minival' / 'generalized_rcnn')
    assert get_output_dir('coco_2014_minival', training=False) == test_dir
    assert (tmp_path / 'train' / 'coco_2014_train:coco_2014_valminusminival' / 'generalized_rcnn').is_dir()
    assert (tmp_path / 'test' / 'coco_2014_minival' / 'generalized_rcnn').is_dir()


def test_output_dir_under_a_file_is_one_output_dir_error(tmp_path):
    (tmp_path / 'a_file').write_text('')
    merge_cfg_from_list(['OUTPUT_DIR', str(tmp_path / 'a_file' / 'out'), 'MODEL.TYPE', 'generalized_rcnn'])
    with pytest.raises(OutputDirError) as err:
        get_output_dir(('coco_2014_train',))
    assert str(err.value) == (
        'OUTPUT_DIR {0} cannot be used: {0}/train/coco_2014_train/generalized_rcnn is not a writable directory '
        '(Not a directory); set OUTPUT_DIR to a writable directory'.format(tmp_path / 'a_file' / 'out'))


def test_read_only_output_dir_is_one_output_dir_error(tmp_path, monkeypatch):
    # Root writes through permission bits, so the read-only filesystem is simulated.
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, 'Read-only file system')
    merge_cfg_from_list(['OUTPUT_DIR', str(tmp_path), 'MODEL.TYPE', 'generalized_rcnn'])
    get_output_dir(('coco_2014_train',))  # exists now: only writing it fails below
    monkeypatch.setattr(config.tempfile, 'TemporaryFile', read_only)
    with pytest.raises(OutputDirError, match=r'is not a writable directory \(Read-only file system\); set '
                                             r'OUTPUT_DIR to a writable directory'):
        get_output_dir(('coco_2014_train',))


def test_get_output_dir_rejects_other_types():
    with pytest.raises(ConfigValueError, match='dataset names as a tuple, list or string'):
        get_output_dir(3)


# ---------------------------------------------------------------------------------------------
# Linear scaling rule
# ---------------------------------------------------------------------------------------------
TUTORIAL = 'configs/getting_started/tutorial_{}gpu_e2e_faster_rcnn_R-50-FPN.yaml'


def test_images_per_iter():
    merge_cfg_from_list(['NUM_GPUS', '4', 'TRAIN.IMS_PER_BATCH', '3', 'SOLVER.ITER_SIZE', '2'])
    assert images_per_iter() == 24


@pytest.mark.parametrize('gpus', [1, 2, 4])
def test_scaling_the_8gpu_tutorial_gives_the_smaller_tutorials(gpus):
    merge_cfg_from_file(TUTORIAL.format(gpus))
    expected = (cfg.SOLVER.BASE_LR, cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS, cfg.TRAIN.SNAPSHOT_ITERS)
    merge_cfg_from_file(TUTORIAL.format(8))
    merge_cfg_from_list(['SOLVER.REFERENCE_WORLD_BATCH', '16', 'NUM_GPUS', str(gpus)])
    scale_schedule_to_global_batch(images_per_iter())
    assert cfg.SOLVER.BASE_LR == pytest.approx(expected[0], rel=1e-12)
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS, cfg.TRAIN.SNAPSHOT_ITERS) == expected[1:]
    assert cfg.SOLVER.WARM_UP_ITERS == 500 * 8 // gpus


def test_scaling_with_accumulation_and_explicit_lrs(caplog):
    merge_cfg_from_list([
        'SOLVER.REFERENCE_WORLD_BATCH', '2', 'SOLVER.ITER_SIZE', '2', 'TRAIN.IMS_PER_BATCH', '2',
        'SOLVER.LR_POLICY', 'steps_with_lrs', 'SOLVER.STEPS', '[0, 600]', 'SOLVER.LRS', '[0.01, 0.001]',
        'SOLVER.MAX_ITER', '1000', 'SOLVER.WARM_UP_ITERS', '101', 'SOLVER.STEP_SIZE', '300'])
    with caplog.at_level(logging.INFO):
        changes = scale_schedule_to_global_batch(4)  # 1 GPU x 2 images x 2 accumulated
    solver = cfg.SOLVER
    assert solver.BASE_LR == pytest.approx(0.002)
    assert solver.LRS == pytest.approx([0.02, 0.002])
    assert (solver.MAX_ITER, solver.STEPS, solver.STEP_SIZE) == (500, [0, 300], 150)
    assert solver.WARM_UP_ITERS == 50  # round(50.5) -> 50, Python's round half to even
    # The default 80000: SNAPSHOT_ITERS x IMS_PER_BATCH = 160000 images between checkpoints.
    assert cfg.TRAIN.SNAPSHOT_ITERS == 40000
    assert 'SOLVER.MAX_ITER: 1000 -> 500' in changes
    assert 'TRAIN.SNAPSHOT_ITERS: 80000 -> 40000' in changes
    assert 'SOLVER.MAX_ITER: 1000 -> 500' in caplog.text


def test_scaling_keeps_a_typed_checkpoint_period(caplog):
    merge_cfg_from_list(['SOLVER.REFERENCE_WORLD_BATCH', '2', 'SOLVER.ITER_SIZE', '2', 'TRAIN.IMS_PER_BATCH', '2',
                         'SOLVER.MAX_ITER', '1000', 'SOLVER.CHECKPOINT_PERIOD', '400'])
    with caplog.at_level(logging.INFO):
        changes = scale_schedule_to_global_batch(4)
    assert (cfg.SOLVER.MAX_ITER, cfg.TRAIN.SNAPSHOT_ITERS) == (500, 400)
    assert not [change for change in changes if 'SNAPSHOT' in change]
    assert 'TRAIN.SNAPSHOT_ITERS 400 kept as typed' in caplog.text


def test_scaling_is_off_by_default_and_at_the_reference_batch():
    before = copy.deepcopy(cfg.SOLVER)
    assert scale_schedule_to_global_batch(64) == []
    merge_cfg_from_list(['SOLVER.REFERENCE_WORLD_BATCH', '16'])
    assert scale_schedule_to_global_batch(16) == []
    before.REFERENCE_WORLD_BATCH = 16
    assert cfg.SOLVER == before


def test_scaling_after_freezing_is_refused():
    merge_cfg_from_list(['SOLVER.REFERENCE_WORLD_BATCH', '16'])
    assert_and_infer_cfg()
    with pytest.raises(ConfigValueError, match='before assert_and_infer_cfg'):
        scale_schedule_to_global_batch(4)


def test_the_kl_loss_guides_fp16_spelling_names_the_keys_to_use(tmp_path):
    path = _write(tmp_path, 'fp16: true\nloss_scale: 128.0\n')
    with pytest.raises(ConfigKeyError) as err:
        merge_cfg_from_file(path)
    assert str(err.value) == (
        f'Non-existent config key: fp16 (from {path}); mixed precision here is SOLVER.AMP.ENABLED True '
        'SOLVER.AMP.DTYPE float16 SOLVER.AMP.LOSS_SCALE 128 (or SOLVER.AMP.DTYPE bfloat16)')
    with pytest.raises(ConfigKeyError, match=r'\(from command line\); a fixed loss scale here is SOLVER.AMP'):
        merge_cfg_from_list(['loss_scale', '128.0'])
    # The advice is itself a valid override.
    merge_cfg_from_list('SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE float16 SOLVER.AMP.LOSS_SCALE 128'.split())
    assert (cfg.SOLVER.AMP.ENABLED, cfg.SOLVER.AMP.DTYPE, cfg.SOLVER.AMP.LOSS_SCALE) == (True, 'float16', 128.0)
