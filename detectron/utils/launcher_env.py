"""The job a launcher (torchrun, SLURM's srun) described in the environment: this process's rank,
the world size, and the NUM_GPUS that agrees with them. Plain Python (no torch), so that a tool
settles its command line and config before the seconds-long import of the model code."""
import logging
import os
from dataclasses import dataclass

from detectron.utils.errors import LaunchError

logger = logging.getLogger(__name__)

TORCHRUN_VARIABLES = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
SLURM_VARIABLES = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'MASTER_ADDR', 'MASTER_PORT')


@dataclass(frozen=True)
class JobSpec:
    """Where this process sits in the job."""
    rank: int
    world_size: int
    local_rank: int
    source: str  # who started the process: 'torchrun', 'SLURM', 'launch' or 'single process'


def job_from_environment(environ=None):
    """The JobSpec a launcher put in the environment (torchrun, then SLURM), or None.

    SLURM counts only with more than one task: a single-task allocation may still spawn NUM_GPUS
    workers itself.
    """
    environ = os.environ if environ is None else environ
    if any(name in environ for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')):
        _require_variables(environ, TORCHRUN_VARIABLES, 'torchrun-style')
        return _job_spec(environ, ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'), 'torchrun')
    if _integer_variable(environ, 'SLURM_NTASKS', default='1') > 1:
        _require_variables(environ, SLURM_VARIABLES, 'SLURM')
        return _job_spec(environ, ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID'), 'SLURM')
    return None


def resolve_num_gpus(num_gpus, explicit, job=None):
    """The one world size of the job: a launcher's (torchrun/SLURM) when it started the processes,
    else num_gpus. A launcher's world size that differs from a NUM_GPUS the user typed on the
    command line (explicit) is a LaunchError; one from a config file or the default gives way, with
    a log line, so that a config written for 8 GPUs runs under `torchrun --nproc-per-node 4`."""
    job = job or job_from_environment()
    if job is None or job.world_size == num_gpus:
        return num_gpus
    if explicit:
        raise LaunchError('NUM_GPUS is {} but {} started {} processes; give NUM_GPUS {} or start {} processes'
                          .format(num_gpus, job.source, job.world_size, job.world_size, num_gpus))
    logger.info('NUM_GPUS %d of the config replaced by the world size %d of the job %s started',
                num_gpus, job.world_size, job.source)
    return job.world_size


def launched_rank():
    """The rank a launcher (torchrun, SLURM) gave this process, before any process group exists; 0
    for a tool started by itself (it runs rank 0 or starts the workers)."""
    job = job_from_environment()
    return job.rank if job is not None else 0


def _job_spec(environ, names, source):
    rank, world_size, local_rank = (_integer_variable(environ, name) for name in names)
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise LaunchError('the environment describes a {} job with {}={}, {}={}, {}={}: a rank needs '
                          '0 <= rank < world size and a local rank >= 0; fix or unset them'.format(
                              source, names[0], rank, names[1], world_size, names[2], local_rank))
    return JobSpec(rank, world_size, local_rank, source)


def _integer_variable(environ, name, default=None):
    value = environ.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise LaunchError('environment variable {}={!r} is not an integer; a distributed launcher sets it to '
                          'a number: fix or unset it (docs/MULTI_GPU.md)'.format(name, value)) from None


def _require_variables(environ, names, kind):
    missing = [name for name in names if name not in environ]
    if missing:
        raise LaunchError('the environment describes a {} distributed job but lacks {}; set them '
                          '(docs/MULTI_GPU.md) or unset the others to let NUM_GPUS start local workers'
                          .format(kind, ', '.join(missing)))
