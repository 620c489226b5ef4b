"""CenterNet's training colour jitter and normalisation of a uint8 batch on CUDA (batch 32 at 512 x 512 by
default, random pictures and draws): ops/jitter_normalize.py's Triton kernels against the same arithmetic as
PyTorch ops, in interleaved rounds, medians in ms per batch; and how far apart their values are.

  python dev/jitter_normalize_bench.py [--batch 32] [--size 512] [--rounds 3] [--iters 20]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from detectron.modeling import centernet
from detectron.roi_data import centernet as cn


def batch(count, size):
    rng = np.random.RandomState(0)
    images = torch.from_numpy(rng.randint(0, 256, (count, size, size, 3)).astype(np.uint8)).cuda()
    arrays = [cn.jitter_arrays(cn.draw_color_jitter(rng)) for _ in range(count)]
    return images, {k: torch.from_numpy(np.stack([a[k] for a in arrays])).cuda() for k in arrays[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--size', type=int, default=512)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--iters', type=int, default=20)
    args = parser.parse_args()
    images, jitter = batch(args.batch, args.size)
    ways = {'kernels': centernet.normalize_training_images, 'torch ops': centernet.jitter_normalize_by_torch_ops}
    kernels, ops = (way(images, jitter, cn.COCO_MEAN, cn.COCO_STD) for way in ways.values())
    print('max |kernels - torch ops| {:.3g}, equal values {:.1%}'.format(
        (kernels - ops).abs().max().item(), (kernels == ops).float().mean().item()))
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            for _ in range(3):
                way(images, jitter, cn.COCO_MEAN, cn.COCO_STD)
            torch.cuda.synchronize()
            tic = time.perf_counter()
            for _ in range(args.iters):
                way(images, jitter, cn.COCO_MEAN, cn.COCO_STD)
            torch.cuda.synchronize()
            times[name].append(1000 * (time.perf_counter() - tic) / args.iters)
    for name, values in times.items():
        print('{:<10} ms per batch of {} at {}x{}: median {:.3f} (rounds {})'.format(
            name, args.batch, args.size, args.size, statistics.median(values), ', '.join('%.3f' % v for v in values)))


if __name__ == '__main__':
    main()
