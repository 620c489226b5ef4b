"""The one global config, `cfg`, and Detectron's merge rules (its keys: core/config_defaults.py).

Usage (as in Detectron): tools merge a YAML file and command-line pairs into `cfg`, then call
`assert_and_infer_cfg()`, which fills inferred keys and freezes the tree. Builders and tools read
`cfg`; lower functions take plain values. docs/CONFIG.md lists what this port adds or reads
differently (KL-Loss and CenterNet keys, aliases, type rules).
"""

import ast
import copy
import difflib
import importlib
import logging
import math
import os
import os.path as osp
import tempfile
from collections.abc import Mapping

import numpy as np
import yaml

from detectron.core.config_defaults import CfgNode, cfg
from detectron.utils import distributed
from detectron.utils.errors import (
    ConfigKeyError, ConfigValueError, OutputDirError, OverridesFormatError, OverridesKeyError,
)

logger = logging.getLogger(__name__)

__C = cfg
_DEFAULTS = cfg.clone()  # before any merge: what "left at its default" means


# ---------------------------------------------------------------------------------------------
# Key lists of the merge rules
# ---------------------------------------------------------------------------------------------
_DEPRECATED_KEYS = {
    'FINAL_MSG',
    'MODEL.DILATION',
    'ROOT_GPU_ID',
    'RPN.ON',
    'TRAIN.BBOX_NORMALIZE_TARGETS_PRECOMPUTED',
    'TRAIN.DROPOUT',
    'USE_GPU_NMS',
    'TEST.NUM_TEST_IMAGES',
}

# old key -> new key, or (new key, what else to change)
_RENAMED_KEYS = {
    'EXAMPLE.RENAMED.KEY': 'EXAMPLE.KEY',
    'MODEL.PS_GRID_SIZE': 'RFCN.PS_GRID_SIZE',
    'MODEL.ROI_HEAD': 'FAST_RCNN.ROI_BOX_HEAD',
    'MRCNN.MASK_HEAD_NAME': 'MRCNN.ROI_MASK_HEAD',
    'TRAIN.DATASET': (
        'TRAIN.DATASETS',
        "Also make it a tuple: 'coco_2014_train' -> ('coco_2014_train',), "
        "'coco_2014_train:coco_2014_valminusminival' -> "
        "('coco_2014_train', 'coco_2014_valminusminival')."
    ),
    'TRAIN.PROPOSAL_FILE': (
        'TRAIN.PROPOSAL_FILES',
        "Also make it a tuple: 'path/to/file' -> ('path/to/file',), "
        "'path/to/file1:path/to/file2' -> ('path/to/file1', 'path/to/file2')."
    ),
    'TEST.SCALES': (
        'TEST.SCALE',
        "Also make it a single integer: (600,) -> 600."
    ),
    'TEST.DATASET': (
        'TEST.DATASETS',
        "Also make it a tuple: 'coco_2014_minival' -> ('coco_2014_minival',)."
    ),
    'TEST.PROPOSAL_FILE': (
        'TEST.PROPOSAL_FILES',
        "Also make it a tuple: '/path/to/props.pkl' -> ('/path/to/props.pkl',)."
    ),
}

