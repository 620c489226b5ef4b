"""Every numeric key has a domain in core/config_domains.py's table, and a value outside it is one
error line naming the key (the reliability issue's class 3: -96 as a training scale, 0 as the FPN
width, 1.5 as an NMS threshold, (59, 49) as CenterNet's LR steps).

The table is walked: a numeric key of the tree without a domain fails, naming the key; every default
lies in its domain; values just outside each domain, generated from the domain, are refused by
assert_and_infer_cfg with `{KEY} must be ..., got {value!r}`. A few train_net runs check the tool's
`error:` line and exit status 2."""
import math
import os
import subprocess
import sys

import pytest

from detectron.core import config_domains
from detectron.core.config import CfgNode, assert_and_infer_cfg, cfg, merge_cfg_from_list
from detectron.core.config_domains import DOMAINS, is_numeric_default
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigValueError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _leaves(node, prefix=''):
    for key, value in node.items():
        if isinstance(value, CfgNode):
            yield from _leaves(value, prefix + key + '.')
        else:
            yield prefix + key, value


DEFAULTS = dict(_leaves(cfg))
NUMERIC_KEYS = sorted(key for key, value in DEFAULTS.items() if is_numeric_default(key, value))


def test_every_numeric_key_has_a_domain():
    missing = [key for key in NUMERIC_KEYS if key not in DOMAINS]
    assert missing == [], 'numeric keys without a domain: add them to config_domains.DOMAINS'


def test_every_domain_names_a_numeric_key():
    stale = [key for key in DOMAINS if key not in NUMERIC_KEYS]
    assert stale == [], 'DOMAINS entries that are no numeric key of the tree'
    assert config_domains.NON_NUMERIC_SEQUENCES <= set(DEFAULTS)


@pytest.mark.parametrize('key', sorted(DOMAINS))
def test_the_default_lies_in_its_domain(key):
    assert DOMAINS[key].contains(DEFAULTS[key]), (key, DEFAULTS[key], DOMAINS[key].describe(DEFAULTS[key]))


def _unbounded_integer_key(key):
    domain = DOMAINS[key]
    return isinstance(domain, config_domains.Number) and domain.lo is None and domain.hi is None and \
        isinstance(DEFAULTS[key], int)


def _outside_cases():
    for key in sorted(DOMAINS):
        for value in DOMAINS[key].outside(DEFAULTS[key]):
            yield key, value


OUTSIDE = list(_outside_cases())


@pytest.mark.parametrize('key', sorted(DOMAINS))
def test_every_domain_but_any_integer_has_values_outside(key):
    # An integer key whose domain is every integer (a top-n where <= 0 is "no cap") has nothing outside.
    assert bool(DOMAINS[key].outside(DEFAULTS[key])) != _unbounded_integer_key(key), key


@pytest.mark.parametrize('key, value', OUTSIDE, ids=['{}={!r}'.format(k, v) for k, v in OUTSIDE])
def test_a_value_just_outside_the_domain_is_one_line_naming_the_key(set_cfg, key, value):
    set_cfg({key: value})
    with pytest.raises(ConfigValueError) as err:
        assert_and_infer_cfg()
    message = str(err.value)
    assert message == '{} must be {}, got {!r}'.format(key, DOMAINS[key].describe(DEFAULTS[key]), value)
    assert '\n' not in message


def test_nan_and_inf_are_refused_for_every_float_key():
    float_keys = [key for key in NUMERIC_KEYS if isinstance(DEFAULTS[key], float)]
    assert len(float_keys) > 40
    infinite_allowed = {'SOLVER.CLIP_GRADIENTS.NORM_TYPE'}  # inf: the infinity norm, as torch names it
    for key in float_keys:
        assert not DOMAINS[key].contains(math.nan), key
        for value in (math.inf, -math.inf):
            assert DOMAINS[key].contains(value) == (key in infinite_allowed and value > 0), (key, value)


