"""The one global config, `cfg`, and Detectron's merge rules (its keys: core/config_defaults.py).

Usage (as in Detectron): tools merge a YAML file and command-line pairs into `cfg`, then call
`assert_and_infer_cfg()`, which fills inferred keys and freezes the tree. Builders and tools read
`cfg`; lower functions take plain values. docs/CONFIG.md lists what this port adds or reads
differently (KL-Loss and CenterNet keys, aliases, type rules).
"""

import difflib
import logging
import os
import os.path as osp
import tempfile
from collections.abc import Mapping

from detectron.core import config_domains
from detectron.core.config_defaults import CfgNode, cfg
from detectron.core.config_values import coerce_value, decode_value
from detectron.core.config_yaml import load_cfg, load_yaml_file  # noqa: F401  (load_cfg: public here, as in Detectron)
from detectron.utils.derived_keys import leaf_value
from detectron.utils.errors import (
    ConfigKeyError,
    ConfigValueError,
    OutputDirError,
    OverridesFormatError,
    OverridesKeyError,
)
from detectron.utils.launcher_env import resolve_num_gpus

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
_SIZE_DEPENDENT_AUG = ('size-dependent box and mask augmentation is not implemented in Detectron either (its '
                       'im_detect_bbox_aug / im_detect_mask_aug assert SCALE_SIZE_DEP False)')