# Keys of Detectron's tree that no code of this port acts on (a key ending in '.' stands for every key
# below it). Each stays loadable at its default, so Detectron's configs merge as they are; any other
# value is one error line naming the key and why (tests/core/test_config_keys.py: every key is read or
# listed here).
_PRECOMPUTED_PROPOSALS = 'it serves Fast R-CNN on precomputed proposals, which this port does not build'
_NOT_ACTED_ON = {
    'TRAIN.BBOX_THRESH': _PRECOMPUTED_PROPOSALS,
    'TRAIN.CROWD_FILTER_THRESH': _PRECOMPUTED_PROPOSALS,
    'TRAIN.PROPOSAL_FILES': _PRECOMPUTED_PROPOSALS,
    'TEST.PROPOSAL_FILES': _PRECOMPUTED_PROPOSALS,
    'TEST.PROPOSAL_LIMIT': _PRECOMPUTED_PROPOSALS,
    'DEDUP_BOXES': _PRECOMPUTED_PROPOSALS,
    'TRAIN.GENERATE_PROPOSALS_ON_GPU': 'proposals are always generated on the model\'s device; remove the key',
    'TEST.GENERATE_PROPOSALS_ON_GPU': 'proposals are always generated on the model\'s device; remove the key',
    'TRAIN.COPY_WEIGHTS': 'Detectron\'s class-remapping weight copy is not ported; TRAIN.WEIGHTS loads by name',
    'DATA_LOADER.MINIBATCH_QUEUE_SIZE': 'Caffe2\'s queue; DATA_LOADER.NUM_THREADS workers prefetch two batches each',
    'DATA_LOADER.BLOBS_QUEUE_CAPACITY': 'Caffe2\'s queue; DATA_LOADER.NUM_THREADS workers prefetch two batches each',
    'TEST.FORCE_JSON_DATASET_EVAL': 'every dataset is evaluated by the COCO json evaluator here; remove the key',
    'TEST.CLASS_SPECIFIC_AR': 'proposal recall evaluation (RPN-only models) is not ported',
    'TEST.BBOX_AUG.': 'test-time box augmentation is not ported',
    'TEST.MASK_AUG.': 'test-time mask augmentation is not ported',
    'TEST.KPS_AUG.': 'keypoint heads are not ported',
    'KRCNN.': 'keypoint heads are not ported',
    'RETINANET.': 'RetinaNet is not ported',
    'RPN.SIZES': 'only the FPN RPN is built: its anchors come from FPN.RPN_ANCHOR_START_SIZE and FPN.RPN_ASPECT_RATIOS',
    'RPN.STRIDE': 'only the FPN RPN is built: its anchors come from FPN.RPN_ANCHOR_START_SIZE and FPN.RPN_ASPECT_RATIOS',
    'RPN.ASPECT_RATIOS': 'only the FPN RPN is built: its anchors come from FPN.RPN_ANCHOR_START_SIZE and '
                         'FPN.RPN_ASPECT_RATIOS',
    'FPN.EXTRA_CONV_LEVELS': 'the extra P6/P7 convolutions serve RetinaNet, which is not ported',
    'RESNETS.RES5_DILATION': 'a dilated res5 is not ported',
    'RFCN.PS_GRID_SIZE': 'R-FCN is not ported',
    'MRCNN.': 'Mask R-CNN heads are not ported yet',
    'FAST_RCNN.CONV_HEAD_DIM': 'only the 2-fc box head (fast_rcnn_heads.add_roi_2mlp_head) is built',
    'FAST_RCNN.NUM_STACKED_CONVS': 'only the 2-fc box head (fast_rcnn_heads.add_roi_2mlp_head) is built',
    'MODEL.EXECUTION_TYPE': 'a Caffe2 net setting; PyTorch runs the model eagerly',
    'MEMONGER': 'Caffe2\'s memory optimiser; TRAIN.CHECKPOINT_ACTIVATIONS recomputes activations to save memory',
    'MEMONGER_SHARE_ACTIVATIONS': 'Caffe2\'s memory optimiser; TRAIN.CHECKPOINT_ACTIVATIONS recomputes activations '
                                  'to save memory',
    'USE_NCCL': 'the backend follows the device (NCCL on GPUs, gloo on the CPU) unless DIST_BACKEND names one',
    'MATLAB': 'the MATLAB evaluation of Pascal VOC is not ported',
    'EXPECTED_RESULTS': 'Detectron\'s expected-results check is not ported',
    'EXPECTED_RESULTS_RTOL': 'Detectron\'s expected-results check is not ported',
    'EXPECTED_RESULTS_ATOL': 'Detectron\'s expected-results check is not ported',
    'EXPECTED_RESULTS_SIGMA_TOL': 'Detectron\'s expected-results check is not ported',
    'EXPECTED_RESULTS_EMAIL': 'Detectron\'s expected-results check is not ported',
    'CLUSTER.ON_CLUSTER': 'a Facebook cluster setting; see docs/MULTI_GPU.md for SLURM and torchrun',
    'EPS': 'no computation of this port reads it (each formula names its own epsilon)',
    'ROOT_DIR': 'paths are read relative to the working directory',
}

