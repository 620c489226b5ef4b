"""LR schedule: Detectron's verified values, every policy and warm-up against hand formulas, tutorials."""

import math

import numpy as np
import pytest

from detectron.core.config import cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.core.train_engine import describe_schedule, lr_schedule
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigKeyError, ConfigValueError
from detectron.utils.lr_policy import LRSchedule


def get_lr_at_iter(it):
    """The LR of cfg.SOLVER's schedule at `it` (the schedule is built from cfg by the engine)."""
    return lr_schedule().lr_at(it)


def lr_change_iters():
    return lr_schedule().change_iters()


def test_schedule_from_plain_numbers_needs_no_cfg():
    schedule = LRSchedule(policy='steps_with_decay', base_lr=0.02, max_iter=7500, gamma=0.1,
                          steps=(0, 3750, 5000), warm_up_iters=500, warm_up_factor=1 / 3, warm_up_method='linear')
    assert [schedule.lr_at(it) for it in (0, 500, 3750, 5000)] == pytest.approx(
        [0.02 / 3, 0.02, 0.002, 0.0002], rel=1e-6)
    assert schedule.change_iters() == [3750, 5000]

TUTORIAL = 'configs/getting_started/tutorial_{}gpu_e2e_faster_rcnn_R-50-FPN.yaml'


def _solver(**values):
    for key, value in values.items():
        cfg.SOLVER[key] = value


def _schedule_8gpu(**overrides):
    cfg.MODEL.TYPE = 'generalized_rcnn'  # describe_schedule names the model type's checkpoint files
    values = dict(BASE_LR=0.02, LR_POLICY='steps_with_decay', GAMMA=0.1, STEPS=[0, 3750, 5000], MAX_ITER=7500)
    _solver(**dict(values, **overrides))


# Values verified by running Detectron's own lr_policy.py (reference notes, detectron.md 3.2).
@pytest.mark.parametrize('it, lr', [
    (0, 0.0066667), (250, 0.0133333), (499, 0.0199733), (500, 0.02), (3749, 0.02),
    (3750, 0.002), (4999, 0.002), (5000, 0.0002), (7499, 0.0002), (9000, 0.0002),
])
def test_detectron_verified_steps_with_decay(it, lr):
    _schedule_8gpu()
    assert get_lr_at_iter(it) == pytest.approx(lr, abs=5e-8)


@pytest.mark.parametrize('it, lr', [(0, 0.0066667), (499, 0.0066667), (500, 0.02)])
def test_detectron_verified_constant_warm_up(it, lr):
    _schedule_8gpu(WARM_UP_METHOD='constant')
    assert get_lr_at_iter(it) == pytest.approx(lr, abs=5e-8)


def test_detectron_verified_cosine_and_exp_decay():
    _schedule_8gpu(LR_POLICY='cosine_decay')
    assert get_lr_at_iter(3750) == pytest.approx(0.01, abs=5e-9)
    _schedule_8gpu(LR_POLICY='exp_decay')
    assert get_lr_at_iter(3750) == pytest.approx(0.0063246, abs=5e-8)


def test_lr_is_float32_like_detectron():
    _schedule_8gpu()
    assert isinstance(get_lr_at_iter(10), np.float32)


