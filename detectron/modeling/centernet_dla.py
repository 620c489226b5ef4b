"""CenterNet's DLA-34 backbone (pose_dla_dcn.py's DLASeg with down_ratio 4 and last_level 5, without
its heads): the DLA-34 classification trunk, then deformable iterative aggregation (DLAUp over
levels 2-5, IDAUp over the three finest results) to one 64-channel map at stride 4.

Module names are CenterNet's (`base.level3.tree1.tree2.root.conv`, `dla_up.ida_0.proj_1.conv`,
`ida_up.up_2`, ...), so its checkpoints load by name, and `base` holds the DLA ImageNet file's
`base_layer.*` / `level<k>.*` tensors. The trunk's convs keep PyTorch's default init (CenterNet
replaces them with ImageNet weights); the upsampling transposed convs are depthwise and bilinear.

The outer trees of levels 3 and 4 own a `project` conv + BN whose result CenterNet computes and
then never uses (their first child is a tree that projects for itself). The modules are kept so
that checkpoints load, but are not run, and their parameters have requires_grad False: they never
get a gradient (so CenterNet's Adam never changed them), and DDP would otherwise need
find_unused_parameters.
"""

import torch
from torch import nn

from detectron.modeling.activation_checkpoint import checkpointed
from detectron.modeling.centernet_layers import BatchNorm2d, fill_up_weights
from detectron.modeling.dcn import DCN

DLA34_LEVELS = (1, 1, 1, 2, 2, 1)
DLA34_CHANNELS = (16, 32, 64, 128, 256, 512)
_FIRST_LEVEL = 2  # log2(down_ratio 4): the output stride
_LAST_LEVEL = 5


class DLABasicBlock(nn.Module):
    """3x3 conv -> BN -> ReLU -> 3x3 conv -> BN, plus a residual the caller may supply (a tree
    passes its projected, downsampled input), -> ReLU."""

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = BatchNorm2d(out_channels)

    def forward(self, x, residual=None):
        residual = x if residual is None else residual
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + residual)


class Root(nn.Module):
    """Aggregation node: 1x1 conv over the concatenated inputs -> BN -> ReLU (DLA-34 uses no root
    residual)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, stride=1, bias=False)
        self.bn = BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, *inputs):
        return self.relu(self.bn(self.conv(torch.cat(inputs, 1))))


class Tree(nn.Module):
    """Hierarchical deep aggregation tree of 2**levels blocks.

    A tree of one level is two blocks joined by a root; a deeper tree is two subtrees, the
    second carrying the outputs to aggregate (`children`) down to its last root. With level_root
    the tree's downsampled input is aggregated too.
    """

    def __init__(self, levels, in_channels, out_channels, stride=1, level_root=False, root_dim=0):
        super().__init__()
        root_dim = root_dim or 2 * out_channels
        if level_root:
            root_dim += in_channels
        self.levels = levels
        self.level_root = level_root
        if levels == 1:
            self.tree1 = DLABasicBlock(in_channels, out_channels, stride)
            self.tree2 = DLABasicBlock(out_channels, out_channels, 1)
            self.root = Root(root_dim, out_channels)
        else:
            self.tree1 = Tree(levels - 1, in_channels, out_channels, stride)
            self.tree2 = Tree(levels - 1, out_channels, out_channels,
                              root_dim=root_dim + out_channels)
        self.downsample = nn.MaxPool2d(stride, stride=stride) if stride > 1 else None
        self.project = None
        if in_channels != out_channels:
            self.project = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, bias=False),
                BatchNorm2d(out_channels))
            if levels > 1:  # unused, see the module doc
                self.project.requires_grad_(False)

    def forward(self, x, children=()):
        bottom = self.downsample(x) if self.downsample is not None else x
        children = list(children) + ([bottom] if self.level_root else [])
        if self.levels > 1:
            # A subtree makes its own residual: this tree's projection would go unused.
            x1 = self.tree1(x)
            return self.tree2(x1, children=children + [x1])
        residual = self.project(bottom) if self.project is not None else bottom
        x1 = self.tree1(x, residual)
        return self.root(self.tree2(x1), x1, *children)


class DLA34(nn.Module):
    """DLA-34 trunk without its classifier; forward returns the six level outputs (strides 1-32).
    checkpoint_activations: keep only the input of the stem and of each level in training."""

    def __init__(self, checkpoint_activations=False):
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        levels, channels = DLA34_LEVELS, DLA34_CHANNELS
        self.channels = channels
        self.base_layer = nn.Sequential(
            nn.Conv2d(3, channels[0], kernel_size=7, stride=1, padding=3, bias=False),
            BatchNorm2d(channels[0]), nn.ReLU(inplace=True))
        self.level0 = _conv_level(channels[0], channels[0], levels[0], stride=1)
        self.level1 = _conv_level(channels[0], channels[1], levels[1], stride=2)
        self.level2 = Tree(levels[2], channels[1], channels[2], 2, level_root=False)
        self.level3 = Tree(levels[3], channels[2], channels[3], 2, level_root=True)
        self.level4 = Tree(levels[4], channels[3], channels[4], 2, level_root=True)
        self.level5 = Tree(levels[5], channels[4], channels[5], 2, level_root=True)

    def forward(self, x):
        outputs = []
        x = checkpointed(self.checkpoint_activations, self.base_layer, x)
        for level in range(len(self.channels)):
            x = checkpointed(self.checkpoint_activations, getattr(self, 'level{}'.format(level)), x)
            outputs.append(x)
        return outputs


def _conv_level(in_channels, out_channels, convs, stride):
    """`convs` x (3x3 conv -> BN -> ReLU), the first with the stride."""
    layers = []
    for index in range(convs):
        layers += [nn.Conv2d(in_channels, out_channels, 3, stride=stride if index == 0 else 1,
                             padding=1, bias=False),
                   BatchNorm2d(out_channels), nn.ReLU(inplace=True)]
        in_channels = out_channels
    return nn.Sequential(*layers)


class DeformConv(nn.Module):
    """DCN 3x3 -> BN -> ReLU (`conv`, then `actf`)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.actf = nn.Sequential(BatchNorm2d(out_channels), nn.ReLU(inplace=True))
        self.conv = DCN(in_channels, out_channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x):
        return self.actf(self.conv(x))


