"""Per-channel normalisation layers of the ResNet and FPN bodies.

Detectron fine-tunes ImageNet models with batch norm replaced by a frozen per-channel affine
(`AffineChannel`); its GN option uses trainable GroupNorm. Trainable BatchNorm is offered for
from-scratch training (the caller may convert it to SyncBatchNorm). Whatever the kind, the module
keeps the attribute name Detectron gives the affine (`res2_0_branch2a_bn` -> `branch2a_bn`), so
checkpoints map by name.
"""

import functools

import torch
from torch import nn

from detectron.ops.affine_relu import affine, affine_relu, sum_relu
from detectron.utils.errors import ConfigValueError

NORM_KINDS = ('affine', 'gn', 'bn')


class AffineChannel(nn.Module):
    """y = x * weight + bias per channel, with weight and bias fixed.

    Detectron's AffineChannel never receives gradients (Caffe2 only computes them when
    `is_learnable` is set, which Detectron never does), so weight and bias are buffers: they are
    saved in the state_dict as `<name>.weight` / `<name>.bias` but are not parameters.
    """

    def __init__(self, num_channels):
        super().__init__()
        self.register_buffer('weight', torch.ones(num_channels))
        self.register_buffer('bias', torch.zeros(num_channels))

    def forward(self, x):
        return affine(x, *self._in_dtype_of(x))

    def forward_relu(self, x, residual=None, residual_norm=None):
        """relu(self(x) (+ residual_norm(residual))), in one pass where affine_relu's kernel serves;
        residual_norm, when given, is an AffineChannel."""
        residual_affine = residual_norm._in_dtype_of(residual) if residual_norm is not None else None
        return affine_relu(x, *self._in_dtype_of(x), residual, residual_affine)

    def _in_dtype_of(self, x):
        # Cast so half-precision activations stay half instead of promoting to float32.
        return self.weight.to(x.dtype), self.bias.to(x.dtype)

    def extra_repr(self):
        return 'num_channels={}'.format(self.weight.numel())


def norm_relu(norm, x, residual=None, residual_norm=None):
    """relu(norm(x) (+ residual_norm(residual), or residual)): the frozen affines' fused pass
    (AffineChannel.forward_relu), other norms as separate operations."""
    if isinstance(norm, AffineChannel) and (residual_norm is None or isinstance(residual_norm, AffineChannel)):
        return norm.forward_relu(x, residual, residual_norm)
    if residual_norm is not None:
        residual = residual_norm(residual)
    return sum_relu(norm(x), residual)


def group_norm_groups(dim, num_groups=32, dim_per_group=-1):
    """Number of GroupNorm groups for `dim` channels, as Detectron's `get_group_gn`.

    Exactly one of `num_groups` (GROUP_NORM.NUM_GROUPS) and `dim_per_group`
    (GROUP_NORM.DIM_PER_GP) is used; the other must be -1.
    """
    if dim_per_group != -1 and num_groups != -1:
        raise ConfigValueError(
            'GROUP_NORM: set either NUM_GROUPS ({}) or DIM_PER_GP ({}) and the other to -1'
            .format(num_groups, dim_per_group))
    divisor = dim_per_group if dim_per_group > 0 else num_groups
    if divisor <= 0 or dim % divisor:
        raise ConfigValueError(
            'GROUP_NORM: {} channels cannot be split by {} (NUM_GROUPS={}, DIM_PER_GP={}); '
            'choose a divisor of the channel counts'.format(dim, divisor, num_groups, dim_per_group))
    return dim // dim_per_group if dim_per_group > 0 else num_groups


def _make_norm(dim, kind, gn_num_groups, gn_dim_per_group, gn_eps):
    if kind == 'affine':
        return AffineChannel(dim)
    if kind == 'gn':
        return nn.GroupNorm(group_norm_groups(dim, gn_num_groups, gn_dim_per_group), dim, eps=gn_eps)
    return nn.BatchNorm2d(dim)


def norm_factory(kind, gn_num_groups=32, gn_dim_per_group=-1, gn_eps=1e-5):
    """Return `make(dim) -> nn.Module` building the chosen normalisation for `dim` channels.

    kind: 'affine' (frozen AffineChannel, for pretrained weights), 'gn' (trainable GroupNorm with
    Detectron's GROUP_NORM.NUM_GROUPS / DIM_PER_GP / EPSILON) or 'bn' (trainable BatchNorm2d).
    """
    if kind not in NORM_KINDS:
        raise ConfigValueError(
            "unknown norm kind '{}'; choose one of {}".format(kind, ', '.join(NORM_KINDS)))
    return functools.partial(
        _make_norm, kind=kind, gn_num_groups=gn_num_groups,
        gn_dim_per_group=gn_dim_per_group, gn_eps=gn_eps)
