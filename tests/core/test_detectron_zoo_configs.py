"""Every yaml of Detectron's configs/ (all 87) ships in ours and, merged as train_net merges it, builds;
each of its 50 models (the 1x / 2x / s1x files of a model share one) trains one iteration on the CPU at a
small scale (the tiny datasets, 64 px images, the real bodies and heads; the keypoint_rcnn_* and fast_rcnn_*
ones on a proposal file of the tiny images; the keypoint models' heads have Detectron's shapes)."""
import json
import os

import pytest
import torch

from detectron.checkpoint import checkpointer
from detectron.core import train_engine
from detectron.core.config import cfg
from detectron.core.config_yaml import load_yaml_file
from detectron.core.config_finalize import finalize_cfg
from support.tiny_runs import REPO, write_tiny_proposals

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

CONFIGS = os.path.join(REPO, 'configs')

# The 87 files of Detectron's configs/ (facebookresearch/Detectron at 04155a0).
_BASELINE_NAMES = [
    'e2e_faster_rcnn_R-101-FPN_1x', 'e2e_faster_rcnn_R-101-FPN_2x', 'e2e_faster_rcnn_R-50-C4_1x',
    'e2e_faster_rcnn_R-50-C4_2x', 'e2e_faster_rcnn_R-50-FPN_1x', 'e2e_faster_rcnn_R-50-FPN_2x',
    'e2e_faster_rcnn_X-101-32x8d-FPN_1x', 'e2e_faster_rcnn_X-101-32x8d-FPN_2x', 'e2e_faster_rcnn_X-101-64x4d-FPN_1x',
    'e2e_faster_rcnn_X-101-64x4d-FPN_2x',
    'e2e_keypoint_rcnn_R-101-FPN_1x', 'e2e_keypoint_rcnn_R-101-FPN_s1x', 'e2e_keypoint_rcnn_R-50-FPN_1x',
    'e2e_keypoint_rcnn_R-50-FPN_s1x', 'e2e_keypoint_rcnn_X-101-32x8d-FPN_1x', 'e2e_keypoint_rcnn_X-101-32x8d-FPN_s1x',
    'e2e_keypoint_rcnn_X-101-64x4d-FPN_1x', 'e2e_keypoint_rcnn_X-101-64x4d-FPN_s1x',
    'e2e_mask_rcnn_R-101-FPN_1x', 'e2e_mask_rcnn_R-101-FPN_2x', 'e2e_mask_rcnn_R-50-C4_1x', 'e2e_mask_rcnn_R-50-C4_2x',
    'e2e_mask_rcnn_R-50-FPN_1x', 'e2e_mask_rcnn_R-50-FPN_2x', 'e2e_mask_rcnn_X-101-32x8d-FPN_1x',
    'e2e_mask_rcnn_X-101-32x8d-FPN_2x', 'e2e_mask_rcnn_X-101-64x4d-FPN_1x', 'e2e_mask_rcnn_X-101-64x4d-FPN_2x',
    'e2e_mask_rcnn_X-152-32x8d-FPN-IN5k_1.44x',
    'fast_rcnn_R-101-FPN_1x', 'fast_rcnn_R-101-FPN_2x', 'fast_rcnn_R-50-C4_1x', 'fast_rcnn_R-50-C4_2x',
    'fast_rcnn_R-50-FPN_1x', 'fast_rcnn_R-50-FPN_2x', 'fast_rcnn_X-101-32x8d-FPN_1x', 'fast_rcnn_X-101-32x8d-FPN_2x',
    'fast_rcnn_X-101-64x4d-FPN_1x', 'fast_rcnn_X-101-64x4d-FPN_2x',
    'keypoint_rcnn_R-101-FPN_1x', 'keypoint_rcnn_R-101-FPN_s1x', 'keypoint_rcnn_R-50-FPN_1x',
    'keypoint_rcnn_R-50-FPN_s1x', 'keypoint_rcnn_X-101-32x8d-FPN_1x', 'keypoint_rcnn_X-101-32x8d-FPN_s1x',
    'keypoint_rcnn_X-101-64x4d-FPN_1x', 'keypoint_rcnn_X-101-64x4d-FPN_s1x',
    'mask_rcnn_R-101-FPN_1x', 'mask_rcnn_R-101-FPN_2x', 'mask_rcnn_R-50-C4_1x', 'mask_rcnn_R-50-C4_2x',
    'mask_rcnn_R-50-FPN_1x', 'mask_rcnn_R-50-FPN_2x', 'mask_rcnn_X-101-32x8d-FPN_1x', 'mask_rcnn_X-101-32x8d-FPN_2x',
    'mask_rcnn_X-101-64x4d-FPN_1x', 'mask_rcnn_X-101-64x4d-FPN_2x',
    'retinanet_R-101-FPN_1x', 'retinanet_R-101-FPN_2x', 'retinanet_R-50-FPN_1x', 'retinanet_R-50-FPN_2x',
    'retinanet_X-101-32x8d-FPN_1x', 'retinanet_X-101-32x8d-FPN_2x', 'retinanet_X-101-64x4d-FPN_1x',
    'retinanet_X-101-64x4d-FPN_2x',
    'rpn_R-101-FPN_1x', 'rpn_R-50-C4_1x', 'rpn_R-50-FPN_1x', 'rpn_X-101-32x8d-FPN_1x', 'rpn_X-101-64x4d-FPN_1x',
    'rpn_person_only_R-101-FPN_1x', 'rpn_person_only_R-50-FPN_1x', 'rpn_person_only_X-101-32x8d-FPN_1x',
    'rpn_person_only_X-101-64x4d-FPN_1x',
]
DETECTRON_CONFIGS = (
    ['12_2017_baselines/{}.yaml'.format(name) for name in _BASELINE_NAMES]
    + ['04_2018_gn_baselines/{}.yaml'.format(name) for name in (
        'e2e_mask_rcnn_R-101-FPN_2x_gn', 'e2e_mask_rcnn_R-101-FPN_3x_gn', 'e2e_mask_rcnn_R-50-FPN_2x_gn',
        'e2e_mask_rcnn_R-50-FPN_3x_gn', 'mask_rcnn_R-50-FPN_1x_gn', 'scratch_e2e_mask_rcnn_R-101-FPN_3x_gn',
        'scratch_e2e_mask_rcnn_R-50-FPN_3x_gn')]
    + ['getting_started/tutorial_{}gpu_e2e_faster_rcnn_R-50-FPN.yaml'.format(n) for n in (1, 2, 4, 8)]
    + ['test_time_aug/e2e_mask_rcnn_R-50-FPN_2x.yaml', 'test_time_aug/keypoint_rcnn_R-50-FPN_1x.yaml']
)