class IDAUp(nn.Module):
    """Iterative deep aggregation of maps [m_0, ..., m_n] whose strides are up_factors[k] times
    m_0's: r_0 = m_0, r_k = node_k(up_k(proj_k(m_k)) + r_(k-1)), with proj_k a DeformConv to
    `channels_out` and up_k a depthwise bilinear transposed conv by up_factors[k]."""

    def __init__(self, channels_out, channels_in, up_factors):
        super().__init__()
        for k in range(1, len(channels_in)):
            factor = int(up_factors[k])
            up = nn.ConvTranspose2d(channels_out, channels_out, factor * 2, stride=factor,
                                    padding=factor // 2, output_padding=0, groups=channels_out,
                                    bias=False)
            fill_up_weights(up)
            setattr(self, 'proj_{}'.format(k), DeformConv(channels_in[k], channels_out))
            setattr(self, 'up_{}'.format(k), up)
            setattr(self, 'node_{}'.format(k), DeformConv(channels_out, channels_out))

    def forward(self, maps):
        """Returns [r_0, ..., r_n] (all at m_0's stride and channels_out channels, r_0 = m_0)."""
        results = [maps[0]]
        for k in range(1, len(maps)):
            up = getattr(self, 'up_{}'.format(k))
            project = getattr(self, 'proj_{}'.format(k))
            node = getattr(self, 'node_{}'.format(k))
            results.append(node(up(project(maps[k])) + results[-1]))
        return results


class DLAUp(nn.Module):
    """Coarse-to-fine aggregation of maps with `channels` at relative `scales`: step i fuses the
    i + 2 coarsest (already fused) maps with IDAUp `ida_<i>` into the next finer one's channels.
    checkpoint_activations: keep only the inputs of each step in training."""

    def __init__(self, channels, scales, checkpoint_activations=False):
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        channels_in, scales = list(channels), list(scales)
        for i in range(len(channels) - 1):
            j = len(channels) - 2 - i
            setattr(self, 'ida_{}'.format(i), IDAUp(
                channels[j], channels_in[j:], [s // scales[j] for s in scales[j:]]))
            # The maps coarser than j now have j's channels and j's stride.
            scales[j + 1:] = [scales[j]] * (len(scales) - j - 1)
            channels_in[j + 1:] = [channels[j]] * (len(channels_in) - j - 1)
        self.steps = len(channels) - 1

    def forward(self, maps):
        """Returns one map per step, finest first, then the unchanged coarsest input map."""
        maps = list(maps)
        outputs = [maps[-1]]
        for i in range(self.steps):
            j = len(maps) - 2 - i
            maps[j:] = checkpointed(self.checkpoint_activations, getattr(self, 'ida_{}'.format(i)), maps[j:])
            outputs.insert(0, maps[-1])
        return outputs


class CenterNetDLA(nn.Module):
    """DLA-34 + DLAUp + IDAUp -> (B, 64, H / 4, W / 4); H and W must be multiples of 32.
    checkpoint_activations [TRAIN.CHECKPOINT_ACTIVATIONS]: in training, keep only the inputs of the
    trunk's stem and levels, of each aggregation step and of the last IDAUp, and recompute the rest
    in the backward."""

    def __init__(self, checkpoint_activations=False):
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        self.base = DLA34(checkpoint_activations)
        channels = self.base.channels[_FIRST_LEVEL:]
        self.dla_up = DLAUp(channels, [2 ** i for i in range(len(channels))], checkpoint_activations)
        fused = _LAST_LEVEL - _FIRST_LEVEL
        self.ida_up = IDAUp(channels[0], channels[:fused], [2 ** i for i in range(fused)])
        self.out_channels = channels[0]

    def channels_last_modules(self):
        """None (CenterNet.use_channels_last): DLA's deformable IDA path reads NCHW memory at every
        level, and no layout was measured for it."""
        return []

    def forward(self, x):
        fused = self.dla_up(self.base(x)[_FIRST_LEVEL:])
        return checkpointed(self.checkpoint_activations, self.ida_up, fused[:_LAST_LEVEL - _FIRST_LEVEL])[-1]