# Spellings from detectron2-era guides, stored under Detectron's key.
_KEY_ALIASES = {
    'SOLVER.WARMUP_ITERS': 'SOLVER.WARM_UP_ITERS',
    'SOLVER.WARMUP_FACTOR': 'SOLVER.WARM_UP_FACTOR',
    'SOLVER.WARMUP_METHOD': 'SOLVER.WARM_UP_METHOD',
    'SOLVER.CHECKPOINT_PERIOD': 'TRAIN.SNAPSHOT_ITERS',
}

# Tuple keys holding names or paths: a bare word or an unquoted "(a, b)" becomes a tuple of names.
_NAME_TUPLE_KEYS = {
    'TRAIN.DATASETS',
    'TEST.DATASETS',
    'TRAIN.PROPOSAL_FILES',
    'TEST.PROPOSAL_FILES',
}

_COMMAND_LINE = 'command line'


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def merge_cfg_from_file(cfg_filename):
    """Merge a YAML config file into the global cfg."""
    _merge_mapping(_load_yaml_file(cfg_filename), str(cfg_filename))


def merge_cfg_from_cfg(cfg_other):
    """Merge another (possibly partial) config mapping into the global cfg."""
    _merge_mapping(cfg_other, 'merged config')


def merge_cfg_from_command_line(cfg_file, opts):
    """A tool's config: cfg_file (if any), then its KEY VALUE overrides; the world size of a launcher
    (torchrun, SLURM) replaces a NUM_GPUS from the file, and a typed NUM_GPUS must equal it."""
    if cfg_file is not None:
        merge_cfg_from_file(cfg_file)
    merge_cfg_from_list(opts)
    __C.NUM_GPUS = distributed.resolve_num_gpus(__C.NUM_GPUS, explicit='NUM_GPUS' in opts[0::2])


def merge_cfg_from_list(cfg_list):
    """Merge command-line pairs, e.g. ['TEST.NMS', '0.5', 'NUM_GPUS', '2'], into the global cfg."""
    if len(cfg_list) % 2 != 0:
        raise OverridesFormatError(
            'Config overrides must come in KEY VALUE pairs; got an odd number of items: {}'
            .format(' '.join(str(item) for item in cfg_list))
        )
    for full_key, value in zip(cfg_list[0::2], cfg_list[1::2]):
        _set_value(str(full_key), value, _COMMAND_LINE)


def assert_and_infer_cfg(make_immutable=True):
    """Fill the inferred keys, check cross-key consistency and (by default) freeze the cfg.

    Call once after all merges. Weight URLs are resolved where weights are loaded, not here.
    """
    if __C.MODEL.RPN_ONLY or __C.MODEL.FASTER_RCNN:
        __C.RPN.RPN_ON = True
    if __C.RPN.RPN_ON:
        __C.TEST.PRECOMPUTED_PROPOSALS = False
    _check_cfg()
    if make_immutable:
        __C.immutable(True)


def adopt_cfg(snapshot):
    """Make the global cfg equal to `snapshot` (the cfg a spawned worker received), frozen."""
    if snapshot is __C:
        return
    __C.defrost()
    __C.merge_from_other_cfg(snapshot)
    __C.freeze()