# Small inputs and sampling counts; the bodies, heads and schedules' shapes stay the config's.
SMALL = [
    'NUM_GPUS', '1', 'TRAIN.WEIGHTS', "''", 'TRAIN.DATASETS', "('tiny_train',)", 'TEST.DATASETS', "('tiny_val',)",
    'TRAIN.SCALES', '(64,)', 'TRAIN.MAX_SIZE', '96', 'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96',
    'TRAIN.RPN_PRE_NMS_TOP_N', '200', 'TRAIN.RPN_POST_NMS_TOP_N', '64', 'TEST.RPN_PRE_NMS_TOP_N', '100',
    'TEST.RPN_POST_NMS_TOP_N', '50', 'TRAIN.BATCH_SIZE_PER_IM', '32', 'TRAIN.IMS_PER_BATCH', '1',
    'DATA_LOADER.NUM_THREADS', '0', 'SOLVER.MAX_ITER', '1', 'SOLVER.STEPS', '[0]', 'SOLVER.WARM_UP_ITERS', '1',
    'TRAIN.SNAPSHOT_ITERS', '1000',
]


def test_every_detectron_config_ships():
    shipped = {os.path.relpath(os.path.join(root, name), CONFIGS)
               for root, _, names in os.walk(CONFIGS) for name in names if name.endswith('.yaml')}
    assert len(DETECTRON_CONFIGS) == 87
    assert sorted(set(DETECTRON_CONFIGS) - shipped) == []


