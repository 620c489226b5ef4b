"""tools/benchmark.py (tools/benchmark_lib): its statistics, interleaving, the equal-work torchvision
model, the biased box classifiers, the log parsers, the profile summary, and a CPU smoke run of main."""

import json
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.models.detection import FasterRCNN, KeypointRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops.misc import FrozenBatchNorm2d

from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES_KL = 'configs/getting_started/shapes_demo_R-18-FPN_kl.yaml'
sys.path.insert(0, os.path.join(REPO, 'tools'))  # as when tools/benchmark.py runs

from benchmark_lib import (classifiers, cli, logs, loops, profiling, rcnn_rows, report, timing, torchvision_models,
                           voting_rows)


def _softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- command line ---------------------------------------------------------------------------------

def test_command_line_lists_overrides_and_sections():
    args = cli.parse_args(['--batch', '2', '16', '--', 'TEST.SCALE', '500'])
    assert (args.batch, args.opts, args.mode) == ([2, 16], ['TEST.SCALE', '500'], ['train', 'test'])
    assert cli.parse_args(['--profile', '--iters', '3', 'STD_NMS', 'True']).mode == ['train', 'test', 'profile']
    with pytest.raises(ConfigValueError):
        cli.parse_args(['--mode', 'loops', '--train-dataset', 'coco_tiny_train'])


# --- statistics ---------------------------------------------------------------------------------

def test_spread_on_hand_values():
    assert timing.spread([3, 1, 2]) == {'median': 2.0, 'min': 1.0, 'max': 3.0}
    assert timing.spread([4, 1, 10, 2]) == {'median': 3.0, 'min': 1.0, 'max': 10.0}


def test_ratios_are_paired_per_round():
    ratios = timing.per_round_ratios([10, 12, 9], [5, 4, 3])
    assert ratios == [2.0, 3.0, 3.0]
    # The median of the per-round ratios (3.0), not the ratio of the medians (10 / 4 = 2.5).
    assert timing.spread(ratios) == {'median': 3.0, 'min': 2.0, 'max': 3.0}
    with pytest.raises(ValueError):
        timing.per_round_ratios([1, 2], [1])


def test_rounds_interleave_rows_and_time_only_the_timed_steps():
    now = [0.0]
    calls = []

    def stepper(name, seconds):
        def step():
            calls.append((name, cfg.TEST.SCALE))
            now[0] += seconds
        return step

    train = timing.Row('train', 'a', stepper('a', 0.5), images_per_step=2)
    test = timing.Row('test', 'b', stepper('b', 0.25), images_per_step=1, cfg={'TEST.SCALE': 123})
    scale = cfg.TEST.SCALE
    timing.run_interleaved([train, test], rounds=2, iters=3, warmup=1, round_warmup=1,
                       device=torch.device('cpu'), clock=lambda: now[0])
    order = [name for name, _ in calls]
    assert order == ['a', 'b'] + (['a'] * 4 + ['b'] * 4) * 2
    assert {s for name, s in calls if name == 'b'} == {123} and {s for name, s in calls if name == 'a'} == {scale}
    assert cfg.TEST.SCALE == scale
    assert train.values == [2 * 3 / (3 * 0.5)] * 2  # images/s over the 3 timed steps
    assert test.values == [1000 * 0.25] * 2  # ms per image
    assert train.peaks_mib == [] and test.unit == 'ms/image'


def test_a_timed_pass_takes_every_item_once_between_the_clock_reads():
    now, inputs = [0.0], []
    durations = {0: 1.0, 1: 2.0, 2: 4.0}
    seconds = timing.timed_pass(lambda k: (inputs.append(k), now.__setitem__(0, now[0] + durations[k])), [2, 0, 1],
                                device=torch.device('cpu'), clock=lambda: now[0])
    assert inputs == [2, 0, 1] and seconds == 7.0


def test_the_report_notes_the_pass_before_the_rounds():
    meta = dict(date='d', device='cpu', torch='t', torchvision='tv', commit='c', command='python tools/benchmark.py')
    rep = report.Report(meta)
    row = timing.Row('test', 'bare', step=None, images_per_step=1, values=[12.0, 14.0],
                     info={'images_per_call': 1, 'first_pass_ms_per_image': 17.25})
    rep.add_row(row)
    line = [l for l in rep.markdown().splitlines() if l.startswith('| test | bare')][0]
    assert line.rstrip(' |').endswith('first_pass_ms_per_image 17.25') and '| 13 |' in line


