#!/usr/bin/env python3
r"""Train a detector from a config, then test the final model (Detectron's tools/train_net.py).

Examples:
    python tools/train_net.py --cfg configs/getting_started/tutorial_1gpu_e2e_faster_rcnn_R-50-FPN.yaml \
        OUTPUT_DIR /tmp/detectron-output
    python tools/train_net.py -c configs/e2e_faster_rcnn_R-50-FPN_2x.yaml --print-config NUM_GPUS 2

KEY VALUE pairs (before or after the flags) override the config file (see docs/CONFIG.md).
"""
import argparse
import sys

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.utils.cli import parse_args_anywhere
from detectron.utils.errors import run_tool
from detectron.utils.launcher_env import launched_rank
from detectron.utils.logging import log_file, setup_logging


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', '-c', dest='cfg_file', default=None,
                        help='config file (YAML) for training and, unless --skip-test, testing')
    testing = parser.add_mutually_exclusive_group()
    testing.add_argument('--multi-gpu-testing', action='store_true',
                         help='test the final model on NUM_GPUS GPUs at once instead of one')
    testing.add_argument('--single-gpu-testing', dest='multi_gpu_testing', action='store_false',
                         help="KL-Loss's flag: test in one process (the default here, as in Detectron)")
    parser.add_argument('--skip-test', action='store_true', help='do not test the final model')
    parser.add_argument('--print-config', action='store_true',
                        help='print the merged config and the training schedule, then exit')
    parser.add_argument('opts', nargs='*',
                        help='config overrides as KEY VALUE pairs, e.g. SOLVER.BASE_LR 0.01 NUM_GPUS 2')
    if not argv:
        parser.print_help()
        sys.exit(1)
    return parse_args_anywhere(parser, argv)


def main(argv):
    args = parse_args(argv)
    logger = setup_logging(__name__)
    derived = finalize_cfg(args.cfg_file, args.opts, training=True)
    from detectron.core import test_engine, train_engine
    from detectron.modeling import model_builder
    model_type = model_builder.build_model_type(cfg)
    schedule = derived + train_engine.describe_schedule(model_type)
    if args.print_config:
        print(cfg.dump())
        print('\n'.join(schedule))
        return
    with log_file(cfg.OUTPUT_DIR, launched_rank(), command=sys.argv):
        for line in schedule:
            logger.info(line)
        checkpoints = train_engine.train_model()
        if not args.skip_test:
            test_engine.run_inference(model_type, checkpoints['final'], multi_gpu_testing=args.multi_gpu_testing)


if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
