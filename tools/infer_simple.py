#!/usr/bin/env python3
r"""Detect objects in an image or a folder of images and write visualised copies (Detectron's demo).

Example:
    python tools/infer_simple.py --cfg configs/getting_started/shapes_demo_R-18-FPN.yaml \
        --wts outputs/shapes_demo/train/shapes_train/generalized_rcnn/model_final.pth \
        --output-dir /tmp/vis demo_images/
"""
import argparse
import glob
import logging
import os
import sys

import torch

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.core.test import im_detect_all
from detectron.core.test_engine import load_test_model
from detectron.datasets import dummy_datasets
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.test_results import detection_parts
from detectron.modeling import model_builder
from detectron.roi_data.minibatch import read_image
from detectron.utils.cli import parse_args_anywhere
from detectron.utils.errors import ConfigValueError, DatasetError, OutputDirError, run_tool
from detectron.utils.logging import setup_logging
from detectron.utils.vis import write_vis_image


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', '-c', dest='cfg_file', required=True, help='model config (YAML)')
    parser.add_argument('--wts', required=True, help='weights: our .pth, a Detectron .pkl, or a URL')
    parser.add_argument('--output-dir', default='/tmp/infer_simple', help='where visualised images go')
    parser.add_argument('--image-ext', default='jpg', help='image extension to look for in a folder')
    parser.add_argument('--thresh', type=float, default=0.7, help='score threshold for drawing')
    parser.add_argument('--class-names-from', default='',
                        help='dataset name whose class names label the boxes (default: TEST.DATASETS[0], '
                             'or the COCO names for an 81-class model when that dataset is absent)')
    parser.add_argument('im_or_folder', help='an image or a folder of images')
    parser.add_argument('opts', nargs='*', help='config overrides: KEY VALUE ...')
    if len(argv) == 0:
        parser.print_help()
        sys.exit(1)
    return parse_args_anywhere(parser, argv)


def _image_paths(im_or_folder, ext):
    if not os.path.isdir(im_or_folder):
        return [im_or_folder]
    paths = sorted(glob.glob(os.path.join(im_or_folder, '*.' + ext)))
    if not paths:
        raise DatasetError('folder {} holds no *.{} image; pass --image-ext for other images, or another '
                           'folder'.format(im_or_folder, ext))
    return paths


def _class_names(model_type, dataset_name):
    """Names from the dataset (--class-names-from, else TEST.DATASETS[0]); like Detectron's demo, a
    81-class model falls back to the COCO names when that dataset is not on this machine."""
    name = dataset_name or (cfg.TEST.DATASETS[0] if cfg.TEST.DATASETS else '')
    try:
        return JsonDataset(name).classes if name else None
    except DatasetError:
        model_classes = model_type.output_classes()
        if dataset_name or model_classes != len(dummy_datasets.COCO_CLASSES):
            raise
        return dummy_datasets.get_coco_dataset()


def _keypoint_names(dataset_name):
    """The keypoint names of the dataset (as _class_names picks it), None when it has none or is absent
    (the skeleton of 17 keypoints is then COCO's)."""
    name = dataset_name or (cfg.TEST.DATASETS[0] if cfg.TEST.DATASETS else '')
    try:
        return JsonDataset(name).keypoints if name else None
    except DatasetError:
        return None


def _make_output_dir(output_dir):
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise OutputDirError('--output-dir {} cannot be used: {}; pass a writable directory'.format(
            output_dir, e.strerror or e)) from None
    if not os.access(output_dir, os.W_OK):
        raise OutputDirError('--output-dir {} cannot be used: it is not writable; pass a writable directory'
                             .format(output_dir))


def main(argv):
    args = parse_args(argv)
    logger = setup_logging(__name__)
    finalize_cfg(args.cfg_file, args.opts)
    if cfg.MODEL.RPN_ONLY:  # as Detectron's infer_simple
        raise ConfigValueError('MODEL.RPN_ONLY True: an RPN-only model gives proposals, not detections to draw; '
                               'test it with tools/test_net.py, which writes rpn_proposals.pkl')
    model_type = model_builder.build_model_type(cfg)
    paths = _image_paths(args.im_or_folder, args.image_ext)
    class_names = _class_names(model_type, args.class_names_from)
    keypoint_names = _keypoint_names(args.class_names_from)
    _make_output_dir(args.output_dir)  # before the model loads: a bad directory is known at once
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    model = load_test_model(model_type, args.wts, device)
    failed = []
    for path in paths:
        try:
            im = read_image(path)
        except DatasetError as err:
            # One unreadable file of a folder does not stop the others; the run fails at the end.
            logger.warning('Skipping %s: %s', path, err)
            failed.append(path)
            continue
        cls_boxes, cls_segms, cls_keyps = detection_parts(im_detect_all(model_type, model, im))
        out_path = write_vis_image(args.output_dir, path, im, cls_boxes, class_names, args.thresh, cls_segms=cls_segms,
                                   cls_keyps=cls_keyps, keypoint_names=keypoint_names)
        logger.info('%s -> %s', path, out_path)
    if failed:
        raise DatasetError('{} of {} images could not be read and were skipped ({}{}); the others were written to '
                           '{}'.format(len(failed), len(paths), ', '.join(failed[:5]),
                                       ' and {} more'.format(len(failed) - 5) if len(failed) > 5 else '',
                                       args.output_dir))


if __name__ == '__main__':
    logging.basicConfig(level=logging.INFO)
    run_tool(main, sys.argv[1:])
