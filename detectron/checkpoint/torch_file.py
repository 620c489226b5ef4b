"""Torch weight files (checkpoints, model_final.pth, converted .pkl): a digest written with the content
and checked on every load, and one-line errors for files that are truncated, damaged or carry code.

torch.load does not check the CRCs of its zip archive, so a damaged tensor would load silently; the
digest (SHA-256 over every tensor's bytes, dtype and shape and every plain value) catches any flipped
byte. Files without a digest (older checkpoints, torchvision weights) load with an info line.
"""
import logging
import os
import pickle
import re

import torch

from detectron.utils.digest import DIGEST_KEY, content_digest
from detectron.utils.errors import WeightsError
from detectron.utils.io import _write_atomically

logger = logging.getLogger(__name__)

_ZIP_MAGIC = b'PK\x03\x04'
_LEGACY_MAGIC = pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2)  # torch.serialization's MAGIC_NUMBER
_REFUSED_GLOBAL = re.compile(r'GLOBAL ([\w.]+)')  # in torch's message for a refused pickled global


def looks_like_torch_file(path):
    """Whether path starts like a torch file (complete or not): a zip archive, or the pickled magic number
    that torch.save wrote before torch 1.6 (older torchvision ResNet files)."""
    with open(path, 'rb') as f:
        start = f.read(len(_LEGACY_MAGIC))
    return start.startswith(_ZIP_MAGIC) or start == _LEGACY_MAGIC


def with_digest(content):
    """A copy of the dict `content` with its digest under DIGEST_KEY, ready for torch.save."""
    return dict(content, **{DIGEST_KEY: {'sha256': content_digest(content)}})


def write_torch_file(content, path):
    """torch.save the dict `content` with its digest to path atomically (utils/io.py): one OutputDirError
    line when the directory is missing, read-only or full."""
    _write_atomically(path, lambda f: torch.save(with_digest(content), f))


def read_torch_file(path):
    """torch.load(path) into CPU memory without running pickled code, its digest checked if it has one.

    Raises WeightsError with one sentence for a missing, empty, truncated, damaged or code-carrying file.
    """
    if os.path.isdir(path):
        raise WeightsError('{} is a directory, not a weights file; name a file in it (e.g. its model_final.pth)'
                           .format(path))
    if not os.path.isfile(path):
        raise WeightsError('{} does not exist'.format(path))
    try:
        content = torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only refuses a pickled global (code) by name; other bytes it cannot parse at all
        # ("Unsupported operand": a text file, say) are no torch file, not a dangerous one.
        if 'Weights only load failed' in str(e) and _REFUSED_GLOBAL.search(str(e)):
            raise WeightsError(_refused_code_message(path, str(e))) from e
        raise WeightsError(_unreadable_message(path, e)) from e
    except Exception as e:  # torch reports a damaged file with several exception types
        raise WeightsError(_unreadable_message(path, e)) from e
    verify_digest(content, path)
    return content


def verify_digest(content, path):
    """Raise WeightsError if content carries a digest that its tensors and values do not match."""
    saved = content.get(DIGEST_KEY) if isinstance(content, dict) else None
    if saved is None:
        logger.info('%s carries no digest (written before digests or by another program): loaded without '
                    'an integrity check', path)
        return
    if not isinstance(saved, dict) or saved.get('sha256') != content_digest(content):
        raise WeightsError('{} is damaged: its tensors do not match the digest written with them (a flipped or '
                           'overwritten byte on disk or in a copy); restore it from an intact copy, or delete '
                           'it to resume from the previous checkpoint'.format(path))


def _unreadable_message(path, error):
    size = os.path.getsize(path)
    if size == 0:
        return '{} is empty (0 bytes): an interrupted save or copy; delete it or copy it again'.format(path)
    if looks_like_torch_file(path) and not _has_zip_end(path):
        return ('{} is truncated or not a complete checkpoint ({} bytes, the end of its zip archive is missing: '
                'an interrupted save or copy); delete it or copy it again'.format(path, size))
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return '{} is not a readable torch file ({}); only files written by torch.save can be loaded'.format(
        path, reason)


def _has_zip_end(path):
    # The end-of-central-directory record sits in the last 64 KiB + 22 bytes of a zip archive.
    with open(path, 'rb') as f:
        f.seek(max(0, os.path.getsize(path) - (1 << 16) - 22))
        return b'PK\x05\x06' in f.read()


def _refused_code_message(path, torch_message):
    found = _REFUSED_GLOBAL.search(torch_message)
    what = ' ({})'.format(found.group(1)) if found else ''
    return ('{} contains code objects{} that a weights file never needs; it is refused for safety: do not '
            'load it, get the weights from a source you trust'.format(path, what))
