"""A content digest of a dict of tensors and plain values: SHA-256 over every tensor's bytes, dtype and
shape and every plain value (written with torch files, compared across ranks)."""
import hashlib

import torch

DIGEST_KEY = 'digest'


def content_digest(content):
    """Hex SHA-256 of a dict of tensors and plain values, its DIGEST_KEY entry left out."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in content.items() if k != DIGEST_KEY})
    return digest.hexdigest()


def _feed(digest, value):
    # Every value is tagged with its type and length, so that no two different contents feed the
    # same bytes (e.g. ['ab'] and ['a', 'b'], 1 and 1.0 and True).
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update('X{}{};'.format(value.dtype, tuple(value.shape)).encode())
        digest.update(tensor.view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update('D{};'.format(len(value)).encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update('{}{};'.format('L' if isinstance(value, list) else 'T', len(value)).encode())
        for item in value:
            _feed(digest, item)
    elif isinstance(value, str):
        data = value.encode('utf-8', 'surrogatepass')
        digest.update('S{}:'.format(len(data)).encode() + data)
    elif isinstance(value, bytes):
        digest.update('Y{}:'.format(len(value)).encode() + value)
    elif isinstance(value, float):
        digest.update('F{};'.format(value.hex()).encode())
    elif value is None or isinstance(value, (bool, int)):  # bool before int: True is not 1 here
        digest.update('{}{};'.format(type(value).__name__, value).encode())
    else:  # what weights_only loading may still return: torch.Size, dtype, device
        digest.update('O{}:{!r};'.format(type(value).__qualname__, value).encode())
