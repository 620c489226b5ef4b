"""COCO box, mask and keypoint evaluation of detections on a JsonDataset: Detectron's results json + COCOeval."""

import contextlib
import io
import logging
import os
import uuid
from dataclasses import dataclass

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.utils import boxes as box_utils
from detectron.utils.io import save_json, save_object

logger = logging.getLogger(__name__)

# The single-IoU AP lines KL-Loss reports after the standard summary (its README quotes AP90).
EXTRA_AP_IOUS = (0.60, 0.70, 0.80, 0.85, 0.90, 0.95)


@dataclass(frozen=True)
class ResultsFormat:
    """How a model's (x1, y1, x2, y2) boxes become the results json's [x, y, w, h]: Detectron's
    boxes are inclusive pixel indices, w = x2 - x1 + 1 (box_width_offset 1) computed in float64;
    CenterNet's are continuous, w = x2 - x1 (offset 0) computed on its float32 rows, and its json
    rounds boxes and scores to 2 decimals (where float32 and float64 widths round apart).
    keypoint_confidence: a keypoint result's score, Detectron's KRCNN.KEYPOINT_CONFIDENCE: its box's
    score ('bbox'), or the mean over its keypoints of their heatmap logit ('logit') or probability ('prob')."""
    box_width_offset: float = 1.0
    decimals: int = None
    dtype: type = np.float64
    keypoint_confidence: str = 'bbox'


# KRCNN.KEYPOINT_CONFIDENCE -> the row of heatmaps_to_keypoints' (x, y, logit, prob) output it averages.
KEYPOINT_CONFIDENCES = {'bbox': None, 'logit': 2, 'prob': 3}


DETECTRON_RESULTS = ResultsFormat()


def evaluate_boxes(json_dataset, all_boxes, output_dir, use_salt=True, cleanup=False,
                   results_format=DETECTRON_RESULTS):
    """Write the results json, evaluate it with COCOeval and return the COCOeval.

    all_boxes[cls][img] is an (N, 5) array (x1, y1, x2, y2, score) or [] for classes 1..K-1 and
    images in ascending id order. Datasets whose name contains 'test' have no public annotations:
    the json is written for submission and None is returned.
    """
    res_file = _results_path(output_dir, 'bbox_', json_dataset.name, use_salt)
    num_results = _write_coco_bbox_results_file(json_dataset, all_boxes, res_file, results_format)
    return _evaluate_results_file(json_dataset, res_file, num_results, output_dir, 'bbox', cleanup)


def evaluate_masks(json_dataset, all_boxes, all_segms, output_dir, use_salt=True, cleanup=False):
    """Detectron's evaluate_masks: write the segmentation results json (each RLE with the score of
    its box in all_boxes; all_segms[cls][img] lists the RLEs of all_boxes[cls][img]), evaluate it
    with COCOeval('segm') and return the COCOeval (None for a 'test' set, as evaluate_boxes)."""
    res_file = _results_path(output_dir, 'segmentations_', json_dataset.name, use_salt)
    num_results = _write_coco_segms_results_file(json_dataset, all_boxes, all_segms, res_file)
    return _evaluate_results_file(json_dataset, res_file, num_results, output_dir, 'segm', cleanup)


def evaluate_keypoints(json_dataset, all_boxes, all_keyps, output_dir, use_salt=True, cleanup=False,
                       results_format=DETECTRON_RESULTS):
    """Detectron's evaluate_keypoints: write the keypoint results json (all_keyps[cls][img] lists the
    (4, K) (x, y, logit, prob) keypoints of all_boxes[cls][img]), evaluate it with COCOeval('keypoints')
    at the dataset's OKS sigmas and return the COCOeval (None for a 'test' set, as evaluate_boxes)."""
    res_file = _results_path(output_dir, 'keypoints_', json_dataset.name, use_salt)
    score_row = KEYPOINT_CONFIDENCES[results_format.keypoint_confidence]

    def one_category(cls_ind, image_ids, category_id):
        for image_id, dets, keyps in zip(image_ids, all_boxes[cls_ind], all_keyps[cls_ind]):
            box_scores = np.asarray(dets, dtype=np.float64).reshape(-1, 5)[:, 4]
            for kps, box_score in zip(keyps, box_scores):
                kps = np.asarray(kps)
                xy = np.stack([kps[0], kps[1], np.ones_like(kps[0])], axis=1).astype(np.float64).ravel().tolist()
                score = box_score if score_row is None else np.mean(kps[score_row], dtype=np.float64)
                yield {'image_id': image_id, 'category_id': category_id, 'keypoints': xy, 'score': float(score)}
    num_results = _write_results_file(json_dataset, 'all_keyps', all_keyps, res_file, 'keypoints', one_category)
    return _evaluate_results_file(json_dataset, res_file, num_results, output_dir, 'keypoints', cleanup)


