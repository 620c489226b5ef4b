"""Detectron's Feature Pyramid Network over a ResNet body (Detectron FPN.py add_fpn).

Lateral 1x1 convs (`fpn_inner`) and 3x3 output convs (`fpn_layer`) are indexed 0..3 for
res2..res5; Detectron names them after the last block of each stage, e.g. `fpn_inner.2` is
`fpn_inner_res4_5_sum_lateral` in R-50 and `fpn_inner_res4_22_sum_lateral` in R-101.
"""

import torch.nn.functional as F
from torch import nn

from detectron.modeling.ResNet import ResNet, caffe2_xavier_fill_
from detectron.modeling.norm import group_norm_groups
from detectron.ops.upsample_add import upsample_add
from detectron.utils.errors import ConfigValueError

_LOWEST_LEVEL = 2  # the body's finest stage, res2 (Detectron's LOWEST_BACKBONE_LVL)


def _conv_norm(dim_in, dim_out, kernel, use_gn, gn_groups, gn_eps):
    """Conv (XavierFill, bias 0) and its GroupNorm or Identity; Detectron's ConvGN has no conv bias."""
    conv = nn.Conv2d(dim_in, dim_out, kernel, padding=kernel // 2, bias=not use_gn)
    caffe2_xavier_fill_(conv)
    norm = nn.GroupNorm(gn_groups(dim_out), dim_out, eps=gn_eps) if use_gn else nn.Identity()
    return conv, norm


class FPNBody(nn.Module):
    """ResNet body + FPN; forward(images) returns [P<min_level>, ..., P<max_level>] ([P2 .. P6] by default).

    Stored as `conv_body` in a model, its parameters are `conv_body.body.*` (the ResNet),
    `conv_body.fpn_inner.*` and `conv_body.fpn_layer.*` (and `fpn_inner_gn.*` / `fpn_layer_gn.*`
    with GroupNorm). Above P5, as Detectron's add_fpn: without extra_conv_levels a P6 is P5
    subsampled by a kernel-1 stride-2 max-pool (no parameters); with extra_conv_levels (RetinaNet's
    FPN.EXTRA_CONV_LEVELS) P6 is a stride-2 3x3 conv on C5 and each further level one on the ReLU
    of the level below (`conv_body.fpn_extra.<i>`, Detectron's `fpn_6`, `fpn_7`).

    Arguments (cfg key in brackets): bottom_up, a body with `out_channels` for res2..res5 returning
    their outputs as a list; dim [FPN.DIM]; use_gn [FPN.USE_GN]; zero_init_lateral
    [FPN.ZERO_INIT_LATERAL] zero-initialises the lateral 1x1 convs of res2..res4;
    gn_num_groups, gn_dim_per_group, gn_eps [GROUP_NORM.*]; coarsest_stride
    [FPN.COARSEST_STRIDE]: the multiple images are padded to; it and the input height and width
    must be multiples of the body's coarsest stride (32) so that every top-down upsampling is an
    exact 2x. min_level, max_level [FPN.RPN_MIN_LEVEL / RPN_MAX_LEVEL for RetinaNet]: the levels
    returned; below min_level no lateral or output conv is built (their slots hold parameterless
    Identity modules, so that `fpn_inner.<i>` stays stage res<i+2> as Detectron names it).
    """

    def __init__(self, bottom_up, dim=256, *, use_gn=False, zero_init_lateral=False,
                 gn_num_groups=32, gn_dim_per_group=-1, gn_eps=1e-5, coarsest_stride=32,
                 min_level=2, max_level=6, extra_conv_levels=False):
        super().__init__()
        top_level = _LOWEST_LEVEL + len(bottom_up.out_channels) - 1
        if not (_LOWEST_LEVEL <= min_level <= top_level) or max_level < top_level or (
                not extra_conv_levels and max_level > top_level + 1):
            raise ConfigValueError('FPN levels {}..{} cannot be built on a body with levels {}..{}{}'.format(
                min_level, max_level, _LOWEST_LEVEL, top_level,
                '' if extra_conv_levels else ' (levels above {} need FPN.EXTRA_CONV_LEVELS True)'.format(
                    top_level + 1)))
        if coarsest_stride % bottom_up.strides[-1]:
            raise ConfigValueError(
                'FPN.COARSEST_STRIDE ({}) must be a multiple of the body stride {}'.format(
                    coarsest_stride, bottom_up.strides[-1]))
        self.body = bottom_up
        self.out_channels = dim
        self.min_level, self.max_level = min_level, max_level
        self.strides = tuple(2 ** level for level in range(min_level, max_level + 1))

        def gn_groups(channels):
            return group_norm_groups(channels, gn_num_groups, gn_dim_per_group)

        skipped = min_level - _LOWEST_LEVEL
        unused = [(nn.Identity(), nn.Identity())] * skipped
        inner = unused + [_conv_norm(c, dim, 1, use_gn, gn_groups, gn_eps) for c in bottom_up.out_channels[skipped:]]
        layer = unused + [_conv_norm(dim, dim, 3, use_gn, gn_groups, gn_eps) for _ in bottom_up.out_channels[skipped:]]
        self.fpn_inner = nn.ModuleList(conv for conv, _ in inner)
        self.fpn_inner_gn = nn.ModuleList(norm for _, norm in inner)
        self.fpn_layer = nn.ModuleList(conv for conv, _ in layer)
        self.fpn_layer_gn = nn.ModuleList(norm for _, norm in layer)
        if zero_init_lateral:
            # The coarsest 1x1 only seeds the top-down path and keeps its Xavier init in Detectron.
            for conv in self.fpn_inner[skipped:-1]:
                nn.init.zeros_(conv.weight)
        self.fpn_extra = nn.ModuleList()
        if extra_conv_levels:
            dims_in = [bottom_up.out_channels[-1]] + [dim] * (max_level - top_level - 1)
            for dim_in in dims_in:
                conv = nn.Conv2d(dim_in, dim, 3, stride=2, padding=1)
                caffe2_xavier_fill_(conv)
                self.fpn_extra.append(conv)
        self.max_pool_p6 = not extra_conv_levels and max_level == top_level + 1

    def _check_input_size(self, images):
        height, width = images.shape[-2:]
        stride = self.body.strides[-1]
        if height % stride or width % stride:
            raise ConfigValueError(
                'FPN input size {}x{} is not a multiple of {}; pad images to a multiple of '
                'FPN.COARSEST_STRIDE ({})'.format(height, width, stride, stride))

    def forward(self, images):
        self._check_input_size(images)
        features = self.body(images)
        top = len(features) - 1
        inner = self.fpn_inner_gn[top](self.fpn_inner[top](features[top]))
        outputs = [self.fpn_layer_gn[top](self.fpn_layer[top](inner))]
        for level in range(top - 1, self.min_level - _LOWEST_LEVEL - 1, -1):
            lateral = self.fpn_inner_gn[level](self.fpn_inner[level](features[level]))
            inner = upsample_add(lateral, inner)
            outputs.insert(0, self.fpn_layer_gn[level](self.fpn_layer[level](inner)))
        if self.max_pool_p6:
            outputs.append(F.max_pool2d(outputs[-1], kernel_size=1, stride=2))
        extra_in = features[top]
        for i, conv in enumerate(self.fpn_extra):
            outputs.append(conv(F.relu(extra_in) if i else extra_in))
            extra_in = outputs[-1]
        return outputs


def fpn_resnet_body(depth, *, fpn_dim=256, fpn_use_gn=False, zero_init_lateral=False,
                    gn_num_groups=32, gn_dim_per_group=-1, gn_eps=1e-5, coarsest_stride=32,
                    min_level=2, max_level=6, extra_conv_levels=False, **resnet_kwargs):
    """FPNBody over ResNet(depth, **resnet_kwargs); GROUP_NORM settings go to both."""
    gn_kwargs = dict(gn_num_groups=gn_num_groups, gn_dim_per_group=gn_dim_per_group, gn_eps=gn_eps)
    body = ResNet(depth, **gn_kwargs, **resnet_kwargs)
    return FPNBody(body, fpn_dim, use_gn=fpn_use_gn, zero_init_lateral=zero_init_lateral,
                   coarsest_stride=coarsest_stride, min_level=min_level, max_level=max_level,
                   extra_conv_levels=extra_conv_levels, **gn_kwargs)


def add_fpn_ResNet50_conv5_body(**kwargs):
    """R-50-FPN body; kwargs as `fpn_resnet_body` (FPN options) and `ResNet` (the rest)."""
    return fpn_resnet_body(50, **kwargs)


def add_fpn_ResNet101_conv5_body(**kwargs):
    """R-101-FPN body; kwargs as `add_fpn_ResNet50_conv5_body`."""
    return fpn_resnet_body(101, **kwargs)


def add_fpn_ResNet152_conv5_body(**kwargs):
    """R-152-FPN body (X-152-32x8d with RESNETS.NUM_GROUPS 32, WIDTH_PER_GROUP 8); kwargs as
    `add_fpn_ResNet50_conv5_body`."""
    return fpn_resnet_body(152, **kwargs)


def add_fpn_ResNet18_conv5_body(**kwargs):
    """R-18-FPN body (basic blocks, not in Detectron); kwargs as `add_fpn_ResNet50_conv5_body`."""
    return fpn_resnet_body(18, **kwargs)


def add_fpn_ResNet34_conv5_body(**kwargs):
    """R-34-FPN body (basic blocks, not in Detectron); kwargs as `add_fpn_ResNet50_conv5_body`."""
    return fpn_resnet_body(34, **kwargs)