def get_output_dir(datasets, training=True):
    """OUTPUT_DIR/{train|test}/<dataset names joined by ':'>/<MODEL.TYPE>, created if missing."""
    if isinstance(datasets, str):
        dataset_name = datasets
    elif isinstance(datasets, (tuple, list)):
        dataset_name = ':'.join(datasets)
    else:
        raise ConfigValueError(
            'get_output_dir expects dataset names as a tuple, list or string; got {!r}'
            .format(datasets)
        )
    tag = 'train' if training else 'test'
    outdir = osp.join(__C.OUTPUT_DIR, tag, dataset_name, __C.MODEL.TYPE)
    try:
        os.makedirs(outdir, exist_ok=True)
        tempfile.TemporaryFile(dir=outdir).close()  # writable, not just present
    except OSError as err:
        raise OutputDirError(
            'OUTPUT_DIR {} cannot be used: {} is not a writable directory ({}); set OUTPUT_DIR to a '
            'writable directory'.format(__C.OUTPUT_DIR, outdir, err.strerror or err)) from err
    return outdir


def load_cfg(cfg_to_load):
    """Parse YAML text or an open file, including configs dumped by Detectron into .pkl files.

    Detectron dumps carry Python tags (its AttrDict, numpy arrays and scalars); only those tags
    are constructed, so a config file cannot run arbitrary code.
    """
    if hasattr(cfg_to_load, 'read'):
        cfg_to_load = cfg_to_load.read()
    if not isinstance(cfg_to_load, str):
        raise ConfigValueError(
            'load_cfg expects YAML text or an open file, got {}'.format(type(cfg_to_load).__name__)
        )
    return yaml.load(cfg_to_load, Loader=_CfgYamlLoader)


def images_per_iter():
    """Images consumed by one training iteration (one optimizer step) over all GPUs."""
    return _images_per_micro_batch() * __C.SOLVER.ITER_SIZE


def _images_per_micro_batch():
    return sum(__C.TRAIN.RANK_IMS_PER_BATCH) or __C.NUM_GPUS * __C.TRAIN.IMS_PER_BATCH


def scale_schedule_to_global_batch(global_batch):
    """Apply the linear scaling rule when SOLVER.REFERENCE_WORLD_BATCH > 0.

    The solver schedule in the cfg is read as written for REFERENCE_WORLD_BATCH images per
    iteration. For `global_batch` images per iteration, learning rates are multiplied and
    iteration counts divided by global_batch / REFERENCE_WORLD_BATCH. Detectron's checkpoint
    period int(SNAPSHOT_ITERS / NUM_GPUS) already keeps SNAPSHOT_ITERS x IMS_PER_BATCH images
    between checkpoints; SNAPSHOT_ITERS is rescaled so that this stays true when the batch also
    grows by other means (ITER_SIZE). Returns the list of changes, also logged. Call before
    assert_and_infer_cfg freezes the cfg.
    """
    reference = __C.SOLVER.REFERENCE_WORLD_BATCH
    if reference <= 0 or global_batch == reference:
        return []
    if global_batch < 1:
        raise ConfigValueError('Global batch must be at least 1 image, got {}'.format(global_batch))
    if __C.is_frozen():
        raise ConfigValueError(
            'scale_schedule_to_global_batch must run before assert_and_infer_cfg freezes the cfg'
        )
    factor = global_batch / reference
    solver = __C.SOLVER
    snapshot_scale = _images_per_micro_batch() / global_batch
    new_values = {
        'SOLVER.BASE_LR': solver.BASE_LR * factor,
        'SOLVER.LRS': [lr * factor for lr in solver.LRS],
        'SOLVER.MAX_ITER': _scaled_iters(solver.MAX_ITER, factor),
        'SOLVER.STEPS': [_scaled_iters(step, factor) for step in solver.STEPS],
        'SOLVER.STEP_SIZE': _scaled_iters(solver.STEP_SIZE, factor),
        'SOLVER.WARM_UP_ITERS': _scaled_iters(solver.WARM_UP_ITERS, factor),
        'TRAIN.SNAPSHOT_ITERS': max(1, int(round(__C.TRAIN.SNAPSHOT_ITERS * snapshot_scale))),
    }
    changes = []
    for full_key, new_value in new_values.items():
        node, leaf = _find_node(full_key, 'scale_schedule_to_global_batch')
        if node[leaf] != new_value:
            changes.append('{}: {} -> {}'.format(full_key, node[leaf], new_value))
            node[leaf] = new_value
    logger.info(
        'Linear scaling rule: %d images per iteration instead of SOLVER.REFERENCE_WORLD_BATCH %d '
        '(x%g): %s', global_batch, reference, factor, '; '.join(changes) or 'nothing to change'
    )
    return changes


