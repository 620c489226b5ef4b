"""Load Detectron (Caffe2) .pkl weights, torchvision ResNets and our own .pth files into the port.

Detectron blob names map to our state_dict keys mechanically (docs/DESIGN.md, "Parameter names"):
`<name>_w`/`_b` -> `<module>.weight`/`.bias`, `<prefix>_bn_s`/`_bn_b` -> `<prefix>_bn.weight`/`.bias`;
GroupNorm models (Detectron's ConvGN, the 04_2018_gn_baselines) name the norm `<prefix>_gn_s`/`_gn_b`
(the stem's `conv1_gn_*`, FPN's `fpn_inner_*_gn_*`, `fpn_*_sum_gn_*`), which load into the same modules;
the GN box head's `head_conv<i>` and the mask head's `_[mask]_fcn<i>` (`_mask_fcn<i>` + `_gn` with GroupNorm),
`conv5_mask` and `mask_fcn_logits` map to `box_head.head_conv<i>` and `mask_head.*`; the keypoint head's
`conv_fcn<i>`, `kps_deconv`, `kps_score_lowres` and `kps_score` to `keypoint_head.*`. The C4 models' res5 RoI
head (`box_head.res5.*`) holds Detectron's `res5_*` blobs, and their single-scale RPN (a body ending at res4)
is `conv_rpn` / `rpn_cls_logits` / `rpn_bbox_pred` without FPN's `_fpn2`.
Loading follows Detectron's utils/net.py: for every model tensor the blob of its Detectron name is
loaded (shapes must match); model tensors without a blob keep their init and are reported as
missing; file blobs no tensor asked for are reported as unused, except the ones Detectron files
always carry for reasons unrelated to the model (`*_momentum`, ImageNet's `fc1000_*`, `conv1_b`),
which are logged as ignored. A parameter's `<blob>_momentum` (the SGD history a Detectron
checkpoint holds) is not a model tensor: load_weights_and_momentum also returns it for the
optimizer, as Detectron's initialize_gpu_from_weights_file feeds it into the `<blob>_momentum`
history.
"""

import collections
import logging
import os
import pickle
import re

import numpy as np
import torch

from detectron.checkpoint.centernet_weights import is_centernet_checkpoint
from detectron.checkpoint.torch_file import looks_like_torch_file, read_torch_file
from detectron.checkpoint.weights_fit import weights_kind
from detectron.utils.errors import WeightsError
from detectron.utils.io import load_object

logger = logging.getLogger(__name__)

# Blobs that never correspond to a parameter of the port: SGD momentum of Detectron checkpoints,
# the ImageNet classifier and the unused conv1 bias of the MSRA ImageNet files.
_IGNORED_BLOB = re.compile(r'(_momentum$)|(^fc1000_[wb]$)|(^conv1_b$)')

# torchvision's normalisation of RGB input in [0, 1] (torchvision ResNet weights expect it).
TORCHVISION_RGB_MEAN = (0.485, 0.456, 0.406)
TORCHVISION_RGB_STD = (0.229, 0.224, 0.225)
# PIXEL_MEANS (BGR, 0..255) that make a converted torchvision ResNet see exactly its own input.
TORCHVISION_PIXEL_MEANS_BGR = tuple(255.0 * m for m in reversed(TORCHVISION_RGB_MEAN))
_TORCHVISION_BN_EPS = 1e-5


# ---------------------------------------------------------------------------------------------
# Safe unpickling
# ---------------------------------------------------------------------------------------------

_NUMPY_MODULES = ('numpy.core.multiarray', 'numpy._core.multiarray')
_SAFE_GLOBALS = frozenset(
    [(module, name) for module in _NUMPY_MODULES for name in ('_reconstruct', 'scalar')]
    + [(module, '_frombuffer') for module in ('numpy.core.numeric', 'numpy._core.numeric')]
    + [('numpy', 'ndarray'), ('numpy', 'dtype'), ('collections', 'OrderedDict'),
       # Python 3 pickles bytes as _codecs.encode(str, 'latin1') under protocol 2.
       ('_codecs', 'encode')]
    + [('builtins', name) for name in ('set', 'frozenset', 'bytearray', 'complex', 'slice')])


