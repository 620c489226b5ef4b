import io
import os
import urllib.request

import pytest

from detectron.checkpoint.download import cache_url
from detectron.utils.errors import WeightsError


def _forbid_network(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError('network used')
    monkeypatch.setattr(urllib.request, 'urlopen', fail)


def test_cache_url_returns_local_paths_unchanged(monkeypatch):
    _forbid_network(monkeypatch)
    assert cache_url('/data/R-50.pkl', '/cache') == '/data/R-50.pkl'
    assert cache_url('weights/model.pth', '/cache') == 'weights/model.pth'


def test_cache_url_uses_cached_detectron_file_without_network(tmp_path, monkeypatch):
    _forbid_network(monkeypatch)
    cached = tmp_path / 'ImageNetPretrained' / 'MSRA' / 'R-50.pkl'
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b'x')
    url = 'https://dl.fbaipublicfiles.com/detectron/ImageNetPretrained/MSRA/R-50.pkl'
    assert cache_url(url, str(tmp_path)) == str(cached)


def test_cache_url_downloads_other_hosts_under_host_directory(tmp_path, monkeypatch):
    calls = []

    def fake_urlopen(url, timeout):
        calls.append(url)
        return io.BytesIO(b'weights')
    monkeypatch.setattr(urllib.request, 'urlopen', fake_urlopen)
    url = 'https://github.com/yihui-he/KL-Loss/releases/download/models/faster2x_log.pkl'
    expected = tmp_path / 'github.com/yihui-he/KL-Loss/releases/download/models/faster2x_log.pkl'
    assert cache_url(url, str(tmp_path)) == str(expected)
    assert expected.read_bytes() == b'weights'
    assert os.listdir(expected.parent) == ['faster2x_log.pkl']
    assert cache_url(url, str(tmp_path)) == str(expected)
    assert calls == [url]


def test_cache_url_offline_error_names_url_and_local_path(tmp_path):
    url = 'http://127.0.0.1:9/x.pkl'
    local = str(tmp_path / '127.0.0.1:9' / 'x.pkl')
    with pytest.raises(WeightsError) as err:
        cache_url(url, str(tmp_path))
    message = str(err.value)
    assert 'could not download {}'.format(url) in message
    assert message.endswith('place it at {}'.format(local))
    assert os.listdir(tmp_path / '127.0.0.1:9') == []


def test_cache_url_refuses_paths_leaving_the_cache(tmp_path):
    with pytest.raises(WeightsError, match='inside the download cache'):
        cache_url('https://example.com/../../etc/passwd', str(tmp_path))
