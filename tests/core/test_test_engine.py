"""run_inference on the tiny datasets (CPU): Detectron's detections.pkl, COCO metrics checked with an
independent pycocotools evaluation, 2-process gloo testing equal to one process, --range slices,
several TEST.DATASETS, and tools/train_net.py from the command line."""
import os
import pickle
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from pycocotools.coco import COCO

from detectron.core import test as test_lib
from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from detectron.roi_data.minibatch import read_image
from detectron.utils.errors import ConfigValueError
from detectron.utils.vis import vis_one_image
from support.coco_eval import METRICS, coco_metrics, images_in_id_order
from support.tiny_runs import REPO, SHAPES_CFG, TINY_OVERRIDES, json_stats, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture
def random_weights(tiny_catalog):
    """A randomly initialised tiny model saved as {'model': state_dict} (once per module): its many
    low-confidence boxes make a good detection test. Function scope, so that the cfg it sets is
    restored after the test."""
    path = tiny_catalog.parent / 'random_init.pth'
    if not path.exists():
        use_tiny_config(tiny_catalog, tiny_catalog.parent / 'unused')
        torch.manual_seed(0)
        torch.save({'model': model_builder.create(cfg).state_dict()}, path)
    return str(path)


def _test_dir(output_dir, name):
    return os.path.join(str(output_dir), 'test', name, 'generalized_rcnn')


def _load(path):
    with open(path, 'rb') as f:
        return pickle.load(f)


def _detect_directly(weights, ann_file, image_dir):
    """all_boxes built image by image with core/test.im_detect_all, the per-image function."""
    model_type = model_builder.build_model_type(cfg)
    model = test_engine.load_test_model(model_type, weights,
                                        torch.device('cuda' if torch.cuda.is_available() else 'cpu'))
    per_image = [test_lib.im_detect_all(model_type, model, read_image(os.path.join(image_dir, image['file_name'])))
                 for image in images_in_id_order(COCO(ann_file))]
    return [[[] for _ in per_image]] + [[boxes[j] for boxes in per_image] for j in range(1, cfg.MODEL.NUM_CLASSES)]


def _assert_same_boxes(actual, expected):
    assert len(actual) == len(expected)
    for j, (actual_j, expected_j) in enumerate(zip(actual, expected)):
        assert len(actual_j) == len(expected_j), j
        for a, e in zip(actual_j, expected_j):
            assert np.array_equal(np.asarray(a), np.asarray(e)), j


def test_single_process_writes_detections_and_metrics_of_each_dataset(tiny_catalog, random_weights):
    output_dir = tiny_catalog.parent / 'single'
    use_tiny_config(tiny_catalog, output_dir, 'TEST.DATASETS', "('tiny_val', 'tiny_val_small')")
    results = test_engine.run_inference(model_builder.build_model_type(cfg), random_weights)
    assert list(results) == ['tiny_val', 'tiny_val_small']
    for name, ann_file, num_images in (('tiny_val', 'all.json', 8), ('tiny_val_small', 'small.json', 3)):
        content = _load(os.path.join(_test_dir(output_dir, name), 'detections.pkl'))
        all_boxes = content['all_boxes']
        # Detectron's layout: all_boxes[class][image], background class 0 empty.
        assert len(all_boxes) == 3 and all(len(per_class) == num_images for per_class in all_boxes)
        assert all(isinstance(b, list) and b == [] for b in all_boxes[0])
        for dets in all_boxes[1] + all_boxes[2]:
            assert dets.dtype == np.float32 and dets.ndim == 2 and dets.shape[1] == 5
            assert (dets[:, 4] >= cfg.TEST.SCORE_THRESH).all()
        assert sum(len(d) for d in all_boxes[1] + all_boxes[2]) >= 10 * num_images
        _assert_same_boxes(all_boxes, _detect_directly(random_weights, str(tiny_catalog.parent / ann_file),
                                                       str(tiny_catalog.parent / 'images')))
        assert 'DATASET_CATALOG' in content['cfg']
        assert list(results[name]) == ['box'] and list(results[name]['box']) == METRICS
        expected = coco_metrics(str(tiny_catalog.parent / ann_file), all_boxes)
        assert results[name]['box'] == pytest.approx(expected, abs=1e-12)
    assert results['tiny_val']['box']['AP50'] > 0  # random boxes hit some of the 11 objects


@pytest.mark.processes
def test_two_gloo_processes_give_the_single_process_detections(tiny_catalog, random_weights, one_thread_per_process):
    single_dir, multi_dir = tiny_catalog.parent / 'single_1', tiny_catalog.parent / 'multi'
    use_tiny_config(tiny_catalog, single_dir)
    single = test_engine.run_inference(model_builder.build_model_type(cfg), random_weights)
    use_tiny_config(tiny_catalog, multi_dir, 'NUM_GPUS', '2')
    multi = test_engine.run_inference(model_builder.build_model_type(cfg), random_weights, multi_gpu_testing=True)
    expected = _load(os.path.join(_test_dir(single_dir, 'tiny_val'), 'detections.pkl'))['all_boxes']
    assert sum(len(dets) for per_class in expected[1:] for dets in per_class) >= 80
    _assert_same_boxes(_load(os.path.join(_test_dir(multi_dir, 'tiny_val'), 'detections.pkl'))['all_boxes'],
                       expected)
    assert multi == single


