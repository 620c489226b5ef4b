"""The domain of every numeric config key: the one table that core/config.py's check reads.

A value outside its key's domain is refused when the config is finished, with one line
`{KEY} must be {domain}, got {value!r}` (a ConfigValueError), instead of a traceback from cv2, numpy
or torch, or a run that trains or tests nonsense. Numeric keys are the numbers of the key tree
(core/config_defaults.py) and its sequences of numbers; tests/core/test_config_domains.py walks the
tree: a numeric key without an entry here fails it, naming the key. Domains that depend on another
key (SOLVER.STEP_SIZE with LR_POLICY step, TEST.DETECTIONS_PER_IM with CenterNet, CenterNet's chunk
sizes against NUM_GPUS) are checked by core/config.py's _check_dependent_domains or the model type.

Floats are finite in every domain below: NaN and inf are refused everywhere.
"""

import math
import numbers

from detectron.utils.errors import ConfigValueError


def _distinct(values):
    """values without repeats, in their order (NaN, never equal to itself, kept once)."""
    kept = []
    for value in values:
        if not any(value is k or (type(value) is type(k) and value == k) for k in kept):
            kept.append(value)
    return kept


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _show(bound):
    """A bound as written in a message: 1, 0.5, 4294967295 (never 1.0 or 4.29e+09)."""
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def _integer(default):
    """Whether a key (or a sequence key's items) holds integers, judged by its default."""
    if isinstance(default, (tuple, list)):
        return bool(default) and all(isinstance(item, int) for item in default)
    return isinstance(default, int)


def _bound(bound, integer):
    return int(bound) if integer else float(bound)


def _just_outside(bound, direction, integer):
    """The value next to `bound` on the outside (direction -1: below, +1: above), typed as the key."""
    if integer:
        return int(bound) + direction
    return math.nextafter(float(bound), direction * math.inf)


class Domain:
    """What a key may hold. contains(value); describe(default) completes "{KEY} must be ..." (default:
    the key's default, which says whether the key holds integers, a tuple or a list); outside(default)
    gives values just outside the domain, of the key's type, for the test that walks the table."""

    def contains(self, value):
        raise NotImplementedError

    def describe(self, default):
        raise NotImplementedError

    def outside(self, default):
        raise NotImplementedError


class Number(Domain):
    """A finite number between optional bounds, each closed or open; note: what a special value means."""

    def __init__(self, lo=None, hi=None, lo_open=False, hi_open=False, note=''):
        self.lo, self.hi, self.lo_open, self.hi_open, self.note = lo, hi, lo_open, hi_open, note

    def contains(self, value):
        if not _is_number(value) or not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def describe(self, default):
        return self._phrase(_integer(default), plural=False) + (' ({})'.format(self.note) if self.note else '')

    def _phrase(self, integer, plural):
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None:
            text = 'in {}{}, {}{}'.format('(' if self.lo_open else '[', _show(lo), _show(hi),
                                          ')' if self.hi_open else ']')
            return ('numbers ' + text) if plural else text
        if lo is None and hi is None:
            return ('integers' if plural else 'an integer') if integer else (
                'finite numbers' if plural else 'a finite number')
        bound, closed, word, sign = ((lo, not self.lo_open, 'at least', '>') if lo is not None else
                                     (hi, not self.hi_open, 'at most', '<'))
        relation = '{}{} {}'.format(sign, '=' if closed else '', _show(bound))
        if integer:
            return 'integers ' + relation if plural else (
                '{} {}'.format(word, _show(bound)) if closed else relation)
        return '{} {}'.format('finite numbers' if plural else 'a finite number', relation)

    def outside(self, default):
        integer = _integer(default)
        values = []
        if self.lo is not None:
            values.append(_bound(self.lo, integer) if self.lo_open else _just_outside(self.lo, -1, integer))
        if self.hi is not None:
            values.append(_bound(self.hi, integer) if self.hi_open else _just_outside(self.hi, +1, integer))
        if not integer:
            values += [math.nan, math.inf, -math.inf]
        return [value for value in values if not self.contains(value)]