# The issue's values: (key, value typed) -> the error message.
ISSUE_CASES = {
    ('TRAIN.SCALES', '(-96,)'): 'TRAIN.SCALES must be a non-empty tuple of integers >= 1, got (-96,)',
    ('TRAIN.SCALES', '()'): 'TRAIN.SCALES must be a non-empty tuple of integers >= 1, got ()',
    ('TRAIN.MAX_SIZE', '0'): 'TRAIN.MAX_SIZE must be at least 1, got 0',
    ('TEST.SCALE', '-1'): 'TEST.SCALE must be at least 1, got -1',
    ('MODEL.NUM_CLASSES', '-3'):
        'MODEL.NUM_CLASSES must be -1 (not set: CenterNet reads CENTERNET.NUM_CLASSES) or at least 2, got -3',
    ('MRCNN.DIM_REDUCED', '0'): 'MRCNN.DIM_REDUCED must be at least 1, got 0',
    ('FPN.DIM', '0'): 'FPN.DIM must be at least 1, got 0',
    ('DATA_LOADER.NUM_THREADS', '-1'):
        'DATA_LOADER.NUM_THREADS must be at least 0 (0: load in the main process), got -1',
    ('RNG_SEED', '-1'): 'RNG_SEED must be in [0, 2147483647], got -1',
    ('TRAIN.FG_FRACTION', '1.5'): 'TRAIN.FG_FRACTION must be in [0, 1], got 1.5',
    ('TEST.NMS', '1.5'): 'TEST.NMS must be in [0, 1], got 1.5',
    ('TEST.SCORE_THRESH', '1e999'): 'TEST.SCORE_THRESH must be in [0, 1], got inf',
    ('CENTERNET.K', '0'): 'CENTERNET.K must be at least 1, got 0',
    ('CENTERNET.LR_STEP', '(59, 49)'): 'CENTERNET.LR_STEP must be a tuple of increasing integers >= 1, got (59, 49)',
    ('TRAIN.BATCH_SIZE_PER_IM', '0'): 'TRAIN.BATCH_SIZE_PER_IM must be at least 1, got 0',
    ('FPN.RPN_ANCHOR_START_SIZE', '0'): 'FPN.RPN_ANCHOR_START_SIZE must be at least 1, got 0',
    ('MODEL.BBOX_REG_WEIGHTS', '(10., 10., 5.)'):
        'MODEL.BBOX_REG_WEIGHTS must be a tuple of 4 finite numbers > 0, got (10.0, 10.0, 5.0)',
    ('PIXEL_MEANS', '[1e999, 1, 2]'):
        'PIXEL_MEANS must be (((B, G, R),),) of finite numbers, got (((inf, 1.0, 2.0),),)',
}


@pytest.mark.parametrize('key, value', sorted(ISSUE_CASES))
def test_the_issues_values_are_one_line(key, value):
    merge_cfg_from_list([key, value])
    with pytest.raises(ConfigValueError) as err:
        assert_and_infer_cfg()
    assert str(err.value) == ISSUE_CASES[key, value]


def test_nan_typed_is_a_string_for_the_type_rule():
    with pytest.raises(ConfigValueError, match='^Config key TEST.NMS expects a number'):
        merge_cfg_from_list(['TEST.NMS', 'nan'])


@pytest.mark.parametrize('overrides', [
    ['MODEL.NUM_CLASSES', '-1'],  # not set (CenterNet)
    ['CENTERNET.HEAD_CONV', '0'],  # no hidden convolution, as CenterNet's --head_conv 0
    ['DATA_LOADER.NUM_THREADS', '0'],
    ['TRAIN.RPN_PRE_NMS_TOP_N', '-1', 'TEST.RPN_POST_NMS_TOP_N', '0'],  # no cap, as Detectron
    ['TRAIN.RPN_STRADDLE_THRESH', '-1'],
    ['CENTERNET.LR_STEP', '()'],  # no LR drop
    ['CENTERNET.MASTER_BATCH_SIZE', '-1'],
    ['GROUP_NORM.NUM_GROUPS', '-1', 'GROUP_NORM.DIM_PER_GP', '16'],
    ['TEST.NMS', '1', 'TRAIN.FG_FRACTION', '0', 'SOLVER.MOMENTUM', '0'],  # closed ends
])
def test_values_that_mean_off_or_auto_are_in_their_domains(overrides):
    merge_cfg_from_list(overrides)
    assert_and_infer_cfg()


