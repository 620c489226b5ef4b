"""train_model end to end on a tiny COCO-format dataset (CPU): Detectron's output layout, json_stats,
TensorBoard events, the curves PNG, AUTO_RESUME (exact continuation), skipping a finished run and the
non-finite-loss stop.

The tiny datasets and config are in tests/support/tiny_runs.py.
"""
import glob
import itertools
import logging
import os
import re
import shutil
import struct
import time

import cv2
import pytest
import torch

from detectron.checkpoint import checkpointer
from detectron.checkpoint.c2_weights import load_weights
from detectron.core import hooks, train_engine
from detectron.core.train_loop import StepOptions, TrainLoop
from detectron.core.config import cfg
from detectron.modeling import fast_rcnn_heads, model_builder
from detectron.utils.errors import DetectronError
from protobuf_reader import proto_fields
from support.tiny_runs import TRAIN_SUBDIR, json_stats, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def finished_runs():
    return {}


@pytest.fixture
def uninterrupted_run(tiny_catalog, finished_runs, capsys):
    """cfg of the 4-iteration run; the run itself happens once per module.
    Returns {'train_dir', 'result' (train_model's), 'stdout'}."""
    output_dir = tiny_catalog.parent / 'uninterrupted'
    use_tiny_config(tiny_catalog, output_dir)
    if not finished_runs:
        capsys.readouterr()
        result = train_engine.train_model()
        finished_runs.update(train_dir=str(output_dir / TRAIN_SUBDIR), result=result,
                             stdout=capsys.readouterr().out)
    return finished_runs


def test_checkpoints_in_detectron_layout(uninterrupted_run):
    train_dir = uninterrupted_run['train_dir']
    assert uninterrupted_run['result'] == {'final': os.path.join(train_dir, 'model_final.pth')}
    # Detectron's rule with period SNAPSHOT_ITERS / NUM_GPUS = 2, starting at iteration 0.
    expected = ['model_iter{}.pth'.format(i) for i in range(4) if (i + 1) % 2 == 0 and i > 0]
    assert expected == ['model_iter1.pth', 'model_iter3.pth']
    assert sorted(os.listdir(train_dir)) == sorted(expected + ['model_final.pth', 'tensorboard',
                                                                'training_curves.png'])
    saved = {name: torch.load(os.path.join(train_dir, name), weights_only=True)
             for name in expected + ['model_final.pth']}
    assert [saved[name]['iteration'] for name in expected + ['model_final.pth']] == [1, 3, 3]
    # No check drops a draw: the stored position is the next iteration's global batch.
    assert saved['model_final.pth']['sampler'] == {'seed': cfg.RNG_SEED, 'global_batch_size': 2,
                                                   'position': {'draws': 4, 'skipped': 0}}
    for key, value in saved['model_iter3.pth']['model'].items():
        assert torch.equal(saved['model_final.pth']['model'][key], value), key
    assert any(not torch.equal(saved['model_iter1.pth']['model'][k], v)
               for k, v in saved['model_iter3.pth']['model'].items())


def test_model_final_loads_as_weights(uninterrupted_run):
    model = model_builder.create(cfg)
    missing, unused = load_weights(model, uninterrupted_run['result']['final'])
    assert (list(missing), list(unused)) == ([], [])
    final = torch.load(uninterrupted_run['result']['final'], weights_only=True)['model']
    for key, value in model.state_dict().items():
        assert torch.equal(value, final[key]), key


def test_json_stats_lines_follow_detectron(uninterrupted_run):
    raw, stats = json_stats(uninterrupted_run['stdout'])
    # Logged every 20 iterations and at the last one.
    assert [s['iter'] for s in stats] == [0, 3]
    loss_keys = ['loss_cls', 'loss_bbox'] + ['loss_rpn_{}_fpn{}'.format(kind, level)
                                             for kind in ('cls', 'bbox') for level in range(2, 7)]
    expected_keys = sorted(['iter', 'lr', 'time', 'data_time', 'eta', 'mb_qsize', 'mem', 'loss', 'accuracy_cls'] + loss_keys)
    for line, entry in zip(raw, stats):
        assert re.findall(r'"(\w+)": ', line) == expected_keys  # sorted, as json.dumps(sort_keys=True)
        floats = [k for k in expected_keys if k not in ('iter', 'eta', 'mb_qsize', 'mem')]
        for key in floats:
            assert re.fullmatch(r'-?\d+\.\d{6}', entry[key]), (key, entry[key])
        assert isinstance(entry['iter'], int) and entry['mem'] == 0 and entry['mb_qsize'] == 0
        assert re.fullmatch(r'\d+:\d\d:\d\d', entry['eta'])
        assert entry['lr'] == '{:.6f}'.format(train_engine.lr_schedule().lr_at(entry['iter']))
        assert 0.0 <= float(entry['accuracy_cls']) <= 1.0
    # Warm-up over 2 iterations from 1/3 of BASE_LR 0.02 (Detectron's linear warm-up).
    assert [s['lr'] for s in stats] == ['0.006667', '0.020000']
    # At iteration 0 each median is over one value, so the total is the sum of the parts.
    first = stats[0]
    assert float(first['loss']) == pytest.approx(sum(float(first[k]) for k in loss_keys), abs=2e-5)


