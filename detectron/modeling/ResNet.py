"""Detectron's ResNet bodies (conv1 .. res5), with Detectron's module names.

Parameter names follow Caffe2 blob names (`res3_0_branch2a_w` -> `res3.0.branch2a.weight`, see
docs/DESIGN.md), so Detectron .pkl files load by name. R-50/101/152 use the bottleneck block of
Detectron's `bottleneck_transformation`; R-18/34 use two 3x3 convs (not in Detectron; small bodies
for CPU demos) with the same naming.
"""

import functools
import math

import torch.nn.functional as F
from torch import nn

from detectron.modeling.activation_checkpoint import checkpointed
from detectron.modeling.norm import norm_factory, norm_relu
from detectron.ops.max_pool import max_pool_3x3_s2
from detectron.utils.errors import ConfigValueError

# depth -> (blocks in res2, res3, res4, res5); Detectron ResNet.py add_ResNet{50,101,152}_conv5_body.
BLOCK_COUNTS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
                152: (3, 8, 36, 3)}
BASIC_BLOCK_DEPTHS = (18, 34)
FREEZE_AT_CHOICES = (0, 2, 3, 4, 5)
STAGE_NAMES = ('res2', 'res3', 'res4', 'res5')
STAGE_STRIDES = (4, 8, 16, 32)


def caffe2_xavier_fill_(conv):
    """Caffe2's XavierFill: weight ~ U(-sqrt(3 / fan_in), +sqrt(3 / fan_in)), bias 0.

    Caffe2 brew's default conv init, used by Detectron for every conv it creates without an
    explicit filler (backbone and FPN). fan_in = in_channels / groups * kh * kw.
    """
    fan_in = conv.weight[0].numel()
    bound = math.sqrt(3.0 / fan_in)
    nn.init.uniform_(conv.weight, -bound, bound)
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


def _conv(dim_in, dim_out, kernel, stride=1, groups=1):
    conv = nn.Conv2d(dim_in, dim_out, kernel, stride=stride, padding=kernel // 2,
                     groups=groups, bias=False)
    caffe2_xavier_fill_(conv)
    return conv


class _ResidualBlock(nn.Module):
    """relu(last_norm(transform(x)) + shortcut(x)); the shortcut projects (branch1) iff dims
    differ. transform runs the residual branch up to its last conv: that conv's norm, the
    shortcut's norm, the sum and the ReLU are one pass for the frozen affine (norm_relu)."""

    def _add_shortcut(self, dim_in, dim_out, stride, make_norm):
        # Detectron's basic_bn_shortcut: identity when dim_in == dim_out, else 1x1 conv + norm.
        self.has_projection = dim_in != dim_out
        if self.has_projection:
            self.branch1 = _conv(dim_in, dim_out, 1, stride)
            self.branch1_bn = make_norm(dim_out)

    def forward(self, x):
        # A projection's branch1_bn joins the last norm's pass.
        shortcut, shortcut_norm = (self.branch1(x), self.branch1_bn) if self.has_projection else (x, None)
        return norm_relu(self.last_norm(), self.transform(x), residual=shortcut, residual_norm=shortcut_norm)


class BottleneckBlock(_ResidualBlock):
    """1x1 -> norm -> relu -> 3x3 -> norm -> relu -> 1x1 -> norm (Detectron's
    bottleneck_transformation).

    stride_1x1=True puts the stride on branch2a (MSRA / Detectron, RESNETS.STRIDE_1X1);
    False puts it on the 3x3 branch2b (torchvision / fb.torch layout).
    """

    def __init__(self, dim_in, dim_out, dim_inner, stride, make_norm, stride_1x1=True, groups=1):
        super().__init__()
        stride_a, stride_b = (stride, 1) if stride_1x1 else (1, stride)
        self.branch2a = _conv(dim_in, dim_inner, 1, stride_a)
        self.branch2a_bn = make_norm(dim_inner)
        self.branch2b = _conv(dim_inner, dim_inner, 3, stride_b, groups)
        self.branch2b_bn = make_norm(dim_inner)
        self.branch2c = _conv(dim_inner, dim_out, 1)
        self.branch2c_bn = make_norm(dim_out)
        self._add_shortcut(dim_in, dim_out, stride, make_norm)

    def transform(self, x):
        x = norm_relu(self.branch2a_bn, self.branch2a(x))
        x = norm_relu(self.branch2b_bn, self.branch2b(x))
        return self.branch2c(x)

    def last_norm(self):
        return self.branch2c_bn


