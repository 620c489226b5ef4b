"""Evaluation during training (TEST.EVAL_PERIOD, TEST.VAL_LOSS_PERIOD, CENTERNET.VAL_INTERVALS) and
model_best.pth: each evaluation equals test_net on that iteration's checkpoint, the best is the best,
evaluating leaves training's own numbers alone, and a run killed during an evaluation repeats it."""
import os
import signal
import subprocess
import sys

import pytest
import torch

from detectron.core import test_engine, train_engine
from detectron.core.config import cfg
from detectron.core.hooks import BestCheckpoint
from detectron.modeling import model_builder
from detectron.checkpoint.torch_file import read_torch_file
from support.tiny_runs import REPO, SHAPES_CFG, TINY_OVERRIDES, TRAIN_SUBDIR, use_centernet, use_tiny_config

EVALUATED = ['SOLVER.MAX_ITER', '6', 'TEST.EVAL_PERIOD', '2', 'TEST.VAL_LOSS_PERIOD', '2']
BOX_METRICS = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl')


pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def runs():
    return {}


def _train(runs, catalog, name, *overrides):
    """train_model in this process once per module and name; returns the training directory."""
    if name not in runs:
        output_dir = catalog.parent / name
        use_tiny_config(catalog, output_dir, *overrides)
        train_engine.train_model()
        runs[name] = str(output_dir / TRAIN_SUBDIR)
    return runs[name]


def _saved(train_dir, name='model_final.pth'):
    return read_torch_file(os.path.join(train_dir, name))


def test_each_evaluation_is_test_net_on_that_iterations_checkpoint(runs, tiny_catalog):
    train_dir = _train(runs, tiny_catalog, 'evaluated', *EVALUATED)
    history = _saved(train_dir)['extra']['evaluations']['history']
    assert [entry['iter'] for entry in history] == [1, 3, 5]
    for entry in history:
        use_tiny_config(tiny_catalog, tiny_catalog.parent / 'test_of_{}'.format(entry['iter']))
        weights = os.path.join(train_dir, 'model_iter{}.pth'.format(entry['iter']))
        results = test_engine.run_inference(model_builder.build_model_type(cfg), weights)
        box = results['tiny_val']['box']
        assert {m: entry['bbox/' + m] for m in BOX_METRICS} == {m: box[m] for m in BOX_METRICS}
        # Each evaluation wrote its own results file.
        assert os.path.isfile(os.path.join(train_dir, 'evaluation', 'iter{}'.format(entry['iter']), 'tiny_val',
                                           'bbox_tiny_val_results.json'))
    # The evaluations differ, so choosing the best means something.
    assert len({entry['bbox/AP'] for entry in history}) == 3


def test_model_best_is_the_checkpoint_with_the_highest_ap(runs, tiny_catalog):
    train_dir = _train(runs, tiny_catalog, 'evaluated', *EVALUATED)
    history = _saved(train_dir)['extra']['evaluations']['history']
    best = max(history, key=lambda entry: entry['bbox/AP'])
    saved_best = _saved(train_dir, BestCheckpoint.NAME)
    assert saved_best['extra']['best'] == {'iter': best['iter'], 'metric': 'bbox/AP', 'value': best['bbox/AP']}
    assert saved_best['iteration'] == best['iter']
    numbered = _saved(train_dir, 'model_iter{}.pth'.format(best['iter']))['model']
    assert all(torch.equal(saved_best['model'][k], numbered[k]) for k in numbered)
    # The final checkpoint carries the record, for a resumed run.
    assert _saved(train_dir)['extra']['best'] == saved_best['extra']['best']


def test_validation_loss_is_the_training_loss_of_the_validation_images(runs, tiny_catalog):
    train_dir = _train(runs, tiny_catalog, 'evaluated', *EVALUATED)
    history = _saved(train_dir)['extra']['validation_losses']['history']
    assert [entry['iter'] for entry in history] == [1, 3, 5]
    for entry in history:
        parts = sum(v for k, v in entry.items() if k.startswith('val/loss_'))
        assert entry['val/loss'] == pytest.approx(parts, rel=1e-5)
        assert entry['val/loss'] > 0 and 0 <= entry['val/accuracy_cls'] <= 1


def test_evaluating_changes_nothing_of_the_training(runs, tiny_catalog):
    # The evaluations' loaders and RoI sampling draw from their own copies of the random streams.
    evaluated = _saved(_train(runs, tiny_catalog, 'evaluated', *EVALUATED))
    plain = _saved(_train(runs, tiny_catalog, 'plain', 'SOLVER.MAX_ITER', '6'))
    assert all(torch.equal(evaluated['model'][k], plain['model'][k]) for k in plain['model'])
    assert _logged_training(evaluated) == _logged_training(plain)


def _logged_training(saved):
    """The training json_stats lines a checkpoint carries, without the timings."""
    return [{k: v for k, v in h.items() if k not in ('time', 'eta', 'data_time')}
            for h in saved['extra']['progress']['history'] if 'lr' in h]


