"""CenterNet's DCN layer: a modulated deformable conv (DCNv2) whose offsets and masks come from a plain
conv of the input, with CenterNet's parameter names (its checkpoints load tensor for tensor). The op
itself is ops/deform_conv.py."""
import math

import torch
from torch import nn

from detectron.ops.deform_conv import modulated_deform_conv2d


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
        offset_mask = self.conv_offset_mask(x)
        # cat(o1, o2) of the three chunks is the first two thirds of the channels, as they are.
        taps = self.kernel_size * self.kernel_size
        offset, mask_logits = offset_mask[:, :2 * taps], offset_mask[:, 2 * taps:]
        return modulated_deform_conv2d(x, offset, torch.sigmoid(mask_logits), self.weight, self.bias,
                                       stride=self.stride, padding=self.padding)

    def extra_repr(self):
        return '{}, {}, kernel_size={}, stride={}, padding={}'.format(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)
