"""FPN RPN: head layout/init, anchors, proposals and losses against Detectron transcriptions.

The numpy references below transcribe Detectron's ops/generate_proposals.py
(proposals_for_one_image, _filter_boxes), collect_and_distribute_fpn_rpn_proposals.collect,
utils/cython_nms.pyx nms, KL-Loss utils/boxes.py bbox_transform(_xyxy) and the Caffe2
SigmoidCrossEntropyLoss / SmoothL1Loss ops, step by step.
"""
import math

import numpy as np
import pytest
import torch

from detectron.modeling import rpn_heads
from detectron.modeling.generate_anchors import generate_anchors
from detectron.roi_data.rpn import RPNTargets

STRIDES = (4, 8, 16, 32, 64)
SIZES = (32, 64, 128, 256, 512)
# Detectron's FPN cell anchors per level (verified by running Detectron's generate_anchors).
DETECTRON_CELL_ANCHORS = [
    [[-22, -10, 25, 13], [-14, -14, 17, 17], [-10, -22, 13, 25]],
    [[-40, -20, 47, 27], [-28, -28, 35, 35], [-20, -44, 27, 51]],
    [[-84, -40, 99, 55], [-56, -56, 71, 71], [-36, -80, 51, 95]],
    [[-164, -72, 195, 103], [-112, -112, 143, 143], [-76, -168, 107, 199]],
    [[-332, -152, 395, 215], [-224, -224, 287, 287], [-148, -328, 211, 391]],
]
FEATURE_SHAPES = [(16, 20), (8, 10), (4, 5), (2, 3), (1, 2)]


# ------------------------------------------------------------------------------------------------
# numpy transcriptions of Detectron
# ------------------------------------------------------------------------------------------------

def np_shifted_anchors(cell_anchors, stride, height, width):
    """GenerateProposalsOp.forward: (K*A, 4) anchors, rows (H, W, A)."""
    shift_x = np.arange(0, width) * stride
    shift_y = np.arange(0, height) * stride
    shift_x, shift_y = np.meshgrid(shift_x, shift_y, copy=False)
    shifts = np.vstack((shift_x.ravel(), shift_y.ravel(), shift_x.ravel(), shift_y.ravel())).transpose()
    num_anchors = cell_anchors.shape[0]
    all_anchors = cell_anchors[np.newaxis, :, :] + shifts[:, np.newaxis, :]
    return all_anchors.reshape((shifts.shape[0] * num_anchors, 4)).astype(np.float32)


def np_bbox_transform(boxes, deltas, xyxy):
    """KL-Loss boxes.bbox_transform / bbox_transform_xyxy with weights (1, 1, 1, 1)."""
    boxes = boxes.astype(deltas.dtype, copy=False)
    widths = boxes[:, 2] - boxes[:, 0] + 1.0
    heights = boxes[:, 3] - boxes[:, 1] + 1.0
    pred = np.zeros(deltas.shape, dtype=deltas.dtype)
    if xyxy:
        clip = 1000. / 16.
        dl = np.maximum(np.minimum(deltas[:, 0::4], clip), -clip)
        dr = np.maximum(np.minimum(deltas[:, 1::4], clip), -clip)
        dd = np.maximum(np.minimum(deltas[:, 2::4], clip), -clip)
        du = np.maximum(np.minimum(deltas[:, 3::4], clip), -clip)
        pred[:, 0::4] = dl * widths[:, None] + boxes[:, 0][:, None]
        pred[:, 1::4] = dd * heights[:, None] + boxes[:, 1][:, None]
        pred[:, 2::4] = dr * widths[:, None] + boxes[:, 2][:, None]
        pred[:, 3::4] = du * heights[:, None] + boxes[:, 3][:, None]
        return pred
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    dx, dy = deltas[:, 0::4], deltas[:, 1::4]
    dw = np.minimum(deltas[:, 2::4], math.log(1000. / 16.))
    dh = np.minimum(deltas[:, 3::4], math.log(1000. / 16.))
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = np.exp(dw) * widths[:, None]
    pred_h = np.exp(dh) * heights[:, None]
    pred[:, 0::4] = pred_ctr_x - 0.5 * pred_w
    pred[:, 1::4] = pred_ctr_y - 0.5 * pred_h
    pred[:, 2::4] = pred_ctr_x + 0.5 * pred_w - 1
    pred[:, 3::4] = pred_ctr_y + 0.5 * pred_h - 1
    return pred


