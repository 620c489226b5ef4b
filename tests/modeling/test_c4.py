"""Detectron's C4 models (conv4 body, single-scale RPN, res5 RoI head, v0upshare mask head) and the R-152
FPN body, against independent computations of Detectron's formulas."""
import math
import os

import numpy as np
import pytest
import torch
from torchvision.ops import roi_align

from detectron.core.config import (assert_and_infer_cfg, cfg, load_yaml_file, merge_cfg_from_cfg, merge_cfg_from_file,
                                   merge_cfg_from_list)
from detectron.modeling import FPN, generalized_rcnn, mask_rcnn_heads, model_builder, rcnn_builder, rpn_heads
from detectron.modeling.ResNet import ResNetRoIConv5Head, add_ResNet50_conv4_body
from detectron.modeling.mask_rcnn_heads import MaskRCNNHead
from detectron.ops.roi_pooling import single_level_roi_transform
from detectron.roi_data.minibatch import gt_targets
from detectron.utils.errors import ConfigValueError

BASELINES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'configs',
                         '12_2017_baselines')
# The shipped configs shrunk for the CPU: a narrow bottleneck (RESNETS.WIDTH_PER_GROUP) and few RoIs.
SMALL = ['MODEL.NUM_CLASSES', '4', 'RESNETS.WIDTH_PER_GROUP', '4', 'TRAIN.BATCH_SIZE_PER_IM', '8',
         'TRAIN.RPN_PRE_NMS_TOP_N', '100', 'TRAIN.RPN_POST_NMS_TOP_N', '30', 'TEST.RPN_PRE_NMS_TOP_N', '100',
         'TEST.RPN_POST_NMS_TOP_N', '20', 'MRCNN.DIM_REDUCED', '8', 'TRAIN.WEIGHTS', '', 'NUM_GPUS', '1']


def _model(config, *opts):
    merge_cfg_from_file(os.path.join(BASELINES, config))
    merge_cfg_from_list(SMALL + list(opts))
    assert_and_infer_cfg()
    return model_builder.create(cfg)


# ---- Detectron's generate_anchors, written out from its formulas (modeling/generate_anchors.py) ----

def _whctrs(anchor):
    w, h = anchor[2] - anchor[0] + 1, anchor[3] - anchor[1] + 1
    return w, h, anchor[0] + 0.5 * (w - 1), anchor[1] + 0.5 * (h - 1)


def _mkanchors(ws, hs, x_ctr, y_ctr):
    ws, hs = ws[:, None], hs[:, None]
    return np.hstack((x_ctr - 0.5 * (ws - 1), y_ctr - 0.5 * (hs - 1), x_ctr + 0.5 * (ws - 1), y_ctr + 0.5 * (hs - 1)))


def _detectron_anchors(stride, sizes, ratios):
    base = np.array([1, 1, stride, stride], dtype=float) - 1
    w, h, x_ctr, y_ctr = _whctrs(base)
    ws = np.round(np.sqrt(w * h / np.array(ratios, dtype=float)))
    by_ratio = _mkanchors(ws, np.round(ws * np.array(ratios, dtype=float)), x_ctr, y_ctr)
    scales = np.array(sizes, dtype=float) / stride
    rows = []
    for anchor in by_ratio:
        w, h, x_ctr, y_ctr = _whctrs(anchor)
        rows.append(_mkanchors(w * scales, h * scales, x_ctr, y_ctr))
    return np.vstack(rows)


def test_c4_anchors_are_detectrons_field_of_anchors_on_the_res4_map():
    body = add_ResNet50_conv4_body(width_per_group=4).eval()
    with torch.no_grad():
        (res4,) = body(torch.zeros(1, 3, 100, 150))
    height, width = res4.shape[-2:]
    assert (height, width) == (math.ceil(100 / 16), math.ceil(150 / 16)) and res4.shape[1] == body.out_channels == 1024
    sizes, ratios = (32, 64, 128, 256, 512), (0.5, 1, 2)
    (anchors,) = rpn_heads.fpn_anchors([(height, width)], (16,), (sizes,), ratios)
    cell = _detectron_anchors(16, sizes, ratios)
    shift_x, shift_y = np.meshgrid(np.arange(width) * 16, np.arange(height) * 16)
    shifts = np.stack((shift_x.ravel(), shift_y.ravel(), shift_x.ravel(), shift_y.ravel()), axis=1)
    expected = (cell[None] + shifts[:, None]).reshape(-1, 4)
    assert anchors.reshape(-1, 4).shape == (7 * 10 * 15, 4)
    np.testing.assert_array_equal(anchors.reshape(-1, 4).numpy(), expected.astype(np.float32))


