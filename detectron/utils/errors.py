"""Errors that describe bad user input (config, data, weights, launch settings).

The command-line tools print these as one line and exit non-zero instead of showing a traceback:
they are about what the user typed, not about a bug. Each subclasses the builtin exception that
Detectron raised in the same situation, so code and tests written for Detectron still catch them.
"""
import sys


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


class OutputDirError(DetectronError, OSError):
    """OUTPUT_DIR cannot be used: not a writable directory, full, or in use by another run."""

    def __str__(self):
        # OSError would format (errno, strerror) pairs; the message is the whole sentence.
        return str(self.args[0]) if self.args else ''


def run_tool(main, argv):
    """Run a command-line tool's main(argv), reporting a DetectronError as one `error:` line on
    stderr with exit status 2 (a bad config, dataset or weights file needs no traceback), or the
    error's own `exit_status` (128 + signal for a run stopped by a signal)."""
    try:
        main(argv)
    except DetectronError as err:
        print('error: {}'.format(' '.join(str(err).splitlines())), file=sys.stderr)
        sys.exit(getattr(err, 'exit_status', 2))
