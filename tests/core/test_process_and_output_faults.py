"""Process lifetime and run outputs (docs/RELIABILITY.md, "Processes and outputs"): a SIGKILLed torchrun agent,
launcher variables that are not numbers, a rank's error before the first collective, stalled image reads,
resuming past SOLVER.MAX_ITER, AUTO_RESUME False over an earlier run, stale mask results, --range with
parallel testing, infer_simple on a folder with an unreadable image, weights paths that are directories
and refused pickles. Real tool runs (subprocesses) where a real run is what failed."""
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import cv2
import numpy as np
import pytest

from detectron.checkpoint import c2_weights, checkpointer, torch_file
from detectron.datasets import json_dataset_evaluator, task_evaluation
from detectron.datasets.json_dataset import JsonDataset
from detectron.utils.errors import LaunchError, WeightsError
from detectron.utils import launcher_env

from support.processes import (DEADLINE_S, alive, descendants, job_env, session_processes, survivors_after,
                               wait_for_files)
from support.tiny_runs import REPO, SHAPES_CFG, TINY_OVERRIDES, TRAIN_SUBDIR, write_tiny_datasets

pytestmark = [pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc, FIFOs, parent-death signals'),
              pytest.mark.usefixtures('private_dataset_registrations')]


def _tool_command(tool, catalog, output_dir, *overrides):
    return ([sys.executable, os.path.join(REPO, 'tools', tool), '--cfg', SHAPES_CFG] + TINY_OVERRIDES
            + ['DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(output_dir)] + [str(o) for o in overrides])


def _one_error_line(command, env=None, timeout=300):
    """Run a tool in its own session; assert exit 2, no traceback, one `error:` line last, nothing left
    running DEADLINE_S later; return the line."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env or job_env(), start_new_session=True)
    try:
        _, err = process.communicate(timeout=timeout)
        left = survivors_after(session_processes(process.pid), DEADLINE_S)
    finally:
        for pid in session_processes(process.pid):
            os.kill(pid, signal.SIGKILL)
    assert left == [], left
    assert process.returncode == 2, err
    assert 'Traceback' not in err, err
    errors = [line for line in err.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    return errors[0]


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('tiny'))


@pytest.fixture(scope='module')
def trained(tiny, tmp_path_factory):
    """A finished 4-iteration run: model_iter1.pth, model_iter3.pth, model_final.pth."""
    output_dir = tmp_path_factory.mktemp('trained')
    done = subprocess.run(_tool_command('train_net.py', tiny, output_dir, '--skip-test'), env=job_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return output_dir / TRAIN_SUBDIR


# --- processes ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.processes
def test_a_sigkilled_torchrun_agent_takes_its_ranks_and_loader_workers_with_it(tiny, tmp_path):
    output_dir = tmp_path / 'out'
    agent = subprocess.Popen(
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2']
        + _tool_command('train_net.py', tiny, output_dir, '--skip-test', 'SOLVER.MAX_ITER', 10 ** 6,
                        'DATA_LOADER.NUM_THREADS', 1, 'DIST_BACKEND', 'gloo')[1:],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=job_env(), start_new_session=True)
    job = []
    try:
        wait_for_files(output_dir / TRAIN_SUBDIR, ['model_iter1.pth'], agent, timeout=240)
        job = descendants(agent.pid)
        assert len(job) >= 4, job  # 2 ranks, each with its loader worker
        agent.kill()
        agent.wait(timeout=5)
        assert survivors_after(job, DEADLINE_S) == []
    finally:  # the ranks run in sessions of their own (torchrun's start_new_session)
        for pid in descendants(agent.pid) + job + [agent.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_die_with_torchrun_agent_is_only_for_torchrun_ranks(monkeypatch):
    from detectron.utils import lifetime
    monkeypatch.delenv('TORCHELASTIC_RUN_ID', raising=False)
    assert lifetime.die_with_torchrun_agent() is False  # started by hand or a script: no parent-death signal


@pytest.mark.processes
def test_a_launched_rank_whose_parent_already_died_ends_itself(tmp_path):
    """The race the check after prctl closes: an agent that died before the rank asked for the signal."""
    script = tmp_path / 'orphan.py'
    script.write_text(textwrap.dedent('''
        import os, sys, time
        import detectron
        detectron.PARENT_PID_AT_START = -1  # as if the agent had died before this point
        from detectron.utils.lifetime import die_with_torchrun_agent
        die_with_torchrun_agent()
        time.sleep(30)
        print('survived')
    '''))
    done = subprocess.run([sys.executable, str(script)], env=dict(job_env(), TORCHELASTIC_RUN_ID='x'),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and 'survived' not in done.stdout


@pytest.mark.parametrize('variables, named', [
    ({'RANK': 'abc', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0'}, "RANK='abc'"),
    ({'RANK': '0', 'WORLD_SIZE': 'two', 'LOCAL_RANK': '0'}, "WORLD_SIZE='two'"),
    ({'RANK': '2', 'WORLD_SIZE': '2', 'LOCAL_RANK': '0'}, 'RANK=2, WORLD_SIZE=2'),
])
def test_launcher_variables_that_are_not_a_rank_are_one_launch_error(variables, named):
    environ = dict(variables, MASTER_ADDR='127.0.0.1', MASTER_PORT='29500')
    with pytest.raises(LaunchError, match=named.replace('(', r'\(')):
        launcher_env.job_from_environment(environ)
    with pytest.raises(LaunchError, match="SLURM_NTASKS='x'"):
        launcher_env.job_from_environment({'SLURM_NTASKS': 'x'})


@pytest.mark.processes
def test_train_net_under_rank_abc_is_one_error_line(tiny, tmp_path):
    env = dict(job_env(), RANK='abc', WORLD_SIZE='2', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1', MASTER_PORT='29500')
    line = _one_error_line(_tool_command('train_net.py', tiny, tmp_path, '--skip-test'), env=env, timeout=120)
    assert line.startswith("error: environment variable RANK='abc' is not an integer"), line


RANK_ERROR_SCRIPT = textwrap.dedent('''
    import sys
    from detectron.core import launch
    from detectron.utils import comm
    from detectron.utils.errors import DatasetError, run_tool

    def work(failing):
        if comm.get_rank() == failing:  # before the first collective of main_fn; the other rank waits in one
            raise DatasetError('bad input seen by rank {}'.format(failing))
        comm.synchronize()

    if __name__ == '__main__':
        run_tool(lambda argv: launch.launch(work, 2, args=(int(argv[0]),), device='cpu'), sys.argv[1:])
''')


@pytest.mark.processes
@pytest.mark.parametrize('failing', [0, 1])
def test_a_rank_s_error_before_the_first_collective_is_one_line(tmp_path, failing):
    script = tmp_path / 'job.py'
    script.write_text(RANK_ERROR_SCRIPT)
    line = _one_error_line([sys.executable, str(script), str(failing)], timeout=120)
    assert line == 'error: rank {0}: bad input seen by rank {0}'.format(failing)


@pytest.fixture(scope='module')
def stalled(tmp_path_factory):
    """The tiny datasets with every image a FIFO nobody writes: a read that never finishes (a stalled mount)."""
    root = tmp_path_factory.mktemp('stalled')
    catalog = write_tiny_datasets(root)
    for image in (root / 'images').iterdir():
        image.unlink()
        os.mkfifo(image)
    return catalog


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
def test_a_stalled_image_read_ends_in_one_line_naming_it_and_nothing_left_running(stalled, trained, tmp_path, tool):
    extra = ['--skip-test'] if tool == 'train_net.py' else ['TEST.WEIGHTS', trained / 'model_final.pth']
    started = time.monotonic()
    line = _one_error_line(_tool_command(tool, stalled, tmp_path / 'out', *extra, 'DATA_LOADER.NUM_THREADS', 1,
                                         'DATA_LOADER.TIMEOUT_S', 2))
    assert time.monotonic() - started < 120
    assert line.startswith('error: DataLoader worker 0 (pid '), line
    assert 'delivered no batch in 2 s (DATA_LOADER.TIMEOUT_S); the batch it owes holds {}'.format(
        stalled.parent / 'images' / 'im') in line, line


# --- runs and outputs ---------------------------------------------------------------------------

def _copy_run(trained, tmp_path, keep):
    output_dir = tmp_path / 'out'
    os.makedirs(output_dir / TRAIN_SUBDIR)
    for name in keep:
        shutil.copy(trained / name, output_dir / TRAIN_SUBDIR / name)
    return output_dir


@pytest.mark.slow
@pytest.mark.processes
def test_resuming_a_checkpoint_past_max_iter_is_refused(tiny, trained, tmp_path):
    output_dir = _copy_run(trained, tmp_path, ['model_iter1.pth', 'model_iter3.pth'])
    line = _one_error_line(_tool_command('train_net.py', tiny, output_dir, '--skip-test', 'SOLVER.MAX_ITER', 3))
    assert line == ('error: {} holds iteration 3, past SOLVER.MAX_ITER 3 (iterations 0 to 2): there is nothing left to '
                    'train and model_final.pth would hold later weights than it says; raise SOLVER.MAX_ITER above 3 to '
                    'continue that run, or set another OUTPUT_DIR to start a new one'.format(
                        output_dir / TRAIN_SUBDIR / 'model_iter3.pth'))
    assert not (output_dir / TRAIN_SUBDIR / 'model_final.pth').exists()


@pytest.mark.slow
@pytest.mark.processes
def test_auto_resume_false_over_an_earlier_run_s_checkpoints_is_refused(tiny, trained, tmp_path):
    output_dir = _copy_run(trained, tmp_path, ['model_iter1.pth', 'model_iter3.pth'])
    before = {name: (output_dir / TRAIN_SUBDIR / name).read_bytes() for name in ('model_iter1.pth', 'model_iter3.pth')}
    line = _one_error_line(_tool_command('train_net.py', tiny, output_dir, '--skip-test', 'TRAIN.AUTO_RESUME', 'False'))
    assert line == ('error: {} holds checkpoints of an earlier run (model_iter3.pth, model_iter1.pth) and '
                    'TRAIN.AUTO_RESUME is False: this run would overwrite some and leave the others beside its own; '
                    'set TRAIN.AUTO_RESUME True to resume that run, or set another OUTPUT_DIR, or remove those '
                    'files'.format(output_dir / TRAIN_SUBDIR))
    assert {name: (output_dir / TRAIN_SUBDIR / name).read_bytes() for name in before} == before


def test_a_box_test_removes_the_mask_results_an_earlier_mask_test_left(tiny, tmp_path):
    from detectron.datasets import dataset_catalog
    dataset_catalog.register_catalog_file(str(tiny))
    dataset = JsonDataset('tiny_val')
    stale = [tmp_path / 'segmentations_tiny_val_results.json', tmp_path / 'segmentation_results.pkl']
    for path in stale:  # what a mask test of this dataset wrote into this directory
        path.write_text('[]')
    all_boxes = [[np.zeros((0, 5), np.float32) for _ in range(8)] for _ in range(dataset.num_classes)]
    all_boxes[1][0] = np.array([[10, 10, 30, 30, 0.9]], np.float32)
    task_evaluation.evaluate_all(dataset, all_boxes, str(tmp_path))
    assert [path.exists() for path in stale] == [False, False]
    assert json.loads((tmp_path / 'bbox_tiny_val_results.json').read_text())
    assert json_dataset_evaluator.remove_stale_results(str(tmp_path), 'tiny_val', 'segm') == []


@pytest.mark.processes
def test_range_with_multi_gpu_testing_is_refused(tiny, tmp_path):
    weights = tmp_path / 'never_read.pth'
    weights.write_bytes(b'refused before the weights are read')
    line = _one_error_line(_tool_command('test_net.py', tiny, tmp_path, 'TEST.WEIGHTS', weights, '--range', 0, 2,
                                         '--multi-gpu-testing', 'NUM_GPUS', 2), timeout=120)
    assert line == ('error: --range 0 2 tests one slice of the images in one process and cannot be combined with '
                    '--multi-gpu-testing; drop --range to test every image on all processes, or run one process per '
                    'slice')


@pytest.mark.slow
@pytest.mark.processes
def test_infer_simple_skips_an_unreadable_image_and_fails_at_the_end(tiny, trained, tmp_path):
    folder = tmp_path / 'images'
    folder.mkdir()
    image = np.random.RandomState(0).randint(0, 256, (64, 96, 3)).astype(np.uint8)
    cv2.imwrite(str(folder / 'a.jpg'), image)
    (folder / 'b.jpg').write_bytes(b'not an image')
    cv2.imwrite(str(folder / 'c.jpg'), image)
    command = [sys.executable, os.path.join(REPO, 'tools', 'infer_simple.py'), '--cfg', SHAPES_CFG,
               '--wts', str(trained / 'model_final.pth'), '--output-dir', str(tmp_path / 'vis'), str(folder)
               ] + TINY_OVERRIDES + ['DATASET_CATALOG', str(tiny)]
    done = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert 'Traceback' not in done.stderr, done.stderr
    assert sorted(os.listdir(tmp_path / 'vis')) == ['a.png', 'c.png']  # the image after the bad one too
    assert 'Skipping {}'.format(folder / 'b.jpg') in done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == ('error: 1 of 3 images could not be read and were skipped ({}); the others '
                                            'were written to {}'.format(folder / 'b.jpg', tmp_path / 'vis'))
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    command[command.index('--output-dir') + 1] = str(blocker / 'vis')
    line = _one_error_line(command, timeout=300)
    assert line == 'error: --output-dir {} cannot be used: Not a directory; pass a writable directory'.format(
        blocker / 'vis')


def test_a_weights_path_that_is_a_directory_is_named_a_directory(tmp_path):
    with pytest.raises(WeightsError, match='weights file {} is a directory; set TRAIN.WEIGHTS / TEST.WEIGHTS to a '
                       'weights file in it'.format(tmp_path)):
        c2_weights.require_weights_file(str(tmp_path))
    with pytest.raises(WeightsError, match='{} is a directory, not a weights file'.format(tmp_path)):
        torch_file.read_torch_file(str(tmp_path))
    with pytest.raises(WeightsError, match='checkpoint {} is a directory'.format(tmp_path)):
        checkpointer.load_checkpoint(str(tmp_path), None)


class _RunsCode:
    def __reduce__(self):
        return os.system, ('echo this must never run',)


def test_a_refused_pickle_s_error_names_the_file(tmp_path):
    path = tmp_path / 'evil.pkl'
    with open(path, 'wb') as f:
        pickle.dump({'blobs': {'conv1_w': _RunsCode()}}, f, protocol=2)
    with pytest.raises(WeightsError) as raised:
        c2_weights.read_detectron_pickle(str(path))
    assert str(raised.value) == ('{}: refusing to unpickle posix.system: weights pickles may only hold numpy arrays '
                                 'in plain containers; this file could run code, do not use it'.format(path))
