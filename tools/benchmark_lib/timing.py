"""Interleaved timing: rows of steps timed in rounds, medians and per-round ratios, the memory each row holds."""
import contextlib
import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from detectron.core.config import cfg
from detectron.utils import cuda_graphs

PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16}


def spread(values):
    """Median, min and max of a list of numbers."""
    values = [float(v) for v in values]
    return {'median': float(np.median(values)), 'min': min(values), 'max': max(values)}


def per_round_ratios(numerators, denominators):
    """numerators[i] / denominators[i]: rounds are paired, so machine drift cancels per round."""
    if len(numerators) != len(denominators):
        raise ValueError('ratios need the same number of rounds, got {} and {}'.format(
            len(numerators), len(denominators)))
    return [float(a) / float(b) for a, b in zip(numerators, denominators)]


@contextlib.contextmanager
def cfg_values(values):
    """Temporarily set global cfg keys ({'STD_NMS': True, 'TEST.SCALE': 256, ...})."""
    frozen = cfg.is_frozen()
    cfg.immutable(False)
    saved = {}
    try:
        for key, value in values.items():
            node, leaf = _cfg_node(key)
            saved[key] = node[leaf]
            node[leaf] = value
        yield
    finally:
        for key, value in saved.items():
            node, leaf = _cfg_node(key)
            node[leaf] = value
        cfg.immutable(frozen)


def _cfg_node(key):
    *path, leaf = key.split('.')
    node = cfg
    for name in path:
        node = node[name]
    return node, leaf


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast(device, precision):
    dtype = PRECISIONS[precision]
    return torch.autocast(device_type=device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


@contextlib.contextmanager
def cudnn_autotuning(enabled):
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


@dataclass
class Row:
    """One timed configuration: section 'train' values are images/s, 'test' values ms/image,
    'startup' values seconds, 'demo' values minutes."""
    section: str
    name: str
    step: Callable[[], object]
    images_per_step: int
    resident: Callable[[], list] = list  # this row's tensors that stay allocated between rounds
    graph_owners: Callable[[], list] = list  # modules whose CUDA graphs (and their memory) the row holds
    cfg: dict = field(default_factory=dict)  # global cfg values while the row runs
    info: dict = field(default_factory=dict)  # facts measured once (RoIs, candidates, ...)
    after: Callable[[], dict] = dict  # facts read after the rounds (were the losses finite?)
    values: list = field(default_factory=list)
    peaks_mib: list = field(default_factory=list)
    # Timed steps per round instead of --iters: a row replaying a loop's inputs times whole passes
    # over them, so that every input counts once per round whatever the round's first input.
    steps_per_round: int = None

    def value(self, elapsed, iters):
        if self.section == 'train':
            return self.images_per_step * iters / elapsed
        return 1000.0 * elapsed / (iters * self.images_per_step)

    @property
    def unit(self):
        return {'train': 'images/s', 'startup': 's', 'demo': 'min'}.get(self.section, 'ms/image')


def run_interleaved(rows, rounds, iters, warmup, round_warmup, device, clock=time.perf_counter):
    """Warm every row up, then `rounds` rounds in which each row in turn runs round_warmup untimed
    and `iters` (or its steps_per_round) timed steps between device synchronisations; fills
    row.values and, on CUDA, row.peaks_mib."""
    for row in rows:
        with cfg_values(row.cfg):
            for _ in range(warmup):
                row.step()
    for _ in range(rounds):
        for row in rows:
            with cfg_values(row.cfg):
                others = _start_memory_window(row, device)
                for _ in range(round_warmup):
                    row.step()
                steps = row.steps_per_round or iters
                sync(device)
                tic = clock()
                for _ in range(steps):
                    row.step()
                sync(device)
                row.values.append(row.value(clock() - tic, steps))
                if others is not None:
                    row.peaks_mib.append((torch.cuda.max_memory_allocated(device) - others) / 2 ** 20)


def _start_memory_window(row, device):
    """Resets the peak and returns the bytes held by everything but this row (the other rows'
    models stay allocated while rows interleave): the peak minus them is this row's; None off CUDA."""
    if device.type != 'cuda':
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = _cuda_bytes(row.resident()) + graph_pool_bytes(row.graph_owners())
    return torch.cuda.memory_allocated(device) - held


def graph_pool_bytes(owners):
    """Bytes in use in the memory pools of the owners' CUDA graphs, captured during a row's warm-up
    and held by it between steps like its tensors."""
    pools = {pool for owner in owners for pool in cuda_graphs.graph_pools(owner)}
    return pool_bytes(pools, torch.cuda.memory_snapshot()) if pools else 0


def pool_bytes(pools, segments):
    """Allocated bytes of the memory_snapshot() segments that belong to the given pools."""
    return sum(s['allocated_size'] for s in segments if tuple(s['segment_pool_id']) in pools)


def _cuda_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or not t.is_cuda or t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()
    return total


def model_tensors(model, optimizer=None):
    tensors = list(model.parameters()) + list(model.buffers()) + [p.grad for p in model.parameters()]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return tensors


def flat_tensors(nested):
    if torch.is_tensor(nested):
        return [nested]
    if isinstance(nested, dict):
        nested = list(nested.values())
    if isinstance(nested, (list, tuple)):
        return [t for item in nested for t in flat_tensors(item)]
    return []


def free_device_memory(device):
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def in_turn(step_on, items):
    """A step calling step_on on the items one after another, round and round."""
    items_in_turn = itertools.cycle(items)
    return lambda: step_on(next(items_in_turn))


def timed_pass(step_on, items, device, clock=time.perf_counter):
    """Seconds of one pass of step_on over the items, between device synchronisations."""
    sync(device)
    tic = clock()
    for item in items:
        step_on(item)
    sync(device)
    return clock() - tic


def capture(module, run, pick, pre=False):
    """pick(inputs) (pre=True) or pick(output) of the module's last call while run() runs."""
    seen = []
    if pre:
        handle = module.register_forward_pre_hook(lambda m, inputs: seen.append(pick(inputs)))
    else:
        handle = module.register_forward_hook(lambda m, inputs, output: seen.append(pick(output)))
    try:
        run()
    finally:
        handle.remove()
    return seen[-1]
