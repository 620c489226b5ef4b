"""A Detectron RetinaNet .pkl (12_2017_baselines/retinanet_R-50-FPN_1x) loads by blob name, every tensor into its
parameter."""
import os

import numpy as np
import pytest
import torch

from detectron.checkpoint.c2_weights import load_detectron_weights, load_weights, state_dict_to_detectron_blobs
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.modeling import model_builder
from detectron.utils.io import save_object

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = {2: 3, 3: 4, 4: 6, 5: 3}


def _affine(prefix):
    return [prefix + '_bn_s', prefix + '_bn_b']


def detectron_retinanet_names():
    """Detectron's blob names of retinanet_R-50-FPN_1x, written out from its ResNet.py, FPN.py (levels 3..7: no P2
    lateral, fpn_6 / fpn_7 with EXTRA_CONV_LEVELS) and retinanet_heads.py (towers and predictors on fpn3)."""
    names = ['conv1_w'] + _affine('res_conv1')
    for stage, blocks in BLOCKS.items():
        for block in range(blocks):
            for branch in ('branch2a', 'branch2b', 'branch2c') + (('branch1',) if block == 0 else ()):
                prefix = f'res{stage}_{block}_{branch}'
                names += [prefix + '_w'] + _affine(prefix)
    for stage in range(3, 6):
        last = f'res{stage}_{BLOCKS[stage] - 1}_sum'
        inner = f'fpn_inner_{last}' + ('' if stage == 5 else '_lateral')
        names += [inner + '_w', inner + '_b', f'fpn_{last}_w', f'fpn_{last}_b']
    names += ['fpn_6_w', 'fpn_6_b', 'fpn_7_w', 'fpn_7_b']
    for tower in ('cls', 'bbox'):
        for i in range(4):
            names += [f'retnet_{tower}_conv_n{i}_fpn3_w', f'retnet_{tower}_conv_n{i}_fpn3_b']
        names += [f'retnet_{tower}_pred_fpn3_w', f'retnet_{tower}_pred_fpn3_b']
    return names


HAND_MAPPED = {
    'fpn_6_w': 'conv_body.fpn_extra.0.weight', 'fpn_7_b': 'conv_body.fpn_extra.1.bias',
    'fpn_inner_res3_3_sum_lateral_w': 'conv_body.fpn_inner.1.weight', 'fpn_res5_2_sum_b': 'conv_body.fpn_layer.3.bias',
    'retnet_cls_conv_n0_fpn3_w': 'head.cls_tower.0.weight', 'retnet_bbox_conv_n3_fpn3_b': 'head.bbox_tower.3.bias',
    'retnet_cls_pred_fpn3_b': 'head.cls_pred.bias', 'retnet_bbox_pred_fpn3_w': 'head.bbox_pred.weight',
    'res4_5_branch2c_bn_s': 'conv_body.body.res4.5.branch2c_bn.weight',
}


@pytest.fixture(scope='module')
def retinanet_model():
    merge_cfg_from_file(os.path.join(REPO, 'configs', '12_2017_baselines', 'retinanet_R-50-FPN_1x.yaml'))
    # Narrow widths (same layers and names) keep the files small.
    merge_cfg_from_list(['RESNETS.WIDTH_PER_GROUP', '16', 'FPN.DIM', '32', 'MODEL.NUM_CLASSES', '5'])
    assert_and_infer_cfg()
    model = model_builder.create(cfg)
    cfg.defrost()
    return model


def _random_blobs(model):
    rng = np.random.RandomState(0)
    shapes = {name: tuple(v.shape) for name, v in state_dict_to_detectron_blobs(model.state_dict()).items()}
    return {name: rng.randn(*shapes[name]).astype(np.float32) for name in detectron_retinanet_names()}


def test_detectron_retinanet_pkl_loads_every_tensor_into_its_parameter(retinanet_model, tmp_path):
    blobs = _random_blobs(retinanet_model)
    path = str(tmp_path / 'model_final.pkl')
    save_object({'blobs': dict(blobs, **{n + '_momentum': v for n, v in blobs.items()})}, path)
    missing, unused = load_weights(retinanet_model, path)
    assert (missing, unused) == ([], [])
    state = retinanet_model.state_dict()
    assert len(state) == len(blobs)
    for name, key in HAND_MAPPED.items():
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), name
    by_bytes = {v.tobytes(): n for n, v in blobs.items()}
    assert sorted(by_bytes[v.numpy().tobytes()] for v in state.values()) == sorted(blobs)


def test_missing_and_unused_retinanet_blobs_are_reported(retinanet_model):
    blobs = _random_blobs(retinanet_model)
    del blobs['retnet_bbox_conv_n2_fpn3_w']
    blobs['retnet_cls_conv_n0_fpn4_w'] = np.zeros(3, np.float32)  # Detectron shares fpn3's: never a blob of its own
    missing, unused = load_detectron_weights(retinanet_model, blobs)
    assert (missing, unused) == (['head.bbox_tower.2.weight'], ['retnet_cls_conv_n0_fpn4_w'])
