"""Detectron .pkl files of Keypoint R-CNN models (12_2017_baselines/e2e_keypoint_rcnn_*) load by blob name."""
import os

import numpy as np
import pytest
import torch

from detectron.checkpoint.c2_weights import load_detectron_weights
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.modeling import model_builder
from detectron.modeling.keypoint_rcnn_heads import bilinear_kernel
from detectron.utils.io import save_object

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCKS = {2: 3, 3: 4, 4: 6, 5: 3}
WIDTH, FPN_DIM, HEAD_DIM, MLP_DIM, K = 4, 8, 8, 16, 17


def _conv(name, out, inp, k):
    return {name + '_w': (out, inp, k, k), name + '_b': (out,)}


def detectron_keypoint_rcnn_blobs():
    """Detectron's blob names and shapes of e2e_keypoint_rcnn_R-50-FPN_1x (narrowed: WIDTH_PER_GROUP 4, FPN.DIM 8,
    KRCNN.CONV_HEAD_DIM 8, FAST_RCNN.MLP_HEAD_DIM 16), written out from its ResNet.py / FPN.py / rpn_heads.py /
    fast_rcnn_heads.py / keypoint_rcnn_heads.py / detector.py code."""
    blobs = {'conv1_w': (64, 3, 7, 7), 'res_conv1_bn_s': (64,), 'res_conv1_bn_b': (64,)}
    dim_in = 64
    for stage, blocks in BLOCKS.items():
        # Detectron's stage outputs stay 256 x 2^(stage - 2); WIDTH_PER_GROUP narrows the bottlenecks only.
        inner, out = WIDTH * 2 ** (stage - 2), 256 * 2 ** (stage - 2)
        for block in range(blocks):
            prefix = f'res{stage}_{block}'
            shapes = {'branch2a': (inner, dim_in if block == 0 else out, 1), 'branch2b': (inner, inner, 3),
                      'branch2c': (out, inner, 1)}
            if block == 0:
                shapes['branch1'] = (out, dim_in, 1)
            for branch, (o, i, k) in shapes.items():
                blobs[f'{prefix}_{branch}_w'] = (o, i, k, k)
                blobs.update({f'{prefix}_{branch}_bn_s': (o,), f'{prefix}_{branch}_bn_b': (o,)})
        dim_in = out
    for stage in range(2, 6):
        last = f'res{stage}_{BLOCKS[stage] - 1}_sum'
        blobs.update(_conv(f'fpn_inner_{last}' + ('' if stage == 5 else '_lateral'), FPN_DIM, 256 * 2 ** (stage - 2), 1))
        blobs.update(_conv(f'fpn_{last}', FPN_DIM, FPN_DIM, 3))
    blobs.update(_conv('conv_rpn_fpn2', FPN_DIM, FPN_DIM, 3))
    blobs.update(_conv('rpn_cls_logits_fpn2', 3, FPN_DIM, 1))
    blobs.update(_conv('rpn_bbox_pred_fpn2', 12, FPN_DIM, 1))
    blobs.update({'fc6_w': (MLP_DIM, FPN_DIM * 49), 'fc6_b': (MLP_DIM,), 'fc7_w': (MLP_DIM, MLP_DIM), 'fc7_b': (MLP_DIM,),
                  'cls_score_w': (2, MLP_DIM), 'cls_score_b': (2,), 'bbox_pred_w': (8, MLP_DIM), 'bbox_pred_b': (8,)})
    for i in range(1, 9):
        blobs.update(_conv(f'conv_fcn{i}', HEAD_DIM, FPN_DIM if i == 1 else HEAD_DIM, 3))
    # ConvTranspose blobs are (in, out, k, k); kps_score is BilinearInterpolation's fixed one.
    blobs.update({'kps_score_lowres_w': (HEAD_DIM, K, 4, 4), 'kps_score_lowres_b': (K,),
                  'kps_score_w': (K, K, 4, 4), 'kps_score_b': (K,)})
    return blobs


@pytest.fixture(scope='module')
def keypoint_model():
    merge_cfg_from_file(os.path.join(REPO, 'configs', '12_2017_baselines', 'e2e_keypoint_rcnn_R-50-FPN_1x.yaml'))
    merge_cfg_from_list(['RESNETS.WIDTH_PER_GROUP', str(WIDTH), 'FPN.DIM', str(FPN_DIM), 'KRCNN.CONV_HEAD_DIM',
                         str(HEAD_DIM), 'FAST_RCNN.MLP_HEAD_DIM', str(MLP_DIM)])
    assert_and_infer_cfg()
    model = model_builder.create(cfg)
    cfg.defrost()
    return model


def test_detectron_keypoint_rcnn_pkl_loads_every_tensor_into_its_parameter(keypoint_model, tmp_path):
    rng = np.random.RandomState(0)
    blobs = {name: rng.randn(*shape).astype(np.float32) for name, shape in detectron_keypoint_rcnn_blobs().items()}
    # The released files hold the bilinear kernel itself (GivenTensorFill, never updated).
    blobs['kps_score_w'] = np.zeros((K, K, 4, 4), np.float32)
    blobs['kps_score_w'][range(K), range(K)] = bilinear_kernel(4)
    blobs['kps_score_b'] = np.zeros(K, np.float32)
    path = str(tmp_path / 'model_final.pkl')
    save_object({'blobs': dict(blobs, **{n + '_momentum': v for n, v in blobs.items()})}, path)
    assert load_detectron_weights(keypoint_model, path) == ([], [])
    state = keypoint_model.state_dict()
    # The keypoint head, blob by blob, into the parameter of its Detectron name.
    for i in range(1, 9):
        for blob, param in (('w', 'weight'), ('b', 'bias')):
            assert torch.equal(state[f'keypoint_head.conv_fcn{i}.{param}'], torch.from_numpy(blobs[f'conv_fcn{i}_{blob}']))
    assert torch.equal(state['keypoint_head.kps_score_lowres.weight'], torch.from_numpy(blobs['kps_score_lowres_w']))
    assert torch.equal(state['keypoint_head.kps_score_lowres.bias'], torch.from_numpy(blobs['kps_score_lowres_b']))
    assert torch.equal(state['keypoint_head.kps_score.weight'], torch.from_numpy(blobs['kps_score_w']))
    # Every other tensor of the model holds exactly one random blob's values, bit for bit.
    random_blobs = {n: v for n, v in blobs.items() if n not in ('kps_score_w', 'kps_score_b')}
    by_bytes = {v.tobytes(): n for n, v in random_blobs.items()}
    tensors = [v for k, v in state.items() if not k.startswith('keypoint_head.kps_score.')]
    assert sorted(by_bytes[v.numpy().tobytes()] for v in tensors) == sorted(random_blobs)


def test_missing_and_unused_keypoint_blobs_are_reported(keypoint_model):
    rng = np.random.RandomState(1)
    blobs = {name: rng.randn(*shape).astype(np.float32) for name, shape in detectron_keypoint_rcnn_blobs().items()}
    del blobs['conv_fcn3_b']
    blobs['kps_deconv_w'] = np.zeros((HEAD_DIM, 4, 4, 4), np.float32)  # a USE_DECONV model's blob
    assert load_detectron_weights(keypoint_model, blobs) == (['keypoint_head.conv_fcn3.bias'], ['kps_deconv_w'])
