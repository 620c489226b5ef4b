"""Mask R-CNN test-time masks: expand_boxes, Detectron's segm_results pasting (against a literal
full-image computation and hand-computed areas), the class channel of each detection, and masks
computed on the final (NMS'd or variance-voted) boxes of im_detect_all."""
import os

import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from detectron.core import test as test_lib
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import mask_inference, model_builder, rcnn_inference
from detectron.modeling.rcnn_builder import GeneralizedRCNNType
from detectron.utils import boxes as box_utils

MASK_DEMO_CFG = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'getting_started',
                             'shapes_demo_mask_R-18-FPN.yaml')


def test_expand_boxes_grows_each_box_about_its_centre():
    boxes = np.array([[10, 20, 37, 47], [0, 0, 13, 6]], np.float32)
    # M = 28: scale 30 / 28. Box 0: centre (23.5, 33.5), half sides 13.5 * 30 / 28 = 14.4642857;
    # box 1: centre (6.5, 3), half sides 6.5 * 30 / 28 = 6.9642857 and 3 * 30 / 28 = 3.2142857.
    expected = [[23.5 - 14.4642857, 33.5 - 14.4642857, 23.5 + 14.4642857, 33.5 + 14.4642857],
                [6.5 - 6.9642857, 3 - 3.2142857, 6.5 + 6.9642857, 3 + 3.2142857]]
    expanded = box_utils.expand_boxes(boxes, 30 / 28)
    assert expanded.dtype == np.float64
    np.testing.assert_allclose(expanded, expected, atol=1e-5)
    # Detectron truncates the grown boxes to int32 (towards zero) before pasting.
    assert expanded.astype(np.int32).tolist() == [[9, 19, 37, 47], [0, 0, 13, 6]]


def _detectron_paste(masks, boxes, im_h, im_w, thresh):
    """Detectron's segm_results loop, literally: a whole-image mask per detection, then pycocotools."""
    m = masks.shape[-1]
    ref_boxes = box_utils.expand_boxes(boxes, (m + 2.0) / m).astype(np.int32)
    padded = np.zeros((m + 2, m + 2), np.float32)
    rles = []
    for mask, box in zip(masks, ref_boxes):
        padded[1:-1, 1:-1] = mask
        w, h = max(box[2] - box[0] + 1, 1), max(box[3] - box[1] + 1, 1)
        resized = np.array(cv2.resize(padded, (w, h)) > thresh, dtype=np.uint8)
        im_mask = np.zeros((im_h, im_w), np.uint8)
        x0, x1, y0, y1 = max(box[0], 0), min(box[2] + 1, im_w), max(box[1], 0), min(box[3] + 1, im_h)
        im_mask[y0:y1, x0:x1] = resized[y0 - box[1]:y1 - box[1], x0 - box[0]:x1 - box[0]]
        rles.append(mask_util.encode(np.array(im_mask[:, :, np.newaxis], order='F'))[0])
    return rles


def test_a_full_mask_pastes_to_the_box_less_the_padding_border():
    # Ones everywhere: the 30 x 30 padded mask resized to the grown box [9, 19, 37, 47] (29 x 29):
    # output pixel x samples (x + 0.5) * 30 / 29 - 0.5, so pixels 0 and 28 fall at 0.017 from the
    # zero border (value 0.017) and pixels 1..27 read ones: a 27 x 27 square from (10, 20).
    rle, = mask_inference.paste_masks(np.ones((1, 28, 28), np.float32), np.array([[10, 20, 37, 47]], np.float32),
                                      60, 50, 0.5)
    assert rle['size'] == [60, 50]
    assert mask_util.area(rle) == 27 * 27
    assert mask_util.toBbox(rle).tolist() == [10, 20, 27, 27]


def test_a_half_logit_map_pastes_its_left_half():
    # Logits +4 on the left 14 columns, -4 on the right: sigmoid 0.982 / 0.018. Along x, the value
    # crosses 0.5 halfway between padded columns 14 and 15, i.e. at (x + 0.5) * 30 / 29 = 15:
    # output columns 1..13 are kept (x = 14 samples 14.52), rows 1..27 as for a full mask.
    logits = np.where(np.arange(28) < 14, 4.0, -4.0)[None, :].repeat(28, 0)
    probs = 1 / (1 + np.exp(-logits))
    rle, = mask_inference.paste_masks(probs[None].astype(np.float32), np.array([[10, 20, 37, 47]], np.float32),
                                      60, 50, 0.5)
    assert mask_util.area(rle) == 13 * 27
    assert mask_util.toBbox(rle).tolist() == [10, 20, 13, 27]


