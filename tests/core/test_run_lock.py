"""The run lock of an output directory, with a real second process holding it."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from detectron.core.run_lock import LOCK_NAME, RunLock, exclusive_run
from detectron.utils.errors import OutputDirError, run_tool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HOLDER = textwrap.dedent('''
    import sys, time
    from detectron.core.run_lock import RunLock
    lock = RunLock(sys.argv[1])
    lock.acquire()
    print('locked', flush=True)
    time.sleep(600)
''')


@pytest.fixture
def holder(tmp_path):
    """A live run holding the lock of tmp_path / 'out' (killed with SIGKILL at the end)."""
    directory = tmp_path / 'out'
    directory.mkdir()
    process = subprocess.Popen([sys.executable, '-c', HOLDER, str(directory)], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=REPO))
    assert process.stdout.readline() == 'locked\n'
    yield process, directory
    process.kill()
    process.wait()


def test_a_second_run_on_a_live_directory_is_refused_with_one_line(holder, capsys):
    process, directory = holder
    with pytest.raises(SystemExit) as exit_info:
        run_tool(lambda argv: RunLock(str(directory)).acquire(), [])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count('\n') == 1
    assert error.startswith('error: {} is in use by another training run (PID {} on host {}, started '.format(
        directory, process.pid, socket.gethostname()))
    assert error.endswith('); wait for it to end or stop it, or set another OUTPUT_DIR\n')
    assert process.poll() is None  # the refused run did not disturb the live one


@pytest.mark.processes
def test_the_lock_of_a_killed_run_is_taken_over_with_a_warning(holder, caplog):
    process, directory = holder
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert os.path.exists(directory / LOCK_NAME)  # a killed run cannot clean up
    with caplog.at_level(logging.WARNING, logger='detectron.core.run_lock'):
        with RunLock(str(directory)):
            assert 'a run that is no longer running (PID {} on host'.format(process.pid) in caplog.text
            assert json.loads((directory / LOCK_NAME).read_text())['pid'] == os.getpid()
            with pytest.raises(OutputDirError, match='PID {} '.format(os.getpid())):
                RunLock(str(directory)).acquire()  # a second lock in this process is refused too
    assert not os.path.exists(directory / LOCK_NAME)  # released cleanly: removed
    with RunLock(str(directory)):  # and free again, without a warning
        pass
    assert caplog.text.count('Taking over') == 1


def test_exclusive_run_locks_and_cleans_on_rank_0_only(tmp_path, monkeypatch):
    stale = tmp_path / 'model_iter9.pth.tmp.{}'.format('ab' * 16)
    stale.write_bytes(b'half a checkpoint')
    monkeypatch.setenv('RANK', '1')
    for name, value in (('WORLD_SIZE', '2'), ('LOCAL_RANK', '1'), ('MASTER_ADDR', 'h'), ('MASTER_PORT', '1')):
        monkeypatch.setenv(name, value)
    with exclusive_run(str(tmp_path)):
        assert os.listdir(tmp_path) == [stale.name]
    monkeypatch.setenv('RANK', '0')
    with exclusive_run(str(tmp_path)):
        assert os.listdir(tmp_path) == [LOCK_NAME]
    assert os.listdir(tmp_path) == []


def test_an_output_dir_that_is_a_file_is_one_output_dir_error(tmp_path):
    (tmp_path / 'file').write_text('')
    with pytest.raises(OutputDirError, match='cannot create the run lock .*file/run.lock .*Not a directory'):
        RunLock(str(tmp_path / 'file')).acquire()