def _results_path(output_dir, prefix, dataset_name, use_salt):
    res_file = os.path.join(output_dir, prefix + dataset_name + '_results')
    if use_salt:
        res_file += '_{}'.format(uuid.uuid4())
    return res_file + '.json'


# COCOeval iouType -> (name in the log, file of the pickled COCOeval), as Detectron's.
_EVAL_OUTPUTS = {'bbox': ('Bbox', 'detection_results.pkl'), 'segm': ('Segmentation', 'segmentation_results.pkl'),
                 'keypoints': ('Keypoint', 'keypoint_results.pkl')}
_RESULTS_PREFIXES = {'bbox': 'bbox_', 'segm': 'segmentations_', 'keypoints': 'keypoints_'}


def remove_stale_results(output_dir, dataset_name, iou_type):
    """Remove the results json and pickled COCOeval of task iou_type ('bbox', 'segm' or 'keypoints') that an earlier test of
    dataset_name left in output_dir, so that no file beside a new test's outputs describes other detections
    (a box-only test after a mask test in one OUTPUT_DIR). Returns the removed paths."""
    paths = [_results_path(output_dir, _RESULTS_PREFIXES[iou_type], dataset_name, use_salt=False),
             os.path.join(output_dir, _EVAL_OUTPUTS[iou_type][1])]
    removed = [path for path in paths if os.path.isfile(path)]
    for path in removed:
        os.remove(path)
    if removed:
        logger.info('Removed %s of an earlier test: this one has no %s results', ', '.join(removed), iou_type)
    return removed


def _evaluate_results_file(json_dataset, res_file, num_results, output_dir, iou_type, cleanup):
    name, eval_file = _EVAL_OUTPUTS[iou_type]
    if 'test' in json_dataset.name:
        logger.warning('{} eval ignored as annotations are undisclosed on test: {} ignored'
                       .format(name, json_dataset.name))
        coco_eval = None
    else:
        coco_eval = _do_detection_eval(json_dataset, res_file, num_results, output_dir, iou_type, eval_file)
    if cleanup:
        os.remove(res_file)
    return coco_eval


def ap_at_iou(coco_eval, iou):
    """AP at one IoU threshold: area 'all', 100 detections per image, -1 when undefined."""
    return _mean_valid(_precision(coco_eval, iou, iou))


def _write_coco_bbox_results_file(json_dataset, all_boxes, res_file, results_format=DETECTRON_RESULTS):
    """Write the results json; returns the number of detections written."""
    return _write_results_file(
        json_dataset, 'all_boxes', all_boxes, res_file, 'bbox',
        lambda cls_ind, image_ids, category_id: _coco_bbox_results_one_category(
            all_boxes[cls_ind], image_ids, category_id, results_format))


def _write_coco_segms_results_file(json_dataset, all_boxes, all_segms, res_file):
    """Write the segmentation results json, RLE counts as str (Detectron's Python 3 decode), each
    RLE with the score of its box; returns the number of results written."""
    def one_category(cls_ind, image_ids, category_id):
        for image_id, dets, rles in zip(image_ids, all_boxes[cls_ind], all_segms[cls_ind]):
            scores = np.asarray(dets, dtype=np.float64).reshape(-1, 5)[:, 4].tolist()
            yield from ({'image_id': image_id, 'category_id': category_id, 'score': score,
                         'segmentation': {'size': rle['size'], 'counts': _str_counts(rle['counts'])}}
                        for rle, score in zip(rles, scores))
    return _write_results_file(json_dataset, 'all_segms', all_segms, res_file, 'segmentation', one_category)


def _write_results_file(json_dataset, name, per_class, res_file, kind, category_results):
    """The results of every class >= 1 (per_class[cls][image] for the dataset's images, `name` in the
    error) as category_results(cls, image_ids, json category id) makes them, written to res_file."""
    image_ids = json_dataset.get_image_ids()
    results = []
    for cls_ind in range(1, min(len(per_class), json_dataset.num_classes)):
        if len(per_class[cls_ind]) != len(image_ids):
            raise ValueError('{}[{}] has {} images but dataset {} has {}'.format(
                name, cls_ind, len(per_class[cls_ind]), json_dataset.name, len(image_ids)))
        results.extend(category_results(cls_ind, image_ids, json_dataset.contiguous_category_id_to_json_id[cls_ind]))
    logger.info('Writing {} results json to: {}'.format(kind, os.path.abspath(res_file)))
    save_json(results, res_file)
    return len(results)


