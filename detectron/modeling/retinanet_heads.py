"""RetinaNet's head, anchors and losses (Detectron's modeling/retinanet_heads.py, the anchors of its
roi_data/retinanet.py and core/test_retinanet.py, and the SigmoidFocalLoss / SoftmaxFocalLoss / SelectSmoothL1Loss ops).

The class and box towers are shared by every level: Detectron defines them on the finest level
(`retnet_cls_conv_n<i>_fpn3`, ...) and applies the same weights to the coarser ones.
"""
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from detectron.modeling.generate_anchors import generate_anchors
from detectron.modeling.rpn_heads import grid_anchors


def _tower(dim, num_convs):
    convs = nn.ModuleList(nn.Conv2d(dim, dim, 3, padding=1) for _ in range(num_convs))
    for conv in convs:
        _gaussian_init(conv, bias=0.0)
    return convs


def _gaussian_init(conv, bias):
    nn.init.normal_(conv.weight, std=0.01)
    nn.init.constant_(conv.bias, bias)


class RetinaNetHead(nn.Module):
    """forward(features) -> (class logits per level (B, A*K, H, W), channels (anchor, class); box
    deltas per level (B, A*4, H, W), or (B, A*4C, H, W) with class_specific_bbox).

    num_classes: foreground classes C (MODEL.NUM_CLASSES - 1); num_anchors: A = SCALES_PER_OCTAVE *
    len(ASPECT_RATIOS); num_convs [NUM_CONVS] 3x3 conv + ReLU in each tower; share_tower
    [SHARE_CLS_BBOX_TOWER]: the box predictor reads the class tower; softmax [SOFTMAX]: K = C + 1
    logits per anchor, background first, for one softmax (else K = C sigmoids); prior_prob
    [PRIOR_PROB]: the class biases start so that every anchor is background with probability 1 - p.
    """

    def __init__(self, dim, num_classes, num_anchors, num_convs=4, share_tower=False, class_specific_bbox=False,
                 prior_prob=0.01, softmax=False):
        super().__init__()
        self.cls_tower = _tower(dim, num_convs)
        self.bbox_tower = None if share_tower else _tower(dim, num_convs)
        logits_per_anchor = num_classes + 1 if softmax else num_classes
        self.cls_pred = nn.Conv2d(dim, logits_per_anchor * num_anchors, 3, padding=1)
        _gaussian_init(self.cls_pred, bias=0.0)
        with torch.no_grad():
            self.cls_pred.bias.copy_(class_prior_bias(num_classes, num_anchors, prior_prob, softmax))
        box_dim = 4 * num_classes if class_specific_bbox else 4
        self.bbox_pred = nn.Conv2d(dim, box_dim * num_anchors, 3, padding=1)
        _gaussian_init(self.bbox_pred, bias=0.0)

    def forward(self, features):
        logits, deltas = [], []
        for feature in features:
            cls_feature = _run_tower(self.cls_tower, feature)
            box_feature = cls_feature if self.bbox_tower is None else _run_tower(self.bbox_tower, feature)
            logits.append(self.cls_pred(cls_feature))
            deltas.append(self.bbox_pred(box_feature))
        return logits, deltas


def class_prior_bias(num_classes, num_anchors, prior_prob, softmax):
    """Detectron's get_retinanet_bias_init: each sigmoid starts at p (bias -log((1 - p) / p)); with
    softmax, the background logit of each anchor starts at log(C (1 - p) / p) and the C class logits at
    0, so that background has probability 1 - p and each class p / C."""
    if not softmax:
        return torch.full((num_classes * num_anchors,), -math.log((1 - prior_prob) / prior_prob))
    per_anchor = torch.zeros(num_classes + 1)
    per_anchor[0] = math.log(num_classes * (1 - prior_prob) / prior_prob)
    return per_anchor.repeat(num_anchors)


def _run_tower(convs, x):
    for conv in convs:
        x = F.relu(conv(x))
    return x


def cell_anchors(stride, scales_per_octave, aspect_ratios, anchor_scale):
    """(A, 4) float64 anchors of one cell of the level of this stride, in Detectron's order:
    octave-major, then aspect ratio; octave o has size stride * 2^(o / scales_per_octave) * anchor_scale."""
    sizes = [stride * 2 ** (octave / float(scales_per_octave)) * anchor_scale for octave in range(scales_per_octave)]
    return torch.cat([torch.from_numpy(generate_anchors(stride=stride, sizes=(size,), aspect_ratios=aspect_ratios))
                      for size in sizes])


# As rpn_heads' _CACHED_LEVELS: the levels of about 32 padded image sizes.
_CACHED_LEVELS = 160


@functools.lru_cache(maxsize=_CACHED_LEVELS)
def _level_anchors(height, width, stride, scales_per_octave, aspect_ratios, anchor_scale, device):
    cell = cell_anchors(stride, scales_per_octave, aspect_ratios, anchor_scale).to(device, torch.float32)
    return grid_anchors(cell, height, width, stride)


def retinanet_anchors(feature_shapes, strides, scales_per_octave=3, aspect_ratios=(0.5, 1.0, 2.0), anchor_scale=4,
                      device='cpu'):
    """Anchors of every level: a list of (H, W, A, 4) float32 tensors, cached per level shape and
    shared between calls (read them, never write them). `.reshape(-1, 4)` orders them (y, x, anchor),
    the order of the head's outputs after anchor_major."""
    device = torch.device(device)
    return [_level_anchors(int(height), int(width), float(stride), scales_per_octave, tuple(aspect_ratios),
                           anchor_scale, device)
            for (height, width), stride in zip(feature_shapes, strides)]


