"""A Detectron RetinaNet .pkl (12_2017_baselines/retinanet_R-50-FPN_1x) loads by blob name, every tensor into its
parameter."""
import os

import numpy as np
import pytest

from detectron.checkpoint.c2_weights import load_detectron_weights
from detectron.utils.errors import WeightsError
from tests.support.detectron_pkl import (R50_BLOCKS, check_pkl_fills_every_parameter, model_of_config, r50_body_names,
                                         random_blobs)


def detectron_retinanet_names():
    """Detectron's blob names of retinanet_R-50-FPN_1x, written out from its ResNet.py, FPN.py (levels 3..7: no P2
    lateral, fpn_6 / fpn_7 with EXTRA_CONV_LEVELS) and retinanet_heads.py (towers and predictors on fpn3)."""
    names = r50_body_names(lambda prefix: [prefix + '_bn_s', prefix + '_bn_b'])
    names += ['res_conv1_bn_s', 'res_conv1_bn_b']
    for stage in range(3, 6):
        last = f'res{stage}_{R50_BLOCKS[stage] - 1}_sum'
        inner = f'fpn_inner_{last}' + ('' if stage == 5 else '_lateral')
        names += [inner + '_w', inner + '_b', f'fpn_{last}_w', f'fpn_{last}_b']
    names += ['fpn_6_w', 'fpn_6_b', 'fpn_7_w', 'fpn_7_b']
    for tower in ('cls', 'bbox'):
        for i in range(4):
            names += [f'retnet_{tower}_conv_n{i}_fpn3_w', f'retnet_{tower}_conv_n{i}_fpn3_b']
        names += [f'retnet_{tower}_pred_fpn3_w', f'retnet_{tower}_pred_fpn3_b']
    return names


@pytest.fixture(scope='module')
def retinanet_model():
    return model_of_config(os.path.join('12_2017_baselines', 'retinanet_R-50-FPN_1x.yaml'),
                           ['RESNETS.WIDTH_PER_GROUP', '16', 'FPN.DIM', '32', 'MODEL.NUM_CLASSES', '5'])


# Our key of some blobs, by hand (besides every blob landing somewhere).
HAND_MAPPED = {
    'fpn_6_w': 'conv_body.fpn_extra.0.weight', 'fpn_7_b': 'conv_body.fpn_extra.1.bias',
    'fpn_inner_res3_3_sum_lateral_w': 'conv_body.fpn_inner.1.weight', 'fpn_res5_2_sum_b': 'conv_body.fpn_layer.3.bias',
    'retnet_cls_conv_n0_fpn3_w': 'head.cls_tower.0.weight', 'retnet_bbox_conv_n3_fpn3_b': 'head.bbox_tower.3.bias',
    'retnet_cls_pred_fpn3_b': 'head.cls_pred.bias', 'retnet_bbox_pred_fpn3_w': 'head.bbox_pred.weight',
    'res4_5_branch2c_bn_s': 'conv_body.body.res4.5.branch2c_bn.weight',
}


def test_detectron_retinanet_pkl_loads_every_tensor_into_its_parameter(retinanet_model, tmp_path):
    blobs = random_blobs(retinanet_model, detectron_retinanet_names())
    check_pkl_fills_every_parameter(retinanet_model, blobs, str(tmp_path / 'model_final.pkl'), HAND_MAPPED)


def test_missing_and_unused_retinanet_blobs_are_reported(retinanet_model):
    blobs = random_blobs(retinanet_model, detectron_retinanet_names())
    del blobs['retnet_bbox_conv_n2_fpn3_w']
    blobs['retnet_cls_conv_n0_fpn4_w'] = np.zeros(3, np.float32)  # Detectron shares fpn3's: never a blob of its own
    missing, unused = load_detectron_weights(retinanet_model, blobs)
    assert (missing, unused) == (['head.bbox_tower.2.weight'], ['retnet_cls_conv_n0_fpn4_w'])


def test_a_softmax_retinanet_pkl_loads_with_its_background_logits(tmp_path):
    # RETINANET.SOFTMAX: retnet_cls_pred_fpn3 predicts NUM_CLASSES (background included) logits per anchor, 9 anchors.
    model = model_of_config(os.path.join('12_2017_baselines', 'retinanet_R-50-FPN_1x.yaml'),
                            ['RESNETS.WIDTH_PER_GROUP', '16', 'FPN.DIM', '32', 'MODEL.NUM_CLASSES', '5',
                             'RETINANET.SOFTMAX', 'True'])
    blobs = random_blobs(model, detectron_retinanet_names())
    assert blobs['retnet_cls_pred_fpn3_w'].shape == (9 * 5, 32, 3, 3) and blobs['retnet_cls_pred_fpn3_b'].shape == (45,)
    check_pkl_fills_every_parameter(model, blobs, str(tmp_path / 'model_final.pkl'), HAND_MAPPED)
    sigmoid_blobs = dict(blobs, retnet_cls_pred_fpn3_w=blobs['retnet_cls_pred_fpn3_w'][:36],
                         retnet_cls_pred_fpn3_b=blobs['retnet_cls_pred_fpn3_b'][:36])
    with pytest.raises(WeightsError, match='head.cls_pred.weight'):  # a sigmoid model's file does not fit
        load_detectron_weights(model, sigmoid_blobs)
