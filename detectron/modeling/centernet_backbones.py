"""Build a CenterNet backbone from its arch name (CENTERNET.ARCH, CenterNet's `--arch`)."""

from detectron.modeling.centernet_dla import CenterNetDLA
from detectron.modeling.centernet_resnet import RESNET_SPECS, CenterNetResNet
from detectron.utils.errors import ConfigValueError

CENTERNET_ARCHS = tuple(
    ['resdcn_{}'.format(d) for d in RESNET_SPECS] + ['res_{}'.format(d) for d in RESNET_SPECS]
    + ['dla_34'])


def check_centernet_arch(arch):
    if arch not in CENTERNET_ARCHS:
        raise ConfigValueError('CENTERNET.ARCH {!r} is not a supported backbone; choose one of {}'
                               .format(arch, ', '.join(CENTERNET_ARCHS)))


def build_centernet_backbone(arch, checkpoint_activations=False):
    """'resdcn_<depth>' | 'res_<depth>' (depth 18, 34, 50, 101) | 'dla_34' -> a module whose
    forward(x) returns its stride-4 feature map of `out_channels` channels; checkpoint_activations
    [TRAIN.CHECKPOINT_ACTIVATIONS] recomputes its activations in the backward pass of training."""
    check_centernet_arch(arch)
    if arch == 'dla_34':
        return CenterNetDLA(checkpoint_activations)
    kind, depth = arch.split('_')
    return CenterNetResNet(int(depth), deformable=kind == 'resdcn', checkpoint_activations=checkpoint_activations)
