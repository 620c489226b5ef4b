"""DevicePrefetcher: the training loop's batches moved to the device one step ahead."""
import pytest
import torch

from detectron.core.train_loop import StepOptions, TrainLoop
from detectron.roi_data.prefetch import DevicePrefetcher

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')


class _Source:
    """Batches (k,) for k = 0, 1, ...; records each draw in log and fails if drawn past `limit`."""

    def __init__(self, log, limit):
        self.log, self.limit, self.drawn = log, limit, 0

    def __iter__(self):
        return self

    def __next__(self):
        assert self.drawn < self.limit, 'drawn past the loop\'s last batch'
        self.log.append(('draw', self.drawn))
        self.drawn += 1
        return (torch.tensor(float(self.drawn - 1)),)


def test_batches_come_in_order_each_moved_once_and_never_past_the_count():
    log, moved = [], []
    source = _Source(log, limit=3)

    def to_device(batch):
        moved.append(float(batch[0]))
        return (batch[0] + 10,)

    batches = DevicePrefetcher(source, to_device, torch.device('cpu'), count=3)
    assert float(next(batches)[0]) == 10
    batches.prefetch()
    batches.prefetch()  # one pending batch at most
    assert source.drawn == 2 and moved == [0, 1]
    assert [float(b[0]) for b in batches] == [11, 12]
    batches.prefetch()  # all three drawn: nothing more is read from the source
    with pytest.raises(StopIteration):
        next(batches)
    assert moved == [0, 1, 2] and source.drawn == 3


def test_ready_batches_are_the_sources():
    class Counted(_Source):
        def ready_batches(self):
            return 7 - self.drawn

    batches = DevicePrefetcher(Counted([], 2), lambda b: b, torch.device('cpu'), count=2)
    next(batches)
    assert batches.ready_batches() == 6
    assert DevicePrefetcher(iter([]), lambda b: b, torch.device('cpu'), count=0).ready_batches() == 0


@pytest.mark.parametrize('iter_size', [1, 2])
def test_the_loop_draws_the_next_batch_once_the_step_is_queued(iter_size):
    # Each micro-batch is drawn (and its upload queued) right after the forward and backward before it,
    # within that step (before its hooks), and the last step draws nothing more: 3 iterations take
    # exactly 3 x iter_size batches.
    log = []

    class Hook:
        def after_step(self, loop):
            log.append(('after_step', loop.iter))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x):
            log.append(('forward', int(x)))
            return {'loss': self.w * x}

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = TrainLoop(model, optimizer, _Source(log, limit=3 * iter_size), torch.device('cpu'), 0, 3,
                     StepOptions(iter_size=iter_size), hooks=[Hook()])
    loop.run()
    expected = [('draw', 0)]
    for k in range(3 * iter_size):
        expected.append(('forward', k))
        if k + 1 < 3 * iter_size:
            expected.append(('draw', k + 1))
        if k % iter_size == iter_size - 1:
            expected.append(('after_step', k // iter_size))
    assert log == expected
    # SGD on loss w * x: each step moves w by -0.1 x the mean of its micro-batches.
    steps = torch.arange(3 * iter_size, dtype=torch.float32).view(3, iter_size).mean(dim=1)
    torch.testing.assert_close(model.w.detach(), -0.1 * steps.sum())


def _pinned_batches(values, numel):
    for value in values:
        yield torch.full((numel,), float(value)).pin_memory()


@pytest.mark.cuda
@needs_cuda
def test_the_training_stream_waits_for_the_side_streams_upload():
    # The upload is held back on the side stream: a consumer that did not wait for it would read
    # the batch's memory before it is written.
    device, numel = torch.device('cuda'), 1 << 24

    def slow_upload(batch):
        torch.cuda._sleep(200_000_000)
        return {'images': batch.to(device, non_blocking=True), 'left_on_the_host': [torch.ones(2)]}

    batches = DevicePrefetcher(_pinned_batches([3], numel), slow_upload, device, count=1)
    batch = next(batches)
    total = batch['images'].sum()
    assert total.item() == 3 * numel
    assert batch['left_on_the_host'][0].device.type == 'cpu'


@pytest.mark.cuda
@needs_cuda
def test_a_handed_over_batch_is_not_overwritten_while_the_training_stream_still_reads_it():
    # The batch is freed while the training stream's queued read of it waits; the next upload, on the
    # side stream, must not get its memory before that read ran (record_stream).
    device, numel = torch.device('cuda'), 1 << 24
    batches = DevicePrefetcher(_pinned_batches([1, 2], numel), lambda b: b.to(device, non_blocking=True),
                               device, count=2)
    batch = next(batches)
    torch.cuda._sleep(200_000_000)
    total = batch.sum()
    del batch
    batches.prefetch()
    assert total.item() == numel
    assert next(batches).sum().item() == 2 * numel
