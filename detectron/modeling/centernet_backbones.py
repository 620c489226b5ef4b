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


def check_deconv_filters(arch, deconv_filters):
    """CENTERNET.DECONV_FILTERS: empty (the arch's own widths) or three widths for a ResNet arch."""
    if not deconv_filters:
        return
    if arch == 'dla_34' or len(deconv_filters) != 3:
        raise ConfigValueError('CENTERNET.DECONV_FILTERS sets the three upsampling widths of a res_ or resdcn_ '
                               'arch: give three widths, or () for the arch\'s own; got {} with CENTERNET.ARCH {}'
                               .format(tuple(deconv_filters), arch))


def build_centernet_backbone(arch, checkpoint_activations=False, deconv_filters=()):
    """'resdcn_<depth>' | 'res_<depth>' (depth 18, 34, 50, 101) | 'dla_34' -> a module whose
    forward(x) returns its stride-4 feature map of `out_channels` channels; checkpoint_activations
    [TRAIN.CHECKPOINT_ACTIVATIONS] recomputes its activations in the backward pass of training;
    deconv_filters [CENTERNET.DECONV_FILTERS] replaces a ResNet arch's three upsampling widths."""
    check_centernet_arch(arch)
    check_deconv_filters(arch, deconv_filters)
    if arch == 'dla_34':
        return CenterNetDLA(checkpoint_activations)
    kind, depth = arch.split('_')
    return CenterNetResNet(int(depth), deformable=kind == 'resdcn', checkpoint_activations=checkpoint_activations,
                           up_channels=tuple(deconv_filters) or None)
