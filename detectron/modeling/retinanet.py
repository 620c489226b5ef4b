"""RetinaNet (Detectron's MODEL.TYPE retinanet): an FPN body with levels P3..P7, the class and box
towers of retinanet_heads on every level, anchors matched to the ground truth by roi_data/retinanet.py,
the focal and SelectSmoothL1 losses. All hyper-parameters arrive as plain values from retinanet_builder.
"""
from dataclasses import dataclass

import torch
from torch import nn

from detectron.modeling import retinanet_heads
from detectron.roi_data.retinanet import retinanet_targets
from detectron.utils.cuda_graphs import graphed_training_method


@dataclass(frozen=True)
class RetinaNetParams:
    """Everything RetinaNet needs besides its modules (Detectron's RETINANET.* and FPN levels)."""
    levels: tuple = (3, 4, 5, 6, 7)  # FPN.RPN_MIN_LEVEL .. RPN_MAX_LEVEL
    scales_per_octave: int = 3
    aspect_ratios: tuple = (0.5, 1.0, 2.0)
    anchor_scale: float = 4
    positive_overlap: float = 0.5
    negative_overlap: float = 0.4
    straddle_thresh: float = -1  # TRAIN.RPN_STRADDLE_THRESH; -1 keeps every anchor, as Detectron's RetinaNet
    loss_gamma: float = 2.0
    loss_alpha: float = 0.25
    bbox_reg_beta: float = 0.11
    bbox_reg_weight: float = 1.0
    class_specific_bbox: bool = False
    softmax: bool = False  # RETINANET.SOFTMAX: one softmax over background and the classes per anchor
    train_cuda_graphs: bool = False  # on a GPU, replay body_and_head's forward and backward in training
    train_max_graphs: int = 8  # TRAIN.CUDA_GRAPHS_MAX_SHAPES

    @property
    def num_anchors(self):
        return self.scales_per_octave * len(self.aspect_ratios)


class RetinaNet(nn.Module):
    """`model(images, im_info, targets)` -> losses in training (`loss_fl_fpn<l>` and
    `loss_retnet_bbox_fpn<l>` per level, as Detectron's fl_fpn<l> / retnet_loss_bbox_fpn<l>, and the
    metric `retnet_fg_num`); in inference {'anchors', 'logits', 'deltas'}, per level, for
    retinanet_inference.

    `body_and_head(images)` is the part of the forward with fixed shapes for a given image size (no
    host synchronisation): the test path may replay it from a CUDA graph (`model(images, im_info,
    body=...)` takes its outputs from `body`), and with params.train_cuda_graphs training replays
    its forward and backward from graphs per padded batch shape, as GeneralizedRCNN's body.
    """

    def __init__(self, conv_body, head, params: RetinaNetParams):
        super().__init__()
        self.conv_body = conv_body
        self.head = head
        self.params = params
        self.channels_last = False

    def use_channels_last(self):
        """Body and head stored channels_last (as GeneralizedRCNN.use_channels_last: bf16 convolutions
        run NHWC in cuDNN); images enter the body in that layout."""
        self.to(memory_format=torch.channels_last)
        self.channels_last = True

    def forward(self, images, im_info, targets=None, body=None):
        p = self.params
        if body is None and self.training and p.train_cuda_graphs:
            body = graphed_training_method(self, 'body_and_head', RetinaNet.body_and_head, max_graphs=p.train_max_graphs)
        flat = (body or self.body_and_head)(images)
        logits, deltas = list(flat[:len(p.levels)]), list(flat[len(p.levels):])
        anchors = retinanet_heads.retinanet_anchors(
            [x.shape[-2:] for x in logits], tuple(2 ** level for level in p.levels), p.scales_per_octave,
            p.aspect_ratios, p.anchor_scale, device=images.device)
        if self.training:
            return self._losses(logits, deltas, anchors, im_info, targets)
        return {'anchors': anchors, 'logits': logits, 'deltas': deltas}

    def body_and_head(self, images):
        """The class logits, then the box deltas, of every level, as one flat tuple."""
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        logits, deltas = self.head(self.conv_body(images))
        return tuple(logits) + tuple(deltas)

    def _losses(self, logits, deltas, anchors, im_info, targets):
        p = self.params
        t = retinanet_targets(
            anchors, [x['boxes'] for x in targets], [x['classes'] for x in targets],
            [x['is_crowd'] for x in targets], im_info, positive_overlap=p.positive_overlap,
            negative_overlap=p.negative_overlap, straddle_thresh=p.straddle_thresh)
        # All levels at once: one focal loss and one smooth L1 over every anchor, summed per level after.
        logits = torch.cat([retinanet_heads.anchor_major(x, p.num_anchors) for x in logits], dim=1)
        deltas = torch.cat([retinanet_heads.anchor_major(x, p.num_anchors) for x in deltas], dim=1)
        focal_loss = retinanet_heads.softmax_focal_loss if p.softmax else retinanet_heads.sigmoid_focal_loss
        cls_loss = focal_loss(logits, t.labels, gamma=p.loss_gamma, alpha=p.loss_alpha).sum(0)
        box_loss = retinanet_heads.select_smooth_l1_loss(deltas, t.bbox_targets, t.labels, beta=p.bbox_reg_beta,
                                                         class_specific=p.class_specific_bbox).sum(0)
        # Detectron's focal and box losses divide by max(retnet_fg_num, 1) (fg_num counts 1 per image).
        normalizer = t.fg_num.clamp(min=1)
        losses = {}
        for level, level_cls, level_box in zip(p.levels, cls_loss.split(t.level_sizes), box_loss.split(t.level_sizes)):
            losses['loss_fl_fpn{}'.format(level)] = level_cls.sum() / normalizer
            losses['loss_retnet_bbox_fpn{}'.format(level)] = p.bbox_reg_weight * level_box.sum() / normalizer
        losses['retnet_fg_num'] = t.fg_num.detach()
        return losses
