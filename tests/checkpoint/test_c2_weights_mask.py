"""Detectron .pkl files of GroupNorm Mask R-CNN models (04_2018_gn_baselines) load bit-exact by blob name."""
import os
import runpy

import numpy as np
import pytest
import torch

from detectron.checkpoint.c2_weights import load_detectron_weights, state_dict_to_detectron_blobs
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.modeling import model_builder
from detectron.utils.io import save_object

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, 'tools', 'convert_pkl_to_pth.py')
BLOCKS = {2: 3, 3: 4, 4: 6, 5: 3}


def _gn(prefix):
    return [prefix + '_gn_s', prefix + '_gn_b']


def detectron_gn_mask_rcnn_names():
    """Detectron's blob names of e2e_mask_rcnn_R-50-FPN_2x_gn, written out from its ConvGN / FPN / heads
    code (ResNet.py, FPN.py, rpn_heads.py, fast_rcnn_heads.py, mask_rcnn_heads.py)."""
    names = ['conv1_w'] + _gn('conv1')
    for stage, blocks in BLOCKS.items():
        for block in range(blocks):
            for branch in ('branch2a', 'branch2b', 'branch2c') + (('branch1',) if block == 0 else ()):
                prefix = f'res{stage}_{block}_{branch}'
                names += [prefix + '_w'] + _gn(prefix)
    for stage in range(2, 6):
        last = f'res{stage}_{BLOCKS[stage] - 1}_sum'
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
    merge_cfg_from_file(os.path.join(REPO, 'configs', '04_2018_gn_baselines', 'e2e_mask_rcnn_R-50-FPN_2x_gn.yaml'))
    # Narrow widths (same layers and names) keep the files small.
    merge_cfg_from_list(['RESNETS.WIDTH_PER_GROUP', '16', 'GROUP_NORM.NUM_GROUPS', '8', 'FPN.DIM', '32',
                         'MRCNN.DIM_REDUCED', '32', 'FAST_RCNN.CONV_HEAD_DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64'])
    assert_and_infer_cfg()
    model = model_builder.create(cfg)
    cfg.defrost()
    return model


def _random_blobs(model):
    """Detectron's names with random values of each parameter's shape, matched by order of creation."""
    rng = np.random.RandomState(0)
    shapes = {name: tuple(v.shape) for name, v in state_dict_to_detectron_blobs(model.state_dict(), 'gn').items()}
    return {name: rng.randn(*shapes[name]).astype(np.float32) for name in detectron_gn_mask_rcnn_names()}


def test_detectron_gn_mask_rcnn_pkl_loads_every_tensor_into_its_parameter(gn_mask_model, tmp_path):
    blobs = _random_blobs(gn_mask_model)
    path = str(tmp_path / 'model_final.pkl')
    save_object({'blobs': dict(blobs, **{n + '_momentum': v for n, v in blobs.items()})}, path)
    missing, unused = load_detectron_weights(gn_mask_model, path)
    assert (missing, unused) == ([], [])
    state = gn_mask_model.state_dict()
    params = {k: v for k, v in state.items() if 'running_' not in k and 'num_batches' not in k}
    assert len(params) == len(blobs)
    for name, key in HAND_MAPPED.items():
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), name
    # Every parameter holds exactly one blob's values, bit for bit.
    by_bytes = {v.tobytes(): n for n, v in blobs.items()}
    assert sorted(by_bytes[v.numpy().tobytes()] for v in params.values()) == sorted(blobs)


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
