"""Detectron .pkl files of GroupNorm Mask R-CNN models (04_2018_gn_baselines) load bit-exact by blob name."""
import os
import runpy

import numpy as np
import pytest
import torch

from detectron.checkpoint.c2_weights import load_detectron_weights
from detectron.utils.io import save_object
from tests.support.detectron_pkl import (R50_BLOCKS, check_pkl_fills_every_parameter, model_of_config, r50_body_names,
                                         random_blobs)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, 'tools', 'convert_pkl_to_pth.py')


def _gn(prefix):
    return [prefix + '_gn_s', prefix + '_gn_b']


def detectron_gn_mask_rcnn_names():
    """Detectron's blob names of e2e_mask_rcnn_R-50-FPN_2x_gn, written out from its ConvGN / FPN / heads
    code (ResNet.py, FPN.py, rpn_heads.py, fast_rcnn_heads.py, mask_rcnn_heads.py)."""
    names = r50_body_names(_gn) + _gn('conv1')
    for stage in range(2, 6):
        last = f'res{stage}_{R50_BLOCKS[stage] - 1}_sum'
        inner = f'fpn_inner_{last}' + ('' if stage == 5 else '_lateral')
        names += [inner + '_w'] + _gn(inner) + [f'fpn_{last}_w'] + _gn(f'fpn_{last}')
    for name in ('conv_rpn', 'rpn_cls_logits', 'rpn_bbox_pred'):
        names += [f'{name}_fpn2_w', f'{name}_fpn2_b']
    for i in range(1, 5):
        names += [f'head_conv{i}_w'] + _gn(f'head_conv{i}')
    names += ['fc6_w', 'fc6_b', 'cls_score_w', 'cls_score_b', 'bbox_pred_w', 'bbox_pred_b']
    for i in range(1, 5):
        names += [f'_mask_fcn{i}_w'] + _gn(f'_mask_fcn{i}')
    return names + ['conv5_mask_w', 'conv5_mask_b', 'mask_fcn_logits_w', 'mask_fcn_logits_b']


# Our key of some blobs, by hand, to check that each lands where it should (besides all being used).
HAND_MAPPED = {
    '_mask_fcn3_w': 'mask_head.fcn3.weight', '_mask_fcn3_gn_s': 'mask_head.fcn3_gn.weight',
    '_mask_fcn1_gn_b': 'mask_head.fcn1_gn.bias', 'conv5_mask_w': 'mask_head.conv5_mask.weight',
    'mask_fcn_logits_b': 'mask_head.mask_fcn_logits.bias', 'head_conv2_w': 'box_head.head_conv2.weight',
    'head_conv4_gn_s': 'box_head.head_conv4_gn.weight', 'fc6_w': 'box_head.fc6.weight',
    'conv1_gn_s': 'conv_body.body.res_conv1_bn.weight', 'res4_5_branch2c_gn_b': 'conv_body.body.res4.5.branch2c_bn.bias',
    'fpn_inner_res5_2_sum_gn_s': 'conv_body.fpn_inner_gn.3.weight',
}


@pytest.fixture(scope='module')
def gn_mask_model():
    return model_of_config(os.path.join('04_2018_gn_baselines', 'e2e_mask_rcnn_R-50-FPN_2x_gn.yaml'),
                           ['RESNETS.WIDTH_PER_GROUP', '16', 'GROUP_NORM.NUM_GROUPS', '8', 'FPN.DIM', '32',
                            'MRCNN.DIM_REDUCED', '32', 'FAST_RCNN.CONV_HEAD_DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64'])


def _random_blobs(model):
    return random_blobs(model, detectron_gn_mask_rcnn_names(), 'gn')


def test_detectron_gn_mask_rcnn_pkl_loads_every_tensor_into_its_parameter(gn_mask_model, tmp_path):
    check_pkl_fills_every_parameter(gn_mask_model, _random_blobs(gn_mask_model), str(tmp_path / 'model_final.pkl'),
                                    HAND_MAPPED)


def test_missing_and_unused_mask_blobs_are_reported(gn_mask_model, tmp_path):
    blobs = _random_blobs(gn_mask_model)
    del blobs['_mask_fcn2_gn_s']
    blobs['_[mask]_fcn9_w'] = np.zeros(3, np.float32)
    missing, unused = load_detectron_weights(gn_mask_model, blobs)
    assert (missing, unused) == (['mask_head.fcn2_gn.weight'], ['_[mask]_fcn9_w'])


def test_convert_tool_covers_mask_and_gn_head_blobs(gn_mask_model, tmp_path, capsys):
    blobs = _random_blobs(gn_mask_model)
    pkl, pth = str(tmp_path / 'm.pkl'), str(tmp_path / 'm.pth')
    save_object({'blobs': blobs}, pkl)
    runpy.run_path(TOOL, run_name='convert')['main']([pkl, pth])
    assert 'not converted (0, no counterpart in the port): none' in capsys.readouterr().out
    converted = torch.load(pth)['model']
    assert torch.equal(converted['mask_head.fcn4_gn.bias'], torch.from_numpy(blobs['_mask_fcn4_gn_b']))
    assert torch.equal(converted['box_head.head_conv1.weight'], torch.from_numpy(blobs['head_conv1_w']))


def test_non_gn_mask_head_reads_detectrons_bracketed_names():
    from detectron.modeling.mask_rcnn_heads import MaskRCNNHead

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mask_head = MaskRCNNHead(8, num_outputs=3, dim_reduced=8)

    model = Holder()
    rng = np.random.RandomState(1)
    blobs = {f'_[mask]_fcn{i}_{p}': rng.randn(*((8, 8, 3, 3) if p == 'w' else (8,))).astype(np.float32)
             for i in range(1, 5) for p in 'wb'}
    blobs.update(conv5_mask_w=rng.randn(8, 8, 2, 2).astype(np.float32), conv5_mask_b=np.zeros(8, np.float32),
                 mask_fcn_logits_w=rng.randn(3, 8, 1, 1).astype(np.float32), mask_fcn_logits_b=np.ones(3, np.float32))
    assert load_detectron_weights(model, blobs) == ([], [])
    assert torch.equal(model.mask_head.fcn2.bias, torch.from_numpy(blobs['_[mask]_fcn2_b']))
    assert torch.equal(model.mask_head.conv5_mask.weight, torch.from_numpy(blobs['conv5_mask_w']))
