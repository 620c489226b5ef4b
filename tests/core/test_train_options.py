"""The training loop's options on CPU: SOLVER.ITER_SIZE against a hand-computed SGD step, AMP (bfloat16,
float16 with a fixed and a dynamic loss scale), MODEL.SYNC_BN, and TRAIN.RANK_IMS_PER_BATCH with
ITER_SIZE on 2 gloo workers against a hand-computed DDP step. Uses the tiny dataset and config of
tests/support/tiny_runs.py."""
import collections
import itertools
import json
import math
import pathlib

import numpy as np
import pytest
import torch

from detectron.core import config_finalize, train_engine
from detectron.core import launch
from detectron.core.config import cfg, images_per_iter, merge_cfg_from_list
from detectron.datasets import dataset_catalog
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.modeling import model_builder
from detectron.modeling.generalized_rcnn import GeneralizedRCNN
from detectron.roi_data.loader import aspect_ratio_groups, build_train_loader
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import TRAIN_SUBDIR, json_stats, use_tiny_config

# One plain SGD step at a constant LR: no momentum, no weight decay, no warm-up ramp.
PLAIN_SGD = ['SOLVER.MOMENTUM', '0.0', 'SOLVER.WEIGHT_DECAY', '0.0', 'SOLVER.WEIGHT_DECAY_GN', '0.0',
             'SOLVER.WARM_UP_FACTOR', '1.0']
# Detectron's LR is a float32 blob: BASE_LR 0.02 of the shapes config, no warm-up factor.
SHAPES_LR = float(np.float32(0.02))
STEM_CONV = 'conv_body.body.conv1.weight'

CPU = torch.device('cpu')

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(autouse=True)
def train_on_the_cpu(monkeypatch):
    """The expected values are computed on the CPU: on a machine with a GPU the engine (and the
    launcher, which would ask for NUM_GPUS CUDA devices) would train on it, where the same
    arithmetic rounds differently. Spawned workers inherit the hidden devices."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')


def _train(output_dir):
    """train_model with the current cfg; returns the state_dict of model_final.pth."""
    train_engine.train_model()
    return torch.load(output_dir / TRAIN_SUBDIR / 'model_final.pth', weights_only=True)['model']


def _initial_model(rank=0):
    """The model train_worker builds on `rank` of a fresh run, with torch's generator where it leaves it."""
    torch.manual_seed(cfg.RNG_SEED)
    model = model_builder.create(cfg)
    torch.manual_seed(cfg.RNG_SEED + rank)  # the rank's stream for anchor and RoI sampling
    return model


def _first_batches(count, rank=0, rank_sizes=None):
    """The first `count` batches of `rank` (rank_sizes: every rank's batch size; None: one process of
    TRAIN.IMS_PER_BATCH), from a sampler and loader built as the engine does."""
    rank_sizes = rank_sizes or [cfg.TRAIN.IMS_PER_BATCH]
    dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)
    roidb = combined_roidb_for_training(cfg.TRAIN.DATASETS, cfg.TRAIN.USE_FLIPPED)
    sampler = GroupedDistributedBatchSampler(aspect_ratio_groups(roidb), None, seed=cfg.RNG_SEED, rank=rank,
                                             world_size=len(rank_sizes), rank_batch_sizes=rank_sizes)
    model_type = model_builder.build_model_type(cfg)
    loader = build_train_loader(model_type.training_dataset(roidb, CPU), sampler, model_type.collate(CPU),
                                num_workers=0)
    with torch.random.fork_rng(devices=[]):  # the engine keeps the DataLoader's seed draw out of torch's stream
        return list(itertools.islice(loader, count))


def _accumulate_gradients(model, micro_batches):
    """Backward of the mean of the micro-batch losses, forward after forward: anchor and RoI sampling
    draw from torch's generator in this order."""
    model.train()
    for batch in micro_batches:
        losses = model(*batch)
        (sum(v for k, v in losses.items() if k.startswith('loss')) / len(micro_batches)).backward()


