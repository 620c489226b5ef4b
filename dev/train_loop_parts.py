"""Where train_net's iteration time goes beyond the bare step: the training loop (TrainLoop, with
train_net's hooks) over the same batches fed four ways, in interleaved rounds on one model (its CUDA
graphs and cuDNN plans made once, in a first untimed pass of every way):

- loader: train_net's loader, positioned at --start (workers, pin-memory thread, batch_to_device);
- host_replay: those batches drawn once and kept on the host, moved by batch_to_device each step;
- device_replay: those batches kept on the device;
- device_replay_no_hooks: the same with only the learning-rate hook;
- bare_step: the benchmark's bare training step (tools/benchmark.py's replay row) on the device batches,
  without TrainLoop;
- device_replay_with_<hook>: the learning-rate hook and one other of train_net's (--per-hook).

Medians of the per-iteration wall times after --warmup iterations of each run; the rounds run the ways in a
rotated order. The tail of each way follows: its mean, 90th percentile and slowest iteration, and how many
iterations took over 1.5x its median, counted by their position in train_net's 20-iteration logging period.
With all hooks, each hook's own host time per iteration is printed too (its calls timed on
the host, so a hook that waits for the GPU shows the wait). BENCHMARKS.md, "Mask R-CNN".

    python dev/train_loop_parts.py --cfg configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml --dataset coco_tiny_train \
        [--catalog catalog.json] [--iters 100 --warmup 20 --rounds 3] [--per-hook] [KEY VALUE ...]
"""
import argparse
import collections
import functools
import itertools
import statistics
import tempfile
import time

import torch

from detectron.core import train_engine
from detectron.core.config import adopt_cfg, cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.core.hooks import LRScheduler
from detectron.core.train_loop import AMP_DTYPES, TrainLoop
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--cfg', required=True)
    parser.add_argument('--dataset', required=True, nargs='+', help='the training datasets (TRAIN.DATASETS)')
    parser.add_argument('--catalog', default='', help='DATASET_CATALOG')
    parser.add_argument('--batch', type=int, default=2, help='TRAIN.IMS_PER_BATCH')
    parser.add_argument('--start', type=int, default=100, help='the iteration whose batch comes first')
    parser.add_argument('--iters', type=int, default=100)
    parser.add_argument('--warmup', type=int, default=20, help='iterations of each run not timed')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--per-hook', action='store_true', help='also a row per hook on device batches')
    parser.add_argument('opts', nargs=argparse.REMAINDER, help='config overrides, KEY VALUE ...')
    return parser.parse_args()


class IterationTimes:
    """Runs first among the hooks: the wall time at the end of each iteration's step."""

    def __init__(self, device, last_iter):
        self.device, self.last_iter = device, last_iter
        self.times = []

    def after_step(self, loop):
        if loop.iter == self.last_iter and self.device.type == 'cuda':
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())


class HostTimed:
    """A hook whose per-iteration calls (before_step, after_step, writes_at) add their host time to
    `seconds`."""
    PER_ITERATION = ('before_step', 'after_step', 'writes_at')

    def __init__(self, hook):
        self.hook = hook
        self.seconds = 0.0

    def __getattr__(self, name):
        method = getattr(self.hook, name)
        if name not in self.PER_ITERATION:
            return method

        def timed(*args):
            tic = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.seconds += time.perf_counter() - tic
        return timed


def timed_run(model, optimizer, source, batch_to_device, hooks, args, device):
    """ms per iteration of one run of the loop over args.iters batches of source, after the warm-up."""
    clock = IterationTimes(device, args.start + args.iters - 1)
    loop = TrainLoop(model, optimizer, source, device, args.start, args.start + args.iters,
                     train_engine.step_options(), [clock] + hooks, batch_to_device=batch_to_device)
    loop.run()
    return [1000 * (b - a) for a, b in zip(clock.times, clock.times[1:])][args.warmup:]


def bare_run(model, optimizer, batches, args, device):
    """ms per iteration of the benchmark's bare step (zero_grad, forward under train_net's
    autocast, sum of the losses, backward, optimizer step) over the batches."""
    step = train_engine.step_options()
    times = []
    for index, batch in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=AMP_DTYPES[step.amp_dtype], enabled=step.amp):
            losses = model(*batch)
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        optimizer.step()
        if index == len(batches) - 1 and device.type == 'cuda':
            torch.cuda.synchronize()
        times.append(time.perf_counter())
    return [1000 * (b - a) for a, b in zip(times, times[1:])][args.warmup:]


