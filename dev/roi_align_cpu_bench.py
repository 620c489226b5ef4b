"""CPU RoIAlign, forward + backward: torchvision's roi_align per FPN level against
detectron.ops.sparse_roi_align (BENCHMARKS.md, "CPU demos"). Checks that both give the same pooled
features and gradients, then times them in interleaved rounds (medians).

    python dev/roi_align_cpu_bench.py [--rois 512] [--channels 128] [--sampling-ratio 2] [--rounds 15]
"""
import argparse
import statistics
import time

import torch
from torchvision.ops import roi_align

from detectron.ops import sparse_roi_align
from detectron.ops.roi_pooling import map_rois_to_fpn_levels

SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rois', type=int, default=512)
    parser.add_argument('--channels', type=int, default=128)
    parser.add_argument('--sampling-ratio', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    # The CPU demos' batch: 4 images of 128 x 192 px, P2..P5, RoIs of the shapes' sizes (mostly on P2).
    features = [torch.randn(4, args.channels, 32 // 2 ** k, 48 // 2 ** k, requires_grad=True) for k in range(4)]
    corner = torch.rand(args.rois, 2) * torch.tensor([180.0, 120.0])
    rois = torch.cat([torch.randint(0, 4, (args.rois, 1)).float(), corner,
                      corner + 8 + torch.rand(args.rois, 2) * 100], 1)
    levels = map_rois_to_fpn_levels(rois[:, 1:5]) - 2
    grad = torch.randn(args.rois, args.channels, 7, 7)

    def per_level():
        out = torch.zeros(args.rois, args.channels, 7, 7)
        for k, feature in enumerate(features):
            rows = (levels == k).nonzero().squeeze(1)
            out = out.index_put((rows,), roi_align(feature, rois[rows], 7, SCALES[k], args.sampling_ratio,
                                                   aligned=False))
        return out, torch.autograd.grad(out, features, grad)

    def sparse():
        out = sparse_roi_align.roi_align_levels(features, rois, levels, SCALES, 7, args.sampling_ratio)
        return out, torch.autograd.grad(out, features, grad)

    (a, grads_a), (b, grads_b) = per_level(), sparse()
    same = torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(grads_a, grads_b))
    print('RoIs per level {}; pooled features and gradients bit-equal: {}'.format(
        torch.bincount(levels, minlength=4).tolist(), same))
    times = {'torchvision per level': [], 'sparse_roi_align': []}
    for _ in range(args.rounds):
        for name, fn in (('torchvision per level', per_level), ('sparse_roi_align', sparse)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, ms in medians.items():
        print('{}: {:.2f} ms forward + backward (median of {})'.format(name, ms, args.rounds))
    print('ratio {:.2f}x'.format(medians['torchvision per level'] / medians['sparse_roi_align']))


if __name__ == '__main__':
    main()
