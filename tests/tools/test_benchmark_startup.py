"""tools/benchmark.py --mode startup: COCO val's size table and its sampling, the dataset written
with those sizes, the log readings, the rows' arithmetic, stopping a tool at a log line, and main
on the CPU with the tools' runs replaced by known values."""

import importlib.util
import json
import os
import shlex
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.utils.errors import ConfigValueError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COCO_TINY_VAL = os.path.join(REPO, '..', 'shared', 'data', 'coco_tiny', 'annotations', 'instances_val2017.json')
SHAPES_KL = 'configs/getting_started/shapes_demo_R-18-FPN_kl.yaml'
SHAPES_CENTERNET = 'configs/getting_started/shapes_demo_centernet_res18.yaml'
sys.path.insert(0, os.path.join(REPO, 'tools'))  # as when tools/benchmark.py runs

from benchmark_lib import cli, coco_val_sizes, image_sizes, logs, startup
from benchmark_lib.timing import Row


def _annotations(tmp_path, sizes):
    path = tmp_path / 'ann.json'
    path.write_text(json.dumps({'images': [{'id': i, 'height': h, 'width': w} for i, (h, w) in enumerate(sizes)]}))
    return str(path)


# --- the size table and its sample ---------------------------------------------------------------

def test_size_table_counts_sizes_most_frequent_first(tmp_path):
    ann = _annotations(tmp_path, [(480, 640)] * 3 + [(640, 480)] * 2 + [(427, 640), (375, 500)])
    assert image_sizes.size_table(ann) == [(480, 640, 3), (640, 480, 2), (375, 500, 1), (427, 640, 1)]
    module_file = tmp_path / 'sizes.py'  # the module the script writes
    module_file.write_text(image_sizes.table_module(ann, 'seven images'))
    spec = importlib.util.spec_from_file_location('sizes', module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SIZES == image_sizes.size_table(ann) and module.SOURCE == 'seven images'


def test_sample_follows_the_table_frequencies():
    table = [(480, 640, 6), (640, 480, 3), (427, 640, 1)]
    sample = image_sizes.sample_sizes(table, 10)
    # quantiles 0.05, 0.15, ..., 0.95 of the cumulative 0.6, 0.9, 1.0: six, three and one
    assert sorted(sample) == sorted([(480, 640)] * 6 + [(640, 480)] * 3 + [(427, 640)])
    unshuffled = [(480, 640)] * 6 + [(640, 480)] * 3 + [(427, 640)]
    assert sample != unshuffled and sample == image_sizes.sample_sizes(table, 10)  # shuffled, repeatably
    big = image_sizes.sample_sizes(table, 1000)
    assert (big.count((480, 640)), big.count((640, 480)), big.count((427, 640))) == (600, 300, 100)
    assert sorted(image_sizes.sample_sizes(table, 2)) == [(480, 640), (640, 480)]  # quantiles 0.25 and 0.75


def test_committed_table_is_the_one_its_command_writes(tmp_path):
    # COCO val2017's annotation file is not in the repository: one with the table's sizes, named as the
    # docstring's command names it, must give back the committed module word for word (order, label,
    # command line)
    annotation_name = shlex.split(coco_val_sizes.__doc__.split('Written by:')[1])[2]
    sizes = [(h, w) for h, w, n in coco_val_sizes.SIZES for _ in range(n)]
    ann = tmp_path / annotation_name
    ann.write_text(json.dumps({'images': [{'id': i, 'height': h, 'width': w} for i, (h, w) in enumerate(sizes)]}))
    with open(coco_val_sizes.__file__) as f:
        assert image_sizes.table_module(str(ann), coco_val_sizes.SOURCE) == f.read()
    # COCO val2017: 5000 images, 480 x 640 (height x width) the most frequent size; image 139 is
    # 426 x 640, image 285 640 x 586
    assert sum(n for _, _, n in coco_val_sizes.SIZES) == 5000 and coco_val_sizes.SIZES[0][:2] == (480, 640)
    assert {(426, 640), (640, 586)} <= {(h, w) for h, w, _ in coco_val_sizes.SIZES}


@pytest.mark.skipif(not os.path.isfile(COCO_TINY_VAL), reason='coco_tiny not found')
def test_coco_tiny_val_sizes_are_within_the_table():
    # coco_tiny val's 80 images are COCO val2017 images: each of its sizes is in the table, as often or more
    full = {(h, w): n for h, w, n in coco_val_sizes.SIZES}
    assert all(n <= full.get((h, w), 0) for h, w, n in image_sizes.size_table(COCO_TINY_VAL))


# --- the dataset of those sizes -------------------------------------------------------------------

def test_sized_dataset_has_the_sizes_boxes_and_classes_asked(tmp_path):
    sizes = [(48, 64), (70, 40), (48, 64)]
    image_dir, ann = startup.write_sized_dataset(str(tmp_path), sizes, num_classes=3, boxes=4)
    dataset_catalog.register_dataset('benchmark_sized_test', image_dir, ann)
    roidb = JsonDataset('benchmark_sized_test').get_roidb(gt=True)
    assert [(r['height'], r['width']) for r in roidb] == sizes
    for entry in roidb:
        assert cv2.imread(entry['image']).shape == (entry['height'], entry['width'], 3)
        boxes = entry['boxes']
        assert len(boxes) == 4 and boxes.min() >= 0
        assert (boxes[:, 2] < entry['width']).all() and (boxes[:, 3] < entry['height']).all()
        assert set(entry['gt_classes'].tolist()) <= {1, 2, 3}
    assert JsonDataset('benchmark_sized_test').num_classes == 4


def test_test_weights_load_the_box_classifier_of_models_that_have_one(tmp_path):
    from benchmark_lib.classifiers import loaded_class_probs

    from detectron.core.config_finalize import finalize_cfg
    from detectron.modeling import model_builder
    finalize_cfg(SHAPES_KL, [])
    state = _written_weights(tmp_path)
    np.testing.assert_allclose(state['box_outs.cls_score.bias'].numpy(), np.log(loaded_class_probs(4)), rtol=1e-6)
    assert not state['box_outs.cls_score.weight'].any() and not state['box_outs.bbox_pred.weight'].any()
    cfg.defrost()
    finalize_cfg(SHAPES_CENTERNET, [])
    torch.manual_seed(0)
    fresh = model_builder.create(cfg).state_dict()
    state = _written_weights(tmp_path)
    assert state.keys() == fresh.keys() and all(torch.equal(state[k], fresh[k]) for k in fresh)


def _written_weights(tmp_path):
    from detectron.modeling import model_builder
    path = str(tmp_path / 'weights.pth')
    startup.write_test_weights(model_builder.build_model_type(cfg), path)
    return torch.load(path)['model']


# --- the logs -------------------------------------------------------------------------------------

TEST_LOG = """INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 1/30 1.500s + 0.250s (eta: 0:00:58)
INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 11/30 0.290s + 0.010s (eta: 0:00:05)
INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 30/30 0.140s + 0.010s (eta: 0:00:00)
INFO test_engine.py:  68: Total inference time: 6.125s
"""


def test_first_image_and_total_from_the_test_log():
    assert logs.test_log_first_image_s(TEST_LOG) == pytest.approx(1.75)
    assert logs.test_log_total_inference_s(TEST_LOG) == pytest.approx(6.125)
    # TEST.IMS_PER_BATCH 32: the first line follows the first batch; its means times 32.
    batched = 'INFO test_engine.py: 194: im_detect: range [1, 1000] of 1000: 32/1000 0.102s + 0.010s (eta: 0:01:48)'
    assert logs.test_log_first_image_s(batched) == pytest.approx(32 * 0.112)
    with pytest.raises(ConfigValueError):
        logs.test_log_first_image_s(TEST_LOG.splitlines()[3])
    with pytest.raises(ConfigValueError):
        logs.test_log_total_inference_s(TEST_LOG.splitlines()[0])
    # The run is stopped at that line, before the evaluation.
    assert logs.test_log_inference_timed(TEST_LOG)
    assert not logs.test_log_inference_timed('\n'.join(TEST_LOG.splitlines()[:3]))


def test_first_iteration_from_the_training_log():
    stats = logs.json_stats('json_stats: {"iter": 0, "time": "2.500000", "data_time": "0.125000"}\n'
                            'json_stats: {"iter": 20, "time": "0.200000", "data_time": "0.010000"}\n')
    assert logs.train_log_first_iteration_s(stats) == pytest.approx(2.375)
    assert startup.first_iteration_logged('json_stats: {"iter": 0, "time": "1.0"}\n')
    assert not startup.first_iteration_logged('INFO loading\n')
    with pytest.raises(ConfigValueError):
        logs.train_log_first_iteration_s(stats[1:])


@pytest.mark.processes
def test_a_run_stops_at_the_line_asked_for(tmp_path):
    log = tmp_path / 'log.txt'
    with open(log, 'w') as out:
        process = subprocess.Popen([sys.executable, '-u', '-c', 'import time; print("ready"); time.sleep(60)'],
                                   stdout=out, start_new_session=True)
        assert logs._wait(process, str(log), lambda text: 'ready' in text, poll_s=0.05) == 0
    assert process.returncode is not None and log.read_text() == 'ready\n'
    with open(log, 'w') as out:
        process = subprocess.Popen([sys.executable, '-c', 'raise SystemExit(3)'], stdout=out)
        assert logs._wait(process, str(log), lambda text: False, poll_s=0.05) == 3


@pytest.mark.processes
def test_a_wait_ended_by_an_interrupt_ends_the_tool_in_its_own_session(tmp_path):
    log = tmp_path / 'log.txt'

    def interrupted(text):
        raise KeyboardInterrupt

    with open(log, 'w') as out:
        process = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=out,
                                   start_new_session=True)
        with pytest.raises(KeyboardInterrupt):
            logs._wait(process, str(log), interrupted, poll_s=0.05)
    assert process.returncode == -15  # SIGTERM, not left running


