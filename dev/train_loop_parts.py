"""Where train_net's iteration time goes beyond the bare step: the training loop (TrainLoop, with
train_net's hooks) over the same batches fed four ways, in interleaved rounds on one model (its CUDA
graphs and cuDNN plans made once, in a first untimed pass of every way):

- loader: train_net's loader, positioned at --start (workers, pin-memory thread, batch_to_device);
- host_replay: those batches drawn once and kept on the host, moved by batch_to_device each step;
- device_replay: those batches kept on the device;
- device_replay_no_hooks: the same with only the learning-rate hook.

Medians of the per-iteration wall times after --warmup iterations of each run. BENCHMARKS.md, "Mask R-CNN".

    python dev/train_loop_parts.py --cfg configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml --dataset coco_tiny_train \
        [--catalog catalog.json] [--iters 100 --warmup 20 --rounds 3] [KEY VALUE ...]
"""
import argparse
import itertools
import statistics
import tempfile
import time

import torch

from detectron.core import train_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.core.hooks import LRScheduler
from detectron.core.train_loop import TrainLoop
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--cfg', required=True)
    parser.add_argument('--dataset', required=True, help='the training dataset (TRAIN.DATASETS)')
    parser.add_argument('--catalog', default='', help='DATASET_CATALOG')
    parser.add_argument('--batch', type=int, default=2, help='TRAIN.IMS_PER_BATCH')
    parser.add_argument('--start', type=int, default=100, help='the iteration whose batch comes first')
    parser.add_argument('--iters', type=int, default=100)
    parser.add_argument('--warmup', type=int, default=20, help='iterations of each run not timed')
    parser.add_argument('--rounds', type=int, default=3)
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


def timed_run(model, optimizer, source, batch_to_device, hooks, args, device):
    """ms per iteration (median) of one run of the loop over args.iters batches of source."""
    clock = IterationTimes(device, args.start + args.iters - 1)
    loop = TrainLoop(model, optimizer, source, device, args.start, args.start + args.iters,
                     train_engine.step_options(), [clock] + hooks, batch_to_device=batch_to_device)
    loop.run()
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])][args.warmup:]
    return 1000 * statistics.median(steps)


def main():
    args = parse_args()
    output_dir = tempfile.mkdtemp()
    catalog = ['DATASET_CATALOG', args.catalog] if args.catalog else []
    finalize_cfg(args.cfg, ['NUM_GPUS', '1', 'TRAIN.DATASETS', "('{}',)".format(args.dataset), 'TRAIN.WEIGHTS', "''",
                            'TRAIN.IMS_PER_BATCH', str(args.batch), 'SOLVER.BASE_LR', '1e-12',
                            'SOLVER.MAX_ITER', str(args.start + args.iters), 'TRAIN.SNAPSHOT_ITERS', '100000000',
                            'OUTPUT_DIR', output_dir] + catalog + args.opts, training=True)
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

    ways = {
        'loader': lambda: (loader(), to_device, all_hooks()),
        'host_replay': lambda: (iter(host_batches), to_device, all_hooks()),
        'device_replay': lambda: (iter(device_batches), None, all_hooks()),
        'device_replay_no_hooks': lambda: (iter(device_batches), None, [LRScheduler(schedule.lr_at)]),
    }
    for way in ways.values():
        timed_run(model, optimizer, *way(), args, device)
    results = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            results[name].append(timed_run(model, optimizer, *way(), args, device))
    for name, times in results.items():
        print('{:<24} ms per iteration: median {:.2f} (rounds {})'.format(
            name, statistics.median(times), ', '.join('{:.2f}'.format(t) for t in times)))


if __name__ == '__main__':
    main()
