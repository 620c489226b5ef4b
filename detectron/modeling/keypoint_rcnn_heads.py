"""Keypoint R-CNN head: Detectron's `add_roi_pose_head_v1convX` followed by `add_keypoint_outputs`,
and the spatial softmax loss of `add_keypoint_losses`.

Parameter names follow Detectron's blob names: `conv_fcn1..N`, `kps_deconv`, `kps_score_lowres`
(`kps_score` when the heatmaps are not upsampled) and the fixed bilinear `kps_score`, so a Detectron
.pkl maps onto the module mechanically (checkpoint/c2_weights.py).
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectron.modeling.mask_rcnn_heads import init_conv_

# KRCNN.ROI_KEYPOINTS_HEAD values this port builds.
KEYPOINT_HEADS = ('keypoint_rcnn_heads.add_roi_pose_head_v1convX',)


class KeypointRCNNHead(nn.Module):
    """RoI features (R, dim_in, S, S) -> keypoint heatmap logits (R, K, M, M).

    num_convs x (conv kernel x kernel at conv_dim + ReLU) [`conv_fcn<i>`, conv_init std 0.01];
    with use_deconv a stride-2 transposed convolution + ReLU [`kps_deconv`, Gaussian std 0.01];
    the K outputs by a stride-2 transposed convolution (use_deconv_output) or a 1x1 convolution
    [conv_init std 0.001]; with up_scale > 1 Detectron's fixed bilinear upsampling by up_scale. Biases 0.
    """

    def __init__(self, dim_in, num_keypoints, num_convs=8, conv_dim=512, kernel=3, conv_init='MSRAFill',
                 use_deconv=False, deconv_dim=256, deconv_kernel=4, use_deconv_output=True, up_scale=2):
        super().__init__()
        self.num_convs = num_convs
        for i in range(1, num_convs + 1):
            conv = nn.Conv2d(dim_in if i == 1 else conv_dim, conv_dim, kernel, padding=kernel // 2)
            init_conv_(conv, conv_init, std=0.01)
            setattr(self, f'conv_fcn{i}', conv)
        dim = conv_dim if num_convs else dim_in
        pad = deconv_kernel // 2 - 1
        self.kps_deconv = None
        if use_deconv:
            self.kps_deconv = nn.ConvTranspose2d(dim, deconv_dim, deconv_kernel, stride=2, padding=pad)
            init_conv_(self.kps_deconv, 'GaussianFill', std=0.01)
            dim = deconv_dim
        if use_deconv_output:
            score = nn.ConvTranspose2d(dim, num_keypoints, deconv_kernel, stride=2, padding=pad)
        else:
            score = nn.Conv2d(dim, num_keypoints, 1)
        init_conv_(score, conv_init, std=0.001)
        if up_scale > 1:
            self.kps_score_lowres = score
            self.kps_score = BilinearUpsample(num_keypoints, up_scale)
        else:
            self.kps_score = score

    def forward(self, x):
        for i in range(1, self.num_convs + 1):
            x = F.relu(getattr(self, f'conv_fcn{i}')(x))
        if self.kps_deconv is not None:
            x = F.relu(self.kps_deconv(x))
        if isinstance(self.kps_score, BilinearUpsample):
            x = self.kps_score_lowres(x)
        return self.kps_score(x)


def bilinear_kernel(size):
    """Detectron's upsample_filt: the size x size bilinear kernel of the FCN code."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    og = np.ogrid[:size, :size]
    return (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)


class BilinearUpsample(nn.Module):
    """Detectron's BilinearInterpolation: a transposed convolution (kernel 2s, stride s, padding s / 2)
    with a fixed per-channel bilinear kernel and zero bias; kept as buffers `weight` / `bias` (Detectron
    never updates them) so that its .pkl's `kps_score_w` / `_b` load into them."""

    def __init__(self, channels, up_scale):
        super().__init__()
        if up_scale % 2:
            raise ValueError(f'the bilinear upsampling scale must be even, got {up_scale}')
        self.up_scale = up_scale
        kernel = np.zeros((channels, channels, 2 * up_scale, 2 * up_scale), dtype=np.float32)
        kernel[range(channels), range(channels)] = bilinear_kernel(2 * up_scale)
        self.register_buffer('weight', torch.from_numpy(kernel))
        self.register_buffer('bias', torch.zeros(channels))

    def forward(self, x):
        # Channels do not mix: the diagonal of the kernel as a grouped (depthwise) transposed convolution.
        channels = self.weight.shape[0]
        diagonal = self.weight[range(channels), range(channels)].unsqueeze(1).to(x.dtype)
        return F.conv_transpose2d(x, diagonal, self.bias.to(x.dtype), stride=self.up_scale,
                                  padding=self.up_scale // 2, groups=channels)


def keypoint_loss(heatmap_logits, labels, weights, loss_weight=1.0, normalizer=None):
    """Detectron's `add_keypoint_losses`: Caffe2's SoftmaxWithLoss over the M * M positions of each
    keypoint's heatmap (each position a class), each (RoI, keypoint) term weighted by weights and the
    sum divided by the weights' sum (0 when it is 0), times loss_weight [KRCNN.LOSS_WEIGHT]; with
    normalizer (KRCNN.NORMALIZE_BY_VISIBLE_KEYPOINTS False) also times that constant.

    heatmap_logits (R, K, M, M); labels (R, K) int64 linear positions; weights (R, K) float."""
    logits = heatmap_logits.float().flatten(2).flatten(0, 1)
    per_term = F.cross_entropy(logits, labels.flatten(), reduction='none')
    w = weights.flatten().to(per_term.dtype)
    total = w.sum()
    loss = loss_weight * (per_term * w).sum() / torch.where(total > 0, total, torch.ones_like(total))
    return loss if normalizer is None else loss * normalizer