def np_nms(dets, thresh):
    """utils/cython_nms.pyx nms: greedy, suppress IoU >= thresh, survivors in ascending index order."""
    x1, y1, x2, y2, scores = dets[:, 0], dets[:, 1], dets[:, 2], dets[:, 3], dets[:, 4]
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    suppressed = np.zeros(len(dets), dtype=int)
    for _i in range(len(dets)):
        i = order[_i]
        if suppressed[i] == 1:
            continue
        for _j in range(_i + 1, len(dets)):
            j = order[_j]
            if suppressed[j] == 1:
                continue
            w = max(0.0, min(x2[i], x2[j]) - max(x1[i], x1[j]) + 1)
            h = max(0.0, min(y2[i], y2[j]) - max(y1[i], y1[j]) + 1)
            inter = w * h
            if inter / (areas[i] + areas[j] - inter) >= thresh:
                suppressed[j] = 1
    return np.where(suppressed == 0)[0]


def np_proposals_for_one_image(im_info, all_anchors, bbox_deltas, scores, pre_nms_top_n,
                               post_nms_top_n, nms_thresh, min_size, xyxy):
    bbox_deltas = bbox_deltas.transpose((1, 2, 0)).reshape((-1, 4))
    scores = scores.transpose((1, 2, 0)).reshape((-1, 1))
    if pre_nms_top_n <= 0 or pre_nms_top_n >= len(scores):
        order = np.argsort(-scores.squeeze())
    else:
        inds = np.argpartition(-scores.squeeze(), pre_nms_top_n)[:pre_nms_top_n]
        order = inds[np.argsort(-scores[inds].squeeze())]
    bbox_deltas, all_anchors, scores = bbox_deltas[order, :], all_anchors[order, :], scores[order]
    proposals = np_bbox_transform(all_anchors, bbox_deltas, xyxy)
    proposals[:, 0::4] = np.maximum(np.minimum(proposals[:, 0::4], im_info[1] - 1), 0)
    proposals[:, 1::4] = np.maximum(np.minimum(proposals[:, 1::4], im_info[0] - 1), 0)
    proposals[:, 2::4] = np.maximum(np.minimum(proposals[:, 2::4], im_info[1] - 1), 0)
    proposals[:, 3::4] = np.maximum(np.minimum(proposals[:, 3::4], im_info[0] - 1), 0)
    # _filter_boxes
    ws_orig = (proposals[:, 2] - proposals[:, 0]) / im_info[2] + 1
    hs_orig = (proposals[:, 3] - proposals[:, 1]) / im_info[2] + 1
    min_size = np.maximum(min_size, 1)
    ws = proposals[:, 2] - proposals[:, 0] + 1
    hs = proposals[:, 3] - proposals[:, 1] + 1
    x_ctr = proposals[:, 0] + ws / 2.
    y_ctr = proposals[:, 1] + hs / 2.
    keep = np.where((ws_orig >= min_size) & (hs_orig >= min_size)
                    & (x_ctr < im_info[1]) & (y_ctr < im_info[0]))[0]
    proposals, scores = proposals[keep, :], scores[keep]
    if nms_thresh > 0:
        keep = np_nms(np.hstack((proposals, scores)), nms_thresh)
        if post_nms_top_n > 0:
            keep = keep[:post_nms_top_n]
        proposals, scores = proposals[keep, :], scores[keep]
    return proposals, scores


