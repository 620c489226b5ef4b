"""Load CenterNet weights into the port: trained CenterNet checkpoints and the ImageNet files its
backbones start from. Files are local paths; nothing is downloaded.

Names. CenterNet's model is one module holding the backbone's children and the heads side by side
(`conv1.weight`, `deconv_layers.0.conv_offset_mask.bias`, `base.level3...`, `hm.0.weight`); ours is
`CenterNet(backbone, heads)`, so a CenterNet key `<head>.<rest>` (head hm, wh or reg) is our
`heads.<head>.<rest>` and any other key `<rest>` is our `backbone.<rest>`. A `module.` prefix
(weights saved from nn.DataParallel) is dropped first, as CenterNet's load_model does.
ImageNet files map onto the backbone module: a torchvision ResNet's keys are the resnet backbones'
keys (its `fc.*` classifier is unused); a DLA-34 file's keys are the dla_34 backbone's `base.<key>`
(its `fc.*` is unused too).

Shapes. A CenterNet checkpoint's tensor whose shape differs from the model's is skipped with a
warning naming it, both shapes and the likely cause, and keeps its init, as CenterNet's load_model
does ("Skip loading parameter ..."): that is how a COCO model is fine-tuned to another number of
classes. This port's own CenterNet .pth files load the same way. A file that fills (almost) none of
the model, or for testing not all of it, is refused by the engines (checkpoint/weights_fit.py). In an ImageNet file a mismatch is a WeightsError (CenterNet's load_state_dict raises too).
BatchNorm's `num_batches_tracked` counters are loaded when present but never reported missing:
with a fixed momentum BatchNorm does not read them, and 2018 files do not have them.
"""

import logging

import torch

from detectron.checkpoint.torch_file import read_torch_file
from detectron.checkpoint.weights_fit import weights_kind
from detectron.utils.errors import ConfigValueError, WeightsError

logger = logging.getLogger(__name__)

CENTERNET_HEADS = ('hm', 'wh', 'reg')
_DATA_PARALLEL_PREFIX = 'module.'
_BN_COUNTER = 'num_batches_tracked'
_NAMES_LOGGED = 5


def _without_data_parallel_prefix(key):
    return key[len(_DATA_PARALLEL_PREFIX):] if key.startswith(_DATA_PARALLEL_PREFIX) else key


def centernet_key_to_ours(key):
    """Our state_dict key for a CenterNet key (with or without `module.`), see the module doc."""
    key = _without_data_parallel_prefix(key)
    top = key.split('.', 1)[0]
    return ('heads.' if top in CENTERNET_HEADS else 'backbone.') + key


def _state_dict_of(content):
    return content.get('state_dict', content) if isinstance(content, dict) else content


def is_centernet_checkpoint(content):
    """Whether a loaded .pth holds a CenterNet model (its heatmap head `hm.*`), not an ImageNet trunk."""
    state_dict = _state_dict_of(content)
    return isinstance(state_dict, dict) and any(
        isinstance(key, str) and _without_data_parallel_prefix(key).startswith('hm.') for key in state_dict)


def load_centernet_checkpoint(model, path, content=None):
    """Load a CenterNet .pth (`{'epoch': e, 'state_dict': sd, ...}` or a bare state dict, with or
    without `module.` prefixes) into our CenterNet model; `content`: the file as already read.

    Returns (missing, unused): our keys the file did not provide or gave in another shape (they
    keep their init) and the file's keys (CenterNet names, without `module.`) that the model has no
    place for.
    """
    content = read_torch_file(path) if content is None else content
    state_dict = _state_dict_of(content)
    _check_state_dict(state_dict, path, 'a CenterNet checkpoint ({"epoch", "state_dict"})')
    renamed = {}
    for key, value in state_dict.items():
        file_key = _without_data_parallel_prefix(key)
        renamed[centernet_key_to_ours(file_key)] = (file_key, value)
    missing, unused = _copy_by_name(model, renamed, path, _checkpoint_mismatch_cause, skip_mismatched=True)
    epoch = content.get('epoch') if isinstance(content, dict) else None
    _log_summary('CenterNet checkpoint {} (epoch {})'.format(path, epoch),
                 len(renamed) - len(unused), missing, unused)
    return missing, unused


def load_port_checkpoint(model, path, state_dict):
    """Load this port's CenterNet .pth (its 'model' state dict, our keys) as load_centernet_checkpoint
    loads CenterNet's: a tensor of another shape (another class count) is skipped with a warning and
    keeps its init. Returns (missing, unused)."""
    _check_state_dict(state_dict, path, "a {'model': state_dict} checkpoint")
    missing, unused = _copy_by_name(model, {key: (key, value) for key, value in state_dict.items()}, path,
                                    _port_mismatch_cause, skip_mismatched=True)
    _log_summary(path, len(state_dict) - len(unused), missing, unused)
    return missing, unused