class BasicBlock(_ResidualBlock):
    """3x3 (with the stride) -> norm -> relu -> 3x3 -> norm, torchvision's BasicBlock layout."""

    def __init__(self, dim_in, dim_out, stride, make_norm):
        super().__init__()
        self.branch2a = _conv(dim_in, dim_out, 3, stride)
        self.branch2a_bn = make_norm(dim_out)
        self.branch2b = _conv(dim_out, dim_out, 3)
        self.branch2b_bn = make_norm(dim_out)
        self._add_shortcut(dim_in, dim_out, stride, make_norm)

    def transform(self, x):
        x = norm_relu(self.branch2a_bn, self.branch2a(x))
        return self.branch2b(x)

    def last_norm(self):
        return self.branch2b_bn


def _bottleneck_maker(dim_out, dim_inner, make_norm, stride_1x1, num_groups):
    return functools.partial(BottleneckBlock, dim_out=dim_out, dim_inner=dim_inner, make_norm=make_norm,
                             stride_1x1=stride_1x1, groups=num_groups)


def make_stage(make_block, dim_in, dim_out, count, first_stride):
    """Detectron's add_stage: `count` blocks, the first taking dim_in at stride first_stride."""
    return nn.Sequential(*[make_block(dim_in=dim_in if i == 0 else dim_out, stride=first_stride if i == 0 else 1)
                           for i in range(count)])


class ResNet(nn.Module):
    """ResNet body returning the list [res2, res3, res4, res5] of stage outputs ([res2, res3, res4]
    with num_stages=3).

    Attributes: `strides` = (4, 8, 16, 32) and `out_channels` (per stage: 256..2048 for bottleneck
    bodies, 64..512 for R-18/34), both cut to the built stages.

    Keyword arguments (cfg key in brackets, as read by model_builder):
      stride_1x1 [RESNETS.STRIDE_1X1]: stride on the 1x1 (True, MSRA) or the 3x3 (False,
        torchvision) of bottleneck blocks.
      freeze_at [TRAIN.FREEZE_AT]: 0 trains everything; k in 2..5 freezes conv1 and res2..res<k>
        (Detectron's StopGradient after stage k): their parameters get requires_grad=False and
        their BatchNorm layers (norm='bn') stay in eval mode.
      norm: 'affine' (frozen AffineChannel, Detectron's default), 'gn' [RESNETS.*_FUNC gn
        variants] or 'bn'.
      num_groups, width_per_group [RESNETS.NUM_GROUPS, WIDTH_PER_GROUP]: bottleneck width
        (ResNeXt when num_groups > 1); ignored by R-18/34.
      gn_num_groups, gn_dim_per_group, gn_eps [GROUP_NORM.NUM_GROUPS, DIM_PER_GP, EPSILON].
      checkpoint_stages: recompute each stage in backward (torch.utils.checkpoint) to save memory.
      num_stages: 4 (conv1..res5) or 3 (conv1..res4, Detectron's conv4 bodies).
    """

    def __init__(self, depth=50, *, stride_1x1=True, freeze_at=2, norm='affine', num_groups=1,
                 width_per_group=64, gn_num_groups=32, gn_dim_per_group=-1, gn_eps=1e-5,
                 checkpoint_stages=False, num_stages=4):
        super().__init__()
        if depth not in BLOCK_COUNTS:
            raise ConfigValueError('unsupported ResNet depth {}; choose one of {}'.format(
                depth, sorted(BLOCK_COUNTS)))
        # A conv4 body has no res5 to freeze (Detectron adds no StopGradient then).
        freeze_choices = tuple(k for k in FREEZE_AT_CHOICES if k <= num_stages + 1)
        if freeze_at not in freeze_choices:
            raise ConfigValueError('TRAIN.FREEZE_AT must be one of {} for a body ending at res{}, got {}'.format(
                freeze_choices, num_stages + 1, freeze_at))
        make_norm = norm_factory(norm, gn_num_groups, gn_dim_per_group, gn_eps)
        self.stride_1x1 = stride_1x1
        self.checkpoint_stages = checkpoint_stages
        self.stage_names = STAGE_NAMES[:num_stages]
        self.strides = STAGE_STRIDES[:num_stages]

        self.conv1 = _conv(3, 64, 7, stride=2)
        self.res_conv1_bn = make_norm(64)
        self.out_channels = self._add_stages(depth, make_norm, stride_1x1, num_groups,
                                             width_per_group)
        self.frozen_module_names = (
            ('conv1', 'res_conv1_bn') + STAGE_NAMES[:freeze_at - 1] if freeze_at else ())
        for name in self.frozen_module_names:
            getattr(self, name).requires_grad_(False)
        self.train()

    def _add_stages(self, depth, make_norm, stride_1x1, num_groups, width_per_group):
        dim_in, out_channels = 64, []
        for index, (name, count) in enumerate(zip(self.stage_names, BLOCK_COUNTS[depth])):
            scale = 2 ** index
            if depth in BASIC_BLOCK_DEPTHS:
                dim_out = 64 * scale
                make_block = functools.partial(BasicBlock, dim_out=dim_out, make_norm=make_norm)
            else:
                dim_out = 256 * scale
                make_block = _bottleneck_maker(dim_out, num_groups * width_per_group * scale, make_norm,
                                               stride_1x1, num_groups)
            # res2 follows the stride-2 max-pool, so only res3..res5 downsample (in block 0).
            self.add_module(name, make_stage(make_block, dim_in, dim_out, count, 1 if index == 0 else 2))
            dim_in = dim_out
            out_channels.append(dim_out)
        return tuple(out_channels)

    def train(self, mode=True):
        super().train(mode)
        # Frozen stages are constants: BatchNorm there must not update its running statistics.
        for name in self.frozen_module_names:
            getattr(self, name).train(False)
        return self

    def forward(self, x):
        x = norm_relu(self.res_conv1_bn, self.conv1(x))
        x = max_pool_3x3_s2(x)
        outputs = []
        for name in self.stage_names:
            stage = getattr(self, name)
            x = checkpointed(self.checkpoint_stages, stage, x)
            outputs.append(x)
        return outputs