def _hand_lr(it, policy, warm_up_method):
    """The formulas of the module docstring, written out for the settings of test_policy_matches_formula."""
    base, gamma, max_iter, warm_iters, warm_factor = 0.1, 0.5, 1000, 200, 0.25
    if policy == 'step':  # STEP_SIZE 300
        lr = base * gamma ** (it // 300)
    elif policy == 'steps_with_decay':  # STEPS [0, 400, 700]
        lr = base * gamma ** sum(1 for s in (400, 700) if it >= s)
    elif policy == 'steps_with_lrs':  # LRS [0.3, 0.03, 0.003]
        lr = [0.3, 0.03, 0.003][sum(1 for s in (400, 700) if it >= s)]
    elif policy == 'cosine_decay':
        lr = base * (math.cos(math.pi * it / max_iter) + 1) / 2
    else:
        lr = base * gamma ** (it / max_iter)
    if it < warm_iters:
        ramp = it / warm_iters
        lr *= warm_factor if warm_up_method == 'constant' else warm_factor * (1 - ramp) + ramp
    return lr


@pytest.mark.parametrize('warm_up_method', ['constant', 'linear'])
@pytest.mark.parametrize('policy', ['step', 'steps_with_decay', 'steps_with_lrs', 'cosine_decay', 'exp_decay'])
def test_policy_matches_formula(policy, warm_up_method):
    _solver(BASE_LR=0.1, GAMMA=0.5, MAX_ITER=1000, STEP_SIZE=300, STEPS=[0, 400, 700], LRS=[0.3, 0.03, 0.003],
            LR_POLICY=policy, WARM_UP_ITERS=200, WARM_UP_FACTOR=0.25, WARM_UP_METHOD=warm_up_method)
    for it in [0, 1, 50, 199, 200, 299, 300, 399, 400, 599, 600, 699, 700, 999]:
        assert get_lr_at_iter(it) == pytest.approx(_hand_lr(it, policy, warm_up_method), rel=1e-6), it


def test_detectron_steps_with_lrs_example():
    _solver(LR_POLICY='steps_with_lrs', MAX_ITER=90, STEPS=[0, 60, 80], LRS=[0.02, 0.002, 0.0002], WARM_UP_ITERS=0)
    lrs = [get_lr_at_iter(it) for it in (0, 59, 60, 79, 80, 89, 120)]
    assert lrs == pytest.approx([0.02, 0.02, 0.002, 0.002, 0.0002, 0.0002, 0.0002], rel=1e-6)


def test_unknown_policy_names_the_allowed_ones():
    _solver(LR_POLICY='poly')
    with pytest.raises(NotImplementedError) as err:  # Detectron's exception type
        get_lr_at_iter(0)
    assert isinstance(err.value, ConfigValueError)
    assert str(err.value) == ('Unknown LR policy: poly; SOLVER.LR_POLICY must be one of '
                              'cosine_decay, exp_decay, step, steps_with_decay, steps_with_lrs')


def test_unknown_warm_up_method():
    _solver(WARM_UP_METHOD='cosine')
    with pytest.raises(ConfigKeyError, match="Unknown SOLVER.WARM_UP_METHOD: cosine; use 'constant' or 'linear'"):
        get_lr_at_iter(0)
    assert get_lr_at_iter(500) == pytest.approx(0.001)  # after warm-up the method is not consulted


@pytest.mark.parametrize('steps', [[], [100, 200], [0, 300, 200]])
def test_bad_steps(steps):
    _schedule_8gpu(STEPS=steps)
    with pytest.raises(ConfigValueError, match='SOLVER.STEPS must be ascending iterations starting at 0'):
        get_lr_at_iter(600)


def test_lrs_must_match_steps():
    _solver(LR_POLICY='steps_with_lrs', STEPS=[0, 10], LRS=[0.1])
    with pytest.raises(ConfigValueError, match=r'one learning rate per SOLVER.STEPS entry \(2\), got \[0.1\]'):
        get_lr_at_iter(600)


# ---------------------------------------------------------------------------------------------
# Detectron's tutorial schedules (linear scaling rule)
# ---------------------------------------------------------------------------------------------
TUTORIALS = {  # GPUs: (BASE_LR, MAX_ITER, STEPS), detectron.md 3.3
    1: (0.0025, 60000, [0, 30000, 40000]),
    2: (0.005, 30000, [0, 15000, 20000]),
    4: (0.01, 15000, [0, 7500, 10000]),
    8: (0.02, 7500, [0, 3750, 5000]),
}


@pytest.mark.parametrize('gpus', sorted(TUTORIALS))
def test_tutorial_schedule(gpus):
    merge_cfg_from_file(TUTORIAL.format(gpus))
    base_lr, max_iter, steps = TUTORIALS[gpus]
    assert (cfg.NUM_GPUS, cfg.TRAIN.IMS_PER_BATCH) == (gpus, 2)
    assert (cfg.SOLVER.BASE_LR, cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS) == (base_lr, max_iter, steps)
    assert cfg.SOLVER.MAX_ITER * cfg.NUM_GPUS * cfg.TRAIN.IMS_PER_BATCH == 120000  # same images for all four
    expected = {
        0: base_lr / 3, 250: base_lr * 2 / 3, 500: base_lr, steps[1] - 1: base_lr,
        steps[1]: base_lr / 10, steps[2] - 1: base_lr / 10, steps[2]: base_lr / 100, max_iter - 1: base_lr / 100,
    }
    for it, lr in expected.items():
        assert get_lr_at_iter(it) == pytest.approx(lr, rel=1e-6), it


def test_describe_schedule_of_the_8gpu_tutorial():
    merge_cfg_from_file(TUTORIAL.format(8))
    assert describe_schedule(model_builder.build_model_type(cfg), num_images=118287) == [
        'images per iteration: 16 (NUM_GPUS 8 x TRAIN.IMS_PER_BATCH 2 x SOLVER.ITER_SIZE 1)',
        'LR policy: steps_with_decay, base LR 0.02',
        'warm-up: 500 iterations, linear from factor 0.333333 (LR 0.00666667 at iteration 0)',
        'LR step: iteration 3750 -> LR 0.002',
        'LR step: iteration 5000 -> LR 0.0002',
        'final LR: 0.0002 (iteration 7499)',
        'MAX_ITER: 7500 iterations = 120000 images',
        'epochs: 1.01 over 118287 training images',
        'checkpoint every 10000 iterations (int(TRAIN.SNAPSHOT_ITERS 80000 / NUM_GPUS 8)) into model_iterN.pth, '
        'all kept',
    ]


def test_describe_schedule_step_policy_without_warm_up():
    merge_cfg_from_list(['MODEL.TYPE', 'generalized_rcnn', 'SOLVER.WARM_UP_ITERS', '0', 'SOLVER.ITER_SIZE', '3',
                         'SOLVER.STEP_SIZE', '1000', 'SOLVER.MAX_ITER', '12500', 'SOLVER.BASE_LR', '1.0',
                         'SOLVER.GAMMA', '0.5'])
    assert lr_change_iters() == list(range(1000, 12500, 1000))
    lines = describe_schedule(model_builder.build_model_type(cfg))
    assert lines[0] == 'images per iteration: 6 (NUM_GPUS 1 x TRAIN.IMS_PER_BATCH 2 x SOLVER.ITER_SIZE 3)'
    assert lines[2] == 'warm-up: none'
    assert lines[3] == 'LR step: iteration 1000 -> LR 0.5'
    assert lines[12] == 'LR step: iteration 10000 -> LR 0.000976562'
    assert lines[13] == '... 2 more LR steps'
    assert lines[14] == 'final LR: 0.000244141 (iteration 12499)'
    assert not any(line.startswith('epochs') for line in lines)


def test_describe_schedule_continuous_policy_lists_no_steps():
    _schedule_8gpu(LR_POLICY='cosine_decay')
    lines = describe_schedule(model_builder.build_model_type(cfg))
    assert not any(line.startswith('LR step') for line in lines)
    assert lines[3] == 'final LR: {:.6g} (iteration 7499)'.format(
        np.float32(0.02 * (math.cos(math.pi * 7499 / 7500) + 1) / 2))
