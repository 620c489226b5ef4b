"""What test_net keeps of a model's per-image results, how slices merge, the files they are written to
and how they are evaluated (ModelType.test_results): Detectron's detections (all_boxes / all_segms /
all_keyps, detections.pkl, COCO AP) or, for an RPN-only model, its proposals (rpn_proposals.pkl, proposal recall)."""
import logging
import os

from detectron.datasets import proposal_files, task_evaluation
from detectron.datasets.json_dataset_evaluator import DETECTRON_RESULTS
from detectron.utils.io import save_object

logger = logging.getLogger(__name__)


def detection_parts(detections):
    """A detector's result (cls_boxes, (cls_boxes, cls_segms) or, for a Keypoint R-CNN, (cls_boxes, cls_segms
    or None, cls_keyps)) -> (cls_boxes, cls_segms or None, cls_keyps or None)."""
    if not isinstance(detections, tuple):
        return detections, None, None
    return tuple(detections) + (None,) * (3 - len(detections))


def boxes_and_segms(detections):
    """A detector's result -> (cls_boxes, cls_segms or None)."""
    return detection_parts(detections)[:2]


class DetectionResults:
    """Detectron's all_boxes[j][i] (and all_segms[j][i] / all_keyps[j][i] for a detector with masks /
    keypoints) of detectors returning cls_boxes, (cls_boxes, cls_segms) or (cls_boxes, cls_segms or None,
    cls_keyps); the value of a slice is the triple (all_boxes, all_segms or None, all_keyps or None)."""

    def __init__(self, results_format=DETECTRON_RESULTS, competition_mode=True):
        self.results_format, self.competition_mode = results_format, competition_mode

    def store(self, num_classes, entries):
        return _Detections(num_classes, len(entries))

    def merge(self, values):
        """The values of consecutive slices, in slice order, as one."""
        return (merge_ranges([value[0] for value in values]),) + tuple(_merged_part(values, part) for part in (1, 2))

    def save_range(self, value, output_dir, ind_range, cfg_yaml):
        """detection_range_S_E.pkl, as Detectron's child processes write it."""
        path = os.path.join(output_dir, 'detection_range_{}_{}.pkl'.format(*ind_range))
        save_object(_detections_pkl(value, cfg_yaml), path)
        logger.info('Wrote detections of range %s to %s', ind_range, path)

    def evaluate(self, dataset, value, output_dir, cfg_yaml):
        """Write detections.pkl and evaluate it: {dataset name: {'box': ..., 'mask': ..., 'keypoint': ...}}."""
        all_boxes, all_segms, all_keyps = value
        path = os.path.join(output_dir, 'detections.pkl')
        save_object(_detections_pkl(value, cfg_yaml), path)
        logger.info('Wrote detections to: %s', os.path.abspath(path))
        return task_evaluation.evaluate_all(dataset, all_boxes, output_dir, competition_mode=self.competition_mode,
                                            results_format=self.results_format, all_segms=all_segms,
                                            all_keyps=all_keyps)


def _detections_pkl(value, cfg_yaml):
    all_boxes, all_segms, all_keyps = value
    return {'all_boxes': all_boxes, 'all_segms': all_segms or [], 'all_keyps': all_keyps or [], 'cfg': cfg_yaml}


def _merged_part(values, part):
    """The merged all_segms (part 1) or all_keyps (part 2) of the slices, None when no slice has them. A slice
    of no images has none: it contributes no images either way."""
    if all(value[part] is None for value in values):
        return None
    return merge_ranges([value[part] if value[part] is not None else value[0] for value in values])


def merge_ranges(per_range):
    """Concatenate all_boxes[cls][img] (or all_segms / all_keyps [cls][img]) lists of consecutive ranges, in
    range order."""
    num_classes = len(per_range[0])
    return [[dets for part in per_range for dets in part[j]] for j in range(num_classes)]


class _Detections:
    """all_boxes[j][i] of the tested images, and all_segms[j][i] / all_keyps[j][i] once the detector returns
    masks / keypoints."""

    def __init__(self, num_classes, num_images):
        self.num_classes, self.num_images = num_classes, num_images
        self.all_boxes = self._empty()
        self.all_segms = None
        self.all_keyps = None

    def _empty(self):
        return [[[] for _ in range(self.num_images)] for _ in range(self.num_classes)]

    def add(self, i, result):
        """Store image i's result; returns (cls_boxes, cls_segms or None, cls_keyps or None) to draw."""
        cls_boxes, cls_segms, cls_keyps = detection_parts(result)
        for j in range(1, self.num_classes):
            self.all_boxes[j][i] = cls_boxes[j]
        if cls_segms is not None:
            self.all_segms = self.all_segms or self._empty()
            for j in range(1, self.num_classes):
                self.all_segms[j][i] = cls_segms[j]
        if cls_keyps is not None:
            self.all_keyps = self.all_keyps or self._empty()
            for j in range(1, self.num_classes):
                self.all_keyps[j][i] = cls_keyps[j]
        return cls_boxes, cls_segms, cls_keyps

    @property
    def value(self):
        return self.all_boxes, self.all_segms, self.all_keyps


class ProposalResults:
    """An RPN-only model's proposals (detector results (boxes (R, 4), scores (R,))) as Detectron's
    rpn_generator keeps them: {'boxes', 'scores', 'ids'} lists in image order, written to
    rpn_proposals.pkl and evaluated by proposal recall (task 'box_proposal')."""

    def __init__(self, class_specific_ar=False):
        self.class_specific_ar = class_specific_ar

    def store(self, num_classes, entries):
        return _Proposals([entry['id'] for entry in entries])

    def merge(self, values):
        return {key: [item for value in values for item in value[key]] for key in ('boxes', 'scores', 'ids')}

    def save_range(self, value, output_dir, ind_range, cfg_yaml):
        path = os.path.join(output_dir, 'rpn_proposals_range_{}_{}.pkl'.format(*ind_range))
        proposal_files.save_proposals(path, value['boxes'], value['scores'], value['ids'], cfg_yaml)

    def evaluate(self, dataset, value, output_dir, cfg_yaml):
        """Detectron's evaluate_proposal_file: rpn_proposals.pkl written, read back into the gt roidb as a
        proposal file is read, its recall logged and written to rpn_proposal_recall.pkl."""
        path = os.path.join(output_dir, 'rpn_proposals.pkl')
        proposal_files.save_proposals(path, value['boxes'], value['scores'], value['ids'], cfg_yaml)
        roidb = dataset.get_roidb(gt=True, proposals=proposal_files.load_proposals(path, output_dir))
        results = task_evaluation.evaluate_box_proposals(dataset, roidb, class_specific=self.class_specific_ar)
        task_evaluation.log_box_proposal_results(results)
        save_object(results, os.path.join(output_dir, 'rpn_proposal_recall.pkl'))
        return results


class _Proposals:
    def __init__(self, ids):
        self.value = {'boxes': [None] * len(ids), 'scores': [None] * len(ids), 'ids': ids}

    def add(self, i, result):
        """Store image i's (boxes, scores); returns None: nothing to draw."""
        self.value['boxes'][i], self.value['scores'][i] = result
        return None
