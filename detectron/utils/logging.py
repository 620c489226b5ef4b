"""Detectron's log format, its `json_stats:` training lines, and OUTPUT_DIR/log.txt."""

import contextlib
import datetime
import json
import logging
import os
import shlex
import socket
import sys
import traceback
from numbers import Integral, Real

from detectron.utils.errors import DetectronError, OutputDirError, error_line

_FORMAT = '%(levelname)s %(filename)s:%(lineno)4d: %(message)s'
LOG_FILE_NAME = 'log.txt'
# Lines for log.txt alone, without the log format: the json_stats lines (printed to stdout as
# well), start marks and error lines (the tools print theirs to stderr).
_log_file_only = logging.getLogger('detectron.log_file')
_log_file_only.propagate = False
_log_file_only.setLevel(logging.INFO)
_log_file_only.addHandler(logging.NullHandler())  # no file attached: nothing, not logging's stderr fallback


def setup_logging(name, rank=None):
    """Log to stdout in Detectron's format and return the logger `name`.

    INFO and above; processes of a multi-process run other than rank 0 log WARNING and above
    only, so that each message appears once.
    """
    level = logging.WARNING if rank else logging.INFO
    # force: drop handlers that an earlier logging.basicConfig() (e.g. by a library) installed
    logging.basicConfig(level=level, format=_FORMAT, stream=sys.stdout, force=True)
    return logging.getLogger(name)


def log_json_stats(stats, sort_keys=True):
    """Print `json_stats: {...}` (no log prefix), the line Detectron's plotting scripts parse.

    Floats become strings with 6 decimals and integers stay integers, as in Detectron;
    numpy scalars are treated like the Python numbers they hold.
    """
    line = 'json_stats: {}'.format(json.dumps(
        {key: _json_value(value) for key, value in stats.items()}, sort_keys=sort_keys))
    print(line)
    _log_file_only.info(line)


def _json_value(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return '{:.6f}'.format(value)
    return value


@contextlib.contextmanager
def log_file(output_dir, rank, command=None):
    """Within the block, append this process's log to <output_dir>/log.txt (created if missing), which
    a job's processes share: rank 0 (a launcher of spawned workers is rank 0 too) writes its whole log
    (INFO and above, and the json_stats lines), other ranks their errors only, prefixed with their rank.
    An error that ends the block is written as its `error:` line (a traceback for an unexpected one).
    command: the argv of a tool's start, marked on rank 0 with the time, PID and host. In a process
    that already writes the file (an in-process worker under its tool) this changes nothing."""
    path = os.path.abspath(os.path.join(output_dir, LOG_FILE_NAME))
    if any(getattr(h, 'baseFilename', None) == path for h in logging.getLogger().handlers):
        yield
        return
    handler = _open_log_file(output_dir, path, rank)
    loggers = (logging.getLogger(), _log_file_only)
    for logger in loggers:
        logger.addHandler(handler)
    try:
        if command is not None and rank == 0:
            _log_file_only.info('=== started {} (PID {} on {}): {}'.format(
                datetime.datetime.now().astimezone().isoformat(timespec='seconds'), os.getpid(),
                socket.gethostname(), shlex.join(command)))
        yield
    except BaseException as err:
        _log_error(err)
        raise
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
        handler.close()


def _open_log_file(output_dir, path, rank):
    try:
        os.makedirs(output_dir, exist_ok=True)
        handler = logging.FileHandler(path, mode='a', encoding='utf-8')
    except OSError as err:
        raise OutputDirError('OUTPUT_DIR {} cannot be used: cannot append to {} ({}); set OUTPUT_DIR to a '
                             'writable directory'.format(output_dir, path, err.strerror or err)) from err
    handler.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    handler.setFormatter(_LogFileFormatter(rank))
    return handler


def _log_error(err):
    if isinstance(err, DetectronError):
        _log_file_only.error(error_line(err))
    elif isinstance(err, Exception):
        _log_file_only.error('error: {}'.format(''.join(traceback.format_exception(err)).rstrip()))


class _LogFileFormatter(logging.Formatter):
    """Detectron's format with the time; the log-file-only lines as they are; other ranks' lines
    after their rank."""

    def __init__(self, rank):
        super().__init__('%(asctime)s ' + _FORMAT, datefmt='%Y-%m-%d %H:%M:%S')
        self.prefix = 'rank {}: '.format(rank) if rank else ''

    def format(self, record):
        text = record.getMessage() if record.name == _log_file_only.name else super().format(record)
        return self.prefix + text
