"""R-CNN test-time augmentation (modeling/test_time_aug.py) against Detectron's core/test.py: the
combinations on hand-built predictions, the boxes and masks of a flipped or stretched image back in
the original frame, and a tiny Mask R-CNN (with KL-Loss' sigmas) run through its model type."""
import os

import cv2
import numpy as np
import pytest
import torch

from detectron.core import test as test_lib
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import mask_inference, model_builder, rcnn_inference
from detectron.modeling import test_time_aug as tta
from detectron.utils import boxes as box_utils
from detectron.utils.errors import ConfigValueError

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')
MASK_DEMO_CFG = os.path.join(CONFIGS, 'getting_started', 'shapes_demo_mask_R-18-FPN.yaml')
TINY_MASK_OPTS = ['FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'MRCNN.DIM_REDUCED', '32', 'MRCNN.RESOLUTION', '14',
                  'MRCNN.ROI_XFORM_RESOLUTION', '7', 'PRED_STD', 'True', 'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96',
                  'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '60', 'TEST.SCORE_THRESH', '0.0',
                  'TEST.DETECTIONS_PER_IM', '30']


# --- combinations on hand-built predictions -------------------------------------------------------

def _t(array):
    return torch.tensor(array, dtype=torch.float32)


def test_union_stacks_avg_averages_and_id_keeps_the_identity():
    a, b, ident = np.array([[0.2, 0.8], [0.5, 0.5]]), np.array([[0.4, 0.6], [0.1, 0.9]]), np.array([[1., 0.], [0., 1.]])
    ts = [_t(a), _t(b), _t(ident)]
    np.testing.assert_array_equal(tta.combine_heuristic_results('UNION', ts, ts[-1]).numpy(),
                                  np.vstack([a, b, ident]).astype(np.float32))
    np.testing.assert_allclose(tta.combine_heuristic_results('AVG', ts, ts[-1]).numpy(),
                               [[1.6 / 3, 1.4 / 3], [0.6 / 3, 2.4 / 3]], rtol=1e-6)
    np.testing.assert_array_equal(tta.combine_heuristic_results('ID', ts, ts[-1]).numpy(), ident)
    with pytest.raises(ValueError, match='heuristic MAX not supported'):
        tta.combine_heuristic_results('MAX', ts, ts[-1])


def test_averaged_boxes_average_the_variances_of_their_sigmas():
    confs = [_t([[3.0, 1.0, 2.0, 0.0]]), _t([[4.0, 1.0, 2.0, 2.0]])]
    np.testing.assert_allclose(tta.combine_sigmas('AVG', confs, confs[-1]).numpy(),
                               [[np.sqrt(12.5), 1.0, 2.0, np.sqrt(2.0)]], rtol=1e-6)
    np.testing.assert_array_equal(tta.combine_sigmas('UNION', confs, confs[-1]).numpy(), [[3, 1, 2, 0], [4, 1, 2, 2]])
    np.testing.assert_array_equal(tta.combine_sigmas('ID', confs, confs[-1]).numpy(), [[4, 1, 2, 2]])


def _detectron_mask_heur(heur, masks_ts):
    """Detectron's im_detect_mask_aug combination, transcribed in numpy."""
    if heur == 'SOFT_AVG':
        return np.mean(masks_ts, axis=0)
    if heur == 'SOFT_MAX':
        return np.amax(masks_ts, axis=0)
    logits = np.mean([-1.0 * np.log((1.0 - y) / np.maximum(y, 1e-20)) for y in masks_ts], axis=0)
    return 1.0 / (1.0 + np.exp(-logits))


@pytest.mark.parametrize('heur', ['SOFT_AVG', 'SOFT_MAX', 'LOGIT_AVG'])
def test_soft_masks_combine_as_detectron(heur):
    rng = np.random.RandomState(0)
    masks_ts = [rng.uniform(0.01, 0.99, size=(3, 5, 5)).astype(np.float32) for _ in range(4)]
    masks_ts[1][0, 0, 0] = 0.0  # a probability of 0: its logit is floored (1e-20)
    got = tta.combine_masks(heur, [torch.from_numpy(m) for m in masks_ts]).numpy()
    np.testing.assert_allclose(got, _detectron_mask_heur(heur, masks_ts), rtol=1e-5, atol=1e-7)


