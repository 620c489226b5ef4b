"""RPN-only models and Fast R-CNN on proposal files on the tiny datasets (CPU): an RPN-only model trains
a few iterations and test_net writes Detectron's rpn_proposals.pkl with its recall (checked against a
numpy re-implementation of Detectron's evaluate_box_proposals); --range and 2-process testing merge the
proposals as one process writes them; a Fast R-CNN (and a two-stage Mask R-CNN, a KL head with XYXY
and variance voting) trains from that file and tests on it."""
import os
import pickle

import numpy as np
import pytest
import torch
from _pytest.monkeypatch import MonkeyPatch

from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from support.proposal_recall import detectron_proposal_ar
from support.tiny_runs import MASK_OVERRIDES, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

RPN_ONLY = ['MODEL.RPN_ONLY', 'True', 'MODEL.FASTER_RCNN', 'False', 'SOLVER.MAX_ITER', '2']


def _fast_rcnn(proposal_file, *overrides):
    # RPN_ON as a fresh process leaves it (the module's RPN-only run inferred it True).
    return ['MODEL.RPN_ONLY', 'False', 'RPN.RPN_ON', 'False',
            'MODEL.FASTER_RCNN', 'False', 'SOLVER.MAX_ITER', '2', 'TRAIN.PROPOSAL_FILES', "('{}',)".format(proposal_file),
            'TEST.PROPOSAL_FILES', "('{}',)".format(proposal_file), 'TRAIN.DATASETS', "('tiny_val',)",
            'TEST.PROPOSAL_LIMIT', '40'] + list(overrides)


def _load(path):
    with open(path, 'rb') as f:
        return pickle.load(f)


@pytest.fixture(scope='module')
def rpn_run(tiny_catalog, tmp_path_factory):
    """An RPN-only model trained 2 iterations, then tested on tiny_val: its output directory and results (the
    module's cfg is restored at its end by conftest)."""
    patch = MonkeyPatch()
    patch.setattr(dataset_catalog, '_registered', {})
    output_dir = tmp_path_factory.mktemp('rpn_only')
    torch.manual_seed(0)
    try:
        use_tiny_config(tiny_catalog, output_dir, *RPN_ONLY)
        final = train_engine.train_model()['final']
        results = test_engine.run_inference(model_builder.build_model_type(cfg), final)
        test_dir = os.path.join(str(output_dir), 'test', 'tiny_val', 'generalized_rcnn')
        yield {'dir': test_dir, 'results': results, 'final': final, 'output_dir': output_dir}
    finally:
        patch.undo()


def test_rpn_only_writes_detectron_proposals_and_their_recall(rpn_run, tiny_catalog):
    dataset_catalog.register_catalog_file(str(tiny_catalog))
    content = _load(os.path.join(rpn_run['dir'], 'rpn_proposals.pkl'))
    assert sorted(content) == ['boxes', 'cfg', 'ids', 'scores']
    dataset_ids = sorted(JsonDataset('tiny_val').get_image_ids())
    assert content['ids'] == dataset_ids
    assert all(b.shape[1] == 4 and len(b) == len(s) and len(b) <= 50 for b, s in zip(content['boxes'], content['scores']))
    assert all(np.all(np.diff(s) <= 0) for s in content['scores'])  # by descending score
    recall = rpn_run['results']['tiny_val']['box_proposal']
    assert list(recall) == ['AR@100', 'ARs@100', 'ARm@100', 'ARl@100', 'AR@1000', 'ARs@1000', 'ARm@1000', 'ARl@1000']
    dataset = JsonDataset('tiny_val')
    assert recall['AR@100'] == pytest.approx(detectron_proposal_ar(dataset, content, 100, (0, 1e10)), abs=1e-12)
    assert recall['ARs@1000'] == pytest.approx(detectron_proposal_ar(dataset, content, 1000, (0, 32 ** 2)), abs=1e-12)
    assert 0 < recall['AR@100'] < 1
    written = _load(os.path.join(rpn_run['dir'], 'rpn_proposal_recall.pkl'))['tiny_val']['box_proposal']
    np.testing.assert_equal(list(written.items()), list(recall.items()))  # nan (no gt of that area) included


def test_rpn_only_range_and_two_processes_merge_as_one(rpn_run, tiny_catalog, tmp_path, one_thread_per_process):
    whole = _load(os.path.join(rpn_run['dir'], 'rpn_proposals.pkl'))
    use_tiny_config(tiny_catalog, tmp_path / 'range', *RPN_ONLY)
    model_type = model_builder.build_model_type(cfg)
    test_engine.run_inference(model_type, rpn_run['final'], ind_range=(2, 5))
    sliced = _load(os.path.join(str(tmp_path), 'range', 'test', 'tiny_val', 'generalized_rcnn',
                                'rpn_proposals_range_2_5.pkl'))
    assert sliced['ids'] == whole['ids'][2:5]
    for a, b in zip(sliced['boxes'], whole['boxes'][2:5]):
        np.testing.assert_allclose(a, b, atol=1e-4)
    use_tiny_config(tiny_catalog, tmp_path / 'two', *RPN_ONLY, 'NUM_GPUS', '2')
    test_engine.run_inference(model_builder.build_model_type(cfg), rpn_run['final'], multi_gpu_testing=True)
    merged = _load(os.path.join(str(tmp_path), 'two', 'test', 'tiny_val', 'generalized_rcnn', 'rpn_proposals.pkl'))
    assert merged['ids'] == whole['ids']
    for a, b in zip(merged['boxes'], whole['boxes']):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize('overrides', [
    [],
    MASK_OVERRIDES,
    ['PRED_STD', 'True', 'XYXY', 'True', 'STD_NMS', 'True', 'TEST.SOFT_NMS.ENABLED', 'True'],
], ids=['fast_rcnn', 'two_stage_mask_rcnn', 'kl_xyxy_variance_voting'])
def test_fast_rcnn_trains_and_tests_on_the_rpn_proposals(rpn_run, tiny_catalog, tmp_path, overrides):
    proposal_file = os.path.join(rpn_run['dir'], 'rpn_proposals.pkl')
    torch.manual_seed(0)
    use_tiny_config(tiny_catalog, tmp_path, *_fast_rcnn(proposal_file, 'TEST.SCORE_THRESH', '0.0', *overrides))
    final = train_engine.train_model()['final']
    model_type = model_builder.build_model_type(cfg)
    model = test_engine.load_test_model(model_type, final, torch.device('cpu'))
    assert model.rpn is None
    results = test_engine.run_inference(model_type, final)
    assert 'AP' in results['tiny_val']['box']
    if overrides == MASK_OVERRIDES:
        assert 'AP' in results['tiny_val']['mask']
    detections = _load(os.path.join(str(tmp_path), 'test', 'tiny_val', 'generalized_rcnn', 'detections.pkl'))
    # Every detection is a decoded proposal: with a threshold of 0 each image gets some.
    assert all(sum(len(detections['all_boxes'][j][i]) for j in (1, 2)) > 0 for i in range(8))
