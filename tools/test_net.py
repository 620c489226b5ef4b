#!/usr/bin/env python3
r"""Test a trained model on TEST.DATASETS and evaluate it (Detectron's tools/test_net.py).

Examples:
    python tools/test_net.py --cfg configs/e2e_faster_rcnn_R-50-FPN_2x.yaml
    python tools/test_net.py -c configs/e2e_faster_rcnn_R-50-FPN_2x.yaml --multi-gpu-testing \
        TEST.WEIGHTS /path/to/model_final.pkl NUM_GPUS 8 STD_NMS True

The model is TEST.WEIGHTS (a .pth of this port, a Detectron .pkl or a URL). KEY VALUE pairs
(before or after the flags) override the config file (see docs/CONFIG.md).
"""
import argparse
import sys

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.utils.cli import parse_args_anywhere
from detectron.utils.errors import ConfigValueError, run_tool
from detectron.utils.launcher_env import launched_rank
from detectron.utils.logging import log_file, setup_logging


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', '-c', dest='cfg_file', default=None, help='config file (YAML)')
    testing = parser.add_mutually_exclusive_group()
    testing.add_argument('--multi-gpu-testing', action='store_true',
                         help='split the images over NUM_GPUS GPUs and merge the detections')
    testing.add_argument('--single-gpu-testing', dest='multi_gpu_testing', action='store_false',
                         help="KL-Loss's flag: test in one process (the default here, as in Detectron)")
    parser.add_argument('--range', type=int, nargs=2, metavar=('START', 'END'), default=None,
                        help='test only images START (inclusive) to END (exclusive) of the one TEST.DATASETS '
                             'entry and write detection_range_START_END.pkl')
    parser.add_argument('--vis', action='store_true', help='also draw the detections (sets VIS True)')
    parser.add_argument('--wait', default=True, help="Detectron's flag, accepted and ignored")
    parser.add_argument('--print-config', action='store_true', help='print the merged config, then exit')
    parser.add_argument('opts', nargs='*',
                        help='config overrides as KEY VALUE pairs, e.g. TEST.WEIGHTS model.pkl TEST.NMS 0.5')
    if not argv:
        parser.print_help()
        sys.exit(1)
    args = parse_args_anywhere(parser, argv)
    if args.range is not None and not 0 <= args.range[0] < args.range[1]:
        parser.error('--range needs 0 <= START < END, got {} {}'.format(*args.range))
    return args


def main(argv):
    args = parse_args(argv)
    setup_logging(__name__)
    finalize_cfg(args.cfg_file, args.opts + (['VIS', 'True'] if args.vis else []))
    if args.print_config:
        print(cfg.dump())
        return
    if not cfg.TEST.WEIGHTS:
        raise ConfigValueError('TEST.WEIGHTS is empty: name the model to test, e.g. TEST.WEIGHTS model_final.pth')
    from detectron.core import test_engine
    from detectron.modeling import model_builder
    model_type = model_builder.build_model_type(cfg)
    with log_file(cfg.OUTPUT_DIR, launched_rank(), command=sys.argv):
        test_engine.run_inference(model_type, cfg.TEST.WEIGHTS, ind_range=args.range,
                                  multi_gpu_testing=args.multi_gpu_testing)


if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