def _tensorboard_scalars(path):
    """{step: {tag: value}} from a TFRecord event file (CRCs are test_tensorboard.py's business)."""
    data, pos, scalars = open(path, 'rb').read(), 0, {}
    while pos < len(data):
        (length,) = struct.unpack('<Q', data[pos:pos + 8])
        event = proto_fields(data[pos + 12:pos + 12 + length])
        pos += 16 + length
        for summary in event.get(5, []):
            for value in proto_fields(summary)[1]:
                fields = proto_fields(value)
                tag = fields[1][0].decode()
                scalars.setdefault(event[2][0], {})[tag] = struct.unpack('<f', fields[2][0])[0]
    return scalars


def test_tensorboard_events_hold_the_logged_iterations(uninterrupted_run):
    (path,) = glob.glob(os.path.join(uninterrupted_run['train_dir'], 'tensorboard', 'events.out.tfevents.*'))
    scalars = _tensorboard_scalars(path)
    _, stats = json_stats(uninterrupted_run['stdout'])
    assert sorted(scalars) == [0, 3]
    for entry in stats:
        logged = scalars[entry['iter']]
        assert 'eta' not in logged and 'iter' not in logged  # strings and the step are not scalars
        for tag in ('loss', 'lr', 'loss_cls', 'loss_bbox', 'accuracy_cls', 'time'):
            assert logged[tag] == pytest.approx(float(entry[tag]), abs=1e-6), tag


def test_training_curves_png_is_written(uninterrupted_run):
    image = cv2.imread(os.path.join(uninterrupted_run['train_dir'], 'training_curves.png'))
    assert image is not None and image.shape == (1000, 800, 3)  # loss panel over lr panel
    assert (image != 255).any(axis=2).sum() > 1000


def test_finished_run_is_not_trained_again(uninterrupted_run, caplog):
    train_dir = uninterrupted_run['train_dir']
    before = {name: os.stat(os.path.join(train_dir, name)).st_mtime_ns for name in os.listdir(train_dir)}
    with caplog.at_level(logging.INFO):
        result = train_engine.train_model()
    assert result == {'final': os.path.join(train_dir, 'model_final.pth')}
    assert 'model_final.pth exists; no need to train!' in caplog.text
    assert {name: os.stat(os.path.join(train_dir, name)).st_mtime_ns for name in os.listdir(train_dir)} == before


def test_auto_resume_continues_the_interrupted_run_exactly(uninterrupted_run, tiny_catalog, caplog, capsys):
    output_dir = tiny_catalog.parent / 'resumed'
    use_tiny_config(tiny_catalog, output_dir)
    train_dir = output_dir / TRAIN_SUBDIR
    train_dir.mkdir(parents=True)
    # What a run stopped after iteration 1's checkpoint leaves behind.
    shutil.copy(os.path.join(uninterrupted_run['train_dir'], 'model_iter1.pth'), train_dir)
    with caplog.at_level(logging.INFO):
        train_engine.train_model()
    assert 'Resuming from checkpoint {}'.format(train_dir / 'model_iter1.pth') in caplog.text
    assert sorted(os.listdir(train_dir)) == ['model_final.pth', 'model_iter1.pth', 'model_iter3.pth', 'tensorboard',
                                             'training_curves.png']
    _, stats = json_stats(capsys.readouterr().out)
    assert [s['iter'] for s in stats] == [3]
    resumed = torch.load(train_dir / 'model_final.pth', weights_only=True)
    uninterrupted = torch.load(uninterrupted_run['result']['final'], weights_only=True)
    for key, value in uninterrupted['model'].items():
        assert torch.equal(resumed['model'][key], value), key
    for param_id, state in uninterrupted['optimizer']['state'].items():
        assert torch.equal(resumed['optimizer']['state'][param_id]['momentum_buffer'], state['momentum_buffer'])
    assert resumed['optimizer']['base_lr'] == uninterrupted['optimizer']['base_lr']


