"""No process of a job outlives its launcher: a spawned worker or a DataLoader worker asks Linux to kill
it when its parent dies, whatever the signal that ended the parent."""
import ctypes
import logging
import multiprocessing
import os
import signal
import sys

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig=signal.SIGKILL):
    """Have Linux send `sig` to this process when its parent dies; returns whether it is set up.

    For a process started through multiprocessing (a spawned rank, a DataLoader worker); elsewhere,
    and off Linux, it does nothing and returns False. Linux sends the signal when the parent *thread*
    that started this process ends, so start workers from a thread that lives as long as they should.
    """
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith('linux'):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        logger.warning('prctl(PR_SET_PDEATHSIG) failed (%s): this process may outlive its parent',
                       os.strerror(ctypes.get_errno()))
        return False
    # The parent may have died before prctl: then no signal will ever come, and this process was
    # already handed to another parent (init or a subreaper).
    if os.getppid() != parent.pid:
        os.kill(os.getpid(), sig)
    return True