class _BlobUnpickler(pickle.Unpickler):
    """Unpickles only numpy arrays/scalars inside plain containers; anything else could run code."""

    def find_class(self, module, name):
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise WeightsError(
            'refusing to unpickle {}.{}: weights pickles may only hold numpy arrays in plain '
            'containers; this file could run code, do not use it'.format(module, name))


def require_weights_file(path):
    """One line for a TRAIN.WEIGHTS / TEST.WEIGHTS that names no file."""
    if os.path.isdir(path):
        raise WeightsError('weights file {} is a directory; set TRAIN.WEIGHTS / TEST.WEIGHTS to a weights file in it '
                           '(e.g. its model_final.pth)'.format(path))
    if not os.path.isfile(path):
        raise WeightsError('weights file {} does not exist; check TRAIN.WEIGHTS / TEST.WEIGHTS'.format(path))


def read_detectron_pickle(path):
    """Return (blobs, cfg_yaml or None) of a Detectron .pkl: an ImageNet file (flat blob dict) or
    a checkpoint `{'blobs': ..., 'cfg': yaml string}`."""
    require_weights_file(path)
    try:
        content = load_object(path, unpickler=_BlobUnpickler)
    except WeightsError as e:  # a refused global: the unpickler does not know the file's name
        raise WeightsError('{}: {}'.format(path, e)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise WeightsError('{} is not a readable weights pickle ({})'.format(path, e)) from e
    return split_detectron_content(content, path)


def split_detectron_content(content, source):
    """(blobs, cfg_yaml or None) of an unpickled Detectron weights dict."""
    if not isinstance(content, dict):
        raise WeightsError('{} holds a {}, not a dict of Detectron blobs'.format(
            source, type(content).__name__))
    blobs = content.get('blobs', content)
    return blobs, content.get('cfg')


# ---------------------------------------------------------------------------------------------
# Names: our state_dict keys <-> Detectron blob names
# ---------------------------------------------------------------------------------------------

_PARAM_SUFFIX = {'weight': '_w', 'bias': '_b'}
# Detectron's per-channel affine (AffineChannel, `_bn`) and its GroupNorm (SpatialGN after ConvGN, `_gn`).
_NORM_SUFFIX = {'affine': {'weight': '_bn_s', 'bias': '_bn_b'}, 'gn': {'weight': '_gn_s', 'bias': '_gn_b'}}
NORMS = tuple(_NORM_SUFFIX)
_COARSEST_STAGE = 5  # its FPN 1x1 seeds the top-down path and carries no `_lateral` suffix
_BODY = r'^(?:conv_body\.|box_head\.)?(?:body\.)?'  # box_head: the res5 RoI head of the C4 models
_FPN = r'^(?:conv_body\.)?'


def _fpn_inner_name(level, last):
    stage = level + 2
    return 'fpn_inner_{}{}'.format(_stage_sum(stage, last), '' if stage == _COARSEST_STAGE else '_lateral')


# The keypoint head (keypoint_rcnn_heads.py) keeps Detectron's blob names; kps_score is the fixed bilinear one.
_KEYPOINT_KEY = r'^keypoint_head\.(conv_fcn\d+|kps_deconv|kps_score_lowres|kps_score)\.(weight|bias)$'
# (pattern of our key, name(match, last blocks per stage, norm)); norm picks the stem's and blocks'
# norm names (the modules keep Detectron's `_bn` attribute names whatever their kind).
_KEY_RULES = [
    (re.compile(_BODY + r'conv1\.weight$'), lambda m, _, norm: 'conv1_w'),
    (re.compile(_BODY + r'res_conv1_bn\.(weight|bias)$'),
     lambda m, _, norm: ('res_conv1' if norm == 'affine' else 'conv1') + _NORM_SUFFIX[norm][m.group(1)]),
    (re.compile(_BODY + r'res(\d)\.(\d+)\.(branch1|branch2[abc])_bn\.(weight|bias)$'),
     lambda m, _, norm: 'res{}_{}_{}{}'.format(m.group(1), m.group(2), m.group(3), _NORM_SUFFIX[norm][m.group(4)])),
    (re.compile(_BODY + r'res(\d)\.(\d+)\.(branch1|branch2[abc])\.(weight|bias)$'),
     lambda m, _, norm: 'res{}_{}_{}{}'.format(m.group(1), m.group(2), m.group(3), _PARAM_SUFFIX[m.group(4)])),
    (re.compile(_FPN + r'fpn_inner\.(\d)\.(weight|bias)$'),
     lambda m, last, norm: _fpn_inner_name(int(m.group(1)), last) + _PARAM_SUFFIX[m.group(2)]),
    (re.compile(_FPN + r'fpn_inner_gn\.(\d)\.(weight|bias)$'),
     lambda m, last, norm: _fpn_inner_name(int(m.group(1)), last) + _NORM_SUFFIX['gn'][m.group(2)]),
    (re.compile(_FPN + r'fpn_layer\.(\d)\.(weight|bias)$'),
     lambda m, last, norm: 'fpn_{}{}'.format(_stage_sum(int(m.group(1)) + 2, last), _PARAM_SUFFIX[m.group(2)])),
    (re.compile(_FPN + r'fpn_layer_gn\.(\d)\.(weight|bias)$'),
     lambda m, last, norm: 'fpn_{}{}'.format(_stage_sum(int(m.group(1)) + 2, last),
                                             _NORM_SUFFIX['gn'][m.group(2)])),
    (re.compile(r'^rpn\.(conv_rpn|rpn_cls_logits|rpn_bbox_pred)\.(weight|bias)$'),
     lambda m, _, norm: '{}_fpn2{}'.format(m.group(1), _PARAM_SUFFIX[m.group(2)])),
    # FPN.EXTRA_CONV_LEVELS: `fpn_6` on C5, `fpn_7` on its ReLU; RetinaNet's towers and predictors, defined
    # on P3 (`retnet_cls_conv_n<i>_fpn3`, `retnet_bbox_pred_fpn3`) and shared by the coarser levels.
    (re.compile(_FPN + r'fpn_extra\.(\d)\.(weight|bias)$'),
     lambda m, _, norm: 'fpn_{}{}'.format(int(m.group(1)) + _COARSEST_STAGE + 1, _PARAM_SUFFIX[m.group(2)])),
    (re.compile(r'^head\.(cls|bbox)_tower\.(\d+)\.(weight|bias)$'),
     lambda m, _, norm: 'retnet_{}_conv_n{}_fpn3{}'.format(m.group(1), m.group(2), _PARAM_SUFFIX[m.group(3)])),
    (re.compile(r'^head\.(cls|bbox)_pred\.(weight|bias)$'),
     lambda m, _, norm: 'retnet_{}_pred_fpn3{}'.format(m.group(1), _PARAM_SUFFIX[m.group(2)])),
    (re.compile(r'^(?:box_head|box_outs)\.(fc6|fc7|cls_score|bbox_pred|bbox_pred_std)\.'
                r'(weight|bias)$'),
     lambda m, _, norm: m.group(1) + _PARAM_SUFFIX[m.group(2)]),
    # The GN box head (add_roi_Xconv1fc_gn_head): ConvGN `head_conv<i>` (no bias) and its `_gn`.
    (re.compile(r'^box_head\.head_conv(\d+)\.weight$'), lambda m, _, norm: f'head_conv{m.group(1)}_w'),
    (re.compile(r'^box_head\.head_conv(\d+)_gn\.(weight|bias)$'),
     lambda m, _, norm: f"head_conv{m.group(1)}{_NORM_SUFFIX['gn'][m.group(2)]}"),
    # Mask head: Detectron names the convolutions `_[mask]_fcn<i>`, or `_mask_fcn<i>` (no bias) before
    # a GroupNorm `_mask_fcn<i>_gn`; norm picks the spelling as for the body.
    (re.compile(r'^mask_head\.fcn(\d+)\.(weight|bias)$'),
     lambda m, _, norm: f"{'_[mask]' if norm == 'affine' else '_mask'}_fcn{m.group(1)}{_PARAM_SUFFIX[m.group(2)]}"),
    (re.compile(r'^mask_head\.fcn(\d+)_gn\.(weight|bias)$'),
     lambda m, _, norm: f"_mask_fcn{m.group(1)}{_NORM_SUFFIX['gn'][m.group(2)]}"),
    (re.compile(r'^mask_head\.(conv5_mask|mask_fcn_logits)\.(weight|bias)$'),
     lambda m, _, norm: m.group(1) + _PARAM_SUFFIX[m.group(2)]),
    (re.compile(_KEYPOINT_KEY), lambda m, _, norm: m.group(1) + _PARAM_SUFFIX[m.group(2)]),
]

_BLOB_PARAM = {'w': 'weight', 'b': 'bias', 's': 'weight'}
_BLOB_RULES = [
    (re.compile(r'^conv1_w$'), lambda m: 'conv_body.body.conv1.weight'),
    (re.compile(r'^(?:res_conv1_bn|conv1_gn)_([sb])$'),
     lambda m: 'conv_body.body.res_conv1_bn.' + _BLOB_PARAM[m.group(1)]),
    (re.compile(r'^res(\d)_(\d+)_(branch1|branch2[abc])(_bn|_gn)?_([wsb])$'),
     lambda m: 'conv_body.body.res{}.{}.{}{}.{}'.format(
         m.group(1), m.group(2), m.group(3), '_bn' if m.group(4) else '', _BLOB_PARAM[m.group(5)])),
    (re.compile(r'^fpn_inner_res(\d)_\d+_sum(?:_lateral)?(_gn)?_([wsb])$'),
     lambda m: 'conv_body.fpn_inner{}.{}.{}'.format(m.group(2) or '', int(m.group(1)) - 2,
                                                     _BLOB_PARAM[m.group(3)])),
    (re.compile(r'^fpn_res(\d)_\d+_sum(_gn)?_([wsb])$'),
     lambda m: 'conv_body.fpn_layer{}.{}.{}'.format(m.group(2) or '', int(m.group(1)) - 2,
                                                     _BLOB_PARAM[m.group(3)])),
    (re.compile(r'^(conv_rpn|rpn_cls_logits|rpn_bbox_pred)(?:_fpn2)?_([wb])$'),
     lambda m: 'rpn.{}.{}'.format(m.group(1), _BLOB_PARAM[m.group(2)])),
    (re.compile(r'^fpn_(\d)_([wb])$'),
     lambda m: 'conv_body.fpn_extra.{}.{}'.format(int(m.group(1)) - _COARSEST_STAGE - 1, _BLOB_PARAM[m.group(2)])),
    (re.compile(r'^retnet_(cls|bbox)_conv_n(\d+)_fpn3_([wb])$'),
     lambda m: 'head.{}_tower.{}.{}'.format(m.group(1), m.group(2), _BLOB_PARAM[m.group(3)])),
    (re.compile(r'^retnet_(cls|bbox)_pred_fpn3_([wb])$'),
     lambda m: 'head.{}_pred.{}'.format(m.group(1), _BLOB_PARAM[m.group(2)])),
    (re.compile(r'^(fc6|fc7)_([wb])$'),
     lambda m: 'box_head.{}.{}'.format(m.group(1), _BLOB_PARAM[m.group(2)])),
    (re.compile(r'^(cls_score|bbox_pred|bbox_pred_std)_([wb])$'),
     lambda m: 'box_outs.{}.{}'.format(m.group(1), _BLOB_PARAM[m.group(2)])),
    (re.compile(r'^head_conv(\d+)(_gn)?_([wsb])$'),
     lambda m: f"box_head.head_conv{m.group(1)}{m.group(2) or ''}.{_BLOB_PARAM[m.group(3)]}"),
    (re.compile(r'^(?:_\[mask\]|_mask)_fcn(\d+)(_gn)?_([wsb])$'),
     lambda m: f"mask_head.fcn{m.group(1)}{m.group(2) or ''}.{_BLOB_PARAM[m.group(3)]}"),
    (re.compile(r'^(conv5_mask|mask_fcn_logits)_([wb])$'),
     lambda m: f'mask_head.{m.group(1)}.{_BLOB_PARAM[m.group(2)]}'),
    (re.compile(r'^(conv_fcn\d+|kps_deconv|kps_score_lowres|kps_score)_([wb])$'),
     lambda m: f'keypoint_head.{m.group(1)}.{_BLOB_PARAM[m.group(2)]}'),
]


def _stage_sum(stage, last_blocks):
    """Detectron's name of a stage output, e.g. 'res4_5_sum' (R-50) or 'res4_22_sum' (R-101)."""
    if stage not in last_blocks:
        raise WeightsError('cannot name FPN level res{}: the state holds no res{} blocks'.format(
            stage, stage))
    return 'res{}_{}_sum'.format(stage, last_blocks[stage])


def last_block_per_stage(keys):
    """{stage: index of its last block} from state_dict keys such as 'res4.22.branch2a.weight'."""
    last = {}
    for key in keys:
        match = re.search(r'(?:^|\.)res(\d)\.(\d+)\.', key)
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            last[stage] = max(last.get(stage, 0), block)
    return last


def key_to_detectron_name(key, last_blocks, norm='affine'):
    """Detectron blob name of a state_dict key, or None if Detectron has no such blob.

    last_blocks: `last_block_per_stage` of the model's keys (names the FPN convs).
    norm: 'affine' (Detectron's default AffineChannel, `_bn_s`) or 'gn' (GroupNorm, `_gn_s`): how the
      file names the ResNet's norms, which our keys do not tell apart.
    """
    for pattern, name in _KEY_RULES:
        match = pattern.match(key)
        if match:
            return name(match, last_blocks, norm)
    return None


def detectron_name_to_key(name):
    """Our state_dict key (full model layout, `conv_body.body.*`) of a Detectron blob, or None."""
    for pattern, key in _BLOB_RULES:
        match = pattern.match(name)
        if match:
            return key(match)
    return None


def is_ignored_blob(name):
    """True for blobs that never map to a parameter (momentum, ImageNet classifier, conv1_b)."""
    return _IGNORED_BLOB.search(name) is not None


def _blob_names(keys, norm='affine'):
    """{key: blob name}; keys without a Detectron name keep their own name (e.g. BatchNorm
    running statistics), so such state survives a round trip through a Detectron-format file."""
    last_blocks = last_block_per_stage(keys)
    names = {key: key_to_detectron_name(key, last_blocks, norm) or key for key in keys}
    if _has_conv4_body(keys):
        names = {key: name.replace('_fpn2_', '_') if key.startswith('rpn.') else name for key, name in names.items()}
    return names


def _has_conv4_body(keys):
    """Whether the keys' body ends at res4 (Detectron's conv4 bodies, whose RPN sees one map)."""
    stages = {int(m.group(1)) for m in (re.match(r'^conv_body\.(?:body\.)?res(\d)\.', k) for k in keys) if m}
    return max(stages, default=None) == 4


# ---------------------------------------------------------------------------------------------
# Conversions and loading
# ---------------------------------------------------------------------------------------------

def detectron_blobs_to_state_dict(blobs, model_state_keys):
    """Pick the blob of each model key by its Detectron name (its affine or GroupNorm name).

    Returns (state_dict of float32 tensors for the keys found, sorted unused blob names).
    """
    state_dict, _, unused, _ = _pick_blobs(blobs, model_state_keys)
    return state_dict, unused


def _pick_blobs(blobs, model_state_keys):
    """(state_dict, {key: blob name}, unused blob names, ignored blob names) of a blob dict."""
    candidates = [_blob_names(model_state_keys, norm) for norm in NORMS]
    state_dict, names = collections.OrderedDict(), {}
    for key in model_state_keys:
        name = next((c[key] for c in candidates if c[key] in blobs), None)
        if name is not None:
            state_dict[key] = _blob_to_tensor(blobs[name], name)
            names[key] = name
    used = set(names.values())
    unused = sorted(n for n in blobs if n not in used and not is_ignored_blob(n))
    ignored = sorted(n for n in blobs if n not in used and is_ignored_blob(n))
    return state_dict, names, unused, ignored


def convert_detectron_blobs(blobs):
    """Convert, without a model, every blob that has a counterpart in the port to its full-model
    key (`conv_body.body.*`, `rpn.*`, ...; `box_head.res5.*` for a C4 model's res5), e.g. to write a .pth file.

    Returns (state_dict, ignored blob names, unconverted blob names).
    """
    state_dict, ignored, unconverted = collections.OrderedDict(), [], []
    c4 = _is_c4_model_file(blobs)
    for name, blob in blobs.items():
        key = None if is_ignored_blob(name) else detectron_name_to_key(name)
        if c4 and key is not None and key.startswith('conv_body.body.res5.'):
            key = 'box_head.' + key[len('conv_body.body.'):]
        if key is not None:
            state_dict[key] = _blob_to_tensor(blob, name)
        else:
            (ignored if is_ignored_blob(name) else unconverted).append(name)
    return state_dict, sorted(ignored), sorted(unconverted)


def _is_c4_model_file(blobs):
    """Whether blobs are a detector without FPN (Detectron's C4 models): box outputs or a single-scale RPN and
    no `fpn_*` blob; its res5 blobs are the RoI head's. An ImageNet file tells nothing: its res5 stays the body's."""
    return (not any(name.startswith('fpn_') for name in blobs)
            and any(name in blobs for name in ('cls_score_w', 'conv_rpn_w')))


def _blob_to_tensor(blob, name):
    if not isinstance(blob, np.ndarray):
        raise WeightsError('blob {} is a {}, not a numpy array; the weights file is damaged'
                           .format(name, type(blob).__name__))
    # Detectron loads every parameter as float32; integer state (BatchNorm counters) stays integer.
    dtype = np.float32 if blob.dtype.kind == 'f' else blob.dtype
    return torch.from_numpy(np.require(blob, dtype=dtype, requirements=['C', 'W']))


def state_dict_to_detectron_blobs(state_dict, norm='affine'):
    """Inverse of detectron_blobs_to_state_dict: {Detectron blob name: numpy array}.

    norm: 'gn' names the ResNet's norms as Detectron's GroupNorm models do (`_gn_s`, `conv1_gn_s`).
    Save as `{'blobs': blobs, 'cfg': yaml}` with utils.io.save_object for a Detectron-layout file.
    """
    names = _blob_names(list(state_dict), norm)
    return collections.OrderedDict(
        (names[key], value.detach().cpu().numpy()) for key, value in state_dict.items())


def _copy_into_model(model, state_dict, source, file_names=None):
    """Copy the entries of state_dict whose keys the model has, after checking every shape.

    file_names: {key: name of the tensor in the file} where the file names it otherwise (Detectron
    blobs), so that an error names both. Returns (missing model keys, unused state_dict keys).
    """
    own = model.state_dict()
    file_names = file_names or {}
    loaded = {k: v for k, v in state_dict.items() if k in own}
    mismatched = ['{}{} {} in file vs {} in model'.format(
                      k, ' (blob {})'.format(file_names[k]) if k in file_names else '', tuple(v.shape),
                      tuple(own[k].shape))
                  for k, v in loaded.items() if v.shape != own[k].shape]
    if mismatched:
        raise WeightsError('{} does not fit the model ({} shape mismatches: {}); check that the '
                           'config builds the network the weights were trained with'.format(
                               source, len(mismatched), '; '.join(mismatched)))
    with torch.no_grad():
        for key, value in loaded.items():
            # state_dict() tensors share storage with the parameters and buffers.
            own[key].copy_(value)
    missing = [k for k in own if k not in loaded]
    unused = sorted(k for k in state_dict if k not in own)
    return missing, unused


def _log_summary(source, missing, unused, ignored=()):
    logger.info('Loaded %s; %d model tensors not in it (keep their init): %s; %d unused: %s',
                source, len(missing), missing, len(unused), unused)
    if ignored:
        momentum = [n for n in ignored if n.endswith('_momentum')]
        others = [n for n in ignored if not n.endswith('_momentum')]
        logger.info('%s: %d blobs are not model tensors: %d SGD momentum blobs (*_momentum; train_net '
                    'loads them into the optimizer, as Detectron)%s', source, len(ignored), len(momentum),
                    ', ' + ', '.join(others) if others else '')
        logger.debug('%s: ignored blobs: %s', source, ', '.join(ignored))


def load_state_dict_by_key(model, state_dict, source='state_dict'):
    """Load a state_dict of our keys (shapes checked); returns (missing, unused) key lists."""
    missing, unused = _copy_into_model(model, state_dict, source)
    _log_summary(source, missing, unused)
    return missing, unused


def load_detectron_weights(model, path_or_blobs):
    """Load a Detectron .pkl (path, unpickled dict or blob dict) into model by blob name.

    Returns (missing model keys, unused file blobs); raises WeightsError on shape mismatches.
    """
    if isinstance(path_or_blobs, (str, os.PathLike)):
        source = str(path_or_blobs)
        blobs, _ = read_detectron_pickle(source)
    else:
        source = 'Detectron blobs'
        blobs, _ = split_detectron_content(path_or_blobs, source)
    return _load_detectron_blobs(model, blobs, source)


def _load_detectron_blobs(model, blobs, source):
    state_dict, names, unused, ignored = _pick_blobs(blobs, list(model.state_dict()))
    missing, _ = _copy_into_model(model, state_dict, source, file_names=names)
    _log_summary(source, missing, unused, ignored)
    return missing, unused


def detectron_momentum(model, blobs):
    """{parameter key: its `<blob>_momentum` tensor} among a Detectron .pkl's blobs for model's
    trainable parameters: the momentum SGD history Detectron's loader restores."""
    trainable = [key for key, p in model.named_parameters() if p.requires_grad]
    _, names, _, _ = _pick_blobs(blobs, trainable)
    return {key: _blob_to_tensor(blobs[name + '_momentum'], name + '_momentum')
            for key, name in names.items() if name + '_momentum' in blobs}


# ---------------------------------------------------------------------------------------------
# torchvision ResNets
# ---------------------------------------------------------------------------------------------

_TORCHVISION_MODULE_RULES = [
    (re.compile(r'^conv1$'), lambda m: 'conv1'),
    (re.compile(r'^bn1$'), lambda m: 'res_conv1_bn'),
    (re.compile(r'^layer(\d)\.(\d+)\.(conv|bn)(\d)$'), lambda m: 'res{}.{}.branch2{}{}'.format(
        int(m.group(1)) + 1, m.group(2), 'abc'[int(m.group(4)) - 1],
        '_bn' if m.group(3) == 'bn' else '')),
    (re.compile(r'^layer(\d)\.(\d+)\.downsample\.([01])$'), lambda m: 'res{}.{}.branch1{}'.format(
        int(m.group(1)) + 1, m.group(2), '_bn' if m.group(3) == '1' else '')),
]


def _torchvision_module_to_ours(module):
    for pattern, ours in _TORCHVISION_MODULE_RULES:
        match = pattern.match(module)
        if match:
            return ours(match)
    return None


def _find_resnet_body(model):
    """(prefix of the ResNet body's keys, body module): the body owns `res_conv1_bn`."""
    prefixes = [k[:-len('res_conv1_bn.weight')] for k in model.state_dict()
                if k.endswith('res_conv1_bn.weight')]
    if len(prefixes) != 1:
        raise WeightsError('torchvision ResNet weights need a model with exactly one ResNet body; '
                           'found {}'.format(len(prefixes)))
    prefix = prefixes[0]
    return prefix, model.get_submodule(prefix.rstrip('.')) if prefix else model


def _conv1_for_bgr_input(weight):
    """conv1 weights for BGR 0..255 input minus TORCHVISION_PIXEL_MEANS_BGR.

    torchvision sees x_rgb = (rgb / 255 - mean) / std; our input channel k (BGR) equals
    255 * std[2 - k] * x_rgb[2 - k], so flip the input channels and divide by 255 * std.
    """
    std = weight.new_tensor(TORCHVISION_RGB_STD)
    return weight.flip(1) / (255.0 * std.flip(0)).view(1, 3, 1, 1)


def _fold_batch_norm(params):
    """Frozen affine of an eval-mode BatchNorm: scale = gamma / sqrt(var + eps),
    bias = beta - mean * scale."""
    scale = params['weight'] / torch.sqrt(params['running_var'] + _TORCHVISION_BN_EPS)
    return {'weight': scale, 'bias': params['bias'] - params['running_mean'] * scale}


def torchvision_resnet_to_body_state_dict(tv_state_dict, fold_batch_norm=True):
    """Rename a torchvision ResNet state_dict to our ResNet body keys.

    conv1 is converted for BGR 0..255 input minus TORCHVISION_PIXEL_MEANS_BGR; BatchNorms are
    folded into AffineChannel weight/bias (fold_batch_norm) or copied as they are (for norm='bn').
    Returns (body state_dict, unused torchvision keys such as the fc classifier).
    """
    modules = collections.OrderedDict()
    unused = []
    for key, value in tv_state_dict.items():
        module, _, param = key.rpartition('.')
        ours = _torchvision_module_to_ours(module)
        if ours is None:
            unused.append(key)
        else:
            value = value.float() if value.is_floating_point() else value
            modules.setdefault(ours, {})[param] = value
    state_dict = collections.OrderedDict()
    for ours, params in modules.items():
        if ours == 'conv1':
            params = {'weight': _conv1_for_bgr_input(params['weight'])}
        elif fold_batch_norm and ours.endswith('_bn'):
            params = _fold_batch_norm(params)
        state_dict.update(('{}.{}'.format(ours, p), v) for p, v in params.items())
    return state_dict, unused


def load_torchvision_resnet(model_body, state_dict):
    """Load a torchvision resnet{18,34,50,101} state_dict into our ResNet body (or a model that
    contains one). Returns (missing, unused) keys.

    The result computes torchvision's features exactly when the input is BGR in 0..255 minus
    PIXEL_MEANS = TORCHVISION_PIXEL_MEANS_BGR (103.53, 116.28, 123.675): set PIXEL_MEANS to
    that. Bottleneck bodies must be built with stride_1x1=False (RESNETS.STRIDE_1X1 False),
    torchvision's stride placement.
    """
    prefix, body = _find_resnet_body(model_body)
    if getattr(body, 'stride_1x1', False) and any('conv3' in k for k in state_dict):
        raise WeightsError('torchvision ResNets put the stride on the 3x3 conv; build the body '
                           'with stride_1x1=False (RESNETS.STRIDE_1X1 False)')
    fold = prefix + 'res_conv1_bn.running_mean' not in model_body.state_dict()
    body_state, tv_unused = torchvision_resnet_to_body_state_dict(state_dict, fold)
    logger.warning('torchvision ResNet weights: PIXEL_MEANS must be %s (BGR) for exact features',
                   TORCHVISION_PIXEL_MEANS_BGR)
    source = 'torchvision ResNet weights'
    missing, unused = _copy_into_model(model_body, {prefix + k: v for k, v in body_state.items()},
                                       source)
    unused = sorted(unused + tv_unused)
    _log_summary(source, missing, unused)
    return missing, unused


# ---------------------------------------------------------------------------------------------
# Any weights file
# ---------------------------------------------------------------------------------------------

def load_weights(model, path):
    """Load a weights file of any supported kind, told apart by content; returns (missing, unused).

    - Detectron pickles (ImageNet R-50.pkl, model_final.pkl of Detectron or KL-Loss);
    - torch files with a 'model' state_dict (this port's checkpoints, tools/convert_pkl_to_pth.py),
      their digest checked when they carry one (checkpoint/torch_file.py);
    - torchvision ResNet state_dicts (see load_torchvision_resnet for PIXEL_MEANS).
    """
    require_weights_file(path)
    if not looks_like_torch_file(path):
        return load_detectron_weights(model, path)
    content = read_torch_file(path)
    if isinstance(content, dict) and isinstance(content.get('model'), dict):
        return load_state_dict_by_key(model, content['model'], path)
    if isinstance(content, dict) and 'layer1.0.conv1.weight' in content and not is_centernet_checkpoint(content):
        return load_torchvision_resnet(model, content)
    kind = weights_kind(content) if isinstance(content, dict) else 'a {}'.format(type(content).__name__)
    raise WeightsError('{} holds neither a {{"model": state_dict}} checkpoint nor torchvision ResNet weights '
                       'but {}; set TRAIN.WEIGHTS / TEST.WEIGHTS to weights of this model'.format(path, kind))


def load_weights_and_momentum(model, path):
    """load_weights, and the file's SGD momentum histories (detectron_momentum; {} for torch
    files): (missing, unused, momentum), a Detectron .pkl read once."""
    require_weights_file(path)
    if looks_like_torch_file(path):
        return (*load_weights(model, path), {})
    blobs, _ = read_detectron_pickle(str(path))
    missing, unused = _load_detectron_blobs(model, blobs, str(path))
    return missing, unused, detectron_momentum(model, blobs)