def _str_counts(counts):
    return counts.decode('utf8') if isinstance(counts, bytes) else counts


def _coco_bbox_results_one_category(boxes, image_ids, category_id, results_format):
    results = []
    for image_id, dets in zip(image_ids, boxes):
        if len(dets) == 0:
            continue
        dets = np.asarray(dets, dtype=results_format.dtype)
        # Detectron's xyxy_to_xywh with offset 1 (the same float64 arithmetic), CenterNet's
        # convert_eval_format with 0 (bbox[2] -= bbox[0] on float32 rows).
        xywh = np.hstack([dets[:, :2], dets[:, 2:4] - dets[:, :2] + results_format.box_width_offset])
        xywh, scores = xywh.tolist(), dets[:, 4].tolist()
        if results_format.decimals is not None:
            # CenterNet's float('{:.2f}'.format(v)) of every box value and score.
            xywh = [[_rounded(v, results_format.decimals) for v in bbox] for bbox in xywh]
            scores = [_rounded(v, results_format.decimals) for v in scores]
        results.extend(
            {'image_id': image_id, 'category_id': category_id, 'bbox': bbox, 'score': score}
            for bbox, score in zip(xywh, scores)
        )
    return results


def _rounded(value, decimals):
    return float('{:.{}f}'.format(value, decimals))


def _do_detection_eval(json_dataset, res_file, num_results, output_dir, iou_type, eval_file):
    coco_gt = json_dataset.COCO
    coco_dt = coco_gt.loadRes(res_file) if num_results else _empty_results(coco_gt)
    coco_eval = COCOeval(coco_gt, coco_dt, iou_type)
    if iou_type == 'keypoints':
        coco_eval.params.kpt_oks_sigmas = np.asarray(json_dataset.keypoint_oks_sigmas, dtype=np.float64)
    coco_eval.evaluate()
    coco_eval.accumulate()
    if iou_type == 'keypoints':  # Detectron prints only COCOeval's summary of keypoints
        _log_summary(coco_eval)
    else:
        _log_detection_eval_metrics(json_dataset, coco_eval)
    eval_file = os.path.join(output_dir, eval_file)
    save_object(coco_eval, eval_file)
    logger.info('Wrote json eval results to: {}'.format(eval_file))
    return coco_eval


def _empty_results(coco_gt):
    """A COCO object without detections (pycocotools' loadRes fails on an empty list)."""
    coco_dt = COCO()
    coco_dt.dataset = {'images': list(coco_gt.dataset['images']),
                       'categories': list(coco_gt.dataset['categories']),
                       'annotations': []}
    coco_dt.createIndex()
    return coco_dt


def _log_detection_eval_metrics(json_dataset, coco_eval):
    lo, hi = 0.50, 0.95
    logger.info('~~~~ Mean and per-category AP @ IoU=[{:.2f},{:.2f}] ~~~~'.format(lo, hi))
    precision = _precision(coco_eval, lo, hi)
    logger.info('{:.1f}'.format(100 * _mean_valid(precision)))
    for cls_ind in range(1, json_dataset.num_classes):
        # precision's class axis has no background column; -1 there means no ground truth at all
        ap = _mean_valid(precision[:, :, cls_ind - 1])
        logger.info('{}: {}'.format(json_dataset.classes[cls_ind], '{:.1f}'.format(100 * ap) if ap >= 0
                                    else 'absent (no ground-truth box of this class in the dataset)'))
    logger.info('~~~~ Summary metrics ~~~~')
    _log_summary(coco_eval)
    for iou in EXTRA_AP_IOUS:
        logger.info(' {:<18} {} @[ IoU={:<9} | area={:>6s} | maxDets={:>3d} ] = {:0.3f}'.format(
            'Average Precision', '(AP)', '{:0.2f}'.format(iou), 'all', 100,
            ap_at_iou(coco_eval, iou)))


def _log_summary(coco_eval):
    """COCOeval.summarize()'s lines, logged."""
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        coco_eval.summarize()
    for line in summary.getvalue().splitlines():
        logger.info(line)


def _precision(coco_eval, iou_lo, iou_hi):
    """Precision (iou, recall, class) for IoUs in [iou_lo, iou_hi], area 'all', maxDets 100."""
    params = coco_eval.params
    # pycocotools' thresholds come from linspace, so 0.6 etc. are matched with a tolerance.
    ind_lo = _iou_index(params.iouThrs, iou_lo)
    ind_hi = _iou_index(params.iouThrs, iou_hi)
    area = params.areaRngLbl.index('all')
    max_dets = params.maxDets.index(100)
    return coco_eval.eval['precision'][ind_lo:ind_hi + 1, :, :, area, max_dets]


