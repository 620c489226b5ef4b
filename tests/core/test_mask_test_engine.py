"""Testing a Mask R-CNN on the tiny datasets (CPU): tools/test_net.py printing box and mask AP (checked
with an independent pycocotools evaluation), all_segms beside all_boxes in detections.pkl and in
--range slices, 2 gloo processes equal to one."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pycocotools.mask as mask_util
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.modeling import model_builder
from support.coco_eval import METRICS, coco_metrics
from support.tiny_runs import MASK_OVERRIDES, REPO, SHAPES_CFG, TINY_OVERRIDES, save_random_mask_model, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

def _use_mask_config(catalog, output_dir, *overrides):
    use_tiny_config(catalog, output_dir, *MASK_OVERRIDES, *overrides)


@pytest.fixture
def mask_weights(tiny_catalog):
    """A randomly initialised tiny Mask R-CNN, its mask head drawn large enough for masks to show."""
    path = tiny_catalog.parent / 'random_mask_init.pth'
    if not path.exists():
        _use_mask_config(tiny_catalog, tiny_catalog.parent / 'unused')
        save_random_mask_model(path)
    return str(path)


def _detections(output_dir, name='detections.pkl'):
    with open(os.path.join(str(output_dir), 'test', 'tiny_val', 'generalized_rcnn', name), 'rb') as f:
        return pickle.load(f)


def mask_metrics(ann_file, all_boxes, all_segms):
    """The 12 mask metrics, evaluated here from scratch with pycocotools' segm COCOeval."""
    coco = COCO(ann_file)
    json_ids = [c['id'] for c in coco.dataset['categories']]
    image_ids = sorted(coco.getImgIds())
    results = [{'image_id': image_id, 'category_id': json_ids[j - 1], 'score': float(dets[k, 4]),
                'segmentation': {'size': rles[k]['size'], 'counts': rles[k]['counts'].decode('ascii')}}
               for j in range(1, len(all_boxes)) for image_id, dets, rles in zip(image_ids, all_boxes[j], all_segms[j])
               for k in range(len(rles))]
    evaluation = COCOeval(coco, coco.loadRes(results), 'segm')
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    precision = evaluation.eval['precision'][:, :, :, 0, 2]
    single = [precision[int(round((iou - 0.5) / 0.05))] for iou in (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    values = list(evaluation.stats[:6]) + [p[p > -1].mean() if (p > -1).any() else -1.0 for p in single]
    return dict(zip(METRICS, map(float, values)))


def _assert_segms_match_boxes(all_boxes, all_segms, image_sizes):
    assert len(all_segms) == len(all_boxes)
    for per_class_boxes, per_class_segms in zip(all_boxes[1:], all_segms[1:]):
        assert len(per_class_segms) == len(per_class_boxes)
        for dets, rles, size in zip(per_class_boxes, per_class_segms, image_sizes):
            assert len(rles) == len(dets)
            assert all(rle['size'] == list(size) for rle in rles)


@pytest.mark.slow
@pytest.mark.processes
def test_test_net_prints_box_and_mask_ap_and_two_gloo_processes_give_its_masks(tiny_catalog, mask_weights,
                                                                              one_thread_per_process):
    # tools/test_net.py in one process (OMP_NUM_THREADS 1, as the gloo workers below).
    single_dir = tiny_catalog.parent / 'mask_command_line'
    overrides = TINY_OVERRIDES + MASK_OVERRIDES + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(single_dir)]
    result = subprocess.run([sys.executable, 'tools/test_net.py', '--cfg', SHAPES_CFG, 'TEST.WEIGHTS', mask_weights]
                            + overrides, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert 'Evaluating bounding boxes is done!' in out and 'Evaluating segmentations is done!' in out
    # Per-class AP of both tasks: the class names appear twice after the mean AP header.
    assert out.count('Mean and per-category AP') == 2 and out.count('red: ') == 2
    content = _detections(single_dir)
    all_boxes, all_segms = content['all_boxes'], content['all_segms']
    coco = COCO(str(tiny_catalog.parent / 'all.json'))
    sizes = [(coco.imgs[i]['height'], coco.imgs[i]['width']) for i in sorted(coco.getImgIds())]
    _assert_segms_match_boxes(all_boxes, all_segms, sizes)
    assert sum(mask_util.area(rle) for per_class in all_segms[1:] for rles in per_class for rle in rles) > 0
    ann_file = str(tiny_catalog.parent / 'all.json')
    box_expected, mask_expected = coco_metrics(ann_file, all_boxes), mask_metrics(ann_file, all_boxes, all_segms)
    copypaste = [line.split('copypaste: ', 1)[1] for line in out.splitlines() if 'copypaste: ' in line]
    assert copypaste == ['Dataset: tiny_val', 'Task: box', ','.join(METRICS),
                         ','.join(f'{box_expected[name]:.4f}' for name in METRICS),
                         'Task: mask', ','.join(METRICS), ','.join(f'{mask_expected[name]:.4f}' for name in METRICS)]

    # Two gloo processes, each testing its own range, merge to the same boxes and masks.
    multi_dir = tiny_catalog.parent / 'mask_multi'
    _use_mask_config(tiny_catalog, multi_dir, 'NUM_GPUS', '2')
    multi = test_engine.run_inference(model_builder.build_model_type(cfg), mask_weights, multi_gpu_testing=True)
    merged = _detections(multi_dir)
    assert merged['all_segms'] == all_segms
    assert all(np.array_equal(a, b) for per_a, per_b in zip(merged['all_boxes'][1:], all_boxes[1:])
               for a, b in zip(per_a, per_b))
    assert list(multi['tiny_val']) == ['box', 'mask']
    assert multi['tiny_val']['box'] == pytest.approx(box_expected, abs=1e-12)
    assert multi['tiny_val']['mask'] == pytest.approx(mask_expected, abs=1e-12)

    # --range writes its slice of the masks.
    range_dir = tiny_catalog.parent / 'mask_range'
    _use_mask_config(tiny_catalog, range_dir)
    test_engine.run_inference(model_builder.build_model_type(cfg), mask_weights, ind_range=(2, 5))
    sliced = _detections(range_dir, 'detection_range_2_5.pkl')
    assert sliced['all_segms'] == [per_class[2:5] for per_class in all_segms]
