"""No process of a job outlives its launcher: a spawned worker, a DataLoader worker or a rank that torchrun's
agent started asks Linux to kill it when its parent dies, whatever the signal that ended the parent."""
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
    if parent is None:
        return False
    return _die_with(parent.pid, sig)


def die_with_torchrun_agent(sig=signal.SIGKILL):
    """For a rank that torchrun's agent started (TORCHELASTIC_RUN_ID in the environment): have Linux send
    `sig` to this process when the agent dies, so that a SIGKILLed agent leaves no rank training on (its
    DataLoader workers follow it through die_with_parent). Returns whether it is set up.

    The agent is the parent this process had when the detectron package was first imported
    (detectron.PARENT_PID_AT_START); if the parent is another one by now, the agent is gone and this
    process ends at once. Elsewhere (no torchrun agent, not Linux) it does nothing and returns False:
    a process started by hand or by a script must not die with the shell that started it.
    """
    if 'TORCHELASTIC_RUN_ID' not in os.environ:
        return False
    import detectron
    return _die_with(detectron.PARENT_PID_AT_START, sig)


def _die_with(parent_pid, sig):
    if not sys.platform.startswith('linux'):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        logger.warning('prctl(PR_SET_PDEATHSIG) failed (%s): this process may outlive its parent',
                       os.strerror(ctypes.get_errno()))
        return False
    # The parent may have died before prctl: then no signal will ever come, and this process was
    # already handed to another parent (init or a subreaper).
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
    return True