def test_logit_average_of_opposite_probabilities_is_one_half():
    got = tta.combine_masks('LOGIT_AVG', [_t([[[0.2]]]), _t([[[0.8]]])])
    np.testing.assert_allclose(got.numpy(), [[[0.5]]], rtol=1e-6)
    np.testing.assert_allclose(tta.combine_masks('SOFT_MAX', [_t([[[0.2]]]), _t([[[0.8]]])]).numpy(), [[[0.8]]])


# --- transforms and frames ------------------------------------------------------------------------

def test_transforms_follow_detectron_s_order():
    aug = tta.AugTransforms(h_flip=True, scales=(400, 500), max_size=2000, scale_h_flip=True, aspect_ratios=(0.5,),
                            aspect_ratio_h_flip=True)
    T = tta.Transform
    assert tta.transforms(aug, 800, 1333) == [
        T(800, 1333, hflip=True), T(400, 2000), T(400, 2000, hflip=True), T(500, 2000), T(500, 2000, hflip=True),
        T(800, 1333, aspect_ratio=0.5), T(800, 1333, hflip=True, aspect_ratio=0.5)]
    assert tta.transforms(tta.AugTransforms(), 800, 1333) == []


def test_boxes_of_a_flipped_image_come_back_mirrored():
    # Width 100: x -> 99 - x, the edges exchanged, per class column group.
    boxes = _t([[10, 5, 29, 20, 0, 0, 99, 9]])
    back = tta.boxes_to_original(boxes, tta.Transform(64, 96, hflip=True), 100)
    np.testing.assert_array_equal(back.numpy(), [[70, 5, 89, 20, 0, 0, 99, 9]])


def test_boxes_of_a_stretched_and_flipped_image_come_back():
    # Width 50 stretched by 2 to 100, then mirrored: x -> (99 - x) / 2.
    t = tta.Transform(64, 96, hflip=True, aspect_ratio=2.0)
    back = tta.boxes_to_original(_t([[10, 5, 29, 20]]), t, 100)
    np.testing.assert_array_equal(back.numpy(), [[35, 5, 44.5, 20]])
    np.testing.assert_array_equal(tta.boxes_to_transformed(back, t, 100).numpy(), [[10, 5, 29, 20]])


def test_transformed_image_stretches_the_width_then_mirrors():
    im = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(tta.transformed_image(im, tta.Transform(64, 96, hflip=True)), im[:, ::-1])
    stretched = tta.transformed_image(im, tta.Transform(64, 96, hflip=True, aspect_ratio=2.0))
    np.testing.assert_array_equal(stretched, cv2.resize(im, dsize=(6, 2))[:, ::-1])


def test_flipped_xyxy_sigmas_exchange_their_x_columns():
    confs = _t([[1, 2, 3, 4, 5, 6, 7, 8]])  # (x1, x2, y1, y2) per class
    np.testing.assert_array_equal(tta.flip_sigmas(confs, xyxy=True).numpy(), [[2, 1, 3, 4, 6, 5, 7, 8]])
    np.testing.assert_array_equal(tta.flip_sigmas(confs, xyxy=False).numpy(), confs.numpy())


# --- a tiny Mask R-CNN with KL-Loss' head ---------------------------------------------------------

def _image():
    image = np.full((48, 72, 3), 170, np.uint8)
    image[5:30, 8:40] = (40, 40, 220)
    image[20:44, 45:66] = (220, 60, 40)
    return image


def _tiny_model(*opts):
    finalize_cfg(MASK_DEMO_CFG, TINY_MASK_OPTS + list(opts))
    model_type = model_builder.build_model_type(cfg)
    torch.manual_seed(0)
    model = model_builder.checked_model(model_type).eval()
    with torch.no_grad():
        for param in model.mask_head.parameters():
            param.normal_(0.0, 0.3)
    return model_type, model


def _flip_union(model, image, image_params, decode):
    """Detectron's UNION of the flip and the identity, built from two plain detections and numpy's
    flip_boxes (with XYXY, the flipped prediction's x1 and x2 sigma columns exchanged by hand)."""
    flipped = image[:, ::-1, :]
    s_hf, b_hf, c_hf, _ = rcnn_inference.detect_boxes(model, flipped, image_params, decode)
    s_i, b_i, c_i, _ = rcnn_inference.detect_boxes(model, image, image_params, decode)
    b_hf = box_utils.flip_boxes(b_hf.numpy(), image.shape[1])
    scores, boxes = np.vstack([s_hf.numpy(), s_i.numpy()]), np.vstack([b_hf, b_i.numpy()])
    if c_i is None:
        return scores, boxes, None
    c_hf = c_hf.numpy()
    if decode.xyxy:
        c_hf = c_hf.reshape(len(c_hf), -1, 4)[:, :, [1, 0, 2, 3]].reshape(len(c_hf), -1)
    return scores, boxes, np.vstack([c_hf, c_i.numpy()])


