"""The R-CNN model type's training batches: resized by the loader workers (cv2) or on the device."""
import cv2
import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.modeling import rcnn_builder, rcnn_checks, rcnn_inference
from detectron.utils.errors import ConfigValueError
from detectron.roi_data.loader import scale_rng
from detectron.roi_data.minibatch import (UnresizedImages, collate_minibatch, collate_unresized, prepare_training_entry,
                                          prepare_unresized_training_entry)

PIXEL_MEANS = (102.9801, 115.9465, 122.7717)
CPU, CUDA = torch.device('cpu'), torch.device('cuda', 0)   # a device object needs no GPU


def _entries(tmp_path):
    rng = np.random.RandomState(7)
    entries = []
    for name, (h, w), flipped in (('a', (37, 61), False), ('b', (50, 29), True)):
        path = str(tmp_path / (name + '.png'))
        assert cv2.imwrite(path, rng.randint(0, 256, (h, w, 3)).astype(np.uint8))
        entries.append({'image': path, 'height': h, 'width': w, 'flipped': flipped,
                        'boxes': np.array([[1, 2, 9, 12]], np.float32), 'gt_classes': np.array([3], np.int32),
                        'is_crowd': np.array([False])})
    return entries


def test_the_device_resizes_on_a_gpu_unless_told_not_to(tmp_path, set_cfg):
    set_cfg({'MODEL.FASTER_RCNN': True})
    model_type = rcnn_builder.GeneralizedRCNNType(cfg)
    assert cfg.TRAIN.RESIZE_ON_DEVICE
    assert rcnn_builder.resizes_on_device(cfg, CUDA) and not rcnn_builder.resizes_on_device(cfg, CPU)
    roidb = _entries(tmp_path)
    assert model_type.collate(CUDA) is collate_unresized
    assert model_type.collate(CPU).func is collate_minibatch
    assert model_type.training_dataset(roidb, CUDA)[(0, 1)][0].dtype == np.uint8
    assert model_type.training_dataset(roidb, CPU)[(0, 1)][0].dtype == np.float32
    frozen = cfg.is_frozen()
    cfg.defrost()
    cfg.TRAIN.RESIZE_ON_DEVICE = False
    try:
        assert not rcnn_builder.resizes_on_device(cfg, CUDA)
        assert model_type.collate(CUDA).func is collate_minibatch
    finally:
        cfg.TRAIN.RESIZE_ON_DEVICE = True
        if frozen:
            cfg.freeze()


@pytest.mark.parametrize('device', [CPU, pytest.param(CUDA, marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs a CUDA GPU')])])
def test_unresized_batches_finished_on_the_device_equal_the_workers_blobs(tmp_path, device):
    # The same draws, im_info and targets; the blob within float rounding of cv2's resize.
    entries = _entries(tmp_path)
    scales, max_size = (40, 72, 55), 90
    cv2_items = [prepare_training_entry(e, scale_rng(5, 3, k), scales, max_size, PIXEL_MEANS) for k, e in enumerate(entries)]
    raw_items = [prepare_unresized_training_entry(e, scale_rng(5, 3, k), scales, max_size) for k, e in enumerate(entries)]
    expected = collate_minibatch(cv2_items, stride=32)
    unresized = collate_unresized(raw_items)
    assert isinstance(unresized[0], UnresizedImages)
    assert [tuple(im.shape) for im in unresized[0].images] == [(37, 61, 3), (50, 29, 3)]
    assert all(im.dtype == torch.uint8 for im in unresized[0].images)
    images, im_info, targets = rcnn_builder._batch_to_device(unresized, device, PIXEL_MEANS, 32)
    assert images.device.type == device.type
    images, im_info = images.cpu(), im_info.cpu()
    targets = [{k: v.cpu() for k, v in t.items()} for t in targets]
    assert images.shape == expected[0].shape and images.dtype == torch.float32
    np.testing.assert_allclose(images.numpy(), expected[0].numpy(), rtol=0, atol=1e-4)
    assert images.abs().max() > 50
    np.testing.assert_array_equal(im_info.numpy(), expected[1].numpy())
    for got, want in zip(targets, expected[2]):
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def test_a_resized_batch_passes_through_batch_to_device(tmp_path):
    items = [prepare_training_entry(e, scale_rng(0, 0, k), (40,), 90, PIXEL_MEANS) for k, e in enumerate(_entries(tmp_path))]
    batch = collate_minibatch(items, stride=32)
    images, im_info, targets = rcnn_builder._batch_to_device(batch, CPU, PIXEL_MEANS, 32)
    assert torch.equal(images, batch[0]) and torch.equal(im_info, batch[1])


def test_box_voting_gets_the_configured_beta(monkeypatch):
    cfg.TEST.BBOX_VOTE.SCORING_METHOD_BETA = 2.5
    params = rcnn_builder.nms_params(cfg)
    assert params.bbox_vote_scoring_beta == 2.5
    seen = []
    monkeypatch.setattr(rcnn_inference.box_utils, 'box_voting',
                        lambda top, pool, thresh, scoring_method, beta: seen.append(beta) or top)
    dets = torch.tensor([[0., 0., 9., 9., 0.9]])
    rcnn_inference._box_voting(dets, torch.tensor([1]), dets, torch.tensor([1]), 2, params)
    assert seen == [2.5, 2.5]  # one call per class (background included)


@pytest.mark.parametrize('shortcut', ['basic_bn_shortcut', 'basic_gn_shortcut'])
def test_a_body_that_mixes_groupnorm_and_affine_functions_is_refused(shortcut):
    cfg.merge_from_list(['MODEL.FASTER_RCNN', True, 'FPN.FPN_ON', True, 'FPN.MULTILEVEL_RPN', True,
                         'FPN.MULTILEVEL_ROIS', True, 'MODEL.CONV_BODY', 'FPN.add_fpn_ResNet50_conv5_body',
                         'FAST_RCNN.ROI_BOX_HEAD', 'fast_rcnn_heads.add_roi_2mlp_head',
                         'FAST_RCNN.ROI_XFORM_METHOD', 'RoIAlign', 'RESNETS.STEM_FUNC', 'basic_gn_stem',
                         'RESNETS.TRANS_FUNC', 'bottleneck_gn_transformation', 'RESNETS.SHORTCUT_FUNC', shortcut])
    if shortcut == 'basic_gn_shortcut':
        rcnn_checks.check_supported(cfg)
        return
    with pytest.raises(ConfigValueError, match='RESNETS.STEM_FUNC basic_gn_stem, RESNETS.TRANS_FUNC '
                                               'bottleneck_gn_transformation, RESNETS.SHORTCUT_FUNC '
                                               'basic_bn_shortcut mix GroupNorm and affine'):
        rcnn_checks.check_supported(cfg)


def test_the_training_roidb_drops_annotations_below_gt_min_area(monkeypatch):
    calls = []
    monkeypatch.setattr(rcnn_builder, 'combined_roidb_for_training',
                        lambda *args, **kwargs: calls.append((args, kwargs)) or [])
    cfg.merge_from_list(['TRAIN.DATASETS', ('a', 'b'), 'TRAIN.GT_MIN_AREA', 32, 'TRAIN.USE_FLIPPED', False,
                         'MODEL.MASK_ON', True, 'MODEL.FASTER_RCNN', True])
    rcnn_builder.GeneralizedRCNNType(cfg).training_roidb()
    assert calls == [((('a', 'b'), False, 32), {'segms': True, 'num_keypoints': 0})]
