"""Dataset-level evaluation results in Detectron's {dataset: {task: {metric: value}}} form."""

import logging
from collections import OrderedDict

import numpy as np

from detectron.datasets import json_dataset_evaluator, voc_dataset_evaluator

logger = logging.getLogger(__name__)

# Metric name -> index in COCOeval.stats (the standard summary).
_COCO_STATS_METRICS = (('AP', 0), ('AP50', 1), ('AP75', 2), ('APs', 3), ('APm', 4), ('APl', 5))
# COCOeval('keypoints') has no small objects: its stats run AP, AP50, AP75, APm, APl (Detectron's COCO_KPS_*).
_COCO_KEYPOINT_METRICS = (('AP', 0), ('AP50', 1), ('AP75', 2), ('APm', 3), ('APl', 4))


def evaluate_all(dataset, all_boxes, output_dir, competition_mode=True,
                 results_format=json_dataset_evaluator.DETECTRON_RESULTS, all_segms=None, all_keyps=None):
    """Evaluate every task the detections have: boxes, masks when all_segms (all_segms[cls][img]
    the RLEs of all_boxes[cls][img]) is given and keypoints when all_keyps (all_keyps[cls][img] their
    (4, K) keypoints) is; returns {dataset name: {'box': ..., 'mask': ..., 'keypoint': ...}}."""
    results = evaluate_boxes(dataset, all_boxes, output_dir, competition_mode, results_format)
    logger.info('Evaluating bounding boxes is done!')
    if all_segms:
        results[dataset.name].update(evaluate_masks(dataset, all_boxes, all_segms, output_dir, competition_mode)
                                     [dataset.name])
        logger.info('Evaluating segmentations is done!')
    else:
        json_dataset_evaluator.remove_stale_results(output_dir, dataset.name, 'segm')
    if all_keyps:
        results[dataset.name].update(evaluate_keypoints(dataset, all_boxes, all_keyps, output_dir, competition_mode,
                                                        results_format)[dataset.name])
        logger.info('Evaluating keypoints is done!')
    else:
        json_dataset_evaluator.remove_stale_results(output_dir, dataset.name, 'keypoints')
    return results


def evaluate_boxes(dataset, all_boxes, output_dir, competition_mode=True,
                   results_format=json_dataset_evaluator.DETECTRON_RESULTS):
    """COCO box AP of all_boxes on the JsonDataset `dataset` (a `voc_*` dataset: VOC's AP, see _voc_results).

    competition_mode is Detectron's TEST.COMPETITION_MODE: when False the results json gets a
    unique name and is deleted after evaluation. results_format: the model's box convention
    (json_dataset_evaluator.ResultsFormat). Returns OrderedDict{dataset name: {'box':
    OrderedDict of AP, AP50, AP75, APs, APm, APl, AP60, ..., AP95}}, every value -1 when the
    dataset is not evaluated (a 'test' set).
    """
    logger.info('Evaluating detections')
    if voc_dataset_evaluator.use_voc_evaluator(dataset.name):
        return OrderedDict([(dataset.name, OrderedDict([('box', _voc_results(
            voc_dataset_evaluator.evaluate_boxes(dataset, all_boxes, output_dir)))]))])
    coco_eval = json_dataset_evaluator.evaluate_boxes(
        dataset, all_boxes, output_dir,
        use_salt=not competition_mode, cleanup=not competition_mode, results_format=results_format,
    )
    box_results = OrderedDict([('box', _coco_eval_to_results(coco_eval))])
    return OrderedDict([(dataset.name, box_results)])


def evaluate_masks(dataset, all_boxes, all_segms, output_dir, competition_mode=True):
    """COCO mask AP (COCOeval 'segm') of all_segms on the JsonDataset `dataset`, as evaluate_boxes:
    OrderedDict{dataset name: {'mask': OrderedDict of the box metrics' names}}."""
    logger.info('Evaluating segmentations')
    coco_eval = json_dataset_evaluator.evaluate_masks(
        dataset, all_boxes, all_segms, output_dir, use_salt=not competition_mode, cleanup=not competition_mode)
    return OrderedDict([(dataset.name, OrderedDict([('mask', _coco_eval_to_results(coco_eval))]))])


