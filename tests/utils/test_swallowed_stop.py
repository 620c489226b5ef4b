"""A SIGTERM / SIGINT whose JobInterrupted is swallowed by code that catches everything (copyreg's
`except: pass`, which pickling runs on every save of some types) still stops the run at the next
safe point: after the file being written is complete, after the training iteration, after the
tested batch."""
import os
import signal

import pytest
import torch

from detectron.checkpoint import torch_file
from detectron.core import hooks
from detectron.core.train_loop import StepOptions, TrainLoop
from detectron.utils import errors
from detectron.utils.errors import JobInterrupted


def _signal_swallowed(sig):
    """Deliver sig to this process inside a bare `except: pass`, as copyreg._slotnames does."""
    try:
        os.kill(os.getpid(), sig)
        for _ in range(100):  # Python runs the handler between bytecodes, here
            pass
        raise AssertionError('the handler did not run')
    except:  # noqa: E722 - the swallowing this module is about
        pass


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_a_swallowed_stop_during_a_checkpoint_write_ends_after_the_complete_file(tmp_path, monkeypatch, sig):
    digest = torch_file.content_digest

    def digest_while_stopped(content):
        _signal_swallowed(sig)
        return digest(content)
    monkeypatch.setattr(torch_file, 'content_digest', digest_while_stopped)
    path = tmp_path / 'model_final.pth'
    with errors.termination_signals_raise():
        with pytest.raises(JobInterrupted) as info:
            torch_file.write_torch_file({'iteration': 7, 'w': torch.arange(5.0)}, str(path))
    monkeypatch.undo()  # reading the file back computes its digest too
    assert info.value.exit_status == 128 + sig
    assert os.listdir(tmp_path) == ['model_final.pth']  # renamed into place, no temporary file left
    assert torch_file.read_torch_file(str(path))['iteration'] == 7  # complete: its digest matches


class _SwallowsAStop:
    def __init__(self, at_iter):
        self.at_iter, self.steps = at_iter, []

    def after_step(self, loop):
        self.steps.append(loop.iter)
        if loop.iter == self.at_iter:
            _signal_swallowed(signal.SIGTERM)


class _Linear(torch.nn.Linear):
    def forward(self, x):
        return {'loss': super().forward(x).sum()}


def test_a_swallowed_stop_ends_training_after_that_iteration():
    model = _Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = StepOptions(iter_size=1, amp=False, amp_dtype='float16', loss_scale=0.0, clipping=None)
    batches = iter([(torch.ones(1),)] * 10)
    swallower = _SwallowsAStop(at_iter=3)
    loop = TrainLoop(model, optimizer, batches, torch.device('cpu'), 0, 10, step,
                     hooks=[hooks.LRScheduler(lambda it: 0.1), swallower])
    with errors.termination_signals_raise():
        with pytest.raises(JobInterrupted):
            loop.run()
    assert swallower.steps == [0, 1, 2, 3]


def test_no_stop_is_remembered_outside_the_block_or_after_it():
    errors.raise_if_stopped()
    with pytest.raises(JobInterrupted):
        with errors.termination_signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                pass
    errors.raise_if_stopped()  # the block is over: the next run starts afresh
    with errors.termination_signals_raise():
        errors.raise_if_stopped()
