"""One process per GPU: start the workers and join them into a torch.distributed job (the collectives
that code inside the job uses are utils/comm.py).

A job starts in one of three ways (docs/MULTI_GPU.md has the commands):
- a launcher (torchrun, or SLURM's srun) already started one process per GPU and put the rank and
  world size in the environment: `launch` joins that job in the calling process;
- `NUM_GPUS N` (N > 1) and no launcher: `launch` spawns N local workers and watches them, so that one
  worker dying stops the others at once and the caller gets that worker's error;
- `NUM_GPUS 1`: `main_fn` runs in the calling process, without a process group.
The collectives of utils/comm.py also work in the last case (world size 1, no process group).

Backend gloo on CUDA is a check mode: ranks may then outnumber the visible GPUs and share them
round-robin (local rank r on GPU r % count), as NCCL refuses two ranks on one GPU. It runs every
multi-GPU code path on any machine and measures no scaling.

No process of a job outlives its launcher: spawned workers, ranks that torchrun's agent started
(`die_with_torchrun_agent`) and, through `die_with_parent` in their worker_init_fn, DataLoader workers
ask Linux to kill them when their parent dies, whatever the signal that ended it; a SIGTERM or SIGINT
to the launcher stops its workers and raises errors.JobInterrupted.

Nothing here reads the config; the engines pass plain values.
"""
import atexit
import datetime
import logging
import multiprocessing.connection
import os
import pickle
import random
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing

from detectron.utils import comm
from detectron.utils.errors import (DetectronError, JobInterrupted, LaunchError, as_loader_worker_error,
                                    termination_signals_raise)
from detectron.utils.launcher_env import JobSpec, job_from_environment, resolve_num_gpus
from detectron.utils.lifetime import die_with_parent, die_with_torchrun_agent
from detectron.utils.logging import setup_logging

logger = logging.getLogger(__name__)

# Bounds a collective that waits for a rank that never arrives (e.g. a dead node in a multi-node job).
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
# After one spawned worker fails, the others get this long to exit on SIGTERM before SIGKILL.
TERMINATE_GRACE_S = 10.0


class WorkerError(RuntimeError):
    """A worker of a launched job failed; the message names its rank and carries its traceback."""


class WorkerKilled(DetectronError, WorkerError):
    """A worker was killed by a signal (the OOM killer, a user's kill): one line, there is no traceback."""


class PeerLostError(DetectronError, RuntimeError):
    """This rank lost its connection to the job's other ranks: one of them (or its node) stopped."""


# How gloo and the rendezvous store report a peer whose process is gone.
_LOST_PEER_MESSAGES = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe',
                       'Connection refused')


@dataclass(frozen=True)
class _LaunchOptions:
    backend: str
    init_method: str
    timeout: datetime.timedelta
    device_type: str
    seed: object  # int or None
    share_gpus: bool  # gloo on CUDA: ranks map round-robin onto the visible GPUs


# ----------------------------------------------------------------------------------------------
# launch

def launch(main_fn, num_processes, args=(), backend=None, dist_url=None, timeout=DEFAULT_TIMEOUT,
           device=None, seed=None):
    """Run main_fn(*args) in every process of the job and return its result on rank 0.

    num_processes: NUM_GPUS, the processes wanted when no launcher started the job.
    backend: 'nccl', 'gloo', or None/'' for the default: 'nccl' on CUDA, 'gloo' on CPU. 'gloo' on
      CUDA is the check mode of the module docstring.
    dist_url: rendezvous address; default env:// (the launcher's MASTER_ADDR/PORT, or a free port
      on 127.0.0.1 for spawned workers).
    device: 'cuda', 'cpu' or None (CUDA when available).
    seed: if given, every worker seeds python, numpy and torch with seed + rank before main_fn.
    Under torchrun/SLURM each process returns its own result. Spawned workers need main_fn and args
    picklable (a module-level function) and send back rank 0's result by pickle.
    """
    if num_processes < 1:
        raise LaunchError('NUM_GPUS must be at least 1, got {}'.format(num_processes))
    device_type = _resolve_device_type(device)
    backend = backend or ('nccl' if device_type == 'cuda' else 'gloo')
    if backend == 'nccl' and device_type != 'cuda':
        raise LaunchError("backend 'nccl' needs CUDA GPUs but the device is {!r}; use backend "
                          "'gloo' for CPU runs".format(device_type))
    with termination_signals_raise():
        return _launch(main_fn, num_processes, args, backend, dist_url, timeout, device_type, seed)


