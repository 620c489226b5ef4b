"""evaluate_boxes against pycocotools called directly on a results list built here by hand."""

import json
import logging
import os

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.datasets import json_dataset_evaluator
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling.centernet_builder import CENTERNET_RESULTS
from detectron.utils.io import load_object

CATEGORY_IDS = (1, 5, 9)  # non-contiguous json ids -> contiguous 1, 2, 3


def _random_coco(seed=0, num_images=8):
    rng = np.random.RandomState(seed)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        width, height = rng.randint(150, 300, size=2)
        images.append({'id': image_id, 'file_name': '{}.jpg'.format(image_id),
                       'width': int(width), 'height': int(height)})
        for _ in range(rng.randint(0, 6)):  # some images have no object
            w, h = rng.uniform(8, 120, size=2)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id,
                                'category_id': int(rng.choice(CATEGORY_IDS)),
                                'bbox': [x, y, w, h], 'area': w * h, 'iscrowd': 0})
    annotations[3]['iscrowd'] = 1
    return {'images': images, 'annotations': annotations,
            'categories': [{'id': i, 'name': 'c{}'.format(i)} for i in CATEGORY_IDS]}


def _all_boxes_from(coco, rng=None):
    """all_boxes[contiguous class][image index]: the non-crowd gt as (x1, y1, x2, y2, score),
    x2 = x + w - 1; with rng, boxes jittered, random scores, some dropped, false positives added."""
    all_boxes = [[]] + [[[] for _ in coco['images']] for _ in CATEGORY_IDS]
    for i, image in enumerate(coco['images']):
        for c, category_id in enumerate(CATEGORY_IDS, start=1):
            rows = [[x, y, x + w - 1, y + h - 1, 1.0] for a in coco['annotations']
                    if a['image_id'] == image['id'] and a['category_id'] == category_id
                    and not a['iscrowd'] for x, y, w, h in [a['bbox']]]
            if rng is not None:
                rows = [r for r in rows if rng.uniform() > 0.2]
                false_positives = [[*rng.uniform(0, 60, 2), *rng.uniform(80, 140, 2), 0]
                                   for _ in range(2)]
                rows += false_positives
                rows = [[*(np.array(r[:4]) + rng.normal(0, 4, 4)), rng.uniform()] for r in rows]
            if rows:
                all_boxes[c][i] = np.array(rows, np.float32)
    return all_boxes


def _direct_cocoeval(coco_gt, all_boxes, image_ids):
    """pycocotools on a results list written here: loops, json ids, w = x2 - x1 + 1."""
    results = []
    for c, category_id in enumerate(CATEGORY_IDS, start=1):
        for image_id, dets in zip(image_ids, all_boxes[c]):
            for x1, y1, x2, y2, score in np.asarray(dets, np.float64).reshape(-1, 5):
                results.append({'image_id': image_id, 'category_id': category_id,
                                'bbox': [x1, y1, x2 - x1 + 1, y2 - y1 + 1], 'score': score})
    coco_eval = COCOeval(coco_gt, coco_gt.loadRes(results), 'bbox')
    coco_eval.evaluate()
    coco_eval.accumulate()
    coco_eval.summarize()
    return coco_eval


def _ap_at(coco_eval, iou):
    """Mean valid precision at one IoU threshold, area 'all' (index 0), 100 dets (index 2)."""
    t = int(np.argmin(np.abs(coco_eval.params.iouThrs - iou)))
    assert abs(coco_eval.params.iouThrs[t] - iou) < 1e-9
    precision = coco_eval.eval['precision'][t, :, :, 0, 2]
    valid = precision[precision > -1]
    return valid.mean() if valid.size else -1


@pytest.fixture
def dataset(register_coco):
    coco = _random_coco()
    root = register_coco('random', coco)
    return JsonDataset('random'), coco, str(root / 'annotations.json')