@pytest.fixture(scope='module')
def tiny_proposals(tiny_catalog, tmp_path_factory):
    return write_tiny_proposals(tiny_catalog, tmp_path_factory.mktemp('proposals') / 'rpn_proposals.pkl')


def _overrides(relative_path, tiny_catalog, tiny_proposals, output_dir):
    typed = load_yaml_file(os.path.join(CONFIGS, relative_path))
    opts = SMALL + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(output_dir), 'MODEL.NUM_CLASSES', '3']
    if typed.get('MODEL', {}).get('KEYPOINTS_ON'):  # the person-only keypoint data of the tiny images
        opts += ['TRAIN.DATASETS', "('tiny_keypoints',)", 'TEST.DATASETS', "('tiny_keypoints',)",
                 'MODEL.NUM_CLASSES', '2']
    if typed.get('TRAIN', {}).get('PROPOSAL_FILES'):
        opts += ['TRAIN.PROPOSAL_FILES', "('{}',)".format(tiny_proposals),
                 'TEST.PROPOSAL_FILES', "('{}',)".format(tiny_proposals)]
    return opts


def _model_sections(relative_path):
    """The config without its schedule (SOLVER, NUM_GPUS, OUTPUT_DIR): Detectron's 1x / 2x / s1x files of
    one model differ only there."""
    typed = load_yaml_file(os.path.join(CONFIGS, relative_path))
    return json.dumps({k: v for k, v in typed.items() if k not in ('SOLVER', 'NUM_GPUS', 'OUTPUT_DIR')},
                      sort_keys=True, default=str)


# Each model is trained once, from its first config; its other schedules finalize.
_FIRST_OF_MODEL = {}
for _path in DETECTRON_CONFIGS:
    _FIRST_OF_MODEL.setdefault(_model_sections(_path), _path)


@pytest.fixture
def written_checkpoints(monkeypatch):
    """{path: content} of the checkpoints training writes. Kept in memory: writing, digesting and fsyncing an
    X-152's weights and momentum (~1 GB) took half of each model's time; the file write is the same code for
    every model and tests/checkpoint/ tests it."""
    written = {}
    monkeypatch.setattr(checkpointer, 'write_torch_file', lambda content, path: written.setdefault(path, content))
    return written


@pytest.mark.slow
@pytest.mark.parametrize('relative_path', DETECTRON_CONFIGS)
def test_detectron_config_builds_and_trains_one_iteration(relative_path, tiny_catalog, tiny_proposals, tmp_path,
                                                          written_checkpoints):
    output_dir = tmp_path / 'output'
    opts = _overrides(relative_path, tiny_catalog, tiny_proposals, output_dir)
    cfg.defrost()
    finalize_cfg(os.path.join(CONFIGS, relative_path), opts, training=True)
    first = _FIRST_OF_MODEL[_model_sections(relative_path)]
    if first != relative_path:  # the same model as `first`, which trains: only the schedule differs
        return
    final = train_engine.train_model()['final']
    assert list(written_checkpoints) == [final]
    saved = written_checkpoints[final]
    assert saved['iteration'] == 0 and saved['model']
    # The one SGD step ran: every parameter that trains has its momentum, and every value is finite.
    momenta = [state['momentum_buffer'] for state in saved['optimizer']['state'].values()]
    assert momenta and len(momenta) == sum(len(g['params']) for g in saved['optimizer']['param_groups'])
    assert all(torch.isfinite(t).all() for t in [*saved['model'].values(), *momenta] if t.is_floating_point())
    if cfg.MODEL.KEYPOINTS_ON:  # Detectron's keypoint head: 8 convs of 512, a 4x4 deconvolution to 17 heatmaps
        assert saved['model']['keypoint_head.conv_fcn8.weight'].shape == (512, 512, 3, 3)
        assert saved['model']['keypoint_head.kps_score.weight'].shape == (17, 17, 4, 4)


def test_the_count_of_distinct_models_trained():
    assert len(set(_FIRST_OF_MODEL.values())) == 50