def test_json_stats_skip_a_half_written_last_line():
    text = 'json_stats: {"iter": 0, "time": "1.0"}\njson_stats: {"iter": 20, "ti'
    assert logs.json_stats(text) == [{'iter': 0, 'time': '1.0'}]
    assert logs.json_stats(text + 'me": "2.0"}\n') == [{'iter': 0, 'time': '1.0'}, {'iter': 20, 'time': '2.0'}]


# --- the rows' arithmetic -------------------------------------------------------------------------

def test_rows_and_ratios_from_the_rounds():
    test_runs = [(2.0, 12.0, 11.0), (1.0, 10.0, 9.0)]  # (first detection s, total s, steady ms) per round
    bare = Row('test', 'bare', None, 1, values=[8.0, 10.0])
    rows, ratios = startup.startup_rows('m.yaml', test_runs, [3.0, 1.5], [bare], num_images=1000)
    first, train, whole, steady, bare_row = rows
    assert first.values == [2.0, 1.0] and first.unit == 's' and train.values == [3.0, 1.5]
    assert whole.values == [12.0, 10.0] and whole.unit == 'ms/image'  # 1000 x total s / 1000 images
    assert whole.info == {'total_s': 11.0} and steady.values == [11.0, 9.0] and bare_row is bare
    assert all(r.name.startswith('m.yaml: ') for r in rows)
    (whole_name, whole_ratios), (steady_name, steady_ratios) = ratios
    assert whole_ratios == [1.5, 1.0] and steady_ratios == [11.0 / 8.0, 0.9]
    assert 'target <= 1.3' in whole_name and 'steady' in steady_name
    # With test_net's batch (TEST.IMS_PER_BATCH 32) a second bare row and its two ratios.
    batched = Row('test', 'bare, 32 per call', None, 1, values=[2.0, 5.0], info={'images_per_call': 32})
    bare = Row('test', 'bare', None, 1, values=[8.0, 10.0])
    rows, ratios = startup.startup_rows('m.yaml', test_runs, [3.0, 1.5], [bare, batched], num_images=1000)
    assert rows[-2:] == [bare, batched] and [r for _, r in ratios[2:]] == [[6.0, 2.0], [5.5, 1.8]]
    assert all('at 32 images per call' in name for name, _ in ratios[2:])
    assert not any('per call' in name for name, _ in ratios[:2])