def test_range_writes_exactly_its_slice(tiny_catalog, random_weights):
    output_dir = tiny_catalog.parent / 'range'
    use_tiny_config(tiny_catalog, output_dir)
    assert test_engine.run_inference(model_builder.build_model_type(cfg), random_weights, ind_range=(2, 5)) == {}
    test_dir = _test_dir(output_dir, 'tiny_val')
    assert sorted(os.listdir(test_dir)) == ['detection_range_2_5.pkl']
    expected = _detect_directly(random_weights, str(tiny_catalog.parent / 'all.json'),
                                str(tiny_catalog.parent / 'images'))
    _assert_same_boxes(_load(os.path.join(test_dir, 'detection_range_2_5.pkl'))['all_boxes'],
                       [per_class[2:5] for per_class in expected])


def test_range_needs_exactly_one_dataset(tiny_catalog, random_weights):
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'range2', 'TEST.DATASETS', "('tiny_val', 'tiny_val_small')")
    with pytest.raises(ConfigValueError, match=r"--range needs exactly one TEST.DATASETS entry"):
        test_engine.run_inference(model_builder.build_model_type(cfg), random_weights, ind_range=(0, 2))


@pytest.mark.slow
@pytest.mark.processes
def test_train_net_command_line_trains_then_tests(tiny_catalog):
    output_dir = tiny_catalog.parent / 'command_line'
    overrides = TINY_OVERRIDES + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(output_dir),
                                  'SOLVER.MAX_ITER', '2']
    result = subprocess.run([sys.executable, 'tools/train_net.py', '--cfg', SHAPES_CFG] + overrides, cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [entry['iter'] for entry in json_stats(result.stdout)[1]] == [0, 1]
    train_dir = os.path.join(str(output_dir), 'train', 'tiny_train', 'generalized_rcnn')
    assert sorted(os.listdir(train_dir)) == ['model_final.pth', 'model_iter1.pth', 'tensorboard',
                                             'training_curves.png']
    copypaste = [line.split('copypaste: ', 1)[1] for line in result.stdout.splitlines() if 'copypaste: ' in line]
    assert copypaste[:3] == ['Dataset: tiny_val', 'Task: box', ','.join(METRICS)]
    all_boxes = _load(os.path.join(_test_dir(output_dir, 'tiny_val'), 'detections.pkl'))['all_boxes']
    expected = coco_metrics(str(tiny_catalog.parent / 'all.json'), all_boxes)
    assert copypaste[3] == ','.join('{:.4f}'.format(expected[name]) for name in METRICS)



def test_vis_draws_each_tested_image_with_its_detections(tiny_catalog, random_weights):
    output_dir = tiny_catalog.parent / 'vis'
    use_tiny_config(tiny_catalog, output_dir, 'VIS', 'True', 'VIS_TH', '0.0')
    test_engine.run_inference(model_builder.build_model_type(cfg), random_weights)
    test_dir = _test_dir(output_dir, 'tiny_val')
    images = images_in_id_order(COCO(dataset_catalog.get_ann_fn('tiny_val')))
    names = [os.path.splitext(image['file_name'])[0] + '.png' for image in images]
    assert sorted(os.listdir(os.path.join(test_dir, 'vis'))) == sorted(names)
    all_boxes = _load(os.path.join(test_dir, 'detections.pkl'))['all_boxes']
    cls_boxes = [[]] + [all_boxes[j][0] for j in range(1, len(all_boxes))]
    assert sum(len(b) for b in cls_boxes) > 0
    original = read_image(os.path.join(dataset_catalog.get_im_dir('tiny_val'), images[0]['file_name']))
    expected = vis_one_image(original, cls_boxes, JsonDataset('tiny_val').classes, 0.0)
    drawn = cv2.imread(os.path.join(test_dir, 'vis', names[0]))
    assert np.array_equal(drawn, expected) and not np.array_equal(drawn, original)


def test_a_range_outside_the_dataset_is_one_config_error():
    from types import SimpleNamespace
    from detectron.core.test_engine import check_range
    from detectron.utils.errors import ConfigValueError
    five = SimpleNamespace(name='five_val', get_image_ids=lambda: [1, 2, 3, 4, 5])
    check_range((0, 5), five)
    check_range((4, 5), five)
    for bad in ((0, 6), (5, 5), (3, 2)):
        with pytest.raises(ConfigValueError, match=r'^--range {} {} does not fit dataset five_val of 5 images; '
                                                   r'use 0 <= START < END <= 5$'.format(*bad)):
            check_range(bad, five)


def test_log_splits_each_image_into_detector_and_loop_time_as_detectron(tiny_catalog, random_weights, monkeypatch,
                                                                        caplog):
    """Detectron's `i/n <det>s + <misc>s` line: a detector taking 20 ms and a loader taking 100 ms
    per image show up on their own sides (the two are means per image, the ETA their sum)."""
    import re
    import time
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'timed')
    _use_slow_detector(monkeypatch, seconds=0.02)

    def slow_loader(*args, **kwargs):
        for item in build_test_loader(*args, **kwargs):
            time.sleep(0.1)
            yield item

    build_test_loader = test_engine.build_test_loader
    monkeypatch.setattr(test_engine, 'build_test_loader', slow_loader)
    dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)
    with caplog.at_level('INFO', logger='detectron.core.test_engine'):
        test_engine.test_net(model_builder.build_model_type(cfg), random_weights, 'tiny_val',
                             str(tiny_catalog.parent / 'timed'), (2, 5))
    lines = [re.search(r'im_detect: range \[3, 5\] of \d+: (\d)/3 ([0-9.]+)s \+ ([0-9.]+)s \(eta: ', r.getMessage())
             for r in caplog.records if 'im_detect' in r.getMessage()]
    assert [int(m.group(1)) for m in lines] == [1, 3]
    detector_s, loop_s = float(lines[-1].group(2)), float(lines[-1].group(3))
    assert 0.02 <= detector_s < 0.09 and loop_s >= 0.1


