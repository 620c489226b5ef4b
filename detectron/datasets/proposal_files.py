"""Proposal files (Detectron's rpn_proposals.pkl: {'boxes', 'scores', 'ids'} lists in image order, plus
the cfg yaml) read into a roidb and written by RPN-only testing, as Detectron's json_dataset.py
(_add_proposals_from_file, _merge_proposal_boxes_into_roidb, _filter_crowd_proposals) and
rpn_generator.py do."""
import logging

import numpy as np
from pycocotools import mask as COCOmask

from detectron.checkpoint.download import cache_url
from detectron.utils import boxes as box_utils
from detectron.utils.errors import DatasetError
from detectron.utils.io import load_object, save_object

logger = logging.getLogger(__name__)

# Detectron's own proposal files of 2017 name the image ids 'indexes' (its "compat fix").
_ID_FIELDS = ('ids', 'indexes')


def load_proposals(path_or_url, cache_dir):
    """{'boxes', 'scores', 'ids'} lists of a proposal file (a local path or a URL cached in cache_dir);
    Python 2 pickles (bytes keys, latin1 numpy data) are read as Detectron wrote them."""
    path = cache_url(path_or_url, cache_dir)
    logger.info('Loading proposals from: %s', path_or_url)
    try:
        content = load_object(path)
    except FileNotFoundError:
        raise DatasetError('proposal file {} not found; set TRAIN/TEST.PROPOSAL_FILES to the rpn_proposals.pkl '
                           'of an RPN-only model (tools/test_net.py writes one per dataset)'.format(path)) from None
    if isinstance(content, dict):
        content = {k.decode('latin1') if isinstance(k, bytes) else k: v for k, v in content.items()}
    id_field = next((f for f in _ID_FIELDS if isinstance(content, dict) and f in content), None)
    if id_field is None or 'boxes' not in content:
        raise DatasetError('proposal file {} holds no "boxes" and "ids" lists: it is not a Detectron proposal '
                           'file'.format(path_or_url))
    num = len(content[id_field])
    scores = content.get('scores', [np.zeros(len(b), np.float32) for b in content['boxes']])
    return {'boxes': list(content['boxes']), 'scores': list(scores), 'ids': [int(i) for i in content[id_field]],
            'file': path_or_url, 'count': num}


def save_proposals(path, boxes, scores, ids, cfg_yaml):
    """rpn_proposals.pkl as Detectron's rpn_generator writes it (protocol 2, readable by Python 2)."""
    save_object({'boxes': boxes, 'scores': scores, 'ids': ids, 'cfg': cfg_yaml}, path)
    logger.info('Wrote RPN proposals to %s', path)


def add_proposals_from_file(roidb, proposals, dataset_name, min_proposal_size=2, top_k=-1, crowd_thresh=0):
    """Detectron's _add_proposals_from_file: each entry's proposals (of load_proposals) clipped to its
    image, duplicates removed (Detectron's unique_boxes), boxes of side <= min_proposal_size dropped,
    the first top_k kept (top_k > 0), appended after its gt boxes (with max_overlaps / max_classes: the
    roidb's class assignments are made before); with crowd_thresh > 0 the proposals covering a crowd region
    by more than it get overlap -1."""
    by_id = {image_id: i for i, image_id in enumerate(proposals['ids'])}
    missing = [entry['id'] for entry in roidb if entry['id'] not in by_id]
    if missing:
        raise DatasetError('proposal file {} does not match dataset {}: it has proposals for {} of its {} images '
                           '(image id {} has none; the file lists {} images); use the proposal file made on this '
                           'dataset'.format(proposals['file'], dataset_name, len(roidb) - len(missing), len(roidb),
                                            missing[0], proposals['count']))
    box_list = []
    for entry in roidb:
        boxes = np.array(proposals['boxes'][by_id[entry['id']]], dtype=np.float32).reshape(-1, 4)
        boxes = box_utils.clip_boxes_to_image(boxes, entry['height'], entry['width'])
        boxes = boxes[unique_boxes(boxes)]
        boxes = boxes[box_utils.filter_small_boxes(boxes, min_proposal_size)]
        box_list.append(boxes[:top_k] if top_k > 0 else boxes)
    merge_proposal_boxes_into_roidb(roidb, box_list)
    if crowd_thresh > 0:
        filter_crowd_proposals(roidb, crowd_thresh)


