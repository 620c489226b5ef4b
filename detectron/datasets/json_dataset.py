"""A COCO-format json dataset and its roidb (Detectron's per-image training/testing records)."""

import collections
import copy
import json
import logging
import os

import numpy as np
from pycocotools.coco import COCO

from detectron.datasets import dataset_catalog
from detectron.utils import boxes as box_utils
from detectron.utils import segms as segm_utils
from detectron.utils.errors import DatasetError

logger = logging.getLogger(__name__)

# COCO image fields that are of no use downstream (file_name becomes the absolute 'image').
_DROPPED_IMAGE_FIELDS = ('date_captured', 'url', 'license', 'file_name')


class JsonDataset(object):
    """A dataset of the catalog: classes, id maps and roidb of its COCO json."""

    def __init__(self, name):
        # The catalog raises DatasetError (with close names) for an unknown name.
        self.image_directory = dataset_catalog.get_im_dir(name)
        self.name = name
        self.image_prefix = dataset_catalog.get_im_prefix(name)
        annotation_file = self.annotation_file = dataset_catalog.get_ann_fn(name)
        _require_path(self.image_directory, 'Image directory', name)
        _require_path(annotation_file, 'Annotation file', name)
        logger.debug('Creating: {}'.format(name))
        self.COCO = _read_coco(annotation_file, name)
        category_ids = self.COCO.getCatIds()
        categories = [c['name'] for c in self.COCO.loadCats(category_ids)]
        self.category_to_id_map = dict(zip(categories, category_ids))
        self.classes = ['__background__'] + categories
        self.num_classes = len(self.classes)
        self.json_category_id_to_contiguous_id = {v: i + 1 for i, v in enumerate(category_ids)}
        self.contiguous_category_id_to_json_id = {
            v: k for k, v in self.json_category_id_to_contiguous_id.items()
        }

    def check_model_classes(self, model_classes, at_least=False):
        """A model whose class count (background included) differs from the dataset's would be scored
        against the wrong categories (at_least=False, testing) or, with fewer classes, fail inside
        the loss (at_least=True, training): one DatasetError line instead."""
        if model_classes > self.num_classes and at_least:
            logger.warning('The model has %d classes (background included), dataset %s %d: classes %d.. are '
                           'never trained', model_classes, self.name, self.num_classes, self.num_classes)
            return
        if model_classes != self.num_classes:
            raise DatasetError(
                'the model has {} classes (background included) but dataset {} has {} categories + '
                'background = {}; set the class count of the config to match (MODEL.NUM_CLASSES {}, or '
                'CENTERNET.NUM_CLASSES {} without background) or use the dataset the model is for'.format(
                    model_classes, self.name, self.num_classes - 1, self.num_classes, self.num_classes,
                    self.num_classes - 1))

    def get_image_ids(self):
        """Image ids in ascending order: the order of the roidb and of all_boxes[cls]."""
        return sorted(self.COCO.getImgIds())

    def get_roidb(self, gt=False, gt_min_area=-1, segms=False):
        """One entry per image (ascending id); with gt=True the filtered ground-truth boxes.

        gt_min_area drops annotations whose 'area' is below it (Detectron's TRAIN.GT_MIN_AREA).
        segms=True (Mask R-CNN) adds 'segms': each gt object's segmentation, polygons of fewer than
        3 points dropped (crowd regions keep their RLE), as Detectron's roidb.
        Detectron's proposal_file / crowd_filter_thresh arguments are absent: they serve
        precomputed proposals, which end-to-end Faster R-CNN does not use.
        """
        roidb = copy.deepcopy(self.COCO.loadImgs(self.get_image_ids()))
        for entry in roidb:
            self._prep_roidb_entry(entry)
            if gt:
                self._add_gt_annotations(entry, gt_min_area, segms)
            _add_class_assignments(entry)
        return roidb

    def _prep_roidb_entry(self, entry):
        im_path = os.path.join(self.image_directory, self.image_prefix + entry['file_name'])
        if not os.path.exists(im_path):
            raise DatasetError('Image {} of dataset {} not found; check the image directory in '
                               'the dataset catalog.'.format(im_path, self.name))
        entry['dataset'] = self
        entry['image'] = im_path
        entry['flipped'] = False
        _set_gt_fields(entry, *_empty_gt(self.num_classes))
        for k in _DROPPED_IMAGE_FIELDS:
            entry.pop(k, None)

    def _add_gt_annotations(self, entry, gt_min_area, segms):
        anns = self.COCO.loadAnns(self.COCO.getAnnIds(imgIds=entry['id'], iscrowd=None))
        anns = [a for a in anns if a['area'] >= gt_min_area and a.get('ignore', 0) != 1]
        # Float64 as Detectron's per-box Python arithmetic; the validity test runs before the
        # float32 cast so borderline boxes are kept or dropped exactly as there.
        xywh = np.array([a['bbox'] for a in anns], dtype=np.float64).reshape(-1, 4)
        boxes = box_utils.xywh_to_xyxy(xywh)
        x1, y1, x2, y2 = box_utils.clip_xyxy_to_image(
            boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3], entry['height'], entry['width']
        )
        areas = np.array([a['area'] for a in anns], dtype=np.float64)
        valid = (areas > 0) & (x2 > x1) & (y2 > y1)
        anns = [a for a, keep in zip(anns, valid) if keep]
        if segms:
            entry['segms'] = [segm_utils.valid_polygons(a['segmentation']) for a in anns]
        classes = np.array([self._contiguous_id(a) for a in anns], dtype=np.int32)
        is_crowd = np.array([bool(a['iscrowd']) for a in anns], dtype=bool)
        gt_overlaps = np.zeros((len(anns), self.num_classes), dtype=np.float32)
        gt_overlaps[np.arange(len(anns)), classes] = 1.0
        # Crowd regions get -1 for every class so they are never sampled as fg or bg.
        gt_overlaps[is_crowd] = -1.0
        _set_gt_fields(
            entry,
            boxes=np.stack([x1, y1, x2, y2], axis=1)[valid].astype(np.float32),
            gt_classes=classes,
            seg_areas=areas[valid].astype(np.float32),
            gt_overlaps=gt_overlaps,
            is_crowd=is_crowd,
        )


    def _contiguous_id(self, annotation):
        category_id = annotation['category_id']
        if category_id not in self.json_category_id_to_contiguous_id:
            raise DatasetError(
                'Annotation {} (image {}) of dataset {} has category_id {}, which is not in the "categories" '
                'of {} (ids {}); fix the annotation or add the category'.format(
                    annotation.get('id'), annotation['image_id'], self.name, category_id,
                    self.annotation_file, sorted(self.json_category_id_to_contiguous_id)))
        return self.json_category_id_to_contiguous_id[category_id]


