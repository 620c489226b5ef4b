"""Checkpoints: atomic writes, finding the newest, round trips, resume (also on another world size)."""
import copy
import errno
import logging
import os
import random

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detectron.checkpoint import checkpointer
from detectron.checkpoint.torch_file import with_digest
from detectron.core import launch
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import comm
from detectron.utils.errors import WeightsError, run_tool


class _ToyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.fc = torch.nn.Linear(2 * 2 * 2, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _trained_model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = _ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 1, 4, 4)).square().mean().backward()
    optimizer.step()
    return model, optimizer


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_model_optimizer_iteration_extra_and_rng(tmp_path):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / checkpointer.checkpoint_name(41))
    checkpointer.save_checkpoint(path, model, optimizer, 41, extra={'cfg': 'NUM_GPUS: 1\n'},
                                 sampler_state={'seed': 3, 'global_batch_size': 4})
    after_save = _draws()
    other_model, other_optimizer = _trained_model_and_optimizer(seed=1)
    loaded = checkpointer.load_checkpoint(path, torch.nn.parallel.DataParallel(other_model), other_optimizer)
    assert _draws() == after_save  # the generators continue where the saving process was
    assert (loaded['iteration'], loaded['world_size'], loaded['extra'], loaded['sampler']) == \
        (41, 1, {'cfg': 'NUM_GPUS: 1\n'}, {'seed': 3, 'global_batch_size': 4})
    for key, value in model.state_dict().items():
        assert torch.equal(other_model.state_dict()[key].cpu(), value)  # DataParallel moves it to a GPU
    for param, other in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(other_optimizer.state[other]['momentum_buffer'].cpu(),
                           optimizer.state[param]['momentum_buffer'])
    # Plain data only: the file loads without running pickled code.
    assert torch.load(path, map_location='cpu', weights_only=True)['iteration'] == 41


def test_failed_save_leaves_the_old_file_and_no_partial_file(tmp_path, monkeypatch):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter9.pth')
    checkpointer.save_checkpoint(path, model, optimizer, 9)

    def write_half_then_fail(obj, f):
        f.write(b'PK\x03\x04 half a zip file')
        raise OSError('No space left on device')
    monkeypatch.setattr(torch, 'save', write_half_then_fail)
    with pytest.raises(OSError, match='No space left'):
        checkpointer.save_checkpoint(path, model, optimizer, 19)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ['model_iter9.pth']
    assert checkpointer.load_checkpoint(path, _ToyNet())['iteration'] == 9


def test_extra_must_be_plain_data(tmp_path):
    class CfgLike(dict):
        pass
    model, optimizer = _trained_model_and_optimizer()
    with pytest.raises(TypeError, match=r"extra\['cfg'\] is a CfgLike"):
        checkpointer.save_checkpoint(str(tmp_path / 'x.pth'), model, optimizer, 0, extra={'cfg': CfgLike()})
    assert os.listdir(tmp_path) == []


def test_find_last_checkpoint_by_number_then_final(tmp_path):
    assert checkpointer.find_last_checkpoint(str(tmp_path / 'missing')) is None
    assert checkpointer.find_last_checkpoint(str(tmp_path)) is None
    for name in ('model_iter9.pth', 'model_iter19.pth', 'model_iter100.pth', 'model_iter5000.pth.tmp.3f2a',
                 'model_iter7000.pkl', 'notes.txt'):
        (tmp_path / name).write_bytes(b'')
    assert checkpointer.find_last_checkpoint(str(tmp_path)) == str(tmp_path / 'model_iter100.pth')
    (tmp_path / 'model_final.pth').write_bytes(b'')
    assert checkpointer.find_last_checkpoint(str(tmp_path)) == str(tmp_path / 'model_final.pth')