_NOT_ACTED_ON = {
    'TRAIN.GENERATE_PROPOSALS_ON_GPU': 'proposals are always generated on the model\'s device; remove the key',
    'TEST.GENERATE_PROPOSALS_ON_GPU': 'proposals are always generated on the model\'s device; remove the key',
    'TRAIN.COPY_WEIGHTS': 'Detectron\'s class-remapping weight copy is not ported; TRAIN.WEIGHTS loads by name',
    'DATA_LOADER.MINIBATCH_QUEUE_SIZE': 'Caffe2\'s queue; DATA_LOADER.NUM_THREADS workers prefetch two batches each',
    'DATA_LOADER.BLOBS_QUEUE_CAPACITY': 'Caffe2\'s queue; DATA_LOADER.NUM_THREADS workers prefetch two batches each',
    'TEST.FORCE_JSON_DATASET_EVAL': 'the COCO json evaluator serves every dataset but voc_* ones (Detectron\'s VOC '
                                    'evaluator); forcing it is not ported, remove the key',
    'TEST.BBOX_AUG.SCALE_SIZE_DEP': _SIZE_DEPENDENT_AUG,
    'TEST.BBOX_AUG.AREA_TH_LO': _SIZE_DEPENDENT_AUG,
    'TEST.BBOX_AUG.AREA_TH_HI': _SIZE_DEPENDENT_AUG,
    'TEST.MASK_AUG.SCALE_SIZE_DEP': _SIZE_DEPENDENT_AUG,
    'TEST.MASK_AUG.AREA_TH': _SIZE_DEPENDENT_AUG,
    'KRCNN.DILATION': 'it serves the ResNet conv5 keypoint head; only add_roi_pose_head_v1convX is built',
    'RESNETS.RES5_DILATION': 'a dilated res5 is not ported',
    'RFCN.PS_GRID_SIZE': 'R-FCN is not ported',
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

# Keys of the single-scale RPN (the conv4 bodies), which Detectron ignores with FPN: refused there unless at
# their defaults.
_SINGLE_SCALE_RPN_KEYS = ('RPN.SIZES', 'RPN.STRIDE', 'RPN.ASPECT_RATIOS')

# Spellings from detectron2-era guides, stored under Detectron's key.
_KEY_ALIASES = {
    'SOLVER.WARMUP_ITERS': 'SOLVER.WARM_UP_ITERS',
    'SOLVER.WARMUP_FACTOR': 'SOLVER.WARM_UP_FACTOR',
    'SOLVER.WARMUP_METHOD': 'SOLVER.WARM_UP_METHOD',
    'SOLVER.CHECKPOINT_PERIOD': 'TRAIN.SNAPSHOT_ITERS',
}

_COMMAND_LINE = 'command line'
_TYPED_KEYS = 'typed_keys'  # the entry of cfg.__dict__ that typed_keys() returns


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def merge_cfg_from_file(cfg_filename):
    """Merge a YAML config file into the global cfg."""
    _merge_mapping(load_yaml_file(cfg_filename), str(cfg_filename))


def merge_cfg_from_cfg(cfg_other):
    """Merge another (possibly partial) config mapping into the global cfg."""
    _merge_mapping(cfg_other, 'merged config')


def merge_cfg_from_command_line(cfg_file, opts):
    """A tool's config: cfg_file (if any), then its KEY VALUE overrides; the world size of a launcher
    (torchrun, SLURM) replaces a NUM_GPUS from the file, and a typed NUM_GPUS must equal it.
    typed_keys() then holds what this command typed, none of an earlier merge."""
    typed_keys().clear()
    if cfg_file is not None:
        merge_cfg_from_file(cfg_file)
    merge_cfg_from_list(opts)
    __C.NUM_GPUS = resolve_num_gpus(__C.NUM_GPUS, explicit='NUM_GPUS' in opts[0::2])


def merge_cfg_from_list(cfg_list):
    """Merge command-line pairs, e.g. ['TEST.NMS', '0.5', 'NUM_GPUS', '2'], into the global cfg."""
    if len(cfg_list) % 2 != 0:
        raise OverridesFormatError(
            'Config overrides must come in KEY VALUE pairs; got an odd number of items: {}'
            .format(' '.join(str(item) for item in cfg_list))
        )
    for full_key, value in zip(cfg_list[0::2], cfg_list[1::2]):
        _set_value(str(full_key), value, _COMMAND_LINE)


def typed_keys():
    """{full key: where the user typed it (a config file's path or 'command line')}: every key merged
    into cfg so far. Derivations (CenterNet's epoch schedule, the linear scaling rule) fill only the
    other keys, those left at their defaults."""
    return __C.__dict__.setdefault(_TYPED_KEYS, {})


def assert_and_infer_cfg(make_immutable=True):
    """Fill the inferred keys, check cross-key consistency and (by default) freeze the cfg.

    Call once after all merges. Weight URLs are resolved where weights are loaded, not here.
    """
    if __C.MODEL.RPN_ONLY or __C.MODEL.FASTER_RCNN:
        __C.RPN.RPN_ON = True
    if __C.RPN.RPN_ON or __C.RETINANET.RETINANET_ON:
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
    grows by other means (ITER_SIZE); a typed TRAIN.SNAPSHOT_ITERS is kept as typed. The schedule
    keys are rescaled as merged: REFERENCE_WORLD_BATCH says which batch they were typed for.
    Returns the list of changes, also logged. Call before assert_and_infer_cfg freezes the cfg.
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
    kept = ''
    if 'TRAIN.SNAPSHOT_ITERS' in typed_keys():
        del new_values['TRAIN.SNAPSHOT_ITERS']
        kept = '; TRAIN.SNAPSHOT_ITERS {} kept as typed'.format(__C.TRAIN.SNAPSHOT_ITERS)
    changes = []
    for full_key, new_value in new_values.items():
        node, leaf = _find_node(full_key, 'scale_schedule_to_global_batch')
        if node[leaf] != new_value:
            changes.append('{}: {} -> {}'.format(full_key, node[leaf], new_value))
            node[leaf] = new_value
    logger.info(
        'Linear scaling rule: %d images per iteration instead of SOLVER.REFERENCE_WORLD_BATCH %d '
        '(x%g): %s%s', global_batch, reference, factor, '; '.join(changes) or 'nothing to change', kept
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
        node[leaf] = coerce_value(decode_value(raw_value), node[leaf], full_key, source)
        typed_keys()[full_key] = source
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


# ---------------------------------------------------------------------------------------------
# Consistency checks of assert_and_infer_cfg
# ---------------------------------------------------------------------------------------------
def _check_cfg():
    check_domains()
    _check_acted_on()
    _check_single_scale_rpn_keys()
    _check_rank_ims_per_batch()
    _check_dependent_domains()
    # The short spellings users type from mixed-precision guides.
    __C.SOLVER.AMP.DTYPE = {'fp16': 'float16', 'half': 'float16', 'bf16': 'bfloat16'}.get(
        __C.SOLVER.AMP.DTYPE, __C.SOLVER.AMP.DTYPE)
    _check_choice('SOLVER.AMP.DTYPE', ('float16', 'bfloat16'))
    _check_choice('SOLVER.OPTIMIZER', ('sgd', 'adam'))
    _check_choice('SOLVER.CLIP_GRADIENTS.CLIP_TYPE', ('value', 'norm'))
    _check_choice('DIST_BACKEND', ('', 'nccl', 'gloo'))
    _check_choice('STD.SIGMA_COLUMN_ORDER', ('reference', 'corrected'))
    if __C.STD_NMS:
        _check_choice('STD.METHOD', ('stdiou', 'soft'))
        if not __C.PRED_STD:
            raise ConfigValueError(
                'STD_NMS True needs the predicted sigmas: set PRED_STD True as well, with weights trained with '
                'PRED_STD True (they hold bbox_pred_std)'
            )


def check_domains():
    """Every numeric key inside its domain (core/config_domains.py's table), else one ConfigValueError
    line naming the key. assert_and_infer_cfg checks; tools also check right after merging, before the
    model type reads the values."""
    config_domains.check_domains(lambda full_key: leaf_value(__C, full_key),
                                 lambda full_key: leaf_value(_DEFAULTS, full_key))


def _check_acted_on():
    """A key of _NOT_ACTED_ON set to anything but its default: one line naming it and why."""
    for full_key in _all_leaf_keys(__C, ''):
        reason = _NOT_ACTED_ON.get(full_key) or _NOT_ACTED_ON.get(full_key.rsplit('.', 1)[0] + '.')
        value = leaf_value(__C, full_key)
        if reason and value != leaf_value(_DEFAULTS, full_key):
            raise ConfigValueError('{} {!r} is not acted on by this port: {}'.format(full_key, value, reason))


def _check_single_scale_rpn_keys():
    if not __C.FPN.FPN_ON:
        return
    for full_key in _SINGLE_SCALE_RPN_KEYS:
        value = leaf_value(__C, full_key)
        if value != leaf_value(_DEFAULTS, full_key):
            raise ConfigValueError('{} {!r} is not acted on with FPN.FPN_ON: it serves the single-scale RPN of the conv4 '
                                   'bodies; an FPN RPN\'s anchors come from FPN.RPN_ANCHOR_START_SIZE and '
                                   'FPN.RPN_ASPECT_RATIOS'.format(full_key, value))


def _check_dependent_domains():
    """Domains that depend on another key (every other domain: core/config_domains.py; a model type's
    own, in its check)."""
    dependent = [
        ('SOLVER.STEP_SIZE', __C.SOLVER.LR_POLICY == 'step', 'at least 1 with LR_POLICY step'),
    ]
    for full_key, applies, expected in dependent:
        value = leaf_value(__C, full_key)
        if applies and value < 1:
            raise ConfigValueError('{} must be {}, got {!r}'.format(full_key, expected, value))


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