class ResNetConv4Body(nn.Module):
    """Detectron's add_ResNet{50,101}_conv4_body: conv1..res4, whose output (stride 16) is the one
    feature map the single-scale RPN and the RoI head see. forward(images) returns [res4]; the
    ResNet is `body` (keys `conv_body.body.*`, as in the FPN bodies). kwargs as ResNet's."""

    def __init__(self, depth, **resnet_kwargs):
        super().__init__()
        self.body = ResNet(depth, num_stages=3, **resnet_kwargs)
        self.strides = self.body.strides[-1:]
        self.out_channels = self.body.out_channels[-1]

    def forward(self, images):
        return self.body(images)[-1:]


def add_ResNet50_conv4_body(**kwargs):
    """R-50-C4 body; kwargs as ResNet's."""
    return ResNetConv4Body(50, **kwargs)


def add_ResNet101_conv4_body(**kwargs):
    """R-101-C4 body; kwargs as ResNet's."""
    return ResNetConv4Body(101, **kwargs)


# Detectron's head average-pools a 7 x 7 res5 map (kernel 7) before its fully connected outputs.
ROI_CONV5_POOLED_SIZE = 7


class ResNetRoIConv5Head(nn.Module):
    """Detectron's add_ResNet_roi_conv5_head after the RoI transform: res5 (3 bottleneck blocks,
    dim_in -> 2048, the first at stride roi_size // 7) on each RoI's features (R, dim_in, roi_size,
    roi_size), then a 7 x 7 average pool: forward returns (R, 2048). conv5(x) is the res5 map before
    the pool (R, 2048, 7, 7), Detectron's `res5_2_sum`, which its v0upshare mask head reuses.

    Parameters are `res5.<block>.*` (Detectron's `res5_<block>_*` blobs). Keyword arguments as
    ResNet's (stride_1x1, norm, num_groups, width_per_group, gn_*); roi_size [FAST_RCNN.
    ROI_XFORM_RESOLUTION] must be a multiple of 7.
    """

    def __init__(self, dim_in, *, roi_size=14, stride_1x1=True, norm='affine', num_groups=1, width_per_group=64,
                 gn_num_groups=32, gn_dim_per_group=-1, gn_eps=1e-5):
        super().__init__()
        if roi_size % ROI_CONV5_POOLED_SIZE:
            raise ConfigValueError('FAST_RCNN.ROI_XFORM_RESOLUTION {} must be a multiple of 7 for the res5 RoI head: '
                                   'its res5 map is average-pooled with a 7 x 7 kernel'.format(roi_size))
        make_norm = norm_factory(norm, gn_num_groups, gn_dim_per_group, gn_eps)
        make_block = _bottleneck_maker(2048, num_groups * width_per_group * 8, make_norm, stride_1x1, num_groups)
        self.res5 = make_stage(make_block, dim_in, 2048, 3, roi_size // ROI_CONV5_POOLED_SIZE)
        self.dim_out = 2048

    def conv5(self, roi_features):
        return self.res5(roi_features)

    def pool(self, conv5):
        return F.avg_pool2d(conv5, ROI_CONV5_POOLED_SIZE, stride=1).flatten(1)

    def forward(self, roi_features):
        return self.pool(self.conv5(roi_features))