def test_load_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(WeightsError, match='does not exist'):
        checkpointer.load_checkpoint(str(tmp_path / 'nope.pth'), _ToyNet())
    weights_only = str(tmp_path / 'weights.pth')
    torch.save({'model': _ToyNet().state_dict()}, weights_only)
    with pytest.raises(WeightsError, match=r'lacks iteration, optimizer, rng_states, world_size\); to start '
                                           'from its weights use TRAIN.WEIGHTS'):
        checkpointer.load_checkpoint(weights_only, _ToyNet())
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter1.pth')
    checkpointer.save_checkpoint(path, model, optimizer, 1)
    with pytest.raises(WeightsError, match=r"missing \['extra.weight'\], unexpected \[\]"):
        checkpointer.load_checkpoint(path, _ToyNetWithExtraLayer())


class _ToyNetWithExtraLayer(_ToyNet):
    def __init__(self):
        super().__init__()
        self.extra = torch.nn.Linear(2, 2, bias=False)


def test_rng_is_kept_when_the_world_size_changed(tmp_path, caplog):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter3.pth')
    saved = checkpointer.capture_rng_state()
    checkpointer.save_checkpoint(path, model, optimizer, 3, rng_states={0: saved, 1: saved})
    content = torch.load(path, weights_only=True)
    content['world_size'] = 2  # as if two processes had saved it
    torch.save(with_digest(content), path)
    after_save = _draws()
    target = _ToyNet()
    torch.manual_seed(5)
    expected = torch.rand(3).tolist()
    torch.manual_seed(5)
    with caplog.at_level(logging.INFO):
        checkpointer.load_checkpoint(path, target)
    assert torch.rand(3).tolist() == expected  # untouched by the load
    assert _draws() != after_save
    assert 'checkpoint saved by 2 processes' in caplog.text


def test_resume_from_starts_after_the_saved_iteration_and_checks_the_sampler(tmp_path, caplog):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter19.pth')
    checkpointer.save_checkpoint(path, model, optimizer, 19, sampler_state={'seed': 3, 'global_batch_size': 16})
    assert checkpointer.resume_from(path, _ToyNet(), torch.optim.SGD(_ToyNet().parameters(), lr=0.1)) == 20
    assert 'does not continue' not in caplog.text
    fresh = _ToyNet()
    with caplog.at_level(logging.WARNING):
        checkpointer.resume_from(path, fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                 sampler_state={'seed': 3, 'global_batch_size': 8})
    assert 'the data order does not continue the interrupted run' in caplog.text


def test_resume_compares_this_runs_sampler_keys_and_returns_the_saved_sampler_state(tmp_path, caplog):
    # The saved position says where the run stood; only the keys this run passes must match.
    model, optimizer = _trained_model_and_optimizer()
    saved = {'seed': 3, 'global_batch_size': 16, 'position': {'draws': 45, 'skipped': 5}}
    checkpointer.save_checkpoint(str(tmp_path / 'model_iter39.pth'), model, optimizer, 39, sampler_state=saved)
    for seed, warned in ((3, False), (4, True)):
        fresh = _ToyNet()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            resumed = checkpointer.resume_from_last(str(tmp_path), fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                                    sampler_state={'seed': seed, 'global_batch_size': 16})
        assert resumed[1:] == (40, {}, saved)
        assert ("but it was saved with {'seed': 3, 'global_batch_size': 16}: the data order does not continue"
                in caplog.text) == warned


# ----------------------------------------------------------------------------------------------
# toy training, interrupted and resumed (module level: spawned workers import it)

GLOBAL_BATCH = 4
DATA_SEED = 5
# 12 entries, two orientation groups of 6: 2 global batches per epoch, so 10 iterations cross epochs.
TOY_GROUPS = [True, False] * 6


def _toy_dataset():
    generator = torch.Generator().manual_seed(11)
    return torch.randn(12, 1, 4, 4, generator=generator), torch.randn(12, 2, generator=generator)


def _toy_lr(iteration):
    return 0.05 if iteration < 6 else 0.005  # recomputed from the iteration, as Detectron does