def _launch(main_fn, num_processes, args, backend, dist_url, timeout, device_type, seed):
    share_gpus = backend == 'gloo' and device_type == 'cuda'
    job = job_from_environment()
    if job is not None:
        # A rank that torchrun's agent started dies with the agent, even a SIGKILLed one.
        die_with_torchrun_agent()
        resolve_num_gpus(num_processes, explicit=True, job=job)
        _check_visible_gpus(device_type, 1 if share_gpus else job.local_rank + 1,
                            'LOCAL_RANK {} (from {})'.format(job.local_rank, job.source))
        options = _LaunchOptions(backend, dist_url or 'env://', timeout, device_type, seed, share_gpus)
        return _run_worker(main_fn, args, job, options)
    _check_visible_gpus(device_type, 1 if share_gpus else num_processes, 'NUM_GPUS {}'.format(num_processes))
    if num_processes == 1:
        options = _LaunchOptions(backend, None, timeout, device_type, seed, share_gpus)
        return _run_worker(main_fn, args, JobSpec(0, 1, 0, 'single process'), options)
    if device_type == 'cpu':
        _check_cpu_cores(num_processes)
    port = _free_local_port()
    options = _LaunchOptions(backend, dist_url or 'env://', timeout, device_type, seed, share_gpus)
    return _spawn_and_watch(main_fn, args, num_processes, options, port)


def _resolve_device_type(device):
    if device is None:
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if device not in ('cuda', 'cpu'):
        raise LaunchError("device must be 'cuda' or 'cpu', got {!r}".format(device))
    return device


def _check_visible_gpus(device_type, needed, asked_by):
    # Checked before any process starts, so the user never sees "invalid device ordinal".
    if device_type != 'cuda':
        return
    count = torch.cuda.device_count()  # honours CUDA_VISIBLE_DEVICES
    if needed <= count:
        return
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    where = ' (CUDA_VISIBLE_DEVICES={})'.format(visible) if visible is not None else ''
    raise LaunchError('{} needs {} GPU{} but only {} {} visible{}; ask for at most {} or free/expose '
                      'more GPUs (DIST_BACKEND gloo runs more ranks than GPUs, to check a multi-GPU job)'
                      .format(asked_by, needed, 's' if needed > 1 else '', count,
                              'is' if count == 1 else 'are', where, count))


def gpu_index(local_rank, share_gpus, num_visible):
    """The visible GPU a local rank uses: its own, or round-robin when ranks share GPUs (check mode)."""
    return local_rank % num_visible if share_gpus else local_rank


