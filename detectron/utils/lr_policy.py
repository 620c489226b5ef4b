"""Learning-rate schedule read from cfg.SOLVER, with Detectron's policies and warm-up.

`get_lr_at_iter(it)` = policy(it) x warm-up factor, as float32 like Detectron. Policies:
  step              BASE_LR x GAMMA^(it // STEP_SIZE)
  steps_with_decay  BASE_LR x GAMMA^k, k = number of STEPS after the first that are <= it
  steps_with_lrs    LRS[k]
  cosine_decay      BASE_LR x (cos(pi x it / MAX_ITER) + 1) / 2
  exp_decay         BASE_LR x GAMMA^(it / MAX_ITER)
Warm-up while it < WARM_UP_ITERS: 'constant' multiplies by WARM_UP_FACTOR, 'linear' ramps the
factor from WARM_UP_FACTOR at iteration 0 towards 1.
"""

import math

import numpy as np

from detectron.core.config import cfg, images_per_iter
from detectron.utils.errors import ConfigKeyError, ConfigValueError, UnknownPolicyError


def get_lr_at_iter(it):
    """Learning rate of iteration `it` (0-based) under cfg.SOLVER."""
    lr = get_lr_func()(it) * _warm_up_factor(it)
    return np.float32(lr)


def _warm_up_factor(it):
    solver = cfg.SOLVER
    if it >= solver.WARM_UP_ITERS:
        return 1.0
    if solver.WARM_UP_METHOD == 'constant':
        return solver.WARM_UP_FACTOR
    if solver.WARM_UP_METHOD == 'linear':
        alpha = it / solver.WARM_UP_ITERS
        return solver.WARM_UP_FACTOR * (1 - alpha) + alpha
    raise ConfigKeyError(
        "Unknown SOLVER.WARM_UP_METHOD: {}; use 'constant' or 'linear'".format(solver.WARM_UP_METHOD)
    )