def _train_toy(output_dir, last_iter):
    """Train until last_iter (inclusive), resuming from output_dir's newest checkpoint; save there."""
    world_size, rank = comm.get_world_size(), comm.get_rank()
    torch.manual_seed(0)
    model = _ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=_toy_lr(0), momentum=0.9)
    sampler_state = {'seed': DATA_SEED, 'global_batch_size': GLOBAL_BATCH}
    last = checkpointer.find_last_checkpoint(output_dir)
    start_iter = checkpointer.resume_from(last, model, optimizer, sampler_state) if last else 0
    trained = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    batches = GroupedDistributedBatchSampler(TOY_GROUPS, GLOBAL_BATCH // world_size, DATA_SEED, rank,
                                             world_size, start_iter=start_iter)
    inputs, targets = _toy_dataset()
    for iteration, batch in zip(range(start_iter, last_iter + 1), batches):
        for group in optimizer.param_groups:
            group['lr'] = _toy_lr(iteration)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(trained(inputs[batch]), targets[batch]).backward()
        optimizer.step()
    rng_states = checkpointer.gather_rng_states()
    if comm.is_main_process():
        checkpointer.save_checkpoint(os.path.join(output_dir, checkpointer.checkpoint_name(last_iter)), model,
                                     optimizer, last_iter, rng_states=rng_states, sampler_state=sampler_state)
    comm.synchronize()
    return start_iter, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.processes
def test_resumed_training_ends_where_the_uninterrupted_one_does(tmp_path):
    for directory in ('a', 'b', 'c'):
        os.makedirs(tmp_path / directory)
    _, uninterrupted = launch.launch(_train_toy, 1, args=(str(tmp_path / 'a'), 9), device='cpu')
    # Stopped after iteration 3, resumed on 1 process: bit-identical.
    launch.launch(_train_toy, 1, args=(str(tmp_path / 'b'), 3), device='cpu')
    start_iter, same_world = launch.launch(_train_toy, 1, args=(str(tmp_path / 'b'), 9), device='cpu')
    assert start_iter == 4
    for key, value in uninterrupted.items():
        assert torch.equal(same_world[key], value), key
    # Stopped on 1 process, resumed on 2 gloo processes with the same global batch.
    launch.launch(_train_toy, 1, args=(str(tmp_path / 'c'), 3), device='cpu')
    start_iter, two_workers = launch.launch(_train_toy, 2, args=(str(tmp_path / 'c'), 9), device='cpu')
    assert start_iter == 4
    for key, value in uninterrupted.items():
        torch.testing.assert_close(two_workers[key], value, rtol=0, atol=1e-6)
    assert sorted(os.listdir(tmp_path / 'c')) == ['model_iter3.pth', 'model_iter9.pth']
    assert sorted(torch.load(tmp_path / 'c' / 'model_iter9.pth', weights_only=True)['rng_states']) == [0, 1]


# ----------------------------------------------------------------------------------------------
# integrity: the newest intact checkpoint, finite weights only, one line when the disk is full

def _iteration_checkpoints(directory, iterations):
    paths = {}
    for iteration in iterations:
        model, optimizer = _trained_model_and_optimizer(seed=iteration)
        paths[iteration] = str(directory / checkpointer.checkpoint_name(iteration))
        checkpointer.save_checkpoint(paths[iteration], model, optimizer, iteration)
    return paths


