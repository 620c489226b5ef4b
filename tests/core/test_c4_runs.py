"""Detectron's shipped C4 configs (Faster and Mask R-CNN), shrunk, train and test through the unchanged engines on
the tiny drawn-shapes datasets (CPU)."""
import os

import pytest

from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from support.tiny_runs import REPO, TINY_OVERRIDES, json_stats

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

# A narrow R-50-C4 (RESNETS.WIDTH_PER_GROUP), few RoIs, two iterations, no ImageNet weights.
C4_SMALL = ['RESNETS.WIDTH_PER_GROUP', '4', 'TRAIN.BATCH_SIZE_PER_IM', '8', 'MRCNN.DIM_REDUCED', '8',
            'TRAIN.WEIGHTS', '', 'NUM_GPUS', '1', 'SOLVER.MAX_ITER', '2', 'TEST.RPN_PRE_NMS_TOP_N', '100',
            'TEST.RPN_POST_NMS_TOP_N', '20', 'TEST.DATASETS', "('tiny_val_small',)"]


@pytest.mark.slow
@pytest.mark.parametrize('config, losses, evaluations', [
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', {'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox'}, {'box'}),
    ('e2e_mask_rcnn_R-50-C4_1x.yaml', {'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'loss_mask'},
     {'box', 'mask'}),
])
def test_c4_configs_train_and_test_through_the_engines(config, losses, evaluations, tiny_catalog, tmp_path, capsys):
    cfg.defrost()
    finalize_cfg(os.path.join(REPO, 'configs', '12_2017_baselines', config),
                 TINY_OVERRIDES + C4_SMALL + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(tmp_path)],
                 training=True)
    weights = train_engine.train_model()['final']
    _, stats = json_stats(capsys.readouterr().out)
    assert stats and losses <= set(stats[-1]) and not any(k.startswith('loss_rpn_cls_fpn') for k in stats[-1])
    results = test_engine.run_inference(model_builder.build_model_type(cfg), weights)
    assert set(results['tiny_val_small']) == evaluations