class OneOf(Domain):
    """One of a few values, e.g. TRAIN.FREEZE_AT's stages."""

    def __init__(self, *choices):
        self.choices = choices

    def contains(self, value):
        return _is_number(value) and value in self.choices

    def describe(self, default):
        return 'one of ' + ', '.join(repr(choice) for choice in self.choices)

    def outside(self, default):
        candidates = [min(self.choices) - 1, max(self.choices) + 1] + [c + 1 for c in self.choices]
        return _distinct(value for value in candidates if not self.contains(value))


class Or(Domain):
    """A special value with its own meaning (e.g. -1: derived) or a value of another domain."""

    def __init__(self, value, meaning, domain):
        self.value, self.meaning, self.domain = value, meaning, domain

    def contains(self, value):
        return (_is_number(value) and value == self.value) or self.domain.contains(value)

    def describe(self, default):
        return '{!r} ({}) or {}'.format(self.value, self.meaning, self.domain.describe(default))

    def outside(self, default):
        candidates = self.domain.outside(default) + [self.value - 1, self.value + 1]
        return _distinct(value for value in candidates if not self.contains(value))


class Sequence(Domain):
    """A tuple or list (as the key's default) of numbers of one domain; optionally non-empty, of a
    fixed length, or strictly increasing."""

    def __init__(self, item, nonempty=False, length=None, increasing=False):
        self.item, self.nonempty, self.length, self.increasing = item, nonempty, length, increasing

    def contains(self, value):
        if not isinstance(value, (tuple, list)) or not all(self.item.contains(v) for v in value):
            return False
        if (self.nonempty and not value) or (self.length is not None and len(value) != self.length):
            return False
        return not self.increasing or all(a < b for a, b in zip(value, value[1:]))

    def describe(self, default):
        kind = 'list' if isinstance(default, list) else 'tuple'
        size = '{} '.format(self.length) if self.length is not None else ''
        article = 'a non-empty' if self.nonempty and self.length is None else 'a'
        order = 'increasing ' if self.increasing else ''
        return '{} {} of {}{}{}'.format(article, kind, size, order, self.item._phrase(_integer(default), plural=True))

    def outside(self, default):
        as_default = list if isinstance(default, list) else tuple
        inside = list(default) or [1]  # every item domain of the table holds 1
        values = [as_default(bad if i == 0 else v for i, v in enumerate(inside))
                  for bad in self.item.outside(default)]
        if self.nonempty or self.length:
            values.append(as_default())
        if self.length:
            values.append(as_default(inside + inside[-1:]))
        if self.increasing:
            values.append(as_default([inside[0], inside[0]]))
        return [value for value in values if not self.contains(value)]


class Nested(Domain):
    """Numbers of one domain in a fixed nesting, e.g. PIXEL_MEANS' (((B, G, R),),)."""

    def __init__(self, item, shape_text):
        self.item, self.shape_text = item, shape_text

    def contains(self, value):
        return all(self.item.contains(v) for v in _leaves(value))

    def describe(self, default):
        return '{} of {}'.format(self.shape_text, self.item._phrase(False, plural=True))

    def outside(self, default):
        return [_replace_first_leaf(default, bad) for bad in self.item.outside(0.0)]


def _leaves(value):
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _replace_first_leaf(value, new):
    if isinstance(value, (tuple, list)):
        return type(value)([_replace_first_leaf(value[0], new)] + list(value[1:]))
    return new


# ---------------------------------------------------------------------------------------------
# The words of the table
# ---------------------------------------------------------------------------------------------
def at_least(bound, note=''):
    return Number(lo=bound, note=note)


def positive(note=''):
    return Number(lo=0, lo_open=True, note=note)


def in_range(lo, hi, lo_open=False, hi_open=False, note=''):
    return Number(lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, note=note)


def finite(note=''):
    """Any (finite) number is meaningful; the table says why next to the key."""
    return Number(note=note)


def one_of(*choices):
    return OneOf(*choices)


def unset_or(domain, meaning, value=-1):
    return Or(value, meaning, domain)


def tuple_of(item, **kwargs):
    return Sequence(item, **kwargs)


def nonempty_of(item, **kwargs):
    return Sequence(item, nonempty=True, **kwargs)


FRACTION = in_range(0, 1)
OFF_OR_PROPOSALS_CAP = finite('<= 0: no cap, as Detectron')
NUMPY_SEED_MAX = 2 ** 31 - 1  # np.random.seed takes < 2 ** 32; RNG_SEED + rank seeds each rank

