"""Keypoint R-CNN on precomputed proposals (Detectron's two-stage keypoint_rcnn_*) end to end on the tiny keypoint
data (CPU): minibatches with too few visible keypoints are skipped and logged, a resumed run continues exactly, the
model tests on its proposal file with keypoints; end-to-end training judges no minibatch."""
import logging
import os
import shutil

import pytest
import torch

from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from support.tiny_runs import REPO, write_tiny_proposals

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

DEMO = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml')
TRAIN_SUBDIR = os.path.join('train', 'tiny_keypoints', 'generalized_rcnn')
# Per image, the tiny keypoint data's RoIs hold 27 to 68 visible keypoints: 40 leaves some images out.
MIN_COUNT = 40


def _use(catalog, output_dir, proposals, *overrides):
    cfg.defrost()
    two_stage = ['MODEL.FASTER_RCNN', 'False', 'TRAIN.PROPOSAL_FILES', "('{}',)".format(proposals),
                 'TEST.PROPOSAL_FILES', "('{}',)".format(proposals)] if proposals else [
        'TRAIN.PROPOSAL_FILES', '()', 'TEST.PROPOSAL_FILES', '()']
    finalize_cfg(DEMO, [
        'DATASET_CATALOG', str(catalog), 'TRAIN.DATASETS', "('tiny_keypoints',)", 'TEST.DATASETS', "('tiny_keypoints',)",
        'KRCNN.NUM_KEYPOINTS', '17', 'FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'GROUP_NORM.NUM_GROUPS', '16',
        'KRCNN.CONV_HEAD_DIM', '16', 'KRCNN.NUM_STACKED_CONVS', '2', 'TRAIN.SCALES', '(64,)', 'TRAIN.MAX_SIZE', '96',
        'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96', 'TRAIN.RPN_PRE_NMS_TOP_N', '200', 'TRAIN.RPN_POST_NMS_TOP_N', '64',
        'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '50', 'TRAIN.BATCH_SIZE_PER_IM', '32',
        'TRAIN.IMS_PER_BATCH', '1', 'DATA_LOADER.NUM_THREADS', '0', 'SOLVER.MAX_ITER', '4', 'SOLVER.STEPS', '[0]',
        'SOLVER.WARM_UP_ITERS', '2', 'TRAIN.SNAPSHOT_ITERS', '2', 'TEST.SCORE_THRESH', '0.0',
        'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH', str(MIN_COUNT), 'OUTPUT_DIR', str(output_dir),
    ] + two_stage + list(overrides), training=True)


@pytest.fixture(scope='module')
def proposals(tiny_catalog, tmp_path_factory):
    return write_tiny_proposals(tiny_catalog, tmp_path_factory.mktemp('proposals') / 'rpn_proposals.pkl')


@pytest.fixture(scope='module')
def uninterrupted(tiny_catalog, proposals, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp('two_stage')
    _use(tiny_catalog, output_dir, proposals)
    torch.manual_seed(0)
    handler, logger = _ListHandler(), logging.getLogger('detectron.roi_data.samplers')
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        final = train_engine.train_model()['final']
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return {'final': final, 'train_dir': os.path.join(str(output_dir), TRAIN_SUBDIR), 'log': handler.lines}


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_minibatches_with_few_visible_keypoints_are_skipped_and_logged(uninterrupted):
    skipped = [line for line in uninterrupted['log'] if line.startswith('Training minibatch of images')]
    assert skipped
    for line in skipped:
        count = int(line.split(' hold ')[1].split(' visible')[0])
        assert count <= MIN_COUNT and 'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH {}'.format(MIN_COUNT) in line
    assert skipped[-1].endswith('({} skipped so far)'.format(len(skipped)))


def test_a_resumed_two_stage_run_continues_exactly(uninterrupted, tiny_catalog, proposals, tmp_path):
    _use(tiny_catalog, tmp_path, proposals)
    train_dir = tmp_path / TRAIN_SUBDIR
    train_dir.mkdir(parents=True)
    shutil.copy(os.path.join(uninterrupted['train_dir'], 'model_iter1.pth'), train_dir)
    train_engine.train_model()
    resumed = torch.load(train_dir / 'model_final.pth', weights_only=True)['model']
    whole = torch.load(uninterrupted['final'], weights_only=True)['model']
    assert resumed.keys() == whole.keys()
    for key, value in whole.items():
        assert torch.equal(resumed[key], value), key


def test_the_two_stage_model_tests_on_its_proposal_file_with_keypoints(uninterrupted, tiny_catalog, proposals,
                                                                       tmp_path):
    _use(tiny_catalog, tmp_path, proposals)
    model_type = model_builder.build_model_type(cfg)
    results = test_engine.run_inference(model_type, uninterrupted['final'])['tiny_keypoints']
    assert 'AP' in results['box'] and 'AP' in results['keypoint']


def test_end_to_end_training_judges_no_minibatch(tiny_catalog, tmp_path):
    _use(tiny_catalog, tmp_path, None)
    model_type = model_builder.build_model_type(cfg)
    assert model_type.training_batch_check(model_type.training_roidb()) is None
