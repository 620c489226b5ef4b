"""PASCAL VOC box evaluation of a `voc_<year>_<image set>` dataset, as Detectron's
datasets/voc_dataset_evaluator.py: one results file per class written into the devkit
(`results/VOC<year>/Main/comp4_<salt>_det_<image set>_<class>.txt`, 1-based boxes), each evaluated
by voc_eval against the devkit's xml annotations and image set (VOC2007's 11-point AP for years
before 2010, the area AP after), the precision / recall of each class saved as `<class>_pr.pkl` in
output_dir and the results files moved there. Detectron's MATLAB evaluation is not ported (cfg.MATLAB
is refused)."""
import logging
import os
import shutil
import uuid

import numpy as np

from detectron.datasets import dataset_catalog
from detectron.datasets.voc_eval import voc_eval
from detectron.utils.errors import DatasetError
from detectron.utils.io import save_object

logger = logging.getLogger(__name__)


def use_voc_evaluator(dataset_name):
    """Detectron's task_evaluation choice: names starting with 'voc_' get this evaluator."""
    return dataset_name[:4] == 'voc_'


def evaluate_boxes(json_dataset, all_boxes, output_dir):
    """Write and evaluate all_boxes[cls][img] ((N, 5) arrays or [], images in the roidb's order) of
    json_dataset; returns {class name: AP} over its foreground classes."""
    info = voc_info(json_dataset.name)
    image_index = _image_index(json_dataset, info['image_set_path'])
    salt = '_{}'.format(uuid.uuid4())  # Detectron always salts: the devkit's results folder is shared
    os.makedirs(output_dir, exist_ok=True)
    os.makedirs(os.path.dirname(_results_file(info, salt, 'x')), exist_ok=True)
    # The PASCAL VOC metric changed in 2010.
    use_07_metric = int(info['year']) < 2010
    logger.info('VOC07 metric? %s', 'Yes' if use_07_metric else 'No')
    aps = {}
    for cls_ind, cls in enumerate(json_dataset.classes):
        if cls == '__background__':
            continue
        filename = _results_file(info, salt, cls)
        _write_class_results(filename, all_boxes[cls_ind], image_index)
        rec, prec, ap = voc_eval(filename, info['anno_path'], info['image_set_path'], cls, ovthresh=0.5,
                                 use_07_metric=use_07_metric)
        aps[cls] = float(ap)
        logger.info('AP for %s = %.4f', cls, ap)
        save_object({'rec': rec, 'prec': prec, 'ap': ap}, os.path.join(output_dir, cls + '_pr.pkl'))
        shutil.move(filename, os.path.join(output_dir, os.path.basename(filename)))
    logger.info('Mean AP = %.4f (Python VOC evaluation, close to but not the official MATLAB code)',
                np.mean(list(aps.values())))
    return aps


def voc_info(dataset_name):
    """Year, image set and the devkit's paths of dataset `voc_<year>_<image set>`."""
    year, image_set = dataset_name[4:8], dataset_name[9:]
    devkit_path = dataset_catalog.get_devkit_dir(dataset_name)
    if not os.path.isdir(devkit_path):
        raise DatasetError('VOC devkit directory {} of dataset {} not found (the VOC evaluator reads its '
                           'Annotations and ImageSets)'.format(devkit_path, dataset_name))
    voc = os.path.join(devkit_path, 'VOC' + year)
    return {'year': year, 'image_set': image_set, 'devkit_path': devkit_path,
            'anno_path': os.path.join(voc, 'Annotations', '{:s}.xml'),
            'image_set_path': os.path.join(voc, 'ImageSets', 'Main', image_set + '.txt')}


def _image_index(json_dataset, image_set_path):
    """The image set's names, which must be the roidb's images in its order."""
    if not os.path.isfile(image_set_path):
        raise DatasetError('VOC image set {} of dataset {} not found'.format(image_set_path, json_dataset.name))
    with open(image_set_path) as f:
        image_index = [line.strip() for line in f]
    roidb_index = [os.path.splitext(os.path.basename(entry['image']))[0] for entry in json_dataset.get_roidb()]
    if roidb_index != image_index:
        raise DatasetError('the images of dataset {} ({}, ...) are not those of its VOC image set {} ({}, ...) in '
                           'the same order'.format(json_dataset.name, ', '.join(roidb_index[:3]), image_set_path,
                                                   ', '.join(image_index[:3])))
    return image_index


def _results_file(info, salt, cls):
    name = 'comp4{}_det_{}_{}.txt'.format(salt, info['image_set'], cls)
    return os.path.join(info['devkit_path'], 'results', 'VOC' + info['year'], 'Main', name)


def _write_class_results(filename, class_boxes, image_index):
    if len(class_boxes) != len(image_index):
        raise ValueError('{} images of detections for an image set of {}'.format(len(class_boxes), len(image_index)))
    with open(filename, 'wt') as f:
        for index, dets in zip(image_index, class_boxes):
            # The devkit counts pixels from 1.
            for x1, y1, x2, y2, score in np.asarray(dets, dtype=np.float64).reshape(-1, 5):
                f.write('{:s} {:.3f} {:.1f} {:.1f} {:.1f} {:.1f}\n'.format(index, score, x1 + 1, y1 + 1, x2 + 1,
                                                                           y2 + 1))