def _check_cpu_cores(num_processes):
    """CPU processes share the cores, as GPU processes need their GPUs: more processes than cores only
    slow the job down and fill the memory (each holds a model and its loader workers)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    if num_processes > cores:
        raise LaunchError('NUM_GPUS {} without GPUs starts {} CPU processes but this machine gives {} CPU core{}; '
                          'ask for at most NUM_GPUS {}, or run on GPUs'.format(
                              num_processes, num_processes, cores, 's' if cores > 1 else '', cores))


def _free_local_port():
    # The port is free now; another program could take it before the workers bind it (rare).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# one worker

def _run_worker(main_fn, args, job, options):
    """Bind the device, join the process group, seed, log, then run main_fn."""
    _bind_device(options, job.local_rank)
    _configure_worker_logging()
    # Under torchrun one process may launch twice (train, then test): the group of the first stays.
    if job.source != 'single process' and not comm.in_process_group():
        _init_process_group(job, options)
    _log_identity(job, options)
    if job.rank != 0:  # the other ranks would repeat rank 0's messages
        logging.getLogger().setLevel(logging.WARNING)
    if options.seed is not None:
        seed_all_rngs(options.seed + job.rank)
    try:
        return main_fn(*args)
    except RuntimeError as err:
        if job.world_size > 1 and not isinstance(err, DetectronError) and _is_lost_peer(err):
            raise PeerLostError(
                f'rank {job.rank} of {job.world_size} lost its connection to the other ranks ({_first_line(err)}): '
                "another process of the job or its node stopped, and its own output (or its launcher's summary) "
                'names it; started again, training resumes from its last checkpoint') from err
        raise


def _is_lost_peer(err):
    return isinstance(err, dist.DistNetworkError) or any(m in str(err) for m in _LOST_PEER_MESSAGES)


def _first_line(err):
    # gloo's messages start with its source location in brackets and go on after the first sentence.
    line = str(err).strip().splitlines()[0]
    line = line.split('] ', 1)[1] if line.startswith('[') and '] ' in line else line
    return line.split('. ', 1)[0]


def _bind_device(options, local_rank):
    comm._state['local_rank'] = local_rank
    if options.device_type == 'cuda':
        index = gpu_index(local_rank, options.share_gpus, torch.cuda.device_count())
        # Before any CUDA work, or every rank would create a context (and buffers) on GPU 0.
        torch.cuda.set_device(index)
        comm._state['device'] = torch.device('cuda', index)
    else:
        comm._state['device'] = torch.device('cpu')


def _configure_worker_logging():
    # A freshly spawned worker has no handlers; a tool's own process (in-process and torchrun runs)
    # keeps its set-up. Every rank starts at INFO so that its identity line shows.
    if not logging.getLogger().handlers:
        setup_logging(__name__)


def _init_process_group(job, options):
    dist.init_process_group(backend=options.backend, init_method=options.init_method, rank=job.rank,
                            world_size=job.world_size, timeout=options.timeout)
    if options.backend != 'gloo':
        # Python objects (e.g. detections) travel through host memory, not GPU buffers.
        comm._state['object_group'] = dist.new_group(backend='gloo', timeout=options.timeout)
    atexit.register(_destroy_process_group)
    # A first collective: NCCL/network problems show up now, not in the middle of iteration 0.
    comm.synchronize()


def _destroy_process_group():
    if comm.in_process_group():
        dist.destroy_process_group()
    comm._state['object_group'] = None


def _log_identity(job, options):
    if job.source == 'single process':
        logger.info('Single process (world size 1, no process group), device %s', comm.get_device())
        return
    logger.info('Distributed job from %s: world size %d, rank %d, local rank %d, backend %s, device %s',
                job.source, job.world_size, job.rank, job.local_rank, options.backend, comm.get_device())
    if options.share_gpus and job.rank == 0:
        logger.warning(_check_mode_message(job.world_size, torch.cuda.device_count()))


def _check_mode_message(world_size, num_visible):
    return ('Check mode (DIST_BACKEND gloo on CUDA): {} ranks on {} visible GPU{}, local rank r on GPU r % {}, '
            'gradients all-reduced through host memory; it runs the multi-GPU code paths and measures no '
            'scaling'.format(world_size, num_visible, 's' if num_visible > 1 else '', num_visible))


def seed_all_rngs(seed):
    """Seed python's, numpy's and torch's (CPU and every CUDA device) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# spawned workers and their watcher

def _spawn_and_watch(main_fn, args, num_processes, options, port):
    logger.info('Starting %d worker processes on 127.0.0.1:%d (backend %s, device %s)', num_processes, port,
                options.backend, options.device_type)
    context = torch.multiprocessing.get_context('spawn')
    with tempfile.TemporaryDirectory(prefix='detectron_launch_') as report_dir:
        workers = [context.Process(target=_spawned_worker, name='rank{}'.format(rank),
                                   args=(rank, num_processes, port, main_fn, args, options, report_dir))
                   for rank in range(num_processes)]
        for worker in workers:
            worker.start()
        try:
            failed = _wait_for_first_failures(workers)
        finally:
            _stop(workers)
        if failed:
            _raise_worker_failure(failed, workers, report_dir)
        return _read_report(report_dir, 0)['result']