# ---------------------------------------------------------------------------------------------
# Merging
# ---------------------------------------------------------------------------------------------
def _merge_mapping(mapping, source):
    if not isinstance(mapping, Mapping):
        raise ConfigValueError(
            'Config from {} must be a mapping of keys to values, got {}'
            .format(source, type(mapping).__name__)
        )
    for full_key, value in _flatten(mapping, ''):
        _set_value(full_key, value, source)


def _flatten(mapping, prefix):
    """Yield (dotted key, leaf value) pairs of a nested mapping."""
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ConfigKeyError(
                'Config key {}{!r} is not a name: YAML reads bare ON/OFF/YES/NO as booleans; '
                'quote the key or use its current name'.format(prefix, key)
            )
        full_key = prefix + key
        if isinstance(value, Mapping):
            yield from _flatten(value, full_key + '.')
        else:
            yield full_key, value


def _set_value(full_key, raw_value, source):
    full_key = _KEY_ALIASES.get(full_key, full_key)
    if _key_exists(full_key):
        node, leaf = _find_node(full_key, source)
        node[leaf] = _coerce_value(_decode_value(raw_value), node[leaf], full_key, source)
    elif full_key in _DEPRECATED_KEYS:
        logger.warning('Deprecated config key (ignoring): %s', full_key)
    elif full_key in _RENAMED_KEYS:
        _raise_key_rename_error(full_key)
    else:
        _find_node(full_key, source)  # raises the unknown-key error


def _key_exists(full_key):
    node = __C
    for subkey in full_key.split('.'):
        if not isinstance(node, CfgNode) or subkey not in node:
            return False
        node = node[subkey]
    return not isinstance(node, CfgNode)


# Keys that guides written for other code bases teach (the KL-Loss guide's `fp16: true` and
# `loss_scale: 128.0`), and the keys that do the same here.
_AMP_KEYS = 'SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE float16 SOLVER.AMP.LOSS_SCALE 128'
_OTHER_SPELLINGS = {
    'fp16': 'mixed precision here is ' + _AMP_KEYS + ' (or SOLVER.AMP.DTYPE bfloat16)',
    'loss_scale': 'a fixed loss scale here is ' + _AMP_KEYS + ' (0 = dynamic)',
}


def _find_node(full_key, source):
    """(parent node, leaf name) of an existing leaf key, else ConfigKeyError with a suggestion."""
    if not _key_exists(full_key):
        # Detectron's wording: "Non-existent key" for overrides, "Non-existent config key" for files.
        from_overrides = source == _COMMAND_LINE
        message = 'Non-existent {}key: {} (from {})'.format(
            '' if from_overrides else 'config ', full_key, source)
        other_spelling = _OTHER_SPELLINGS.get(full_key.rsplit('.', 1)[-1].lower())
        closest = [] if other_spelling else difflib.get_close_matches(full_key, _all_leaf_keys(__C, ''), n=1)
        if other_spelling:
            message += f'; {other_spelling}'
        elif closest:
            message += '; closest valid key: {}'.format(closest[0])
        raise (OverridesKeyError if from_overrides else ConfigKeyError)(message)
    *parents, leaf = full_key.split('.')
    node = __C
    for subkey in parents:
        node = node[subkey]
    return node, leaf