def test_non_finite_loss_stops_with_the_iteration_and_keeps_the_checkpoint(tiny_catalog, monkeypatch):
    output_dir = tiny_catalog.parent / 'nan'
    use_tiny_config(tiny_catalog, output_dir)
    real_losses = fast_rcnn_heads.fast_rcnn_losses
    calls = itertools.count()

    def nan_from_iteration_2(*args, **kwargs):
        losses = real_losses(*args, **kwargs)
        if next(calls) >= 2:  # one forward per iteration
            losses['loss_cls'] = losses['loss_cls'] * float('nan')
        return losses

    monkeypatch.setattr(fast_rcnn_heads, 'fast_rcnn_losses', nan_from_iteration_2)
    with pytest.raises(hooks.NonFiniteLossError) as err:
        train_engine.train_model()
    assert isinstance(err.value, DetectronError)
    message = str(err.value)
    # Checked without a host sync every iteration: the error comes at the next log/checkpoint
    # iteration (3) and names the first non-finite one (2).
    assert message.startswith('Loss is not finite since iteration 2 (now: ')
    assert 'loss_cls=nan' in message
    train_dir = output_dir / TRAIN_SUBDIR
    assert str(train_dir) in message
    assert sorted(os.listdir(train_dir)) == ['model_iter1.pth', 'tensorboard', 'training_curves.png']
    model = model_builder.create(cfg)
    assert checkpointer.load_checkpoint(str(train_dir / 'model_iter1.pth'), model)['iteration'] == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.processes
def test_two_gloo_workers_train_with_detectron_checkpoint_period(tiny_catalog, capfd):
    output_dir = tiny_catalog.parent / 'two_workers'
    use_tiny_config(tiny_catalog, output_dir, 'NUM_GPUS', '2', 'TRAIN.IMS_PER_BATCH', '1', 'SOLVER.MAX_ITER', '3')
    train_engine.train_model()
    train_dir = output_dir / TRAIN_SUBDIR
    # Period int(SNAPSHOT_ITERS / NUM_GPUS) = 1; iteration 0 (the start) is never checkpointed.
    assert sorted(os.listdir(train_dir)) == ['model_final.pth', 'model_iter1.pth', 'model_iter2.pth', 'tensorboard',
                                             'training_curves.png']
    final = torch.load(train_dir / 'model_final.pth', weights_only=True)
    assert (final['iteration'], final['world_size'], sorted(final['rng_states'])) == (2, 2, [0, 1])
    assert final['sampler'] == {'seed': cfg.RNG_SEED, 'global_batch_size': 2, 'position': {'draws': 3, 'skipped': 0}}
    _, stats = json_stats(capfd.readouterr().out)  # printed by rank 0 alone
    assert [s['iter'] for s in stats] == [0, 2]


def test_resume_keeps_the_logged_history_and_smoothing_windows(uninterrupted_run, tiny_catalog, capsys):
    output_dir = tiny_catalog.parent / 'resumed_history'
    use_tiny_config(tiny_catalog, output_dir)
    train_dir = output_dir / TRAIN_SUBDIR
    train_dir.mkdir(parents=True)
    shutil.copy(os.path.join(uninterrupted_run['train_dir'], 'model_iter1.pth'), train_dir)
    capsys.readouterr()
    train_engine.train_model()
    _, resumed = json_stats(capsys.readouterr().out)
    _, uninterrupted = json_stats(uninterrupted_run['stdout'])
    # The medians over the last 20 iterations include the iterations before the resume.
    timing = ('time', 'data_time', 'eta', 'mem')
    assert {k: v for k, v in resumed[-1].items() if k not in timing} == \
        {k: v for k, v in uninterrupted[-1].items() if k not in timing}
    # The checkpoint's history goes on: the final checkpoint knows every logged iteration.
    final = torch.load(train_dir / 'model_final.pth', weights_only=True)
    assert [stats['iter'] for stats in final['extra']['progress']['history']] == [0, 3]


