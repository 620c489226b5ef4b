"""Mask evaluation (evaluate_all with all_segms) against pycocotools' segm COCOeval run here on a
results list built by hand from the same RLEs."""
import json
import os

import numpy as np
import pycocotools.mask as mask_util
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.datasets import task_evaluation
from detectron.datasets.json_dataset import JsonDataset
from detectron.utils.io import load_object

CATEGORY_IDS = (4, 2)  # non-contiguous json ids -> contiguous 1, 2
METRICS = ['AP', 'AP50', 'AP75', 'APs', 'APm', 'APl', 'AP60', 'AP70', 'AP80', 'AP85', 'AP90', 'AP95']


def _polygon(rng, width, height):
    """A random convex-ish polygon (an irregular octagon) inside the image."""
    cx, cy = rng.uniform(20, width - 20), rng.uniform(20, height - 20)
    radii = rng.uniform(5, 18, 8)
    angles = np.linspace(0, 2 * np.pi, 8, endpoint=False)
    return np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1).ravel().tolist()


def _coco_with_polygons(rng):
    images, annotations = [], []
    for image_id in (11, 12, 13, 14):
        width, height = (int(v) for v in rng.randint(80, 140, size=2))
        images.append({'id': image_id, 'file_name': f'{image_id}.jpg', 'width': width, 'height': height})
        for _ in range(rng.randint(1, 4)):
            poly = _polygon(rng, width, height)
            rle = mask_util.merge(mask_util.frPyObjects([poly], height, width))
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id,
                                'category_id': int(rng.choice(CATEGORY_IDS)), 'segmentation': [poly],
                                'area': float(mask_util.area(rle)), 'bbox': mask_util.toBbox(rle).tolist(),
                                'iscrowd': 0})
    return {'images': images, 'annotations': annotations,
            'categories': [{'id': i, 'name': f'c{i}'} for i in CATEGORY_IDS]}


def _detections(coco, rng):
    """all_boxes / all_segms[contiguous class][image]: each gt mask shifted by a few pixels (some
    dropped), plus a false positive per image and class; random scores."""
    all_boxes = [[]] + [[[] for _ in coco['images']] for _ in CATEGORY_IDS]
    all_segms = [[]] + [[[] for _ in coco['images']] for _ in CATEGORY_IDS]
    for i, image in enumerate(coco['images']):
        h, w = image['height'], image['width']
        for c, category_id in enumerate(CATEGORY_IDS, start=1):
            masks = []
            for a in coco['annotations']:
                if a['image_id'] == image['id'] and a['category_id'] == category_id and rng.uniform() > 0.2:
                    mask = mask_util.decode(mask_util.frPyObjects(a['segmentation'], h, w))[:, :, 0]
                    masks.append(np.roll(mask, tuple(rng.randint(-3, 4, size=2)), axis=(0, 1)))
            false_positive = np.zeros((h, w), np.uint8)
            false_positive[5:25, 5:30] = 1
            masks.append(false_positive)
            rles = [mask_util.encode(np.asfortranarray(m)) for m in masks]
            boxes = np.array([[x, y, x + bw - 1, y + bh - 1] for x, y, bw, bh in mask_util.toBbox(rles)])
            all_boxes[c][i] = np.hstack([boxes, rng.uniform(0.1, 1, (len(rles), 1))]).astype(np.float32)
            all_segms[c][i] = rles
    return all_boxes, all_segms


def _direct_segm_eval(coco_gt, all_boxes, all_segms, image_ids):
    results = [{'image_id': image_id, 'category_id': CATEGORY_IDS[c - 1], 'score': float(dets[k, 4]),
                'segmentation': {'size': rles[k]['size'], 'counts': rles[k]['counts'].decode('ascii')}}
               for c in (1, 2) for image_id, dets, rles in zip(image_ids, all_boxes[c], all_segms[c])
               for k in range(len(rles))]
    evaluation = COCOeval(coco_gt, coco_gt.loadRes(results), 'segm')
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    precision = evaluation.eval['precision'][:, :, :, 0, 2]
    single = [precision[int(round((iou - 0.5) / 0.05))] for iou in (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    values = list(evaluation.stats[:6]) + [p[p > -1].mean() for p in single]
    return dict(zip(METRICS, map(float, values)))


def test_mask_ap_equals_pycocotools_segm_evaluation(register_coco, tmp_path):
    rng = np.random.RandomState(3)
    coco = _coco_with_polygons(rng)
    root = register_coco('polys_val', coco)
    all_boxes, all_segms = _detections(coco, rng)
    output_dir = tmp_path / 'out'
    output_dir.mkdir()
    results = task_evaluation.evaluate_all(JsonDataset('polys_val'), all_boxes, str(output_dir),
                                           competition_mode=True, all_segms=all_segms)
    assert list(results['polys_val']) == ['box', 'mask']
    mask = results['polys_val']['mask']
    expected = _direct_segm_eval(COCO(str(root / 'annotations.json')), all_boxes, all_segms, [11, 12, 13, 14])
    assert mask == pytest.approx(expected, abs=1e-12)
    assert 0.2 < mask['AP'] < 0.95 and mask['AP50'] > mask['AP90']
    # The masks are evaluated, not the boxes: box and mask AP differ.
    assert results['polys_val']['box']['AP'] != pytest.approx(mask['AP'], abs=1e-3)
    # Detectron's results json: RLE counts as str, one entry per mask with its box's score.
    with open(output_dir / 'segmentations_polys_val_results.json') as f:
        written = json.load(f)
    assert len(written) == sum(len(r) for per_class in all_segms[1:] for r in per_class)
    assert all(isinstance(r['segmentation']['counts'], str) for r in written)
    assert written[0]['score'] == pytest.approx(float(all_boxes[1][0][0, 4]))
    assert load_object(os.path.join(output_dir, 'segmentation_results.pkl')).params.iouType == 'segm'


def test_without_segms_only_boxes_are_evaluated(register_coco, tmp_path):
    rng = np.random.RandomState(4)
    coco = _coco_with_polygons(rng)
    register_coco('polys_val', coco)
    all_boxes, _ = _detections(coco, rng)
    results = task_evaluation.evaluate_all(JsonDataset('polys_val'), all_boxes, str(tmp_path), all_segms=None)
    assert list(results['polys_val']) == ['box']
    assert not os.path.exists(tmp_path / 'segmentation_results.pkl')
