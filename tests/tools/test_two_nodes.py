"""Two "nodes" on one host run one train_net job (real processes, gloo, CPU): torchrun with
--nnodes 2 / --node_rank, and two SLURM tasks. The job trains, a rank killed with SIGKILL ends it on
both nodes with a line naming a rank, and the same command on both nodes resumes together."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from detectron.core import launch
from detectron.utils import launcher_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENDED_WITHIN_S = 60.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')


def _train_net(output_dir, max_iter):
    # 1 image per rank and a checkpoint every 2 iterations (int(SNAPSHOT_ITERS 4 / 2 ranks)).
    return ['tools/train_net.py', '--cfg', 'configs/getting_started/shapes_demo_R-18-FPN.yaml', '--skip-test',
            'SOLVER.MAX_ITER', str(max_iter), 'TRAIN.SNAPSHOT_ITERS', '4', 'TRAIN.IMS_PER_BATCH', '1',
            'DATA_LOADER.NUM_THREADS', '0', 'OUTPUT_DIR', str(output_dir)]


def _environment(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in launcher_env.TORCHRUN_VARIABLES and not k.startswith('SLURM_')}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS='1', **extra)
    return env


def _start_nodes(launcher, output_dir, max_iter, logs):
    """Two processes that form one 2-rank job: torchrun agents (one rank each) or SLURM tasks."""
    port = str(launch._free_local_port())
    nodes = []
    for node in (0, 1):
        if launcher == 'torchrun':
            command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2', '--node_rank', str(node),
                       '--nproc_per_node', '1', '--rdzv-endpoint', 'localhost:' + port]
            env = _environment()
        else:
            command = [sys.executable]
            env = _environment(SLURM_PROCID=str(node), SLURM_NTASKS='2', SLURM_LOCALID='0',
                               MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
        log = logs / f'node{node}_{len(list(logs.iterdir()))}.log'
        with open(log, 'w') as out:  # the child keeps its own descriptor
            nodes.append((subprocess.Popen(command + _train_net(output_dir, max_iter), cwd=REPO, env=env,
                                           stdout=out, stderr=subprocess.STDOUT), log))
    return nodes


def _finish(nodes, timeout):
    """Each node's (exit status, output); kills what is still running after timeout seconds."""
    deadline = time.monotonic() + timeout
    results = []
    for process, log in nodes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        results.append((process.returncode, log.read_text()))
    return results


def _rank1_process(launcher, node1):
    """The training process of rank 1: torchrun's worker below its agent, or the SLURM task itself."""
    if launcher != 'torchrun':
        return node1.pid
    with open(f'/proc/{node1.pid}/task/{node1.pid}/children') as f:
        return int(f.read().split()[0])


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize('launcher', ['torchrun', 'SLURM'])
def test_two_nodes_train_end_on_a_killed_rank_and_resume_together(tmp_path, launcher):
    output_dir, logs = tmp_path / 'out', tmp_path / 'logs'
    logs.mkdir()
    train_dir = output_dir / 'train' / 'shapes_train' / 'generalized_rcnn'
    nodes = _start_nodes(launcher, output_dir, 10 ** 4, logs)
    try:
        while not (train_dir / 'model_iter1.pth').exists():
            assert all(process.poll() is None for process, _ in nodes), _finish(nodes, 0)
            time.sleep(0.2)
        os.kill(_rank1_process(launcher, nodes[1][0]), signal.SIGKILL)
        killed = time.monotonic()
    finally:
        (status0, out0), (status1, out1) = _finish(nodes, ENDED_WITHIN_S)
    assert time.monotonic() - killed < ENDED_WITHIN_S
    assert f'Distributed job from {launcher}: world size 2, rank 0, local rank 0, backend gloo' in out0
    assert status0 != 0 and status1 != 0
    assert re.search(r'^error: rank 0 of 2 lost its connection to the other ranks \(.*(reset|closed) by peer.*\): '
                     r'another process of the job or its node stopped', out0, re.MULTILINE), out0[-3000:]
    if launcher == 'torchrun':  # the killed rank's agent names it
        assert re.search(r'rank\s+: 1 \(local_rank: 0\)\s+exitcode\s+: -9', out1), out1[-3000:]
    saved = max(int(name[len('model_iter'):-len('.pth')]) for name in os.listdir(train_dir)
                if name.startswith('model_iter'))

    (status0, out0), (status1, out1) = _finish(_start_nodes(launcher, output_dir, saved + 2, logs), 240)
    assert (status0, status1) == (0, 0), (out0[-3000:], out1[-3000:])
    assert 'Resuming from checkpoint {}'.format(train_dir / f'model_iter{saved}.pth') in out0
    assert re.search(rf'Parameters after iteration {saved + 1} are bitwise equal on all 2 ranks \(sha256 [0-9a-f]{{16}}\)'
                     , out0), out0[-3000:]
    assert (train_dir / 'model_final.pth').exists()
