"""Saves interrupted by a signal or a full disk, and loader workers stopped by a signal, in real
processes: one `error:` line, the shell's exit status, no partial file left.

The full disk is a real one: a small tmpfs mounted in a private mount namespace (`unshare -m`), so
the test needs to be allowed to mount (root, or user namespaces); elsewhere it is skipped."""
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from detectron.checkpoint.torch_file import read_torch_file
from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.utils.errors import JobInterrupted, as_loader_worker_error
from support.tiny_runs import SHAPES_CFG, TINY_OVERRIDES, use_tiny_config, write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENV = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1')
STOPPED = 'error: stopped by {}; all worker processes were stopped (a training run resumes from its last checkpoint ' \
          'when started again)'
NO_SPACE = 'error: could not write {} (No space left on device); free space on that disk or set OUTPUT_DIR to one ' \
           'with room'


def _can_mount_a_tmpfs():
    try:
        return subprocess.run(['unshare', '-m', 'sh', '-c', 'mount -t tmpfs -o size=64k tmpfs /mnt'],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_tmpfs = pytest.mark.skipif(not _can_mount_a_tmpfs(),
                                 reason='mounting a small tmpfs (unshare -m) is not allowed on this machine')


_LISTING = '--- left on the disk:'


def _on_a_small_disk(directory, size, command, listed=None):
    """Run command (argv) with a tmpfs of `size` mounted on directory in a private mount namespace;
    returns (exit status, stderr, the names left in `listed`, by default directory)."""
    script = 'mount -t tmpfs -o size={} tmpfs "$0" && "$@"; rc=$?; echo {}; ls -a {}; exit $rc'.format(
        size, _LISTING, listed or '"$0"')
    out = subprocess.run(['unshare', '-m', 'sh', '-c', script, str(directory)] + command, capture_output=True,
                         text=True, env=ENV, timeout=120)
    left = out.stdout.rpartition(_LISTING)[2].split()
    return out.returncode, out.stderr, sorted(set(left) - {'.', '..'})


@pytest.mark.processes
@needs_tmpfs
def test_a_real_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path):
    disk = tmp_path / 'disk'
    disk.mkdir()
    saves = textwrap.dedent('''
        import sys, torch
        from detectron.checkpoint import checkpointer
        from detectron.checkpoint.torch_file import read_torch_file
        from detectron.utils import errors
        def main(argv):
            for iteration, width in ((0, 16), (1, 1024)):  # 1 KB, then 4 MB on a 1 MB disk
                model = torch.nn.Linear(width, width)
                checkpointer.save_checkpoint('{0}/model_iter%d.pth' % iteration, model,
                                             torch.optim.SGD(model.parameters(), 0.1), iteration)
        try:
            errors.run_tool(main, [])
        finally:
            read_torch_file('{0}/model_iter0.pth')  # still intact
    ''').format(disk)
    status, stderr, left = _on_a_small_disk(disk, '1m', [sys.executable, '-c', saves])
    assert status == 2
    assert stderr.strip().splitlines() == [NO_SPACE.format(disk / 'model_iter1.pth')]
    assert left == ['model_iter0.pth']


@pytest.fixture(scope='module')
def tiny_catalog(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('small_disk'))


@pytest.fixture
def tiny_test_set(tiny_catalog):
    """(catalog, a randomly initialised tiny R-CNN's weights, written once): ~300 boxes, a 24 KB
    detections.pkl and an 89 KB results json. Function scope: the cfg it sets is restored after the test."""
    weights = tiny_catalog.parent / 'weights.pth'
    if not weights.exists():
        use_tiny_config(tiny_catalog, tiny_catalog.parent / 'unused')
        torch.manual_seed(0)
        torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    return tiny_catalog, weights


@pytest.mark.processes
@needs_tmpfs
def test_test_net_onto_a_full_disk_is_one_line_and_leaves_no_truncated_results_file(tmp_path, tiny_test_set):
    catalog, weights = tiny_test_set
    out = tmp_path / 'out'
    out.mkdir()
    command = [sys.executable, os.path.join(REPO, 'tools', 'test_net.py'), '--cfg', SHAPES_CFG] + TINY_OVERRIDES + [
        'DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(out), 'TEST.WEIGHTS', str(weights),
        'TEST.DATASETS', "('tiny_val',)"]
    # The detections.pkl fits in 64 KB, the results json does not.
    results = out / 'test' / 'tiny_val' / 'generalized_rcnn' / 'bbox_tiny_val_results.json'
    status, stderr, left = _on_a_small_disk(out, '64k', command, listed=results.parent)
    assert status == 2
    assert 'Traceback' not in stderr
    assert stderr.strip().splitlines()[-1] == NO_SPACE.format(results)
    assert left == ['detections.pkl']


# ---------------------------------------------------------------------------------------------
# SIGTERM / Ctrl-C while a checkpoint is written
# ---------------------------------------------------------------------------------------------

