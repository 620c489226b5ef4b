"""Modulated deformable convolution (DCNv2) as CenterNet's backbones use it.

CenterNet ships a compiled DCNv2 extension (`DCN` in its `networks/DCNv2/dcn_v2.py`); this module
computes the same function with `torchvision.ops.deform_conv2d`, so nothing has to be compiled and
the CPU works too. Parameter names and shapes are CenterNet's (`weight`, `bias`,
`conv_offset_mask.weight`, `conv_offset_mask.bias`), so its checkpoints load tensor for tensor.

The offset/mask layout needs no conversion: for kernel tap k = i * kw + j, offset channel 2k is the
vertical and 2k + 1 the horizontal displacement and mask channel k the modulation, in both DCNv2's
CUDA kernel and torchvision; samples outside the image read zero in both.
"""

import math

import torch
from torch import nn
from torchvision.ops import deform_conv2d


class DCN(nn.Module):
    """k x k modulated deformable conv whose offsets and masks come from a plain conv of the input.

    `conv_offset_mask` predicts 3 * k * k channels, split in three equal chunks (o1, o2, m):
    offsets = cat(o1, o2), masks = sigmoid(m). It starts at zero, i.e. as a regular conv whose
    taps are all weighted by sigmoid(0) = 0.5.
    """

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        self.conv_offset_mask = nn.Conv2d(in_channels, 3 * kernel_size * kernel_size, kernel_size,
                                          stride=stride, padding=padding, bias=True)
        self.reset_parameters()

    def reset_parameters(self):
        """DCNv2's init: weight U(-b, b) with b = 1 / sqrt(in_channels * k * k), bias 0, and a
        zero offset/mask predictor."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size * self.kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.zeros_(self.bias)
        nn.init.zeros_(self.conv_offset_mask.weight)
        nn.init.zeros_(self.conv_offset_mask.bias)

    def forward(self, x):
        offset_head, offset_tail, mask_logits = torch.chunk(self.conv_offset_mask(x), 3, dim=1)
        offset = torch.cat((offset_head, offset_tail), dim=1)
        return deform_conv2d(x, offset, self.weight, self.bias, stride=self.stride,
                             padding=self.padding, mask=torch.sigmoid(mask_logits))

    def extra_repr(self):
        return '{}, {}, kernel_size={}, stride={}, padding={}'.format(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)