def test_ground_truth_as_detections_scores_ap_one(dataset, tmp_path):
    json_dataset, coco, _ = dataset
    coco_eval = json_dataset_evaluator.evaluate_boxes(
        json_dataset, _all_boxes_from(coco), str(tmp_path), use_salt=False)
    np.testing.assert_allclose(coco_eval.stats[:6][coco_eval.stats[:6] > -1], 1.0)
    for iou in json_dataset_evaluator.EXTRA_AP_IOUS:
        assert json_dataset_evaluator.ap_at_iou(coco_eval, iou) == pytest.approx(1.0)


def test_results_json_uses_json_ids_and_plus_one_widths(dataset, tmp_path):
    json_dataset, coco, _ = dataset
    json_dataset_evaluator.evaluate_boxes(
        json_dataset, _all_boxes_from(coco), str(tmp_path), use_salt=False)
    with open(tmp_path / 'bbox_random_results.json') as f:
        results = json.load(f)
    # Order: class, then image id, then the rows of all_boxes (annotation order here).
    expected = [(a['image_id'], category_id, a['bbox'])
                for category_id in CATEGORY_IDS for image in coco['images']
                for a in coco['annotations'] if a['image_id'] == image['id']
                and a['category_id'] == category_id and not a['iscrowd']]
    assert [(r['image_id'], r['category_id']) for r in results] == [e[:2] for e in expected]
    # float32 storage of x1 and x2 = x + w - 1 costs a few 1e-5 pixels
    np.testing.assert_allclose([r['bbox'] for r in results], [e[2] for e in expected], atol=1e-4)
    assert all(r['score'] == 1.0 for r in results)


def test_perturbed_detections_match_pycocotools_directly(dataset, tmp_path):
    json_dataset, coco, ann_file = dataset
    all_boxes = _all_boxes_from(coco, np.random.RandomState(1))
    coco_eval = json_dataset_evaluator.evaluate_boxes(
        json_dataset, all_boxes, str(tmp_path), use_salt=False)
    direct = _direct_cocoeval(COCO(ann_file), all_boxes,
                              sorted(im['id'] for im in coco['images']))
    np.testing.assert_allclose(coco_eval.stats, direct.stats, rtol=0, atol=1e-12)
    assert 0.1 < direct.stats[0] < 0.9  # the perturbation leaves a non-trivial AP
    aps = [json_dataset_evaluator.ap_at_iou(coco_eval, iou)
           for iou in json_dataset_evaluator.EXTRA_AP_IOUS]
    np.testing.assert_allclose(aps, [_ap_at(direct, iou) for iou in (.6, .7, .8, .85, .9, .95)],
                               rtol=0, atol=1e-12)
    assert aps == sorted(aps, reverse=True) and aps[0] > aps[-1]
    saved = load_object(str(tmp_path / 'detection_results.pkl'))
    np.testing.assert_array_equal(saved.stats, coco_eval.stats)


def test_log_lines(dataset, tmp_path, caplog):
    json_dataset, coco, _ = dataset
    with caplog.at_level(logging.INFO, logger='detectron.datasets.json_dataset_evaluator'):
        coco_eval = json_dataset_evaluator.evaluate_boxes(
            json_dataset, _all_boxes_from(coco, np.random.RandomState(1)), str(tmp_path))
    lines = caplog.messages
    start = lines.index('~~~~ Mean and per-category AP @ IoU=[0.50,0.95] ~~~~')
    per_category = coco_eval.eval['precision'][:, :, :, 0, 2]
    expected_class_aps = []
    for k, category_id in enumerate(CATEGORY_IDS):
        precision = per_category[:, :, k]
        expected_class_aps.append('c{}: {:.1f}'.format(category_id, 100 * precision[precision > -1].mean()))
    assert lines[start + 1] == '{:.1f}'.format(100 * coco_eval.stats[0])
    assert lines[start + 2:start + 5] == expected_class_aps
    assert lines[start + 5] == '~~~~ Summary metrics ~~~~'
    summary = lines[start + 6:start + 18]
    assert summary[0] == ' Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]' \
        ' = {:.3f}'.format(coco_eval.stats[0])
    assert summary[11].startswith(' Average Recall     (AR) @[ IoU=0.50:0.95 | area= large |')
    extra = lines[start + 18:start + 24]
    assert extra[0] == ' Average Precision  (AP) @[ IoU=0.60      | area=   all | maxDets=100 ]' \
        ' = {:.3f}'.format(_ap_at(coco_eval, 0.6))
    assert [line[:41] for line in extra] == [
        ' Average Precision  (AP) @[ IoU={:<9}'.format(t)
        for t in ('0.60', '0.70', '0.80', '0.85', '0.90', '0.95')]
    results_files = [f for f in os.listdir(tmp_path) if f.startswith('bbox_random_results_')]
    assert len(results_files) == 1  # salted name, kept without cleanup


