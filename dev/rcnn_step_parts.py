"""Where the host time of the R-CNN training step goes: ms per step in each part of the forward, the
backward and the optimizer, timed on the host without synchronising inside the step (a part that
synchronises includes its wait for the GPU), then again with a synchronisation after every step, then
the GPU kernel time per step under torch.profiler. BENCHMARKS.md, "Training speed".

    python dev/rcnn_step_parts.py --batch 2 [--compact-rois] [--eager-roi-align] [--height 800 --width 1333] [KEY VALUE ...]
"""
import argparse
import collections
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tools'))
from benchmark_lib.inputs import ours_train_inputs, synthetic_batch
from benchmark_lib.rcnn_rows import build_ours_for_training
from benchmark_lib.timing import autocast, sync

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import fast_rcnn_heads, generalized_rcnn, mask_rcnn_heads, model_builder, rpn_heads
from detectron.modeling.optimizer import build_optimizer
from detectron.ops import multilevel_roi_align

HOST_MS = collections.defaultdict(float)

# (module or class, function name) of the parts timed inside the forward. The RPN stage (the RPN targets, the
# proposals and, without a keypoint head, the RoI sampling; replayed from a CUDA graph on a GPU) does the work of
# rpn_targets and sample_rois, which it does not call on a GPU.
PARTS = [(generalized_rcnn.GeneralizedRCNN, '_rpn_and_roi_targets'),
         (generalized_rcnn, 'rpn_targets'), (generalized_rcnn, 'sample_rois'),
         (generalized_rcnn, 'roi_feature_transform'), (rpn_heads, 'rpn_losses'),
         (rpn_heads, 'generate_proposals'), (fast_rcnn_heads, 'fast_rcnn_losses'), (fast_rcnn_heads, 'kl_loss'),
         (generalized_rcnn, 'mask_targets'), (mask_rcnn_heads, 'mask_loss')]


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            HOST_MS[name] += 1000 * (time.perf_counter() - start)
    return wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--cfg', default='configs/e2e_faster_rcnn_R-50-FPN_2x.yaml')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--height', type=int, default=800)
    parser.add_argument('--width', type=int, default=1333)
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--eager-roi-align', action='store_true',
                        help="torchvision's roi_align per level instead of the Triton kernels")
    parser.add_argument('--compact-rois', action='store_true',
                        help='the compact proposals and RoIs (host synchronisations) instead of the fixed-size ones')
    parser.add_argument('opts', nargs=argparse.REMAINDER, help='config overrides (KEY VALUE ...)')
    args = parser.parse_args()
    finalize_cfg(args.cfg, args.opts)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    precision = 'bf16' if device.type == 'cuda' else 'fp32'
    torch.backends.cudnn.benchmark = True
    if args.eager_roi_align:
        multilevel_roi_align.kernel_applies = lambda *unused: False
    if args.compact_rois:
        generalized_rcnn.fixed_size_training_rois = lambda device: False
    for module, name in PARTS:
        setattr(module, name, timed(name, getattr(module, name)))

    model = build_ours_for_training(model_builder.build_model_type(cfg), device, precision).train()
    model.box_head.forward = timed('box_head', model.box_head.forward)
    model.box_outs.forward = timed('box_outs', model.box_outs.forward)
    if model.mask_head is not None:
        model.mask_head.forward = timed('mask_head', model.mask_head.forward)
    inputs = ours_train_inputs(*synthetic_batch(args.batch, args.height, args.width, 20, cfg.MODEL.NUM_CLASSES),
                               device)
    optimizer = build_optimizer(model, base_lr=0.0, momentum=cfg.SOLVER.MOMENTUM, weight_decay=cfg.SOLVER.WEIGHT_DECAY)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            losses = timed('forward (all parts)', model)(*inputs)
        total = sum(v for k, v in losses.items() if k.startswith('loss'))
        timed('backward', total.backward)()
        timed('optimizer step', optimizer.step)()

    for _ in range(10):  # graph captures, autotuning
        step()
    for mode in ('no sync inside', 'sync after each step'):
        HOST_MS.clear()
        sync(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
            if mode != 'no sync inside':
                sync(device)
        sync(device)
        wall = 1000 * (time.perf_counter() - start) / args.steps
        print('{}: {:.2f} ms per step, {:.1f} images/s'.format(mode, wall, args.batch * 1000 / wall))
        for name, ms in sorted(HOST_MS.items(), key=lambda kv: -kv[1]):
            print('  {:<24} {:7.2f} ms per step'.format(name, ms / args.steps))
    if device.type == 'cuda':
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            sync(device)
        kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
        print('GPU kernel time: {:.2f} ms per step'.format(kernel_us / 1000 / 5))


if __name__ == '__main__':
    main()