def lr_func_step(cur_iter):
    return cfg.SOLVER.BASE_LR * cfg.SOLVER.GAMMA ** (cur_iter // cfg.SOLVER.STEP_SIZE)


def lr_func_steps_with_decay(cur_iter):
    return cfg.SOLVER.BASE_LR * cfg.SOLVER.GAMMA ** get_step_index(cur_iter)


def lr_func_steps_with_lrs(cur_iter):
    lrs, steps = cfg.SOLVER.LRS, cfg.SOLVER.STEPS
    if len(lrs) != len(steps):
        raise ConfigValueError(
            'SOLVER.LRS needs one learning rate per SOLVER.STEPS entry ({}), got {}'
            .format(len(steps), list(lrs))
        )
    return lrs[get_step_index(cur_iter)]


def lr_func_cosine_decay(cur_iter):
    iter_frac = cur_iter / cfg.SOLVER.MAX_ITER
    return cfg.SOLVER.BASE_LR * 0.5 * (math.cos(math.pi * iter_frac) + 1)


def lr_func_exp_decay(cur_iter):
    # GAMMA is the ratio of the final to the initial learning rate
    iter_frac = cur_iter / cfg.SOLVER.MAX_ITER
    return cfg.SOLVER.BASE_LR * math.exp(iter_frac * math.log(cfg.SOLVER.GAMMA))


_POLICIES = {
    'step': lr_func_step,
    'steps_with_decay': lr_func_steps_with_decay,
    'steps_with_lrs': lr_func_steps_with_lrs,
    'cosine_decay': lr_func_cosine_decay,
    'exp_decay': lr_func_exp_decay,
}


def get_step_index(cur_iter):
    """Index of the last SOLVER.STEPS entry <= cur_iter (MAX_ITER closes the last interval)."""
    steps = list(cfg.SOLVER.STEPS)
    if not steps or steps[0] != 0 or steps != sorted(steps):
        raise ConfigValueError(
            'SOLVER.STEPS must be ascending iterations starting at 0 for LR_POLICY {}, got {}'
            .format(cfg.SOLVER.LR_POLICY, steps)
        )
    # Detectron's search: an iteration past MAX_ITER stays in the last interval
    bounds = steps + [cfg.SOLVER.MAX_ITER]
    for ind, step in enumerate(bounds):
        if cur_iter < step:
            return ind - 1
    return len(bounds) - 2


def get_lr_func():
    policy = cfg.SOLVER.LR_POLICY
    if policy not in _POLICIES:
        raise UnknownPolicyError(
            'Unknown LR policy: {}; SOLVER.LR_POLICY must be one of {}'
            .format(policy, ', '.join(sorted(_POLICIES)))
        )
    return _POLICIES[policy]


def lr_change_iters():
    """Iterations after 0 and before MAX_ITER where a step policy changes the learning rate."""
    solver = cfg.SOLVER
    if solver.LR_POLICY == 'step':
        return list(range(solver.STEP_SIZE, solver.MAX_ITER, solver.STEP_SIZE))
    if solver.LR_POLICY in ('steps_with_decay', 'steps_with_lrs'):
        return [step for step in solver.STEPS[1:] if step < solver.MAX_ITER]
    return []


_MAX_LISTED_STEPS = 10


def _describe_micro_batch():
    if cfg.TRAIN.RANK_IMS_PER_BATCH:
        return 'TRAIN.RANK_IMS_PER_BATCH {}'.format(tuple(cfg.TRAIN.RANK_IMS_PER_BATCH))
    return 'NUM_GPUS {} x TRAIN.IMS_PER_BATCH {}'.format(cfg.NUM_GPUS, cfg.TRAIN.IMS_PER_BATCH)


def describe_schedule(num_images=None):
    """Lines that say what a training run will do, for a user about to spend GPU hours.

    num_images: size of the training set (with flipped copies), to express the run in epochs.
    """
    solver = cfg.SOLVER
    batch = images_per_iter()
    lines = [
        'images per iteration: {} ({} x SOLVER.ITER_SIZE {})'.format(
            batch, _describe_micro_batch(), solver.ITER_SIZE),
        'LR policy: {}, base LR {:g}'.format(solver.LR_POLICY, solver.BASE_LR),
        _describe_warm_up(),
    ]
    change_iters = lr_change_iters()
    for it in change_iters[:_MAX_LISTED_STEPS]:
        lines.append('LR step: iteration {} -> LR {:.6g}'.format(it, get_lr_at_iter(it)))
    if len(change_iters) > _MAX_LISTED_STEPS:
        lines.append('... {} more LR steps'.format(len(change_iters) - _MAX_LISTED_STEPS))
    lines += [
        'final LR: {:.6g} (iteration {})'.format(
            get_lr_at_iter(solver.MAX_ITER - 1), solver.MAX_ITER - 1),
        'MAX_ITER: {} iterations = {} images'.format(solver.MAX_ITER, solver.MAX_ITER * batch),
    ]
    if num_images:
        lines.append('epochs: {:.2f} over {} training images'.format(
            solver.MAX_ITER * batch / num_images, num_images))
    lines.append('checkpoint every {} iterations (int(TRAIN.SNAPSHOT_ITERS {} / NUM_GPUS {}))'.format(
        int(cfg.TRAIN.SNAPSHOT_ITERS / cfg.NUM_GPUS), cfg.TRAIN.SNAPSHOT_ITERS, cfg.NUM_GPUS))
    return lines


def _describe_warm_up():
    solver = cfg.SOLVER
    if solver.WARM_UP_ITERS <= 0:
        return 'warm-up: none'
    return 'warm-up: {} iterations, {} from factor {:g} (LR {:.6g} at iteration 0)'.format(
        solver.WARM_UP_ITERS, solver.WARM_UP_METHOD, solver.WARM_UP_FACTOR, get_lr_at_iter(0))
