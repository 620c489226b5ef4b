#!/usr/bin/env python3
r"""Export a trained model's whole inference to ONNX or a torch.export program, and optionally verify
the file (ONNX in onnxruntime, or the loaded program) against the PyTorch model (docs/EXPORT.md).

Examples:
    python tools/export_model.py --cfg configs/getting_started/shapes_demo_R-18-FPN.yaml \
        --wts outputs/shapes_demo/train/shapes_train/generalized_rcnn/model_final.pth \
        --format onnx --output rcnn.onnx --verify shapes_val
    python tools/export_model.py -c configs/getting_started/shapes_demo_centernet_res18.yaml \
        --wts model_final.pth --format exported_program --device cuda --output centernet.pt2

--verify takes a registered dataset (then both models' APs are printed too), an image or a folder
of images; the tool exits with status 1 when the detections differ past the stated tolerances.
KEY VALUE pairs override the config file.
"""
import argparse
import sys

import torch

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.utils.cli import parse_args_anywhere
from detectron.utils.errors import run_tool
from detectron.utils.logging import setup_logging


def parse_args(argv):
    from detectron.core.export import FORMATS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', '-c', dest='cfg_file', default=None, help='config file (YAML)')
    parser.add_argument('--wts', required=True, help='weights file (a .pth of this port, a Detectron .pkl or a URL)')
    parser.add_argument('--format', choices=FORMATS, default='onnx', help='onnx (default) or exported_program')
    parser.add_argument('--output', required=True, help='the file to write')
    parser.add_argument('--verify', default=None, metavar='DATASET_OR_IMAGES',
                        help='compare the exported file (ONNX in onnxruntime, or the torch.export program, which '
                             'takes only its traced input size) with the PyTorch model on a registered dataset, '
                             'an image or a folder of images')
    parser.add_argument('--device', default='cpu', help="the model's device (cuda: torch.export only, the "
                        'Triton kernels then in the program as custom ops)')
    parser.add_argument('opts', nargs='*', help='config overrides as KEY VALUE pairs')
    if not argv:
        parser.print_help()
        sys.exit(1)
    args = parse_args_anywhere(parser, argv)
    if args.device != 'cpu' and args.format != 'exported_program':
        parser.error('--device {} exports with torch.export: it needs --format exported_program (ONNX traces the '
                     'CPU model)'.format(args.device))
    return args


def main(argv):
    args = parse_args(argv)
    setup_logging(__name__)
    finalize_cfg(args.cfg_file, args.opts)
    from detectron.core import export, test_engine
    from detectron.modeling import model_builder
    model_type = model_builder.build_model_type(cfg)
    model = test_engine.load_test_model(model_type, args.wts, torch.device(args.device))
    exporter = export.export_model(model_type, model, args.format, args.output,
                                   export.example_sample(model_type, args.verify))
    if args.verify and not export.verify(model_type, model, exporter, args.output, args.verify, cfg.OUTPUT_DIR,
                                         args.format):
        print('error: the exported model differs from the PyTorch model past the tolerances (see above)',
              file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
