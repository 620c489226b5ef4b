"""Modulated deformable convolution (DCNv2) as CenterNet's backbones use it.

CenterNet ships a compiled DCNv2 extension (`DCN` in its `networks/DCNv2/dcn_v2.py`); this module
computes the same function from torch ops (bilinear sampling by `grid_sample`, then one matmul), so
nothing has to be compiled and the CPU works too. Parameter names and shapes are CenterNet's
(`weight`, `bias`, `conv_offset_mask.weight`, `conv_offset_mask.bias`), so its checkpoints load tensor
for tensor.

Why not `torchvision.ops.deform_conv2d`, which computes the same function: it replays wrong values from
a CUDA graph (torchvision 0.26, BENCHMARKS.md), so a detector with it cannot be graphed at batch 1, and
under autocast it runs its im2col / col2im and the matmul in float32. Here the sampling positions and
the bilinear sampling stay in float32 (a bfloat16 position would be off by up to half a pixel at 128)
and the matmul follows autocast like any convolution. tests/modeling/test_dcn.py checks both against a
loop-by-loop DCNv2.

The offset/mask layout is DCNv2's: for kernel tap t = i * kw + j, offset channel 2t is the vertical
and 2t + 1 the horizontal displacement and mask channel t the modulation; a sample at (y, x) is the
bilinear interpolation of its four neighbours, those outside the image reading zero (zero unless
-1 < y < H and -1 < x < W).
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn


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
        return modulated_deform_conv2d(x, offset, torch.sigmoid(mask_logits), self.weight, self.bias,
                                       stride=self.stride, padding=self.padding)

    def extra_repr(self):
        return '{}, {}, kernel_size={}, stride={}, padding={}'.format(
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)


def modulated_deform_conv2d(x, offset, mask, weight, bias, stride=1, padding=0):
    """DCNv2 of x (N, C, H, W) with offsets (N, 2 * taps, Ho, Wo), masks (N, taps, Ho, Wo) and a
    (O, C, kh, kw) weight -> (N, O, Ho, Wo); one offset group, dilation 1."""
    n, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[-2:]
    taps = kh * kw
    sample_dtype = torch.promote_types(x.dtype, torch.float32)
    offset = offset.to(sample_dtype).view(n, taps, 2, out_h, out_w)
    tap_y, tap_x = _tap_positions(kh, kw, out_h, out_w, stride, padding, x.device, sample_dtype)
    sample_y = tap_y + offset[:, :, 0]
    sample_x = tap_x + offset[:, :, 1]
    # grid_sample's coordinates for align_corners=False: pixel p <-> (2p + 1) / size - 1.
    grid = torch.stack(((2 * sample_x + 1) / width - 1, (2 * sample_y + 1) / height - 1), dim=-1)
    columns = F.grid_sample(x.to(sample_dtype), grid.view(n, taps * out_h, out_w, 2), mode='bilinear',
                            padding_mode='zeros', align_corners=False)
    columns = columns.view(n, channels, taps, out_h * out_w) * mask.to(sample_dtype).view(n, 1, taps, -1)
    out = torch.matmul(weight.reshape(out_channels, channels * taps), columns.view(n, channels * taps, -1))
    return (out + bias.view(-1, 1).to(out.dtype)).view(n, out_channels, out_h, out_w)


def _tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype):
    """Where each tap t = i * kw + j of each output pixel reads without offset: (taps, Ho, 1) rows
    and (taps, 1, Wo) columns. Made once per shape and device (about ten small kernels, a sizeable
    share of a batch-1 forward); a CUDA graph capture makes its own, since tensors made while
    capturing hold their values only in the graph's replays."""
    if device.type == 'cuda' and torch.cuda.is_current_stream_capturing():
        return _make_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype)
    return _cached_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype)


def _make_tap_positions(kh, kw, out_h, out_w, stride, padding, device, dtype):
    rows = torch.arange(out_h, device=device, dtype=dtype) * stride - padding
    cols = torch.arange(out_w, device=device, dtype=dtype) * stride - padding
    tap_i = torch.arange(kh, device=device, dtype=dtype).repeat_interleave(kw)
    tap_j = torch.arange(kw, device=device, dtype=dtype).repeat(kh)
    return rows.view(1, -1, 1) + tap_i.view(-1, 1, 1), cols.view(1, 1, -1) + tap_j.view(-1, 1, 1)


_cached_tap_positions = functools.lru_cache(maxsize=256)(_make_tap_positions)
