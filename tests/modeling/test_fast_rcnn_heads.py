import math

import numpy as np
import pytest
import torch

from detectron.modeling.fast_rcnn_heads import (
    FastRCNNOutputs, Roi2MLPHead, fast_rcnn_losses, kl_loss)


def test_roi_2mlp_head_uses_caffe2_xavier_fill_and_zero_bias():
    torch.manual_seed(0)
    head = Roi2MLPHead(dim_in=16, roi_size=7, hidden_dim=256)
    assert head.fc6.weight.shape == (256, 16 * 7 * 7)
    assert head.fc7.weight.shape == (256, 256)
    for fc in (head.fc6, head.fc7):
        bound = math.sqrt(3.0 / fc.in_features)
        w = fc.weight.detach()
        assert w.abs().max() <= bound
        assert w.abs().max() > 0.99 * bound
        # U(-b, b) has std b / sqrt(3) = 1 / sqrt(fan_in).
        assert w.std().item() == pytest.approx(1.0 / math.sqrt(fc.in_features), rel=0.02)
        assert torch.count_nonzero(fc.bias) == 0


def test_roi_2mlp_head_forward_is_two_relu_fcs():
    torch.manual_seed(1)
    head = Roi2MLPHead(dim_in=2, roi_size=3, hidden_dim=5)
    x = torch.randn(4, 2, 3, 3)
    w6, b6 = head.fc6.weight.detach().numpy(), head.fc6.bias.detach().numpy()
    w7, b7 = head.fc7.weight.detach().numpy(), head.fc7.bias.detach().numpy()
    fc6 = np.maximum(x.numpy().reshape(4, 18) @ w6.T + b6, 0)
    expected = np.maximum(fc6 @ w7.T + b7, 0)
    np.testing.assert_allclose(head(x).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_fast_rcnn_outputs_init_statistics():
    torch.manual_seed(0)
    outs = FastRCNNOutputs(1024, 81, pred_std=True)
    expected = {'cls_score': (81, 0.01), 'bbox_pred': (324, 0.001), 'bbox_pred_std': (324, 1e-4)}
    for name, (rows, std) in expected.items():
        fc = getattr(outs, name)
        assert fc.weight.shape == (rows, 1024)
        assert fc.weight.detach().mean().item() == pytest.approx(0.0, abs=std * 0.02)
        assert fc.weight.detach().std().item() == pytest.approx(std, rel=0.02)
        assert torch.count_nonzero(fc.bias) == 0


def test_fast_rcnn_outputs_class_agnostic_and_without_std():
    outs = FastRCNNOutputs(8, 5, cls_agnostic_bbox_reg=True)
    assert outs.bbox_pred.weight.shape == (8, 8)
    assert outs.bbox_pred_std is None
    assert set(outs(torch.randn(3, 8))) == {'cls_score', 'bbox_pred'}


def test_fast_rcnn_outputs_forward_train_and_eval():
    torch.manual_seed(2)
    outs = FastRCNNOutputs(6, 3, pred_std=True)
    x = torch.randn(4, 6)
    train_out = outs(x)
    assert set(train_out) == {'cls_score', 'bbox_pred', 'bbox_pred_std'}
    assert train_out['bbox_pred_std'].shape == (4, 12)
    outs.eval()
    eval_out = outs(x)
    score = eval_out['cls_score'].detach().numpy().astype(np.float64)
    softmax = np.exp(score) / np.exp(score).sum(1, keepdims=True)
    np.testing.assert_allclose(eval_out['cls_prob'].detach().numpy(), softmax, rtol=1e-6)


def test_fast_rcnn_losses_hand_computed():
    # Row 0: logits (0, ln 3) -> p(1) = 3/4, label 1. Row 1: logits (0, 0), label 1: a tie,
    # which the first maximum (class 0) wins, so row 1 is misclassified.
    cls_score = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    labels = torch.tensor([1, 1])
    # Only row 0 class 1 is a target: x = (0.5, -2.0, 0.0, 3.0) * inside weights (1, 1, 1, 1).
    bbox_pred = torch.zeros(2, 8)
    bbox_pred[0, 4:] = torch.tensor([1.5, -1.0, 2.0, 3.0])
    bbox_pred[1] = 7.0  # not a target: weights 0
    bbox_targets = torch.zeros(2, 8)
    bbox_targets[0, 4:] = torch.tensor([1.0, 1.0, 2.0, 0.0])
    inside = torch.zeros(2, 8)
    inside[0, 4:] = 1.0
    outside = inside.clone()
    losses = fast_rcnn_losses(cls_score, bbox_pred, labels, bbox_targets, inside, outside)
    loss_cls = (-math.log(0.75) + math.log(2.0)) / 2
    # SL1: 0.5 * 0.25, |-2| - 0.5, 0, |3| - 0.5, summed and divided by R = 2.
    loss_bbox = (0.125 + 1.5 + 0.0 + 2.5) / 2
    assert losses['loss_cls'].item() == pytest.approx(loss_cls, rel=1e-6)
    assert losses['loss_bbox'].item() == pytest.approx(loss_bbox, rel=1e-6)
    assert losses['accuracy_cls'].item() == pytest.approx(0.5)
    assert not losses['accuracy_cls'].requires_grad


def _realistic_kl_inputs(seed, num_rois=64, num_classes=5, num_fg=16):
    """Fast R-CNN targets as roi_data builds them: fg rows carry 4 target columns of their class."""
    rng = np.random.RandomState(seed)
    labels = np.zeros(num_rois, np.int64)
    labels[:num_fg] = rng.randint(1, num_classes, size=num_fg)
    rng.shuffle(labels)
    targets = np.zeros((num_rois, 4 * num_classes))
    inside = np.zeros_like(targets)
    for r in np.nonzero(labels)[0]:
        cols = slice(4 * labels[r], 4 * labels[r] + 4)
        targets[r, cols] = rng.randn(4)
        inside[r, cols] = 1.0
    outside = (inside > 0).astype(np.float64)
    # Spread predictions so that both Smooth L1 branches (|x| < 1 and |x| >= 1) occur.
    pred = rng.randn(num_rois, 4 * num_classes) * 1.5
    alpha = rng.randn(num_rois, 4 * num_classes) * 0.7
    return pred, alpha, targets, inside, outside


def _caffe2_kl_graph(pred, alpha, targets, inside, outside):
    """The KL-Loss Caffe2 graph (NUM_GPUS = 1), blob by blob, with its gradients."""
    num_rois = pred.shape[0]
    bbox_inw = (pred - targets) * inside
    bbox_l1abs = np.abs(bbox_inw)
    wl1 = (bbox_l1abs >= 1).astype(np.float64)
    wl2 = (bbox_l1abs < 1).astype(np.float64)
    bbox_inws = 0.5 * bbox_inw * bbox_inw * wl2 + (bbox_l1abs - 0.5) * wl1
    nexp = np.exp(-alpha)
    logw_loss = np.sum(np.mean(0.5 * alpha * outside, axis=0))
    mulw_loss = np.sum(np.mean(nexp * bbox_inws, axis=0))
    # SmoothL1Loss(pred, targets, inside, alpha_out=nexp): sum(nexp * SL1) / N.
    loss_bbox = np.sum(nexp * bbox_inws) / num_rois
    # SmoothL1Loss's gradient goes to its first input only; SL1' = x if |x| < 1 else sign(x).
    sl1_grad = np.where(bbox_l1abs < 1, bbox_inw, np.sign(bbox_inw))
    grad_pred = nexp * inside * sl1_grad / num_rois
    # logw: 0.5 * out_w / R; mulw through Negative -> Exp with bbox_inws stopped.
    grad_alpha = 0.5 * outside / num_rois - nexp * bbox_inws / num_rois
    return loss_bbox, mulw_loss, logw_loss, grad_pred, grad_alpha


@pytest.mark.parametrize('seed', [0, 1])
def test_kl_loss_value_and_gradients_match_caffe2_graph(seed):
    pred, alpha, targets, inside, outside = _realistic_kl_inputs(seed)
    loss_bbox, mulw, logw, grad_pred, grad_alpha = _caffe2_kl_graph(
        pred, alpha, targets, inside, outside)
    assert np.any(np.abs((pred - targets) * inside)[inside > 0] >= 1)
    assert np.any(np.abs((pred - targets) * inside)[inside > 0] < 1)
    pred_t = torch.tensor(pred, requires_grad=True)
    alpha_t = torch.tensor(alpha, requires_grad=True)
    loss = kl_loss(pred_t, alpha_t, torch.tensor(targets), torch.tensor(inside),
                   torch.tensor(outside))
    loss.backward()
    # Value counted once: the Caffe2 graph's loss_bbox equals mulw; its logged total has both.
    assert loss_bbox == pytest.approx(mulw, rel=1e-12)
    assert loss.item() == pytest.approx(loss_bbox + logw, rel=1e-12)
    np.testing.assert_allclose(pred_t.grad.numpy(), grad_pred, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(alpha_t.grad.numpy(), grad_alpha, rtol=1e-12, atol=1e-15)
    # bg rows and non-target columns: exactly zero gradient for alpha and for the deltas.
    assert np.all(alpha_t.grad.numpy()[outside == 0] == 0)
    assert np.all(pred_t.grad.numpy()[inside == 0] == 0)
    assert np.all(alpha_t.grad.numpy()[outside > 0] != 0)


def test_kl_loss_float32_matches_float64():
    pred, alpha, targets, inside, outside = _realistic_kl_inputs(3)
    args64 = [torch.tensor(a) for a in (pred, alpha, targets, inside, outside)]
    loss64 = kl_loss(*args64)
    loss32 = kl_loss(*[a.float() for a in args64])
    assert loss32.dtype == torch.float32
    assert loss32.item() == pytest.approx(loss64.item(), rel=1e-5)


def test_kl_loss_at_init_reduces_to_smooth_l1_loss():
    # alpha = 0 (the bbox_pred_std init): KL = SmoothL1 term, the alpha term is 0.
    pred, _, targets, inside, outside = _realistic_kl_inputs(4)
    args = [torch.tensor(a) for a in (pred, targets, inside, outside)]
    kl = kl_loss(args[0], torch.zeros_like(args[0]), *args[1:])
    sl1 = fast_rcnn_losses(torch.zeros(pred.shape[0], 5, dtype=torch.float64), args[0],
                           torch.zeros(pred.shape[0], dtype=torch.int64), *args[1:])['loss_bbox']
    assert kl.item() == pytest.approx(sl1.item(), rel=1e-12)


def test_losses_over_valid_rows_equal_the_losses_of_those_rows_alone():
    # Fixed-size sampling pads with rows of label 0 and zero box weights: the losses, their
    # gradients and the accuracy over the valid rows are those of the compact rows.
    g = torch.Generator().manual_seed(3)
    num, padding, classes = 6, 3, 4
    cls_score = torch.randn(num + padding, classes, generator=g, requires_grad=True)
    bbox_pred = torch.randn(num + padding, 4 * classes, generator=g, requires_grad=True)
    bbox_std = torch.randn(num + padding, 4 * classes, generator=g, requires_grad=True)
    labels = torch.cat((torch.tensor([1, 0, 3, 2, 0, 1]), torch.zeros(padding, dtype=torch.long)))
    targets = torch.randn(num + padding, 4 * classes, generator=g)
    inside = torch.zeros(num + padding, 4 * classes)
    for row, label in enumerate(labels[:num].tolist()):
        inside[row, 4 * label:4 * label + 4] = float(label > 0)
    targets = targets * (inside > 0)
    valid = torch.arange(num + padding) < num
    padded = fast_rcnn_losses(cls_score, bbox_pred, labels, targets, inside, inside, valid=valid)
    padded['kl'] = kl_loss(bbox_pred, bbox_std, targets, inside, inside, valid=valid)
    compact = fast_rcnn_losses(cls_score[:num], bbox_pred[:num], labels[:num], targets[:num], inside[:num],
                               inside[:num])
    compact['kl'] = kl_loss(bbox_pred[:num], bbox_std[:num], targets[:num], inside[:num], inside[:num])
    for name in ('loss_cls', 'loss_bbox', 'accuracy_cls', 'kl'):
        torch.testing.assert_close(padded[name], compact[name], rtol=1e-6, atol=0)
    for name in ('loss_cls', 'loss_bbox', 'kl'):
        grads = torch.autograd.grad(padded[name], (cls_score, bbox_pred, bbox_std), allow_unused=True,
                                    materialize_grads=True)
        want = torch.autograd.grad(compact[name], (cls_score, bbox_pred, bbox_std), allow_unused=True,
                                   materialize_grads=True)
        for got, expected in zip(grads, want):
            torch.testing.assert_close(got[:num], expected[:num], rtol=1e-6, atol=1e-7)
            assert got[num:].abs().sum() == 0
