"""Fast R-CNN box head: the 2-FC RoI head, the classification / regression outputs (with the
KL-Loss `bbox_pred_std` branch) and their training losses.

Parameter names are Detectron's blob names (fc6, fc7, cls_score, bbox_pred, bbox_pred_std), so a
Detectron or KL-Loss .pkl maps onto these modules mechanically.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def _caffe2_xavier_fill_(fc):
    # Caffe2's XavierFill (brew.fc's default, used by Detectron for fc6/fc7) is
    # U(-sqrt(3 / fan_in), +sqrt(3 / fan_in)), not Glorot's fan_in + fan_out rule.
    bound = math.sqrt(3.0 / fc.in_features)
    nn.init.uniform_(fc.weight, -bound, bound)
    nn.init.zeros_(fc.bias)


def caffe2_msra_fill_(weight):
    """Caffe2's MSRAFill: N(0, 2 / fan_out), fan_out = numel / shape[1] (out * kh * kw for a
    convolution, in * kh * kw for a transposed one, whose weight is (in, out, kh, kw))."""
    nn.init.normal_(weight, std=math.sqrt(2.0 * weight.shape[1] / weight.numel()))


def _gaussian_fill_(fc, std):
    nn.init.normal_(fc.weight, mean=0.0, std=std)
    nn.init.zeros_(fc.bias)


class Roi2MLPHead(nn.Module):
    """Detectron's `add_roi_2mlp_head` after the RoI transform: fc6 + ReLU, fc7 + ReLU.

    Takes pooled RoI features (R, dim_in, roi_size, roi_size) and returns (R, hidden_dim).
    """

    def __init__(self, dim_in, roi_size=7, hidden_dim=1024):
        super().__init__()
        self.fc6 = nn.Linear(dim_in * roi_size * roi_size, hidden_dim)
        self.fc7 = nn.Linear(hidden_dim, hidden_dim)
        _caffe2_xavier_fill_(self.fc6)
        _caffe2_xavier_fill_(self.fc7)
        self.dim_out = hidden_dim

    def forward(self, roi_feat):
        x = F.relu(self.fc6(roi_feat.flatten(1)))
        return F.relu(self.fc7(x))


class RoiXConv1FCGNHead(nn.Module):
    """Detectron's `add_roi_Xconv1fc_gn_head` after the RoI transform: num_convs x (conv 3x3 at
    conv_dim, no bias, MSRAFill + GroupNorm + ReLU) named `head_conv<i>` / `head_conv<i>_gn`, then
    fc6 + ReLU. Takes (R, dim_in, roi_size, roi_size), returns (R, hidden_dim).
    """

    def __init__(self, dim_in, roi_size=7, conv_dim=256, num_convs=4, hidden_dim=1024, gn_groups=None,
                 gn_eps=1e-5):
        super().__init__()
        self.num_convs = num_convs
        for i in range(1, num_convs + 1):
            conv = nn.Conv2d(dim_in if i == 1 else conv_dim, conv_dim, 3, padding=1, bias=False)
            caffe2_msra_fill_(conv.weight)
            setattr(self, f'head_conv{i}', conv)
            setattr(self, f'head_conv{i}_gn', nn.GroupNorm(gn_groups(conv_dim), conv_dim, eps=gn_eps))
        self.fc6 = nn.Linear(conv_dim * roi_size * roi_size, hidden_dim)
        _caffe2_xavier_fill_(self.fc6)
        self.dim_out = hidden_dim

    def forward(self, roi_feat):
        x = roi_feat
        for i in range(1, self.num_convs + 1):
            x = F.relu(getattr(self, f'head_conv{i}_gn')(getattr(self, f'head_conv{i}')(x)))
        return F.relu(self.fc6(x.flatten(1)))


class FastRCNNOutputs(nn.Module):
    """Detectron's `add_fast_rcnn_outputs` with KL-Loss's `bbox_pred_std` branch.

    `bbox_pred` and `bbox_pred_std` have 4 columns per regression class (K classes, or 2 when
    class-agnostic), in the box coding's column order: (dx, dy, dw, dh), or (x1, x2, y1, y2) edges
    under cfg.XYXY. `bbox_pred_std` predicts alpha = log(sigma^2); its init (N(0, 1e-4), bias 0)
    starts every sigma near 1.
    """

    def __init__(self, dim_in, num_classes, cls_agnostic_bbox_reg=False, pred_std=False):
        super().__init__()
        num_bbox_reg_classes = 2 if cls_agnostic_bbox_reg else num_classes
        self.cls_score = nn.Linear(dim_in, num_classes)
        self.bbox_pred = nn.Linear(dim_in, 4 * num_bbox_reg_classes)
        _gaussian_fill_(self.cls_score, 0.01)
        _gaussian_fill_(self.bbox_pred, 0.001)
        self.bbox_pred_std = None
        if pred_std:
            self.bbox_pred_std = nn.Linear(dim_in, 4 * num_bbox_reg_classes)
            _gaussian_fill_(self.bbox_pred_std, 1e-4)

    def forward(self, x):
        cls_score = self.cls_score(x)
        outputs = {'cls_score': cls_score, 'bbox_pred': self.bbox_pred(x)}
        if self.bbox_pred_std is not None:
            outputs['bbox_pred_std'] = self.bbox_pred_std(x)
        if not self.training:
            # Detectron adds the softmax only to the test net; training folds it into the loss.
            outputs['cls_prob'] = F.softmax(cls_score, dim=1)
        return outputs


def _smooth_l1(x, beta=1.0):
    # Elementwise Huber term of Caffe2's SmoothL1Loss op (beta = 1 for the box head).
    abs_x = x.abs()
    return torch.where(abs_x < beta, 0.5 * x * x / beta, abs_x - 0.5 * beta)


def fast_rcnn_losses(cls_score, bbox_pred, labels, bbox_targets, bbox_inside_weights,
                     bbox_outside_weights, valid=None):
    """Detectron's `add_fast_rcnn_losses` for the RoIs of one process.

    Returns `loss_cls` (softmax cross entropy averaged over the R sampled RoIs), `loss_bbox`
    (Caffe2's SmoothL1Loss, beta 1: sum(out_w * SL1(in_w * (pred - target))) / R) and the metric
    `accuracy_cls`. With KL-Loss (cfg.PRED_STD) the caller replaces `loss_bbox` by `kl_loss`,
    keeping the key `loss_bbox`. valid (R,) bool (fixed-size sampling): only those rows are RoIs,
    R their count (the others carry zero box weights).
    """
    loss_bbox = (bbox_outside_weights
                 * _smooth_l1(bbox_inside_weights * (bbox_pred - bbox_targets))).sum()
    with torch.no_grad():
        # Caffe2's Accuracy op on cls_prob: the first maximum wins ties, as argmax does.
        predicted = F.softmax(cls_score, dim=1).argmax(dim=1)
        correct = (predicted == labels).to(cls_score.dtype)
    num_rois = _num_rois(bbox_pred, valid)
    if valid is None:
        loss_cls, accuracy_cls = F.cross_entropy(cls_score, labels), correct.mean()
    else:
        loss_cls = (F.cross_entropy(cls_score, labels, reduction='none') * valid).sum() / num_rois
        accuracy_cls = (correct * valid).sum() / num_rois
    return {'loss_cls': loss_cls, 'loss_bbox': loss_bbox / num_rois, 'accuracy_cls': accuracy_cls}


def _num_rois(bbox_pred, valid):
    """R of the box losses: the rows of bbox_pred, or those flagged valid (fixed-size sampling)."""
    return bbox_pred.shape[0] if valid is None else valid.sum()


def kl_loss(bbox_pred, bbox_pred_std, bbox_targets, bbox_inside_weights, bbox_outside_weights, valid=None):
    """KL-Loss box regression loss of one process (KL-Loss `add_fast_rcnn_losses`, PRED_STD_LOG).

    With alpha = bbox_pred_std = log(sigma^2) and x = in_w * (pred - target):
        L = (1 / R) * sum[ exp(-alpha) * SL1(x) + 0.5 * alpha * out_w ],
    R = all sampled RoIs (fg and bg), SL1 with beta 1. Only the alpha term carries out_w, as in the
    Caffe2 graph; SL1(x) is 0 wherever out_w is 0, so bg rows and non-target columns contribute
    nothing and their alpha gets exactly zero gradient.

    Gradients equal the Caffe2 graph's: dL/dpred = exp(-alpha) SL1'(x) in_w / R and
    dL/dalpha = (0.5 out_w - exp(-alpha) SL1(x)) / R. The graph gets them from two copies of the
    product term, one with exp(-alpha) and one with SL1 stopped; those stop-gradients only split
    the product rule between the copies, so differentiating the single product gives the same
    gradients. The value here counts the product once, whereas Detectron's logged total 'loss'
    (loss_bbox + mulw + logw) counts exp(-alpha) SL1 twice. valid: as fast_rcnn_losses' (rows
    outside it have zero weights, so only R changes).
    """
    x = bbox_inside_weights * (bbox_pred - bbox_targets)
    per_element = (torch.exp(-bbox_pred_std) * _smooth_l1(x)
                   + 0.5 * bbox_pred_std * bbox_outside_weights)
    return per_element.sum() / _num_rois(bbox_pred, valid)