def np_generate_proposals(logits, deltas, im_info, pre, post, nms_thresh, min_size, xyxy):
    """Per level GenerateProposals over the images of the batch, then collect (one call)."""
    level_rois, level_scores = [], []
    for lvl, (lvl_logits, lvl_deltas) in enumerate(zip(logits, deltas)):
        probs = 1. / (1. + np.exp(-lvl_logits))
        height, width = probs.shape[-2:]
        cell = generate_anchors(stride=STRIDES[lvl], sizes=(SIZES[lvl],), aspect_ratios=(0.5, 1, 2))
        all_anchors = np_shifted_anchors(cell, STRIDES[lvl], height, width)
        rois = np.empty((0, 5), dtype=np.float32)
        roi_scores = np.empty((0, 1), dtype=np.float32)
        for im_i in range(probs.shape[0]):
            boxes, scores = np_proposals_for_one_image(
                im_info[im_i], all_anchors, lvl_deltas[im_i], probs[im_i], pre, post,
                nms_thresh, min_size, xyxy)
            batch_inds = im_i * np.ones((boxes.shape[0], 1), dtype=np.float32)
            rois = np.append(rois, np.hstack((batch_inds, boxes)), axis=0)
            roi_scores = np.append(roi_scores, scores, axis=0)
        level_rois.append(rois)
        level_scores.append(roi_scores)
    rois = np.concatenate(level_rois)
    scores = np.concatenate(level_scores).squeeze(1)
    inds = np.argsort(-scores)[:post]
    return rois[inds, :], scores[inds]


def np_sigmoid_ce_sum(logits, labels):
    """Caffe2 SigmoidCrossEntropyLoss (normalize=0) before scale, element by element."""
    total = 0.0
    for x, t in zip(logits.ravel(), labels.ravel()):
        if t == -1:
            continue
        total += -x * (t - (x >= 0)) + math.log(1 + math.exp(x - 2 * x * (x >= 0)))
    return total


def np_smooth_l1_sum(pred, target, inside, outside, beta):
    """Caffe2 SmoothL1Loss before scale / N, element by element."""
    total = 0.0
    for p, t, wi, wo in zip(pred.ravel(), target.ravel(), inside.ravel(), outside.ravel()):
        val = wi * (p - t)
        total += wo * (0.5 * val * val / beta if abs(val) < beta else abs(val) - 0.5 * beta)
    return total


# ------------------------------------------------------------------------------------------------
# head
# ------------------------------------------------------------------------------------------------

def test_head_parameters_follow_detectron_blob_names_and_init():
    torch.manual_seed(0)
    head = rpn_heads.FPNRPNHead(dim_in=256, num_anchors=3)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes == {
        'conv_rpn.weight': (256, 256, 3, 3), 'conv_rpn.bias': (256,),
        'rpn_cls_logits.weight': (3, 256, 1, 1), 'rpn_cls_logits.bias': (3,),
        'rpn_bbox_pred.weight': (12, 256, 1, 1), 'rpn_bbox_pred.bias': (12,),
    }
    assert abs(head.conv_rpn.weight.std().item() - 0.01) < 0.0002
    assert abs(head.rpn_bbox_pred.weight.std().item() - 0.01) < 0.001
    for conv in (head.conv_rpn, head.rpn_cls_logits, head.rpn_bbox_pred):
        assert torch.all(conv.bias == 0)


def _np_conv(x, weight, bias, pad):
    """Plain cross-correlation (C, H, W) -> (O, H, W) with zero padding."""
    c, h, w = x.shape
    k = weight.shape[-1]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((weight.shape[0], h, w))
    for o in range(weight.shape[0]):
        for i in range(h):
            for j in range(w):
                out[o, i, j] = (xp[:, i:i + k, j:j + k] * weight[o]).sum() + bias[o]
    return out


