"""Mask R-CNN head (Detectron's v1up4convs and _gn), its loss, and the model's mask_logits contract."""
import math
import os

import numpy as np
import torch
import torchvision

from detectron.core.config import (
    assert_and_infer_cfg,
    cfg,
    merge_cfg_from_file,
    merge_cfg_from_list,
)
from detectron.modeling import model_builder
from detectron.modeling.fast_rcnn_heads import RoiXConv1FCGNHead
from detectron.modeling.mask_rcnn_heads import MaskRCNNHead, mask_loss
from detectron.modeling.norm import group_norm_groups
from detectron.roi_data.minibatch import gt_targets

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'configs')


def _groups(dim):
    return group_norm_groups(dim, 32, -1)


def test_v1up4convs_layers_and_output_shape():
    head = MaskRCNNHead(256, num_outputs=81)
    names = [n for n, _ in head.named_parameters()]
    assert names == ['fcn1.weight', 'fcn1.bias', 'fcn2.weight', 'fcn2.bias', 'fcn3.weight', 'fcn3.bias',
                     'fcn4.weight', 'fcn4.bias', 'conv5_mask.weight', 'conv5_mask.bias',
                     'mask_fcn_logits.weight', 'mask_fcn_logits.bias']
    assert head(torch.zeros(3, 256, 14, 14)).shape == (3, 81, 28, 28)
    # MSRAFill: std sqrt(2 / fan_out), fan_out = 256 * 3 * 3 for fcn*, 256 * 2 * 2 for the deconv (in x k x k)
    assert abs(head.fcn2.weight.std().item() - math.sqrt(2 / (256 * 9))) < 0.02 * math.sqrt(2 / (256 * 9))
    assert abs(head.conv5_mask.weight.std().item() - math.sqrt(2 / (256 * 4))) < 0.02 * math.sqrt(2 / 1024)
    assert head.fcn1.bias.abs().sum() == 0 and head.conv5_mask.bias.abs().sum() == 0


def test_gn_variant_has_no_conv_bias_and_a_groupnorm_per_conv():
    head = MaskRCNNHead(64, num_outputs=1, dim_reduced=64, use_gn=True, gn_groups=_groups)
    names = [n for n, _ in head.named_parameters()]
    assert names[:3] == ['fcn1.weight', 'fcn1_gn.weight', 'fcn1_gn.bias']
    assert head.fcn4_gn.num_groups == 32 and head.fcn1.bias is None
    x = torch.randn(2, 64, 14, 14)
    expected = x
    for i in range(1, 5):
        conv, gn = getattr(head, f'fcn{i}'), getattr(head, f'fcn{i}_gn')
        expected = torch.relu(torch.nn.functional.group_norm(conv(expected), 32, gn.weight, gn.bias, 1e-5))
    expected = head.mask_fcn_logits(torch.relu(head.conv5_mask(expected)))
    torch.testing.assert_close(head(x), expected)
    # class-agnostic logits: GaussianFill std 0.001 whatever CONV_INIT (Detectron's add_mask_rcnn_outputs)
    assert head.mask_fcn_logits.weight.std().item() < 0.002


def test_gn_box_head_names_and_shape():
    head = RoiXConv1FCGNHead(32, roi_size=7, conv_dim=64, num_convs=4, hidden_dim=128, gn_groups=_groups)
    names = [n for n, _ in head.named_parameters()]
    assert names == [p for i in range(1, 5) for p in (f'head_conv{i}.weight', f'head_conv{i}_gn.weight',
                                                      f'head_conv{i}_gn.bias')] + ['fc6.weight', 'fc6.bias']
    assert head(torch.zeros(5, 32, 7, 7)).shape == (5, 128)
    assert head.dim_out == 128


def test_mask_loss_equals_detectron_class_specific_sigmoid_cross_entropy():
    rng = np.random.RandomState(0)
    logits = rng.randn(3, 4, 5, 5).astype(np.float32) * 3
    classes = np.array([2, 1, 0])
    targets = rng.randint(0, 2, (3, 5, 5)).astype(np.int8)
    targets[2] = -1  # Detectron's all-ignored row (no fg RoI in an image)
    targets[0, 0, :3] = -1
    # Detectron's blob: targets spread over every class channel, -1 outside the RoI's class
    # (class 0 leaves the whole row -1); SigmoidCrossEntropyLoss sums over t != -1 and divides by their count.
    expanded = -np.ones((3, 4, 5, 5))
    for i, c in enumerate(classes):
        if c > 0:
            expanded[i, c] = targets[i]
    x = logits.astype(np.float64)
    valid = expanded != -1
    per_element = np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0) - x * (expanded == 1)
    expected = 0.5 * per_element[valid].sum() / valid.sum()
    loss = mask_loss(torch.from_numpy(logits), torch.from_numpy(classes), torch.from_numpy(targets), weight=0.5)
    assert abs(loss.item() - expected) < 1e-6 * expected


