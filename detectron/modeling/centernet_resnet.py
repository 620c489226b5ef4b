"""CenterNet's ResNet backbones: a torchvision-layout ResNet followed by three learned 2x upsampling
stages, giving one feature map at stride 4 for the CenterNet heads.

- `resdcn` (CenterNet's resnet_dcn.py, arch `resdcn_<depth>`): each stage is DCN 3x3 -> BN -> ReLU
  -> ConvTranspose2d 4x4/2 (bilinear kernel in weight[:, 0]) -> BN -> ReLU, to 256, 128, 64
  channels.
- `res` (CenterNet's msra_resnet.py, arch `res_<depth>`): each stage is ConvTranspose2d 4x4/2
  (N(0, 0.001)) -> BN -> ReLU, 256 channels throughout.

Module names are CenterNet's (`conv1`, `bn1`, `layer1.0.conv1`, ..., `deconv_layers.<i>`), which are
also torchvision's for the ResNet part, so both CenterNet checkpoints and torchvision ImageNet files
load by name. Convs and BNs of the ResNet keep PyTorch's default init (CenterNet replaces them with
ImageNet weights); the upsampling path is initialised as CenterNet does.
"""

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from detectron.modeling.activation_checkpoint import checkpointed
from detectron.modeling.centernet_layers import BatchNorm2d, fill_up_weights
from detectron.modeling.dcn import DCN
from detectron.ops.max_pool import max_pool_3x3_s2

# depth -> (block, blocks per stage), CenterNet's resnet_spec.
RESNET_SPECS = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
}
_STAGE_WIDTHS = (64, 128, 256, 512)
_DCN_UP_CHANNELS = (256, 128, 64)
_PLAIN_UP_CHANNELS = (256, 256, 256)


class StemMaxPool(nn.Module):
    """CenterNet's nn.MaxPool2d(3, stride=2, padding=1) of the stem, through ops.max_pool (its Triton
    kernels in CUDA training: BENCHMARKS.md "CenterNet speed")."""

    def forward(self, x):
        return max_pool_3x3_s2(x)


class CenterNetResNet(nn.Module):
    """ResNet-<depth> (stride 32) + 3 upsampling stages -> (B, out_channels, H / 4, W / 4).

    deformable=True is CenterNet's `resdcn` (out_channels 64), False its `res` (out_channels 256);
    up_channels, if given, replaces the three upsampling stages' widths (out_channels is the last).
    checkpoint_activations [TRAIN.CHECKPOINT_ACTIVATIONS]: in training, keep only the inputs of the
    stem, of each ResNet stage and of each upsampling stage, and recompute the rest in the backward.
    """

    def __init__(self, depth=18, deformable=True, checkpoint_activations=False, up_channels=None):
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        block, blocks_per_stage = RESNET_SPECS[depth]
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = StemMaxPool()
        in_channels = 64
        for index, (width, blocks) in enumerate(zip(_STAGE_WIDTHS, blocks_per_stage)):
            stage = _make_stage(block, in_channels, width, blocks, stride=1 if index == 0 else 2)
            self.add_module('layer{}'.format(index + 1), stage)
            in_channels = width * block.expansion
        up_channels = up_channels or (_DCN_UP_CHANNELS if deformable else _PLAIN_UP_CHANNELS)
        make_up_stage = _dcn_up_stage if deformable else _plain_up_stage
        layers = []
        for channels in up_channels:
            layers += make_up_stage(in_channels, channels)
            in_channels = channels
        self.deconv_layers = nn.Sequential(*layers)
        self.out_channels = in_channels
        # The checkpointed segments, as views sharing the registered modules (a plain list, so
        # that parameter names stay CenterNet's).
        self.trunk_segments = [nn.Sequential(self.conv1, self.bn1, self.relu, self.maxpool),
                               self.layer1, self.layer2, self.layer3, self.layer4]
        stage_length = len(layers) // len(up_channels)
        self.up_segments = [self.deconv_layers[i:i + stage_length] for i in range(0, len(layers), stage_length)]

    def forward(self, x):
        for segment in self.trunk_segments:
            x = checkpointed(self.checkpoint_activations, segment, x)
        # The up-sampling path runs in NCHW, the layout measured for it (BENCHMARKS.md,
        # "CenterNet speed"): a trunk stored channels_last (channels_last_modules) hands over an NCHW copy.
        x = x.contiguous()
        for segment in self.up_segments:
            x = checkpointed(self.checkpoint_activations, segment, x)
        return x

    def channels_last_modules(self):
        """The layers that may be stored channels_last (CenterNet.use_channels_last): the ResNet."""
        return [self.conv1, self.bn1, self.layer1, self.layer2, self.layer3, self.layer4]


def _make_stage(block, in_channels, width, blocks, stride):
    """torchvision's ResNet stage: a 1x1 conv + BN projection on the first block's shortcut when
    the shape changes; the stride sits in the first block (on the 3x3 conv for bottlenecks)."""
    downsample = None
    if stride != 1 or in_channels != width * block.expansion:
        downsample = nn.Sequential(
            nn.Conv2d(in_channels, width * block.expansion, kernel_size=1, stride=stride,
                      bias=False),
            BatchNorm2d(width * block.expansion))
    layers = [block(in_channels, width, stride, downsample, norm_layer=BatchNorm2d)]
    layers += [block(width * block.expansion, width, norm_layer=BatchNorm2d)
               for _ in range(1, blocks)]
    return nn.Sequential(*layers)


def _upsample_2x(channels_in, channels_out):
    """CenterNet's 4x4 stride-2 transposed conv (padding 1, no bias): exactly doubles H and W."""
    return nn.ConvTranspose2d(channels_in, channels_out, kernel_size=4, stride=2, padding=1,
                              output_padding=0, bias=False)


def _dcn_up_stage(channels_in, channels_out):
    up = _upsample_2x(channels_out, channels_out)
    fill_up_weights(up)
    return [DCN(channels_in, channels_out), BatchNorm2d(channels_out), nn.ReLU(inplace=True),
            up, BatchNorm2d(channels_out), nn.ReLU(inplace=True)]


def _plain_up_stage(channels_in, channels_out):
    up = _upsample_2x(channels_in, channels_out)
    nn.init.normal_(up.weight, std=0.001)  # msra_resnet.py's init_weights
    return [up, BatchNorm2d(channels_out), nn.ReLU(inplace=True)]
