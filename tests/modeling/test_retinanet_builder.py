"""MODEL.TYPE retinanet through the unchanged engines: it trains, tests and is evaluated on the tiny datasets;
its settings are read or refused by name; Detectron's shipped retinanet configs build."""
import os
import pickle

import numpy as np
import pytest
import torch

from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from detectron.modeling.retinanet import RetinaNet
from detectron.modeling.retinanet_builder import RetinaNetType
from detectron.utils.errors import ConfigValueError
from tests.support.tiny_runs import REPO, RETINANET_CFG, json_stats, use_retinanet

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')
BASELINES = os.path.join(REPO, 'configs', '12_2017_baselines')


def test_retinanet_trains_and_tests_through_the_engines(tiny_catalog, tmp_path, capsys):
    use_retinanet(tiny_catalog, tmp_path, 'SOLVER.MAX_ITER', '4', 'TRAIN.SNAPSHOT_ITERS', '100')
    weights = train_engine.train_model()['final']
    _, stats = json_stats(capsys.readouterr().out)
    assert all(torch.isfinite(torch.tensor(float(s['loss']))) for s in stats)
    assert {'loss_fl_fpn3', 'loss_retnet_bbox_fpn7', 'retnet_fg_num'} <= set(stats[0])
    results = test_engine.run_inference(model_builder.build_model_type(cfg), weights)
    assert set(results['tiny_val']['box']) >= {'AP', 'AP50', 'AP75'}


def test_softmax_retinanet_trains_one_iteration_and_tests_through_the_engines(tiny_catalog, tmp_path, capsys):
    use_retinanet(tiny_catalog, tmp_path, 'RETINANET.SOFTMAX', 'True', 'SOLVER.MAX_ITER', '1')
    model_type = model_builder.build_model_type(cfg)
    assert model_builder.checked_model(model_type).head.cls_pred.out_channels == 9 * 3  # background + 2 classes
    weights = train_engine.train_model()['final']
    _, stats = json_stats(capsys.readouterr().out)
    assert len(stats) == 1 and float(stats[0]['loss']) > 0
    assert all(np.isfinite(float(stats[0]['loss_fl_fpn{}'.format(level)])) for level in range(3, 8))
    results = test_engine.run_inference(model_type, weights)
    assert set(results['tiny_val']['box']) >= {'AP', 'AP50', 'AP75'}


def test_sgd_steps_on_one_batch_lower_the_loss(tiny_catalog, tmp_path):
    use_retinanet(tiny_catalog, tmp_path)
    torch.manual_seed(0)
    model_type = model_builder.build_model_type(cfg)
    model = model_builder.checked_model(model_type).train()
    device = torch.device('cpu')
    roidb = model_type.training_roidb()
    dataset = model_type.training_dataset(roidb, device)
    batch = model_type.batch_to_device(device)(model_type.collate(device)([dataset[0, 0], dataset[0, 1]]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(6):
        out = model(*batch)
        loss = sum(v for k, v in out.items() if k.startswith('loss'))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize('name', sorted(f for f in os.listdir(BASELINES) if f.startswith('retinanet_')))
def test_detectrons_retinanet_configs_build(name):
    finalize_cfg(os.path.join(BASELINES, name), ['FPN.DIM', '16', 'RESNETS.WIDTH_PER_GROUP', '4'])
    assert (cfg.MODEL.TYPE, cfg.RETINANET.RETINANET_ON, cfg.FPN.RPN_MAX_LEVEL) == ('retinanet', True, 7)
    assert cfg.TRAIN.WEIGHTS.startswith('https://dl.fbaipublicfiles.com/detectron/ImageNetPretrained/')
    model_type = model_builder.build_model_type(cfg)
    assert isinstance(model_type, RetinaNetType)
    model = model_builder.checked_model(model_type)
    assert isinstance(model, RetinaNet) and model.conv_body.strides == (8, 16, 32, 64, 128)
    assert model.head.cls_pred.out_channels == 9 * 80


@pytest.mark.parametrize('overrides, message', [
    (['RETINANET.RETINANET_ON', 'False'], 'MODEL.TYPE retinanet needs RETINANET.RETINANET_ON True'),
    (['FPN.RPN_MAX_LEVEL', '6'], 'RetinaNet is built on FPN levels P3..P7'),
    (['FPN.EXTRA_CONV_LEVELS', 'False'], 'RetinaNet is built on FPN levels P3..P7'),
    (['MODEL.MASK_ON', 'True'], 'MODEL.MASK_ON True asks for a mask head'),
])
def test_settings_retinanet_does_not_build_are_one_error(overrides, message):
    with pytest.raises(ConfigValueError, match=message):  # finalize_cfg checks the model type's settings
        finalize_cfg(RETINANET_CFG, overrides)


def test_an_r_cnn_with_retinanet_on_is_one_error():
    with pytest.raises(ConfigValueError, match=r'RETINANET.RETINANET_ON True asks for RetinaNet \(MODEL.TYPE retinanet'):
        finalize_cfg(os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_R-18-FPN.yaml'),
                     ['RETINANET.RETINANET_ON', 'True'])


@pytest.mark.slow
@pytest.mark.processes
def test_two_gloo_workers_train_and_test_as_one_process(tiny_catalog, tmp_path, one_thread_per_process):
    use_retinanet(tiny_catalog, tmp_path / 'multi', 'NUM_GPUS', '2', 'TRAIN.IMS_PER_BATCH', '1', 'SOLVER.MAX_ITER',
                  '2')
    weights = train_engine.train_model()['final']
    final = torch.load(weights, weights_only=True)
    assert (final['iteration'], final['world_size']) == (1, 2)
    multi = test_engine.run_inference(model_builder.build_model_type(cfg), weights, multi_gpu_testing=True)
    use_retinanet(tiny_catalog, tmp_path / 'single')
    single = test_engine.run_inference(model_builder.build_model_type(cfg), weights)
    assert multi == single and set(single['tiny_val']['box']) >= {'AP', 'AP50'}
    detections = [os.path.join(tmp_path / run, 'test', 'tiny_val', 'retinanet', 'detections.pkl')
                  for run in ('multi', 'single')]
    with open(detections[0], 'rb') as f, open(detections[1], 'rb') as g:
        multi_boxes, single_boxes = pickle.load(f)['all_boxes'], pickle.load(g)['all_boxes']
    for multi_class, single_class in zip(multi_boxes[1:], single_boxes[1:]):
        for a, b in zip(multi_class, single_class):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