# Every numeric key: its domain. Keys of config._NOT_ACTED_ON get Detectron's meaning too (they are
# refused away from their default anyway).
DOMAINS = {
    # Training
    'TRAIN.SCALES': nonempty_of(at_least(1)),
    'TRAIN.MAX_SIZE': at_least(1),
    'TRAIN.IMS_PER_BATCH': at_least(1),
    'TRAIN.RANK_IMS_PER_BATCH': tuple_of(at_least(1)),  # (): TRAIN.IMS_PER_BATCH on every process
    'TRAIN.BATCH_SIZE_PER_IM': at_least(1),
    'TRAIN.FG_FRACTION': FRACTION,
    'TRAIN.FG_THRESH': FRACTION,
    'TRAIN.BG_THRESH_HI': FRACTION,
    'TRAIN.BG_THRESH_LO': FRACTION,
    'TRAIN.BBOX_THRESH': FRACTION,
    'TRAIN.SNAPSHOT_ITERS': at_least(1),
    'TRAIN.RPN_POSITIVE_OVERLAP': FRACTION,
    'TRAIN.RPN_NEGATIVE_OVERLAP': FRACTION,
    'TRAIN.RPN_FG_FRACTION': FRACTION,
    'TRAIN.RPN_BATCH_SIZE_PER_IM': at_least(1),
    'TRAIN.RPN_NMS_THRESH': in_range(0, 1, note='0: no NMS, as Detectron'),
    'TRAIN.RPN_PRE_NMS_TOP_N': OFF_OR_PROPOSALS_CAP,  # rpn_heads: a top-n <= 0 keeps every anchor
    'TRAIN.RPN_POST_NMS_TOP_N': OFF_OR_PROPOSALS_CAP,
    # Detectron's -1 (any negative) keeps anchors crossing the border; n >= 0 drops those n pixels out
    'TRAIN.RPN_STRADDLE_THRESH': finite('negative: keep anchors crossing the image border'),
    'TRAIN.RPN_MIN_SIZE': at_least(0),
    'TRAIN.CROWD_FILTER_THRESH': FRACTION,
    'TRAIN.GT_MIN_AREA': finite('annotations of smaller area are dropped; -1 keeps all'),
    'TRAIN.KEEP_CHECKPOINTS': at_least(0, '0: keep all'),
    'TRAIN.FREEZE_AT': one_of(0, 2, 3, 4, 5),  # 0: train the whole body; n: freeze the stem and res2..resn
    'TRAIN.CUDA_GRAPHS_MAX_SHAPES': at_least(1),
    # Data loader
    'DATA_LOADER.NUM_THREADS': at_least(0, '0: load in the main process'),
    'DATA_LOADER.MINIBATCH_QUEUE_SIZE': at_least(1),
    'DATA_LOADER.BLOBS_QUEUE_CAPACITY': at_least(1),
    'DATA_LOADER.TIMEOUT_S': at_least(0, '0: no timeout'),
    # Inference
    'TEST.SCALE': at_least(1),
    'TEST.MAX_SIZE': at_least(1),
    'TEST.NMS': FRACTION,
    'TEST.PROPOSAL_LIMIT': at_least(1),
    'TEST.RPN_NMS_THRESH': in_range(0, 1, note='0: no NMS, as Detectron'),
    'TEST.RPN_PRE_NMS_TOP_N': OFF_OR_PROPOSALS_CAP,
    'TEST.RPN_POST_NMS_TOP_N': OFF_OR_PROPOSALS_CAP,
    'TEST.EVAL_PERIOD': at_least(0, '0: off'),
    'TEST.VAL_LOSS_PERIOD': at_least(0, '0: off'),
    'TEST.RPN_MIN_SIZE': at_least(0),
    # R-CNN reads 0 as no cap (Detectron's <= 0); CenterNet's merge keeps the n best, so there it is at
    # least 1 (core/config.py's _check_dependent_domains)
    'TEST.DETECTIONS_PER_IM': at_least(0, '0: no cap'),
    'TEST.SCORE_THRESH': FRACTION,
    'TEST.IMS_PER_BATCH': at_least(1),
    'TEST.CUDA_GRAPHS_MAX_SHAPES': at_least(1),
    'TEST.BBOX_AUG.SCALES': tuple_of(at_least(1)),
    'TEST.BBOX_AUG.MAX_SIZE': at_least(1),
    'TEST.BBOX_AUG.AREA_TH_LO': at_least(0),
    'TEST.BBOX_AUG.AREA_TH_HI': at_least(0),
    'TEST.BBOX_AUG.ASPECT_RATIOS': tuple_of(positive()),
    'TEST.MASK_AUG.SCALES': tuple_of(at_least(1)),
    'TEST.MASK_AUG.MAX_SIZE': at_least(1),
    'TEST.MASK_AUG.AREA_TH': at_least(0),
    'TEST.MASK_AUG.ASPECT_RATIOS': tuple_of(positive()),
    'TEST.KPS_AUG.SCALES': tuple_of(at_least(1)),
    'TEST.KPS_AUG.MAX_SIZE': at_least(1),
    'TEST.KPS_AUG.AREA_TH': at_least(0),
    'TEST.KPS_AUG.ASPECT_RATIOS': tuple_of(positive()),
    'TEST.SOFT_NMS.SIGMA': positive(),  # the Gaussian's exp(-IoU^2 / sigma)
    'TEST.BBOX_VOTE.VOTE_TH': FRACTION,
    'TEST.BBOX_VOTE.SCORING_METHOD_BETA': positive(),  # an exponent (and its 1 / beta) of the vote's scores
    # Model
    # Background included. -1: not set, Detectron's default; CenterNet counts CENTERNET.NUM_CLASSES instead
    'MODEL.NUM_CLASSES': unset_or(at_least(2), 'not set: CenterNet reads CENTERNET.NUM_CLASSES'),
    'MODEL.BBOX_REG_WEIGHTS': tuple_of(positive(), length=4),  # box deltas are divided by them
    'RETINANET.ASPECT_RATIOS': nonempty_of(positive()),
    'RETINANET.SCALES_PER_OCTAVE': at_least(1),
    'RETINANET.ANCHOR_SCALE': at_least(1),
    'RETINANET.NUM_CONVS': at_least(0),
    'RETINANET.BBOX_REG_WEIGHT': at_least(0.0),
    'RETINANET.BBOX_REG_BETA': positive(),
    'RETINANET.PRE_NMS_TOP_N': at_least(1),
    'RETINANET.POSITIVE_OVERLAP': FRACTION,
    'RETINANET.NEGATIVE_OVERLAP': FRACTION,
    'RETINANET.LOSS_ALPHA': FRACTION,
    'RETINANET.LOSS_GAMMA': at_least(0.0),
    'RETINANET.PRIOR_PROB': in_range(0, 1, lo_open=True, hi_open=True),
    'RETINANET.INFERENCE_TH': FRACTION,
    # Solver
    'SOLVER.BASE_LR': positive(),
    'SOLVER.GAMMA': positive(),
    # at least 1 with LR_POLICY step (core/config.py's _check_dependent_domains); other policies do not read it
    'SOLVER.STEP_SIZE': finite(),
    'SOLVER.STEPS': tuple_of(at_least(0)),  # lr_policy checks that they ascend from 0 for a steps policy
    'SOLVER.LRS': tuple_of(positive()),
    'SOLVER.MAX_ITER': at_least(1),
    'SOLVER.MOMENTUM': in_range(0, 1, hi_open=True),
    'SOLVER.WEIGHT_DECAY': at_least(0.0),
    'SOLVER.WEIGHT_DECAY_GN': at_least(0.0),
    'SOLVER.WARM_UP_ITERS': at_least(0),
    'SOLVER.WARM_UP_FACTOR': in_range(0, 1),
    # Ratios max(new / old, old / new) of two LRs, >= 1: a threshold of 1 acts on every change
    'SOLVER.SCALE_MOMENTUM_THRESHOLD': at_least(1.0),
    'SOLVER.LOG_LR_CHANGE_THRESHOLD': at_least(1.0),
    'SOLVER.ITER_SIZE': at_least(1),
    'SOLVER.REFERENCE_WORLD_BATCH': at_least(0, '0: no rescaling'),
    'SOLVER.AMP.LOSS_SCALE': at_least(0.0, '0: dynamic loss scaling'),
    'SOLVER.CLIP_GRADIENTS.CLIP_VALUE': positive(),
    'SOLVER.CLIP_GRADIENTS.NORM_TYPE': unset_or(positive(), 'the largest absolute value', value=math.inf),
    # Heads and backbones
    'FAST_RCNN.MLP_HEAD_DIM': at_least(1),
    'FAST_RCNN.CONV_HEAD_DIM': at_least(1),
    'FAST_RCNN.NUM_STACKED_CONVS': at_least(1),  # fc6 reads CONV_HEAD_DIM channels from the last conv
    'FAST_RCNN.ROI_XFORM_SAMPLING_RATIO': at_least(0, '0: adaptive, as RoIAlign'),
    'FAST_RCNN.ROI_XFORM_RESOLUTION': at_least(1),
    'RPN.SIZES': nonempty_of(positive()),
    'RPN.STRIDE': at_least(1),
    'RPN.ASPECT_RATIOS': nonempty_of(positive()),
    'FPN.DIM': at_least(1),
    'FPN.COARSEST_STRIDE': at_least(1),
    'FPN.ROI_CANONICAL_SCALE': at_least(1),
    'FPN.ROI_CANONICAL_LEVEL': finite(),  # an offset in the level formula; the result is clamped to the levels
    'FPN.ROI_MAX_LEVEL': at_least(0),  # the levels themselves: rcnn_checks.check_supported
    'FPN.ROI_MIN_LEVEL': at_least(0),
    'FPN.RPN_MAX_LEVEL': at_least(0),
    'FPN.RPN_MIN_LEVEL': at_least(0),
    'FPN.RPN_ASPECT_RATIOS': nonempty_of(positive()),
    'FPN.RPN_ANCHOR_START_SIZE': at_least(1),
    'MRCNN.RESOLUTION': at_least(1),
    'MRCNN.ROI_XFORM_RESOLUTION': at_least(1),
    'MRCNN.ROI_XFORM_SAMPLING_RATIO': at_least(0, '0: adaptive, as RoIAlign'),
    'MRCNN.DIM_REDUCED': at_least(1),
    'MRCNN.DILATION': at_least(1),
    'MRCNN.UPSAMPLE_RATIO': at_least(1),
    'MRCNN.WEIGHT_LOSS_MASK': at_least(0.0),
    'MRCNN.THRESH_BINARIZE': FRACTION,
    'KRCNN.HEATMAP_SIZE': unset_or(at_least(1), 'not set'),
    'KRCNN.UP_SCALE': unset_or(at_least(1), 'not set'),
    'KRCNN.DECONV_DIM': at_least(1),
    'KRCNN.DILATION': at_least(1),
    'KRCNN.DECONV_KERNEL': at_least(1),
    'KRCNN.NUM_KEYPOINTS': unset_or(at_least(1), 'not set'),
    'KRCNN.NUM_STACKED_CONVS': at_least(1),
    'KRCNN.CONV_HEAD_DIM': at_least(1),
    'KRCNN.CONV_HEAD_KERNEL': at_least(1),
    'KRCNN.ROI_XFORM_RESOLUTION': at_least(1),
    'KRCNN.ROI_XFORM_SAMPLING_RATIO': at_least(0),
    'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH': at_least(0),
    'KRCNN.INFERENCE_MIN_SIZE': at_least(0),
    'KRCNN.LOSS_WEIGHT': at_least(0.0),
    'RFCN.PS_GRID_SIZE': at_least(1),
    'RESNETS.NUM_GROUPS': at_least(1),
    'RESNETS.WIDTH_PER_GROUP': at_least(1),
    'RESNETS.RES5_DILATION': at_least(1),
    # GroupNorm's groups come from one of the two; the other is -1 (modeling/norm.py)
    'GROUP_NORM.DIM_PER_GP': unset_or(at_least(1), 'GROUP_NORM.NUM_GROUPS sets the groups'),
    'GROUP_NORM.NUM_GROUPS': unset_or(at_least(1), 'GROUP_NORM.DIM_PER_GP sets the groups'),
    'GROUP_NORM.EPSILON': positive(),
    # KL-Loss
    'STD_TH': FRACTION,  # the IoU above which variance voting averages boxes
    'STD.IOU_SIGMA': positive(),
    # CenterNet
    'CENTERNET.NUM_CLASSES': at_least(1, 'heatmaps, no background'),
    # CenterNet's --head_conv: 0 puts the 1x1 output convolution straight on the backbone
    'CENTERNET.HEAD_CONV': at_least(-1, '-1: 256 for DLA backbones, 64 otherwise; 0: no hidden convolution'),
    'CENTERNET.DECONV_FILTERS': tuple_of(at_least(1)),  # empty or three widths: the model type's check
    'CENTERNET.INPUT_RES': at_least(1),  # a multiple of 32: the model type's check
    'CENTERNET.DOWN_RATIO': at_least(1),
    'CENTERNET.MAX_OBJS': at_least(1),
    'CENTERNET.FLIP': FRACTION,  # a probability
    # Random scaling by 1 +- up to SCALE (with NOT_RAND_CROP): at 1 an image could shrink to nothing
    'CENTERNET.SCALE': in_range(0, 1, hi_open=True),
    'CENTERNET.SHIFT': at_least(0.0),
    'CENTERNET.HM_WEIGHT': at_least(0.0),
    'CENTERNET.WH_WEIGHT': at_least(0.0),
    'CENTERNET.OFF_WEIGHT': at_least(0.0),
    'CENTERNET.K': at_least(1),
    'CENTERNET.TEST_SCALES': nonempty_of(positive()),
    'CENTERNET.NUM_EPOCHS': at_least(1),
    'CENTERNET.VAL_INTERVALS': at_least(0, '0: off'),
    # Epochs after which the LR drops x0.1 each (epochs count from 1); main.py would raise the LR again
    # after an unordered or repeated epoch
    'CENTERNET.LR_STEP': tuple_of(at_least(1), increasing=True),
    'CENTERNET.LR': positive(),
    'CENTERNET.LR_BATCH_SIZE': at_least(1),
    'CENTERNET.BATCH_SIZE': at_least(1),
    'CENTERNET.MASTER_BATCH_SIZE': unset_or(at_least(1), 'BATCH_SIZE // NUM_GPUS'),
    'CENTERNET.CHUNK_SIZES': tuple_of(at_least(1)),  # (): derived from BATCH_SIZE and MASTER_BATCH_SIZE
    'CENTERNET.MEAN': tuple_of(finite(), length=3),
    'CENTERNET.STD': tuple_of(positive(), length=3),  # images are divided by it
    # Miscellaneous
    'NUM_GPUS': at_least(1),
    'DEDUP_BOXES': positive(),
    'BBOX_XFORM_CLIP': positive(),
    'BBOX_XFORM_CLIPe': positive(),
    'PIXEL_MEANS': Nested(finite(), '(((B, G, R),),)'),
    'RNG_SEED': in_range(0, NUMPY_SEED_MAX),
    'EPS': positive(),
    'VIS_TH': FRACTION,
    'EXPECTED_RESULTS_RTOL': at_least(0.0),
    'EXPECTED_RESULTS_ATOL': at_least(0.0),
    'EXPECTED_RESULTS_SIGMA_TOL': at_least(0),
}

# Keys whose default is an empty sequence but which hold names, not numbers (no domain here).
NON_NUMERIC_SEQUENCES = {
    'TRAIN.DATASETS', 'TEST.DATASETS', 'TRAIN.PROPOSAL_FILES', 'TEST.PROPOSAL_FILES',
    'EXPECTED_RESULTS',  # Detectron's (dataset, task, metric, value) rows
}


def is_numeric_default(full_key, default):
    """Whether a key of the tree is numeric: a number, or a sequence of numbers (nested: PIXEL_MEANS),
    or an empty sequence that is not one of NON_NUMERIC_SEQUENCES."""
    if isinstance(default, (tuple, list)):
        if not default:
            return full_key not in NON_NUMERIC_SEQUENCES
        return all(is_numeric_default(full_key, item) for item in default)
    return _is_number(default)


def check_domains(values, defaults):
    """ConfigValueError, one line, for the first key of DOMAINS whose value (values(key)) lies outside
    its domain; defaults(key): the key's default, which says how to word the domain."""
    for full_key, domain in DOMAINS.items():
        value = values(full_key)
        if not domain.contains(value):
            raise ConfigValueError('{} must be {}, got {!r}'.format(full_key, domain.describe(defaults(full_key)),
                                                                    value))