def test_a_row_with_steps_per_round_times_that_many_steps_every_round():
    now, inputs = [0.0], []
    durations = {0: 1.0, 1: 2.0, 2: 3.0}
    step = timing.in_turn(lambda k: (inputs.append(k), now.__setitem__(0, now[0] + durations[k])), [0, 1, 2])
    row = timing.Row('train', 'replay', step, images_per_step=1, steps_per_round=3)
    timing.run_interleaved([row], rounds=2, iters=5, warmup=1, round_warmup=1, device=torch.device('cpu'),
                       clock=lambda: now[0])
    # warm-up 0; round 1: warm-up 1, timed 2, 0, 1; round 2: warm-up 2, timed 0, 1, 2
    assert inputs == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert row.values == [3 / 6.0] * 2  # every input once per round: 3 images in 1 + 2 + 3 s


# --- the torchvision models ---------------------------------------------------------------------

def _bottleneck(dim_in, width, dim_out, projection):
    return dim_in * width + 9 * width * width + width * dim_out + (dim_in * dim_out if projection else 0)


def _layer(dim_in, width, blocks):
    return _bottleneck(dim_in, width, 4 * width, True) + (blocks - 1) * _bottleneck(4 * width, width, 4 * width, False)


# ResNet-50 convolutions (no biases; FrozenBatchNorm2d has no parameters), by hand.
CONV1 = 64 * 3 * 7 * 7
LAYER1 = _layer(64, 64, 3)
LAYERS_2_TO_4 = _layer(256, 128, 4) + _layer(512, 256, 6) + _layer(1024, 512, 3)
FPN = 256 * (256 + 512 + 1024 + 2048) + 4 * 256 + 4 * (9 * 256 * 256 + 256)
RPN = (9 * 256 * 256 + 256) + (256 * 3 + 3) + (256 * 12 + 12)
BOX_HEAD = (256 * 49 * 1024 + 1024) + (1024 * 1024 + 1024)
PREDICTOR_81 = (1024 * 81 + 81) + (1024 * 4 * 81 + 4 * 81)
BN_AFFINE = 2 * (64 + 3 * (64 + 64 + 256) + 256 + 4 * (128 + 128 + 512) + 512 + 6 * (256 + 256 + 1024) + 1024
                 + 3 * (512 + 512 + 2048) + 2048)


def test_equal_work_torchvision_model_freezes_exactly_conv1_and_layer1_with_frozen_bn():
    model = torchvision_models.torchvision_equal_work(81, **torchvision_models.torchvision_settings(800, 1333))
    norms = [m for m in model.modules() if isinstance(m, (FrozenBatchNorm2d, nn.BatchNorm2d))]
    assert len(norms) == 53 and all(isinstance(m, FrozenBatchNorm2d) for m in norms)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    stem_and_res2 = {n for n, _ in model.named_parameters()
                     if n.startswith(('backbone.body.conv1.', 'backbone.body.layer1.'))}
    assert frozen == stem_and_res2 and len(frozen) == 1 + 10  # conv1 + layer1's 9 convs and 1 projection
    assert CONV1 + LAYER1 == 222400
    assert torchvision_models.trainable_parameters(model) == LAYERS_2_TO_4 + FPN + RPN + BOX_HEAD + PREDICTOR_81 == 41481636


def test_unequal_torchvision_model_trains_every_stage_with_batch_norm():
    model = torchvision_models.torchvision_all_stages_bn(81, **torchvision_models.torchvision_settings(800, 1333))
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 53
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    assert torchvision_models.trainable_parameters(model) == 41481636 + CONV1 + LAYER1 + BN_AFFINE == 41757156


def test_with_masks_the_equal_work_torchvision_model_has_our_mask_head_s_parameters():
    from detectron.core.config_finalize import finalize_cfg
    from detectron.modeling import rcnn_builder
    finalize_cfg(os.path.join(REPO, 'configs', 'e2e_mask_rcnn_R-50-FPN_2x_log.yaml'), [])
    model = torchvision_models.torchvision_equal_work(81, **torchvision_models.torchvision_settings(800, 1333))
    # 4 conv 3x3 256 -> 256, the 2x deconv, the 1x1 logits of 81 classes.
    mask_head = 4 * (256 * 256 * 9 + 256) + (256 * 256 * 4 + 256) + (256 * 81 + 81)
    assert torchvision_models.trainable_parameters(model) == 41481636 + mask_head
    ours = rcnn_builder.build_mask_head(cfg, 256)
    assert sum(p.numel() for p in ours.parameters()) == mask_head


def test_torchvision_settings_follow_our_cfg():
    cfg.immutable(False)
    cfg.TEST.RPN_POST_NMS_TOP_N = 321
    cfg.TRAIN.BATCH_SIZE_PER_IM = 64
    settings = torchvision_models.torchvision_settings(256, 320)
    model = torchvision_models.torchvision_equal_work(6, **settings)
    assert (settings['min_size'], settings['max_size']) == (256, 320)
    assert model.rpn._post_nms_top_n['testing'] == 321
    assert model.roi_heads.fg_bg_sampler.batch_size_per_image == 64