def unique_boxes(boxes, scale=1.0):
    """Indices (ascending) of the first of each set of boxes equal after rounding boxes * scale."""
    hashes = np.round(boxes * scale).dot(np.array([1, 1e3, 1e6, 1e9]))
    return np.sort(np.unique(hashes, return_index=True)[1])


def merge_proposal_boxes_into_roidb(roidb, box_list):
    """Append box_list[i] to roidb[i] (whose max_overlaps / max_classes the gt rows have) as class-0 boxes whose
    max overlap is their IoU with the gt box (crowd included) overlapping them most, with its class, when above 0.
    Detectron kept these in a sparse gt_overlaps row per box; only its maximum is ever read, and a dense row of
    every class would take 81 x 4 bytes per proposal (about 80 GB for COCO's training proposals)."""
    for entry, boxes in zip(roidb, box_list):
        num_boxes = len(boxes)
        max_overlaps = np.zeros(num_boxes, dtype=entry['max_overlaps'].dtype)
        max_classes = np.zeros(num_boxes, dtype=entry['max_classes'].dtype)
        box_to_gt = -np.ones(num_boxes, dtype=entry['box_to_gt_ind_map'].dtype)
        gt_inds = np.where(entry['gt_classes'] > 0)[0]
        if len(gt_inds) and num_boxes:
            overlaps = box_utils.bbox_overlaps(boxes.astype(np.float32), entry['boxes'][gt_inds].astype(np.float32))
            best, best_iou = overlaps.argmax(axis=1), overlaps.max(axis=1)
            hit = np.where(best_iou > 0)[0]
            max_overlaps[hit] = best_iou[hit]
            max_classes[hit] = entry['gt_classes'][gt_inds[best[hit]]]
            box_to_gt[hit] = gt_inds[best[hit]]
        entry['boxes'] = np.append(entry['boxes'], boxes.astype(entry['boxes'].dtype), axis=0)
        entry['gt_classes'] = np.append(entry['gt_classes'], np.zeros(num_boxes, entry['gt_classes'].dtype))
        entry['seg_areas'] = np.append(entry['seg_areas'], np.zeros(num_boxes, entry['seg_areas'].dtype))
        entry['is_crowd'] = np.append(entry['is_crowd'], np.zeros(num_boxes, entry['is_crowd'].dtype))
        entry['box_to_gt_ind_map'] = np.append(entry['box_to_gt_ind_map'], box_to_gt)
        entry['max_overlaps'] = np.append(entry['max_overlaps'], max_overlaps)
        entry['max_classes'] = np.append(entry['max_classes'], max_classes)


def filter_crowd_proposals(roidb, crowd_thresh):
    """Proposals covering a crowd box by more than crowd_thresh (COCO's crowd IoU: the intersection
    over the proposal's area) get max overlap -1 (class 0): never sampled."""
    for entry in roidb:
        crowd_inds = np.where(entry['is_crowd'])[0]
        non_gt_inds = np.where(entry['gt_classes'] == 0)[0]
        if not len(crowd_inds) or not len(non_gt_inds):
            continue
        crowd_boxes = box_utils.xyxy_to_xywh(entry['boxes'][crowd_inds].astype(np.float64))
        non_gt_boxes = box_utils.xyxy_to_xywh(entry['boxes'][non_gt_inds].astype(np.float64))
        ious = COCOmask.iou(non_gt_boxes, crowd_boxes, [1] * len(crowd_inds))
        bad = non_gt_inds[ious.max(axis=1) > crowd_thresh]
        entry['max_overlaps'][bad] = -1
        entry['max_classes'][bad] = 0


def proposal_rows(entry):
    """The proposal boxes (class-0 rows) of a roidb entry that can be sampled, in original image coordinates:
    the crowd-filtered ones (overlap -1, which TRAIN.BG_THRESH_LO and BBOX_THRESH in [0, 1] never take) left out."""
    rows = (np.asarray(entry['gt_classes']) == 0) & (np.asarray(entry['max_overlaps']) >= 0)
    return np.asarray(entry['boxes'], dtype=np.float32).reshape(-1, 4)[rows]
