"""Detectron .pkl files of the C4 models (e2e_mask_rcnn_R-50-C4) load by blob name: the res5 RoI head takes
`res5_*`, the single-scale RPN `conv_rpn_*` (no `_fpn2`), the v0upshare head `conv5_mask` / `mask_fcn_logits`."""
import os
import runpy

import numpy as np
import pytest
import torch

from detectron.checkpoint.c2_weights import load_detectron_weights, load_weights, state_dict_to_detectron_blobs
from detectron.modeling import FPN
from detectron.utils.io import save_object
from tests.support.detectron_pkl import model_of_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDTH = 4  # RESNETS.WIDTH_PER_GROUP: narrow bottlenecks, the same layers and names
NUM_CLASSES, DIM_REDUCED, ANCHORS = 4, 8, 15


def _affine(prefix, dim):
    return {prefix + '_bn_s': (dim,), prefix + '_bn_b': (dim,)}


def _stage(stage, blocks, dim_in):
    """Detectron's add_stage blob names and shapes (bottleneck_transformation, basic_bn_shortcut)."""
    dim_out, inner = 256 * 2 ** (stage - 2), WIDTH * 2 ** (stage - 2)
    shapes = {}
    for block in range(blocks):
        prefix = f'res{stage}_{block}'
        shapes.update({prefix + '_branch2a_w': (inner, dim_in if block == 0 else dim_out, 1, 1),
                       prefix + '_branch2b_w': (inner, inner, 3, 3), prefix + '_branch2c_w': (dim_out, inner, 1, 1)})
        for branch, dim in (('branch2a', inner), ('branch2b', inner), ('branch2c', dim_out)):
            shapes.update(_affine(f'{prefix}_{branch}', dim))
        if block == 0:
            shapes[prefix + '_branch1_w'] = (dim_out, dim_in, 1, 1)
            shapes.update(_affine(prefix + '_branch1', dim_out))
    return shapes


def imagenet_r50_shapes():
    """R-50.pkl's parameter blobs (conv1 .. res5), as add_ResNet50_conv5_body names them."""
    shapes = {'conv1_w': (64, 3, 7, 7), **_affine('res_conv1', 64)}
    for stage, blocks, dim_in in ((2, 3, 64), (3, 4, 256), (4, 6, 512), (5, 3, 1024)):
        shapes.update(_stage(stage, blocks, dim_in))
    return shapes


def c4_mask_rcnn_shapes():
    """e2e_mask_rcnn_R-50-C4's blobs: the body, res5 in the RoI head, the single-scale RPN and the outputs."""
    return {**imagenet_r50_shapes(),
            'conv_rpn_w': (1024, 1024, 3, 3), 'conv_rpn_b': (1024,), 'rpn_cls_logits_w': (ANCHORS, 1024, 1, 1),
            'rpn_cls_logits_b': (ANCHORS,), 'rpn_bbox_pred_w': (4 * ANCHORS, 1024, 1, 1),
            'rpn_bbox_pred_b': (4 * ANCHORS,), 'cls_score_w': (NUM_CLASSES, 2048), 'cls_score_b': (NUM_CLASSES,),
            'bbox_pred_w': (4 * NUM_CLASSES, 2048), 'bbox_pred_b': (4 * NUM_CLASSES,),
            'conv5_mask_w': (2048, DIM_REDUCED, 2, 2), 'conv5_mask_b': (DIM_REDUCED,),
            'mask_fcn_logits_w': (NUM_CLASSES, DIM_REDUCED, 1, 1), 'mask_fcn_logits_b': (NUM_CLASSES,)}


@pytest.fixture(scope='module')
def c4_mask_model():
    return model_of_config(os.path.join('12_2017_baselines', 'e2e_mask_rcnn_R-50-C4_1x.yaml'),
                           ['RESNETS.WIDTH_PER_GROUP', str(WIDTH), 'MODEL.NUM_CLASSES', str(NUM_CLASSES),
                            'MRCNN.DIM_REDUCED', str(DIM_REDUCED), 'NUM_GPUS', '1'])


# Our key of some blobs, by hand.
HAND_MAPPED = {
    'res5_0_branch1_w': 'box_head.res5.0.branch1.weight', 'res5_2_branch2c_bn_s': 'box_head.res5.2.branch2c_bn.weight',
    'res4_5_branch2b_w': 'conv_body.body.res4.5.branch2b.weight', 'res_conv1_bn_b': 'conv_body.body.res_conv1_bn.bias',
    'conv_rpn_w': 'rpn.conv_rpn.weight', 'rpn_bbox_pred_b': 'rpn.rpn_bbox_pred.bias',
    'cls_score_w': 'box_outs.cls_score.weight', 'conv5_mask_w': 'mask_head.conv5_mask.weight',
    'mask_fcn_logits_b': 'mask_head.mask_fcn_logits.bias',
}