def _spawned_worker(rank, world_size, port, main_fn, args, options, report_dir):
    die_with_parent()  # a killed launcher (even by SIGKILL) takes its workers with it
    # multiprocessing's spawn bootstrap made 'spawn' this process's default start method; restore the
    # platform's, so that DataLoader workers start as under torchrun (forked: fast, and without named
    # semaphores that a killed rank would leave to the resource tracker, which then warns about them).
    multiprocessing.set_start_method(None, force=True)
    # The same variables torchrun sets, so env:// and anything reading them sees a normal job.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    if options.device_type == 'cpu' and 'OMP_NUM_THREADS' not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # workers share the cores
    try:
        result = _run_worker(main_fn, args, JobSpec(rank, world_size, rank, 'launch'), options)
        _write_report(report_dir, rank, {'result': result if rank == 0 else None})
    except BaseException as err:  # Ctrl-C and SystemExit end this rank too: report them
        try:
            report = _failure_report(err)
        except BaseException as later:  # e.g. torch's SIGCHLD handler raising while the first is formatted
            report = _failure_report(later)
        _write_report(report_dir, rank, report)
        _exit_now(1)
    # The work is done and reported: skip interpreter teardown, where a process group or loader
    # thread of a finished rank can still fail and turn a completed job into a failed one.
    _exit_now(0)


def _failure_report(err):
    err = as_loader_worker_error(err) or err
    report = {'time': time.time(), 'error': '{}: {}'.format(type(err).__name__, err),
              'traceback': traceback.format_exc(), 'user_error': None}
    if isinstance(err, DetectronError):
        try:
            report['user_error'] = pickle.dumps(err)
        except (pickle.PicklingError, TypeError, AttributeError):
            pass
    return report


def _exit_now(code):
    # os._exit: a stuck non-daemon thread (e.g. a data-loader feeder) must not keep a failed rank alive.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _write_report(report_dir, rank, report):
    path = os.path.join(report_dir, 'rank{}.pkl'.format(rank))
    with open(path + '.tmp', 'wb') as f:
        pickle.dump(report, f)
    os.replace(path + '.tmp', path)


def _read_report(report_dir, rank):
    path = os.path.join(report_dir, 'rank{}.pkl'.format(rank))
    if not os.path.exists(path):
        return None
    with open(path, 'rb') as f:
        return pickle.load(f)


def _wait_for_first_failures(workers):
    """Block until every worker exits cleanly (-> []) or some exit non-zero (-> their ranks)."""
    running = {worker.sentinel: rank for rank, worker in enumerate(workers)}
    while running:
        ready = multiprocessing.connection.wait(list(running))
        exited = sorted(running.pop(sentinel) for sentinel in ready)
        for rank in exited:
            workers[rank].join()
        failed = [rank for rank in exited if workers[rank].exitcode != 0]
        if failed:
            return failed
    return []


def _stop(workers):
    alive = [worker for worker in workers if worker.is_alive()]
    for worker in alive:
        worker.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for worker in alive:
        worker.join(max(0.0, deadline - time.monotonic()))
    for worker in alive:
        if worker.is_alive():
            worker.kill()
            worker.join()


def _raise_worker_failure(failed, workers, report_dir):
    """Raise the error of the worker that failed first (the others usually failed because of it)."""
    reports = {rank: _read_report(report_dir, rank) for rank in range(len(workers))}
    # A worker killed by a signal leaves no report and is the cause (the OOM killer, a user's kill);
    # among Python errors the earliest is the cause, later ones are peers losing their connection.
    # The earliest may belong to a rank still shutting down when a peer's exit was seen first (its
    # loader worker died; the peer lost the connection to it), so every rank's report counts.
    killed = [rank for rank in failed if reports[rank] is None or 'error' not in reports[rank]]
    errors = [rank for rank, report in reports.items() if report is not None and 'error' in report]
    rank = killed[0] if killed else min(errors, key=lambda r: reports[r]['time'])
    report, exitcode, world_size = reports[rank], workers[rank].exitcode, len(workers)
    if report is None or 'error' not in report:
        raise WorkerKilled(_describe_exit(rank, world_size, exitcode))
    if report['user_error'] is not None:
        user_error = pickle.loads(report['user_error'])
        if isinstance(user_error, JobInterrupted):  # a stopped job: the same line and exit status as here
            raise user_error
        raise type(user_error)('rank {}: {}'.format(rank, user_error))
    raise WorkerError('worker rank {} of {} failed with {}\n\nTraceback of rank {}:\n{}'.format(
        rank, world_size, report['error'], rank, report['traceback']))


def _describe_exit(rank, world_size, exitcode):
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = ' (often the out-of-memory killer; see dmesg)' if name == 'SIGKILL' else ''
        return 'worker rank {} of {} was killed by {}{}'.format(rank, world_size, name, hint)
    return 'worker rank {} of {} exited with code {} without a Python error'.format(
        rank, world_size, exitcode)
