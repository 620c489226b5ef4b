"""Mask R-CNN head: Detectron's `mask_rcnn_fcn_head_v1up4convs` (and its `_gn` variant) or the
upsampling part of `mask_rcnn_fcn_head_v0upshare` (C4 models: on the box head's res5 map), followed by
`add_mask_rcnn_outputs`, and the mask loss of `add_mask_rcnn_losses`.

Parameter names follow Detectron's blob names: `fcn1..4` (`_[mask]_fcn1_w`, or `_mask_fcn1_w` with
`_mask_fcn1_gn_s/_b` in the GroupNorm variant), `conv5_mask` and `mask_fcn_logits`, so a Detectron
.pkl maps onto the module mechanically (checkpoint/c2_weights.py).
"""
import torch
import torch.nn.functional as F
from torch import nn

from detectron.modeling.fast_rcnn_heads import caffe2_msra_fill_

# MRCNN.ROI_MASK_HEAD -> (number of 3x3 convolutions, GroupNorm after each).
MASK_HEADS = {
    'mask_rcnn_heads.mask_rcnn_fcn_head_v1up4convs': (4, False),
    'mask_rcnn_heads.mask_rcnn_fcn_head_v1up4convs_gn': (4, True),
}
# The C4 head: conv5_mask and the logits on the res5 map of the box head (ResNetRoIConv5Head), whose
# weights it shares (Detectron's test net loads `_[mask]_res5_*` from `res5_*`).
SHARED_RES5_MASK_HEAD = 'mask_rcnn_heads.mask_rcnn_fcn_head_v0upshare'
CONV_INITS = ('GaussianFill', 'MSRAFill')


def init_conv_(conv, conv_init, std=0.001):
    """Detectron's conv init: MSRAFill, or GaussianFill of std; bias 0."""
    if conv_init == 'MSRAFill':
        caffe2_msra_fill_(conv.weight)
    else:
        nn.init.normal_(conv.weight, std=std)
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


class MaskRCNNHead(nn.Module):
    """RoI features (R, dim_in, S, S) -> mask logits (R, num_outputs, 2S, 2S).

    num_convs x (conv 3x3 at dim_reduced [+ GroupNorm] + ReLU), a 2x2 stride-2 transposed
    convolution to dim_reduced + ReLU (`conv5_mask`; straight from dim_in when num_convs is 0, the
    v0upshare head), then 1x1 logits (`mask_fcn_logits`): num_outputs is
    MODEL.NUM_CLASSES with MRCNN.CLS_SPECIFIC_MASK, else 1. conv_init [MRCNN.CONV_INIT] fills every
    weight but the class-agnostic logits (GaussianFill std 0.001 there, as Detectron); biases 0.
    Detectron's ConvGN convolutions have no bias. gn_groups(dim) gives the GroupNorm group count.
    """

    def __init__(self, dim_in, num_outputs, num_convs=4, dim_reduced=256, use_gn=False, gn_groups=None,
                 gn_eps=1e-5, conv_init='MSRAFill'):
        super().__init__()
        self.num_convs = num_convs
        self.use_gn = use_gn
        for i in range(1, num_convs + 1):
            conv = nn.Conv2d(dim_in if i == 1 else dim_reduced, dim_reduced, 3, padding=1, bias=not use_gn)
            init_conv_(conv, conv_init)
            setattr(self, f'fcn{i}', conv)
            if use_gn:
                setattr(self, f'fcn{i}_gn', nn.GroupNorm(gn_groups(dim_reduced), dim_reduced, eps=gn_eps))
        self.conv5_mask = nn.ConvTranspose2d(dim_reduced if num_convs else dim_in, dim_reduced, 2, stride=2)
        init_conv_(self.conv5_mask, conv_init)
        self.mask_fcn_logits = nn.Conv2d(dim_reduced, num_outputs, 1)
        init_conv_(self.mask_fcn_logits, conv_init if num_outputs > 1 else 'GaussianFill')

    def forward(self, x):
        for i in range(1, self.num_convs + 1):
            x = getattr(self, f'fcn{i}')(x)
            if self.use_gn:
                x = getattr(self, f'fcn{i}_gn')(x)
            x = F.relu(x)
        return self.mask_fcn_logits(F.relu(self.conv5_mask(x)))


def mask_loss(mask_logits, mask_classes, mask_targets, weight=1.0):
    """Detectron's `add_mask_rcnn_losses`: Caffe2's SigmoidCrossEntropyLoss over the target
    elements that are not -1, summed and divided by their number (at least 1e-5), times weight
    [MRCNN.WEIGHT_LOSS_MASK].

    mask_logits (R, C, M, M); mask_classes (R,) int64: the channel holding each RoI's target (its
    class with class-specific masks, 0 when C is 1); mask_targets (R, M, M) in {-1, 0, 1}.
    Detectron spreads the targets over every class channel with -1 outside the RoI's own class;
    those elements add nothing to the sum or the count, so only the own channel is read here.
    """
    logits = mask_logits[torch.arange(len(mask_classes), device=mask_logits.device), mask_classes].float()
    valid = (mask_targets != -1).to(logits.dtype)
    per_element = F.binary_cross_entropy_with_logits(logits, mask_targets.clamp(min=0).to(logits.dtype),
                                                     reduction='none')
    return weight * (per_element * valid).sum() / valid.sum().clamp(min=1e-5)