def _iou_index(iou_thresholds, iou):
    matches = np.where(np.abs(iou_thresholds - iou) < 1e-5)[0]
    if len(matches) == 0:
        raise ValueError('IoU {} is not one of the COCOeval thresholds {}'.format(
            iou, iou_thresholds))
    return matches[0]


def _mean_valid(precision):
    """Mean over entries pycocotools marks valid (> -1); -1 when there are none, as summarize()."""
    valid = precision[precision > -1]
    return float(np.mean(valid)) if valid.size else -1.0


# Detectron's proposal-recall area ranges (of the gt's segmentation area).
PROPOSAL_AREA_RANGES = {'all': (0 ** 2, 1e5 ** 2), 'small': (0 ** 2, 32 ** 2), 'medium': (32 ** 2, 96 ** 2),
                        'large': (96 ** 2, 1e5 ** 2), '96-128': (96 ** 2, 128 ** 2), '128-256': (128 ** 2, 256 ** 2),
                        '256-512': (256 ** 2, 512 ** 2), '512-inf': (512 ** 2, 1e5 ** 2)}


def evaluate_box_proposals(json_dataset, roidb, thresholds=None, area='all', limit=None, class_specific=False):
    """Detectron's proposal recall (its fast approximation of COCO's): per image, the non-crowd gt boxes of
    `area` are matched greedily to the first `limit` proposals (the class-0 rows of the roidb), the best
    covered gt first; recall at each IoU threshold (0.5:0.05:0.95), averaged into 'ar' (per category
    first with class_specific). Returns {'ar', 'recalls', 'thresholds', 'gt_overlaps', 'num_pos'}."""
    low, high = PROPOSAL_AREA_RANGES[area]
    gt_overlaps, gt_classes, num_pos = [np.zeros(0)], [np.zeros(0)], 0
    for entry in roidb:
        gt = np.where((entry['gt_classes'] > 0) & ~np.asarray(entry['is_crowd'], dtype=bool))[0]
        in_area = np.where((entry['seg_areas'][gt] >= low) & (entry['seg_areas'][gt] <= high))[0]
        # As Detectron: the classes at the in-area positions of the non-crowd gt list, read from all rows.
        gt_classes.append(entry['gt_classes'][in_area])
        gt = gt[in_area]
        num_pos += len(gt)
        boxes = entry['boxes'][entry['gt_classes'] == 0]
        if not len(boxes):
            continue
        if limit is not None:
            boxes = boxes[:limit]
        gt_overlaps.append(_greedy_coverage(box_utils.bbox_overlaps(boxes.astype(np.float32),
                                                                    entry['boxes'][gt].astype(np.float32))))
    gt_overlaps, gt_classes = np.hstack(gt_overlaps), np.hstack(gt_classes)
    thresholds = np.arange(0.5, 0.95 + 1e-5, 0.05) if thresholds is None else thresholds
    with np.errstate(invalid='ignore'):  # no gt box in the area range: nan, as Detectron's
        return _recalls(gt_overlaps, gt_classes, num_pos, thresholds, class_specific)


def _recalls(gt_overlaps, gt_classes, num_pos, thresholds, class_specific):
    if class_specific:
        recalls = np.array([[(gt_overlaps[gt_classes == c] >= t).sum() / float((gt_classes == c).sum())
                             for t in thresholds] for c in np.unique(gt_classes)]).reshape(-1, len(thresholds))
        ar = recalls.mean(axis=1).mean()
    else:
        gt_overlaps = np.sort(gt_overlaps)
        recalls = np.array([(gt_overlaps >= t).sum() / float(num_pos) for t in thresholds])
        ar = recalls.mean()
    return {'ar': ar, 'recalls': recalls, 'thresholds': thresholds, 'gt_overlaps': gt_overlaps, 'num_pos': num_pos}


def _greedy_coverage(overlaps):
    """IoU of min(proposals, gt) matches, each step the best-covered remaining gt with its best remaining
    proposal (both then used), in the order they are matched."""
    overlaps = overlaps.copy()
    covered = np.zeros(overlaps.shape[1])
    for j in range(min(overlaps.shape)):
        best_per_gt = overlaps.max(axis=0)
        gt_ind = best_per_gt.argmax()
        box_ind = overlaps[:, gt_ind].argmax()
        covered[j] = overlaps[box_ind, gt_ind]
        overlaps[box_ind, :] = -1
        overlaps[:, gt_ind] = -1
    return covered