# --- the biased box classifiers -----------------------------------------------------------------

def test_loaded_classifier_gives_every_roi_the_loaded_scores():
    cls_score, bbox_pred = nn.Linear(8, 6), nn.Linear(8, 24)
    classifiers.set_loaded_classifier(cls_score, [bbox_pred], 6)
    x = torch.randn(50, 8)
    probs = _softmax(cls_score(x).detach().double().numpy())
    np.testing.assert_allclose(probs, np.tile([0.1, 0.18, 0.18, 0.18, 0.18, 0.18], (50, 1)), atol=1e-6)
    assert not bbox_pred(x).abs().sum()
    # 81 classes: still 5 loaded classes per RoI above a 0.05 threshold, nothing else.
    probs81 = _softmax(np.log(classifiers.loaded_class_probs(81)))
    assert (probs81 > 0.05).sum() == 6 and probs81[1:6].min() > 0.17 and probs81[6:].max() < 1e-8
    np.testing.assert_allclose(classifiers.loaded_class_probs(4)[:4], [1 - 3 * 0.18, 0.18, 0.18, 0.18])
    with pytest.raises(ConfigValueError):
        classifiers.loaded_class_probs(1)


def test_realistic_classifier_lets_about_the_asked_candidates_through():
    gen = torch.Generator().manual_seed(3)
    features = torch.relu(torch.randn(600, 32, generator=gen)) * 7.0
    weight, bias = classifiers.realistic_class_head(features, 6, per_class=100, score_thresh=0.05)
    probs = _softmax(features.double().numpy() @ weight.double().numpy().T + bias.double().numpy())
    per_class = (probs[:, 1:] > 0.05).sum(axis=0)
    assert abs(per_class.sum() - 500) <= 5
    assert per_class.min() > 50 and per_class.max() < 150  # spread over the classes
    assert 0 < (probs[:, 1:] > 0.05).any(axis=1).sum() < 600  # and varying with the RoI


# --- the loops' log parsers and the dataset shape -----------------------------------------------

TRAIN_LOG = """INFO train_net.py:  57: MAX_ITER: 60 iterations
json_stats: {"iter": 0, "loss": "2.1", "time": "0.500000"}
INFO train_engine.py: 269: [1/60] loss 2.1
json_stats: {"data_time": "0.050000", "iter": 20, "loss": "2.0", "time": "0.250000"}
json_stats: {"data_time": "0.010000", "iter": 40, "loss": "2.0", "time": "0.200000"}
json_stats: {"data_time": "0.300000", "iter": 59, "loss": "1.9", "time": "0.400000"}
"""

TEST_LOG = """INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 1/30 1.500s + 0.500s (eta: 0:00:58)
INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 11/30 0.290s + 0.010s (eta: 0:00:05)
INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 21/30 0.190s + 0.010s (eta: 0:00:01)
INFO test_engine.py: 131: im_detect: range [1, 30] of 30: 30/30 0.140s + 0.010s (eta: 0:00:00)
"""


def test_training_log_images_per_second_after_warmup():
    stats = logs.json_stats(TRAIN_LOG)
    assert [s['iter'] for s in stats] == [0, 20, 40, 59]
    assert logs.train_log_images_per_s(stats, global_batch=2, warmup_iter=20) == [8.0, 10.0, 5.0]
    with pytest.raises(ConfigValueError):
        logs.train_log_images_per_s(stats, global_batch=2, warmup_iter=60)
    # data_time / time at iterations 20, 40, 59: 0.2, 0.05, 0.75 -> median 0.2; the first line has none.
    assert logs.train_log_data_fraction(stats, warmup_iter=20) == pytest.approx(0.2)
    assert logs.train_log_data_fraction(stats, warmup_iter=0) == pytest.approx(0.2)
    assert logs.train_log_data_fraction(stats[:1], warmup_iter=0) is None


def test_test_log_ms_per_image_excludes_the_first_images():
    ms, running_mean, detector, rest = logs.test_log_ms_per_image(TEST_LOG)
    # images 12..30: 30 x 0.150 s - 11 x 0.300 s over 19 images, of which the detector's
    # 30 x 0.140 - 11 x 0.290 and the rest's 30 x 0.010 - 11 x 0.010
    assert ms == pytest.approx(1000 * (4.5 - 3.3) / 19)
    assert detector == pytest.approx(1000 * (4.2 - 3.19) / 19) and rest == pytest.approx(1000 * 0.19 / 19)
    assert running_mean == pytest.approx(150.0)
    with pytest.raises(ConfigValueError):
        logs.test_log_ms_per_image(TEST_LOG.splitlines()[0])


