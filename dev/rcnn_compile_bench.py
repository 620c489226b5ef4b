#!/usr/bin/env python3
"""The R-CNN test path with a bounded torch.compile: ms/image of the eager detector beside the same
detector whose body + RPN head, box head (and mask head) are compiled with dynamic=False, at one fixed
image size. The heads see their RoIs padded to a fixed row count (the test's RPN_POST_NMS_TOP_N, the
mask head's DETECTIONS_PER_IM), so each part compiles once; proposals, NMS and the RoIAlign stay
eager (their data-dependent shapes are what made compiling the whole graph run for minutes).

    python dev/rcnn_compile_bench.py --cfg configs/getting_started/shapes_demo_R-18-FPN_kl.yaml \
        --device cuda --size 800 1216 --images 20 --rounds 3 [--wts model_final.pth] [KEY VALUE ...]

Prints the compile time (the first compiled image), the largest score and box differences between
the two detectors' detections (core/export.compare) and the timing table. Without --wts the model has
random weights (timings only).
"""
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import export_checks  # dev/, put on the path above

from detectron.core import export
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from detectron.utils.cli import parse_args_anywhere


def parse_args(argv):
    parser = export_checks.model_parser(__doc__, (800, 1216))
    parser.add_argument('--backend', default='inductor', help="torch.compile's backend (aot_eager to test the logic)")
    return parse_args_anywhere(parser, argv)


class PaddedRows(nn.Module):
    """head(x) for x of up to `rows` rows, run as a compiled call on x padded with zero rows to
    exactly `rows` (one static shape); rows are independent in the R-CNN heads, so the padding
    changes nothing in the real rows."""

    def __init__(self, head, rows, backend):
        super().__init__()
        self.head, self.rows = head, rows
        self.compiled = torch.compile(head, dynamic=False, backend=backend)

    def forward(self, x):
        n = x.shape[0]
        if n > self.rows or n == 0:
            return self.head(x)
        padded = torch.cat([x, x.new_zeros((self.rows - n, *x.shape[1:]))]) if n < self.rows else x
        out = self.compiled(padded)
        return out[:n] if torch.is_tensor(out) else type(out)(o[:n] for o in out)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:  # the head's own attributes (e.g. conv5, dim_out)
            return getattr(super().__getattr__('head'), name)


def compiled_parts(model, backend):
    """(use_compiled, use_eager): switch model, in place, between its compiled parts (the body + RPN
    head compiled on the instance, the box and mask heads wrapped by PaddedRows; each compiled once,
    here) and its own."""
    p = model.params
    own = {'box_head': model.box_head, 'mask_head': model.mask_head}
    compiled = {'box_head': PaddedRows(model.box_head, p.test_proposals.post_nms_top_n, backend)}
    if model.mask_head is not None:
        compiled['mask_head'] = PaddedRows(model.mask_head, cfg.TEST.DETECTIONS_PER_IM, backend)
    body = torch.compile(type(model).body_and_rpn_head.__get__(model), dynamic=False, backend=backend)

    def use_compiled():
        model.body_and_rpn_head = body
        for name, module in compiled.items():
            setattr(model, name, module)

    def use_eager():
        model.__dict__.pop('body_and_rpn_head', None)
        for name in compiled:
            setattr(model, name, own[name])
    return use_compiled, use_eager


def compare_detectors(model_type, model, samples, use_compiled, use_eager):
    """Comparison of the compiled detector's detections on samples with the eager one's."""
    detect = model_type.detector()
    use_eager()
    with torch.no_grad():
        eager = [detect(model, s) for s in samples]
    use_compiled()
    comparison = export.Comparison()
    with torch.no_grad():
        for sample, reference in zip(samples, eager):
            export.compare(reference, detect(model, sample), comparison)
    return comparison


def main(argv):
    args = parse_args(argv)
    # The eager detector would replay its CUDA graphs of the body instead of calling the compiled one.
    finalize_cfg(args.cfg_file, list(args.opts) + ['TEST.CUDA_GRAPHS', 'False'])
    device = torch.device(args.device)
    model_type = model_builder.build_model_type(cfg)
    model = export_checks.test_model(model_type, args.wts, device)
    if not hasattr(model, 'box_head') or model.box_head is None:
        sys.exit('error: dev/rcnn_compile_bench.py times an R-CNN with a box head (MODEL.TYPE generalized_rcnn)')
    rng = np.random.RandomState(0)
    prepare = model_type.test_inputs()
    samples = [prepare(rng.randint(0, 256, size=(*args.size, 3)).astype(np.uint8)) for _ in range(args.images)]
    detect = model_type.detector()

    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize(device)

    use_compiled, use_eager = compiled_parts(model, args.backend)
    use_compiled()
    started = time.perf_counter()
    with torch.no_grad():
        detect(model, samples[0])
    sync()
    print('first compiled image (compilation included): {:.1f} s'.format(time.perf_counter() - started))
    comparison = compare_detectors(model_type, model, samples, use_compiled, use_eager)
    print('compiled vs eager detector: {} matched, {} unpaired ({} ties), largest score difference {:.3g}, '
          'box {:.3g} px'.format(comparison.matched, len(comparison.unmatched), sum(u[3] for u in comparison.unmatched),
                                 comparison.max_score_diff, comparison.max_box_diff))
    timings = {'detector, eager': [], 'detector, compiled body + heads': []}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, switch in zip(timings, (use_eager, use_compiled)):
                switch()
                detect(model, samples[0])  # warm-up after the switch
                sync()
                started = time.perf_counter()
                for sample in samples:
                    detect(model, sample)
                sync()
                timings[name].append((time.perf_counter() - started) * 1000 / len(samples))
    print('| R-CNN {}x{} ({}, {}) | ms/image (median of {} rounds) |'.format(*args.size, device, args.backend,
                                                                              args.rounds))
    print('|---|---|')
    for name, values in timings.items():
        print('| {} | {:.2f} |'.format(name, statistics.median(values)))
    return comparison


if __name__ == '__main__':
    main(sys.argv[1:])