def evaluate_keypoints(dataset, all_boxes, all_keyps, output_dir, competition_mode=True,
                       results_format=json_dataset_evaluator.DETECTRON_RESULTS):
    """COCO keypoint AP (COCOeval 'keypoints', OKS) of all_keyps on the JsonDataset `dataset`:
    OrderedDict{dataset name: {'keypoint': OrderedDict of AP, AP50, AP75, APm, APl}} (-1 when not evaluated)."""
    logger.info('Evaluating keypoints')
    coco_eval = json_dataset_evaluator.evaluate_keypoints(
        dataset, all_boxes, all_keyps, output_dir, use_salt=not competition_mode, cleanup=not competition_mode,
        results_format=results_format)
    metrics = OrderedDict((name, float(coco_eval.stats[i]) if coco_eval is not None else -1)
                          for name, i in _COCO_KEYPOINT_METRICS)
    return OrderedDict([(dataset.name, OrderedDict([('keypoint', metrics)]))])


def log_copy_paste_friendly_results(results):
    """Log results as 'copypaste: ' lines (comma separated names, then values) for spreadsheets."""
    for dataset_name, tasks in results.items():
        logger.info('copypaste: Dataset: {}'.format(dataset_name))
        for task, metrics in tasks.items():
            logger.info('copypaste: Task: {}'.format(task))
            logger.info('copypaste: ' + ','.join(metrics.keys()))
            logger.info('copypaste: ' + ','.join('{:.4f}'.format(v) for v in metrics.values()))


def box_metric_names():
    """Names of the box metrics, in the order evaluate_boxes reports them."""
    return [name for name, _ in _COCO_STATS_METRICS] + [
        'AP{:d}'.format(int(round(100 * iou))) for iou in json_dataset_evaluator.EXTRA_AP_IOUS
    ]


def _voc_results(class_aps):
    """The box metrics of a VOC evaluation: AP50 its mean AP over the classes (at IoU 0.5, VOC's metric),
    the COCO metrics it does not compute -1 (Detectron reports all six -1 for VOC)."""
    results = OrderedDict((name, -1) for name in box_metric_names())
    results['AP50'] = float(np.mean(list(class_aps.values())))
    return results


def _coco_eval_to_results(coco_eval):
    if coco_eval is None:
        return OrderedDict((name, -1) for name in box_metric_names())
    values = [float(coco_eval.stats[i]) for _, i in _COCO_STATS_METRICS] + [
        json_dataset_evaluator.ap_at_iou(coco_eval, iou)
        for iou in json_dataset_evaluator.EXTRA_AP_IOUS
    ]
    return OrderedDict(zip(box_metric_names(), values))


def evaluate_box_proposals(dataset, roidb, class_specific=False):
    """Detectron's proposal recall of the roidb's proposals (class-0 rows): {dataset name: {'box_proposal':
    OrderedDict of AR@100, ARs@100, ARm@100, ARl@100, then the same @1000}} (TEST.CLASS_SPECIFIC_AR:
    class_specific)."""
    recall = OrderedDict()
    for limit in (100, 1000):
        for area, suffix in (('all', ''), ('small', 's'), ('medium', 'm'), ('large', 'l')):
            stats = json_dataset_evaluator.evaluate_box_proposals(dataset, roidb, area=area, limit=limit,
                                                                  class_specific=class_specific)
            recall['AR{}@{:d}'.format(suffix, limit)] = float(stats['ar'])
    return OrderedDict([(dataset.name, OrderedDict([('box_proposal', recall)]))])


def log_box_proposal_results(results):
    """Detectron's lines: the dataset's name, then one 'AR@100    : 0.123' line per metric."""
    for dataset_name, tasks in results.items():
        metrics = tasks['box_proposal']
        pad = max(len(k) for k in metrics)
        logger.info(dataset_name)
        for k, v in metrics.items():
            logger.info('{}: {:.3f}'.format(k.ljust(pad), v))