def test_a_derived_value_outside_its_domain_is_refused_too(set_cfg):
    # The check of assert_and_infer_cfg sees what derivations and the linear scaling rule left.
    merge_cfg_from_list(['SOLVER.REFERENCE_WORLD_BATCH', '16', 'SOLVER.MAX_ITER', '4'])
    from detectron.core.config import scale_schedule_to_global_batch
    scale_schedule_to_global_batch(1000)  # 4 iterations / 62.5 -> 0
    with pytest.raises(ConfigValueError, match=r'^SOLVER.MAX_ITER must be at least 1, got 0$'):
        assert_and_infer_cfg()


@pytest.mark.parametrize('overrides, message', [
    (['SOLVER.LR_POLICY', 'steps_with_decay', 'SOLVER.STEP_SIZE', '0', 'SOLVER.STEPS', '[0, 10]'], None),
    (['SOLVER.LR_POLICY', 'step', 'SOLVER.STEP_SIZE', '0'],
     'SOLVER.STEP_SIZE must be at least 1 with LR_POLICY step, got 0'),
    (['TEST.DETECTIONS_PER_IM', '0'], None),  # R-CNN: no cap, as Detectron
    (['MODEL.TYPE', 'centernet', 'TEST.DETECTIONS_PER_IM', '0'],
     'TEST.DETECTIONS_PER_IM must be at least 1 with MODEL.TYPE centernet (its merge keeps the n best; 0, no cap, '
     'is for R-CNN), got 0'),
    (['MODEL.TYPE', 'centernet', 'CENTERNET.ARCH', 'res_18', 'CENTERNET.DECONV_FILTERS', '(128, 64, 64)'], None),
    (['MODEL.TYPE', 'centernet', 'CENTERNET.ARCH', 'dla_34', 'CENTERNET.DECONV_FILTERS', '(128, 64, 64)'],
     "CENTERNET.DECONV_FILTERS sets the three upsampling widths of a res_ or resdcn_ arch: give three widths, or () "
     "for the arch's own; got (128, 64, 64) with CENTERNET.ARCH dla_34"),
])
def test_domains_that_depend_on_another_key(overrides, message):
    # The model type's own domains are in its check (finalize_cfg calls it before assert_and_infer_cfg).
    merge_cfg_from_list(overrides)

    def check():
        if cfg.MODEL.TYPE:
            model_builder.build_model_type(cfg).check()
        assert_and_infer_cfg()

    if message is None:
        check()
        return
    with pytest.raises(ConfigValueError) as err:
        check()
    assert str(err.value) == message


DEMO = os.path.join('configs', 'getting_started', 'shapes_demo_R-18-FPN.yaml')
CENTERNET_DEMO = os.path.join('configs', 'getting_started', 'shapes_demo_centernet_res18.yaml')


@pytest.mark.parametrize('config, key, value', [
    (DEMO, 'TRAIN.SCALES', '(-96,)'),
    (DEMO, 'TEST.NMS', '1.5'),
    (DEMO, 'MODEL.NUM_CLASSES', '-3'),
    (CENTERNET_DEMO, 'CENTERNET.K', '0'),
    (CENTERNET_DEMO, 'CENTERNET.LR_STEP', '(59, 49)'),
])
def test_train_net_prints_one_error_line_and_exits_2(config, key, value):
    run = subprocess.run([sys.executable, os.path.join('tools', 'train_net.py'), '--cfg', config, key, value,
                          '--print-config'], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout == ''
    assert run.stderr.strip().splitlines() == ['error: ' + ISSUE_CASES[key, value]]
