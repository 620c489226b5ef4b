"""Weights files that do not fit the model, through the engines: a file of the other model type (or
Detectron's ImageNet blobs given to CenterNet) fills none of the model and is refused for training and
testing, naming the file and what it holds; testing with a head the file does not fill (sigma-less
variance voting, CenterNet's heatmap head of another class count) is refused; CenterNet's own format
and this port's .pth of another class count both load for training with the same tensors skipped."""
import logging
import os
import subprocess
import sys

import pytest
import torch
from support.tiny_runs import REPO, SHAPES_CFG, TINY_OVERRIDES, use_centernet, use_tiny_config, write_tiny_datasets

from detectron.checkpoint.c2_weights import state_dict_to_detectron_blobs
from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.utils.errors import WeightsError
from detectron.utils.io import save_object

CPU = torch.device('cpu')


# The engines register DATASET_CATALOG in this process: keep that out of other tests.
pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def catalog(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('fit'))


@pytest.fixture
def weights(catalog, restore_global_cfg):
    """{'rcnn': an R-CNN .pth, 'r50_pkl': its ResNet body as Detectron-named ImageNet blobs, 'centernet': a
    CenterNet .pth (2 classes), 'centernet3' / 'centernet3_ours': a 3-class CenterNet in CenterNet's
    format and in this port's} (paths, written once)."""
    root = catalog.parent
    paths = {name: str(root / file) for name, file in (
        ('rcnn', 'rcnn.pth'), ('r50_pkl', 'R-18.pkl'), ('centernet', 'centernet.pth'),
        ('centernet3', 'ctdet_3.pth'), ('centernet3_ours', 'ours_3.pth'))}
    if os.path.exists(paths['centernet3_ours']):
        return paths
    torch.manual_seed(0)
    use_tiny_config(catalog, root / 'unused')
    rcnn = model_builder.create(cfg).state_dict()
    torch.save({'model': rcnn}, paths['rcnn'])
    body = {k: v for k, v in rcnn.items() if k.startswith('conv_body.body.')}
    save_object({'blobs': state_dict_to_detectron_blobs(body)}, paths['r50_pkl'])
    restore_global_cfg()
    use_centernet(catalog, root / 'unused')
    torch.save({'model': model_builder.create(cfg).state_dict()}, paths['centernet'])
    restore_global_cfg()
    use_centernet(catalog, root / 'unused', 'CENTERNET.NUM_CLASSES', '3')
    three = model_builder.create(cfg).state_dict()
    torch.save({'epoch': 70, 'state_dict': {'module.' + k.split('.', 1)[1]: v for k, v in three.items()}},
               paths['centernet3'])
    torch.save({'model': three}, paths['centernet3_ours'])
    restore_global_cfg()
    return paths


def _use(model, catalog, output_dir, *overrides):
    (use_tiny_config if model == 'rcnn' else use_centernet)(catalog, output_dir, *overrides)


@pytest.mark.parametrize('model, file, total, holds', [
    ('centernet', 'rcnn', 127, 'an R-CNN model of this port (MODEL.TYPE generalized_rcnn)'),
    ('centernet', 'r50_pkl', 127, "Detectron's ImageNet ResNet blobs (such as R-50.pkl), for MODEL.TYPE "
                                  'generalized_rcnn'),
    ('rcnn', 'centernet', 98, 'a CenterNet model of this port (MODEL.TYPE centernet)'),
])
@pytest.mark.parametrize('testing', [True, False])
def test_weights_of_the_other_model_type_are_refused(catalog, weights, tmp_path, model, file, total, holds,
                                                     testing):
    _use(model, catalog, tmp_path, 'TRAIN.AUTO_RESUME', 'False', 'TRAIN.WEIGHTS', weights[file])
    with pytest.raises(WeightsError) as err:
        if testing:
            test_engine.load_test_model(model_builder.build_model_type(cfg), weights[file], CPU)
        else:
            model_type = model_builder.build_model_type(cfg)
            net = model_builder.create(cfg)
            train_engine._resume_or_initialise(model_type, net, torch.optim.SGD(net.parameters(), 0.1), str(tmp_path))
    setting = 'TEST.WEIGHTS' if testing else 'TRAIN.WEIGHTS'
    assert str(err.value) == (
        '{} fills 0 of the {} tensors of the {} model: it holds {}; set {} to weights of this model (or an '
        'ImageNet file of its backbone), or MODEL.TYPE to the model the file holds'.format(
            weights[file], total, cfg.MODEL.TYPE, holds, setting))


@pytest.mark.processes
def test_test_net_with_the_other_model_type_s_weights_is_one_error_line(catalog, weights, tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, 'tools', 'test_net.py'), '--cfg', SHAPES_CFG] + TINY_OVERRIDES +
        ['DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(tmp_path), 'TEST.WEIGHTS', weights['centernet']],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith('error: {} fills 0 of the 98 tensors'.format(
        weights['centernet']))
    assert 'Traceback' not in out.stderr


def test_variance_voting_with_weights_without_predicted_sigmas_is_refused(catalog, weights, tmp_path):
    _use('rcnn', catalog, tmp_path, 'PRED_STD', 'True', 'STD_NMS', 'True')
    with pytest.raises(WeightsError) as err:
        test_engine.load_test_model(model_builder.build_model_type(cfg), weights['rcnn'], CPU)
    assert str(err.value) == (
        '{} does not fill 2 of the 100 tensors of the generalized_rcnn model (box_outs.bbox_pred_std.weight, '
        'box_outs.bbox_pred_std.bias): testing would use their random initial values; test with weights trained '
        'with this config (the heads, PRED_STD and the class count as in training)'.format(weights['rcnn']))


def test_centernet_testing_with_another_class_count_is_refused(catalog, weights, tmp_path):
    _use('centernet', catalog, tmp_path)
    for file in ('centernet3', 'centernet3_ours'):
        with pytest.raises(WeightsError) as err:
            test_engine.load_test_model(model_builder.build_model_type(cfg), weights[file], CPU)
        assert str(err.value).startswith('{} does not fill 2 of the 127 tensors of the centernet model '
                                         '(heads.hm.2.weight, heads.hm.2.bias)'.format(weights[file]))


def test_both_centernet_formats_of_another_class_count_fine_tune_alike(catalog, weights, tmp_path, caplog):
    _use('centernet', catalog, tmp_path)
    model_type = model_builder.build_model_type(cfg)
    results = {}
    for file in ('centernet3', 'centernet3_ours'):
        torch.manual_seed(1)
        net = model_builder.create(cfg)
        init = net.heads.hm[2].weight.clone()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            missing, _, _ = model_type.load_training_weights(net, weights[file])
        assert missing == ['heads.hm.2.weight', 'heads.hm.2.bias']
        assert torch.equal(net.heads.hm[2].weight, init)  # skipped: keeps its init
        assert any('a different number of classes (3 in the file, 2 in the model)' in r.getMessage()
                   for r in caplog.records)
        results[file] = net.state_dict()
    for key, value in results['centernet3'].items():
        assert torch.equal(value, results['centernet3_ours'][key]), key