def tail(steps, first_iter):
    """The mean, 90th percentile and slowest of the iteration times, and the slow ones (over 1.5x the
    median) counted by their iteration number modulo 20; first_iter: the first timed iteration's number."""
    slow_limit = 1.5 * statistics.median(steps)
    slow_at = collections.Counter((first_iter + i) % 20 for i, ms in enumerate(steps) if ms > slow_limit)
    return 'mean {:.2f}, p90 {:.2f}, max {:.2f}, {} over 1.5x the median (by iteration % 20: {})'.format(
        statistics.fmean(steps), sorted(steps)[int(0.9 * (len(steps) - 1))], max(steps), sum(slow_at.values()),
        dict(sorted(slow_at.items())))


def main():
    args = parse_args()
    output_dir = tempfile.mkdtemp()
    catalog = ['DATASET_CATALOG', args.catalog] if args.catalog else []
    # The model type's keys of a timed run (CenterNet's: whole epochs of its own keys), as tools/benchmark.py's.
    defaults = cfg.clone()
    finalize_cfg(args.cfg, ['NUM_GPUS', '1'] + catalog + args.opts)
    run_opts = model_builder.build_model_type(cfg).training_run_opts(args.dataset, args.batch,
                                                                      args.start + args.iters, 1e-12)
    adopt_cfg(defaults)
    cfg.defrost()
    finalize_cfg(args.cfg, ['NUM_GPUS', '1', 'TRAIN.WEIGHTS', "''", 'TRAIN.SNAPSHOT_ITERS', '100000000',
                            'OUTPUT_DIR', output_dir] + catalog + args.opts + run_opts, training=True)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    torch.backends.cudnn.benchmark = cfg.CUDNN_BENCHMARK
    model_type = model_builder.build_model_type(cfg)
    model = model_type.prepare_for_training(model_builder.checked_model(model_type).to(device))
    schedule = train_engine.lr_schedule()
    optimizer = build_optimizer(model, base_lr=schedule.lr_at(0), momentum=cfg.SOLVER.MOMENTUM,
                                weight_decay=cfg.SOLVER.WEIGHT_DECAY, weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_GN,
                                name=cfg.SOLVER.OPTIMIZER)
    to_device = model_type.batch_to_device(device)

    def loader():
        return train_engine.training_batches(model_type, args.start, device)[0]

    host_batches = list(itertools.islice(loader(), args.iters))
    device_batches = [to_device(batch) for batch in host_batches]

    def all_hooks():
        return train_engine.training_hooks(model_type, schedule, output_dir)

    timed_hooks = []

    def device_replay_timed():
        timed_hooks[:] = [HostTimed(hook) for hook in all_hooks()]
        return iter(device_batches), None, timed_hooks

    ways = {
        'loader': lambda: (loader(), to_device, all_hooks()),
        'host_replay': lambda: (iter(host_batches), to_device, all_hooks()),
        'device_replay': device_replay_timed,
        'device_replay_no_hooks': lambda: (iter(device_batches), None, [LRScheduler(schedule.lr_at)]),
    }
    def device_replay_with(index):
        hooks = all_hooks()
        return iter(device_batches), None, [hooks[0], hooks[index]]  # the learning rate's and one other

    if args.per_hook:
        for index, hook in enumerate(all_hooks()[1:], start=1):
            ways['device_replay_with_' + type(hook).__name__] = functools.partial(device_replay_with, index)
    runs = {name: functools.partial(lambda way: timed_run(model, optimizer, *way(), args, device), way)
            for name, way in ways.items()}
    runs['bare_step'] = lambda: bare_run(model, optimizer, device_batches, args, device)
    for run in runs.values():
        run()
    results = {name: [] for name in runs}
    all_steps = {name: [] for name in runs}
    hook_ms = collections.defaultdict(list)
    names = list(runs)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            steps = runs[name]()
            results[name].append(statistics.median(steps))
            all_steps[name].extend(steps)
            if name == 'device_replay':
                for hook in timed_hooks:
                    hook_ms[type(hook.hook).__name__].append(1000 * hook.seconds / args.iters)
    for name, times in results.items():
        print('{:<40} ms per iteration: median {:.2f} (rounds {})'.format(
            name, statistics.median(times), ', '.join('{:.2f}'.format(t) for t in times)))
    for name, steps in all_steps.items():
        # The first timed step ends iteration start + warmup + 1 (the clock's first mark ends start's).
        print('{:<40} {}'.format(name, tail(steps, args.start + args.warmup + 1)))
    for name, times in hook_ms.items():
        print('{:<40} host ms per iteration: median {:.3f} (rounds {})'.format(
            'hook ' + name, statistics.median(times), ', '.join('{:.3f}'.format(t) for t in times)))


if __name__ == '__main__':
    main()
