"""DIST_BACKEND gloo on CUDA: more ranks than GPUs, mapped round-robin (CUDA mocked; no process group);
and the one line of a rank that lost its peers."""
import logging

import pytest
import torch

from detectron.core import launch
from detectron.core.config_finalize import finalize_cfg
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, LaunchError
from detectron.utils import launcher_env

SHAPES = 'configs/getting_started/shapes_demo_R-18-FPN.yaml'


@pytest.fixture
def two_mocked_gpus(monkeypatch):
    """CUDA with two visible GPUs; set_device records its argument; launch's state and the root logger's
    level are restored after."""
    chosen = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'set_device', chosen.append)
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'SLURM_NTASKS'):
        monkeypatch.delenv(name, raising=False)
    # No process group: the mapping and the log line come before any collective.
    monkeypatch.setattr(launch, '_init_process_group', lambda job, options: None)
    for key, value in comm._state.items():
        monkeypatch.setitem(comm._state, key, value)
    root = logging.getLogger()
    level = root.level
    yield chosen
    root.setLevel(level)  # ranks other than 0 lower it to WARNING


def _torchrun_rank(monkeypatch, rank, local_rank, world_size):
    environ = {'RANK': rank, 'WORLD_SIZE': world_size, 'LOCAL_RANK': local_rank, 'MASTER_ADDR': '127.0.0.1',
               'MASTER_PORT': 1}
    for name, value in environ.items():
        monkeypatch.setenv(name, str(value))


def test_gpu_index_is_round_robin_only_when_ranks_share_gpus():
    assert [launch.gpu_index(r, True, 3) for r in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [launch.gpu_index(r, False, 3) for r in range(3)] == [0, 1, 2]


@pytest.mark.processes
@pytest.mark.parametrize('local_rank, gpu', [(0, 0), (1, 1), (2, 0), (5, 1)])
def test_gloo_on_cuda_maps_a_torchrun_rank_onto_the_visible_gpus(two_mocked_gpus, monkeypatch, local_rank, gpu):
    _torchrun_rank(monkeypatch, rank=local_rank + 6, local_rank=local_rank, world_size=12)
    device = launch.launch(comm.get_device, 12, backend='gloo')
    assert device == torch.device('cuda', gpu) and two_mocked_gpus == [gpu]


@pytest.mark.processes
def test_the_check_mode_is_said_once_by_rank_0(two_mocked_gpus, monkeypatch, caplog):
    _torchrun_rank(monkeypatch, rank=0, local_rank=0, world_size=5)
    with caplog.at_level(logging.INFO):
        launch.launch(comm.get_device, 5, backend='gloo')
    said = [r.getMessage() for r in caplog.records if 'Check mode' in r.getMessage()]
    assert said == [('Check mode (DIST_BACKEND gloo on CUDA): 5 ranks on 2 visible GPUs, local rank r on GPU r % 2, '
                     'gradients all-reduced through host memory; it runs the multi-GPU code paths and measures '
                     'no scaling')]
    caplog.clear()
    _torchrun_rank(monkeypatch, rank=3, local_rank=3, world_size=5)
    with caplog.at_level(logging.INFO):
        launch.launch(comm.get_device, 5, backend='gloo')
    assert 'Check mode' not in caplog.text


@pytest.mark.processes
@pytest.mark.parametrize('backend', [None, '', 'nccl'])
def test_nccl_with_more_ranks_than_gpus_stays_the_one_error(two_mocked_gpus, monkeypatch, backend):
    with pytest.raises(LaunchError, match=r'^NUM_GPUS 3 needs 3 GPUs but only 2 are visible; ask for at most 2 '
                                          r'or free/expose more GPUs \(DIST_BACKEND gloo runs more ranks'):
        launch.launch(pytest.fail, 3, backend=backend)
    _torchrun_rank(monkeypatch, rank=2, local_rank=2, world_size=3)
    with pytest.raises(LaunchError, match=r'^LOCAL_RANK 2 \(from torchrun\) needs 3 GPUs but only 2 are visible'):
        launch.launch(pytest.fail, 3, backend=backend)
    assert two_mocked_gpus == []  # refused before any device was bound


@pytest.mark.processes
def test_gloo_on_cpu_is_no_check_mode(monkeypatch, caplog):
    for key, value in comm._state.items():
        monkeypatch.setitem(comm._state, key, value)
    with caplog.at_level(logging.INFO):
        assert launch.launch(comm.get_device, 1, backend='gloo', device='cpu') == torch.device('cpu')
    assert 'Check mode' not in caplog.text


def test_an_unknown_dist_backend_is_one_line():
    with pytest.raises(ConfigValueError, match=r"^DIST_BACKEND must be one of '', 'nccl', 'gloo', got 'mpi'$"):
        finalize_cfg(SHAPES, ['DIST_BACKEND', 'mpi'])


@pytest.mark.processes
def test_num_gpus_spawns_ranks_that_map_round_robin(two_mocked_gpus, monkeypatch):
    spawned = {}
    monkeypatch.setattr(launch, '_spawn_and_watch',
                        lambda main_fn, args, num_processes, options, port: spawned.update(options=options, n=num_processes))
    launch.launch(pytest.fail, 3, backend='gloo')  # 3 ranks on 2 GPUs: no error
    assert spawned['n'] == 3 and spawned['options'].share_gpus
    # What each spawned rank then runs (launch._spawned_worker), rank by rank:
    devices = [launch._run_worker(comm.get_device, (), launcher_env.JobSpec(r, 3, r, 'launch'),
                                  spawned['options']) for r in range(3)]
    assert devices == [torch.device('cuda', i) for i in (0, 1, 0)] and two_mocked_gpus == [0, 1, 0]


def _raises(error):
    def main():
        raise error
    return main


def test_a_lost_peer_is_one_line_naming_this_rank(monkeypatch):
    monkeypatch.setattr(launch, '_init_process_group', lambda job, options: None)
    for key, value in comm._state.items():
        monkeypatch.setitem(comm._state, key, value)
    monkeypatch.setattr(logging.getLogger(), 'level', logging.getLogger().level)
    options = launch._LaunchOptions('gloo', 'env://', launch.DEFAULT_TIMEOUT, 'cpu', None, False)
    gloo = RuntimeError('[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:14561: '
                        'Connection reset by peer. This is typically caused by a remote worker hanging.')
    with pytest.raises(launch.PeerLostError) as info:
        launch._run_worker(_raises(gloo), (), launcher_env.JobSpec(3, 4, 1, 'torchrun'), options)
    assert str(info.value) == (
        'rank 3 of 4 lost its connection to the other ranks (Read error [127.0.0.1]:14561: Connection reset by peer): '
        "another process of the job or its node stopped, and its own output (or its launcher's summary) names it; "
        'started again, training resumes from its last checkpoint')
    other = RuntimeError('CUDA error: an illegal memory access was encountered')
    with pytest.raises(RuntimeError) as info:
        launch._run_worker(_raises(other), (), launcher_env.JobSpec(3, 4, 1, 'torchrun'), options)
    assert info.value is other
    with pytest.raises(RuntimeError) as info:  # one process has no peers to lose
        launch._run_worker(_raises(gloo), (), launcher_env.JobSpec(0, 1, 0, 'single process'), options)
    assert info.value is gloo