def _all_leaf_keys(node, prefix):
    keys = []
    for key, value in node.items():
        if isinstance(value, CfgNode):
            keys.extend(_all_leaf_keys(value, prefix + key + '.'))
        else:
            keys.append(prefix + key)
    return keys


def _raise_key_rename_error(full_key):
    new_key = _RENAMED_KEYS[full_key]
    note = ''
    if isinstance(new_key, tuple):
        new_key, hint = new_key
        note = ' Note: ' + hint
    raise ConfigKeyError(
        'Key {} was renamed to {}; please update your config.{}'.format(full_key, new_key, note)
    )


def _decode_value(value):
    """Strings are Python literals when they parse as one, otherwise stay raw strings."""
    if not isinstance(value, str):
        return copy.deepcopy(value)
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


# ---------------------------------------------------------------------------------------------
# Type rules (docs/CONFIG.md, "Types")
# ---------------------------------------------------------------------------------------------
def _coerce_value(value, default, full_key, source):
    if full_key == 'PIXEL_MEANS':
        return _as_pixel_means(value, default, source)
    if full_key == 'TRAIN.RANK_IMS_PER_BATCH':
        return _as_image_counts(value, full_key, source)
    if full_key in _NAME_TUPLE_KEYS:
        return _as_name_tuple(value, default, full_key, source)
    if type(value) is type(default):
        return value
    if isinstance(default, str):
        return str(value)
    if isinstance(default, float) and _is_real_number(value):
        return float(value)
    if isinstance(default, list) and isinstance(value, tuple):
        return list(value)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    raise _type_error(value, default, full_key, source)


def _is_real_number(value):
    return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)


def _as_name_tuple(value, default, full_key, source):
    if isinstance(value, str):
        value = _split_names(value)
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise _type_error(value, default, full_key, source)
    return tuple(value)


def _split_names(text):
    """'a' -> ('a',); '(a, b)' or '[a,b]' -> ('a', 'b'); quotes around names are dropped."""
    text = text.strip()
    if text[:1] + text[-1:] in ('()', '[]'):
        text = text[1:-1]
    names = (name.strip().strip('\'"') for name in text.split(','))
    return tuple(name for name in names if name)


def _as_image_counts(value, full_key, source):
    if isinstance(value, (tuple, list)) and all(_is_int(v) and v >= 1 for v in value):
        return tuple(int(v) for v in value)
    raise ConfigValueError(
        'Config key {} expects a tuple of integers >= 1, one per process (default: ()), but got {} {!r} '
        '(from {})'.format(full_key, type(value).__name__, value, source)
    )


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _as_pixel_means(value, default, source):
    try:
        means = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        means = None
    if means is None or means.size != 3:
        raise _type_error(value, default, 'PIXEL_MEANS', source)
    return ((tuple(float(m) for m in means.ravel()),),)


_TYPE_NAMES = {
    bool: 'True or False',
    int: 'an integer',
    float: 'a number',
    str: 'a string',
    tuple: 'a tuple',
    list: 'a list',
}


def _type_error(value, default, full_key, source):
    return ConfigValueError(
        'Config key {} expects {} (default: {!r}) but got {} {!r} (from {})'.format(
            full_key, _TYPE_NAMES.get(type(default), type(default).__name__), default,
            type(value).__name__, value, source
        )
    )


