"""TEST.KPS_AUG: Detectron's im_detect_keypoints_aug (flip_heatmaps with the dataset's flip pairs, HM_AVG / HM_MAX,
combine_heatmaps_size_dep) against independent computations, and a Keypoint R-CNN tested with augmentation on the
tiny keypoint data, end to end and on precomputed proposals (configs/test_time_aug/keypoint_rcnn_R-50-FPN_1x.yaml's
settings)."""
import os

import numpy as np
import pytest
import torch

from detectron.core import test as test_lib
from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import keypoint_inference, model_builder, rcnn_builder, rcnn_inference
from detectron.modeling import test_time_aug as tta
from detectron.utils import boxes as box_utils
from detectron.utils import keypoints as keypoint_utils
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import REPO, write_tiny_proposals

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

DEMO = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml')
NAMES = ['nose', 'left_eye', 'right_eye', 'left_ear', 'right_ear']


def _numpy_flip_heatmaps(heatmaps, names):
    """Detectron's flip_heatmaps written out: each left/right pair's maps exchanged, then every map mirrored."""
    out = np.empty_like(heatmaps)
    for k, name in enumerate(names):
        partner = name.replace('left_', 'right_') if name.startswith('left_') else name.replace('right_', 'left_')
        source = names.index(partner) if partner in names else k
        for x in range(heatmaps.shape[3]):
            out[:, k, :, x] = heatmaps[:, source, :, heatmaps.shape[3] - 1 - x]
    return out


def test_flipped_heatmaps_exchange_the_pairs_and_mirror():
    assert keypoint_utils.flip_order(NAMES, keypoint_utils.flip_map_of(NAMES)) == (0, 2, 1, 4, 3)
    heatmaps = np.random.RandomState(0).randn(3, 5, 4, 6).astype(np.float32)
    order = keypoint_utils.flip_order(NAMES, keypoint_utils.flip_map_of(NAMES))
    got = keypoint_utils.flip_heatmaps(torch.from_numpy(heatmaps), order).numpy()
    np.testing.assert_array_equal(got, _numpy_flip_heatmaps(heatmaps, NAMES))
    # COCO's 17: Detectron's hard-coded flip map, eight pairs.
    coco, flip_map = keypoint_utils.get_keypoints()
    assert sum(a != b for a, b in enumerate(keypoint_utils.flip_order(coco, flip_map))) == 16


def test_heatmaps_combine_by_mean_or_maximum():
    a = torch.tensor([[[[1., -2.], [3., 0.]]]])
    b = torch.tensor([[[[3., 2.], [-1., 0.5]]]])
    boxes = torch.tensor([[0., 0., 9., 9.]])
    flags = [False, False]
    avg = tta.combine_heatmaps('HM_AVG', [a, b], flags, flags, boxes)
    torch.testing.assert_close(avg, torch.tensor([[[[2., 0.], [1., 0.25]]]]))
    top = tta.combine_heatmaps('HM_MAX', [a, b], flags, flags, boxes)
    torch.testing.assert_close(top, torch.tensor([[[[3., 2.], [3., 0.5]]]]))


def test_size_dependent_combination_leaves_out_downscaled_for_small_and_upscaled_for_large_objects():
    # Box 0: 10 x 10 = 100 (+1 sides) below AREA_TH 400; box 1: 30 x 30 = 900 above it. Identity 1, downscaled 2,
    # upscaled 4 (all maps constant).
    boxes = torch.tensor([[0., 0., 9., 9.], [0., 0., 29., 29.]])
    maps = [torch.full((2, 1, 2, 2), v) for v in (1., 2., 4.)]
    down, up = [False, True, False], [False, False, True]
    avg = tta.combine_heatmaps('HM_AVG', maps, down, up, boxes, scale_size_dep=True, area_th=400)
    assert avg[0].unique().tolist() == [2.5] and avg[1].unique().tolist() == [1.5]
    top = tta.combine_heatmaps('HM_MAX', maps, down, up, boxes, scale_size_dep=True, area_th=400)
    assert top[0].unique().tolist() == [4.0] and top[1].unique().tolist() == [2.0]
    at_threshold = tta.combine_heatmaps('HM_AVG', maps, down, up, boxes, scale_size_dep=True, area_th=100)
    assert at_threshold[0].unique().tolist() == [1.5]  # area 100 is not below 100: large


SMALL = ['FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'GROUP_NORM.NUM_GROUPS', '16', 'KRCNN.CONV_HEAD_DIM', '16',
         'KRCNN.NUM_STACKED_CONVS', '2', 'KRCNN.NUM_KEYPOINTS', '17', 'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96',
         'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '50', 'TEST.SCORE_THRESH', '0.0',
         'TEST.DETECTIONS_PER_IM', '10', 'TRAIN.DATASETS', "('tiny_keypoints',)", 'TEST.DATASETS', "('tiny_keypoints',)"]