def test_dataset_shape_uses_the_resize_rule(tmp_path):
    coco = {'images': [{'id': 1, 'height': 480, 'width': 640}, {'id': 2, 'height': 375, 'width': 500},
                       {'id': 3, 'height': 427, 'width': 640}],
            'annotations': [{'image_id': 1, 'iscrowd': 0}, {'image_id': 1, 'iscrowd': 1},
                            {'image_id': 2, 'iscrowd': 0}, {'image_id': 3, 'iscrowd': 0}]}
    ann = tmp_path / 'ann.json'
    ann.write_text(json.dumps(coco))
    dataset_catalog.register_dataset('benchmark_test_three_images', str(tmp_path), str(ann))
    shape = loops.dataset_shape(['benchmark_test_three_images'], 800, 1333)
    # short side -> 800: 640 x 800/480 = 1066.7, 500 x 800/375 = 1066.7, 640 x 800/427 = 1199.1
    assert shape == {'images': 3, 'height': 427, 'width': 640, 'resized_height': 800, 'resized_width': 1067,
                     'boxes_per_image': 1.0}
    # Two names: their images together (the same medians, twice the images, the same boxes per image).
    assert loops.dataset_shape(['benchmark_test_three_images'] * 2, 800, 1333) == dict(shape, images=6)


# --- rows replaying a loop's own inputs ------------------------------------------------------------

class _ShapeRecorder(nn.Module):
    """A 'detector' that records the width of every image batch it trains on."""

    def __init__(self):
        super().__init__()
        self.box_head = nn.Linear(1, 1)
        self.widths = []

    def forward(self, images):
        self.widths.append(images.shape[-1])
        return {'loss': self.box_head(images.mean().reshape(1, 1)).sum()}


def test_train_row_primes_on_every_batch_then_takes_them_in_turn():
    model = _ShapeRecorder()
    batches = [(torch.ones(1, 3, 4, w),) for w in (5, 6, 7)]
    row = rcnn_rows.train_row('replay', model, batches, model.box_head, batch=1, device=torch.device('cpu'),
                       precision='fp32', lr=0.0, prime=True)
    assert model.widths == [5, 6, 7, 5]  # the priming pass, then the step that counts the RoIs
    for _ in range(4):
        row.step()
    assert model.widths[4:] == [6, 7, 5, 6]
    unprimed = _ShapeRecorder()
    rcnn_rows.train_row('synthetic', unprimed, batches[:1], unprimed.box_head, 1, torch.device('cpu'), 'fp32', 0.0)
    assert unprimed.widths == [5]


def test_train_net_batches_are_the_loaders_batches_of_the_timed_window(monkeypatch):
    seen = {}

    def batches(model_type, start_iter, device):
        seen.update(start_iter=start_iter, datasets=cfg.TRAIN.DATASETS, ims=cfg.TRAIN.IMS_PER_BATCH, device=device)
        return iter(range(1000)), None

    class ModelType:
        def batch_to_device(self, device):
            return lambda batch: (batch, device.type)

    monkeypatch.setattr(loops.train_engine, 'training_batches', batches)
    args = cli.parse_args(['--mode', 'loops', '--train-dataset', 'tr', '--test-dataset', 'te',
                          '--loop-iters', '12', '--loop-warmup', '8'])
    cpu = torch.device('cpu')
    assert loops.train_net_batches(args, ModelType(), batch=3, device=cpu) == [(8, 'cpu'), (9, 'cpu'), (10, 'cpu'),
                                                                               (11, 'cpu')]
    assert seen == {'start_iter': 0, 'datasets': ('tr',), 'ims': 3, 'device': cpu}
    args = cli.parse_args(['--mode', 'loops', '--loop-parts', 'train', '--train-dataset', 'tr', 'tr2',
                           '--loop-iters', '9', '--loop-warmup', '8'])
    assert loops.train_net_batches(args, ModelType(), batch=2, device=cpu) == [(8, 'cpu')]
    assert seen['datasets'] == ('tr', 'tr2') and seen['ims'] == 2
    assert cfg.TRAIN.IMS_PER_BATCH != 3 or cfg.TRAIN.DATASETS != ('tr',)  # restored afterwards


def test_replayed_test_row_primes_on_every_image_then_takes_them_in_turn():
    seen = []

    class ModelType:
        def batch_detector(self):
            return lambda model, samples: seen.append([sample['id'] for sample in samples])

    samples = [{'id': k} for k in range(3)]
    row = loops.replayed_test_row('ours', ModelType(), samples, model=None, device=torch.device('cpu'),
                                  precision='fp32')
    assert seen == [[0], [1], [2]] and row.section == 'test' and row.images_per_step == 1
    for _ in range(4):
        row.step()
    assert seen[3:] == [[0], [1], [2], [0]]
    assert "3 images replayed" in row.name and row.steps_per_round == 3
    # TEST.IMS_PER_BATCH 2: calls of 2 and 1 images, a round over all 3, ms per image.
    seen.clear()
    row = loops.replayed_test_row('ours', ModelType(), samples, model=None, device=torch.device('cpu'),
                                  precision='fp32', batch=2)
    assert seen == [[0, 1], [2]] and row.steps_per_round == 2 and row.info['images_per_call'] == 2
    assert row.info['first_pass_ms_per_image'] >= 0.0
    assert row.value(elapsed=0.03, iters=2) == pytest.approx(10.0)  # 30 ms over 3 images