def test_the_c4_config_builds_one_rpn_level_with_every_size():
    model = _model('e2e_faster_rcnn_R-50-C4_1x.yaml')
    p = model.params
    assert p.single_scale_rpn and p.anchor_strides == (16,) and p.anchor_sizes == ((32, 64, 128, 256, 512),)
    assert p.roi_spatial_scales == (1 / 16,) and p.roi_xform_method == 'RoIAlign' and p.roi_resolution == 14
    assert model.rpn.rpn_cls_logits.out_channels == 15 and model.rpn.conv_rpn.in_channels == 1024
    assert isinstance(model.box_head, ResNetRoIConv5Head) and model.box_outs.cls_score.in_features == 2048
    assert not hasattr(model.conv_body.body, 'res5')


def test_res5_head_strides_its_first_block_by_roi_size_over_7_and_pools_to_2048():
    for roi_size, stride in ((14, 2), (7, 1)):
        head = ResNetRoIConv5Head(64, roi_size=roi_size, width_per_group=2).eval()
        assert head.res5[0].branch2a.stride == (stride, stride) and head.res5[0].branch1.stride == (stride, stride)
        assert [b.has_projection for b in head.res5] == [True, False, False]
        x = torch.randn(3, 64, roi_size, roi_size)
        with torch.no_grad():
            conv5, pooled = head.conv5(x), head(x)
        assert conv5.shape == (3, 2048, 7, 7) and pooled.shape == (3, 2048)
        torch.testing.assert_close(pooled, conv5.mean(dim=(2, 3)))
    with pytest.raises(ConfigValueError, match='multiple of 7'):
        ResNetRoIConv5Head(64, roi_size=10)


def _caffe2_roi_pool(feature, rois, size, scale):
    """Caffe2's RoIPoolF: bins over the RoI rounded to the map (half away from zero), max of each, 0 if empty."""
    _, channels, height, width = feature.shape
    out = np.zeros((len(rois), channels, size, size), np.float32)
    for r, (b, *box) in enumerate(rois):
        x1, y1, x2, y2 = (math.floor(v * scale + 0.5) for v in box)
        bin_h, bin_w = max(y2 - y1 + 1, 1) / size, max(x2 - x1 + 1, 1) / size
        for ph in range(size):
            for pw in range(size):
                h0 = min(max(math.floor(ph * bin_h) + y1, 0), height)
                h1 = min(max(math.ceil((ph + 1) * bin_h) + y1, 0), height)
                w0 = min(max(math.floor(pw * bin_w) + x1, 0), width)
                w1 = min(max(math.ceil((pw + 1) * bin_w) + x1, 0), width)
                if h1 > h0 and w1 > w0:
                    out[r, :, ph, pw] = feature[int(b), :, h0:h1, w0:w1].max(axis=(1, 2))
    return out


def test_single_level_transform_pools_with_roipoolf_or_roialign():
    rng = np.random.RandomState(3)
    feature = rng.randn(2, 3, 9, 11).astype(np.float32)
    rois = np.array([[0, 3.0, 5.0, 90.0, 60.0], [1, 20.0, 8.0, 41.0, 130.0], [1, 150.0, 120.0, 170.0, 140.0]],
                    np.float32)
    pooled = single_level_roi_transform(torch.from_numpy(feature), torch.from_numpy(rois), 'RoIPoolF', 1 / 16, 4, 0)
    np.testing.assert_allclose(pooled.numpy(), _caffe2_roi_pool(feature, rois, 4, 1 / 16), rtol=0, atol=0)
    aligned = single_level_roi_transform(torch.from_numpy(feature), torch.from_numpy(rois), 'RoIAlign', 1 / 16, 4, 0)
    expected = roi_align(torch.from_numpy(feature), torch.from_numpy(rois), 4, 1 / 16, 0, aligned=False)
    torch.testing.assert_close(aligned, expected, rtol=0, atol=0)
    assert not torch.allclose(aligned, pooled)


