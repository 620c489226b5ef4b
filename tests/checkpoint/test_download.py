import hashlib
import http.server
import os
import threading
import time
import urllib.request

import pytest

from detectron.checkpoint import download
from detectron.checkpoint.download import cache_url
from detectron.utils.errors import WeightsError

WEIGHTS = bytes(range(256)) * 40  # 10240 bytes; starts with b'\x00', like no web page


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


class _WeightsServer:
    """A real HTTP server on 127.0.0.1 in a thread, serving `routes` (path -> (behaviour, body)):
    'whole' sends the body with its Content-Length; 'cut' announces the body's length, sends a third
    of it and closes; 'page' sends the body as text/html with status 200; ('trickle', s) announces the
    body and sends 1 byte every s seconds. Other paths are 404. It stops by itself: handler threads are
    daemons whose waits end when the test ends (stop), each handler's socket times out after 10 s, and
    no trickle runs longer than 20 s."""

    def __init__(self, routes):
        self.requests = []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                if self.path not in routes:
                    self.send_error(404)
                    return
                behaviour, body = routes[self.path]
                self.send_response(200)
                self.send_header('Content-Type', 'text/html; charset=utf-8' if behaviour == 'page'
                                 else 'application/octet-stream')
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                if behaviour in ('whole', 'page'):
                    self.wfile.write(body)
                elif behaviour == 'cut':
                    self.wfile.write(body[:len(body) // 3])
                    self.wfile.flush()
                    self.close_connection = True
                else:
                    interval = behaviour[1]
                    end = time.monotonic() + 20
                    try:
                        for byte in body:
                            if server.stop.wait(interval) or time.monotonic() > end:
                                return
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                    except OSError:  # the client gave up
                        return

        self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.httpd.daemon_threads = True
        self.base = 'http://127.0.0.1:{}'.format(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={'poll_interval': 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def serve():
    servers = []

    def start(routes):
        servers.append(_WeightsServer(routes))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def _files_under(directory):
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, _, names in os.walk(directory) for name in names)


def _md5(data):
    return hashlib.md5(data).hexdigest()


def test_a_good_download_is_checked_cached_and_reused_without_a_second_request(tmp_path, serve):
    server = serve({'/models/R-50.pkl': ('whole', WEIGHTS),
                    '/models/R-50.pkl.md5sum': ('whole', '{}  R-50.pkl\n'.format(_md5(WEIGHTS)).encode())})
    url = server.base + '/models/R-50.pkl'
    host = server.base[len('http://'):]
    path = cache_url(url, str(tmp_path))
    assert path == str(tmp_path / host / 'models' / 'R-50.pkl')
    with open(path, 'rb') as f:
        assert f.read() == WEIGHTS
    assert cache_url(url, str(tmp_path)) == path
    assert server.requests == ['/models/R-50.pkl.md5sum', '/models/R-50.pkl']
    assert _files_under(tmp_path) == [os.path.join(host, 'models', 'R-50.pkl')]


def test_a_host_without_md5_files_is_checked_by_length(tmp_path, serve):
    server = serve({'/w.pth': ('whole', WEIGHTS)})
    path = cache_url(server.base + '/w.pth', str(tmp_path))
    with open(path, 'rb') as f:
        assert f.read() == WEIGHTS
    assert server.requests == ['/w.pth.md5sum', '/w.pth']


def _refused(url, cache_dir, *fragments):
    """cache_url(url) is one WeightsError line naming the URL, the reason and the cache path, and
    leaves no file in the cache; a second call asks the server again (nothing was cached)."""
    path = download.url_cache_path(url, cache_dir)
    for _ in range(2):
        with pytest.raises(WeightsError) as err:
            cache_url(url, cache_dir)
        message = str(err.value)
        assert '\n' not in message
        assert message.startswith('could not download {} ('.format(url))
        assert message.endswith('nothing was kept in the download cache; download it yourself and place it '
                                'at {}'.format(path))
        for fragment in fragments:
            assert fragment in message, message
        assert _files_under(cache_dir) == []
    return message


def test_a_server_closing_after_a_third_of_its_content_length_caches_nothing(tmp_path, serve):
    """Was: the short body cached as the weights file, and every later run failed on it ('not a readable
    weights pickle (truncated)')."""
    server = serve({'/cut.pkl': ('cut', WEIGHTS)})
    _refused(server.base + '/cut.pkl', str(tmp_path),
             'the server closed the connection after 3413 of the 10240 bytes its Content-Length announced')
    assert server.requests == ['/cut.pkl.md5sum', '/cut.pkl'] * 2


@pytest.mark.parametrize('page', [b'<!DOCTYPE html>\n<html><body>Sign in</body></html>',
                                  b'\n  <html><head><title>Not found</title></head></html>'])
def test_an_html_page_served_with_status_200_is_not_cached_as_weights(tmp_path, serve, page):
    server = serve({'/R-50.pkl': ('page', page)})
    _refused(server.base + '/R-50.pkl', str(tmp_path),
             'the server sent a web page (status 200, Content-Type text/html; charset=utf-8) where a weights '
             'file was expected')


def test_a_download_whose_md5_differs_from_its_md5sum_file_is_refused(tmp_path, serve):
    server = serve({'/w.pkl': ('whole', WEIGHTS), '/w.pkl.md5sum': ('whole', _md5(b'other').encode())})
    url = server.base + '/w.pkl'
    _refused(url, str(tmp_path), 'its md5 {} is not the {} that {}.md5sum gives'.format(
        _md5(WEIGHTS), _md5(b'other'), url))


def test_detectron_s_bucket_requires_its_md5sum_file_as_detectron_does(tmp_path, serve, monkeypatch):
    server = serve({'/detectron/ImageNetPretrained/MSRA/R-50.pkl': ('whole', WEIGHTS)})
    monkeypatch.setattr(download, 'DETECTRON_BASE_URL', server.base + '/detectron')
    url = server.base + '/detectron/ImageNetPretrained/MSRA/R-50.pkl'
    _refused(url, str(tmp_path), 'its md5 file {}.md5sum'.format(url), 'HTTP 404')
    # Only the md5 file was asked for: the weights are not downloaded without their reference.
    assert server.requests == ['/detectron/ImageNetPretrained/MSRA/R-50.pkl.md5sum'] * 2
    # The same bucket with its md5 file: downloaded, checked, cached under Detectron's layout.
    server = serve({'/detectron/ImageNetPretrained/MSRA/R-50.pkl': ('whole', WEIGHTS),
                    '/detectron/ImageNetPretrained/MSRA/R-50.pkl.md5sum': ('whole', _md5(WEIGHTS).encode())})
    monkeypatch.setattr(download, 'DETECTRON_BASE_URL', server.base + '/detectron')
    url = server.base + '/detectron/ImageNetPretrained/MSRA/R-50.pkl'
    path = cache_url(url, str(tmp_path))
    assert path == str(tmp_path / 'ImageNetPretrained' / 'MSRA' / 'R-50.pkl')
    assert _files_under(tmp_path) == [os.path.join('ImageNetPretrained', 'MSRA', 'R-50.pkl')]


@pytest.mark.parametrize('interval_s', [0.25, 5])
def test_a_trickling_server_meets_the_overall_deadline(tmp_path, serve, monkeypatch, interval_s):
    """1 byte every interval_s: each read gets data (or waits less than the 60 s idle timeout), so only
    the overall deadline ends it; here 1 s, set by the environment variable."""
    server = serve({'/slow.pkl': (('trickle', interval_s), WEIGHTS)})
    monkeypatch.setenv('DETECTRON_DOWNLOAD_DEADLINE_S', '1')
    started = time.monotonic()
    with pytest.raises(WeightsError) as err:
        cache_url(server.base + '/slow.pkl', str(tmp_path))
    assert time.monotonic() - started < 4  # well before the 5 s wait for a next byte; slack for a loaded machine
    assert 'not complete within the download deadline of 1 s (' in str(err.value)
    assert 'of 10240 bytes received); set DETECTRON_DOWNLOAD_DEADLINE_S to allow longer' in str(err.value)
    assert _files_under(tmp_path) == []


def test_an_unusable_deadline_setting_is_one_line(tmp_path, monkeypatch):
    _forbid_network(monkeypatch)
    monkeypatch.setenv('DETECTRON_DOWNLOAD_DEADLINE_S', 'soon')
    with pytest.raises(WeightsError, match="^DETECTRON_DOWNLOAD_DEADLINE_S must be a number of seconds > 0, "
                                           "got 'soon'$"):
        cache_url('https://example.com/w.pkl', str(tmp_path))
