"""Fast R-CNN at test time (MODEL.FASTER_RCNN False): Detectron's DEDUP_BOXES (numpy's np.unique on the
hashed rois), detections on given proposals with their duplicates mapped back, the RPN-only model's
proposals and the mismatch between TEST.PROPOSAL_FILES and TEST.DATASETS."""
import numpy as np
import pytest
import torch

from detectron.core import test as test_lib
from detectron.core.config import cfg
from detectron.modeling import model_builder, rcnn_builder, rcnn_inference
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


def test_dedup_rois_is_detectrons_unique_on_hashed_rois():
    rng = np.random.RandomState(0)
    rois = np.hstack((np.zeros((40, 1)), rng.uniform(0, 200, (40, 4)))).astype(np.float32)
    rois[10] = rois[3]  # exact duplicate
    rois[20] = rois[5] + 0.5  # within one cell of 1/16
    rois[30, 1:] = rois[7, 1:] + 20  # not a duplicate
    index, inverse = rcnn_inference.dedup_rois(torch.from_numpy(rois), 1 / 16.)
    hashes = np.round(rois.astype(np.float64) * (1 / 16.)).dot(np.array([1, 1e3, 1e6, 1e9, 1e12]))
    _, expected_index, expected_inverse = np.unique(hashes, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(index.numpy(), expected_index)
    np.testing.assert_array_equal(inverse.numpy(), expected_inverse)
    assert len(index) < 40
    every, same = rcnn_inference.dedup_rois(torch.from_numpy(rois), 0)
    assert torch.equal(every, torch.arange(40)) and torch.equal(same, torch.arange(40))


def test_detections_on_proposals_map_duplicates_back(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'MODEL.FASTER_RCNN', 'False', 'TEST.PROPOSAL_FILES', "('p.pkl',)")
    torch.manual_seed(0)
    model = model_builder.create(cfg).eval()
    assert model.rpn is None
    im = np.random.RandomState(1).randint(0, 255, (64, 96, 3)).astype(np.uint8)
    proposals = np.array([[2, 3, 40, 50], [10, 10, 60, 40], [2.3, 3.2, 39.9, 50.2], [0, 0, 95, 63]], np.float32)
    seen = []
    forward = model.forward
    model.forward = lambda *a, **k: seen.append(len(k['proposals'])) or forward(*a, **k)
    scores, boxes, _, im_scale = rcnn_inference.detect_boxes(
        model, im, rcnn_builder.image_params(cfg), rcnn_builder.decode_params(cfg), proposals=proposals,
        dedup_boxes=cfg.DEDUP_BOXES)
    assert seen == [3] and scores.shape == (4, 3) and boxes.shape == (4, 12)
    # Row 2 hashes as row 0: Detectron decodes it from row 0's box with row 0's outputs.
    assert torch.equal(scores[2], scores[0]) and torch.equal(boxes[2], boxes[0])
    seen.clear()
    plain_scores, plain_boxes, _, _ = rcnn_inference.detect_boxes(
        model, im, rcnn_builder.image_params(cfg), rcnn_builder.decode_params(cfg), proposals=proposals, dedup_boxes=0)
    assert seen == [4]
    for row in (0, 1, 3):
        torch.testing.assert_close(plain_scores[row], scores[row])
        torch.testing.assert_close(plain_boxes[row], boxes[row])
    # core/test.py's Detectron-named im_detect_bbox takes them as `boxes`, with DEDUP_BOXES from the cfg.
    model.forward = forward
    np_scores, np_boxes, np_scale = test_lib.im_detect_bbox(model_builder.build_model_type(cfg), model, im,
                                                             cfg.TEST.SCALE, cfg.TEST.MAX_SIZE, boxes=proposals)
    np.testing.assert_array_equal(np_scores, scores.numpy())
    np.testing.assert_array_equal(np_boxes, boxes.numpy())
    assert np_scale == im_scale


def test_rpn_only_model_gives_proposals_by_descending_score(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'MODEL.RPN_ONLY', 'True')
    torch.manual_seed(0)
    model = model_builder.create(cfg).eval()
    assert model.box_head is None and model.box_outs is None
    im = np.random.RandomState(1).randint(0, 255, (64, 96, 3)).astype(np.uint8)
    boxes, scores = rcnn_builder.GeneralizedRCNNType(cfg).detector()(model, {'image': im})
    assert boxes.dtype == np.float32 and boxes.shape == (len(scores), 4) and 0 < len(scores) <= 50
    assert np.all(np.diff(scores) <= 0)
    assert boxes[:, 2].max() <= 95 and boxes[:, 3].max() <= 63 and boxes.min() >= 0  # the original image's


def test_a_fast_rcnn_needs_one_test_proposal_file_per_dataset(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'MODEL.FASTER_RCNN', 'False', 'TEST.DATASETS', "('tiny_val', 'tiny_val_small')",
                    'TEST.PROPOSAL_FILES', "('a.pkl',)")
    with pytest.raises(ConfigValueError) as err:
        model_builder.build_model_type(cfg).test_proposal_files()
    assert str(err.value) == (
        "TEST.PROPOSAL_FILES ('a.pkl',) must name one proposal file per TEST.DATASETS entry ('tiny_val', "
        "'tiny_val_small') for a Fast R-CNN (MODEL.FASTER_RCNN False; an RPN-only model's test_net writes "
        "rpn_proposals.pkl)")