def _truncate(path, fraction=0.5):
    with open(path, 'r+b') as f:
        f.truncate(int(os.path.getsize(path) * fraction))


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    paths = _iteration_checkpoints(tmp_path, (9, 14))
    _truncate(paths[14])
    model = _ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with caplog.at_level(logging.INFO, logger='detectron.checkpoint.checkpointer'):
        assert checkpointer.resume_from_last(str(tmp_path), model, optimizer)[:2] == (paths[9], 10)
    warning, = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith('Skipping the newest checkpoint, which cannot be resumed: {} is truncated or not a '
                              'complete checkpoint'.format(paths[14]))
    assert warning.endswith('resuming from the newest intact one, {}'.format(paths[9]))
    assert 'Resuming from checkpoint {}'.format(paths[9]) in caplog.text
    expected, _ = _trained_model_and_optimizer(seed=9)
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def test_damaged_newest_checkpoints_are_all_skipped_and_named(tmp_path, caplog):
    paths = _iteration_checkpoints(tmp_path, (3, 5, 7))
    _truncate(paths[7], 0.9)
    data = bytearray(open(paths[5], 'rb').read())
    data[len(data) // 2] ^= 0xFF  # inside the pickled values or a tensor: unreadable or a digest mismatch
    open(paths[5], 'wb').write(bytes(data))
    model = _ToyNet()
    with caplog.at_level(logging.WARNING, logger='detectron.checkpoint.checkpointer'):
        path, start_iter, _, _ = checkpointer.resume_from_last(str(tmp_path), model,
                                                               torch.optim.SGD(model.parameters(), lr=1))
    assert (path, start_iter) == (paths[3], 4)
    assert 'Skipping the newest checkpoints' in caplog.text
    assert paths[7] in caplog.text and paths[5] in caplog.text


def test_resume_from_last_without_checkpoints_and_with_none_intact(tmp_path):
    model = _ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert checkpointer.resume_from_last(str(tmp_path / 'missing'), model, optimizer) == (None, 0, {}, None)
    paths = _iteration_checkpoints(tmp_path, (1, 2))
    _truncate(paths[1])
    _truncate(paths[2])
    with pytest.raises(WeightsError, match='{} is truncated'.format(paths[2])):
        checkpointer.resume_from_last(str(tmp_path), model, optimizer)


def test_a_readable_checkpoint_of_another_model_is_an_error_not_skipped(tmp_path):
    _iteration_checkpoints(tmp_path, (1,))
    other = _ToyNetWithExtraLayer()
    with pytest.raises(WeightsError, match='does not fit the model'):
        checkpointer.resume_from_last(str(tmp_path), other, torch.optim.SGD(other.parameters(), lr=0.1))


def test_non_finite_or_diverged_weights_are_never_checkpointed(tmp_path):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter9.pth')
    checkpointer.save_checkpoint(path, model, optimizer, 9)
    before = open(path, 'rb').read()
    with torch.no_grad():
        model.fc.weight[0, 1] = float('nan')
    with pytest.raises(checkpointer.DivergedWeightsError) as err:
        checkpointer.save_checkpoint(path, model, optimizer, 19)
    # 4 model tensors and 4 momentum buffers; sqrt(3.4028235e38) = 1.8446743e19.
    assert str(err.value) == (
        'Training diverged by iteration 19: 1 of 8 tensors hold NaN, inf or values beyond 1.8e+19 (e.g. fc.weight); '
        '{} was not written and earlier checkpoints are intact; lower SOLVER.BASE_LR (or add warm-up) or check the '
        'data'.format(path))
    assert open(path, 'rb').read() == before and os.listdir(tmp_path) == ['model_iter9.pth']
    model, optimizer = _trained_model_and_optimizer()
    optimizer.state[model.conv.bias]['momentum_buffer'][0] = float('inf')
    with pytest.raises(checkpointer.DivergedWeightsError, match=r'\(e.g. momentum_buffer of conv.bias\)'):
        checkpointer.save_checkpoint(str(tmp_path / 'model_iter29.pth'), model, optimizer, 29)
    # What BASE_LR 1e6 leaves one step before the loss turns NaN: finite, but diverged.
    model, optimizer = _trained_model_and_optimizer()
    with torch.no_grad():
        model.conv.weight[0, 0, 0, 0] = 3.3e20
    with pytest.raises(checkpointer.DivergedWeightsError, match=r'1 of 8 tensors .*\(e.g. conv.weight\)'):
        checkpointer.save_checkpoint(str(tmp_path / 'model_iter39.pth'), model, optimizer, 39)
    with torch.no_grad():
        model.conv.weight[0, 0, 0, 0] = 1e19  # large, but short of the bound
    checkpointer.save_checkpoint(str(tmp_path / 'model_iter49.pth'), model, optimizer, 49)
    assert sorted(os.listdir(tmp_path)) == ['model_iter49.pth', 'model_iter9.pth']


def test_full_disk_while_saving_is_one_line_and_keeps_the_old_checkpoint(tmp_path, monkeypatch, capsys):
    model, optimizer = _trained_model_and_optimizer()
    path = str(tmp_path / 'model_iter9.pth')
    checkpointer.save_checkpoint(path, model, optimizer, 9)
    real_save = torch.save

    def save_until_the_disk_is_full(obj, f):
        real_save(obj, f)
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(torch, 'save', save_until_the_disk_is_full)
    with pytest.raises(SystemExit) as exit_info:
        run_tool(lambda argv: checkpointer.save_checkpoint(path, model, optimizer, 19), [])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        'error: could not write {} (No space left on device); free space on that disk or set OUTPUT_DIR to one '
        'with room; the existing file is unchanged\n'.format(path))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ['model_iter9.pth']
    assert checkpointer.load_checkpoint(path, _ToyNet())['iteration'] == 9


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_adam_state_with_cpu_step_counters_checkpoints_on_any_device(tmp_path, device):
    # torch's Adam keeps its 'step' counters as CPU tensors even for CUDA parameters.
    model = torch.nn.Linear(3, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3, device=device)).sum().backward()
    optimizer.step()
    assert optimizer.state[model.weight]['step'].device.type == 'cpu'
    checkpointer.save_checkpoint(str(tmp_path / 'model_iter0.pth'), model, optimizer, 0)
    assert checkpointer.load_checkpoint(str(tmp_path / 'model_iter0.pth'), model, optimizer)['iteration'] == 0