def test_head_shares_one_set_of_weights_across_levels():
    torch.manual_seed(1)
    head = rpn_heads.FPNRPNHead(dim_in=2, num_anchors=3)
    for p in head.parameters():
        torch.nn.init.normal_(p)
    features = [torch.randn(1, 2, 3, 4), torch.randn(1, 2, 2, 2)]
    logits, deltas = head(features)
    w = {k: v.detach().double().numpy() for k, v in head.state_dict().items()}
    for feature, lvl_logits, lvl_deltas in zip(features, logits, deltas):
        hidden = np.maximum(_np_conv(feature[0].double().numpy(), w['conv_rpn.weight'],
                                     w['conv_rpn.bias'], 1), 0)
        expect_logits = _np_conv(hidden, w['rpn_cls_logits.weight'], w['rpn_cls_logits.bias'], 0)
        expect_deltas = _np_conv(hidden, w['rpn_bbox_pred.weight'], w['rpn_bbox_pred.bias'], 0)
        np.testing.assert_allclose(lvl_logits[0].detach().numpy(), expect_logits, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(lvl_deltas[0].detach().numpy(), expect_deltas, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# anchors
# ------------------------------------------------------------------------------------------------

def test_fpn_anchors_are_detectron_cell_anchors_shifted_in_hwa_order():
    anchors = rpn_heads.fpn_anchors(FEATURE_SHAPES)
    for lvl, ((height, width), level_anchors) in enumerate(zip(FEATURE_SHAPES, anchors)):
        assert level_anchors.shape == (height, width, 3, 4)
        assert level_anchors.dtype == torch.float32
        cell = np.array(DETECTRON_CELL_ANCHORS[lvl], dtype=np.float64)
        expected = np_shifted_anchors(cell, STRIDES[lvl], height, width)
        np.testing.assert_array_equal(level_anchors.reshape(-1, 4).numpy(), expected)
    # hand check: P3 cell (y=1, x=2), ratio 2 anchor = [-20, -44, 27, 51] + (16, 8, 16, 8)
    assert anchors[1][1, 2, 2].tolist() == [-4.0, -36.0, 43.0, 59.0]


def test_fpn_anchors_follow_the_requested_device_and_sizes():
    anchors = rpn_heads.fpn_anchors([(2, 2)], strides=(16,), sizes=(64,), aspect_ratios=(1,),
                                    device=torch.device('cpu'))
    # stride 16, size 64, ratio 1: base (0,0,15,15) scaled x4 around 7.5 -> [-24, -24, 39, 39]
    assert anchors[0].reshape(-1, 4).tolist() == [
        [-24, -24, 39, 39], [-8, -24, 55, 39], [-24, -8, 39, 55], [-8, -8, 55, 55]]



def test_fpn_anchors_are_made_once_per_level_shape():
    first = rpn_heads.fpn_anchors([(3, 4), (2, 2)], strides=(8, 16), sizes=(32, 64))
    second = rpn_heads.fpn_anchors([(3, 4), (5, 5)], strides=(8, 16), sizes=(32, 64))
    assert second[0] is first[0]  # the same level shape: the cached tensor, no new kernels
    assert second[1] is not first[1] and tuple(second[1].shape) == (5, 5, 3, 4)
    # the cached level is what a fresh computation gives: (y=2, x=3) of stride 8 = cell + (24, 16)
    cell = torch.as_tensor(rpn_heads.generate_anchors(stride=8, sizes=(32,), aspect_ratios=(0.5, 1, 2)))
    torch.testing.assert_close(second[0][2, 3], cell.float() + torch.tensor([24., 16., 24., 16.]), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# proposals
# ------------------------------------------------------------------------------------------------

def _random_rpn_outputs(seed, num_images=2, delta_scale=0.5):
    rng = np.random.RandomState(seed)
    logits = [rng.randn(num_images, 3, h, w).astype(np.float32) for h, w in FEATURE_SHAPES]
    deltas = [(delta_scale * rng.randn(num_images, 12, h, w)).astype(np.float32)
              for h, w in FEATURE_SHAPES]
    return logits, deltas


IM_INFO = np.array([[64., 80., 1.5], [50., 61., 0.8]], dtype=np.float32)


@pytest.mark.parametrize('xyxy', [False, True])
@pytest.mark.parametrize('pre,post,min_size', [(50, 40, 4), (0, 300, 0), (1000, 7, 10)])
def test_training_proposals_match_detectron_collected_over_the_batch(xyxy, pre, post, min_size):
    logits, deltas = _random_rpn_outputs(seed=pre + post)
    expected_rois, expected_scores = np_generate_proposals(
        logits, deltas, IM_INFO, pre, post, 0.7, min_size, xyxy)
    rois, scores = rpn_heads.generate_proposals(
        [torch.from_numpy(x) for x in logits], [torch.from_numpy(x) for x in deltas],
        rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.from_numpy(IM_INFO), pre, post, 0.7,
        min_size, xyxy=xyxy, collect_across_batch=True)
    assert rois.dtype == torch.float32 and rois.shape == expected_rois.shape
    np.testing.assert_allclose(rois.numpy(), expected_rois, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(scores.numpy(), expected_scores, rtol=1e-6)
    # collected over the batch: the cap is shared by both images
    assert len(rois) <= post


def _fixed_size_proposals(logits, deltas, im_info, pre, post, nms_thresh, min_size, xyxy=False):
    return rpn_heads.collected_proposals_fixed_size(
        [torch.as_tensor(x) for x in logits], [torch.as_tensor(x) for x in deltas],
        rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.as_tensor(im_info), pre, post, nms_thresh, min_size, xyxy=xyxy)


@pytest.mark.parametrize('xyxy', [False, True])
@pytest.mark.parametrize('pre,post,min_size', [(50, 40, 4), (0, 300, 0), (1000, 7, 10), (30, 2000, 8)])
def test_fixed_size_training_proposals_are_detectrons_then_padding(xyxy, pre, post, min_size):
    # (30, 2000, 8): fewer proposals survive than post_nms_top_n, so padding rows follow them.
    logits, deltas = _random_rpn_outputs(seed=pre + post)
    expected_rois, expected_scores = np_generate_proposals(logits, deltas, IM_INFO, pre, post, 0.7, min_size, xyxy)
    rois, scores, valid = _fixed_size_proposals(logits, deltas, IM_INFO, pre, post, 0.7, min_size, xyxy)
    candidates = sum(2 * min(pre if pre > 0 else h * w * 3, h * w * 3) for h, w in FEATURE_SHAPES)
    assert rois.shape == (min(post, candidates), 5) and valid.dtype == torch.bool
    num = len(expected_rois)
    assert valid[:num].all() and not valid[num:].any()
    np.testing.assert_allclose(rois[:num].numpy(), expected_rois, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(scores[:num].numpy(), expected_scores, rtol=1e-6)
    assert rois[num:].abs().sum() == 0 and scores[num:].abs().sum() == 0
    if post == 2000:
        assert num < post  # the case meant to pad


def test_fixed_size_proposals_order_equal_scores_as_generate_proposals():
    # Saturated logits give equal scores (1.0 in float32) on many anchors: the order among them
    # (which then decides the collected cap) must be generate_proposals' own.
    logits, deltas = _random_rpn_outputs(seed=11)
    for level in logits:
        level[:, :, ::2, :] = 40.0
    args = ([torch.from_numpy(x) for x in logits], [torch.from_numpy(x) for x in deltas],
            rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.from_numpy(IM_INFO), 200, 60, 0.7, 2)
    expected_rois, expected_scores = rpn_heads.generate_proposals(*args, collect_across_batch=True)
    rois, scores, valid = rpn_heads.collected_proposals_fixed_size(*args)
    assert (expected_scores == 1.0).sum() > 10 and valid.all()
    assert torch.equal(rois, expected_rois) and torch.equal(scores, expected_scores)


def test_fixed_size_proposals_without_nms_or_cap():
    logits, deltas = _random_rpn_outputs(seed=4, num_images=1)
    expected_rois, _ = np_generate_proposals(logits, deltas, IM_INFO[:1], 30, 1000, 0.0, 0, False)
    rois, _, valid = _fixed_size_proposals(logits, deltas, IM_INFO[:1], 30, 1000, 0.0, 0)
    assert len(rois) == 114 and valid.all()  # 30 + 30 + 30 + 18 + 6, every one
    np.testing.assert_allclose(rois.numpy(), expected_rois, rtol=1e-5, atol=1e-3)
    # post_nms_top_n 0: no cap (generate_proposals' reading; Detectron's collect would keep nothing)
    rois, _, valid = _fixed_size_proposals(logits, deltas, IM_INFO[:1], 30, 0, 0.7, 0)
    expected_rois, _ = rpn_heads.generate_proposals(
        [torch.from_numpy(x) for x in logits], [torch.from_numpy(x) for x in deltas],
        rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.from_numpy(IM_INFO[:1]), 30, 0, 0.7, 0,
        collect_across_batch=True)
    assert len(rois) == 114 and 0 < int(valid.sum()) == len(expected_rois) < 114
    assert torch.equal(rois[valid], expected_rois)


def test_test_proposals_are_collected_per_image():
    logits, deltas = _random_rpn_outputs(seed=3)
    rois, scores = rpn_heads.generate_proposals(
        [torch.from_numpy(x) for x in logits], [torch.from_numpy(x) for x in deltas],
        rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.from_numpy(IM_INFO), 100, 20, 0.7, 0,
        collect_across_batch=False)
    expected = []
    for im_i in range(2):
        # Detectron tests one image per batch
        im_rois, im_scores = np_generate_proposals(
            [x[im_i:im_i + 1] for x in logits], [x[im_i:im_i + 1] for x in deltas],
            IM_INFO[im_i:im_i + 1], 100, 20, 0.7, 0, xyxy=False)
        im_rois[:, 0] = im_i
        expected.append(im_rois)
    expected = np.concatenate(expected)
    assert (rois[:, 0] == 0).sum() == 20 and (rois[:, 0] == 1).sum() == 20
    np.testing.assert_allclose(rois.numpy(), expected, rtol=1e-5, atol=1e-3)
    assert torch.all(scores[:20].diff() <= 0) and torch.all(scores[20:].diff() <= 0)


def test_proposals_without_nms_keep_every_valid_box():
    logits, deltas = _random_rpn_outputs(seed=4, num_images=1)
    expected_rois, _ = np_generate_proposals(logits, deltas, IM_INFO[:1], 30, 1000, 0.0, 0, False)
    rois, _ = rpn_heads.generate_proposals(
        [torch.from_numpy(x) for x in logits], [torch.from_numpy(x) for x in deltas],
        rpn_heads.fpn_anchors(FEATURE_SHAPES), torch.from_numpy(IM_INFO[:1]), 30, 1000, 0.0, 0,
        collect_across_batch=True)
    # levels with fewer than 30 anchors contribute all of theirs: 30 + 30 + 30 + 18 + 6
    assert len(rois) == len(expected_rois) == 114
    np.testing.assert_allclose(rois.numpy(), expected_rois, rtol=1e-5, atol=1e-3)


def test_min_size_is_measured_in_original_pixels():
    # One anchor of one level, deltas 0: the P2 ratio-1 anchor at (0,0) clipped to the image is
    # [0, 0, 17, 17]; its width in original pixels is 17 / scale + 1.
    logits = [torch.tensor([[[[-5.]], [[5.]], [[-5.]]]])]
    deltas = [torch.zeros(1, 12, 1, 1)]
    anchors = rpn_heads.fpn_anchors([(1, 1)], strides=(4,), sizes=(32,))
    for scale, min_size, kept in ((2.0, 9.5, True), (2.0, 9.6, False), (0.5, 35, True)):
        im_info = torch.tensor([[40., 40., scale]])
        rois, _ = rpn_heads.generate_proposals(logits, deltas, anchors, im_info, 1, 10, 0.7,
                                               min_size, collect_across_batch=True)
        assert (len(rois) == 1) == kept
        if kept:
            assert rois.tolist() == [[0., 0., 0., 17., 17.]]


# ------------------------------------------------------------------------------------------------
# losses
# ------------------------------------------------------------------------------------------------

def test_rpn_losses_use_detectron_normalisations():
    rng = np.random.RandomState(5)
    shapes = [(2, 2), (1, 1)]
    num_images, num_cell_anchors = 2, 1
    logits = [rng.randn(num_images, num_cell_anchors, h, w).astype(np.float32) for h, w in shapes]
    deltas = [rng.randn(num_images, 4, h, w).astype(np.float32) * 0.3 for h, w in shapes]
    labels = [np.array([[[[1, 0], [-1, 0]]], [[[-1, -1], [0, 1]]]]), np.array([[[[0]]], [[[1]]]])]
    targets = [rng.randn(num_images, 4, h, w).astype(np.float32) * 0.3 for h, w in shapes]
    inside = [np.repeat((l == 1).astype(np.float32), 4, axis=1) for l in labels]
    # outside = 1 / labelled anchors of the image over both levels: image 0 has 4, image 1 has 3
    per_image = np.array([1 / 4., 1 / 3.], dtype=np.float32).reshape(2, 1, 1, 1)
    outside = [np.repeat((l >= 0).astype(np.float32), 4, axis=1) * per_image for l in labels]
    rpn_t = RPNTargets(*[[torch.from_numpy(x) for x in blobs]
                         for blobs in (labels, targets, inside, outside)])
    losses = rpn_heads.rpn_losses([torch.from_numpy(x) for x in logits],
                                  [torch.from_numpy(x) for x in deltas], rpn_t,
                                  ims_per_batch=2, batch_size_per_im=8)
    assert sorted(losses) == ['loss_rpn_bbox_fpn2', 'loss_rpn_bbox_fpn3',
                              'loss_rpn_cls_fpn2', 'loss_rpn_cls_fpn3']
    for i, level in enumerate((2, 3)):
        expected_cls = np_sigmoid_ce_sum(logits[i], labels[i]) / (8 * 2)
        expected_bbox = np_smooth_l1_sum(deltas[i], targets[i], inside[i], outside[i], 1 / 9.) / 2
        assert losses['loss_rpn_cls_fpn%d' % level].item() == pytest.approx(expected_cls, rel=1e-5)
        assert losses['loss_rpn_bbox_fpn%d' % level].item() == pytest.approx(expected_bbox, rel=1e-5)


def test_rpn_bbox_loss_hand_value():
    # one fg anchor, one coordinate off by 0.05 (< beta = 1/9) and one by 0.5 (> beta):
    # 0.5 * 0.05^2 * 9 + (0.5 - 0.5 / 9) = 0.01125 + 0.444444, outside weight 1/2, 1 image.
    deltas = torch.tensor([0.05, 0.5, 0., 0.]).view(1, 4, 1, 1)
    rpn_t = RPNTargets([torch.ones(1, 1, 1, 1, dtype=torch.long)], [torch.zeros(1, 4, 1, 1)],
                       [torch.ones(1, 4, 1, 1)], [torch.full((1, 4, 1, 1), 0.5)])
    losses = rpn_heads.rpn_losses([torch.zeros(1, 1, 1, 1)], [deltas], rpn_t, ims_per_batch=1,
                                  batch_size_per_im=256)
    assert losses['loss_rpn_bbox_fpn2'].item() == pytest.approx(0.5 * (0.01125 + 0.5 - 0.5 / 9))
    assert losses['loss_rpn_cls_fpn2'].item() == pytest.approx(math.log(2) / 256)


def test_proposal_decode_clamps_at_the_given_clips():
    # KL-Loss's proposal decode reads BBOX_XFORM_CLIPe (XYXY edges) from its cfg: a huge edge delta
    # moves the edge by clip x width.
    anchors = [torch.tensor([[[[100., 100., 139., 139.]]]])]   # (H, W, A, 4): one 40 px anchor
    logits = [torch.zeros(1, 1, 1, 1)]
    deltas = [torch.tensor([50., 0., 0., 0.]).view(1, 4, 1, 1)]   # x1 edge by +50 widths
    im_info = torch.tensor([[1000., 1000., 1.]])
    for clip in (0.25, 0.5):
        rois, _ = rpn_heads.generate_proposals(logits, deltas, anchors, im_info, 0, 0, 0.0, 0.0, xyxy=True,
                                               collect_across_batch=False, clips=(4.0, clip))
        assert rois[0, 1].item() == 100. + clip * 40.
