"""Forward + backward of resdcn_18's three DCN layers (batch 32 at 512 x 512: 512 -> 256 channels at
16 x 16, 256 -> 128 at 32 x 32, 128 -> 64 at 64 x 64) under bf16 autocast on CUDA: the Triton kernels
against grid_sample's path, in interleaved rounds, medians in ms.

  python dev/dcn_layers_bench.py [--batch 32] [--rounds 3] [--iters 20]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from detectron.ops import deform_conv

LAYERS = ((512, 256, 16), (256, 128, 32), (128, 64, 64))


def layer_inputs(batch, channels, out_channels, size):
    """bf16 features and predictor output (offsets of about 2 px), float32 weight and bias."""
    x = torch.randn(batch, channels, size, size, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    raw = (2 * torch.randn(batch, 27, size, size, device='cuda')).bfloat16().requires_grad_()
    weight = torch.randn(out_channels, channels, 3, 3, device='cuda', requires_grad=True)
    bias = torch.randn(out_channels, device='cuda', requires_grad=True)
    return x, raw, weight, bias


def step(x, raw, weight, bias):
    with torch.autocast('cuda', dtype=torch.bfloat16):
        out = deform_conv.modulated_deform_conv2d(x, raw[:, :18], torch.sigmoid(raw[:, 18:]), weight, bias, padding=1)
    out.float().square().mean().backward()


def ms_per_step(inputs, iters):
    for _ in range(3):
        step(*inputs)
    torch.cuda.synchronize()
    tic = time.perf_counter()
    for _ in range(iters):
        step(*inputs)
    torch.cuda.synchronize()
    return 1000.0 * (time.perf_counter() - tic) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--iters', type=int, default=20)
    args = parser.parse_args()
    kernels = deform_conv._use_sampling_kernel
    grid_sample = lambda *a: False  # noqa: E731
    for channels, out_channels, size in LAYERS:
        inputs = layer_inputs(args.batch, channels, out_channels, size)
        times = {'kernels': [], 'grid_sample': []}
        for _ in range(args.rounds):
            for name, chooser in (('grid_sample', grid_sample), ('kernels', kernels)):
                deform_conv._use_sampling_kernel = chooser
                times[name].append(ms_per_step(inputs, args.iters))
        deform_conv._use_sampling_kernel = kernels
        print('{} -> {} channels at {} x {}: kernels {:.3f} ms, grid_sample {:.3f} ms'.format(
            channels, out_channels, size, size, statistics.median(times['kernels']),
            statistics.median(times['grid_sample'])), flush=True)


if __name__ == '__main__':
    main()
