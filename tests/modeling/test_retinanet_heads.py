"""RetinaNet's anchors, head and losses against numpy transcriptions of Detectron (tests/support/retinanet_reference.py)."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from detectron.modeling.FPN import FPNBody
from detectron.modeling.ResNet import ResNet
from detectron.modeling.retinanet import RetinaNet, RetinaNetParams
from detectron.modeling.retinanet_heads import (RetinaNetHead, anchor_major, class_probabilities, retinanet_anchors,
                                                select_smooth_l1_loss, sigmoid_focal_loss, softmax_focal_loss)
from tests.support.retinanet_reference import (np_cell_anchor, np_focal_loss_and_grad, np_level_anchors,
                                               np_retinanet_labels, np_softmax_focal_loss_and_grad)

RATIOS = (1.0, 2.0, 0.5)  # the shipped configs' order


def test_anchors_per_level_match_detectron_for_an_image_size():
    # An 800x1333 image in a blob padded to COARSEST_STRIDE 128: 896 x 1408; level l has 896/2^l x 1408/2^l cells.
    shapes = [(896 // 2 ** level, 1408 // 2 ** level) for level in range(3, 8)]
    anchors = retinanet_anchors(shapes, (8, 16, 32, 64, 128), 3, RATIOS, 4)
    assert [tuple(a.shape) for a in anchors] == [(112, 176, 9, 4), (56, 88, 9, 4), (28, 44, 9, 4), (14, 22, 9, 4),
                                                 (7, 11, 9, 4)]
    assert sum(a.reshape(-1, 4).shape[0] for a in anchors) == 9 * (112 * 176 + 56 * 88 + 28 * 44 + 14 * 22 + 7 * 11)
    for level, (height, width), ours in zip(range(3, 8), shapes, anchors):
        expected = np_level_anchors(level, height, width, 3, RATIOS, 4)
        np.testing.assert_allclose(ours.reshape(-1, 4).numpy(), expected, rtol=0, atol=1e-3)


def test_p3_cell_anchors_by_hand():
    # Stride 8, octave 0 size 32, ratio 1: the 8x8 window (centre 3.5) scaled to 32 -> [-12, -12, 19, 19]; the
    # second octave's size is 32 * 2^(1/3) = 40.3.
    cell = retinanet_anchors([(1, 1)], (8,), 3, RATIOS, 4)[0].reshape(-1, 4)
    np.testing.assert_allclose(cell[0].numpy(), [-12, -12, 19, 19])
    np.testing.assert_allclose(cell[3].numpy(), np_cell_anchor(8.0, 32 * 2 ** (1 / 3), 1.0), atol=1e-4)
    assert cell[3, 2] - cell[3, 0] + 1 == pytest.approx(32 * 2 ** (1 / 3), abs=1e-4)


def test_focal_loss_value_and_gradient_match_the_op_formulas():
    rng = np.random.RandomState(0)
    logits = rng.randn(6, 3) * 2
    labels = np.array([0, 1, 3, -1, 2, 0])
    logits_t = torch.tensor(logits, requires_grad=True)
    per_anchor = sigmoid_focal_loss(logits_t, torch.tensor(labels), gamma=2.0, alpha=0.25)
    loss = per_anchor.sum() / 4.0
    loss.backward()
    expected, grad = np_focal_loss_and_grad(logits, labels, 4.0, gamma=2.0, alpha=0.25)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(logits_t.grad.numpy(), grad, rtol=1e-4, atol=1e-7)
    assert not logits_t.grad[3].any() and per_anchor[3] == 0  # an ignored anchor costs nothing


def test_focal_loss_of_one_positive_by_hand():
    # p = sigmoid(0) = 0.5: -0.25 * 0.5^2 * log(0.5) for its class, -0.75 * 0.5^2 * log(0.5) for the other.
    loss = sigmoid_focal_loss(torch.zeros(1, 2), torch.tensor([1]))
    assert loss.shape == (1,) and loss.item() == pytest.approx(-(0.25 + 0.75) * 0.25 * math.log(0.5))


@pytest.mark.parametrize('gamma, alpha', [(2.0, 0.25), (1.5, 0.6)])
def test_softmax_focal_loss_value_and_gradient_match_the_op_formulas(gamma, alpha):
    rng = np.random.RandomState(1)
    logits = rng.randn(7, 4) * 2  # C = 3 classes and background
    labels = np.array([0, 1, 3, -1, 2, 0, -1])
    logits_t = torch.tensor(logits, requires_grad=True)
    loss = softmax_focal_loss(logits_t, torch.tensor(labels), gamma=gamma, alpha=alpha).sum() / 3.0
    loss.backward()
    expected, grad = np_softmax_focal_loss_and_grad(logits, labels, 3.0, gamma=gamma, alpha=alpha)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(logits_t.grad.numpy(), grad, rtol=1e-4, atol=1e-7)
    assert not logits_t.grad[[3, 6]].any()  # ignored anchors get no gradient


def test_softmax_focal_loss_per_anchor_by_hand():
    # Two equal logits: p_t = 0.5 for every anchor. fg (class 1): 0.25 * 0.5^2 * log 2; bg: 0.75 * 0.5^2 * log 2.
    loss = softmax_focal_loss(torch.zeros(3, 2), torch.tensor([1, 0, -1]))
    np.testing.assert_allclose(loss.numpy(), [0.25 * 0.25 * math.log(2), 0.75 * 0.25 * math.log(2), 0], rtol=1e-6)


def test_select_smooth_l1_reads_only_fg_anchors_and_their_class_columns():
    deltas = torch.tensor([[[0.05, 1.0, 0, 0, 9, 9, 9, 9]], [[5, 5, 5, 5, 0.0, 0.2, 0, 0]]])  # (2, 1, 4C), C = 2
    targets = torch.zeros(2, 1, 4)
    labels = torch.tensor([[1], [2]])
    # beta 0.11: 0.5 * 0.05^2 / 0.11 + (1 - 0.055) for the first, (0.2 - 0.055) for the second
    loss = select_smooth_l1_loss(deltas, targets, labels, beta=0.11, class_specific=True)
    np.testing.assert_allclose(loss.numpy(), [[0.5 * 0.05 ** 2 / 0.11 + 0.945], [0.145]], rtol=1e-5)
    agnostic = select_smooth_l1_loss(deltas[..., :4], targets, torch.tensor([[1], [0]]))
    np.testing.assert_allclose(agnostic.numpy(), [[0.5 * 0.05 ** 2 / 0.11 + 0.945], [0]], rtol=1e-5)


def test_head_shares_towers_across_levels_and_starts_at_the_prior():
    head = RetinaNetHead(16, num_classes=5, num_anchors=9, num_convs=2, prior_prob=0.01)
    assert torch.allclose(head.cls_pred.bias, torch.full((45,), -math.log(99.0)))
    features = [torch.randn(2, 16, s, s) for s in (8, 4, 2)]
    logits, deltas = head(features)
    assert [tuple(x.shape) for x in logits] == [(2, 45, s, s) for s in (8, 4, 2)]
    assert [tuple(x.shape) for x in deltas] == [(2, 36, s, s) for s in (8, 4, 2)]
    shared = RetinaNetHead(16, num_classes=5, num_anchors=9, num_convs=2, share_tower=True, class_specific_bbox=True)
    assert shared.bbox_tower is None and shared.bbox_pred.out_channels == 9 * 4 * 5


@pytest.mark.parametrize('num_classes, prior', [(5, 0.01), (80, 0.02)])
def test_softmax_head_starts_every_anchor_at_the_prior(num_classes, prior):
    # Detectron's bias init: background logit log(C (1 - p) / p), class logits 0 -> P(bg) = 1 - p, P(class) = p / C.
    head = RetinaNetHead(16, num_classes=num_classes, num_anchors=9, num_convs=1, prior_prob=prior, softmax=True)
    assert head.cls_pred.out_channels == 9 * (num_classes + 1)
    bias = head.cls_pred.bias.detach().view(9, num_classes + 1)
    np.testing.assert_allclose(bias[:, 0].numpy(), math.log(num_classes * (1 - prior) / prior), rtol=1e-6)
    assert not bias[:, 1:].any()
    probs = torch.softmax(bias.double(), dim=1)
    np.testing.assert_allclose(probs[:, 0].numpy(), 1 - prior, rtol=1e-6)
    np.testing.assert_allclose(probs[:, 1:].numpy(), prior / num_classes, rtol=1e-6)


def test_class_probabilities_drop_the_softmax_background_column():
    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    e = np.exp([[2.0, 0.0, 1.0]])[0]
    np.testing.assert_allclose(class_probabilities(logits, softmax=True).numpy(),
                               [e[1:] / e.sum(), [1 / 3, 1 / 3]], rtol=1e-6)
    np.testing.assert_allclose(class_probabilities(logits, softmax=False).numpy(), torch.sigmoid(logits).numpy())


def test_anchor_major_orders_rows_like_the_anchors():
    x = torch.arange(3 * 2 * 2 * 2, dtype=torch.float32).view(1, 3 * 2, 2, 2)  # A = 3, K = 2, H = W = 2
    rows = anchor_major(x, 3)
    # row (y, x, a), column k reads channel a * K + k at (y, x)
    assert rows.shape == (1, 12, 2)
    assert rows[0, (1 * 2 + 0) * 3 + 2, 1].item() == x[0, 2 * 2 + 1, 1, 0].item()


def test_fpn_extra_levels_p6_on_c5_and_p7_on_its_relu():
    torch.manual_seed(0)
    body = FPNBody(ResNet(18, freeze_at=0), 16, min_level=3, max_level=7, extra_conv_levels=True, coarsest_stride=128)
    assert body.strides == (8, 16, 32, 64, 128) and len(body.fpn_extra) == 2
    assert not list(body.fpn_inner[0].parameters())  # no P2 lateral, as Detectron's min_level 3
    images = torch.randn(1, 3, 128, 128)
    outputs = body(images)
    assert [o.shape[-1] for o in outputs] == [16, 8, 4, 2, 1]
    c5 = body.body(images)[-1]
    p6 = body.fpn_extra[0](c5)
    torch.testing.assert_close(outputs[3], p6)
    torch.testing.assert_close(outputs[4], body.fpn_extra[1](torch.relu(p6)))


class _FixedFeatures(nn.Module):
    """A 'conv body' answering fixed P3..P7 features of a 128 x 128 blob."""

    def __init__(self, dim=8):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.features = nn.ParameterList(nn.Parameter(torch.randn(1, dim, 128 // 2 ** level, 128 // 2 ** level,
                                                                  generator=generator)) for level in range(3, 8))

    def forward(self, images):
        return list(self.features)


@pytest.mark.parametrize('class_specific', [False, True])
def test_model_losses_per_level_match_numpy_on_detectrons_labels(class_specific):
    torch.manual_seed(0)
    head = RetinaNetHead(8, num_classes=3, num_anchors=9, num_convs=1, class_specific_bbox=class_specific)
    nn.init.normal_(head.cls_pred.weight, std=0.5)  # spread the scores away from the prior
    params = RetinaNetParams(aspect_ratios=RATIOS, loss_gamma=1.5, loss_alpha=0.3, bbox_reg_weight=2.0,
                             class_specific_bbox=class_specific)
    model = RetinaNet(_FixedFeatures(), head, params).train()
    gt, classes = np.array([[4.0, 6.0, 30.0, 40.0], [20.0, 10.0, 100.0, 90.0]]), np.array([3, 1])
    targets = [{'boxes': torch.tensor(gt, dtype=torch.float32), 'classes': torch.tensor(classes),
                'is_crowd': torch.zeros(2, dtype=torch.bool)}]
    losses = model(torch.zeros(1, 3, 128, 128), torch.tensor([[128.0, 128.0, 1.0]]), targets)

    shapes = [(128 // 2 ** level,) * 2 for level in range(3, 8)]
    anchors = [a.reshape(-1, 4).double().numpy() for a in retinanet_anchors(shapes, (8, 16, 32, 64, 128), 3, RATIOS, 4)]
    labels, box_targets, num_fg = np_retinanet_labels(np.concatenate(anchors), gt, classes, 0.5, 0.4)
    assert losses['retnet_fg_num'].item() == num_fg + 1 and (labels > 0).sum() > 1
    with torch.no_grad():
        logits, deltas = head(list(model.conv_body.features))
    start = 0
    for level, level_logits, level_deltas, level_anchors in zip(range(3, 8), logits, deltas, anchors):
        rows = slice(start, start + len(level_anchors))
        start += len(level_anchors)
        expected, _ = np_focal_loss_and_grad(anchor_major(level_logits, 9)[0].double().numpy(), labels[rows],
                                             num_fg + 1, gamma=1.5, alpha=0.3)
        assert losses['loss_fl_fpn{}'.format(level)].item() == pytest.approx(expected, rel=1e-5)
        level_deltas = anchor_major(level_deltas, 9)[0].double().numpy()
        fg = labels[rows] > 0
        if class_specific:
            columns = np.maximum(labels[rows], 1).astype(int) - 1
            level_deltas = level_deltas.reshape(len(fg), 3, 4)[np.arange(len(fg)), columns]
        diff = np.abs(level_deltas - box_targets[rows])[fg]
        smooth_l1 = np.where(diff < 0.11, 0.5 * diff ** 2 / 0.11, diff - 0.055).sum()
        assert losses['loss_retnet_bbox_fpn{}'.format(level)].item() == pytest.approx(
            2.0 * smooth_l1 / (num_fg + 1), rel=1e-5, abs=1e-7)


def test_sigmoid_focal_loss_of_bf16_logits_is_float32_with_a_bf16_gradient():
    logits = (torch.randn(5, 4, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16).requires_grad_()
    labels = torch.tensor([0, 2, -1, 4, 1])
    loss = sigmoid_focal_loss(logits, labels)
    loss.sum().backward()
    expected, grad = np_focal_loss_and_grad(logits.detach().double().numpy(), labels.numpy(), 1.0, 2.0, 0.25)
    assert loss.dtype == torch.float32 and loss.sum().item() == pytest.approx(expected, rel=1e-5)
    assert logits.grad.dtype == torch.bfloat16
    np.testing.assert_allclose(logits.grad.double().numpy(), grad, rtol=1e-2, atol=1e-4)
