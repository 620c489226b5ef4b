import io
import os
import pickle
import urllib.request

import numpy as np
import pytest

from detectron.utils.errors import WeightsError
from detectron.utils.io import cache_url, load_object, save_object


def test_save_object_round_trip_with_protocol_2(tmp_path):
    path = tmp_path / 'obj.pkl'
    obj = {'blobs': {'conv1_w': np.arange(6, dtype=np.float32).reshape(2, 3)}, 'cfg': 'A: 1\n'}
    save_object(obj, str(path))
    assert path.read_bytes()[:2] == b'\x80\x02'
    loaded = load_object(str(path))
    assert loaded['cfg'] == 'A: 1\n'
    np.testing.assert_array_equal(loaded['blobs']['conv1_w'], obj['blobs']['conv1_w'])
    assert os.listdir(tmp_path) == ['obj.pkl']


def test_save_object_leaves_no_partial_file_on_error(tmp_path):
    path = tmp_path / 'model.pkl'
    save_object({'version': 1}, str(path))
    # A lambda cannot be pickled: the dump fails after the temporary file was opened.
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_object({'version': 2, 'bad': lambda: None}, str(path))
    assert os.listdir(tmp_path) == ['model.pkl']
    assert load_object(str(path)) == {'version': 1}
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_object({'bad': lambda: None}, str(tmp_path / 'new.pkl'))
    assert os.listdir(tmp_path) == ['model.pkl']


def test_load_object_decodes_python2_strings_as_latin1(tmp_path):
    path = tmp_path / 'py2.pkl'
    # Python 2 protocol-2 pickle of the byte string '\xe9\xff' (SHORT_BINSTRING).
    path.write_bytes(b'\x80\x02U\x02\xe9\xffq\x00.')
    assert load_object(str(path)) == '\xe9\xff'


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
