"""The URL download cache of weight files (Detectron utils/io.py's cache_url).

A download is written to a temporary name in the cache directory (`<name>.tmp.<uuid>`) and renamed
onto the cached name only once it is whole, so a failed download leaves nothing that a later run
would take for the weights. Checked before the rename:

- the length against the response's Content-Length (a server that closes early);
- Detectron's md5: by Detectron's convention the md5 of `<url>` is served as `<url>.md5sum`
  (Detectron's assert_cache_file_is_ok). It is required for Detectron's bucket, as Detectron requires
  it; other hosts' downloads are checked against it where the server has one;
- a body that starts like an HTML or XML page (`<!DOCTYPE`, `<html`, `<?xml`: a login, error or
  mirror page served with status 200) where a weights file (.pkl / .pth / .pt) is expected, and an
  empty body, are refused.

Time: each read waits at most `_DOWNLOAD_TIMEOUT_S` (60 s) for data, and the whole download (the
md5 file, connecting, every byte) has one deadline, `DOWNLOAD_DEADLINE_S` seconds (3600), which the
environment variable `DETECTRON_DOWNLOAD_DEADLINE_S` overrides. Every failure is one WeightsError
naming the URL and the cache path.
"""
import hashlib
import http.client
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from detectron.utils.errors import OutputDirError, WeightsError
from detectron.utils.io import _write_atomically

logger = logging.getLogger(__name__)

DETECTRON_BASE_URL = 'https://dl.fbaipublicfiles.com/detectron'
_URL_PATTERN = re.compile(r'^https?://', re.IGNORECASE)
_DOWNLOAD_TIMEOUT_S = 60  # the longest wait for the next bytes
DOWNLOAD_DEADLINE_S = 3600  # the whole download; DETECTRON_DOWNLOAD_DEADLINE_S overrides it
DEADLINE_ENV = 'DETECTRON_DOWNLOAD_DEADLINE_S'
_CHUNK_BYTES = 1 << 16
_WEIGHTS_SUFFIXES = ('.pkl', '.pth', '.pt')
_PAGE_STARTS = (b'<!doctype', b'<html', b'<?xml')
_MD5 = re.compile(r'^[0-9a-f]{32}$')


def is_url(path_or_url):
    return _URL_PATTERN.match(path_or_url) is not None


def url_cache_path(url, cache_dir):
    """Where cache_url keeps url: Detectron's bucket prefix is replaced by cache_dir (as Detectron
    does); other hosts go to cache_dir/<host>/<path>."""
    if url.startswith(DETECTRON_BASE_URL + '/'):
        relative = url[len(DETECTRON_BASE_URL) + 1:]
    else:
        parts = urllib.parse.urlsplit(url)
        relative = parts.netloc + parts.path
    cache_root = os.path.abspath(cache_dir)
    path = os.path.normpath(os.path.join(cache_root, relative))
    if not path.startswith(cache_root + os.sep):
        raise WeightsError('URL {} does not name a file inside the download cache {}'.format(
            url, cache_root))
    return path


def download_deadline_s():
    """Seconds the whole download may take: $DETECTRON_DOWNLOAD_DEADLINE_S, else DOWNLOAD_DEADLINE_S."""
    value = os.environ.get(DEADLINE_ENV, '').strip()
    if not value:
        return DOWNLOAD_DEADLINE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = float('nan')
    if not seconds > 0 or seconds == float('inf'):
        raise WeightsError('{} must be a number of seconds > 0, got {!r}'.format(DEADLINE_ENV, value))
    return seconds


class _Failed(Exception):
    """Why a download was refused (the reason part of the one line)."""