def test_mask_loss_of_no_valid_element_is_zero_with_zero_gradient():
    logits = torch.randn(1, 4, 3, 3, requires_grad=True)
    loss = mask_loss(logits, torch.zeros(1, dtype=torch.int64), torch.full((1, 3, 3), -1, dtype=torch.int8))
    loss.backward()
    assert loss.item() == 0 and logits.grad.abs().sum() == 0


def _mask_model(*opts):
    merge_cfg_from_file(os.path.join(CONFIGS, 'getting_started', 'shapes_demo_mask_R-18-FPN.yaml'))
    merge_cfg_from_list(list(opts))
    assert_and_infer_cfg()
    return model_builder.create(cfg)


def test_mask_logits_contract_pools_the_box_heads_feature_list():
    torch.manual_seed(0)
    model = _mask_model('MRCNN.RESOLUTION', '28', 'MRCNN.ROI_XFORM_RESOLUTION', '14').eval()
    assert isinstance(model.mask_head, MaskRCNNHead)
    features = [torch.randn(1, 128, 32 // 2 ** k, 32 // 2 ** k) for k in range(5)]  # P2..P6 of a 128 px image
    rois = torch.tensor([[0, 4.0, 4.0, 60.0, 50.0], [0, 0.0, 0.0, 127.0, 127.0]])
    with torch.no_grad():
        logits = model.mask_logits(features, rois)
        pooled = model._pooled(features, rois, 14, 2)
        assert logits.shape == (2, 4, 28, 28)
        torch.testing.assert_close(logits, model.mask_head(pooled))
        assert pooled.shape == (2, 128, 14, 14)
        # RoIAlign on each RoI's FPN level: the 57 x 47 RoI on P2, the 128 x 128 one on P3 (FPN eq. 1)
        torch.testing.assert_close(pooled[:1], torchvision.ops.roi_align(features[0], rois[:1], 14, 1 / 4, 2))
        torch.testing.assert_close(pooled[1:], torchvision.ops.roi_align(features[1], rois[1:], 14, 1 / 8, 2))


def test_no_mask_head_without_mask_on():
    assert _mask_model('MODEL.MASK_ON', 'False').mask_head is None


def test_class_agnostic_masks_have_one_channel():
    assert _mask_model('MRCNN.CLS_SPECIFIC_MASK', 'False').mask_head.mask_fcn_logits.out_channels == 1


def test_demo_config_trains_two_steps_on_the_cpu_with_masks():
    torch.manual_seed(0)
    model = _mask_model('MODEL.NUM_CLASSES', '4').train()
    images = torch.randn(2, 3, 128, 128)
    im_info = torch.tensor([[128.0, 128.0, 1.0], [128.0, 128.0, 1.0]])
    square = [[20, 30, 70, 30, 70, 80, 20, 80]]
    triangle = [[60, 10, 120, 100, 10, 100]]
    targets = [
        gt_targets({'boxes': np.array([[20.0, 30, 69, 79]]), 'gt_classes': np.array([1]),
                    'is_crowd': np.array([False]), 'segms': [square]}),
        gt_targets({'boxes': np.array([[10.0, 10, 119, 99]]), 'gt_classes': np.array([3]),
                    'is_crowd': np.array([False]), 'segms': [triangle]}),
    ]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        losses = model(images, im_info, targets)
        optimizer.zero_grad()
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        assert torch.isfinite(losses['loss_mask']) and losses['loss_mask'] > 0
        assert model.mask_head.fcn1.weight.grad.abs().sum() > 0
        logits_grad = model.mask_head.mask_fcn_logits.weight.grad
        # only the gt classes' channels (1 and 3) learn: Detectron's -1 targets elsewhere
        assert logits_grad[[1, 3]].abs().sum() > 0 and logits_grad[[0, 2]].abs().sum() == 0
        optimizer.step()
