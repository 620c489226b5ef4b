"""The training loop's step (gradient clipping against hand-computed values, with float16 loss scaling
and ITER_SIZE) and the order its hooks run in."""
import pytest
import torch

from detectron.core import hooks
from detectron.core.train_engine import training_hooks
from detectron.core.train_loop import GradientClipping, StepOptions, TrainLoop
from detectron.checkpoint.checkpointer import Retention
from detectron.utils.lr_policy import LRSchedule

A, B = (3.0, 4.0), (0.6, 0.8)  # the gradients of the two parameter groups for x = 1: norms 5 and 1


class _TwoGroups(torch.nn.Module):
    """loss = x * (A . w1 + B . w2): the gradients are x * A and x * B whatever the weights."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.zeros(2))
        self.w2 = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return {'loss': x * ((torch.tensor(A) * self.w1).sum() + (torch.tensor(B) * self.w2).sum())}


def _step(clipping, xs=(1.0,), amp=False, loss_scale=0.0):
    """One SGD step (LR 1, from zero weights) over the micro-batches xs; returns (-w1, -w2, the logged norm)."""
    model = _TwoGroups()
    optimizer = torch.optim.SGD([{'params': [model.w1]}, {'params': [model.w2]}], lr=1.0)
    step = StepOptions(iter_size=len(xs), amp=amp, amp_dtype='float16', loss_scale=loss_scale, clipping=clipping)
    loop = TrainLoop(model, optimizer, iter((torch.tensor(x),) for x in xs), torch.device('cpu'), 0, 1, step,
                     hooks=[hooks.LRScheduler(lambda it: 1.0)])
    loop.run()
    norm = None if loop.grad_norm is None else float(loop.grad_norm)
    return (-model.w1.detach()).tolist(), (-model.w2.detach()).tolist(), norm


def test_no_clipping_steps_on_the_raw_gradients():
    assert _step(None) == (pytest.approx(list(A)), pytest.approx(list(B)), None)


def test_clipping_by_value_clamps_each_element():
    w1, w2, norm = _step(GradientClipping('value', 1.0))
    assert w1 == [1.0, 1.0] and w2 == pytest.approx([0.6, 0.8])
    assert norm == pytest.approx(5.0)  # the largest group's 2-norm before clipping


def test_clipping_by_norm_scales_each_group_on_its_own():
    # Group 1's norm 5 is scaled to 2 (as torch's clip_grad_norm_: max_norm / (norm + 1e-6)); group 2's 1 stays.
    w1, w2, norm = _step(GradientClipping('norm', 2.0))
    scale = 2.0 / (5.0 + 1e-6)
    assert w1 == pytest.approx([3.0 * scale, 4.0 * scale], rel=1e-6) and w2 == pytest.approx([0.6, 0.8])
    assert norm == pytest.approx(5.0)


def test_clipping_by_the_infinity_norm():
    # NORM_TYPE inf: the largest absolute value, 4 in group 1, scaled to 2.
    w1, w2, norm = _step(GradientClipping('norm', 2.0, float('inf')))
    assert w1 == pytest.approx([1.5, 2.0], rel=1e-6) and w2 == pytest.approx([0.6, 0.8])
    assert norm == pytest.approx(4.0)


def test_clipping_sees_the_gradient_of_the_whole_iteration_with_iter_size_2():
    # Micro-batches x = 1 and 3, each loss / 2: gradients 2A (norm 10) and 2B (norm 2), clipped to norm 2.
    w1, w2, norm = _step(GradientClipping('norm', 2.0), xs=(1.0, 3.0))
    assert w1 == pytest.approx([1.2, 1.6], rel=1e-5) and w2 == pytest.approx([1.2, 1.6], rel=1e-5)
    assert norm == pytest.approx(10.0)


@pytest.mark.parametrize('loss_scale', [1024.0, 0.0])  # static, and dynamic (torch's GradScaler)
def test_clipping_is_on_the_unscaled_gradients_with_float16_loss_scaling(loss_scale):
    w1, w2, norm = _step(GradientClipping('value', 1.0), xs=(1.0, 3.0), amp=True, loss_scale=loss_scale)
    assert w1 == [1.0, 1.0] and w2 == pytest.approx([1.0, 1.0])
    assert norm == pytest.approx(10.0, rel=1e-3)
    w1, _, norm = _step(GradientClipping('norm', 2.0), amp=True, loss_scale=loss_scale)
    assert w1 == pytest.approx([1.2, 1.6], rel=1e-3) and norm == pytest.approx(5.0, rel=1e-3)


class _Recorder:
    def __init__(self, name, log, writes=()):
        self.name, self.log, self.writes = name, log, writes

    def writes_at(self, iteration):
        return iteration in self.writes

    def __getattr__(self, event):
        if event not in ('before_train', 'before_step', 'after_step', 'after_train'):
            raise AttributeError(event)
        return lambda loop: self.log.append((self.name, event, loop.iter))


def test_hooks_run_in_list_order_around_each_step():
    log = []
    model = _TwoGroups()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = TrainLoop(model, optimizer, iter([(torch.tensor(1.0),)] * 2), torch.device('cpu'), 0, 2,
                     hooks=[hooks.LRScheduler(lambda it: 0.1), _Recorder('a', log, writes=(1,)), _Recorder('b', log)])
    loop.run()
    assert log == [('a', 'before_train', -1), ('b', 'before_train', -1),
                   ('a', 'before_step', 0), ('b', 'before_step', 0), ('a', 'after_step', 0), ('b', 'after_step', 0),
                   ('a', 'before_step', 1), ('b', 'before_step', 1), ('a', 'after_step', 1), ('b', 'after_step', 1),
                   ('a', 'after_train', 1), ('b', 'after_train', 1)]
    assert [loop.writes_at(it) for it in (0, 1)] == [False, True]


def test_the_engines_hook_order(monkeypatch, tmp_path):
    # LR first; after a step the non-finite check before anything that writes; evaluations and the best
    # checkpoint before the checkpoint of their iteration; the curves last.
    from detectron.core import train_engine
    from detectron.core.config import cfg
    cfg.TEST.EVAL_PERIOD, cfg.TEST.VAL_LOSS_PERIOD = 4, 2
    monkeypatch.setattr(train_engine, 'checkpoint_retention', lambda model_type, schedule: Retention())

    class _Type:
        def best_metric(self):
            return 'bbox/AP', 'max'

    schedule = LRSchedule(policy='steps_with_decay', base_lr=0.1, max_iter=8, steps=(0,))
    names = [type(hook).__name__ for hook in training_hooks(_Type(), schedule, str(tmp_path))]
    assert names == ['LRScheduler', 'NonFiniteCheck', 'Metrics', 'Evaluation', 'Evaluation', 'BestCheckpoint',
                     'Checkpointer', 'TrainingCurves']
    cfg.TEST.EVAL_PERIOD, cfg.TEST.VAL_LOSS_PERIOD = 0, 0
    names = [type(hook).__name__ for hook in training_hooks(_Type(), schedule, str(tmp_path))]
    assert names == ['LRScheduler', 'NonFiniteCheck', 'Metrics', 'Checkpointer', 'TrainingCurves']