@pytest.mark.parametrize('opts', [[], ['TEST.BBOX_VOTE.ENABLED', 'True'], ['STD_NMS', 'True'],
                                  ['STD_NMS', 'True', 'XYXY', 'True'],
                                  ['STD_NMS', 'True', 'XYXY', 'True', 'TEST.BBOX_VOTE.ENABLED', 'True']])
def test_the_flip_union_is_the_stacked_detections_of_both_images(opts):
    model_type, model = _tiny_model('TEST.BBOX_AUG.ENABLED', 'True', 'TEST.BBOX_AUG.H_FLIP', 'True', *opts)
    image = _image()
    image_params, decode = rcnn_builder_params(model_type)
    scores, boxes, confs = _flip_union(model, image, image_params, decode)
    got = test_lib.im_detect_bbox_aug(model_type, model, image)
    np.testing.assert_array_equal(got[0], scores)
    np.testing.assert_array_equal(got[1], boxes)
    assert got[2] == 64 / 48
    if cfg.STD_NMS:
        np.testing.assert_array_equal(got[3], confs)
    # The detector: NMS / variance voting / box voting of the union, as box_results_with_nms_and_limit.
    _, _, expected = test_lib.box_results_with_nms_and_limit(model_type, scores, boxes, confs)
    cls_boxes, _ = model_type.detector()(model, {'image': image})
    assert sum(len(b) for b in expected) > 0
    for got_j, expected_j in zip(cls_boxes, expected):
        np.testing.assert_array_equal(got_j, expected_j)


def rcnn_builder_params(model_type):
    from detectron.modeling import rcnn_builder
    return rcnn_builder.image_params(model_type.cfg), rcnn_builder.decode_params(model_type.cfg)


@pytest.mark.parametrize('opts', [[], ['STD_NMS', 'True', 'TEST.BBOX_VOTE.ENABLED', 'True']])
def test_identity_only_augmentation_equals_the_plain_detector(opts, restore_global_cfg):
    plain_type, model = _tiny_model(*opts)
    image = _image()
    plain_boxes, plain_segms = plain_type.detector()(model, {'image': image})
    restore_global_cfg()
    aug_type, _ = _tiny_model('TEST.BBOX_AUG.ENABLED', 'True', 'TEST.MASK_AUG.ENABLED', 'True', *opts)
    assert aug_type.detector().keywords['aug'] is not None
    aug_boxes, aug_segms = aug_type.detector()(model, {'image': image})
    assert sum(len(b) for b in plain_boxes) > 0
    for got, expected in zip(aug_boxes, plain_boxes):
        np.testing.assert_array_equal(got, expected)
    assert aug_segms == plain_segms


def test_flipped_masks_are_the_mirrored_masks_of_the_flipped_image():
    model_type, model = _tiny_model('TEST.MASK_AUG.ENABLED', 'True', 'TEST.MASK_AUG.H_FLIP', 'True',
                                    'TEST.MASK_AUG.HEUR', 'SOFT_MAX')
    image = _image()
    image_params, _ = rcnn_builder_params(model_type)
    boxes = np.array([[8, 5, 39, 29], [45, 20, 65, 43]], np.float32)
    classes = np.array([1, 2])
    got = test_lib.im_detect_mask_aug(model_type, model, image, boxes, classes)

    def masks_on(im, im_boxes):
        features, im_scale = rcnn_inference.body_features(model, im, image_params)
        with torch.no_grad():
            return mask_inference.detect_masks(model, features, torch.from_numpy(im_boxes), torch.from_numpy(classes),
                                               im_scale).numpy()
    identity = masks_on(image, boxes)
    mirrored = masks_on(image[:, ::-1, :], box_utils.flip_boxes(boxes, 72))[:, :, ::-1]
    assert not np.array_equal(identity, mirrored)
    np.testing.assert_array_equal(got, np.maximum(identity, mirrored))