# ---------------------------------------------------------------------------------------------
# Consistency checks of assert_and_infer_cfg
# ---------------------------------------------------------------------------------------------
def _check_cfg():
    _check_acted_on()
    _check_positive(('NUM_GPUS', 'TRAIN.IMS_PER_BATCH', 'SOLVER.ITER_SIZE', 'SOLVER.MAX_ITER',
                     'TRAIN.SNAPSHOT_ITERS', 'TRAIN.CUDA_GRAPHS_MAX_SHAPES',
                     'TEST.CUDA_GRAPHS_MAX_SHAPES'))
    _check_rank_ims_per_batch()
    _check_solver()
    # The short spellings users type from mixed-precision guides.
    __C.SOLVER.AMP.DTYPE = {'fp16': 'float16', 'half': 'float16', 'bf16': 'bfloat16'}.get(
        __C.SOLVER.AMP.DTYPE, __C.SOLVER.AMP.DTYPE)
    _check_choice('SOLVER.AMP.DTYPE', ('float16', 'bfloat16'))
    _check_choice('SOLVER.OPTIMIZER', ('sgd', 'adam'))
    _check_choice('DIST_BACKEND', ('', 'nccl', 'gloo'))
    _check_choice('STD.SIGMA_COLUMN_ORDER', ('reference', 'corrected'))
    _check_choice('TRAIN.FREEZE_AT', (0, 2, 3, 4, 5))
    if __C.STD_NMS:
        _check_choice('STD.METHOD', ('stdiou', 'soft'))
        if not __C.PRED_STD:
            raise ConfigValueError(
                'STD_NMS True needs the predicted sigmas: set PRED_STD True as well'
            )


def _check_acted_on():
    """A key of _NOT_ACTED_ON set to anything but its default: one line naming it and why."""
    for full_key in _all_leaf_keys(__C, ''):
        reason = _NOT_ACTED_ON.get(full_key) or _NOT_ACTED_ON.get(full_key.rsplit('.', 1)[0] + '.')
        value = _leaf_value(__C, full_key)
        if reason and value != _leaf_value(_DEFAULTS, full_key):
            raise ConfigValueError('{} {!r} is not acted on by this port: {}'.format(full_key, value, reason))


def _leaf_value(node, full_key):
    for name in full_key.split('.'):
        node = node[name]
    return node


def _check_solver():
    """Values that no schedule means: each is refused with one line instead of training nonsense."""
    solver = __C.SOLVER
    checks = [
        ('SOLVER.BASE_LR', solver.BASE_LR, solver.BASE_LR > 0, 'a finite number > 0'),
        ('SOLVER.GAMMA', solver.GAMMA, solver.GAMMA > 0, 'a finite number > 0'),
        ('SOLVER.MOMENTUM', solver.MOMENTUM, 0 <= solver.MOMENTUM < 1, 'in [0, 1)'),
        ('SOLVER.WEIGHT_DECAY', solver.WEIGHT_DECAY, solver.WEIGHT_DECAY >= 0, 'a finite number >= 0'),
        ('SOLVER.WEIGHT_DECAY_GN', solver.WEIGHT_DECAY_GN, solver.WEIGHT_DECAY_GN >= 0, 'a finite number >= 0'),
        ('SOLVER.WARM_UP_ITERS', solver.WARM_UP_ITERS, solver.WARM_UP_ITERS >= 0, '>= 0'),
        ('SOLVER.WARM_UP_FACTOR', solver.WARM_UP_FACTOR, 0 <= solver.WARM_UP_FACTOR <= 1, 'in [0, 1]'),
        ('SOLVER.AMP.LOSS_SCALE', solver.AMP.LOSS_SCALE, solver.AMP.LOSS_SCALE >= 0,
         'a finite number >= 0 (0: dynamic loss scaling)'),
        ('SOLVER.LRS', solver.LRS, all(lr > 0 for lr in solver.LRS), 'a list of finite numbers > 0'),
    ]
    if solver.LR_POLICY == 'step':
        checks.append(('SOLVER.STEP_SIZE', solver.STEP_SIZE, solver.STEP_SIZE >= 1, 'at least 1 with LR_POLICY step'))
    for full_key, value, valid, expected in checks:
        values = value if isinstance(value, list) else [value]
        if not valid or not all(math.isfinite(v) for v in values):
            raise ConfigValueError('{} must be {}, got {!r}'.format(full_key, expected, value))