def test_run_inference_logs_detectron_s_total_inference_time_per_dataset(tiny_catalog, random_weights, monkeypatch,
                                                                         caplog):
    """Detectron's `Total inference time: <s>s`, once per tested dataset, before its evaluation: at
    least the 8 x 50 ms a slow detector spends on tiny_val's images, at most the call's own time."""
    import re
    import time
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'total')
    _use_slow_detector(monkeypatch, seconds=0.05)
    started = time.perf_counter()
    with caplog.at_level('INFO'):
        test_engine.run_inference(model_builder.build_model_type(cfg), random_weights)
    elapsed = time.perf_counter() - started
    messages = [r.getMessage() for r in caplog.records]
    totals = [float(m.group(1)) for m in (re.fullmatch(r'Total inference time: ([0-9.]+)s', msg) for msg in messages)
              if m]
    assert len(totals) == 1 and 0.4 <= totals[0] <= elapsed
    total_at = next(i for i, msg in enumerate(messages) if msg.startswith('Total inference time'))
    assert any('Evaluating' in msg or 'Average Precision' in msg for msg in messages[total_at:])


def _use_slow_detector(monkeypatch, seconds):
    """The configured model type's detector replaced by one that takes `seconds` per image and
    detects nothing."""
    import time
    classes = cfg.MODEL.NUM_CLASSES

    def slow_detector(self):
        def detect(model, sample):
            time.sleep(seconds)
            return [np.zeros((0, 5), np.float32) for _ in range(classes)]
        return detect

    monkeypatch.setattr(type(model_builder.build_model_type(cfg)), 'detector', slow_detector)


@pytest.mark.parametrize('datasets, says_how', [("('tiny_val',)", True), ('()', False)])
def test_the_one_process_hint_is_logged_only_when_something_is_tested(tiny_catalog, random_weights, monkeypatch,
                                                                      caplog, datasets, says_how):
    """NUM_GPUS 2 without --multi-gpu-testing tests in one process and says so, as long as there is a
    dataset to test; with TEST.DATASETS empty run_inference tests nothing and says nothing about it."""
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'hint', 'TEST.DATASETS', datasets)
    cfg.defrost()
    cfg.NUM_GPUS = 2
    tested = []
    monkeypatch.setattr(test_engine, 'test_net', lambda *args, **kwargs: tested.append(args[2]) or (None, None))
    monkeypatch.setattr(test_engine, '_evaluate', lambda *args: {})
    with caplog.at_level('INFO', logger='detectron.core.test_engine'):
        assert test_engine.run_inference(model_builder.build_model_type(cfg), random_weights) == {}
    hints = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Testing in one process')]
    assert tested == (['tiny_val'] if says_how else [])
    assert hints == (['Testing in one process although NUM_GPUS is 2: pass --multi-gpu-testing to split the '
                      'images over the GPUs'] if says_how else [])


def test_a_swallowed_stop_ends_testing_after_that_image(tiny_catalog, random_weights, monkeypatch):
    """A SIGTERM whose JobInterrupted something swallowed (tests/utils/test_swallowed_stop.py) stops
    test_net after the image it arrived during, not at the end of the dataset."""
    import os
    import signal
    from detectron.utils import errors
    use_tiny_config(tiny_catalog, tiny_catalog.parent / 'stopped')
    classes, calls = cfg.MODEL.NUM_CLASSES, []

    def swallowing_detector(self):
        def detect(model, sample):
            calls.append(1)
            if len(calls) == 2:
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(100):  # the handler runs between these bytecodes
                        pass
                except:  # noqa: E722 - the swallowing under test
                    pass
            return [np.zeros((0, 5), np.float32) for _ in range(classes)]
        return detect

    monkeypatch.setattr(type(model_builder.build_model_type(cfg)), 'detector', swallowing_detector)
    dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)
    with errors.termination_signals_raise():
        with pytest.raises(errors.JobInterrupted):
            test_engine.test_net(model_builder.build_model_type(cfg), random_weights, 'tiny_val',
                                 str(tiny_catalog.parent / 'stopped'))
    assert len(calls) == 2