def test_pasting_equals_detectron_s_whole_image_masks_and_pycocotools():
    rng = np.random.RandomState(0)
    for trial in range(60):
        im_h, im_w = rng.randint(20, 90, size=2)
        x1, y1 = rng.uniform(-4, im_w, 6), rng.uniform(-4, im_h, 6)
        boxes = np.stack([x1, y1, x1 + rng.uniform(0, 50, 6), y1 + rng.uniform(0, 50, 6)], 1).astype(np.float32)
        boxes[:, 0::2] = boxes[:, 0::2].clip(0, im_w - 1)  # clipped as the detections are
        boxes[:, 1::2] = boxes[:, 1::2].clip(0, im_h - 1)
        masks = rng.rand(6, 14, 14).astype(np.float32)
        if trial % 3 == 0:
            masks[:] = 1.0  # masks touching the image border and the box edges
        elif trial % 3 == 1:
            masks = (masks > 0.2).astype(np.float32)
        thresh = 0.5 if trial % 2 else 0.3
        assert (mask_inference.paste_masks(masks, boxes, im_h, im_w, thresh)
                == _detectron_paste(masks, boxes, im_h, im_w, thresh)), trial
    # Masks filling whole columns of the image: one column's last pixel and the next one's first
    # continue one run, and the image's last pixel ends one.
    whole = np.array([[0, 0, 29, 19], [3, 0, 12, 19], [0, 2, 29, 19]], np.float32)
    ones = np.ones((3, 14, 14), np.float32)
    assert mask_inference.paste_masks(ones, whole, 20, 30, 0.5) == _detectron_paste(ones, whole, 20, 30, 0.5)


def test_segm_results_takes_each_detection_s_class_channel(set_cfg):
    rng = np.random.RandomState(1)
    cls_boxes = [np.zeros((0, 5), np.float32),
                 np.array([[2, 3, 30, 20, 0.9], [5, 5, 15, 25, 0.8]], np.float32),
                 np.zeros((0, 5), np.float32),
                 np.array([[10, 1, 40, 35, 0.7]], np.float32)]
    ref_boxes = np.concatenate([b[:, :4] for b in cls_boxes])
    masks = rng.rand(3, 4, 28, 28).astype(np.float32)
    for cls_specific, channels in ((True, [1, 1, 3]), (False, [0, 0, 0])):
        set_cfg({'MODEL.NUM_CLASSES': 4, 'MRCNN.CLS_SPECIFIC_MASK': cls_specific, 'MRCNN.THRESH_BINARIZE': 0.6})
        cls_segms = test_lib.segm_results(GeneralizedRCNNType(cfg), cls_boxes, masks, ref_boxes, 40, 45)
        expected = _detectron_paste(masks[np.arange(3), channels], ref_boxes, 40, 45, 0.6)
        assert cls_segms == [[], expected[:2], [], expected[2:]]


class _RecordingMaskModel:
    """mask_logits of a 3-class head: channel c holds logit c - 1 everywhere; records its rois."""

    def __init__(self):
        self.rois = None

    def mask_logits(self, features, rois):
        self.rois = rois.clone()
        return (torch.arange(3.0) - 1.0)[None, :, None, None].expand(len(rois), 3, 5, 5).clone()


def test_detect_masks_scales_the_boxes_and_takes_the_class_channel():
    model = _RecordingMaskModel()
    boxes = torch.tensor([[1.0, 2.0, 11.0, 12.0], [0.0, 0.0, 5.0, 9.5]])
    probs = mask_inference.detect_masks(model, [], boxes, torch.tensor([2, 1]), 1.5)
    assert model.rois.tolist() == [[0, 1.5, 3, 16.5, 18], [0, 0, 0, 7.5, 14.25]]
    assert probs.shape == (2, 5, 5)
    np.testing.assert_allclose(probs[:, 0, 0].numpy(), [1 / (1 + np.exp(-1.0)), 0.5], rtol=1e-6)


