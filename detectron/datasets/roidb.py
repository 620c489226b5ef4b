"""The training roidb: datasets and their flipped copies, minus images without usable gt."""

import logging

import numpy as np

from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.proposal_files import load_proposals
from detectron.utils import boxes as box_utils
from detectron.utils import keypoints as keypoint_utils
from detectron.utils import segms as segm_utils
from detectron.utils.errors import DatasetError

logger = logging.getLogger(__name__)


def combined_roidb_for_training(dataset_names, use_flipped=True, gt_min_area=-1, segms=False, proposal_files=(),
                                crowd_filter_thresh=0, cache_dir=None, roi_thresholds=(0.5, 0.5, 0.0), num_keypoints=0):
    """Concatenated gt roidb of `dataset_names` (a name or a sequence), ready for training.

    With use_flipped every dataset's entries are followed by their horizontally flipped copies
    (Detectron's TRAIN.USE_FLIPPED); gt_min_area is Detectron's TRAIN.GT_MIN_AREA; segms=True keeps
    the objects' segmentations (MODEL.MASK_ON). proposal_files (TRAIN.PROPOSAL_FILES, one per dataset,
    paths or URLs cached in cache_dir) add each file's proposals after the gt boxes, with
    crowd_filter_thresh (TRAIN.CROWD_FILTER_THRESH). roi_thresholds: TRAIN.FG_THRESH, BG_THRESH_HI and
    BG_THRESH_LO, for filter_for_training. num_keypoints > 0
    (KRCNN.NUM_KEYPOINTS of a Keypoint R-CNN) asks every dataset for that many keypoints per object (one
    DatasetError line otherwise) and keeps only images with a visible keypoint, as Detectron.
    """
    if isinstance(dataset_names, str):
        dataset_names = (dataset_names,)
    if proposal_files and len(proposal_files) != len(dataset_names):
        raise DatasetError('TRAIN.PROPOSAL_FILES names {} files for the {} datasets of TRAIN.DATASETS {}: give one '
                           'proposal file per dataset'.format(len(proposal_files), len(dataset_names),
                                                              tuple(dataset_names)))
    roidb = []
    for name, proposal_file in zip(dataset_names, proposal_files or (None,) * len(dataset_names)):
        dataset = JsonDataset(name)
        if num_keypoints:
            _check_keypoints(dataset, num_keypoints)
        proposals = load_proposals(proposal_file, cache_dir) if proposal_file else None
        dataset_roidb = dataset.get_roidb(gt=True, gt_min_area=gt_min_area, segms=segms, proposals=proposals,
                                          crowd_filter_thresh=crowd_filter_thresh if proposals else 0)
        if use_flipped:
            logger.info('Appending horizontally-flipped training examples...')
            dataset_roidb.extend(flipped_entries(dataset_roidb))
        logger.info('Loaded dataset: {} ({} entries)'.format(name, len(dataset_roidb)))
        roidb.extend(dataset_roidb)
    filtered = filter_for_training(roidb, *roi_thresholds, keypoints=num_keypoints > 0)
    if not filtered:
        raise DatasetError(
            'No training images with usable annotations in TRAIN.DATASETS {}: none of the {} images has a '
            'non-crowd box of positive width, height and area (check the annotation files, and '
            'TRAIN.GT_MIN_AREA {})'.format(tuple(dataset_names), len(roidb) // (2 if use_flipped else 1),
                                          gt_min_area))
    return filtered


def _check_keypoints(dataset, num_keypoints):
    if dataset.num_keypoints != num_keypoints:
        raise DatasetError('dataset {} has {} keypoints per object but the model predicts {} (KRCNN.NUM_KEYPOINTS): '
                           'use a keypoint dataset (e.g. keypoints_coco_2014_train, shapes_keypoints_train) or set '
                           'KRCNN.NUM_KEYPOINTS {}'.format(dataset.name, dataset.num_keypoints, num_keypoints,
                                                           dataset.num_keypoints))


def flipped_entries(roidb):
    """Horizontally flipped copies of the entries: boxes (segms, keypoints) mirrored, flipped=True, rest shared."""
    flipped = []
    for entry in roidb:
        flipped_entry = dict(entry)
        flipped_entry['boxes'] = box_utils.flip_boxes(entry['boxes'], entry['width'])
        if 'gt_keypoints' in entry:
            dataset = entry['dataset']
            flipped_entry['gt_keypoints'] = keypoint_utils.flip_keypoints(
                dataset.keypoints, dataset.keypoint_flip_map, entry['gt_keypoints'], entry['width'])
        if 'segms' in entry:
            flipped_entry['segms'] = segm_utils.flip_segms(entry['segms'], entry['height'], entry['width'])
        flipped_entry['flipped'] = True
        flipped.append(flipped_entry)
    return flipped


def filter_for_training(roidb, fg_thresh=0.5, bg_thresh_hi=0.5, bg_thresh_lo=0.0, keypoints=False):
    """Detectron's filter_for_training: keep the entries with a box that is fg (max overlap >= fg_thresh) or
    bg (in [bg_thresh_lo, bg_thresh_hi)), with keypoints only those with a visible keypoint. In a gt-only
    roidb (non-crowd boxes at overlap 1, crowd ones at -1) that is every entry with a non-crowd gt box; with
    proposals, also images whose proposals are bg."""
    def usable(entry):
        overlaps = entry['max_overlaps']
        return (bool(np.any((overlaps >= fg_thresh) | ((overlaps < bg_thresh_hi) & (overlaps >= bg_thresh_lo))))
                and (not keypoints or entry.get('has_visible_keypoints', False)))

    filtered = [e for e in roidb if usable(e)]
    logger.info('Filtered {} roidb entries: {} -> {}'.format(
        len(roidb) - len(filtered), len(roidb), len(filtered)))
    return filtered