class _SlowBatches:
    """A batch iterator that takes `delay` seconds per batch: a loader the loop waits for."""

    def __init__(self, delay):
        self.delay = delay

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(self.delay)
        return (torch.ones(2, 3),)


class _MeanModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))

    def forward(self, x):
        time.sleep(0.02)  # the step's own time, which data_time must not include
        return {'loss': (x * self.w).sum()}


def test_json_stats_data_time_is_the_wait_for_the_loader(tmp_path, capsys):
    model = _MeanModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = TrainLoop(model, optimizer, _SlowBatches(0.05), torch.device('cpu'), 0, 3, StepOptions(iter_size=2),
                     hooks=[hooks.LRScheduler(lambda it: 0.1), hooks.Metrics(str(tmp_path), 3)])
    loop.run()
    _, stats = json_stats(capsys.readouterr().out)
    last = stats[-1]
    data_time, iter_time = float(last['data_time']), float(last['time'])
    # Two micro-batches per iteration: at least 2 x 50 ms of waiting; the 2 x 20 ms forwards are in
    # the iteration's time only.
    assert data_time >= 0.1
    assert iter_time >= data_time + 0.04


def test_json_stats_mb_qsize_is_the_loaders_ready_batches_at_each_log(tmp_path, capsys):
    """Detectron's mb_qsize: the training batches' count of ready batches, read when a line is logged
    (a count going 5, 4, 3 here: 5 at iteration 0's line, 4 at iteration 20's; train_net's loader
    counts its workers' finished batches, tests/roi_data/test_loader.py)."""
    model = _MeanModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ready = [5, 4, 3]
    batches = train_engine.TrainingBatches(_SlowBatches(0.0), lambda: ready.pop(0))
    loop = TrainLoop(model, optimizer, batches, torch.device('cpu'), 0, 21, StepOptions(iter_size=1),
                     hooks=[hooks.LRScheduler(lambda it: 0.1), hooks.Metrics(str(tmp_path), 21)])
    loop.run()
    _, stats = json_stats(capsys.readouterr().out)
    assert [(s['iter'], s['mb_qsize']) for s in stats] == [(0, 5), (20, 4)]


def test_the_loop_puts_each_batch_on_the_device_with_the_model_types_function(tmp_path):
    # The model type's batch_to_device finishes the batch (R-CNN: resizes on the GPU); the loop
    # calls it on every micro-batch and hands the model what it returns.
    model = _MeanModel()
    seen = []

    def batch_to_device(batch):
        seen.append(batch[0].shape)
        return (batch[0] * 2,)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = TrainLoop(model, optimizer, _SlowBatches(0.0), torch.device('cpu'), 0, 2, StepOptions(iter_size=2),
                     hooks=[hooks.LRScheduler(lambda it: 0.1)], batch_to_device=batch_to_device)
    loop.run()
    assert seen == [torch.Size([2, 3])] * 4
    # Two SGD steps on the mean of 2 x ones(2, 3) . w over two micro-batches: w -= 0.1 * 4 per step.
    torch.testing.assert_close(model.w.detach(), torch.full((3,), -0.8))


def test_training_from_weights_starts_sgd_from_the_files_momentum(tmp_path):
    # train_net initialises from TRAIN.WEIGHTS and, for Detectron's SGD, from the momentum
    # histories the model type reads in that file (Detectron's model_final.pkl holds them).
    from detectron.modeling.model_type import ModelType
    from detectron.modeling.optimizer import DetectronSGD
    history = torch.arange(6.).view(2, 3)

    class FileWithMomentum(ModelType):
        def load_weights(self, model, path):
            return [], []

        def load_training_weights(self, model, path):
            return [], [], {'weight': history} if path == str(tmp_path / 'w.pkl') else {}

    model = torch.nn.Linear(3, 2, bias=False)
    optimizer = DetectronSGD([{'params': list(model.parameters())}], lr=0.1)
    cfg.TRAIN.AUTO_RESUME = False
    cfg.TRAIN.WEIGHTS = str(tmp_path / 'w.pkl')
    assert train_engine._resume_or_initialise(FileWithMomentum(cfg), model, optimizer, str(tmp_path)) == (0, None, None)
    assert torch.equal(optimizer.state[model.weight]['momentum_buffer'], history)