def load_imagenet_backbone(backbone, path, arch, content=None):
    """Load ImageNet weights into a CenterNet backbone module (before training, as CenterNet does):
    a torchvision ResNet .pth (e.g. resnet18-5c106cde.pth) for arch 'res_<depth>' /
    'resdcn_<depth>', or DLA's dla34-ba72cf86.pth for 'dla_34'.

    Returns (missing, unused) like load_centernet_checkpoint: missing are the backbone's keys the
    file did not provide (the upsampling path), unused the file's keys (its classifier `fc.*`);
    `content`: the file as already read.
    A file that does not cover the whole ImageNet trunk (e.g. ResNet-18 weights for resdcn_34) is a
    WeightsError: CenterNet would start training from a partly random trunk without a word.
    """
    trunk_prefix, upsampling_prefixes = _imagenet_layout(arch)
    state_dict = read_torch_file(path) if content is None else content
    _check_state_dict(state_dict, path, 'an ImageNet state dict')
    renamed = {trunk_prefix + key: (key, value) for key, value in state_dict.items()}
    cause = 'ImageNet weights of another trunk than {}\'s: check CENTERNET.ARCH'.format(arch)
    missing, unused = _copy_by_name(backbone, renamed, path, lambda *shapes: cause)
    trunk_missing = [k for k in missing if not k.startswith(upsampling_prefixes)]
    if trunk_missing:
        raise WeightsError(
            '{} lacks {} tensors of the {} ImageNet trunk (e.g. {}): it holds {}; use the ImageNet file of '
            'CENTERNET.ARCH\'s trunk'.format(path, len(trunk_missing), arch, trunk_missing[0],
                                             weights_kind(state_dict)))
    _log_summary('ImageNet weights {} for {}'.format(path, arch), len(renamed) - len(unused),
                 missing, unused)
    return missing, unused


def _imagenet_layout(arch):
    """(prefix of the ImageNet trunk's keys in the backbone, prefixes of the parts ImageNet files
    do not have)."""
    if arch == 'dla_34':
        return 'base.', ('dla_up.', 'ida_up.')
    if arch.startswith(('res_', 'resdcn_')):
        return '', ('deconv_layers.',)
    raise ConfigValueError('CENTERNET.ARCH {!r} has no ImageNet weights layout; use res_<depth>, '
                           'resdcn_<depth> or dla_34'.format(arch))


def _check_state_dict(state_dict, path, expected):
    if not (isinstance(state_dict, dict) and state_dict
            and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                    for k, v in state_dict.items())):
        raise WeightsError('{} does not hold {}: expected a dict of tensors'.format(path, expected))


def _copy_by_name(model, renamed, source, mismatch_cause, skip_mismatched=False):
    """Copy renamed = {our key: (file key, tensor)} into model after checking every shape.

    Returns (missing model keys, unused file keys). A shape mismatch raises WeightsError, or with
    skip_mismatched is logged and its tensor left out (reported missing).
    """
    own = model.state_dict()
    loaded = {k: v for k, v in renamed.items() if k in own}
    for key, (file_key, value) in list(loaded.items()):
        if value.shape == own[key].shape:
            continue
        message = '{}: {} has shape {} in the file but {} in the model ({}); likely {}'.format(
            source, file_key, tuple(value.shape), tuple(own[key].shape), key,
            mismatch_cause(file_key, value.shape, own[key].shape))
        if not skip_mismatched:
            raise WeightsError(message)
        logger.warning('%s: skipped, it keeps its init', message)
        del loaded[key]
    with torch.no_grad():
        for key, (_, value) in loaded.items():
            own[key].copy_(value)  # state_dict() tensors share storage with the model's
    missing = [k for k in own if k not in loaded and not k.endswith(_BN_COUNTER)]
    unused = sorted(file_key for key, (file_key, _) in renamed.items() if key not in own)
    return missing, unused


def _checkpoint_mismatch_cause(file_key, file_shape, model_shape):
    head, _, rest = file_key.partition('.')
    if head not in CENTERNET_HEADS:
        return 'a checkpoint of another backbone: check CENTERNET.ARCH'
    final_conv_outputs_differ = rest.startswith('2.') and file_shape[0] != model_shape[0]
    if final_conv_outputs_differ and head == 'hm':
        return 'a different number of classes ({} in the file, {} in the model): check ' \
               'CENTERNET.NUM_CLASSES'.format(file_shape[0], model_shape[0])
    if final_conv_outputs_differ and head == 'wh':
        return 'per-class vs shared box sizes: check CENTERNET.CAT_SPEC_WH and NUM_CLASSES'
    return 'a different head width: check CENTERNET.HEAD_CONV'


def _port_mismatch_cause(key, file_shape, model_shape):
    top, _, rest = key.partition('.')
    return _checkpoint_mismatch_cause(rest if top in ('heads', 'backbone') else key, file_shape, model_shape)


def _first_names(names):
    shown = ', '.join(names[:_NAMES_LOGGED])
    return shown + (', ...' if len(names) > _NAMES_LOGGED else '')


def _log_summary(source, loaded, missing, unused):
    logger.info('Loaded %d tensors of %s; %d model tensors not in it (keep their init)%s; '
                '%d file tensors unused%s', loaded, source, len(missing),
                ': ' + _first_names(missing) if missing else '', len(unused),
                ': ' + _first_names(unused) if unused else '')