def test_every_augmentation_with_kl_sigmas_gives_detections_and_masks():
    model_type, model = _tiny_model(
        'STD_NMS', 'True', 'TEST.BBOX_VOTE.ENABLED', 'True', 'TEST.BBOX_AUG.ENABLED', 'True',
        'TEST.BBOX_AUG.H_FLIP', 'True', 'TEST.BBOX_AUG.SCALES', '(48, 80)', 'TEST.BBOX_AUG.MAX_SIZE', '120',
        'TEST.BBOX_AUG.SCALE_H_FLIP', 'True', 'TEST.BBOX_AUG.ASPECT_RATIOS', '(0.75,)',
        'TEST.BBOX_AUG.ASPECT_RATIO_H_FLIP', 'True', 'TEST.MASK_AUG.ENABLED', 'True', 'TEST.MASK_AUG.HEUR', 'LOGIT_AVG',
        'TEST.MASK_AUG.H_FLIP', 'True', 'TEST.MASK_AUG.SCALES', '(48,)', 'TEST.MASK_AUG.ASPECT_RATIOS', '(1.5,)')
    image = _image()
    _, boxes, _, confs = test_lib.im_detect_bbox_aug(model_type, model, image)
    single = rcnn_inference.detect_boxes(model, image, *rcnn_builder_params(model_type))[1]
    assert len(boxes) > 3 * len(single) and confs.shape == boxes.shape  # 7 augmentations and the identity
    cls_boxes, cls_segms = model_type.detector()(model, {'image': image})
    assert 0 < sum(len(b) for b in cls_boxes) <= 30
    assert [len(s) for s in cls_segms] == [len(b) for b in cls_boxes]
    # Inside the 72 x 48 image (to float rounding: variance voting averages clipped boxes).
    for b in cls_boxes[1:]:
        assert np.all((b[:, :2] > -1e-4) & (b[:, 2:4] < np.array([71, 47]) + 1e-4))


# --- settings ---------------------------------------------------------------------------------------

@pytest.mark.parametrize('opts, message', [
    (['TEST.BBOX_AUG.SCORE_HEUR', 'AVG'], 'UNION combines scores and coordinates together'),
    (['TEST.BBOX_AUG.SCORE_HEUR', 'AVG', 'TEST.BBOX_AUG.COORD_HEUR', 'AVG'], 'only UNION combines them'),
    (['TEST.BBOX_AUG.SCORE_HEUR', 'MAX'], "TEST.BBOX_AUG.SCORE_HEUR must be one of 'ID', 'AVG', 'UNION'"),
    (['TEST.MASK_AUG.HEUR', 'HM_AVG'], 'TEST.MASK_AUG.HEUR must be one of'),
    (['TEST.BBOX_AUG.SCALE_SIZE_DEP', 'True'], 'not implemented in Detectron either'),
    (['TEST.MASK_AUG.AREA_TH', '100'], 'not implemented in Detectron either'),
    (['TEST.KPS_AUG.HEUR', 'SOFT_AVG'], "TEST.KPS_AUG.HEUR must be one of 'HM_AVG', 'HM_MAX'"),
])
def test_settings_detectron_does_not_run_are_one_error(opts, message):
    with pytest.raises(ConfigValueError, match=message):
        finalize_cfg(MASK_DEMO_CFG, ['TEST.BBOX_AUG.ENABLED', 'True'] + opts)


def test_centernet_refuses_r_cnn_augmentation():
    with pytest.raises(ConfigValueError, match='CENTERNET.FLIP_TEST'):
        finalize_cfg(os.path.join(CONFIGS, 'getting_started', 'shapes_demo_centernet_res18.yaml'),
                     ['TEST.BBOX_AUG.ENABLED', 'True'])


def test_the_shipped_config_is_detectron_s_test_time_augmentation_example():
    finalize_cfg(os.path.join(CONFIGS, 'test_time_aug', 'e2e_mask_rcnn_R-50-FPN_2x.yaml'), [])
    model_type = model_builder.build_model_type(cfg)
    aug = model_type.detector().keywords['aug']
    scales = (400, 500, 600, 700, 900, 1000, 1100, 1200)
    expected = tta.AugTransforms(h_flip=True, scales=scales, max_size=2000, scale_h_flip=True)
    assert aug == tta.Augmentations(tta.BoxAug(expected, 'UNION', 'UNION'), tta.MaskAug(expected, 'SOFT_AVG'))
    assert len(tta.transforms(expected, cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)) == 17
    assert (cfg.TEST.BBOX_VOTE.ENABLED, cfg.TEST.BBOX_VOTE.VOTE_TH, cfg.TEST.SCALE) == (True, 0.9, 800)
    assert cfg.TEST.WEIGHTS.startswith('https://dl.fbaipublicfiles.com/detectron/35859007/12_2017_baselines/')
    assert model_type.output_classes() == 81 and cfg.MODEL.MASK_ON