def test_loops_rows_autotune_cudnn_as_the_config_says(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cli, 'run_loops', lambda *a: seen.append(torch.backends.cudnn.benchmark))
    args = cli.parse_args(['--mode', 'loops', '--train-dataset', 'tr', '--test-dataset', 'te',
                           '--loop-dir', str(tmp_path)])
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as main() sets it for the comparisons with torchvision
    try:
        for value in (False, True):
            with timing.cfg_values({'CUDNN_BENCHMARK': value}):
                cli.run_rcnn_sections(args, None, 'fp32', report=None, timing={'device': torch.device('cpu')})
            assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = previous
    assert seen == [False, True]


def test_loop_parts_need_only_their_own_dataset():
    args = cli.parse_args(['--mode', 'loops', '--loop-parts', 'train', '--train-dataset', 'tr'])
    assert args.loop_parts == ['train'] and args.test_dataset is None
    with pytest.raises(ConfigValueError, match='--loop-parts test needs --test-dataset'):
        cli.parse_args(['--mode', 'loops', '--train-dataset', 'tr'])
    with pytest.raises(ConfigValueError, match='--loop-parts train needs --train-dataset'):
        cli.parse_args(['--mode', 'loops', '--loop-parts', 'train', 'test', '--test-dataset', 'te'])


def test_run_loops_runs_the_chosen_loops_first_then_times_their_rows_interleaved(monkeypatch):
    events = []

    def fake_part(name):
        class Part:
            def __init__(self, args, model_type, precision, work):
                events.append(name + ' loop')

            def timed_rows(self, device):
                events.append(name + ' rows')
                return [name + ' replayed', name + ' synthetic']

            def report(self, report):
                events.append(name + ' report')
        return Part

    monkeypatch.setattr(loops, 'RCNNTrainNetPart', fake_part('train'))
    monkeypatch.setattr(loops, 'TestNetPart', fake_part('test'))
    monkeypatch.setattr(loops, 'run_interleaved', lambda rows, *a: events.append(rows))
    for parts, expected in (
            (['train', 'test'], ['train loop', 'test loop', 'train rows', 'test rows',
                                 ['train replayed', 'train synthetic', 'test replayed', 'test synthetic'],
                                 'train report', 'test report']),
            (['train'], ['train loop', 'train rows', ['train replayed', 'train synthetic'], 'train report'])):
        events.clear()
        args = cli.parse_args(['--mode', 'loops', '--loop-parts', *parts, '--train-dataset', 'tr',
                               '--test-dataset', 'te'])
        loops.run_loops(args, None, torch.device('cpu'), 'fp32', report=None, work='unused')
        assert events == expected


def test_train_net_of_the_train_loop_alone_names_no_test_dataset():
    args = cli.parse_args(['--mode', 'loops', '--loop-parts', 'train', '--train-dataset', 'tr', '--', 'A.B', '1'])
    assert loops._loop_opts(args) == ['A.B', '1', 'NUM_GPUS', '1']
    args.test_dataset = 'te'
    assert loops._loop_opts(args)[-2:] == ['TEST.DATASETS', "('te',)"]


# --- the profile summary ------------------------------------------------------------------------

def test_pool_bytes_sums_the_allocated_bytes_of_the_given_pools_only():
    segments = [{'segment_pool_id': (0, 0), 'allocated_size': 1000},  # the default pool
                {'segment_pool_id': (1, 7), 'allocated_size': 300}, {'segment_pool_id': (1, 7), 'allocated_size': 20},
                {'segment_pool_id': (1, 9), 'allocated_size': 4000}]
    assert timing.pool_bytes({(1, 7)}, segments) == 320
    assert timing.pool_bytes({(1, 7), (1, 9)}, segments) == 4320
    assert timing.pool_bytes(set(), segments) == 0


def test_a_row_without_captured_graphs_holds_no_graph_memory():
    from detectron.utils import cuda_graphs
    owner = nn.Linear(2, 2)
    cuda_graphs.graphed_method(owner, 'forward', lambda module, x: module(x))  # made, nothing captured
    assert cuda_graphs.graph_pools(owner) == []
    assert timing.graph_pool_bytes([owner, nn.Linear(1, 1)]) == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_a_rows_captured_graph_memory_counts_as_held_by_it():
    from detectron.utils import cuda_graphs
    owner = nn.Linear(256, 1024).cuda()
    graphed = cuda_graphs.graphed_method(owner, 'forward', lambda module, x: module(x))
    x = torch.randn(512, 256, device='cuda')
    for _ in range(3):  # captured on the second call of the shape
        out = graphed(x)
    assert cuda_graphs.graph_pools(owner)
    assert timing.graph_pool_bytes([owner]) >= out.numel() * out.element_size()  # at least its output


