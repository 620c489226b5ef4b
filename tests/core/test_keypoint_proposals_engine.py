"""Keypoint R-CNN on precomputed proposals (Detectron's two-stage keypoint_rcnn_*) end to end on the tiny keypoint
data (CPU): minibatches with too few visible keypoints are skipped and logged, a resumed run continues exactly from
the stream position its checkpoint stored (judging no earlier draw; one written without it, by judging them again),
the model tests on its proposal file with keypoints; end-to-end training judges no minibatch."""
import logging
import os
import shutil

import pytest
import torch

from detectron.checkpoint.torch_file import read_torch_file, write_torch_file
from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from detectron.modeling.rcnn_builder import GeneralizedRCNNType
from detectron.utils.digest import DIGEST_KEY
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
def judged():
    """(global batch, valid) of every draw the two-stage check judges, in order (tests clear it)."""
    calls = []
    build = GeneralizedRCNNType.training_batch_check

    def recording(self, roidb):
        check = build(self, roidb)
        if check is None:
            return None

        def judge(rank_batches, iteration):
            why = check(rank_batches, iteration)
            calls.append((iteration, why is None))
            return why
        return judge
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GeneralizedRCNNType, 'training_batch_check', recording)
        yield calls


@pytest.fixture(scope='module')
def uninterrupted_runs(tiny_catalog, proposals, tmp_path_factory, judged):
    """fn(iter_size) -> the uninterrupted run with SOLVER.ITER_SIZE iter_size (trained once)."""
    runs = {}

    def run(iter_size):
        if iter_size not in runs:
            output_dir = tmp_path_factory.mktemp('two_stage')
            _use(tiny_catalog, output_dir, proposals, 'SOLVER.ITER_SIZE', str(iter_size))
            torch.manual_seed(0)
            judged.clear()
            final, log = _train_logged()
            runs[iter_size] = {'final': final, 'train_dir': os.path.join(str(output_dir), TRAIN_SUBDIR), 'log': log,
                               'judged': list(judged)}
        return runs[iter_size]
    return run


@pytest.fixture(scope='module')
def uninterrupted(uninterrupted_runs):
    return uninterrupted_runs(1)


def _train_logged():
    """(train_model's final model, the sampler's log lines)."""
    handler, logger = _ListHandler(), logging.getLogger('detectron.roi_data.samplers')
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return train_engine.train_model()['final'], handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


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


@pytest.mark.parametrize('iter_size', [1, 2])
def test_a_resumed_two_stage_run_continues_exactly_from_the_stored_position(uninterrupted_runs, judged, tiny_catalog,
                                                                            proposals, tmp_path, iter_size):
    run = uninterrupted_runs(iter_size)
    checkpoint = os.path.join(run['train_dir'], 'model_iter1.pth')
    # model_iter1.pth resumes at iteration 2, global batch 2 x ITER_SIZE: the uninterrupted run's draws before it.
    start = 2 * iter_size
    earlier = [valid for iteration, valid in run['judged'] if iteration < start]
    position = {'draws': len(earlier), 'skipped': earlier.count(False)}
    assert position['skipped'] > 0  # the resume has skipped draws to account for
    assert torch.load(checkpoint, weights_only=True)['sampler']['position'] == position
    log = _resume(run, checkpoint, judged, tiny_catalog, proposals, tmp_path, 'SOLVER.ITER_SIZE', str(iter_size))
    assert min(iteration for iteration, _ in judged) == start  # no earlier draw judged again
    assert log[0] == '{} training minibatches skipped before iteration 2'.format(position['skipped'])


def test_a_checkpoint_without_the_stored_position_resumes_by_judging_again(uninterrupted, judged, tiny_catalog,
                                                                          proposals, tmp_path):
    # As written before positions were stored: the sampler state holds the seed and global batch only.
    old = read_torch_file(os.path.join(uninterrupted['train_dir'], 'model_iter1.pth'))
    old.pop(DIGEST_KEY)
    del old['sampler']['position']
    checkpoint = str(tmp_path / 'model_iter1.pth')
    write_torch_file(old, checkpoint)
    _resume(uninterrupted, checkpoint, judged, tiny_catalog, proposals, tmp_path / 'resumed')
    assert min(iteration for iteration, _ in judged) == 0


def _resume(run, checkpoint, judged, catalog, proposals, output_dir, *overrides):
    """Resume from checkpoint in output_dir and check that the final model is bitwise the uninterrupted run's;
    returns the sampler's log lines (judged: the resumed run's draws)."""
    _use(catalog, output_dir, proposals, *overrides)
    train_dir = output_dir / TRAIN_SUBDIR
    train_dir.mkdir(parents=True)
    shutil.copy(checkpoint, train_dir)
    judged.clear()
    _, log = _train_logged()
    resumed = torch.load(train_dir / 'model_final.pth', weights_only=True)['model']
    whole = torch.load(run['final'], weights_only=True)['model']
    assert resumed.keys() == whole.keys()
    for key, value in whole.items():
        assert torch.equal(resumed[key], value), key
    return log


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