def _model(catalog, *opts):
    cfg.defrost()
    finalize_cfg(DEMO, SMALL + ['DATASET_CATALOG', str(catalog)] + list(opts))
    model_type = model_builder.build_model_type(cfg)
    torch.manual_seed(0)
    model = model_builder.checked_model(model_type).eval()
    with torch.no_grad():  # heatmaps with some structure
        for param in model.keypoint_head.parameters():
            param.normal_(0.0, 0.3)
    return model_type, model


def _image():
    image = np.full((48, 72, 3), 170, np.uint8)
    image[5:30, 8:40] = (40, 40, 220)
    image[20:44, 45:66] = (220, 60, 40)
    return image


def test_the_flip_average_is_the_mean_of_the_identity_and_the_mirrored_flip(tiny_catalog):
    model_type, model = _model(tiny_catalog, 'TEST.KPS_AUG.ENABLED', 'True', 'TEST.KPS_AUG.H_FLIP', 'True')
    image = _image()
    cls_boxes, _, cls_keyps = model_type.detector()(model, {'image': image})
    boxes = np.vstack([b[:, :4] for b in cls_boxes[1:]])
    assert len(boxes)
    image_params = rcnn_builder.image_params(cfg)

    def heatmaps_on(im, im_boxes):
        features, im_scale = rcnn_inference.body_features(model, im, image_params)
        with torch.no_grad():
            return keypoint_inference.detect_keypoint_heatmaps(model, features, torch.from_numpy(im_boxes),
                                                               im_scale).numpy()
    identity = heatmaps_on(image, boxes)
    coco = keypoint_utils.get_keypoints()[0]  # the tiny keypoint data's names
    mirrored = _numpy_flip_heatmaps(heatmaps_on(image[:, ::-1], box_utils.flip_boxes(boxes, 72)), coco)
    assert not np.allclose(identity, mirrored, atol=1e-3)
    expected = (identity + mirrored) / 2
    np.testing.assert_allclose(test_lib.im_detect_keypoints_aug(model_type, model, image, boxes), expected, atol=1e-6)
    keyps = keypoint_utils.heatmaps_to_keypoints(expected, boxes)
    np.testing.assert_allclose(np.stack([k for per_class in cls_keyps[1:] for k in per_class]), keyps, atol=1e-4)


def test_identity_only_keypoint_augmentation_equals_the_plain_detector(tiny_catalog):
    model_type, model = _model(tiny_catalog)
    plain = model_type.detector()(model, {'image': _image()})
    aug_type, _ = _model(tiny_catalog, 'TEST.KPS_AUG.ENABLED', 'True')
    assert aug_type.detector().keywords['aug'].keypoints is not None
    augmented = aug_type.detector()(model, {'image': _image()})
    assert sum(len(b) for b in plain[0]) > 0
    for got, expected in zip(augmented[2][1:], plain[2][1:]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_the_tta_config_s_settings_test_a_two_stage_keypoint_model(tiny_catalog, tmp_path):
    """BBOX_AUG AVG on precomputed proposals and KPS_AUG with flips, scales and SCALE_SIZE_DEP, through
    test_net's inference and the COCO keypoint evaluation."""
    proposals = write_tiny_proposals(tiny_catalog, tmp_path / 'proposals.pkl')
    opts = ['MODEL.FASTER_RCNN', 'False', 'TEST.PROPOSAL_FILES', "('{}',)".format(proposals), 'OUTPUT_DIR',
            str(tmp_path), 'TEST.BBOX_AUG.ENABLED', 'True', 'TEST.BBOX_AUG.SCORE_HEUR', 'AVG',
            'TEST.BBOX_AUG.COORD_HEUR', 'AVG', 'TEST.BBOX_AUG.H_FLIP', 'True', 'TEST.BBOX_AUG.SCALES', '(48, 80)',
            'TEST.BBOX_AUG.MAX_SIZE', '120', 'TEST.BBOX_AUG.SCALE_H_FLIP', 'True', 'TEST.KPS_AUG.ENABLED', 'True',
            'TEST.KPS_AUG.H_FLIP', 'True', 'TEST.KPS_AUG.SCALES', '(48, 80)', 'TEST.KPS_AUG.MAX_SIZE', '120',
            'TEST.KPS_AUG.SCALE_H_FLIP', 'True', 'TEST.KPS_AUG.SCALE_SIZE_DEP', 'True', 'TEST.KPS_AUG.AREA_TH', '400',
            'TEST.KPS_AUG.ASPECT_RATIOS', '(0.75,)']
    model_type, model = _model(tiny_catalog, *opts)
    weights = tmp_path / 'model.pth'
    torch.save({'model': model.state_dict()}, weights)
    results = test_engine.run_inference(model_type, str(weights))['tiny_keypoints']
    assert 'AP' in results['box'] and 'AP' in results['keypoint']


def test_a_keypoint_count_other_than_the_test_data_s_is_refused_with_flips(tiny_catalog):
    with pytest.raises(ConfigValueError, match='TEST.KPS_AUG flips heatmaps by the keypoint names'):
        _model(tiny_catalog, 'TEST.KPS_AUG.ENABLED', 'True', 'TEST.KPS_AUG.H_FLIP', 'True', 'KRCNN.NUM_KEYPOINTS', '5')[
            0].detector()
