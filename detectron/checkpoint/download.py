"""The URL download cache of weight files (Detectron utils/io.py's cache_url)."""
import logging
import os
import re
import shutil
import urllib.parse
import urllib.request

from detectron.utils.errors import WeightsError
from detectron.utils.io import _write_atomically

logger = logging.getLogger(__name__)

DETECTRON_BASE_URL = 'https://dl.fbaipublicfiles.com/detectron'
_URL_PATTERN = re.compile(r'^https?://', re.IGNORECASE)
_DOWNLOAD_TIMEOUT_S = 60


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


def _download(url, path):
    logger.info('Downloading %s to %s', url, path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            _write_atomically(path, lambda f: shutil.copyfileobj(response, f))
    except OSError as e:  # URLError, HTTPError, timeouts and disk errors are all OSErrors
        raise WeightsError(
            'could not download {} ({}); download it yourself and place it at {}'.format(
                url, getattr(e, 'reason', e), path)) from e


def cache_url(url_or_path, cache_dir):
    """Return a local path for url_or_path, downloading http(s) URLs into cache_dir once.

    Non-URLs are returned unchanged. A URL already in the cache is used without any network
    access (Detectron re-downloaded an md5 file every time; this port does not).
    """
    if not is_url(url_or_path):
        return url_or_path
    path = url_cache_path(url_or_path, cache_dir)
    if not os.path.exists(path):
        _download(url_or_path, path)
    return path
