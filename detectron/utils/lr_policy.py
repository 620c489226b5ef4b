"""Learning-rate schedules with Detectron's policies and warm-up, from plain numbers.

`LRSchedule(...).lr_at(it)` = policy(it) x warm-up factor, as float32 like Detectron. Policies:
  step              BASE_LR x GAMMA^(it // STEP_SIZE)
  steps_with_decay  BASE_LR x GAMMA^k, k = number of STEPS after the first that are <= it
  steps_with_lrs    LRS[k]
  cosine_decay      BASE_LR x (cos(pi x it / MAX_ITER) + 1) / 2
  exp_decay         BASE_LR x GAMMA^(it / MAX_ITER)
Warm-up while it < WARM_UP_ITERS: 'constant' multiplies by WARM_UP_FACTOR, 'linear' ramps the
factor from WARM_UP_FACTOR at iteration 0 towards 1.

The engines build an LRSchedule from cfg.SOLVER (train_engine.lr_schedule); error messages name
those keys because that is where the numbers come from.
"""

import math
from dataclasses import dataclass

import numpy as np

from detectron.utils.errors import ConfigKeyError, ConfigValueError, UnknownPolicyError


@dataclass(frozen=True)
class LRSchedule:
    policy: str
    base_lr: float
    max_iter: int
    gamma: float = 0.1
    step_size: int = 30000
    steps: tuple = ()
    lrs: tuple = ()
    warm_up_iters: int = 0
    warm_up_factor: float = 1.0 / 3.0
    warm_up_method: str = 'linear'

    def lr_at(self, it):
        """Learning rate of iteration `it` (0-based), float32."""
        return np.float32(_policy(self.policy)(self, it) * _warm_up_factor(self, it))

    def change_iters(self):
        """Iterations after 0 and before max_iter where a step policy changes the learning rate."""
        if self.policy == 'step':
            return list(range(self.step_size, self.max_iter, self.step_size))
        if self.policy in ('steps_with_decay', 'steps_with_lrs'):
            return [step for step in self.steps[1:] if step < self.max_iter]
        return []


def get_lr_at_iter(it, schedule):
    """Detectron's name for schedule.lr_at(it)."""
    return schedule.lr_at(it)


def _warm_up_factor(s, it):
    if it >= s.warm_up_iters:
        return 1.0
    if s.warm_up_method == 'constant':
        return s.warm_up_factor
    if s.warm_up_method == 'linear':
        alpha = it / s.warm_up_iters
        return s.warm_up_factor * (1 - alpha) + alpha
    raise ConfigKeyError(
        "Unknown SOLVER.WARM_UP_METHOD: {}; use 'constant' or 'linear'".format(s.warm_up_method)
    )


def lr_func_step(s, cur_iter):
    return s.base_lr * s.gamma ** (cur_iter // s.step_size)


def lr_func_steps_with_decay(s, cur_iter):
    return s.base_lr * s.gamma ** get_step_index(s, cur_iter)


def lr_func_steps_with_lrs(s, cur_iter):
    if len(s.lrs) != len(s.steps):
        raise ConfigValueError(
            'SOLVER.LRS needs one learning rate per SOLVER.STEPS entry ({}), got {}'
            .format(len(s.steps), list(s.lrs))
        )
    return s.lrs[get_step_index(s, cur_iter)]


def lr_func_cosine_decay(s, cur_iter):
    return s.base_lr * 0.5 * (math.cos(math.pi * cur_iter / s.max_iter) + 1)


def lr_func_exp_decay(s, cur_iter):
    # gamma is the ratio of the final to the initial learning rate
    return s.base_lr * math.exp(cur_iter / s.max_iter * math.log(s.gamma))


_POLICIES = {
    'step': lr_func_step,
    'steps_with_decay': lr_func_steps_with_decay,
    'steps_with_lrs': lr_func_steps_with_lrs,
    'cosine_decay': lr_func_cosine_decay,
    'exp_decay': lr_func_exp_decay,
}


def get_step_index(s, cur_iter):
    """Index of the last steps entry <= cur_iter (max_iter closes the last interval)."""
    steps = list(s.steps)
    if not steps or steps[0] != 0 or steps != sorted(steps):
        raise ConfigValueError(
            'SOLVER.STEPS must be ascending iterations starting at 0 for LR_POLICY {}, got {}'
            .format(s.policy, steps)
        )
    # Detectron's search: an iteration past max_iter stays in the last interval
    bounds = steps + [s.max_iter]
    for ind, step in enumerate(bounds):
        if cur_iter < step:
            return ind - 1
    return len(bounds) - 2


def _policy(name):
    if name not in _POLICIES:
        raise UnknownPolicyError(
            'Unknown LR policy: {}; SOLVER.LR_POLICY must be one of {}'
            .format(name, ', '.join(sorted(_POLICIES)))
        )
    return _POLICIES[name]