class _Deadline:
    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def wait_s(self):
        """How long the next network wait may last: the idle timeout, less near the deadline."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise socket.timeout('deadline')
        return min(_DOWNLOAD_TIMEOUT_S, left)

    def passed(self):
        return time.monotonic() >= self.end


def _download(url, path):
    logger.info('Downloading %s to %s', url, path)
    deadline = _Deadline(download_deadline_s())
    progress = {'received': 0, 'expected': None}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        reference_md5 = _reference_md5(url, deadline)
        with urllib.request.urlopen(url, timeout=deadline.wait_s()) as response:
            progress['expected'] = _content_length(response)
            _write_atomically(path, lambda f: _receive(response, f, url, path, reference_md5,
                                                            deadline, progress))
    except _Failed as e:
        reason = str(e)
    except OutputDirError as e:  # the cache's disk: full, read-only
        cause = e.__cause__
        reason = 'writing into the download cache failed: {}; free space there or set DOWNLOAD_CACHE to ' \
                 'a writable directory'.format(getattr(cause, 'strerror', None) or cause or e)
    except (OSError, http.client.HTTPException) as e:
        # URLError, HTTPError, timeouts, disk errors; a cut chunked transfer is an IncompleteRead.
        reason = _network_reason(e, deadline, progress)
    else:
        return
    raise WeightsError('could not download {} ({}); nothing was kept in the download cache; download it '
                       'yourself and place it at {}'.format(url, reason, path))


def _network_reason(err, deadline, progress):
    if isinstance(err, urllib.error.URLError) and isinstance(err.reason, (socket.timeout, TimeoutError)):
        err = err.reason
    if isinstance(err, (socket.timeout, TimeoutError)):
        got = _bytes_so_far(progress)
        if deadline.passed():
            return ('not complete within the download deadline of {:g} s ({}); set {} to allow '
                    'longer'.format(deadline.seconds, got, DEADLINE_ENV))
        return 'no data for {} s ({})'.format(_DOWNLOAD_TIMEOUT_S, got)
    if isinstance(err, http.client.IncompleteRead):
        return 'the server ended the transfer early ({})'.format(_bytes_so_far(progress))
    if isinstance(err, urllib.error.HTTPError):
        return 'HTTP {} {}'.format(err.code, err.reason)
    return str(getattr(err, 'reason', None) or err)


def _bytes_so_far(progress):
    if progress['expected'] is None:
        return '{} bytes received'.format(progress['received'])
    return '{} of {} bytes received'.format(progress['received'], progress['expected'])


def _content_length(response):
    value = response.headers.get('Content-Length')
    if value is None or response.headers.get('Content-Encoding', 'identity') != 'identity':
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _receive(response, f, url, path, reference_md5, deadline, progress):
    """Copy the body into f (the temporary file), then check it; raises _Failed, so that the
    temporary file is removed and nothing is renamed onto path."""
    digest = hashlib.md5()
    head = b''
    while True:
        try:
            _set_read_timeout(response, deadline.wait_s())
            chunk = response.read1(_CHUNK_BYTES)
        except (OSError, http.client.HTTPException) as e:  # not the disk: said apart from write errors
            raise _Failed(_network_reason(e, deadline, progress)) from e
        if not chunk:
            break
        progress['received'] += len(chunk)
        digest.update(chunk)
        if len(head) < 64:
            head += chunk[:64]
        f.write(chunk)
        if deadline.passed():
            raise _Failed(_network_reason(socket.timeout('deadline'), deadline, progress))
    received, expected = progress['received'], progress['expected']
    if expected is not None and received != expected:
        raise _Failed('the server closed the connection after {} of the {} bytes its Content-Length '
                      'announced'.format(received, expected))
    if path.endswith(_WEIGHTS_SUFFIXES):
        if received == 0:
            raise _Failed('the server sent an empty body where a weights file was expected')
        if head.lstrip(b'\xef\xbb\xbf \t\r\n').lower().startswith(_PAGE_STARTS):
            raise _Failed('the server sent a web page (status {}, Content-Type {}) where a weights file was '
                          'expected: often a login, error or mirror page'.format(
                              response.status, response.headers.get('Content-Type', 'not given')))
    if reference_md5 is not None and digest.hexdigest() != reference_md5:
        raise _Failed('its md5 {} is not the {} that {}.md5sum gives'.format(digest.hexdigest(), reference_md5, url))


def _set_read_timeout(response, seconds):
    """Bound the next read by seconds: urlopen's timeout is set once, when connecting."""
    sock = getattr(getattr(response.fp, 'raw', None), '_sock', None)
    if sock is not None:
        sock.settimeout(seconds)


def _reference_md5(url, deadline):
    """The md5 that `<url>.md5sum` gives (Detectron's convention), or None where the server has none.
    Required for Detectron's bucket, as Detectron requires it."""
    required = url.startswith(DETECTRON_BASE_URL + '/')
    try:
        with urllib.request.urlopen(url + '.md5sum', timeout=deadline.wait_s()) as response:
            text = response.read(4096).decode('ascii', 'replace').strip()
    except (OSError, http.client.HTTPException) as e:
        if required:
            raise _Failed('its md5 file {}.md5sum, which Detectron checks every download of its bucket '
                          'against, could not be read: {}'.format(url, _network_reason(
                              e, deadline, {'received': 0, 'expected': None}))) from e
        logger.debug('No md5 file for %s (%s): checked by its length only', url, e)
        return None
    token = text.split()[0].lower() if text else ''
    if _MD5.match(token):
        return token
    if required:
        raise _Failed('its md5 file {}.md5sum does not hold an md5 (it starts {!r})'.format(url, text[:40]))
    logger.debug('%s.md5sum does not hold an md5: %s is checked by its length only', url, url)
    return None


def cache_url(url_or_path, cache_dir):
    """Return a local path for url_or_path, downloading http(s) URLs into cache_dir once.

    Non-URLs are returned unchanged. A URL already in the cache is used without any network
    access (Detectron re-downloaded an md5 file every time; this port checks the md5 when it
    downloads, and renames a download into the cache only when it is whole and checked).
    """
    if not is_url(url_or_path):
        return url_or_path
    path = url_cache_path(url_or_path, cache_dir)
    if not os.path.exists(path):
        _download(url_or_path, path)
    return path
