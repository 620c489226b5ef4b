"""The collectives (utils/comm.py) in jobs launch() starts with real gloo process groups on CPU: ranks,
collectives, DDP, and a single process without a process group."""
import os

import pytest
import torch
import torch.distributed as dist

from detectron.core import launch
from detectron.utils import comm
from detectron.utils.digest import content_digest


# ----------------------------------------------------------------------------------------------
# workers (module level: spawned processes import them by name)


def _collectives_and_ddp(marker):
    return _report_collectives(marker), _ddp_one_sample_per_rank()


def _report_collectives(marker):
    rank = comm.get_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    reduced = comm.reduce_dict({'b': torch.tensor(2.0 * (rank + 1)), 'a': torch.tensor(rank + 1.0)})
    summed = comm.reduce_dict({'a': torch.tensor(rank + 1.0)}, average=False)
    return {
        'identity': comm.all_gather_object(
            (rank, comm.get_world_size(), comm.get_local_rank(), os.environ['RANK'], marker)),
        'sum': total.item(),
        'mean_a': reduced['a'].item(), 'mean_b': reduced['b'].item(), 'sum_a': summed['a'].item(),
        'broadcast': comm.all_gather_object(comm.broadcast_object('from rank {}'.format(rank))),
        'equal': comm.ranks_differing_from_rank0({'w': torch.ones(2), 'b': torch.zeros(1)}),
        # one ulp apart on rank 1 (float32 1 + 1e-7 rounds to 1 + 2 ** -23)
        'one_ulp_apart': comm.ranks_differing_from_rank0({'w': torch.ones(2) + rank * 1e-7}),
    }


class _ToyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.fc = torch.nn.Linear(2 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _toy_data():
    generator = torch.Generator().manual_seed(123)
    return torch.randn(2, 1, 5, 5, generator=generator), torch.randn(2, 3, generator=generator)


def _sgd_steps(model, inputs, targets, steps=5):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()


def _ddp_one_sample_per_rank():
    rank = comm.get_rank()
    torch.manual_seed(rank)  # different init per rank: DDP must broadcast rank 0's parameters
    model = _ToyNet()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    inputs, targets = _toy_data()
    _sgd_steps(ddp, inputs[rank:rank + 1], targets[rank:rank + 1])
    return comm.all_gather_object([p.detach().clone() for p in model.parameters()])


# ----------------------------------------------------------------------------------------------
# tests

@pytest.fixture(scope='module')
def two_gloo_workers():
    """One 2-process gloo job for the tests below (each spawn costs seconds)."""
    return launch.launch(_collectives_and_ddp, 2, args=('hello',), device='cpu')


@pytest.mark.processes
def test_two_gloo_workers_see_ranks_and_collectives(two_gloo_workers):
    result = two_gloo_workers[0]
    assert result['identity'] == [(0, 2, 0, '0', 'hello'), (1, 2, 1, '1', 'hello')]
    assert result['sum'] == 3.0  # 1 + 2
    assert (result['mean_a'], result['mean_b'], result['sum_a']) == (1.5, 3.0, 3.0)
    assert result['broadcast'] == ['from rank 0', 'from rank 0']


def _world_of_one():
    comm.synchronize()  # a no-op: there is no process group
    return (comm.get_world_size(), comm.get_rank(), comm.is_main_process(),
            comm.all_gather_object(7), comm.broadcast_object('x'),
            comm.reduce_dict({'x': torch.tensor(2.5)})['x'].item(), dist.is_initialized(), os.getpid())


@pytest.mark.processes
def test_ranks_differing_from_rank0_compares_bits(two_gloo_workers):
    report = two_gloo_workers[0]
    assert report['equal'] == (content_digest({'w': torch.ones(2), 'b': torch.zeros(1)}), [])
    assert report['one_ulp_apart'] == (content_digest({'w': torch.ones(2)}), [1])


@pytest.mark.processes
def test_single_process_runs_in_process_without_process_group():
    result = launch.launch(_world_of_one, 1, device='cpu')
    assert result == (1, 0, True, [7], 'x', 2.5, False, os.getpid())


@pytest.mark.processes
def test_ddp_two_processes_one_sample_each_equal_one_process_two_samples(two_gloo_workers):
    per_rank = two_gloo_workers[1]
    torch.manual_seed(0)
    reference = _ToyNet()
    inputs, targets = _toy_data()
    _sgd_steps(reference, inputs, targets)  # mean loss over the 2 samples
    for params in per_rank:
        for got, want in zip(params, reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)


def test_unwrap_model_returns_the_inner_module():
    inner = torch.nn.Linear(2, 2)
    assert comm.unwrap_model(torch.nn.DataParallel(inner)) is inner
    assert comm.unwrap_model(inner) is inner
