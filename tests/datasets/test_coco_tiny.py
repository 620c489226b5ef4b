"""Loader and evaluator on real COCO annotations: ../shared/data/coco_tiny, 80 images a split."""

import json
import os

import numpy as np
import pytest

from detectron.datasets import dataset_catalog, json_dataset_evaluator
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.roidb import combined_roidb_for_training

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COCO_TINY = os.path.normpath(os.path.join(REPO_ROOT, '..', 'shared', 'data', 'coco_tiny'))

pytestmark = pytest.mark.skipif(not os.path.isdir(COCO_TINY),
                                reason='coco_tiny not found at {}'.format(COCO_TINY))


def _split(split):
    return (os.path.join(COCO_TINY, split),
            os.path.join(COCO_TINY, 'annotations', 'instances_{}.json'.format(split)))


@pytest.fixture
def coco_tiny(monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    for split in ('train2017', 'val2017'):
        dataset_catalog.register_dataset('coco_tiny_' + split, *_split(split))


def _raw(split):
    with open(_split(split)[1]) as f:
        return json.load(f)


def _expected_gt(raw, image, contiguous):
    """Detectron's gt rules transcribed one annotation at a time, in Python floats."""
    boxes, classes, crowd = [], [], []
    for a in raw['annotations']:
        if a['image_id'] != image['id'] or a.get('ignore', 0) == 1:
            continue
        x, y, w, h = a['bbox']
        x1, y1 = x, y
        x2, y2 = x + max(0.0, w - 1.0), y + max(0.0, h - 1.0)
        x1, x2 = min(max(x1, 0.0), image['width'] - 1.0), min(max(x2, 0.0), image['width'] - 1.0)
        y1, y2 = min(max(y1, 0.0), image['height'] - 1.0), min(max(y2, 0.0), image['height'] - 1.0)
        if a['area'] > 0 and x2 > x1 and y2 > y1:
            boxes.append([x1, y1, x2, y2])
            classes.append(contiguous[a['category_id']])
            crowd.append(bool(a['iscrowd']))
    return np.array(boxes, np.float32).reshape(-1, 4), classes, crowd


def test_classes_follow_coco_category_ids(coco_tiny):
    ds = JsonDataset('coco_tiny_val2017')
    raw = _raw('val2017')
    assert ds.num_classes == 81
    assert ds.classes[:3] == ['__background__', 'person', 'bicycle']
    assert ds.classes[-1] == 'toothbrush'
    assert ds.json_category_id_to_contiguous_id[1] == 1
    assert ds.json_category_id_to_contiguous_id[13] == 12  # COCO id 12 does not exist
    assert ds.contiguous_category_id_to_json_id[80] == 90
    assert ds.get_image_ids() == sorted(im['id'] for im in raw['images'])


@pytest.mark.parametrize('split', ['train2017', 'val2017'])
def test_roidb_matches_a_transcription_of_detectron_rules(coco_tiny, split):
    ds = JsonDataset('coco_tiny_' + split)
    raw = _raw(split)
    images = {im['id']: im for im in raw['images']}
    roidb = ds.get_roidb(gt=True)
    assert len(roidb) == 80
    assert sum(len(e['boxes']) for e in roidb) > 600
    for entry in roidb:
        image = images[entry['id']]
        boxes, classes, crowd = _expected_gt(raw, image, ds.json_category_id_to_contiguous_id)
        assert entry['image'] == os.path.join(COCO_TINY, split, image['file_name'])
        np.testing.assert_array_equal(entry['boxes'], boxes)
        np.testing.assert_array_equal(entry['gt_classes'], classes)
        np.testing.assert_array_equal(entry['is_crowd'], crowd)


def test_training_roidb_appends_flipped_copies(coco_tiny):
    raw = _raw('train2017')
    with_gt = {a['image_id'] for a in raw['annotations'] if not a['iscrowd']}
    roidb = combined_roidb_for_training('coco_tiny_train2017')
    assert len(roidb) == 2 * len(with_gt)
    originals = [e for e in roidb if not e['flipped']]
    flipped = [e for e in roidb if e['flipped']]
    assert [e['id'] for e in originals] == [e['id'] for e in flipped] == sorted(with_gt)
    for entry, mirror in zip(originals, flipped):
        width = entry['width']
        np.testing.assert_array_equal(mirror['boxes'][:, 0], width - entry['boxes'][:, 2] - 1)
        np.testing.assert_array_equal(mirror['boxes'][:, 2], width - entry['boxes'][:, 0] - 1)
        np.testing.assert_array_equal(mirror['boxes'][:, 1::2], entry['boxes'][:, 1::2])


def test_ground_truth_detections_score_ap_one(coco_tiny, tmp_path):
    ds = JsonDataset('coco_tiny_val2017')
    raw = _raw('val2017')
    image_index = {image_id: i for i, image_id in enumerate(ds.get_image_ids())}
    rows = {}
    for a in raw['annotations']:
        if not a['iscrowd']:
            x, y, w, h = a['bbox']
            category = ds.json_category_id_to_contiguous_id[a['category_id']]
            detection = [x, y, x + w - 1, y + h - 1, 1.0]
            rows.setdefault((category, image_index[a['image_id']]), []).append(detection)
    all_boxes = [[np.array(rows.get((c, i), np.zeros((0, 5))), np.float32)
                  for i in range(len(image_index))] for c in range(ds.num_classes)]
    coco_eval = json_dataset_evaluator.evaluate_boxes(ds, all_boxes, str(tmp_path))
    np.testing.assert_allclose(coco_eval.stats[:6], 1.0)
    assert json_dataset_evaluator.ap_at_iou(coco_eval, 0.95) == pytest.approx(1.0)