# ----------------------------------------------------------------------------------------------
# retention: which files a run writes and keeps

def test_detectron_retention_writes_a_numbered_file_each_period():
    retention = checkpointer.Retention()
    assert [retention.names(i, periodic=(i + 1) % 2 == 0) for i in range(4)] == \
        [[], ['model_iter1.pth'], [], ['model_iter3.pth']]


def test_centernet_retention_overwrites_model_last_and_keeps_the_lr_steps():
    # One epoch = 2 iterations; the LR drops at iteration 4: the checkpoint before the drop is kept.
    retention = checkpointer.Retention(last=True, milestones=frozenset({3}))
    assert [retention.names(i, periodic=(i + 1) % 2 == 0) for i in range(6)] == \
        [[], ['model_last.pth'], [], ['model_last.pth', 'model_iter3.pth'], [], ['model_last.pth']]
    # A period longer than the run (TRAIN.SNAPSHOT_ITERS 1000000): the LR steps only, model_last with them.
    assert [retention.names(i, periodic=False) for i in range(6)] == \
        [[], [], [], ['model_last.pth', 'model_iter3.pth'], [], []]


def test_pruning_keeps_the_newest_numbered_files_and_never_last_or_final(tmp_path):
    names = ['model_iter9.pth', 'model_iter19.pth', 'model_iter100.pth', 'model_last.pth', 'model_final.pth',
             'model_iter5.pth.tmp.3f2a', 'notes.txt']
    for name in names:
        (tmp_path / name).write_bytes(b'')
    assert checkpointer.prune_checkpoints(str(tmp_path), 0) == []
    assert checkpointer.prune_checkpoints(str(tmp_path), 2) == [str(tmp_path / 'model_iter9.pth')]
    assert checkpointer.prune_checkpoints(str(tmp_path), 1) == [str(tmp_path / 'model_iter19.pth')]
    assert sorted(os.listdir(tmp_path)) == sorted(set(names) - {'model_iter9.pth', 'model_iter19.pth'})


