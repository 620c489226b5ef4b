"""OUTPUT_DIR/log.txt (the KL-Loss guide's `tail -f /path/to/output/log.txt`): train_net's whole log,
appended across a failed run and its resume, each start marked with its command; other ranks' errors."""
import logging
import re
import shlex
import sys

import pytest

from detectron.core import launch
from detectron.core.config import cfg
from detectron.modeling import fast_rcnn_heads
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, run_tool
from detectron.utils.logging import log_file
from support.out_of_memory import out_of_memory_from_call
from support.tiny_runs import SHAPES_CFG, TINY_OVERRIDES, TRAIN_SUBDIR, write_tiny_datasets
from support.tools import load_tool

_STAMP = r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d '


@pytest.fixture(autouse=True)
def tools_stdout_handler_removed():
    """train_net's setup_logging gives the root logger a handler on this test's captured stdout,
    which is closed after it: later tests must not write there."""
    yield
    root = logging.getLogger()
    for handler in root.handlers[:]:
        if type(handler) is logging.StreamHandler:
            root.removeHandler(handler)


@pytest.mark.usefixtures('on_the_cpu')  # the error line names the CPU
def test_train_net_log_is_appended_across_a_failure_and_the_resume(tmp_path, monkeypatch, capsys):
    catalog = write_tiny_datasets(tmp_path)
    output_dir = tmp_path / 'out'
    argv = ['--cfg', SHAPES_CFG, '--skip-test'] + TINY_OVERRIDES + [
        'SOLVER.MAX_ITER', '3', 'DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(output_dir)]
    monkeypatch.setattr(sys, 'argv', ['tools/train_net.py'] + argv)
    # Iteration 2 (one call per iteration) runs out of memory, after model_iter1.pth.
    real_losses = out_of_memory_from_call(monkeypatch, fast_rcnn_heads, 'fast_rcnn_losses', 2)
    with pytest.raises(SystemExit):
        run_tool(load_tool('train_net.py').main, argv)
    error = capsys.readouterr().err.strip()
    assert error.startswith('error: out of memory at iteration 2 on rank 0 (cpu)')
    monkeypatch.setattr(fast_rcnn_heads, 'fast_rcnn_losses', real_losses)
    cfg.defrost()  # the second run merges the same file and overrides again
    run_tool(load_tool('train_net.py').main, argv)  # resumes and finishes

    lines = (output_dir / 'log.txt').read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('=== started ')]
    assert len(starts) == 2 and starts[0] == 0
    command = shlex.join(['tools/train_net.py'] + argv)
    for i in starts:
        assert re.fullmatch(r'=== started \S+ \(PID \d+ on \S+\): (.*)', lines[i]).group(1) == command
    first, second = lines[:starts[1]], lines[starts[1]:]
    # The first run: its schedule, its logged iteration, its checkpoint and its error line, as printed.
    assert re.fullmatch(_STAMP + r'INFO train_net.py: +\d+: images per iteration: 2 .*', first[1])
    assert [_iteration(line) for line in first if line.startswith('json_stats: ')] == [0]
    assert any(line.endswith('Wrote checkpoint {}'.format(output_dir / TRAIN_SUBDIR / 'model_iter1.pth'))
               for line in first)
    assert first[-1] == error
    # The second: resumed from that checkpoint, logged its last iteration and wrote model_final.pth.
    assert any(line.endswith('Resuming from checkpoint {}'.format(output_dir / TRAIN_SUBDIR / 'model_iter1.pth'))
               for line in second)
    assert [_iteration(line) for line in second if line.startswith('json_stats: ')] == [2]
    assert second[-1].endswith('Wrote checkpoint {}'.format(output_dir / TRAIN_SUBDIR / 'model_final.pth'))
    assert all(re.match(_STAMP + '(INFO|WARNING|ERROR) ', line) or line.startswith(('json_stats: ', '=== ', 'error: '))
               for line in lines)


def _iteration(json_stats_line):
    return int(re.search(r'"iter": (\d+)', json_stats_line).group(1))


def test_other_ranks_write_their_errors_only_after_their_rank(tmp_path):
    logger = logging.getLogger('detectron.some_module')
    with pytest.raises(ConfigValueError):
        with log_file(str(tmp_path), rank=1):
            logger.info('every rank says this')
            logger.error('only errors of rank 1 reach the file')
            raise ConfigValueError('a bad value\non two lines')
    with log_file(str(tmp_path), rank=0, command=['tools/test_net.py', 'TEST.WEIGHTS', 'a b.pth']):
        logger.info('rank 0 writes everything')
    lines = (tmp_path / 'log.txt').read_text().splitlines()
    assert len(lines) == 4
    assert re.fullmatch('rank 1: ' + _STAMP + r'ERROR test_log_file.py: +\d+: only errors of rank 1 reach the file',
                        lines[0])
    assert lines[1] == 'rank 1: error: a bad value on two lines'
    assert lines[2].startswith('=== started ') and lines[2].endswith(": tools/test_net.py TEST.WEIGHTS 'a b.pth'")
    assert re.fullmatch(_STAMP + r'INFO test_log_file.py: +\d+: rank 0 writes everything', lines[3])
    # Outside the blocks nothing is written, and the handler is gone.
    logger.error('after the block')
    assert len((tmp_path / 'log.txt').read_text().splitlines()) == 4


def test_an_unexpected_error_is_written_with_its_traceback(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with log_file(str(tmp_path), rank=0):
            1 / 0
    text = (tmp_path / 'log.txt').read_text()
    assert text.startswith('error: Traceback (most recent call last):\n')
    assert text.rstrip().endswith('ZeroDivisionError: division by zero')


def _rank_1_fails(output_dir):
    with log_file(output_dir, comm.get_rank()):
        logging.getLogger('detectron.some_module').info('rank %d started', comm.get_rank())
        if comm.get_rank() == 1:
            raise ConfigValueError('a value only rank 1 reads is bad')
        comm.synchronize()  # rank 0 waits for rank 1, which never comes


@pytest.mark.slow
@pytest.mark.processes
def test_a_spawned_rank_writes_its_error_line(tmp_path):
    with pytest.raises(ConfigValueError, match='^rank 1: a value only rank 1 reads is bad$'):
        launch.launch(_rank_1_fails, 2, args=(str(tmp_path),), device='cpu')
    lines = (tmp_path / 'log.txt').read_text().splitlines()
    # Rank 1: its error line alone (not its INFO line); rank 0: its INFO line (and, when the lost peer
    # reaches it before the watcher's SIGTERM, its own error with the traceback).
    assert [line for line in lines if line.startswith('rank 1: ')] == [
        'rank 1: error: a value only rank 1 reads is bad']
    started = re.compile(_STAMP + r'INFO test_log_file.py: +\d+: rank 0 started')
    assert len([line for line in lines if started.fullmatch(line)]) == 1
    assert not any('rank 1 started' in line for line in lines)
