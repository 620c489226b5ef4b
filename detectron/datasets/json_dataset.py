"""A COCO-format json dataset and its roidb (Detectron's per-image training/testing records)."""

import collections
import copy
import json
import logging
import os

import numpy as np
from pycocotools.coco import COCO

from detectron.datasets import annotations, dataset_catalog, proposal_files
from detectron.utils import boxes as box_utils
from detectron.utils import keypoints as keypoint_utils
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
        # Records checked and short polygons dropped (annotations.check_records), in this process.
        self.COCO, self._short_polygons = _read_coco(annotation_file, name)
        category_ids = self.COCO.getCatIds()
        categories = [c['name'] for c in self.COCO.loadCats(category_ids)]
        self.category_to_id_map = dict(zip(categories, category_ids))
        self.classes = ['__background__'] + categories
        self.num_classes = len(self.classes)
        self.json_category_id_to_contiguous_id = {v: i + 1 for i, v in enumerate(category_ids)}
        self.contiguous_category_id_to_json_id = {
            v: k for k, v in self.json_category_id_to_contiguous_id.items()
        }
        self._init_keypoints()

    def _init_keypoints(self):
        """Detectron's keypoint fields: keypoints (the names, None when no category lists any),
        keypoints_to_id_map, num_keypoints and keypoint_flip_map (each 'left_<x>' to its 'right_<x>':
        for COCO's person Detectron's hard-coded map), from the first category listing 'keypoints'
        (COCO: 'person', the only one Detectron reads); keypoint_oks_sigmas: that category's
        'keypoint_oks_sigmas' (the synthetic keypoint shapes), else COCO's person sigmas."""
        self.keypoints = self.keypoint_flip_map = self.keypoints_to_id_map = None
        self.num_keypoints = 0
        self.keypoint_oks_sigmas = keypoint_utils.COCO_OKS_SIGMAS
        category = next((c for c in self.COCO.loadCats(self.COCO.getCatIds()) if c.get('keypoints')), None)
        if category is None:
            return
        self.keypoints = list(category['keypoints'])
        self.keypoints_to_id_map = dict(zip(self.keypoints, range(len(self.keypoints))))
        self.num_keypoints = len(self.keypoints)
        self.keypoint_flip_map = keypoint_utils.flip_map_of(self.keypoints)
        self.keypoint_oks_sigmas = tuple(category.get('keypoint_oks_sigmas', self.keypoint_oks_sigmas))
        if len(self.keypoint_oks_sigmas) != self.num_keypoints:
            raise DatasetError('dataset {}: category {!r} has {} keypoints but {} OKS sigmas; give it '
                               '"keypoint_oks_sigmas" with one per keypoint'.format(
                                   self.name, category['name'], self.num_keypoints, len(self.keypoint_oks_sigmas)))

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

    def get_roidb(self, gt=False, gt_min_area=-1, segms=False, proposals=None, proposal_limit=-1,
                  crowd_filter_thresh=0):
        """One entry per image (ascending id); with gt=True the filtered ground-truth boxes.

        gt_min_area drops annotations whose 'area' is below it (Detectron's TRAIN.GT_MIN_AREA).
        segms=True (Mask R-CNN) checks every annotation's segmentation against its image
        (annotations.usable_segmentation: one DatasetError line for one that no mask can be made of),
        also without gt (testing, before detection, so that the mask evaluation cannot fail after
        it); with gt it adds 'segms', each kept object's segmentation as Detectron's roidb (polygons
        of fewer than 3 points dropped, crowd regions keep their RLE), a non-crowd RLE as polygons.
        The annotations Detectron drops on purpose (a box of no width or height inside the image, area
        <= 0) are dropped with one warning per dataset giving their count and first ids.
        proposals (proposal_files.load_proposals of a proposal file) are appended after the gt boxes
        as Detectron's proposal_file argument does (proposal_files.add_proposals_from_file, with
        proposal_limit and crowd_filter_thresh).
        """
        roidb = copy.deepcopy(self.COCO.loadImgs(self.get_image_ids()))
        invalid_boxes, rle_objects = [], []
        for entry in roidb:
            self._prep_roidb_entry(entry)
            anns = self.COCO.loadAnns(self.COCO.getAnnIds(imgIds=entry['id'], iscrowd=None))
            entry_segms = self._usable_segms(anns, entry, rle_objects) if segms else None
            if gt:
                invalid_boxes += self._add_gt_annotations(entry, anns, gt_min_area, entry_segms)
            _add_class_assignments(entry)
        if proposals is not None:
            proposal_files.add_proposals_from_file(roidb, proposals, self.name, top_k=proposal_limit,
                                                   crowd_thresh=crowd_filter_thresh)
        self._warn_dropped(gt, segms, invalid_boxes, rle_objects)
        return roidb

    def _usable_segms(self, anns, entry, rle_objects):
        """{annotation id: its segmentation as the roidb keeps it} (annotations.usable_segmentation)."""
        source = annotations.Source(self.annotation_file, self.name)
        usable = {}
        for ann in anns:
            usable[ann['id']] = annotations.usable_segmentation(ann, entry['height'], entry['width'], source,
                                                                self._short_polygons.get(ann['id'], 0))
            if isinstance(ann['segmentation'], dict) and not ann['iscrowd']:
                rle_objects.append(ann['id'])
        return usable

    def _warn_dropped(self, gt, segms, invalid_boxes, rle_objects):
        if gt and invalid_boxes:
            logger.warning('Dataset %s (%s): %d annotations have a box of no width or height inside their image or an '
                           'area <= 0 and are not used, as in Detectron (ids %s)', self.name, self.annotation_file,
                           len(invalid_boxes), annotations.first_ids(invalid_boxes))
        if segms and self._short_polygons:
            logger.warning('Dataset %s (%s): %d annotations have polygons of fewer than 3 points, dropped as in '
                           'Detectron (ids %s)', self.name, self.annotation_file, len(self._short_polygons),
                           annotations.first_ids(sorted(self._short_polygons, key=repr)))
        if gt and rle_objects:
            logger.info('Dataset %s: %d non-crowd objects given as RLE are trained from polygons along their '
                        'pixels (ids %s)', self.name, len(rle_objects), annotations.first_ids(rle_objects))

    def _prep_roidb_entry(self, entry):
        im_path = os.path.join(self.image_directory, self.image_prefix + entry['file_name'])
        if not os.path.exists(im_path):
            raise DatasetError('Image {} of dataset {} not found; check the image directory in '
                               'the dataset catalog.'.format(im_path, self.name))
        entry['dataset'] = self
        entry['image'] = im_path
        entry['flipped'] = False
        entry['has_visible_keypoints'] = False
        _set_gt_fields(entry, *_empty_gt(self.num_classes))
        if self.keypoints is not None:
            entry['gt_keypoints'] = np.zeros((0, 3, self.num_keypoints), dtype=np.int32)
        for k in _DROPPED_IMAGE_FIELDS:
            entry.pop(k, None)

    def _add_gt_annotations(self, entry, anns, gt_min_area, segms):
        """The entry's gt fields from its annotations (records checked when the json was read);
        returns the ids of those dropped for an invalid box. segms: _usable_segms's, or None."""
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
        invalid = [a['id'] for a, keep in zip(anns, valid) if not keep]
        anns = [a for a, keep in zip(anns, valid) if keep]
        if segms is not None:
            entry['segms'] = [segms[a['id']] for a in anns]
        if self.keypoints is not None:
            entry['gt_keypoints'] = np.stack([self._get_gt_keypoints(a) for a in anns]).reshape(
                -1, 3, self.num_keypoints)
            entry['has_visible_keypoints'] = bool(entry['gt_keypoints'][:, 2, :].sum() > 0)
        classes = np.array([self.json_category_id_to_contiguous_id[a['category_id']] for a in anns], dtype=np.int32)
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
        return invalid


    def _get_gt_keypoints(self, obj):
        """Detectron's (3, K) int32 (x, y, visibility) of an annotation ('keypoints' [x1, y1, v1, ...],
        coordinates truncated to int as Detectron's int32 array does); all zeros without keypoints."""
        keypoints = np.zeros((3, self.num_keypoints), dtype=np.int32)
        if 'keypoints' in obj:
            values = np.asarray(obj['keypoints'], dtype=np.float64)
            if len(values) != 3 * self.num_keypoints:
                raise DatasetError('dataset {}: annotation {} has {} keypoint values; its category lists {} '
                                   'keypoints (3 values each)'.format(self.name, obj.get('id'), len(values),
                                                                      self.num_keypoints))
            keypoints[:] = values.reshape(-1, 3).T
        return keypoints


def _read_coco(annotation_file, name):
    """(pycocotools' COCO of a COCO-format json, {annotation id: polygons of fewer than 3 points dropped}),
    with one DatasetError line naming the file for what pycocotools would raise on or merge silently:
    text that is not JSON, a missing "images" or "categories" list, image and annotation records
    that cannot be used (annotations.check_records), and an image id listed twice (one image would be
    dropped and its boxes put on the other)."""
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
    short_polygons = annotations.check_records(content, annotation_file, name)
    ids = collections.Counter(image['id'] for image in content['images'])
    repeated = sorted((i for i, n in ids.items() if n > 1), key=str)
    if repeated:
        raise DatasetError('Annotation file {} of dataset {} lists image id {} {} times ({} ids repeated): '
                           'each image needs its own id'.format(annotation_file, name, repeated[0],
                                                                 ids[repeated[0]], len(repeated)))
    coco = COCO()
    coco.dataset = content
    coco.createIndex()
    return coco, short_polygons


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
