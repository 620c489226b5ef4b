"""One training run per output directory: an OS lock held for the run's lifetime.

Two runs writing one OUTPUT_DIR overwrite each other's checkpoints without a word (e.g. a scheduler
that restarts a preempted job while the old one still runs). `RunLock(directory)` takes an exclusive
flock on `<directory>/run.lock`, a file kept open while the run lives, so liveness is the kernel's
business: the lock goes away with the last process holding it, however it ended. The file holds the
holder's PID, host and start time for the message that refuses a second run. A lock file whose holder
is gone (a killed run) is taken over with a warning; a clean release removes it.

flock works on local filesystems and on NFS (Linux emulates it with NFS byte-range locks); on a
filesystem without locking the lock cannot be taken and the run is refused with the reason.
"""
import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import sys

from detectron.utils.errors import OutputDirError
from detectron.utils.io import remove_stale_temporary_files
from detectron.utils.launcher_env import job_from_environment

logger = logging.getLogger(__name__)

LOCK_NAME = 'run.lock'


class RunLock:
    """Context manager holding the run lock of `directory` (see the module doc)."""

    def __init__(self, directory):
        self.path = os.path.join(os.path.abspath(directory), LOCK_NAME)
        self._fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc_info):
        self.release()

    def acquire(self):
        """Take the lock, or raise OutputDirError naming the live run that holds it."""
        if self._fd is not None:
            return
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read_holder(fd))
                os.close(fd)
                raise OutputDirError(
                    '{} is in use by another training run ({}); wait for it to end or stop it, or set another '
                    'OUTPUT_DIR'.format(os.path.dirname(self.path), holder)) from None
            except OSError as err:
                os.close(fd)
                raise OutputDirError('cannot lock {} ({}); use an OUTPUT_DIR on a filesystem with file locks'
                                     .format(self.path, err.strerror or err)) from err
            if _same_file(fd, self.path):
                self._fd = fd
            else:  # its holder released (and removed) it between our open and flock: start again
                os.close(fd)
        previous = _read_holder(self._fd)
        if previous:
            logger.warning('Taking over the run lock %s of a run that is no longer running (%s)', self.path,
                           _describe(previous))
        _write_holder(self._fd)

    def release(self):
        """Remove the lock file and let go of the lock (a no-op when not held)."""
        if self._fd is None:
            return
        try:
            os.remove(self.path)  # while still locked, so no other run sees a half-released file
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def _open(self):
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise OutputDirError('cannot create the run lock {} ({}); set OUTPUT_DIR to a writable directory'
                                 .format(self.path, err.strerror or err)) from err


@contextlib.contextmanager
def exclusive_run(directory):
    """Own directory for a training run: hold its RunLock for the with-block and, once it is held,
    remove the temporary files of interrupted saves (nobody else can be writing them now).

    Ranks > 0 of a job that torchrun or SLURM started do neither: every process of such a job runs the
    engine, and rank 0 does both for the job.
    """
    job = job_from_environment()
    if job is not None and job.rank != 0:
        yield
        return
    with RunLock(directory):
        remove_stale_temporary_files(directory)
        yield


def _same_file(fd, path):
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _read_holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode('utf-8', 'replace')
    try:
        holder = json.loads(text) if text.strip() else {}
    except ValueError:
        return {'unreadable': text[:80]}
    return holder if isinstance(holder, dict) else {'unreadable': text[:80]}


def _write_holder(fd):
    holder = {'pid': os.getpid(), 'host': socket.gethostname(),
              'started': datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
              'command': ' '.join(sys.argv)[:500]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    os.fsync(fd)


def _describe(holder):
    if not holder:
        return 'its details are not written yet'
    if 'unreadable' in holder:
        return 'lock file content {!r}'.format(holder['unreadable'])
    return 'PID {} on host {}, started {}'.format(holder.get('pid'), holder.get('host'), holder.get('started'))
