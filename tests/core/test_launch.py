"""launch() with real gloo process groups on CPU: failures, launchers, the job environment."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from detectron.core import launch
from detectron.utils import comm
from detectron.utils.errors import DatasetError, LaunchError
from detectron.utils import launcher_env

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------------------------
# workers (module level: spawned processes import them by name)


def _write_pid(pid_dir):
    with open(os.path.join(pid_dir, 'rank{}.pid'.format(comm.get_rank())), 'w') as f:
        f.write(str(os.getpid()))


def _rank0_raises_while_rank1_waits(pid_dir):
    _write_pid(pid_dir)
    if comm.get_rank() == 0:
        time.sleep(0.5)  # rank 1 is inside the barrier by now
        raise ValueError('boom from the test')
    comm.synchronize()


def _rank1_is_killed_while_rank0_waits(pid_dir):
    _write_pid(pid_dir)
    if comm.get_rank() == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.synchronize()


def _rank1_raises_user_error():
    if comm.get_rank() == 1:
        raise DatasetError("dataset 'my_set' is not registered; register it in every worker")
    comm.synchronize()


@pytest.mark.processes
def test_more_gpus_than_visible_is_a_launch_error_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1')
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'SLURM_NTASKS'):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LaunchError, match=r'NUM_GPUS 4 needs 4 GPUs but only 2 are visible '
                                          r'\(CUDA_VISIBLE_DEVICES=0,1\)'):
        launch.launch(pytest.fail, 4)


@pytest.mark.processes
def test_zero_processes_is_a_launch_error():
    with pytest.raises(LaunchError, match='NUM_GPUS must be at least 1, got 0'):
        launch.launch(pytest.fail, 0, device='cpu')


@pytest.mark.processes
def test_cuda_asked_without_gpus_is_a_launch_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    with pytest.raises(LaunchError, match='NUM_GPUS 1 needs 1 GPU but only 0 are visible'):
        launch.launch(pytest.fail, 1, device='cuda')


def _assert_gone(pid_dir, rank):
    with open(os.path.join(pid_dir, 'rank{}.pid'.format(rank))) as f:
        pid = int(f.read())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.processes
def test_worker_exception_stops_the_job_and_names_rank_and_error(tmp_path):
    start = time.monotonic()
    with pytest.raises(launch.WorkerError) as info:
        launch.launch(_rank0_raises_while_rank1_waits, 2, args=(str(tmp_path),), device='cpu')
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert message.startswith('worker rank 0 of 2 failed with ValueError: boom from the test')
    assert 'raise ValueError' in message  # the worker's traceback travels with it
    _assert_gone(tmp_path, 1)


@pytest.mark.processes
def test_worker_killed_by_sigkill_stops_the_job(tmp_path):
    start = time.monotonic()
    with pytest.raises(launch.WorkerError,
                       match='worker rank 1 of 2 was killed by SIGKILL') as info:
        launch.launch(_rank1_is_killed_while_rank0_waits, 2, args=(str(tmp_path),), device='cpu')
    assert time.monotonic() - start < 60
    assert 'out-of-memory' in str(info.value)
    _assert_gone(tmp_path, 0)


@pytest.mark.processes
def test_user_error_in_a_worker_keeps_its_type_and_one_line_message():
    with pytest.raises(DatasetError) as info:
        launch.launch(_rank1_raises_user_error, 2, device='cpu')
    assert str(info.value) == "rank 1: dataset 'my_set' is not registered; register it in every worker"


def _rank1_loader_worker_dies():
    if comm.get_rank() == 1:
        # What torch's SIGCHLD handler raises at whatever line the rank runs when a worker is killed.
        raise RuntimeError('DataLoader worker (pid 4242) is killed by signal: Killed. ')
    time.sleep(60)


@pytest.mark.processes
def test_a_dead_loader_worker_raised_outside_the_loader_is_one_line():
    from detectron.utils.errors import LoaderWorkerError
    with pytest.raises(LoaderWorkerError) as info:
        launch.launch(_rank1_loader_worker_dies, 2, device='cpu')
    assert str(info.value) == ('rank 1: DataLoader worker (pid 4242) is killed by signal: Killed (the out-of-memory '
                               'killer, see dmesg, or a kill); lower DATA_LOADER.NUM_THREADS if memory is short')


def test_run_tool_reports_a_dead_loader_worker_as_one_error_line(capsys):
    from detectron.utils.errors import run_tool

    def main(argv):
        raise RuntimeError('DataLoader worker (pid 7) exited unexpectedly with exit code 1.')
    with pytest.raises(SystemExit) as info:
        run_tool(main, [])
    assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ['error: DataLoader worker (pid 7) exited unexpectedly with exit code 1 (the out-of-memory killer, '
                   'see dmesg, or a kill); lower DATA_LOADER.NUM_THREADS if memory is short']


def test_run_tool_keeps_other_runtime_errors_as_they_are():
    from detectron.utils.errors import run_tool

    def main(argv):
        raise RuntimeError('CUDA out of memory')
    with pytest.raises(RuntimeError, match='CUDA out of memory'):
        run_tool(main, [])


def test_the_earliest_error_wins_also_from_a_rank_not_yet_exited(tmp_path):
    # Rank 0's loader worker died (its report is written first) while rank 1, which lost the
    # connection to rank 0, happened to exit first: rank 0's one-line error is the job's.
    import pickle
    from types import SimpleNamespace
    first = DatasetError('DataLoader worker (pid 9) is killed by signal: Killed')
    launch._write_report(str(tmp_path), 0, {'time': 10.0, 'error': 'LoaderWorkerError: ...', 'traceback': '',
                                            'user_error': pickle.dumps(first)})
    launch._write_report(str(tmp_path), 1, {'time': 10.4, 'error': 'RuntimeError: Connection closed by peer',
                                            'traceback': 'gloo', 'user_error': None})
    workers = [SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=1)]
    with pytest.raises(DatasetError, match='^rank 0: DataLoader worker'):
        launch._raise_worker_failure([1], workers, str(tmp_path))


# ----------------------------------------------------------------------------------------------
# jobs started by a launcher

LAUNCHED_SCRIPT = textwrap.dedent('''
    import json, sys
    import torch, torch.distributed as dist
    from detectron.core import launch
    from detectron.utils import comm, launcher_env

    def main():
        total = torch.tensor([float(comm.get_rank() + 1)])
        dist.all_reduce(total)
        return {'rank': comm.get_rank(), 'world_size': comm.get_world_size(),
                'local_rank': comm.get_local_rank(), 'sum': total.item(),
                'source': launcher_env.job_from_environment().source}

    if __name__ == '__main__':
        # One write per line: the ranks share stdout, and print() writes the newline separately.
        sys.stdout.write('RESULT ' + json.dumps(launch.launch(main, int(sys.argv[1]), device='cpu')) + '\\n')
        sys.stdout.flush()
''')


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
           and not k.startswith('SLURM_')}
    env.update(PYTHONPATH=REPO_ROOT, OMP_NUM_THREADS='1', **extra)
    return env


def _results(output):
    return sorted((json.loads(line[len('RESULT '):]) for line in output.splitlines()
                   if line.startswith('RESULT ')), key=lambda r: r['rank'])


@pytest.mark.processes
def test_torchrun_job_is_joined_not_respawned(tmp_path):
    script = tmp_path / 'job.py'
    script.write_text(LAUNCHED_SCRIPT)
    done = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                           '--nproc-per-node', '2', str(script), '2'],
                          env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert _results(done.stdout) == [
        {'rank': r, 'world_size': 2, 'local_rank': r, 'sum': 3.0, 'source': 'torchrun'} for r in (0, 1)]


@pytest.mark.processes
def test_one_world_size_launcher_wins_over_a_config_value_and_refuses_a_typed_one(caplog):
    job = launcher_env.JobSpec(0, 2, 0, 'torchrun')
    assert launcher_env.resolve_num_gpus(2, explicit=True, job=job) == 2
    with caplog.at_level('INFO'):
        assert launcher_env.resolve_num_gpus(8, explicit=False, job=job) == 2  # e.g. NUM_GPUS 8 from a YAML
    assert 'NUM_GPUS 8 of the config replaced by the world size 2' in caplog.text
    with pytest.raises(LaunchError, match=r'^NUM_GPUS is 3 but torchrun started 2 processes; give NUM_GPUS 2'):
        launcher_env.resolve_num_gpus(3, explicit=True, job=job)

    monkey_env = {'RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '1'}
    # launch() treats any mismatch as typed: the tools have already reconciled a config file's value.
    with pytest.MonkeyPatch.context() as mp:
        for name, value in monkey_env.items():
            mp.setenv(name, value)
        with pytest.raises(LaunchError, match='NUM_GPUS is 3 but torchrun started 2'):
            launch.launch(print, 3, device='cpu')


@pytest.mark.processes
def test_slurm_tasks_form_one_job(tmp_path):
    script = tmp_path / 'job.py'
    script.write_text(LAUNCHED_SCRIPT)
    port = str(launch._free_local_port())
    tasks = [subprocess.Popen([sys.executable, str(script), '2'], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_clean_env(SLURM_PROCID=str(r), SLURM_NTASKS='2', SLURM_LOCALID=str(r),
                                             MASTER_ADDR='127.0.0.1', MASTER_PORT=port))
             for r in (0, 1)]
    outputs = [task.communicate(timeout=120) for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    assert _results(''.join(out for out, _ in outputs)) == [
        {'rank': r, 'world_size': 2, 'local_rank': r, 'sum': 3.0, 'source': 'SLURM'} for r in (0, 1)]


def test_job_from_environment_rules():
    assert launcher_env.job_from_environment({}) is None
    assert launcher_env.job_from_environment({'SLURM_NTASKS': '1', 'SLURM_PROCID': '0'}) is None
    torchrun = {'RANK': '5', 'WORLD_SIZE': '8', 'LOCAL_RANK': '1', 'MASTER_ADDR': 'h', 'MASTER_PORT': '1'}
    assert launcher_env.job_from_environment(torchrun) == launcher_env.JobSpec(5, 8, 1, 'torchrun')
    slurm = {'SLURM_PROCID': '3', 'SLURM_NTASKS': '4', 'SLURM_LOCALID': '1', 'MASTER_ADDR': 'h',
             'MASTER_PORT': '1'}
    assert launcher_env.job_from_environment(slurm) == launcher_env.JobSpec(3, 4, 1, 'SLURM')
    with pytest.raises(LaunchError, match='torchrun-style distributed job but lacks LOCAL_RANK, MASTER_PORT'):
        launcher_env.job_from_environment({'RANK': '0', 'WORLD_SIZE': '2', 'MASTER_ADDR': 'h'})
    with pytest.raises(LaunchError, match='SLURM distributed job but lacks MASTER_ADDR, MASTER_PORT'):
        launcher_env.job_from_environment({'SLURM_PROCID': '0', 'SLURM_NTASKS': '2', 'SLURM_LOCALID': '0'})
