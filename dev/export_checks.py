#!/usr/bin/env python3
"""A model's exported inference on one device (docs/EXPORT.md): torch.export of its graph there (on
CUDA with the Triton kernels as custom ops), the program's detections against the eager graph's;
then ms/image in interleaved rounds of the PyTorch detector, the graph eagerly, the graph under
torch.compile and, on the CPU, the ONNX file in onnxruntime.

    python dev/export_checks.py --cfg configs/getting_started/shapes_demo_centernet_res18.yaml \
        --device cuda [--wts model_final.pth] [--images 20 --size 512 512 --rounds 3] [KEY VALUE ...]
    python dev/export_checks.py --cfg configs/getting_started/shapes_demo_R-18-FPN_kl.yaml --device cpu \
        --wts model_final.pth --dataset shapes_val --no-compile

Without --wts the model has random weights (timings only: its detections are meaningless).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import cv2
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from detectron.core import export, test_engine
from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from detectron.utils.cli import parse_args_anywhere


def parse_args(argv):
    parser = model_parser(__doc__, (480, 640))
    parser.add_argument('--compile-backend', default='inductor')
    parser.add_argument('--no-compile', action='store_true', help='leave out the torch.compile variant (its CPU '
                        'compilation of an unrolled soft-NMS takes minutes)')
    parser.add_argument('--no-program', action='store_true', help='leave out torch.export and its comparison')
    parser.add_argument('--dataset', default=None, help="the first --images images of this registered dataset "
                        '(default: random images of --size)')
    return parse_args_anywhere(parser, argv)


def model_parser(description, size):
    """The arguments of the dev timing scripts: the model, its device, the images and the rounds."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', '-c', dest='cfg_file', required=True)
    parser.add_argument('--wts', default=None, help='weights (default: random)')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--images', type=int, default=20, help='random images per round')
    parser.add_argument('--size', type=int, nargs=2, default=size, metavar=('H', 'W'))
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('opts', nargs='*')
    return parser


def test_model(model_type, wts, device):
    """The model in eval mode for inference on device: wts loaded, else random weights."""
    if wts:
        return test_engine.load_test_model(model_type, wts, device)
    torch.manual_seed(0)
    return model_type.prepare_for_inference(model_builder.checked_model(model_type).to(device).eval())


def on_device(tensors, device):
    return tuple(t.to(device) for t in tensors)


def as_numpy(outputs):
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [x.detach().float().cpu().numpy() if x.is_floating_point() else x.cpu().numpy() for x in outputs]


def images(args):
    """BGR uint8 images: the first args.images of args.dataset, else random ones of args.size."""
    if args.dataset:
        roidb = JsonDataset(args.dataset).get_roidb()[:args.images]
        return [cv2.imread(entry['image']) for entry in roidb]
    rng = np.random.RandomState(0)
    return [rng.randint(0, 256, size=(*args.size, 3)).astype(np.uint8) for _ in range(args.images)]


def check_program(graph, exporter, samples, inputs, eager):
    """torch.export of the graph on the first sample's inputs; its detections against the eager
    graph's on the samples of that input shape (the program has the shapes it was traced on)."""
    device = inputs[0][0].device
    with torch.no_grad():
        started = time.perf_counter()
        program = torch.export.export(graph, inputs[0], strict=False)
        print('torch.export on {}: {:.1f} s; custom ops in the program: {}'.format(
            device, time.perf_counter() - started, sorted({str(n.target) for n in program.graph.nodes
                                                           if str(n.target).startswith('detectron.')})))
        comparison = export.Comparison()
        for sample, x, reference in zip(samples, inputs, eager):
            if [t.shape for t in x] != [t.shape for t in inputs[0]]:
                continue
            export.compare(exporter.detections(as_numpy(reference), sample),
                           exporter.detections(as_numpy(program.module()(*x)), sample), comparison)
        print('exported program against the eager graph: {} matched, {} unpaired ({} ties), largest score '
              'difference {:.3g}, box {:.3g} px'.format(comparison.matched, len(comparison.unmatched),
                                                        sum(u[3] for u in comparison.unmatched),
                                                        comparison.max_score_diff, comparison.max_box_diff))


def main(argv):
    args = parse_args(argv)
    finalize_cfg(args.cfg_file, args.opts)
    device = torch.device(args.device)
    model_type = model_builder.build_model_type(cfg)
    model = test_model(model_type, args.wts, device)
    prepare = model_type.test_inputs()
    samples = [prepare(im) for im in images(args)]
    exporter = model_type.exporter(model)
    graph = exporter.graph.eval()
    inputs = [on_device(exporter.inputs(s), device) for s in samples]
    with torch.no_grad():
        eager = [graph(*x) for x in inputs]  # also fills the model's caches with real tensors
    if not args.no_program:
        check_program(graph, exporter, samples, inputs, eager)
    variants = {'detector (eager test path)': lambda i: model_type.detector()(model, samples[i]),
                'graph, eager': lambda i: graph(*inputs[i])}
    if not args.no_compile:
        compiled = torch.compile(graph, backend=args.compile_backend)
        variants['graph, torch.compile'] = lambda i: compiled(*inputs[i])
    if device.type == 'cpu':
        path = os.path.join(tempfile.mkdtemp(), 'model.onnx')
        export.export_model(model_type, model, 'onnx', path, samples[0])
        detect_onnx = export.onnx_detector(exporter, path)
        variants['onnxruntime (CPU)'] = lambda i: detect_onnx(samples[i])
    timings = {name: [] for name in variants}
    with torch.no_grad():
        for name, run in variants.items():  # warm-up: compilation, autotuning, caches
            for i in range(min(3, len(samples))):
                run(i)
        for _ in range(args.rounds):
            for name, run in variants.items():
                if device.type == 'cuda':
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
                for i in range(len(samples)):
                    run(i)
                if device.type == 'cuda':
                    torch.cuda.synchronize(device)
                timings[name].append((time.perf_counter() - started) * 1000 / len(samples))
    base = statistics.median(timings['graph, eager'])
    print('| {} {} ({}) | ms/image (median of {} rounds) | vs graph, eager |'.format(
        cfg.MODEL.TYPE, args.dataset or '{}x{}'.format(*args.size), device, args.rounds))
    print('|---|---|---|')
    for name, values in timings.items():
        print('| {} | {:.2f} | {:.2f}x |'.format(name, statistics.median(values), statistics.median(values) / base))


if __name__ == '__main__':
    main(sys.argv[1:])