def test_profile_summary_on_hand_events():
    events = [('k1', True, 0.0, 10.0), ('k2', True, 5.0, 15.0), ('k1', True, 20.0, 30.0),
              ('Memcpy DtoH (Device -> Pageable)', True, 40.0, 42.0),
              ('cudaLaunchKernel', False, 0.0, 1.0), ('cudaStreamSynchronize', False, 2.0, 3.0),
              ('cudaStreamSynchronize', False, 4.0, 5.0), ('cudaDeviceSynchronize', False, 6.0, 7.0)]
    s = profiling.summarise_profile(events, steps=2, wall_s=0.1)
    assert s['wall_ms_per_step'] == pytest.approx(50.0)
    assert s['gpu_busy_ms_per_step'] == pytest.approx((15 + 10 + 2) / 1000 / 2)  # k1 and k2 overlap
    assert s['gpu_kernel_sum_ms_per_step'] == pytest.approx((10 + 10 + 10 + 2) / 1000 / 2)
    assert s['gpu_busy_fraction'] == pytest.approx(0.0135 / 50.0)
    assert (s['gpu_ops_per_step'], s['host_syncs_per_step'], s['d2h_copies_per_step']) == (2.0, 1.5, 0.5)
    assert s['top_kernels'][0] == {'name': 'k1', 'ms_per_step': pytest.approx(0.01), 'calls_per_step': 1.0}
    assert [k['name'] for k in s['top_kernels']] == ['k1', 'k2', 'Memcpy DtoH (Device -> Pageable)']


# --- main on the CPU ----------------------------------------------------------------------------

def _tiny_torchvision(norm, keypoints=False):
    """A FasterRCNN (with keypoints, a KeypointRCNN of KRCNN.NUM_KEYPOINTS) small enough for the CPU smoke run
    (the real ones are tested above)."""
    def build(num_classes, **settings):
        backbone = nn.Sequential(nn.Conv2d(3, 16, 3, stride=8, padding=1), norm(16), nn.ReLU())
        backbone.out_channels = 16
        model_class, extra = FasterRCNN, {}
        if keypoints:
            model_class = KeypointRCNN
            extra = dict(keypoint_roi_pool=MultiScaleRoIAlign(['0'], 7, 2), keypoint_head=KeypointRCNNHeads(16, (16,)),
                         keypoint_predictor=KeypointRCNNPredictor(16, cfg.KRCNN.NUM_KEYPOINTS))
        return model_class(
            backbone, rpn_anchor_generator=AnchorGenerator(((32,),), ((0.5, 1.0, 2.0),)),
            box_roi_pool=MultiScaleRoIAlign(['0'], 7, 2), box_head=TwoMLPHead(16 * 49, 32),
            box_predictor=FastRCNNPredictor(32, num_classes), **extra, **settings)
    return build