# Imports torch once, then forks one process per try (fast repeated tries): each saves a checkpoint
# of 300 small tensors (most of a save's time is then torch.save's per-tensor Python work, where a
# signal used to give two tracebacks) over and over with save_checkpoint under errors.run_tool.
_FORKING_SAVER = textwrap.dedent('''
    import os, sys, torch
    from detectron.checkpoint import checkpointer
    from detectron.utils import errors
    def save_forever(path):
        model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(150)])
        optimizer = torch.optim.SGD(model.parameters(), 0.1)
        for iteration in range(10 ** 6):
            checkpointer.save_checkpoint(path, model, optimizer, iteration)
            if iteration == 0:
                print('saved', flush=True)
    for line in sys.stdin:
        path, stderr_path = line.split()
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(stderr_path, os.O_WRONLY | os.O_CREAT), 2)
            try:
                errors.run_tool(lambda argv: save_forever(path), [])
            except SystemExit as done:
                os._exit(done.code)
            os._exit(0)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
''')


def _line_within(saver, pid, seconds, what):
    """The saver's next line; a try whose process has not stopped after `seconds` is killed and the
    test fails saying so (a signal that did not stop the save must not hang the suite)."""
    ready, _, _ = select.select([saver.stdout], [], [], seconds)
    if not ready:
        os.kill(pid, signal.SIGKILL)
        pytest.fail('the saving process {} did not stop within {} s of {}'.format(pid, seconds, what))
    return saver.stdout.readline()


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize('sig, tries', [(signal.SIGTERM, 6), (signal.SIGINT, 4)])
def test_a_signal_while_a_checkpoint_is_written_is_one_line_and_leaves_the_last_checkpoint(tmp_path, sig, tries):
    saver = subprocess.Popen([sys.executable, '-c', _FORKING_SAVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=ENV)
    rng = random.Random(sig)
    try:
        for attempt in range(tries):
            path, stderr_path = tmp_path / 'model_iter.pth', tmp_path / 'stderr{}'.format(attempt)
            saver.stdin.write('{} {}\n'.format(path, stderr_path))
            saver.stdin.flush()
            pid = int(saver.stdout.readline())
            assert saver.stdout.readline().strip() == 'saved'
            time.sleep(rng.uniform(0.0, 0.2))
            os.kill(pid, sig)
            assert int(_line_within(saver, pid, 60, sig.name)) == 128 + sig
            assert stderr_path.read_text().strip().splitlines() == [STOPPED.format(sig.name)]
            assert not any('.tmp.' in name for name in os.listdir(tmp_path))
            assert read_torch_file(str(path))['iteration'] >= 0  # complete, its digest matches
    finally:
        saver.stdin.close()
        saver.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# Loader workers and SIGTERM / Ctrl-C
# ---------------------------------------------------------------------------------------------

_READING = textwrap.dedent('''
    import functools, sys, time
    from detectron.roi_data.loader import build_test_loader
    from detectron.utils import errors
    def slow(im):
        time.sleep(0.05)
        return {{'image': im}}
    def main(argv):
        roidb = [{{'image': '{}'}}] * 1000
        for i, _ in enumerate(build_test_loader(roidb, range(1000), 2, slow)):
            if i == 0:
                print('reading', flush=True)
    errors.run_tool(main, [])
''')


@pytest.mark.processes
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_process_group_stops_the_job_with_one_line(tiny_test_set, sig):
    # What a shell's Ctrl-C, a scheduler or torchrun's agent does: the loader workers get the signal too.
    image = tiny_test_set[0].parent / 'images' / 'im0.png'
    job = subprocess.Popen([sys.executable, '-c', _READING.format(image)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        assert job.stdout.readline().strip() == 'reading'
        os.killpg(job.pid, sig)
        _, stderr = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 128 + sig, stderr
    assert stderr.strip().splitlines() == [STOPPED.format(sig.name)], stderr


@pytest.mark.processes
def test_torch_s_dead_worker_errors_of_a_stopped_job_are_the_stop():
    stopped = JobInterrupted(signal.SIGTERM)
    waited = RuntimeError('DataLoader worker (pid(s) 12) exited unexpectedly')
    waited.__cause__ = stopped  # torch's _try_get_data: raise RuntimeError(...) from the error of its wait
    assert as_loader_worker_error(waited) is stopped
    for name, sig in (('Terminated', signal.SIGTERM), ('Interrupt', signal.SIGINT)):
        translated = as_loader_worker_error(RuntimeError('DataLoader worker (pid 12) is killed by signal: {}. '
                                                         .format(name)))
        assert isinstance(translated, JobInterrupted) and translated.exit_status == 128 + sig
    killed = as_loader_worker_error(RuntimeError('DataLoader worker (pid 12) is killed by signal: Killed. '))
    assert str(killed) == ('DataLoader worker (pid 12) is killed by signal: Killed (the out-of-memory killer, see '
                           'dmesg, or a kill); lower DATA_LOADER.NUM_THREADS if memory is short')