def _read_coco(annotation_file, name):
    """pycocotools' COCO of a COCO-format json, with one DatasetError line naming the file for what
    pycocotools would raise on or merge silently: text that is not JSON, a missing "images" or
    "categories" list, and an image id listed twice (one image would be dropped and its
    boxes put on the other)."""
    try:
        with open(annotation_file, encoding='utf-8') as f:
            content = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise DatasetError('Annotation file {} of dataset {} is not valid JSON ({}); restore or regenerate '
                           'it'.format(annotation_file, name, err)) from None
    missing = [key for key in ('images', 'categories')
               if not isinstance(content, dict) or not isinstance(content.get(key), list)]
    if missing:
        raise DatasetError('Annotation file {} of dataset {} has no "{}" list: it is not a COCO-format '
                           'detection file'.format(annotation_file, name, '" or "'.join(missing)))
    ids = collections.Counter(image.get('id') for image in content['images'])
    repeated = sorted((i for i, n in ids.items() if n > 1), key=str)
    if repeated:
        raise DatasetError('Annotation file {} of dataset {} lists image id {} {} times ({} ids repeated): '
                           'each image needs its own id'.format(annotation_file, name, repeated[0],
                                                                 ids[repeated[0]], len(repeated)))
    coco = COCO()
    coco.dataset = content
    coco.createIndex()
    return coco


def _require_path(path, what, name):
    if not os.path.exists(path):
        raise DatasetError('{} {} of dataset {} not found; create it (see '
                           'detectron/datasets/data/README.md) or register the dataset with its '
                           'real paths (see docs/DATASETS.md).'.format(what, path, name))


def _empty_gt(num_classes):
    return (np.zeros((0, 4), np.float32), np.zeros(0, np.int32), np.zeros(0, np.float32),
            np.zeros((0, num_classes), np.float32), np.zeros(0, bool))


def _set_gt_fields(entry, boxes, gt_classes, seg_areas, gt_overlaps, is_crowd):
    entry['boxes'] = boxes
    entry['gt_classes'] = gt_classes
    entry['seg_areas'] = seg_areas
    entry['gt_overlaps'] = gt_overlaps
    entry['is_crowd'] = is_crowd
    # Maps each box to its index among the gt boxes; all boxes are gt here.
    entry['box_to_gt_ind_map'] = np.arange(len(boxes), dtype=np.int32)


def _add_class_assignments(entry):
    """max_overlaps / max_classes: best overlap with any class and that class (0 = background)."""
    entry['max_overlaps'] = entry['gt_overlaps'].max(axis=1)
    entry['max_classes'] = entry['gt_overlaps'].argmax(axis=1)
