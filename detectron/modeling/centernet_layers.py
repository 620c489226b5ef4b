"""Pieces shared by CenterNet's ResNet and DLA backbones: BatchNorm settings and the bilinear
initialisation of their learned (transposed-conv) upsampling layers."""

import functools
import math

import torch
from torch import nn

# CenterNet's BN_MOMENTUM (PyTorch's convention: weight of the new batch statistics).
BN_MOMENTUM = 0.1
BatchNorm2d = functools.partial(nn.BatchNorm2d, momentum=BN_MOMENTUM)


def bilinear_kernel(size):
    """(size, size) bilinear interpolation kernel of CenterNet's fill_up_weights:
    with f = ceil(size / 2) and c = (2f - 1 - f % 2) / (2f), entry (i, j) is
    (1 - |i / f - c|) * (1 - |j / f - c|); e.g. size 4 -> outer([.25, .75, .75, .25]) twice."""
    f = math.ceil(size / 2)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    profile = 1 - (torch.arange(size, dtype=torch.float64) / f - c).abs()
    return torch.outer(profile, profile)


def fill_up_weights(up):
    """Write the bilinear kernel into weight[:, 0] of a ConvTranspose2d (weight shape
    (in, out / groups, k, k)), as CenterNet does: for a depthwise layer that is every weight, for
    a dense one only output channel 0 of each input channel, the rest keeps PyTorch's init."""
    with torch.no_grad():
        up.weight[:, 0] = bilinear_kernel(up.weight.shape[-1]).to(up.weight.dtype)