def test_resume_takes_model_last_before_the_numbered_files_and_falls_back_when_damaged(tmp_path, caplog):
    paths = _iteration_checkpoints(tmp_path, [3, 7])
    model, optimizer = _trained_model_and_optimizer(seed=9)
    last = str(tmp_path / checkpointer.LAST_CHECKPOINT_NAME)
    checkpointer.save_checkpoint(last, model, optimizer, 9)
    assert checkpointer.find_last_checkpoint(str(tmp_path)) == last
    fresh, fresh_optimizer = _trained_model_and_optimizer(seed=1)
    path, start_iter, _, _ = checkpointer.resume_from_last(str(tmp_path), fresh, fresh_optimizer)
    assert (path, start_iter) == (last, 10)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    _truncate(last)
    with caplog.at_level(logging.WARNING):
        path, start_iter, _, _ = checkpointer.resume_from_last(str(tmp_path), fresh, fresh_optimizer)
    assert (path, start_iter) == (paths[7], 8)
    assert 'model_last.pth' in caplog.text


def test_a_copied_checkpoint_reads_as_the_original(tmp_path):
    paths = _iteration_checkpoints(tmp_path, [4])
    copy = str(tmp_path / checkpointer.LAST_CHECKPOINT_NAME)
    checkpointer.copy_checkpoint(paths[4], copy)
    with open(paths[4], 'rb') as a, open(copy, 'rb') as b:
        assert a.read() == b.read()
    assert [name for name in os.listdir(tmp_path) if '.tmp.' in name] == []


# ----------------------------------------------------------------------------------------------
# one host copy per tensor

class _HostCopies(TorchDispatchMode):
    """The shapes of the tensors that copy-like operators (a device-to-host copy, clone, contiguous,
    copy_) write into host memory while the mode is on."""
    COPIES = (torch.ops.aten._to_copy.default, torch.ops.aten.clone.default, torch.ops.aten.copy_.default)

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.COPIES and isinstance(out, torch.Tensor) and out.device.type == 'cpu':
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_a_checkpoint_copies_each_tensor_to_the_host_at_most_once(tmp_path, device):
    # channels_last weights (and Adam's moments, which follow their layout) are the case where the
    # digest used to make a second, contiguous host copy after the device-to-host one.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    model = model.to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 3, 4, 4, device=device)).square().mean().backward()
    optimizer.step()
    assert not model[0].weight.is_contiguous()
    tensors = list(model.state_dict().values()) + [v for state in optimizer.state.values() for v in state.values()]
    if device == 'cpu':  # host tensors: only the non-contiguous ones need a (contiguous) copy
        expected = [tuple(t.shape) for t in tensors if not t.is_contiguous()]
        assert len(expected) == 3  # conv weight, exp_avg, exp_avg_sq
    else:  # device tensors: each copied to the host once (Adam's step counters live on the host already)
        expected = [tuple(t.shape) for t in tensors if t.device.type == 'cuda']
    rng_states = {0: checkpointer.capture_rng_state()}
    path = str(tmp_path / 'model_iter0.pth')
    with _HostCopies() as copies:
        checkpointer.save_checkpoint(path, model, optimizer, 0, rng_states=rng_states)
    assert sorted(copies.shapes) == sorted(expected)
    # Stored contiguous: verifying the digest when the file is read copies nothing either.
    stored = torch.load(path, weights_only=True)
    stored_tensors = list(stored['model'].values()) + [v for state in stored['optimizer']['state'].values()
                                                       for v in state.values()]
    assert len(stored_tensors) == len(tensors) and all(t.is_contiguous() for t in stored_tensors)
    saved = checkpointer.load_checkpoint(path, copy.deepcopy(model).cpu())  # digest checked
    for key, value in model.state_dict().items():
        assert torch.equal(saved['model'][key], value.cpu()), key