def test_main_runs_every_cpu_section_at_tiny_settings(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)  # the CPU sections, on a GPU machine too
    monkeypatch.setattr(rcnn_rows, 'torchvision_equal_work', _tiny_torchvision(FrozenBatchNorm2d))
    monkeypatch.setattr(rcnn_rows, 'torchvision_all_stages_bn', _tiny_torchvision(nn.BatchNorm2d))
    argv = ['--cfg', SHAPES_KL, '--mode', 'train', 'test', '--profile', '--height', '64', '--width', '64',
            '--batch', '1', '--iters', '1', '--rounds', '2', '--warmup', '0', '--round-warmup', '0',
            '--realistic-per-class', '5', '--profile-steps', '1',
            'FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '32', 'TRAIN.RPN_PRE_NMS_TOP_N', '50',
            'TRAIN.RPN_POST_NMS_TOP_N', '50', 'TRAIN.BATCH_SIZE_PER_IM', '16', 'TEST.RPN_PRE_NMS_TOP_N', '30',
            'TEST.RPN_POST_NMS_TOP_N', '30']
    report = cli.main(argv)
    out = capsys.readouterr().out
    records = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert records == report.records
    by_section = {}
    for r in records:
        by_section.setdefault(r['section'], []).append(r)
        assert r['device'].startswith('cpu') and r['torch'] == torch.__version__ and 'benchmark.py' in r['command']
    assert [len(by_section[s]) for s in ('train', 'test', 'ratio', 'profile')] == [3, 6, 2 + 4, 2 + 2]
    assert [p['row'] for p in by_section['profile']][2:] == ['ours, realistic, STD_NMS False',
                                                            'torchvision (equal work), realistic']
    for r in by_section['train'] + by_section['test'] + by_section['ratio']:
        assert len(r['rounds']) == 2 and r['median'] == pytest.approx(float(np.median(r['rounds'])))
        assert (r['min'], r['max']) == (min(r['rounds']), max(r['rounds']))
    ours, equal, unequal = by_section['train']
    assert 'UNEQUAL' in unequal['row'] and 'equal work' in equal['row']
    assert all(r['precision'] == 'fp32' and r['batch'] == 1 and r['loss_finite'] for r in by_section['train'])
    speedup = next(r for r in by_section['ratio'] if r['row'].startswith('ours / torchvision equal work'))
    assert speedup['rounds'] == pytest.approx([a / b for a, b in zip(ours['rounds'], equal['rounds'])])
    rows = {r['row']: r for r in by_section['test']}
    for name in ('ours, loaded, STD_NMS False', 'ours, loaded, STD_NMS True', 'torchvision (equal work), loaded'):
        assert rows[name]['candidates'] == 5 * rows[name]['rois']  # every RoI on all 5 classes
    voting = next(r for r in by_section['ratio'] if r['row'].startswith('ours STD_NMS True / False, loaded'))
    assert voting['rounds'] == pytest.approx([a / b for a, b in zip(rows['ours, loaded, STD_NMS True']['rounds'],
                                                                     rows['ours, loaded, STD_NMS False']['rounds'])])
    assert all(p['host_syncs_per_step'] == 0 and p['wall_ms_per_step'] > 0 for p in by_section['profile'])
    table = out[out.index('| section | row |'):]
    assert all(r['row'] in table for r in records)


@pytest.mark.parametrize('case,loaded', [('loaded', 5), ('many_classes', 15)])
def test_voting_case_head_outputs(case, loaded):
    scores, boxes, sigmas = voting_rows.voting_head_outputs(case, 81)
    assert scores.shape == (1000, 81) and boxes.shape == sigmas.shape == (1000, 324)
    np.testing.assert_allclose(scores.sum(1), 1, rtol=1e-5)
    score = voting_rows.VOTING_CASES[case]['score']
    assert np.abs(scores[:, 1:loaded + 1] - score).max() <= 0.02 + 1e-6 and scores[:, loaded + 1:].max() < 1e-3
    assert boxes.min() >= 0 and (boxes[:, 2::4] >= boxes[:, 0::4]).mean() > 0.9 and sigmas.min() > 0


def test_main_voting_mode_times_both_post_processings(capsys):
    argv = ['--mode', 'voting', '--voting-case', 'loaded', '--iters', '1', '--rounds', '2', '--warmup', '0',
            '--round-warmup', '0']
    records = cli.main(argv).records
    plain, voting, ratio, best = records
    assert [plain['row'], voting['row']] == ['box_results_with_nms_and_limit, loaded, STD_NMS False',
                                             'box_results_with_nms_and_limit, loaded, STD_NMS True']
    assert plain['candidates'] == voting['candidates'] == 5000 and voting['detections'] == 100
    assert ratio['rounds'] == pytest.approx([a / b for a, b in zip(voting['rounds'], plain['rounds'])])
    assert best['rounds'] == pytest.approx([min(voting['rounds']) / min(plain['rounds'])])


# --- Keypoint R-CNN -------------------------------------------------------------------------------

KEYPOINT_CFG = os.path.join('configs', '12_2017_baselines', 'e2e_keypoint_rcnn_R-50-FPN_1x.yaml')


def test_with_keypoints_the_equal_work_torchvision_model_has_our_keypoint_head_s_parameters():
    from detectron.core.config_finalize import finalize_cfg
    from detectron.modeling import keypoint_rcnn_builder
    finalize_cfg(os.path.join(REPO, KEYPOINT_CFG), [])
    model = torchvision_models.torchvision_equal_work(2, **torchvision_models.torchvision_settings(800, 1333))
    # Detectron's v1convX on COCO: 8 conv 3x3 to 512 (the first from FPN's 256), the 4x4 deconv to 17 scores;
    # the bilinear upsampling has no parameters to train (torchvision interpolates, ours is fixed).
    keypoint_head = (256 * 512 * 9 + 512) + 7 * (512 * 512 * 9 + 512) + (512 * 17 * 16 + 17)
    predictor_2 = (1024 * 2 + 2) + (1024 * 4 * 2 + 4 * 2)
    assert torchvision_models.trainable_parameters(model) == (
        41481636 - PREDICTOR_81 + predictor_2 + keypoint_head)
    ours = keypoint_rcnn_builder.build_keypoint_head(cfg, 256)
    assert sum(p.numel() for p in ours.parameters()) == keypoint_head