@pytest.mark.parametrize('method', ['RoIPoolF', 'RoIAlign'])
def test_the_box_head_pools_with_fast_rcnn_roi_xform_method(method):
    torch.manual_seed(0)
    model = _model('e2e_faster_rcnn_R-50-C4_1x.yaml', 'FAST_RCNN.ROI_XFORM_METHOD', method).eval()
    features = [torch.randn(1, 1024, 6, 8)]
    rois = torch.tensor([[0, 3.0, 5.0, 90.0, 60.0], [0, 20.0, 8.0, 41.0, 80.0]])
    feature = features[0].numpy()
    if method == 'RoIPoolF':
        pooled = torch.from_numpy(_caffe2_roi_pool(feature, rois.numpy(), 14, 1 / 16))
    else:
        pooled = roi_align(features[0], rois, 14, 1 / 16, 0, aligned=False)
    with torch.no_grad():
        out = model._box_outputs(features, rois)
        expected = model.box_outs(model.box_head(pooled))
    torch.testing.assert_close(out['cls_prob'], expected['cls_prob'])
    torch.testing.assert_close(out['bbox_pred'], expected['bbox_pred'])


def _mask_targets():
    square = [[20, 30, 60, 30, 60, 62, 20, 62]]
    triangle = [[40, 10, 90, 60, 10, 60]]
    return [gt_targets({'boxes': np.array([[20.0, 30, 59, 61]]), 'gt_classes': np.array([1]),
                        'is_crowd': np.array([False]), 'segms': [square]}),
            gt_targets({'boxes': np.array([[10.0, 10, 89, 59]]), 'gt_classes': np.array([3]),
                        'is_crowd': np.array([False]), 'segms': [triangle]})]


def test_the_v0upshare_mask_head_runs_on_the_box_heads_res5():
    torch.manual_seed(0)
    model = _model('e2e_mask_rcnn_R-50-C4_1x.yaml')
    head = model.mask_head
    assert isinstance(head, MaskRCNNHead) and head.num_convs == 0
    assert sorted(n for n, _ in head.named_parameters()) == [
        'conv5_mask.bias', 'conv5_mask.weight', 'mask_fcn_logits.bias', 'mask_fcn_logits.weight']
    assert head.conv5_mask.in_channels == 2048 and head.conv5_mask.out_channels == 8
    model.eval()
    features = [torch.randn(1, 1024, 6, 8)]
    rois = torch.tensor([[0, 3.0, 5.0, 90.0, 60.0], [0, 20.0, 8.0, 41.0, 80.0]])
    with torch.no_grad():
        logits = model.mask_logits(features, rois)
        # MRCNN.ROI_XFORM_*: RoIAlign at 14 with the adaptive grid (sampling ratio 0), then the box head's res5.
        expected = head(model.box_head.conv5(roi_align(features[0], rois, 14, 1 / 16, 0, aligned=False)))
        assert logits.shape == (2, 4, 14, 14)
        torch.testing.assert_close(logits, expected)
        model.box_head.res5[2].branch2c.weight.mul_(2)  # one set of res5 weights: the masks follow the box head's
        assert not torch.allclose(model.mask_logits(features, rois), logits)