def _check_positive(full_keys):
    for full_key in full_keys:
        node, leaf = _find_node(full_key, 'assert_and_infer_cfg')
        if node[leaf] < 1:
            raise ConfigValueError('{} must be at least 1, got {}'.format(full_key, node[leaf]))


def _check_rank_ims_per_batch():
    sizes = __C.TRAIN.RANK_IMS_PER_BATCH
    if sizes and len(sizes) != __C.NUM_GPUS:
        raise ConfigValueError(
            'TRAIN.RANK_IMS_PER_BATCH {} needs one entry per process but NUM_GPUS is {}; give {} entries, '
            'or () for TRAIN.IMS_PER_BATCH on every process'.format(tuple(sizes), __C.NUM_GPUS, __C.NUM_GPUS)
        )


def _check_choice(full_key, choices):
    node, leaf = _find_node(full_key, 'assert_and_infer_cfg')
    if node[leaf] not in choices:
        raise ConfigValueError('{} must be one of {}, got {!r}'.format(
            full_key, ', '.join(repr(c) for c in choices), node[leaf]))


def _scaled_iters(iters, factor):
    return int(round(iters / factor))


# ---------------------------------------------------------------------------------------------
# YAML reading
# ---------------------------------------------------------------------------------------------
def _load_yaml_file(path):
    try:
        with open(path, 'r', encoding='utf-8') as f:
            text = f.read()
    except OSError as err:
        raise ConfigValueError('Cannot read config file {}: {}'.format(path, err.strerror))
    except UnicodeDecodeError as err:
        raise ConfigValueError(
            'Config file {} is not a YAML text file (the byte at offset {} is not UTF-8 text); pass the .yaml config '
            'with --cfg, and weights files with TRAIN.WEIGHTS / TEST.WEIGHTS'.format(path, err.start))
    try:
        return load_cfg(text)
    except yaml.YAMLError as err:
        raise ConfigValueError('Invalid YAML in {}: {}'.format(path, _describe_yaml_error(err)))


def _describe_yaml_error(err):
    mark = getattr(err, 'problem_mark', None)
    problem = getattr(err, 'problem', None) or str(err).splitlines()[0]
    if mark is None:
        return problem
    return 'line {}, column {}: {}'.format(mark.line + 1, mark.column + 1, problem)


def _numpy_multiarray():
    try:
        return importlib.import_module('numpy._core.multiarray')
    except ImportError:  # numpy < 2
        return importlib.import_module('numpy.core.multiarray')


def _yaml_python_names():
    """The only Python objects a config YAML may construct (what Detectron's dumps contain)."""
    multiarray = _numpy_multiarray()
    names = {
        'detectron.utils.collections.AttrDict': CfgNode,
        'utils.collections.AttrDict': CfgNode,  # Detectron's older module path
        'detectron.core.config.CfgNode': CfgNode,  # dumps made before the key tree moved
        'detectron.core.config_defaults.CfgNode': CfgNode,
        'yacs.config.CfgNode': CfgNode,
        'numpy.ndarray': np.ndarray,
        'numpy.dtype': np.dtype,
    }
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        names[module + '._reconstruct'] = multiarray._reconstruct
        names[module + '.scalar'] = multiarray.scalar
    return names


class _CfgYamlLoader(yaml.UnsafeLoader):
    """PyYAML's Python-object loader restricted to the names in _yaml_python_names()."""

    def find_python_name(self, name, mark, unsafe=False):
        allowed = _yaml_python_names()
        if name not in allowed:
            raise yaml.constructor.ConstructorError(
                None, None, 'refusing to construct Python object {!r} in a config'.format(name), mark
            )
        return allowed[name]

    def find_python_module(self, name, mark, unsafe=False):
        raise yaml.constructor.ConstructorError(
            None, None, 'refusing to import Python module {!r} in a config'.format(name), mark
        )
