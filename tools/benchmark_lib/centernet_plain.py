"""A plain PyTorch port of CenterNet's ctdet training step for resdcn_18, the benchmark's yardstick.

What a user porting CenterNet (github:xingyizhou/CenterNet) to today's torch would write, with nothing
of this repository's model code: resnet_dcn.py's PoseResNet (ResNet-18 of BasicBlocks, then three
up-sampling stages of DCNv2 3x3 + BN + ReLU + ConvTranspose2d 4x4/2 + BN + ReLU to 256, 128, 64
channels, heads hm / wh / reg of conv 3x3 + ReLU + conv 1x1), the DCN by
`torchvision.ops.deform_conv2d` (offsets and the sigmoid mask from one conv, DCNv2's layout),
losses.py's focal loss and RegL1Loss and trains/ctdet.py's CtdetLoss on dense targets (hm, ind,
reg_mask, wh, reg), NCHW, no fusions, no CUDA graphs, precision by autocast alone.

Parameter names are CenterNet's, so `load_from_ours` copies this repository's model in by
checkpoint/centernet_weights.py's name mapping and both start from the same weights.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import deform_conv2d

from detectron.checkpoint.centernet_weights import centernet_key_to_ours

_PROB_EPS = 1e-4


class BasicBlock(nn.Module):
    def __init__(self, in_channels, channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class DCN(nn.Module):
    """DCNv2 3x3: conv_offset_mask predicts 27 channels, the first 18 the (dy, dx) offsets of the 9
    taps, the last 9 the mask logits."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, 3, 3))
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        self.conv_offset_mask = nn.Conv2d(in_channels, 27, 3, padding=1)
        nn.init.zeros_(self.conv_offset_mask.weight)
        nn.init.zeros_(self.conv_offset_mask.bias)

    def forward(self, x):
        offset_mask = self.conv_offset_mask(x)
        return deform_conv2d(x, offset_mask[:, :18], self.weight, self.bias, padding=1,
                             mask=torch.sigmoid(offset_mask[:, 18:]))


class PoseResNetDCN18(nn.Module):
    """resnet_dcn.py's PoseResNet with ResNet-18: images (B, 3, H, W) -> {'hm', 'wh', 'reg'} at H / 4.

    Initialised as PyTorch's layers are, except hm's prior bias (-2.19) and the zero offset/mask
    predictors; the benchmark copies our weights in (load_from_ours)."""

    def __init__(self, num_classes, head_conv=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        for index, channels in enumerate((64, 128, 256, 512)):
            stride = 1 if index == 0 else 2
            stage = nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels))
            self.add_module(f'layer{index + 1}', stage)
            in_channels = channels
        layers = []
        for channels in (256, 128, 64):
            layers += [DCN(in_channels, channels), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                       nn.ConvTranspose2d(channels, channels, 4, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
            in_channels = channels
        self.deconv_layers = nn.Sequential(*layers)
        self.heads = {'hm': num_classes, 'wh': 2, 'reg': 2}
        for name, outputs in self.heads.items():
            head = nn.Sequential(nn.Conv2d(64, head_conv, 3, padding=1), nn.ReLU(inplace=True),
                                 nn.Conv2d(head_conv, outputs, 1))
            if name == 'hm':
                nn.init.constant_(head[-1].bias, -2.19)
            self.add_module(name, head)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.deconv_layers(x)
        return {name: getattr(self, name)(x) for name in self.heads}


def load_from_ours(plain, ours):
    """Copy our CenterNet model's tensors into the plain port, key by key through CenterNet's names."""
    own = ours.state_dict()
    plain.load_state_dict({key: own[centernet_key_to_ours(key)] for key in plain.state_dict()})


def dense_targets(targets, samples):
    """The reference's targets for a batch of ours: our collated targets (collate_samples) with the
    sparse heat-map entries replaced by the samples' dense heat maps, stacked as CenterNet's loader does."""
    dense = {k: v for k, v in targets.items() if not k.startswith('hm_')}
    dense['hm'] = torch.from_numpy(np.stack([s['hm'] for s in samples])).to(targets['ind'].device)
    return dense


def focal_loss(pred, gt):
    """losses.py's _neg_loss on probabilities pred and the dense Gaussian heatmap gt."""
    positives = gt.eq(1).float()
    negatives = gt.lt(1).float()
    positive_term = (torch.log(pred) * (1 - pred) ** 2 * positives).sum()
    negative_term = (torch.log(1 - pred) * pred ** 2 * (1 - gt) ** 4 * negatives).sum()
    num_pos = positives.sum()
    if num_pos == 0:  # the reference's branch, a host synchronisation as there
        return -negative_term
    return -(positive_term + negative_term) / num_pos


def reg_l1_loss(output, mask, ind, target):
    """losses.py's RegL1Loss: output (B, C, H, W) read at ind (B, M), L1 against target (B, M, C) on the
    reg_mask'ed slots, over (their count x C) + 1e-4."""
    batch, channels = output.shape[:2]
    flat = output.permute(0, 2, 3, 1).contiguous().view(batch, -1, channels)
    pred = flat.gather(1, ind.unsqueeze(2).expand(-1, -1, channels))
    mask = mask.unsqueeze(2).expand_as(pred).float()
    return F.l1_loss(pred * mask, target * mask, reduction='sum') / (mask.sum() + 1e-4)


def ctdet_loss(outputs, targets, hm_weight=1.0, wh_weight=0.1, off_weight=1.0):
    """trains/ctdet.py's CtdetLoss (one stack, no cat_spec_wh, reg_offset on), computed in float32."""
    outputs = {k: v.float() for k, v in outputs.items()}
    hm = torch.clamp(outputs['hm'].sigmoid(), min=_PROB_EPS, max=1 - _PROB_EPS)
    hm_loss = focal_loss(hm, targets['hm'])
    wh_loss = reg_l1_loss(outputs['wh'], targets['reg_mask'], targets['ind'], targets['wh'])
    off_loss = reg_l1_loss(outputs['reg'], targets['reg_mask'], targets['ind'], targets['reg'])
    loss = hm_weight * hm_loss + wh_weight * wh_loss + off_weight * off_loss
    return {'loss': loss, 'hm_loss': hm_loss, 'wh_loss': wh_loss, 'off_loss': off_loss}
