"""A small Keypoint R-CNN on a few keypoint shapes (CPU): the demo config builds, a few SGD steps lower its keypoint
loss, and the detector returns keypoints for every box."""
import math
import os

import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.datasets.test_results import detection_parts
from detectron.datasets import shapes
from detectron.modeling import model_builder
from detectron.roi_data.minibatch import read_entry_image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml')
SMALL = ['FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'GROUP_NORM.NUM_GROUPS', '16', 'KRCNN.CONV_HEAD_DIM', '16',
         'KRCNN.NUM_STACKED_CONVS', '2', 'TRAIN.SCALES', '(96,)', 'TRAIN.MAX_SIZE', '144', 'TEST.SCALE', '96',
         'TEST.MAX_SIZE', '144', 'TRAIN.RPN_PRE_NMS_TOP_N', '200', 'TRAIN.RPN_POST_NMS_TOP_N', '64',
         'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '50', 'TRAIN.BATCH_SIZE_PER_IM', '32',
         'TRAIN.IMS_PER_BATCH', '2', 'DATA_LOADER.NUM_THREADS', '0']


@pytest.fixture
def keypoint_shapes(tmp_path, monkeypatch):
    """A few keypoint shapes images generated into a private cache."""
    monkeypatch.setenv(shapes.CACHE_ENV_VAR, str(tmp_path / 'cache'))
    monkeypatch.setattr(shapes, 'KEYPOINT_NUM_IMAGES', {'shapes_keypoints_train': 4, 'shapes_keypoints_val': 2})
    cfg.defrost()
    finalize_cfg(DEMO, SMALL + ['OUTPUT_DIR', str(tmp_path / 'out')], training=True)
    return model_builder.build_model_type(cfg)


def test_keypoint_shapes_have_named_flippable_keypoints(keypoint_shapes):
    roidb = keypoint_shapes.training_roidb()
    assert len(roidb) == 8  # 4 images and their flipped copies
    dataset = roidb[0]['dataset']
    assert dataset.keypoints == list(shapes.KEYPOINT_NAMES) and dataset.num_keypoints == 5
    assert dataset.keypoint_flip_map == {'left_top': 'right_top', 'left_bottom': 'right_bottom'}
    entry = roidb[0]
    kps = entry['gt_keypoints']
    assert kps.shape == (len(entry['boxes']), 3, 5) and (kps[:, 2] == 2).all()
    # The centre is the middle of the corners, inside the object's box.
    np.testing.assert_allclose(kps[:, :2, 4], kps[:, :2, :4].mean(axis=2), atol=1.0)
    boxes = entry['boxes']
    assert ((kps[:, 0, 4] > boxes[:, 0]) & (kps[:, 0, 4] < boxes[:, 2])).all()


def test_keypoint_rcnn_trains_and_detects_keypoints(keypoint_shapes):
    model_type = keypoint_shapes
    torch.manual_seed(0)
    model = model_builder.checked_model(model_type).train()
    roidb = model_type.training_roidb()
    samples = model_type.training_dataset(roidb, torch.device('cpu'))
    batch = model_type.collate(torch.device('cpu'))([samples[(0, 0)], samples[(0, 1)]])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    kps_losses = []
    for _ in range(8):
        losses = model(*batch)
        kps_losses.append(losses['loss_kps'].item())
        optimizer.zero_grad()
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        optimizer.step()
    # Near the uniform softmax over the 28 x 28 positions at first, then learning on the same two images.
    assert abs(kps_losses[0] - math.log(28 * 28)) < 0.3
    assert kps_losses[-1] < kps_losses[0] - 1.0
    model.eval()
    im = read_entry_image(roidb[0])
    cls_boxes, cls_segms, cls_keyps = detection_parts(model_type.detector()(model, model_type.test_inputs()(im)))
    assert cls_segms is None and len(cls_keyps) == 2 and cls_keyps[0] == []
    assert len(cls_keyps[1]) == len(cls_boxes[1]) > 0
    for det, kps in zip(cls_boxes[1], cls_keyps[1]):
        assert kps.shape == (4, 5) and (kps[3] > 0).all() and (kps[3] <= 1).all()
        # heatmaps_to_keypoints puts each keypoint inside its box.
        assert (kps[0] >= det[0] - 1e-3).all() and (kps[0] <= det[2] + 1e-3).all()


def test_test_engine_stores_and_evaluates_the_keypoints(keypoint_shapes, tmp_path):
    from detectron.core import test_engine
    from detectron.utils.io import load_object
    torch.manual_seed(0)
    model = model_builder.checked_model(keypoint_shapes)
    weights = str(tmp_path / 'random.pth')
    torch.save({'model': model.state_dict()}, weights)
    results = test_engine.run_inference(keypoint_shapes, weights)
    assert list(results['shapes_keypoints_val']) == ['box', 'keypoint']
    assert list(results['shapes_keypoints_val']['keypoint']) == ['AP', 'AP50', 'AP75', 'APm', 'APl']
    out_dir = os.path.join(str(tmp_path), 'out', 'test', 'shapes_keypoints_val', 'generalized_rcnn')
    detections = load_object(os.path.join(out_dir, 'detections.pkl'))
    all_boxes, all_keyps = detections['all_boxes'], detections['all_keyps']
    assert [len(k) for k in all_keyps[1]] == [len(b) for b in all_boxes[1]] and sum(map(len, all_boxes[1])) > 0
    assert os.path.isfile(os.path.join(out_dir, 'keypoints_shapes_keypoints_val_results.json'))