def test_the_v0upshare_mask_loss_trains_the_shared_res5_on_the_fg_rois():
    torch.manual_seed(0)
    model = _model('e2e_mask_rcnn_R-50-C4_1x.yaml').train()
    images, im_info = torch.randn(2, 3, 64, 96), torch.tensor([[64.0, 96.0, 1.0], [64.0, 96.0, 1.0]])
    losses = model(images, im_info, _mask_targets())
    assert set(losses) == {'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'accuracy_cls', 'loss_mask'}
    losses['loss_mask'].backward()
    assert model.box_head.res5[0].branch2a.weight.grad.abs().sum() > 0
    assert model.box_outs.cls_score.weight.grad is None  # the mask loss reaches res5, not the box outputs


def test_single_scale_rpn_losses_average_over_labelled_anchors():
    # Detectron's add_single_scale_rpn_losses: SigmoidCrossEntropyLoss (normalize=1) and SmoothL1Loss / images.
    rng = np.random.RandomState(0)
    logits = rng.randn(2, 3, 4, 5).astype(np.float32)
    labels = rng.randint(-1, 2, size=logits.shape)
    deltas = rng.randn(2, 12, 4, 5).astype(np.float32)
    targets = rng.randn(*deltas.shape).astype(np.float32)
    inside = rng.randint(0, 2, size=deltas.shape).astype(np.float32)
    outside = rng.rand(*deltas.shape).astype(np.float32)
    rpn_t = type('T', (), {'labels': [torch.from_numpy(labels)], 'bbox_targets': [torch.from_numpy(targets)],
                           'bbox_inside_weights': [torch.from_numpy(inside)],
                           'bbox_outside_weights': [torch.from_numpy(outside)]})
    losses = rpn_heads.single_scale_rpn_losses([torch.from_numpy(logits)], [torch.from_numpy(deltas)], rpn_t)
    valid = labels >= 0
    ce = np.maximum(logits, 0) - logits * (labels == 1) + np.log1p(np.exp(-np.abs(logits)))
    np.testing.assert_allclose(losses['loss_rpn_cls'].item(), ce[valid].sum() / valid.sum(), rtol=1e-5)
    x = np.abs(inside * (deltas - targets))
    smooth = np.where(x < 1 / 9, 0.5 * x * x * 9, x - 0.5 / 9)
    np.testing.assert_allclose(losses['loss_rpn_bbox'].item(), (outside * smooth).sum() / 2, rtol=1e-5)


def test_c4_rpn_keeps_each_images_proposals():
    # GenerateProposals per image, without FPN's collect over the batch (Detectron's single-scale RPN in training).
    model = _model('e2e_faster_rcnn_R-50-C4_1x.yaml', 'TRAIN.RPN_POST_NMS_TOP_N', '5')
    logits = [torch.randn(2, 15, 4, 6)]
    deltas = [torch.zeros(2, 60, 4, 6)]
    anchors = rpn_heads.fpn_anchors([(4, 6)], (16,), ((32, 64, 128, 256, 512),), (0.5, 1, 2))
    im_info = torch.tensor([[64.0, 96.0, 1.0], [64.0, 96.0, 1.0]])
    rois, valid = model._proposals(logits, deltas, anchors, im_info, model.params.train_proposals, training=True)
    assert valid is None
    assert [(rois[:, 0] == i).sum().item() for i in (0, 1)] == [5, 5]


@pytest.mark.parametrize('config, opts, message', [
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', ['RPN.STRIDE', '8'], 'RPN.STRIDE 8 must be'),
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', ['FAST_RCNN.ROI_BOX_HEAD', 'fast_rcnn_heads.add_roi_2mlp_head'],
     "FAST_RCNN.ROI_BOX_HEAD 'fast_rcnn_heads.add_roi_2mlp_head' does not fit"),
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', ['FAST_RCNN.ROI_XFORM_METHOD', 'RoIWarp'], "ROI_XFORM_METHOD 'RoIWarp'"),
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', ['FPN.MULTILEVEL_ROIS', 'True'], 'is a conv4 body'),
    ('e2e_faster_rcnn_R-50-C4_1x.yaml', ['TRAIN.FREEZE_AT', '5'], 'TRAIN.FREEZE_AT must be one of'),
    ('e2e_mask_rcnn_R-50-C4_1x.yaml', ['MRCNN.ROI_XFORM_RESOLUTION', '7'], 'MRCNN.ROI_XFORM_RESOLUTION 7 must equal'),
    ('e2e_mask_rcnn_R-50-C4_1x.yaml', ['MRCNN.RESOLUTION', '28'], 'MRCNN.RESOLUTION 28 must be 14'),
    ('e2e_mask_rcnn_R-50-C4_1x.yaml', ['MRCNN.ROI_MASK_HEAD', 'mask_rcnn_heads.mask_rcnn_fcn_head_v1up4convs'],
     'is not supported on a conv4 body'),
])
def test_c4_refusals_name_the_key(config, opts, message):
    with pytest.raises(ConfigValueError, match=message):
        _model(config, *opts)


def test_rpn_sizes_are_refused_with_fpn():
    merge_cfg_from_file(os.path.join(os.path.dirname(BASELINES), 'e2e_faster_rcnn_R-50-FPN_2x.yaml'))
    merge_cfg_from_list(['RPN.SIZES', '(16, 32)'])
    with pytest.raises(ConfigValueError, match='RPN.SIZES .* is not acted on with FPN.FPN_ON'):
        assert_and_infer_cfg()


