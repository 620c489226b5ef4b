"""Keypoint evaluation (evaluate_all with all_keyps) against pycocotools' keypoints COCOeval run here on a
results list built by hand; the roidb's keypoint fields as Detectron's json_dataset.py."""
import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.datasets import task_evaluation
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.json_dataset_evaluator import ResultsFormat
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.utils.keypoints import COCO_OKS_SIGMAS, get_keypoints

NAMES = get_keypoints()[0]


def _coco_with_people(rng):
    images, annotations = [], []
    for image_id in (3, 5, 8):
        images.append({'id': image_id, 'file_name': f'{image_id}.jpg', 'width': 200, 'height': 160})
        for _ in range(2):
            x, y = rng.uniform(10, 120), rng.uniform(10, 80)
            w, h = rng.uniform(40, 70), rng.uniform(50, 70)
            kps = np.stack([rng.randint(int(x), int(x + w), 17), rng.randint(int(y), int(y + h), 17),
                            rng.choice([0, 1, 2], 17, p=[0.2, 0.2, 0.6])], 1)
            kps[kps[:, 2] == 0, :2] = 0
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id, 'category_id': 1,
                                'bbox': [x, y, w, h], 'area': w * h, 'iscrowd': 0,
                                'keypoints': kps.ravel().tolist(), 'num_keypoints': int((kps[:, 2] > 0).sum())})
    return {'images': images, 'annotations': annotations,
            'categories': [{'id': 1, 'name': 'person', 'keypoints': NAMES, 'skeleton': []}]}


def _detections(coco, rng):
    """all_boxes / all_keyps[1][image]: every gt person with its keypoints moved by a few pixels, plus a
    false positive per image; (x, y, logit, prob) rows."""
    all_boxes, all_keyps = [[], []], [[], []]
    for image in coco['images']:
        boxes, keyps = [], []
        for ann in [a for a in coco['annotations'] if a['image_id'] == image['id']] + [None]:
            if ann is None:
                kps, (x, y, w, h) = rng.uniform(0, 150, (2, 17)), (0, 0, 30, 30)
            else:
                kps = np.asarray(ann['keypoints'], np.float64).reshape(17, 3)[:, :2].T + rng.normal(0, 2, (2, 17))
                x, y, w, h = ann['bbox']
            boxes.append([x, y, x + w - 1, y + h - 1, rng.uniform(0.1, 1)])
            keyps.append(np.concatenate([kps, rng.uniform(0, 5, (1, 17)), rng.uniform(0, 1, (1, 17))]).astype(
                np.float32))
        all_boxes[1].append(np.array(boxes, np.float32))
        all_keyps[1].append(keyps)
    return all_boxes, all_keyps


def _direct_keypoint_eval(ann_file, all_boxes, all_keyps, score):
    coco_gt = COCO(ann_file)
    results = [{'image_id': image_id, 'category_id': 1, 'score': score(det, kps),
                'keypoints': np.stack([kps[0], kps[1], np.ones(17)], 1).ravel().tolist()}
               for image_id, dets, keyps in zip([3, 5, 8], all_boxes[1], all_keyps[1])
               for det, kps in zip(dets, keyps)]
    evaluation = COCOeval(coco_gt, coco_gt.loadRes(results), 'keypoints')
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return dict(zip(['AP', 'AP50', 'AP75', 'APm', 'APl'], map(float, evaluation.stats[:5])))


@pytest.mark.parametrize('confidence, score', [
    ('bbox', lambda det, kps: float(det[4])),
    ('prob', lambda det, kps: float(np.mean(kps[3], dtype=np.float64))),
])
def test_keypoint_ap_equals_pycocotools_keypoint_evaluation(register_coco, tmp_path, confidence, score):
    rng = np.random.RandomState(5)
    coco = _coco_with_people(rng)
    root = register_coco('people_val', coco)
    all_boxes, all_keyps = _detections(coco, rng)
    results = task_evaluation.evaluate_all(JsonDataset('people_val'), all_boxes, str(tmp_path), all_keyps=all_keyps,
                                           results_format=ResultsFormat(keypoint_confidence=confidence))
    assert list(results['people_val']) == ['box', 'keypoint']
    expected = _direct_keypoint_eval(str(root / 'annotations.json'), all_boxes, all_keyps, score)
    assert results['people_val']['keypoint'] == pytest.approx(expected, abs=1e-12)
    assert 0.2 < expected['AP'] < 1.0
    with open(tmp_path / 'keypoints_people_val_results.json') as f:
        assert len(json.load(f)) == 9


def test_roidb_holds_detectrons_keypoint_fields_and_flips_them(register_coco):
    rng = np.random.RandomState(1)
    coco = _coco_with_people(rng)
    coco['annotations'][0]['keypoints'][0] = 17.8  # Detectron's int32 array truncates
    register_coco('people_train', coco)
    dataset = JsonDataset('people_train')
    assert dataset.keypoints == NAMES and dataset.num_keypoints == 17
    assert dataset.keypoint_oks_sigmas == COCO_OKS_SIGMAS
    roidb = combined_roidb_for_training('people_train', use_flipped=True, num_keypoints=17)
    first, flipped = roidb[0], roidb[len(roidb) // 2]
    assert first['gt_keypoints'].shape == (2, 3, 17) and first['gt_keypoints'].dtype == np.int32
    assert first['gt_keypoints'][0, 0, 0] == 17 and first['has_visible_keypoints']
    expected = np.asarray(coco['annotations'][1]['keypoints']).reshape(17, 3).T
    np.testing.assert_array_equal(first['gt_keypoints'][1], expected.astype(np.int32))
    # The flipped copy: left_eye takes the mirrored right_eye.
    left, right = NAMES.index('left_eye'), NAMES.index('right_eye')
    source = first['gt_keypoints'][1]
    if source[2, right] > 0:
        assert flipped['gt_keypoints'][1, 0, left] == 200 - source[0, right] - 1
    assert flipped['flipped'] and flipped['gt_keypoints'][1, 2, left] == source[2, right]


def test_a_dataset_without_the_models_keypoints_is_one_error(register_coco):
    from detectron.utils.errors import DatasetError
    coco = _coco_with_people(np.random.RandomState(2))
    register_coco('people_17', coco)
    with pytest.raises(DatasetError, match='dataset people_17 has 17 keypoints per object but the model predicts 5'):
        combined_roidb_for_training('people_17', num_keypoints=5)
