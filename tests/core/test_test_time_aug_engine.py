"""Test-time augmentation through the unchanged test engine on the tiny datasets (CPU): a tiny Mask R-CNN
tested with Detectron's augmentations gives detections, masks and their AP; with only the identity it
writes the plain path's detections."""
import os
import pickle

import numpy as np
import pytest

from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.modeling import model_builder
from support.coco_eval import coco_metrics
from support.tiny_runs import MASK_OVERRIDES, save_random_mask_model, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

AUGMENTED = ['TEST.BBOX_AUG.ENABLED', 'True', 'TEST.BBOX_AUG.H_FLIP', 'True', 'TEST.BBOX_AUG.SCALES', '(48, 80)',
             'TEST.BBOX_AUG.MAX_SIZE', '120', 'TEST.BBOX_AUG.SCALE_H_FLIP', 'True', 'TEST.MASK_AUG.ENABLED', 'True',
             'TEST.MASK_AUG.H_FLIP', 'True', 'TEST.MASK_AUG.SCALES', '(80,)', 'TEST.BBOX_VOTE.ENABLED', 'True']


@pytest.fixture
def weights(tiny_catalog):
    """A randomly initialised tiny Mask R-CNN with KL-Loss' sigma head, masks large enough to show."""
    path = tiny_catalog.parent / 'random_tta_init.pth'
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'unused', *MASK_OVERRIDES, 'PRED_STD', 'True')
    save_random_mask_model(path)
    return str(path)


def _test(catalog, output_dir, weights_file, *overrides):
    use_tiny_config(catalog, output_dir, *MASK_OVERRIDES, 'PRED_STD', 'True', 'TEST.SCORE_THRESH', '0.0',
                    'TEST.DETECTIONS_PER_IM', '20', *overrides)
    results = test_engine.run_inference(model_builder.build_model_type(cfg), weights_file)
    with open(os.path.join(str(output_dir), 'test', 'tiny_val', 'generalized_rcnn', 'detections.pkl'), 'rb') as f:
        return results['tiny_val'], pickle.load(f)


@pytest.mark.parametrize('std_nms', ['False', 'True'])
def test_augmented_testing_gives_detections_masks_and_their_ap(tiny_catalog, weights, restore_global_cfg, std_nms):
    results, detections = _test(tiny_catalog, tiny_catalog.parent / 'tta', weights, 'STD_NMS', std_nms, *AUGMENTED)
    all_boxes, all_segms = detections['all_boxes'], detections['all_segms']
    assert sum(len(dets) for per_class in all_boxes[1:] for dets in per_class) > 8
    assert [[len(r) for r in c] for c in all_segms[1:]] == [[len(d) for d in c] for c in all_boxes[1:]]
    expected = coco_metrics(str(tiny_catalog.parent / 'all.json'), all_boxes)
    assert results['box'] == pytest.approx(expected, abs=1e-12)
    assert list(results) == ['box', 'mask']


def test_identity_only_augmentation_writes_the_plain_detections(tiny_catalog, weights, restore_global_cfg):
    _, plain = _test(tiny_catalog, tiny_catalog.parent / 'plain', weights, 'STD_NMS', 'True')
    restore_global_cfg()
    _, identity = _test(tiny_catalog, tiny_catalog.parent / 'identity', weights, 'STD_NMS', 'True',
                        'TEST.BBOX_AUG.ENABLED', 'True', 'TEST.MASK_AUG.ENABLED', 'True')
    assert identity['all_segms'] == plain['all_segms']
    for per_identity, per_plain in zip(identity['all_boxes'][1:], plain['all_boxes'][1:]):
        for a, b in zip(per_identity, per_plain):
            np.testing.assert_array_equal(a, b)