def test_synthetic_keypoints_are_the_same_for_both_models_and_inside_their_boxes(set_cfg):
    from benchmark_lib import inputs
    set_cfg({'MODEL.KEYPOINTS_ON': True, 'KRCNN.NUM_KEYPOINTS': 5})
    images, boxes, labels = inputs.synthetic_batch(2, 64, 96, 3, 2)
    _, _, ours = inputs.ours_train_inputs(images, boxes, labels, torch.device('cpu'))
    _, theirs = inputs.torchvision_train_inputs(images, boxes, labels, torch.device('cpu'))
    for o, t, bx in zip(ours, theirs, boxes):
        assert o['keypoints'].shape == (3, 3, 5) and t['keypoints'].shape == (3, 5, 3)
        assert torch.equal(o['keypoints'].permute(0, 2, 1), t['keypoints'])
        x, y, v = o['keypoints'].unbind(1)
        b = torch.from_numpy(bx)
        assert ((x >= b[:, :1].floor()) & (x <= b[:, 2:3]) & (y >= b[:, 1:2].floor()) & (y <= b[:, 3:4])).all()
        assert (v == 2).all()


@pytest.mark.slow
def test_main_runs_the_keypoint_rows_on_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(rcnn_rows, 'torchvision_equal_work', _tiny_torchvision(FrozenBatchNorm2d, keypoints=True))
    monkeypatch.setattr(rcnn_rows, 'torchvision_all_stages_bn', _tiny_torchvision(nn.BatchNorm2d, keypoints=True))
    argv = ['--cfg', 'configs/getting_started/shapes_demo_keypoint_R-18-FPN.yaml', '--mode', 'train', 'test',
            '--height', '64', '--width', '64', '--batch', '2', '--iters', '1', '--rounds', '1', '--warmup', '0',
            '--round-warmup', '0', '--realistic-per-class', '5', 'FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '32',
            'KRCNN.CONV_HEAD_DIM', '16', 'KRCNN.NUM_STACKED_CONVS', '1', 'TRAIN.RPN_PRE_NMS_TOP_N', '50',
            'TRAIN.RPN_POST_NMS_TOP_N', '50', 'TRAIN.BATCH_SIZE_PER_IM', '16', 'TEST.RPN_PRE_NMS_TOP_N', '30',
            'TEST.RPN_POST_NMS_TOP_N', '30']
    report = cli.main(argv)
    train = [r for r in report.records if r['section'] == 'train']
    test = [r for r in report.records if r['section'] == 'test']
    assert len(train) == 3 and all(r['loss_finite'] for r in train)
    assert len(test) == 4 and all(r['median'] > 0 for r in test)


# --- CenterNet's train_net loop ------------------------------------------------------------------

def test_centernet_loop_runs_train_net_at_the_batch_and_replays_its_window(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    catalog = write_tiny_datasets(tmp_path)
    argv = ['--cfg', 'configs/getting_started/shapes_demo_centernet_res18.yaml', '--mode', 'centernet', 'loops',
            '--loop-parts', 'train', '--catalog', str(catalog), '--train-dataset', *['tiny_train'] * 6,
            '--centernet-batch', '2', '2', '--loop-iters', '5', '--loop-warmup', '2', '--iters', '1',
            '--rounds', '2', '--warmup', '0', '--round-warmup', '0', '--loop-dir', str(tmp_path / 'runs'), '--',
            'CENTERNET.INPUT_RES', '64']
    records = {r['row']: r for r in cli.main(argv).records}
    loop = records['train_net.py on {} (json_stats time)'.format(' + '.join(['tiny_train'] * 6))]
    replayed = records["ours, train_net's batches of iterations 2-4 replayed from memory"]
    bare = records['res_18 train']
    # 48 images at 2 per step: one epoch of 24 iterations, stopped at its first json_stats line past the 5
    # asked (iteration 20), before the epoch's last (23).
    with open(loop['log']) as f:
        log = f.read()
    assert 'SOLVER.MAX_ITER 24 = 1 epochs' in log and '"lr": "0.000000"' in log
    assert [int(s['iter']) for s in logs.json_stats(log)] == [0, 20]
    assert loop['batch'] == replayed['batch'] == bare['batch'] == 2 and len(replayed['rounds']) == 2
    for name, other in (('train_net / its batches replayed from memory, images/s (target >= 0.90)', replayed),
                        ('train_net / res_18 train (synthetic batch), images/s', bare)):
        assert records[name]['median'] == pytest.approx(loop['median'] / other['median'])


def test_the_centernet_loop_times_train_net_only():
    with pytest.raises(ConfigValueError, match='--loop-parts train'):
        cli.parse_args(['--mode', 'centernet', 'loops', '--train-dataset', 'tr', '--test-dataset', 'te'])
