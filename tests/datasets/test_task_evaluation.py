"""Dataset-level box results on a one-box dataset whose APs are worked out by hand.

Ground truth: one 100 x 100 box (COCO 'large'). The detection covers its left 78 columns, so its
COCO IoU is 78 * 100 / (100 * 100) = 0.78: a true positive at IoU thresholds 0.50 ... 0.75 (six of
the ten) and a miss at 0.80 ... 0.95. Hence AP = 6/10 = 0.6, AP50 = AP75 = AP60 = AP70 = 1,
AP80 = AP85 = AP90 = AP95 = 0, APl = AP and APs = APm = -1 (no small or medium ground truth).
"""

import logging
import os

import numpy as np
import pytest

from detectron.datasets import task_evaluation
from detectron.datasets.json_dataset import JsonDataset

ONE_BOX = {
    'images': [{'id': 1, 'file_name': '1.jpg', 'width': 200, 'height': 150}],
    'categories': [{'id': 4, 'name': 'thing'}],
    'annotations': [{'id': 1, 'image_id': 1, 'category_id': 4, 'bbox': [0, 0, 100, 100],
                     'area': 10000, 'iscrowd': 0}],
}
# x2 = 77 -> width 78 with the +1 convention
DETECTION = np.array([[0, 0, 77, 99, 0.9]], np.float32)

EXPECTED = [('AP', 0.6), ('AP50', 1.0), ('AP75', 1.0), ('APs', -1.0), ('APm', -1.0),
            ('APl', 0.6), ('AP60', 1.0), ('AP70', 1.0), ('AP80', 0.0), ('AP85', 0.0),
            ('AP90', 0.0), ('AP95', 0.0)]


def _evaluate(name, all_boxes, output_dir, **kwargs):
    return task_evaluation.evaluate_all(JsonDataset(name), all_boxes, str(output_dir), **kwargs)


def test_box_results_match_hand_computed_values(register_coco, tmp_path):
    register_coco('one_box', ONE_BOX)
    results = _evaluate('one_box', [[], [DETECTION]], tmp_path)
    assert list(results) == ['one_box']
    assert list(results['one_box']) == ['box']
    box = results['one_box']['box']
    assert list(box) == [name for name, _ in EXPECTED]
    np.testing.assert_allclose(list(box.values()), [value for _, value in EXPECTED], atol=1e-12)
    assert os.path.isfile(tmp_path / 'bbox_one_box_results.json')
    assert os.path.isfile(tmp_path / 'detection_results.pkl')


def test_copy_paste_block(register_coco, tmp_path, caplog):
    register_coco('one_box', ONE_BOX)
    results = _evaluate('one_box', [[], [DETECTION]], tmp_path)
    # Only the block: the evaluation's own lines are captured too when an earlier test left the loggers at INFO.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='detectron.datasets.task_evaluation'):
        task_evaluation.log_copy_paste_friendly_results(results)
    assert caplog.messages == [
        'copypaste: Dataset: one_box',
        'copypaste: Task: box',
        'copypaste: AP,AP50,AP75,APs,APm,APl,AP60,AP70,AP80,AP85,AP90,AP95',
        'copypaste: 0.6000,1.0000,1.0000,-1.0000,-1.0000,0.6000,1.0000,1.0000,0.0000,0.0000,'
        '0.0000,0.0000',
    ]


def test_no_detections_give_zero_ap(register_coco, tmp_path):
    register_coco('one_box', ONE_BOX)
    box = _evaluate('one_box', [[], [np.zeros((0, 5), np.float32)]], tmp_path)['one_box']['box']
    assert box['AP'] == 0 and box['AP50'] == 0 and box['AP90'] == 0 and box['APl'] == 0
    assert box['APs'] == -1 and box['APm'] == -1
    box = _evaluate('one_box', [[], [[]]], tmp_path)['one_box']['box']
    assert box['AP'] == 0


def test_test_sets_are_not_evaluated(register_coco, tmp_path):
    register_coco('one_box_test', ONE_BOX)
    output_dir = tmp_path / 'out'
    output_dir.mkdir()
    box = _evaluate('one_box_test', [[], [DETECTION]], output_dir)['one_box_test']['box']
    assert list(box.values()) == [-1] * len(EXPECTED)
    # The results json is still written, for submission to the evaluation server.
    assert os.listdir(output_dir) == ['bbox_one_box_test_results.json']


def test_outside_competition_mode_results_json_is_salted_and_removed(register_coco, tmp_path):
    register_coco('one_box', ONE_BOX)
    output_dir = tmp_path / 'out'
    output_dir.mkdir()
    box = _evaluate('one_box', [[], [DETECTION]], output_dir,
                    competition_mode=False)['one_box']['box']
    assert box['AP'] == pytest.approx(0.6)
    assert sorted(os.listdir(output_dir)) == ['detection_results.pkl']
