#!/usr/bin/env python3
"""Convert a Detectron .pkl (ImageNet R-50.pkl or a Detectron / KL-Loss model_final.pkl) to a torch
file {'model': state_dict with this port's keys, 'cfg': the embedded Detectron yaml, if any, 'digest'}.

Example:
    python tools/convert_pkl_to_pth.py model_final.pkl model_final.pth
"""
import argparse
import sys

from detectron.checkpoint.c2_weights import convert_detectron_blobs, read_detectron_pickle
from detectron.checkpoint.torch_file import write_torch_file
from detectron.utils.errors import run_tool


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('input', help='Detectron weights pickle (.pkl)')
    parser.add_argument('output', help='torch file to write (.pth)')
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    blobs, cfg_yaml = read_detectron_pickle(args.input)
    state_dict, ignored, unconverted = convert_detectron_blobs(blobs)
    content = {'model': state_dict}
    if cfg_yaml is not None:
        content['cfg'] = cfg_yaml
    write_torch_file(content, args.output)
    print('converted {} blobs of {} to {}'.format(len(state_dict), args.input, args.output))
    print('ignored {} blobs (momentum, ImageNet classifier, conv1 bias)'.format(len(ignored)))
    print('not converted ({}, no counterpart in the port): {}'.format(
        len(unconverted), ', '.join(unconverted) or 'none'))
    print('embedded Detectron cfg: {}'.format('kept' if cfg_yaml is not None else 'none'))


if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
