"""Errors that describe bad user input (config, data, weights, launch settings, output directory), and a
run stopped by SIGTERM / SIGINT.

The command-line tools print these as one line and exit non-zero instead of showing a traceback:
they are about what the user typed (or did), not about a bug. Each subclasses the builtin exception that
Detectron raised in the same situation, so code and tests written for Detectron still catch them.
"""
import contextlib
import os
import signal
import sys
import threading


class DetectronError(Exception):
    """Base class of user-facing errors; str(err) is the whole message."""


class ConfigKeyError(DetectronError, KeyError):
    """Unknown, renamed or otherwise unusable config key."""

    def __str__(self):
        # KeyError quotes its argument; the message should read as a sentence.
        return str(self.args[0]) if self.args else ''


class OverridesKeyError(ConfigKeyError, AssertionError):
    """Unknown key in command-line overrides, where Detectron asserted ("Non-existent key: K")."""


class ConfigValueError(DetectronError, ValueError):
    """A config value of the wrong type or out of range."""


class OverridesFormatError(ConfigValueError, AssertionError):
    """Command-line overrides that are not KEY VALUE pairs, where Detectron asserted."""


class UnknownPolicyError(ConfigValueError, NotImplementedError):
    """SOLVER.LR_POLICY names no policy (Detectron raised NotImplementedError)."""


class DatasetError(DetectronError, FileNotFoundError):
    """Unknown dataset name, missing annotation file, image directory or unreadable image."""


class WeightsError(DetectronError, ValueError):
    """A weights file that is missing, unsafe to unpickle or does not fit the model."""


class LaunchError(DetectronError, RuntimeError):
    """Bad multi-process / multi-GPU launch settings (e.g. more GPUs asked than exist)."""


class LoaderWorkerError(DetectronError, RuntimeError):
    """A data-loader worker process died (killed by a signal, often the out-of-memory killer)."""


# What a dead DataLoader worker's one line says after naming the worker.
DEAD_WORKER_HINT = '(the out-of-memory killer, see dmesg, or a kill); lower DATA_LOADER.NUM_THREADS if memory is short'


# torch's "DataLoader worker (pid N) is killed by signal: <strsignal>." for the signals that stop a job.
_STOPPING_SIGNALS = {signal.strsignal(sig): sig for sig in (signal.SIGTERM, signal.SIGINT)}


def as_loader_worker_error(err):
    """torch's RuntimeError for a dead DataLoader worker as a LoaderWorkerError, else None; a worker
    stopped by SIGTERM or SIGINT (sent to the process group, or by torchrun's agent) as the
    JobInterrupted of that signal.

    torch raises it from the loader's iterator or, through its SIGCHLD handler, at whatever line the
    main thread is running, so both the loader and the tools' top levels translate it."""
    if isinstance(err, (LoaderWorkerError, JobInterrupted)):
        return err
    if not (isinstance(err, RuntimeError) and str(err).startswith('DataLoader worker')):
        return None
    if isinstance(err.__cause__, JobInterrupted):
        # The signal arrived while the loader waited for a batch; torch reports any error of that wait
        # as "exited unexpectedly" once a worker (here one ended by the same signal) is gone.
        return err.__cause__
    first_line = str(err).strip().splitlines()[0].rstrip('. ')
    killed_by = first_line.rpartition('killed by signal: ')[2]
    if killed_by in _STOPPING_SIGNALS:
        return JobInterrupted(_STOPPING_SIGNALS[killed_by])
    return LoaderWorkerError('{} {}'.format(first_line, DEAD_WORKER_HINT))


@contextlib.contextmanager
def dead_loader_workers_as_errors():
    """Re-raise torch's RuntimeError for a dead DataLoader worker as one LoaderWorkerError line."""
    try:
        yield
    except RuntimeError as err:
        translated = as_loader_worker_error(err)
        if translated is None:
            raise
        raise translated from None


class DeviceOutOfMemory(DetectronError, RuntimeError):
    """The device ran out of memory (torch.OutOfMemoryError): where, how much, and the keys that lower it."""


class OutputDirError(DetectronError, OSError):
    """OUTPUT_DIR cannot be used: not a writable directory, full, or in use by another run."""

    def __str__(self):
        # OSError would format (errno, strerror) pairs; the message is the whole sentence.
        return str(self.args[0]) if self.args else ''


class JobInterrupted(DetectronError):
    """SIGTERM or SIGINT stopped the run (its workers too); exits with 128 + the signal, as a shell would."""

    def __init__(self, signum):
        self.signum = signum
        self.exit_status = 128 + signum
        super().__init__('stopped by {}; all worker processes were stopped (a training run resumes from its '
                         'last checkpoint when started again)'.format(signal.Signals(signum).name))

    def __reduce__(self):
        return type(self), (self.signum,)


# The signal number of a SIGTERM / SIGINT received inside termination_signals_raise (None otherwise).
_stop_signal = None


def raise_if_stopped():
    """Raise JobInterrupted if a SIGTERM or SIGINT arrived inside termination_signals_raise. Its handler
    raises at once, but code that catches everything (copyreg's `except: pass`, which pickling runs for
    every save of some types) can swallow that exception; the loops call this at their safe points
    (after an atomic write is complete, after each training iteration and each tested batch)."""
    if _stop_signal is not None:
        raise JobInterrupted(_stop_signal)


@contextlib.contextmanager
def termination_signals_raise():
    """Within the block, SIGTERM and SIGINT raise JobInterrupted in the main thread, so that `finally`
    blocks run (stopping worker processes, removing temporary files) and the tool prints one line,
    and are remembered for raise_if_stopped; in a process forked meanwhile they raise
    KeyboardInterrupt. Elsewhere than the main thread (where Python cannot set handlers) it changes
    nothing."""
    global _stop_signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    owner = os.getpid()

    def interrupt(signum, frame):
        if os.getpid() != owner:
            # A forked child, e.g. a DataLoader worker: it ends quietly, as Ctrl-C ends a DataLoader worker
            # (its loop swallows KeyboardInterrupt); the job's own process prints the one line.
            raise KeyboardInterrupt
        # The job stops: its DataLoader workers, stopped by the same signal, are expected to die, and
        # torch's SIGCHLD handler would report one as a failure while the stop unwinds.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        global _stop_signal
        _stop_signal = signum
        raise JobInterrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    _stop_signal = None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop_signal = None


def run_tool(main, argv):
    """Run a command-line tool's main(argv), reporting a DetectronError as one `error:` line on
    stderr with exit status 2 (a bad config, dataset or weights file needs no traceback), or the
    error's own `exit_status` (128 + the signal for a run stopped by SIGTERM or SIGINT)."""
    try:
        with termination_signals_raise(), dead_loader_workers_as_errors():
            main(argv)
    except DetectronError as err:
        print(error_line(err), file=sys.stderr)
        sys.exit(getattr(err, 'exit_status', 2))


# An error line quotes what the user gave (values, paths); a runaway value must not make it unreadable.
MAX_ERROR_LINE = 2000


def error_line(err):
    """A DetectronError as the one `error:` line the tools print, at most MAX_ERROR_LINE characters."""
    line = 'error: {}'.format(' '.join(str(err).splitlines()))
    if len(line) <= MAX_ERROR_LINE:
        return line
    omitted = ' ... ({} characters omitted) ... '.format(len(line) - MAX_ERROR_LINE)
    half = (MAX_ERROR_LINE - len(omitted)) // 2
    return line[:half] + omitted + line[-half:]