def _random(shapes, seed=0):
    rng = np.random.RandomState(seed)
    return {name: rng.randn(*shape).astype(np.float32) for name, shape in shapes.items()}


def test_detectron_c4_mask_rcnn_pkl_loads_every_tensor_into_its_parameter(c4_mask_model, tmp_path):
    blobs = _random(c4_mask_rcnn_shapes())
    path = str(tmp_path / 'model_final.pkl')
    save_object({'blobs': dict(blobs, **{n + '_momentum': v for n, v in blobs.items()})}, path)
    assert load_weights(c4_mask_model, path) == ([], [])
    state = c4_mask_model.state_dict()
    assert len(state) == len(blobs)
    for name, key in HAND_MAPPED.items():
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), name
    by_bytes = {v.tobytes(): n for n, v in blobs.items()}
    assert sorted(by_bytes[v.numpy().tobytes()] for v in state.values()) == sorted(blobs)


def test_imagenet_r50_initialises_the_c4_body_and_its_res5_head(c4_mask_model):
    # As Detectron: R-50.pkl's res5 blobs are the RoI head's; only the RPN and the outputs keep their init.
    blobs = _random(imagenet_r50_shapes(), seed=1)
    blobs.update(fc1000_w=np.zeros((1000, 2048), np.float32), fc1000_b=np.zeros(1000, np.float32),
                 conv1_b=np.zeros(64, np.float32))
    missing, unused = load_detectron_weights(c4_mask_model, blobs)
    assert unused == []
    assert sorted(missing) == sorted(
        '{}.{}.{}'.format(module, layer, p) for module, layers in (
            ('rpn', ('conv_rpn', 'rpn_cls_logits', 'rpn_bbox_pred')), ('box_outs', ('cls_score', 'bbox_pred')),
            ('mask_head', ('conv5_mask', 'mask_fcn_logits'))) for layer in layers for p in ('weight', 'bias'))
    assert torch.equal(c4_mask_model.box_head.res5[1].branch2b.weight, torch.from_numpy(blobs['res5_1_branch2b_w']))


def test_a_c4_model_saves_detectrons_names(c4_mask_model):
    assert set(state_dict_to_detectron_blobs(c4_mask_model.state_dict())) == set(c4_mask_rcnn_shapes())


def test_missing_and_unused_c4_blobs_are_reported(c4_mask_model):
    blobs = _random(c4_mask_rcnn_shapes(), seed=2)
    blobs['conv_rpn_fpn2_w'] = blobs.pop('conv_rpn_w')  # an FPN RPN's blob does not fit the single-scale RPN
    missing, unused = load_detectron_weights(c4_mask_model, blobs)
    assert (missing, unused) == (['rpn.conv_rpn.weight'], ['conv_rpn_fpn2_w'])


def test_x152_fpn_names_follow_its_block_counts():
    # Detectron names FPN's convs after each stage's last block: res3_7_sum and res4_35_sum in R-152.
    body = FPN.add_fpn_ResNet152_conv5_body(num_groups=32, width_per_group=1, stride_1x1=False, fpn_dim=8)
    names = set(state_dict_to_detectron_blobs({'conv_body.' + k: v for k, v in body.state_dict().items()}))
    assert {'fpn_inner_res3_7_sum_lateral_w', 'fpn_inner_res4_35_sum_lateral_b', 'fpn_res4_35_sum_w',
            'fpn_inner_res5_2_sum_w', 'res4_35_branch2b_w', 'res3_7_branch2c_bn_s'} <= names
    assert not any(n.startswith('res5_3') or n.startswith('res4_36') for n in names)


def test_a_converted_c4_pkl_loads_by_key(c4_mask_model, tmp_path, capsys):
    # tools/convert_pkl_to_pth: a C4 model's file (box outputs, no fpn_* blob) puts res5 in the RoI head.
    blobs = _random(c4_mask_rcnn_shapes(), seed=3)
    pkl, pth = str(tmp_path / 'c4.pkl'), str(tmp_path / 'c4.pth')
    save_object({'blobs': blobs}, pkl)
    runpy.run_path(os.path.join(REPO, 'tools', 'convert_pkl_to_pth.py'), run_name='convert')['main']([pkl, pth])
    assert 'not converted (0, no counterpart in the port): none' in capsys.readouterr().out
    assert load_weights(c4_mask_model, pth) == ([], [])
    assert torch.equal(c4_mask_model.box_head.res5[2].branch2a.weight, torch.from_numpy(blobs['res5_2_branch2a_w']))
    assert torch.equal(c4_mask_model.rpn.conv_rpn.bias, torch.from_numpy(blobs['conv_rpn_b']))