def test_x152_fpn_body_has_detectrons_block_counts_and_resnext_groups():
    body = FPN.add_fpn_ResNet152_conv5_body(num_groups=32, width_per_group=1, stride_1x1=False, fpn_dim=16)
    assert [len(getattr(body.body, s)) for s in ('res2', 'res3', 'res4', 'res5')] == [3, 8, 36, 3]
    block = body.body.res4[0]
    assert block.branch2b.groups == 32 and block.branch2b.out_channels == 32 * 1 * 4
    assert block.branch2a.stride == (1, 1) and block.branch2b.stride == (2, 2)


def test_x152_config_builds_without_test_time_augmentation():
    # The shipped file also asks for TEST.BBOX_AUG / MASK_AUG (issue 47 item 4, refused until then): without them
    # it builds.
    values = load_yaml_file(os.path.join(BASELINES, 'e2e_mask_rcnn_X-152-32x8d-FPN-IN5k_1.44x.yaml'))
    del values['TEST']['BBOX_AUG'], values['TEST']['MASK_AUG']
    merge_cfg_from_cfg(values)
    merge_cfg_from_list(['RESNETS.WIDTH_PER_GROUP', '1', 'FPN.DIM', '8', 'FAST_RCNN.MLP_HEAD_DIM', '8',
                         'MRCNN.DIM_REDUCED', '8', 'NUM_GPUS', '1'])
    assert_and_infer_cfg()
    model = model_builder.create(cfg)
    assert len(model.conv_body.body.res4) == 36 and model.conv_body.body.res4[0].branch2b.groups == 32
    assert model.conv_body.fpn_inner[2].in_channels == 1024 and model.mask_head.num_convs == 4


def test_v0upshare_training_logits_are_the_res5_map_of_the_mask_rois(monkeypatch):
    # Detectron's SampleAs on res5_2_sum: the same logits as pooling the mask RoIs again through the shared res5.
    torch.manual_seed(0)
    model = _model('e2e_mask_rcnn_R-50-C4_1x.yaml').train()
    seen = {}
    original_targets, original_loss = generalized_rcnn.mask_targets, mask_rcnn_heads.mask_loss
    monkeypatch.setattr(generalized_rcnn, 'mask_targets',
                        lambda *a, **k: seen.setdefault('targets', original_targets(*a, **k)))
    monkeypatch.setattr(mask_rcnn_heads, 'mask_loss', lambda logits, *a, **k: (
        seen.setdefault('logits', logits), original_loss(logits, *a, **k))[1])
    model.conv_body.register_forward_hook(lambda module, args, out: seen.setdefault('features', out))
    images, im_info = torch.randn(2, 3, 64, 96), torch.tensor([[64.0, 96.0, 1.0], [64.0, 96.0, 1.0]])
    model(images, im_info, _mask_targets())
    targets = seen['targets']
    assert len(targets.rows) > 0
    with torch.no_grad():
        torch.testing.assert_close(seen['logits'], model.mask_logits(seen['features'], targets.rois))


def test_the_kl_head_sits_on_the_res5_head():
    torch.manual_seed(0)
    model = _model('e2e_faster_rcnn_R-50-C4_1x.yaml', 'PRED_STD', 'True', 'PRED_STD_LOG', 'True', 'XYXY', 'True').train()
    assert model.box_outs.bbox_pred_std.in_features == 2048 and model.box_outs.bbox_pred_std.out_features == 16
    targets = [{k: v for k, v in t.items() if not k.startswith('segm')} for t in _mask_targets()]
    losses = model(torch.randn(2, 3, 64, 96), torch.tensor([[64.0, 96.0, 1.0], [64.0, 96.0, 1.0]]), targets)
    losses['loss_bbox'].backward()
    assert torch.isfinite(losses['loss_bbox']) and model.box_outs.bbox_pred_std.weight.grad.abs().sum() > 0


def test_c4_images_are_not_padded_to_a_stride():
    # Detectron's get_max_shape pads to FPN.COARSEST_STRIDE only with FPN.
    merge_cfg_from_file(os.path.join(BASELINES, 'e2e_faster_rcnn_R-50-C4_1x.yaml'))
    merge_cfg_from_list(['NUM_GPUS', '1'])
    assert_and_infer_cfg()
    model_type = model_builder.build_model_type(cfg)
    assert model_type.collate(torch.device('cpu')).keywords['stride'] == 1
    assert rcnn_builder.image_params(cfg).stride == 1