def test_the_curves_picture_gets_an_evaluation_panel(runs, tiny_catalog):
    import cv2
    train_dir = _train(runs, tiny_catalog, 'evaluated', *EVALUATED)
    evaluated = cv2.imread(os.path.join(train_dir, 'training_curves.png'))
    plain = cv2.imread(os.path.join(_train(runs, tiny_catalog, 'plain', 'SOLVER.MAX_ITER', '6'),
                                    'training_curves.png'))
    assert evaluated.shape[0] == plain.shape[0] * 3 // 2  # three panels instead of two


def test_a_best_metric_the_evaluation_lacks_is_one_line(tiny_catalog):
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'bad_metric', 'SOLVER.MAX_ITER', '2',
                    'TEST.EVAL_PERIOD', '2', 'TEST.BEST_METRIC', 'segm/AP')
    with pytest.raises(Exception, match=r"TEST.BEST_METRIC 'segm/AP' is not among the evaluation's metrics "
                                        r"\['bbox/AP', 'bbox/AP50'"):
        train_engine.train_model()


@pytest.mark.slow
def test_centernet_val_intervals_keeps_the_epoch_of_the_lowest_validation_loss(tiny_catalog):
    # 8 images, 2 per iteration: 4 iterations per epoch; 3 epochs, validation after each.
    use_centernet(tiny_catalog, tiny_catalog.parent / 'centernet_val', 'CENTERNET.NUM_EPOCHS', '3',
                  'CENTERNET.LR_STEP', '(3,)', 'CENTERNET.VAL_INTERVALS', '1')
    assert cfg.TEST.VAL_LOSS_PERIOD == 4 and cfg.TEST.EVAL_PERIOD == 0
    train_engine.train_model()
    train_dir = os.path.join(cfg.OUTPUT_DIR, 'train', 'tiny_train', 'centernet')
    final = _saved(train_dir)['extra']
    history = final['validation_losses']['history']
    assert [entry['iter'] for entry in history] == [3, 7, 11]
    assert all(entry['val/loss'] > 0 for entry in history)
    lowest = min(history, key=lambda entry: entry['val/loss'])
    assert final['best'] == {'iter': lowest['iter'], 'metric': 'val/loss', 'value': lowest['val/loss']}
    assert _saved(train_dir, BestCheckpoint.NAME)['iteration'] == lowest['iter']


def _train_net(output_dir, catalog, *overrides):
    return [sys.executable, os.path.join(REPO, 'tools', 'train_net.py'), '--cfg', SHAPES_CFG, '--skip-test',
            *TINY_OVERRIDES, 'DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(output_dir), *EVALUATED, *overrides]


@pytest.mark.processes
@pytest.mark.slow
def test_two_processes_a_run_killed_during_an_evaluation_repeats_it_and_ends_as_an_uninterrupted_run(
        tmp_path, tiny_catalog):
    args = ('NUM_GPUS', '2', 'DIST_BACKEND', 'gloo')
    whole = tmp_path / 'whole'
    subprocess.run(_train_net(whole, tiny_catalog, *args), check=True, capture_output=True, timeout=600)
    killed = tmp_path / 'killed'
    # Killed while testing for the evaluation after iteration 3 (its checkpoint is model_iter1.pth).
    process = subprocess.Popen(_train_net(killed, tiny_catalog, *args), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if 'evaluation/iter3/' in line or 'im_detect' in line and any('"iter": 3' in s for s in seen):
            os.killpg(process.pid, signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, ''.join(seen[-20:])
    assert not os.path.exists(killed / TRAIN_SUBDIR / 'model_iter3.pth')
    resumed = subprocess.run(_train_net(killed, tiny_catalog, *args), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert 'Resuming from checkpoint' in resumed.stdout + resumed.stderr
    ends = [_saved(str(run / TRAIN_SUBDIR)) for run in (whole, killed)]
    for key in ('evaluations', 'validation_losses', 'best'):
        assert ends[0]['extra'][key] == ends[1]['extra'][key], key
    bests = [_saved(str(run / TRAIN_SUBDIR), BestCheckpoint.NAME)['model'] for run in (whole, killed)]
    assert all(torch.equal(bests[0][k], bests[1][k]) for k in bests[0])
    # Two ranks tested their halves; rank 0's evaluation equals test_net on that checkpoint.
    entry = ends[0]['extra']['evaluations']['history'][1]
    use_tiny_config(tiny_catalog, tmp_path / 'test_of_3')
    box = test_engine.run_inference(model_builder.build_model_type(cfg),
                                   str(whole / TRAIN_SUBDIR / 'model_iter3.pth'))['tiny_val']['box']
    assert entry['iter'] == 3 and {m: entry['bbox/' + m] for m in BOX_METRICS} == {m: box[m] for m in BOX_METRICS}