# --- main on the CPU, the tools' runs replaced ----------------------------------------------------

@pytest.mark.processes
def test_main_runs_the_startup_rows_of_each_model(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(coco_val_sizes, 'SIZES', [(60, 80, 2), (80, 60, 1)])
    runs = {}

    def test_net_run(args, cfg_file, catalog, weights, work):
        assert dataset_catalog.get_ann_fn(startup.DATASET).startswith(os.path.dirname(catalog))
        runs.setdefault(cfg_file, []).append(work)
        return 0.5 * len(runs[cfg_file]), 0.03 * len(runs[cfg_file]), 9.0  # 10 and 20 ms/image whole

    monkeypatch.setattr(startup, 'test_net_run', test_net_run)
    monkeypatch.setattr(startup, 'train_net_run', lambda args, cfg_file, catalog, work: 4.0)
    report = cli.main(['--mode', 'startup', '--startup-cfgs', SHAPES_KL, SHAPES_CENTERNET, '--cfg', SHAPES_KL,
                       '--startup-images', '3', '--rounds', '2', '--round-warmup', '0',
                       '--loop-dir', str(tmp_path), 'DATA_LOADER.NUM_THREADS', '1'])
    assert cfg.MODEL.TYPE == 'generalized_rcnn' and cfg.is_frozen()  # --cfg's again
    assert sorted(runs) == sorted([SHAPES_KL, SHAPES_CENTERNET]) and all(len(w) == 2 for w in runs.values())
    records = report.records
    assert len(records) == 2 * (5 + 2)
    for model in (SHAPES_KL, SHAPES_CENTERNET):
        name = os.path.basename(model)
        rows = {r['row'][len(name) + 2:]: r for r in records if r['row'].startswith(name + ': ')}
        assert rows['test_net, model loaded -> first detection']['rounds'] == [0.5, 1.0]
        assert rows['train_net, first batch -> first iteration done']['median'] == 4.0
        whole = next(r for k, r in rows.items() if 'whole run' in k and r['section'] == 'test')
        bare = next(r for k, r in rows.items() if 'bare detector' in k)
        assert whole['rounds'] == pytest.approx([10.0, 20.0]) and len(bare['rounds']) == 2
        assert all(v > 0 for v in bare['rounds']) and whole['images'] == 3 and whole['cfg'] == model
        ratio = next(r for k, r in rows.items() if r['section'] == 'ratio' and 'whole run' in k)
        assert ratio['rounds'] == pytest.approx([w / b for w, b in zip(whole['rounds'], bare['rounds'])])
    assert 'startup' in capsys.readouterr().out
    assert np.isfinite([r['median'] for r in records]).all()