@pytest.fixture
def tiny_mask_model():
    """The shapes Mask R-CNN demo shrunk, with the KL-Loss head, randomly initialised (its mask head
    with weights large enough for masks to show), and a 48 x 72 image of two rectangles."""
    finalize_cfg(MASK_DEMO_CFG, ['FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'MRCNN.DIM_REDUCED', '32',
                                 'MRCNN.RESOLUTION', '14', 'MRCNN.ROI_XFORM_RESOLUTION', '7', 'PRED_STD', 'True',
                                 'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '60'])
    torch.manual_seed(0)
    model = model_builder.create(cfg).eval()
    with torch.no_grad():
        for param in model.mask_head.parameters():
            param.normal_(0.0, 0.3)
    image = np.full((48, 72, 3), 170, np.uint8)
    image[5:30, 8:40] = (40, 40, 220)
    image[20:44, 45:66] = (220, 60, 40)
    return model, image


@pytest.mark.parametrize('std_nms', [False, True])
def test_im_detect_all_computes_masks_on_the_final_boxes(tiny_mask_model, std_nms):
    model, image = tiny_mask_model
    decode = rcnn_inference.BoxDecodeParams(std_nms=std_nms)
    nms = rcnn_inference.NMSParams(std_nms=std_nms, score_thresh=0.0, detections_per_im=30)
    params = rcnn_inference.ImageParams(scale=64, max_size=96)
    recorded = []
    logits = model.mask_logits

    def recording(features, rois):
        recorded.append((features, rois))
        return logits(features, rois)

    model.mask_logits = recording
    cls_boxes, cls_segms = rcnn_inference.im_detect_all(model, image, params, decode, nms, mask_thresh=0.5)
    final = np.concatenate([b[:, :4] for b in cls_boxes[1:]])
    assert 0 < len(final) <= 30 and [len(s) for s in cls_segms] == [len(b) for b in cls_boxes]
    (features, rois), = recorded
    np.testing.assert_array_equal(rois[:, 0].numpy(), 0)
    im_scale = 64 / 48
    # Detectron's rois blob: boxes * im_scale in float64, then float32.
    np.testing.assert_array_equal(rois[:, 1:].numpy(), (final.astype(np.float64) * im_scale).astype(np.float32))
    # The pasted masks are those of the recorded logits at each detection's class channel.
    classes = np.repeat(np.arange(len(cls_boxes)), [len(b) for b in cls_boxes])
    with torch.no_grad():
        probs = torch.sigmoid(logits(features, rois))[np.arange(len(final)), classes]
    expected = _detectron_paste(probs.numpy(), final, 48, 72, 0.5)
    assert [rle for segms in cls_segms for rle in segms] == expected
    assert sum(mask_util.area(rle) for rle in expected) > 0


@pytest.mark.parametrize('std_nms', [False, True])
def test_mask_branch_boxes_are_the_host_path_s_final_boxes(tiny_mask_model, std_nms, monkeypatch):
    """im_detect_all hands the mask head the detections as they leave NMS, on the model's device:
    the same boxes and classes as box_results_with_nms_and_limit gives on the host from the same
    decoded scores and boxes (numpy in, numpy out)."""
    model, image = tiny_mask_model
    decode = rcnn_inference.BoxDecodeParams(std_nms=std_nms)
    nms = rcnn_inference.NMSParams(std_nms=std_nms, score_thresh=0.0, detections_per_im=30)
    params = rcnn_inference.ImageParams(scale=64, max_size=96)
    recorded = []
    detect_masks = mask_inference.detect_masks

    def recording(model, features, boxes, classes, im_scale):
        recorded.append((boxes, classes))
        return detect_masks(model, features, boxes, classes, im_scale)

    monkeypatch.setattr(mask_inference, 'detect_masks', recording)
    cls_boxes, _ = rcnn_inference.im_detect_all(model, image, params, decode, nms, mask_thresh=0.5)
    (boxes, classes), = recorded
    assert isinstance(boxes, torch.Tensor) and boxes.device == rcnn_inference.model_device(model)
    scores, pred_boxes, confs, _ = rcnn_inference.detect_boxes(model, image, params, decode)
    _, host_boxes, host_cls_boxes = rcnn_inference.box_results_with_nms_and_limit(
        scores.cpu().numpy(), pred_boxes.cpu().numpy(), None if confs is None else confs.cpu().numpy(), nms)
    assert 0 < len(host_boxes) <= 30
    np.testing.assert_array_equal(boxes.cpu().numpy(), host_boxes)
    np.testing.assert_array_equal(classes.cpu().numpy(),
                                  np.repeat(np.arange(len(host_cls_boxes)), [len(b) for b in host_cls_boxes]))
    for got, expected in zip(cls_boxes, host_cls_boxes):
        np.testing.assert_array_equal(got, expected)