def test_wrong_number_of_images_is_rejected(dataset, tmp_path):
    json_dataset, coco, _ = dataset
    all_boxes = _all_boxes_from(coco)
    all_boxes[2] = all_boxes[2][:-1]
    with pytest.raises(ValueError, match=r'all_boxes\[2\] has 7 images but dataset random has 8'):
        json_dataset_evaluator.evaluate_boxes(json_dataset, all_boxes, str(tmp_path))


def test_a_category_absent_from_the_split_is_named_and_said_absent(register_coco, tmp_path, caplog):
    coco = _random_coco()
    coco['annotations'] = [a for a in coco['annotations'] if a['category_id'] != 5]
    register_coco('without_c5', coco)
    json_dataset = JsonDataset('without_c5')
    with caplog.at_level(logging.INFO, logger='detectron.datasets.json_dataset_evaluator'):
        json_dataset_evaluator.evaluate_boxes(json_dataset, _all_boxes_from(coco), str(tmp_path))
    start = caplog.messages.index('~~~~ Mean and per-category AP @ IoU=[0.50,0.95] ~~~~')
    # The ground truth as detections: AP 100 for the two classes that have boxes.
    assert caplog.messages[start + 2:start + 5] == [
        'c1: 100.0', 'c5: absent (no ground-truth box of this class in the dataset)', 'c9: 100.0']


def _one_centernet_result(dataset, tmp_path, class_index, row):
    """The results json entry CenterNet's format writes for one float32 detection row in image 0."""
    json_dataset, coco, _ = dataset
    all_boxes = [[]] + [[[] for _ in coco['images']] for _ in CATEGORY_IDS]
    all_boxes[class_index][0] = np.array([row], np.float32)
    json_dataset_evaluator.evaluate_boxes(json_dataset, all_boxes, str(tmp_path), use_salt=False,
                                          results_format=CENTERNET_RESULTS)
    with open(tmp_path / 'bbox_random_results.json') as f:
        (result,) = json.load(f)
    return result


def test_centernet_results_have_continuous_widths_and_two_decimals(dataset, tmp_path):
    result = _one_centernet_result(dataset, tmp_path, 2, [10.004, 20.0, 30.507, 40.2561, 0.87654])
    # CenterNet's convert_eval_format: w = 30.507 - 10.004 = 20.503, h = 20.2561, then '{:.2f}'.
    assert result == {'image_id': dataset[1]['images'][0]['id'], 'category_id': CATEGORY_IDS[1],
                      'bbox': [10.0, 20.0, 20.5, 20.26], 'score': 0.88}


def test_centernet_widths_are_float32_differences_as_in_its_convert_eval_format(dataset, tmp_path):
    # bbox[3] -= bbox[1] on CenterNet's float32 row: 618.79675 - 228.12175 = 390.67498779... -> 390.67,
    # where the float64 difference 390.67500305... would round to 390.68.
    result = _one_centernet_result(dataset, tmp_path, 1, [5.0, 228.12175, 9.0, 618.79675, 0.5])
    assert result['bbox'] == [5.0, 228.12, 4.0, 390.67]