def anchor_major(x, num_anchors):
    """(B, A*K, H, W) head output, channels (anchor, k) -> (B, H*W*A, K), rows ordered like the anchors."""
    batch, channels, height, width = x.shape
    k = channels // num_anchors
    return x.view(batch, num_anchors, k, height, width).permute(0, 3, 4, 1, 2).reshape(batch, -1, k)


def sigmoid_focal_loss(logits, labels, gamma=2.0, alpha=0.25):
    """Detectron's SigmoidFocalLoss per anchor, before its division by retnet_fg_num: (...) float32.

    logits (..., C) of classes 1..C, labels (...) in {-1 ignored, 0 bg, 1..C}. Each class of a
    labelled anchor is a binary problem, positive where it is the anchor's class:
    -alpha (1 - p)^gamma log p for positives, -(1 - alpha) p^gamma log(1 - p) for the others.
    Computed in float32 whatever the head ran in, with the op's closed-form gradient.
    """
    return _SigmoidFocalLoss.apply(logits, labels, gamma, alpha)


class _SigmoidFocalLoss(torch.autograd.Function):
    """With s the logit of the wrong answer (-x for the anchor's class, x for the others), each
    term is w sigmoid(s)^gamma softplus(s), w = alpha or 1 - alpha (0 when ignored). Forward and
    backward are a few elementwise kernels and keep nothing of the (..., C) size alive between
    them: autograd through the same formula would keep a dozen float32 copies of the logits."""

    @staticmethod
    def forward(ctx, logits, labels, gamma, alpha):
        ctx.save_for_backward(logits, labels)
        ctx.gamma, ctx.alpha = gamma, alpha
        s, weight, _ = _wrong_answer_logits(logits, labels, alpha)
        return (weight * torch.sigmoid(s).pow_(gamma) * F.softplus(s)).sum(-1)

    @staticmethod
    def backward(ctx, grad_out):
        logits, labels = ctx.saved_tensors
        s, weight, positive = _wrong_answer_logits(logits, labels, ctx.alpha)
        q = torch.sigmoid(s)
        # d/ds sigmoid(s)^g softplus(s) = sigmoid(s)^g (g (1 - sigmoid(s)) softplus(s) + sigmoid(s))
        grad_s = q.pow(ctx.gamma) * (ctx.gamma * (1 - q) * F.softplus(s) + q) * weight * grad_out.unsqueeze(-1)
        return torch.where(positive, -grad_s, grad_s).to(logits.dtype), None, None, None


def _wrong_answer_logits(logits, labels, alpha):
    """(s, each term's weight, the anchor-class pairs that are positives), all (..., C)."""
    x = logits.float()
    positive = labels.unsqueeze(-1) == torch.arange(1, x.shape[-1] + 1, device=x.device)
    weight = torch.where(positive, alpha, 1 - alpha) * (labels >= 0).unsqueeze(-1)
    return torch.where(positive, -x, x), weight, positive


def softmax_focal_loss(logits, labels, gamma=2.0, alpha=0.25):
    """Detectron's SoftmaxFocalLoss per anchor, before its division by retnet_fg_num: (...) float32.

    logits (..., C + 1) of background and classes 1..C, one softmax per anchor, labels (...) in
    {-1 ignored, 0 bg, 1..C}. A labelled anchor of true class t costs -(1 - p_t)^gamma log p_t,
    weighted by alpha when t is a class and 1 - alpha when it is background. Computed in float32.
    """
    log_p = F.log_softmax(logits.float(), dim=-1)
    log_p_true = torch.gather(log_p, -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    weight = torch.where(labels > 0, alpha, 1 - alpha) * (labels >= 0)
    return -weight * (1 - log_p_true.exp()) ** gamma * log_p_true


def class_probabilities(logits, softmax):
    """(..., C) probabilities of classes 1..C from the head's anchor-major logits: sigmoids, or with
    softmax the softmax over (..., C + 1) with the background column dropped, as test_retinanet."""
    logits = logits.float()
    if softmax:
        return torch.softmax(logits, dim=-1)[..., 1:]
    return torch.sigmoid(logits)


def select_smooth_l1_loss(deltas, targets, labels, beta=0.11, class_specific=False):
    """Detectron's SelectSmoothL1Loss per anchor, before its division by retnet_fg_num: (...) float32,
    the smooth L1 (transition beta) of the fg anchors' (labels > 0) deltas against their targets, 0
    for the other anchors.

    deltas (..., 4) or, class_specific, (..., 4C) whose 4 columns of the anchor's class are read;
    targets (..., 4)."""
    fg = labels > 0
    if class_specific:
        columns = ((labels - 1).clamp(min=0) * 4).unsqueeze(-1) + torch.arange(4, device=deltas.device)
        deltas = torch.gather(deltas, -1, columns)
    diff = (deltas.float() - targets).abs()
    loss = torch.where(diff < beta, 0.5 * diff ** 2 / beta, diff - 0.5 * beta)
    return loss.sum(-1) * fg
