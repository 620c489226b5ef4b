"""Pickle and JSON files and atomic writes (Detectron utils/io.py; its URL download cache is
checkpoint/download.py)."""

import errno
import json
import logging
import os
import pickle
import re
import uuid

try:
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _multiarray

from detectron.utils.errors import DetectronError, OutputDirError, raise_if_stopped

logger = logging.getLogger(__name__)

# `<name>.tmp.<32 hex digits>`: what _write_atomically writes before the rename.
_TEMPORARY_FILE = re.compile(r'^.+\.tmp\.[0-9a-f]{32}$')
_WRITE_FIXES = {
    errno.ENOSPC: 'free space on that disk or set OUTPUT_DIR to one with room',
    errno.EDQUOT: 'free space within your disk quota or set OUTPUT_DIR elsewhere',
    errno.EROFS: 'the filesystem is read-only: set OUTPUT_DIR to a writable directory',
    errno.EACCES: 'make the directory writable for this user or set OUTPUT_DIR elsewhere',
    errno.EPERM: 'make the directory writable for this user or set OUTPUT_DIR elsewhere',
}


def _write_atomically(path, write):
    """Call write(file) on `<path>.tmp.<uuid>` and rename it onto path.

    Readers (and other processes on a shared filesystem) see either the old file or the complete
    new one, never a partial file; the temporary file is removed on failure. A failing write (disk
    full, read-only directory) raises OutputDirError with one sentence.
    """
    path = os.path.abspath(path)
    tmp_path = '{}.tmp.{}'.format(path, uuid.uuid4().hex)
    try:
        with open(tmp_path, 'wb') as f:
            try:
                write(f)
            except RuntimeError as e:
                raise _first_of_chain(e) from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        # The file is complete: a stop whose exception the write swallowed ends the run here.
        raise_if_stopped()
    except OSError as e:
        if isinstance(e, OutputDirError):
            raise
        raise OutputDirError('could not write {} ({}); {}{}'.format(
            path, e.strerror or e, _WRITE_FIXES.get(e.errno, 'check the disk and the directory'),
            '; the existing file is unchanged' if os.path.exists(path) else '')) from e
    finally:
        try:
            os.remove(tmp_path)
        except OSError:
            pass


def _first_of_chain(err):
    """The exception that a write began with. torch.save reports one raised while it writes (a full
    disk's OSError, the JobInterrupted of a SIGTERM or Ctrl-C) as a RuntimeError of its zip writer
    ('unexpected pos ...') raised while unwinding, with the cause as its context."""
    while isinstance(err, RuntimeError) and isinstance(err.__context__, (OSError, DetectronError)):
        err = err.__context__
    return err


def remove_stale_temporary_files(directory):
    """Remove the temporary files that interrupted atomic writes left in directory (a killed save can
    leave a whole checkpoint there); returns their paths. Call only while no other process writes
    into directory, i.e. holding its run lock (core/run_lock.py)."""
    removed = []
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in sorted(filter(_TEMPORARY_FILE.match, names)):
        path = os.path.join(directory, name)
        size = os.path.getsize(path)
        os.remove(path)
        logger.info('Removed %s (%.1f MB), left by an interrupted save', path, size / 2 ** 20)
        removed.append(path)
    return removed


class _OldNumpyPickler(pickle._Pickler):
    """Protocol-2 pickler that names numpy's array and scalar constructors by numpy 1's module path.

    numpy 2 moved them to numpy._core.multiarray, a module the numpy 1 of Detectron's Python 2 cannot
    import; numpy 2 still loads the old path (numpy.core.multiarray). The pure-Python pickler is used
    because only it lets a subclass choose how a global is written.
    """

    _renamed = {id(getattr(_multiarray, name)): name for name in ('_reconstruct', 'scalar')}

    def save_global(self, obj, name=None):
        if id(obj) not in self._renamed:
            return super().save_global(obj, name)
        self.write(pickle.GLOBAL + 'numpy.core.multiarray\n{}\n'.format(self._renamed[id(obj)]).encode())
        self.memoize(obj)


def save_object(obj, path):
    """Pickle obj to path atomically, with protocol 2 and numpy 1's module names, so that Detectron's
    Python 2 (and its numpy 1) can read it."""
    _write_atomically(path, lambda f: _OldNumpyPickler(f, protocol=2).dump(obj))


def save_json(obj, path):
    """json.dump obj to path atomically: a full disk or a kill leaves the old file or none, never a
    truncated one."""
    _write_atomically(path, lambda f: f.write(json.dumps(obj).encode('utf-8')))


def load_object(path, unpickler=pickle.Unpickler):
    """Unpickle path; latin1 decodes the byte strings of Python 2 pickles (numpy array data).

    `unpickler` lets callers restrict what may be unpickled (see checkpoint/c2_weights.py).
    """
    with open(path, 'rb') as f:
        return unpickler(f, encoding='latin1').load()