def _hand_sgd_step(model, lr):
    """Caffe2's update without momentum or decay: p -= lr * g, twice the LR for biases (Detectron's
    optimizer.py); GroupNorm affines are norm parameters and take the base LR."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, torch.nn.GroupNorm) for p in m.parameters()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            lr_mult = 2.0 if name.endswith('bias') and id(p) not in norm_params else 1.0
            p -= lr * lr_mult * p.grad


def _changed_count(state, initial):
    return sum(not torch.equal(value, initial[key]) for key, value in state.items())


def test_iter_size_2_is_one_sgd_step_on_the_mean_of_two_micro_batch_losses(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'SOLVER.ITER_SIZE', '2', 'TRAIN.IMS_PER_BATCH', '1',
                    'SOLVER.MAX_ITER', '1', *PLAIN_SGD)
    trained = _train(tmp_path)

    micro_batches = _first_batches(2)
    images = [batch[0] for batch in micro_batches]
    assert [im.shape[0] for im in images] == [1, 1]
    assert images[0].shape != images[1].shape or not torch.equal(images[0], images[1])
    model = _initial_model()
    initial = {key: value.clone() for key, value in model.state_dict().items()}
    _accumulate_gradients(model, micro_batches)
    _hand_sgd_step(model, SHAPES_LR)

    expected = model.state_dict()
    assert sorted(trained) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(trained[key], value, rtol=0, atol=1e-6, msg=key)
    # Updates are up to ~1e-2; only the P4/P5 FPN output convs (no sampled anchor or RoI reaches them in
    # these tiny images) keep zero gradients.
    assert _changed_count(expected, initial) > 0.9 * len(expected)


def _first_iteration_loss(amp_dtype):
    """Total loss of iteration 0 computed here, under autocast to amp_dtype (None: float32)."""
    batch = _first_batches(1)[0]
    model = _initial_model()
    model.train()
    autocast = torch.autocast('cpu', dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None)
    with torch.no_grad(), autocast:
        losses = model(*batch)
    return float(sum(v for k, v in losses.items() if k.startswith('loss')))


def _assert_finite_losses(stats):
    for entry in stats:
        for key, value in entry.items():
            if key.startswith('loss'):
                assert math.isfinite(float(value)), (entry['iter'], key, value)


def test_bfloat16_autocast_runs_the_forward_in_bfloat16_and_trains(tiny_catalog, tmp_path, capsys, monkeypatch):
    # What autocast does, also on a CPU without bfloat16 instructions (where train_worker would train in
    # float32 instead: tests/core/test_centernet_engine.py).
    monkeypatch.setattr(config_finalize, 'cpu_bfloat16_is_emulated', lambda: False)
    use_tiny_config(tiny_catalog, tmp_path, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'bfloat16',
                    'SOLVER.MAX_ITER', '3')
    capsys.readouterr()
    trained = _train(tmp_path)
    _, stats = json_stats(capsys.readouterr().out)
    assert [s['iter'] for s in stats] == [0, 2]
    _assert_finite_losses(stats)
    bfloat16_loss = _first_iteration_loss(torch.bfloat16)
    # json_stats rounds to 6 decimals; bfloat16 moves the loss by far more than that.
    assert float(stats[0]['loss']) == pytest.approx(bfloat16_loss, abs=1e-6)
    assert abs(bfloat16_loss - _first_iteration_loss(None)) > 1e-4
    initial = _initial_model().state_dict()
    assert all(torch.isfinite(value).all() for value in trained.values())
    assert _changed_count(trained, initial) > 0.9 * len(initial)


def test_float16_fixed_loss_scale_unscales_like_dynamic_scaling(tiny_catalog, tmp_path, capsys):
    trained, first_losses = {}, []
    for loss_scale in ('128.0', '0.0', '1.0'):  # fixed, dynamic (GradScaler('cpu')), no scaling
        output_dir = tmp_path / loss_scale
        use_tiny_config(tiny_catalog, output_dir, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'float16',
                        'SOLVER.AMP.LOSS_SCALE', loss_scale, 'SOLVER.MAX_ITER', '1', *PLAIN_SGD)
        capsys.readouterr()
        trained[loss_scale] = _train(output_dir)
        _, stats = json_stats(capsys.readouterr().out)
        first_losses.append(float(stats[0]['loss']))
    assert first_losses == pytest.approx([_first_iteration_loss(torch.float16)] * 3, abs=1e-6)
    fixed, dynamic, unscaled = trained['128.0'], trained['0.0'], trained['1.0']
    initial = _initial_model().state_dict()
    # GradScaler skips a step whose gradients overflowed; its first scale 2**16 did not overflow here.
    assert _changed_count(dynamic, initial) > 0.9 * len(initial)
    assert max((fixed[key] - initial[key]).abs().max() for key in initial) > 5e-3
    for key in initial:
        # Powers of two scale exactly: what differs is float16 underflow of the smallest gradients.
        torch.testing.assert_close(fixed[key], dynamic[key], rtol=0, atol=1e-6, msg=key)
        if key != STEM_CONV:
            torch.testing.assert_close(fixed[key], unscaled[key], rtol=0, atol=2e-6, msg=key)
    # The stem conv's weight gradient multiplies raw pixels by the network's smallest output gradients,
    # which underflow in float16 unless the loss is scaled (by 128 or by 2**16 alike).
    stem_unscaled_error = (fixed[STEM_CONV] - unscaled[STEM_CONV]).abs().max()
    assert stem_unscaled_error > 10 * (fixed[STEM_CONV] - dynamic[STEM_CONV]).abs().max()


TRAINABLE_BN_BODY = ['RESNETS.TRANS_FUNC', 'basic_bn_transformation', 'RESNETS.STEM_FUNC', 'basic_bn_stem',
                     'RESNETS.SHORTCUT_FUNC', 'basic_bn_shortcut']


def _module_types(model):
    return collections.Counter(type(module).__name__ for module in model.modules())


def test_sync_bn_converts_every_batchnorm_keeping_names_and_values(tiny_catalog, tmp_path, monkeypatch):
    use_tiny_config(tiny_catalog, tmp_path, 'MODEL.SYNC_BN', 'True', *TRAINABLE_BN_BODY)
    model = model_builder.create(cfg)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    # stem 1 + 8 basic blocks x 2 + projections of res3, res4, res5 (res2 keeps 64 channels) = 20.
    assert _module_types(model)['BatchNorm2d'] == 20
    gpu = torch.device('cuda', 0)
    assert train_engine.with_sync_batchnorm(model, gpu) is model  # one process: nothing to synchronise
    assert _module_types(model)['SyncBatchNorm'] == 0
    monkeypatch.setattr(comm, 'get_world_size', lambda: 2)
    converted = train_engine.with_sync_batchnorm(model, gpu)  # conversion itself needs no GPU
    types = _module_types(converted)
    assert (types['SyncBatchNorm'], types['BatchNorm2d']) == (20, 0)
    assert types['GroupNorm'] == _module_types(model_builder.create(cfg))['GroupNorm'] > 0  # FPN keeps GN
    converted_state = converted.state_dict()
    assert sorted(converted_state) == sorted(state)
    for key, value in state.items():
        assert torch.equal(converted_state[key], value), key


def test_sync_bn_on_cpu_workers_is_a_config_error(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'MODEL.SYNC_BN', 'True', 'NUM_GPUS', '2', 'TRAIN.IMS_PER_BATCH', '1',
                    *TRAINABLE_BN_BODY)
    with pytest.raises(ConfigValueError, match=r"^rank \d: MODEL.SYNC_BN True needs CUDA GPUs: torch's "
                                               r"SyncBatchNorm does not run on the cpu; set MODEL.SYNC_BN False"):
        train_engine.train_model()


def test_rank_ims_per_batch_sets_the_global_batch(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'NUM_GPUS', '2', 'TRAIN.RANK_IMS_PER_BATCH', '(2, 1)',
                    'SOLVER.ITER_SIZE', '2')
    assert cfg.TRAIN.RANK_IMS_PER_BATCH == (2, 1)
    assert images_per_iter() == (2 + 1) * 2


@pytest.mark.parametrize('value', ['(2, 0)', '(2, 1.0)', '(True, 1)', '2', "('2', '1')"])
def test_rank_ims_per_batch_takes_integers_of_at_least_one(value):
    with pytest.raises(ConfigValueError, match=r'^Config key TRAIN.RANK_IMS_PER_BATCH expects a tuple of '
                                               r'integers >= 1, one per process \(default: \(\)\), but got '):
        merge_cfg_from_list(['TRAIN.RANK_IMS_PER_BATCH', value])


def test_rank_ims_per_batch_needs_one_entry_per_process(tiny_catalog, tmp_path):
    with pytest.raises(ConfigValueError, match=r'^TRAIN.RANK_IMS_PER_BATCH \(2, 1, 1\) needs one entry per '
                                               r'process but NUM_GPUS is 2; give 2 entries, or \(\) for '):
        use_tiny_config(tiny_catalog, tmp_path, 'NUM_GPUS', '2', 'TRAIN.RANK_IMS_PER_BATCH', '(2, 1, 1)')


@pytest.mark.parametrize('overrides, sizes', [([], [2, 2]), (['TRAIN.RANK_IMS_PER_BATCH', '(3, 1)'], [3, 1])])
def test_engine_gives_the_sampler_one_batch_size_per_rank(tiny_catalog, tmp_path, monkeypatch, overrides, sizes):
    use_tiny_config(tiny_catalog, tmp_path, 'NUM_GPUS', '2', *overrides)  # TRAIN.IMS_PER_BATCH 2
    monkeypatch.setattr(comm, 'get_world_size', lambda: 2)
    assert train_engine.rank_batch_sizes() == sizes
    assert train_engine.images_per_step() == sum(sizes)


def train_worker_recording_batch_sizes(cfg_snapshot, record_dir):
    """train_engine.train_worker, writing the images of every training forward to record_dir/rank<r>.json.
    Module-level: spawned workers import it by name."""
    seen = []
    forward = GeneralizedRCNN.forward

    def recording_forward(self, images, im_info, targets=None):
        seen.append([images.shape[0], im_info.shape[0], len(targets)])
        return forward(self, images, im_info, targets)

    GeneralizedRCNN.forward = recording_forward
    try:
        train_engine.train_worker(cfg_snapshot)
    finally:
        GeneralizedRCNN.forward = forward
    (pathlib.Path(record_dir) / 'rank{}.json'.format(comm.get_rank())).write_text(json.dumps(seen))


@pytest.mark.slow
@pytest.mark.processes
def test_two_gloo_workers_with_unequal_batches_and_iter_size_take_the_hand_ddp_step(tiny_catalog, tmp_path):
    use_tiny_config(tiny_catalog, tmp_path, 'NUM_GPUS', '2', 'TRAIN.RANK_IMS_PER_BATCH', '(2, 1)',
                    'SOLVER.ITER_SIZE', '2', 'SOLVER.MAX_ITER', '1', *PLAIN_SGD)
    launch.launch(train_worker_recording_batch_sizes, 2, args=(cfg.clone(), str(tmp_path)), device='cpu')
    # Two micro-batches: rank 0 forwards 2 images each time, rank 1 one.
    assert json.loads((tmp_path / 'rank0.json').read_text()) == [[2, 2, 2]] * 2
    assert json.loads((tmp_path / 'rank1.json').read_text()) == [[1, 1, 1]] * 2
    final = torch.load(tmp_path / TRAIN_SUBDIR / 'model_final.pth', weights_only=True)
    assert (final['iteration'], final['world_size']) == (0, 2)
    # The position of iteration 1: SOLVER.ITER_SIZE global batches an iteration.
    assert final['sampler'] == {'seed': cfg.RNG_SEED, 'global_batch_size': 3, 'position': {'draws': 2, 'skipped': 0}}

    models = []
    for rank in range(2):
        models.append(_initial_model(rank))
        _accumulate_gradients(models[-1], _first_batches(2, rank, [2, 1]))
    # DDP averages the ranks' accumulated gradients: each rank's loss weighs the same whatever its batch.
    for mine, other in zip(models[0].parameters(), models[1].parameters()):
        if mine.grad is not None:
            mine.grad = (mine.grad + other.grad) / 2
    _hand_sgd_step(models[0], SHAPES_LR)
    expected = models[0].state_dict()
    for key, value in expected.items():
        torch.testing.assert_close(final['model'][key], value, rtol=0, atol=1e-6, msg=key)
    # Without the average (rank 0's gradients alone) the step is measurably different.
    rank0_alone = _initial_model()
    _accumulate_gradients(rank0_alone, _first_batches(2, 0, [2, 1]))
    _hand_sgd_step(rank0_alone, SHAPES_LR)
    assert max((final['model'][k] - v).abs().max() for k, v in rank0_alone.state_dict().items()) > 1e-4


def test_channels_last_body_gives_the_losses_and_gradients_of_the_nchw_body(tiny_catalog, tmp_path):
    """GeneralizedRCNN.use_channels_last changes the memory layout only: on the CPU its kernels round
    differently, so the losses and gradients agree to float32 noise."""
    use_tiny_config(tiny_catalog, tmp_path)
    batch = _first_batches(1)[0]
    nchw = _initial_model()
    nhwc = _initial_model()
    nhwc.use_channels_last()
    assert nhwc.conv_body.body.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert not nhwc.conv_body.body.conv1.weight.is_contiguous()
    assert nchw.conv_body.body.conv1.weight.is_contiguous()
    losses = {}
    for name, model in (('nchw', nchw), ('nhwc', nhwc)):
        torch.manual_seed(5)  # the same anchor and RoI samples
        _accumulate_gradients(model, [batch])
        torch.manual_seed(5)
        losses[name] = {k: v.item() for k, v in model(*batch).items() if k.startswith('loss')}
    assert losses['nchw'].keys() == losses['nhwc'].keys() and len(losses['nchw']) > 4
    for key, value in losses['nchw'].items():
        assert losses['nhwc'][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    grads = dict((n, p.grad) for n, p in nhwc.named_parameters() if p.grad is not None)
    for name, p in nchw.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_the_engine_prepares_the_model_before_building_its_optimizer(tiny_catalog, tmp_path, monkeypatch):
    """prepare_for_training runs on the model the optimizer then holds; the R-CNN type stores the body
    channels_last only for autocast on CUDA, so this bfloat16 run on the CPU keeps NCHW unless forced."""
    use_tiny_config(tiny_catalog, tmp_path, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'bfloat16',
                    'SOLVER.MAX_ITER', '2')
    model_type = model_builder.build_model_type(cfg)
    assert not model_type.prepare_for_training(model_builder.create(cfg)).channels_last
    events = []

    def forced(self, model):
        model.use_channels_last()
        events.append(('prepare', model))
        return model

    build_optimizer = train_engine.build_optimizer
    monkeypatch.setattr(type(model_type), 'prepare_for_training', forced)
    monkeypatch.setattr(train_engine, 'build_optimizer',
                        lambda model, **kw: events.append(('optimizer', model)) or build_optimizer(model, **kw))
    trained = _train(tmp_path)
    assert [event for event, _ in events] == ['prepare', 'optimizer'] and events[0][1] is events[1][1]
    assert all(torch.isfinite(value).all() for value in trained.values())
    assert _changed_count(trained, _initial_model().state_dict()) > 0.9 * len(trained)


def test_freeze_conv_body_trains_the_heads_and_leaves_resnet_and_fpn_as_built(tiny_catalog, tmp_path):
    """Detectron's TRAIN.FREEZE_CONV_BODY: a StopGradient on the body's outputs (ResNet and FPN)."""
    use_tiny_config(tiny_catalog, tmp_path, 'TRAIN.FREEZE_CONV_BODY', 'True', 'SOLVER.MAX_ITER', '2', *PLAIN_SGD)
    trained = _train(tmp_path)
    initial = _initial_model().state_dict()
    body = [key for key in initial if key.startswith('conv_body.')]
    heads = [key for key in initial if key.startswith(('rpn.', 'box_head.', 'box_outs.'))]
    assert len(body) > 20 and len(heads) >= 6
    assert all(torch.equal(trained[key], initial[key]) for key in body)
    assert all(not torch.equal(trained[key], initial[key]) for key in heads if key.endswith('weight'))
