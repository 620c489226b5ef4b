#!/usr/bin/env python3
"""Speed of our Faster R-CNN against torchvision's at equal work, in one run on one device.

Our model comes from --cfg (default: KL-Loss's R-50-FPN 2x config: FREEZE_AT 2, frozen affine
norm). The torchvision model it is compared with does the same work: fasterrcnn_resnet50_fpn's
architecture with FrozenBatchNorm2d and 3 trainable backbone layers (conv1 and layer1 frozen, i.e.
what a user with ImageNet weights trains), built with weights=None since nothing is downloaded.
Both get the same synthetic images (--height x --width, no resize), the same boxes per image,
batch, precision and optimizer (Detectron's momentum SGD with its parameter groups), and the RPN /
RoI settings of our cfg. torchvision with BatchNorm in all stages (weights=None's default, the old
benchmark's baseline) is kept as an extra row labelled as the unequal comparison it is.

Sections (--mode):
  train    images/s of full training steps (forward, losses, backward, SGD step), per --batch;
  test     ms/image at batch 1 with post-processing: im_detect_all(model, im) for ours,
           torchvision's model([x]); 6-class models whose box classifier is biased so that a
           "realistic" few hundred candidates per class, or a "loaded" 1000 RoIs x 5 classes, reach
           post-processing; ours with STD_NMS False and True (variance voting);
  profile  a torch.profiler trace of a few training steps of ours and torchvision's at the first
           --batch, and with test of a few realistic inferences (ours with STD_NMS False), summarised
           (--profile is the same as adding it to --mode);
  loops    tools/train_net.py and tools/test_net.py run as subprocesses on real datasets, timed
           from their own logs, next to synthetic rows of the same model, batch, size and precision.
Rows are timed in interleaved rounds (ours, torchvision, ours, ...): each value is the median over
--rounds with min and max, each ratio the median of the per-round ratios. Prints one JSON line per
row and a Markdown table (BENCHMARKS.md describes every row). Examples:
    python tools/benchmark.py --mode train test --batch 2 16
    python tools/benchmark.py --mode profile
    python tools/benchmark.py --mode loops --catalog catalog.json --train-dataset coco_tiny_train \
        --test-dataset coco_tiny_val
    python tools/benchmark.py --height 256 --width 256 --iters 2 --rounds 2    # CPU smoke run
Learning rate: --lr 0 by default. From random init a frozen-norm R-50 diverges within a few dozen
steps (BENCHMARKS.md) and NaN losses would change what top-k and NMS do; lr 0 keeps all the
arithmetic of a step and the losses finite. train_net (--mode loops) refuses lr 0, so its run uses
LOOP_MIN_LR instead: the same arithmetic, weights that move by nothing measurable.
"""
import argparse
import contextlib
import copy
import datetime
import gc
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torchvision
from torchvision.models.detection import FasterRCNN, fasterrcnn_resnet50_fpn
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops.misc import FrozenBatchNorm2d

from detectron.core import test as test_lib
from detectron.core import train_engine
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer
from detectron.roi_data.loader import build_test_loader
from detectron.utils import blob as blob_utils
from detectron.utils import cuda_graphs
from detectron.utils.errors import ConfigValueError, run_tool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16}
# The inference cases: a 6-class model, 5 foreground classes. "Loaded": every RoI scores 0.18 on
# each of them (softmax 0.1 background), so 1000 RoIs x 5 classes reach post-processing.
TEST_NUM_CLASSES = 6
LOADED_CLASSES = 5
LOADED_SCORE = 0.18
UNLOADED_PROB = 1e-9  # classes beyond the loaded ones (81-class weights of the loops section)
SYNC_API_NAMES = ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize')
TOP_KERNELS = 10


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', default='configs/e2e_faster_rcnn_R-50-FPN_2x.yaml')
    parser.add_argument('--mode', nargs='+', default=['train', 'test'],
                        choices=['train', 'test', 'profile', 'loops', 'centernet'])
    parser.add_argument('--profile', action='store_true', help='add the profile section')
    parser.add_argument('--precision', choices=sorted(PRECISIONS), default=None,
                        help='autocast dtype; default bf16 on CUDA, fp32 on the CPU')
    parser.add_argument('--height', type=int, default=800)
    parser.add_argument('--width', type=int, default=1333)
    parser.add_argument('--batch', type=int, nargs='+', default=[2], help='images per training step (one row set each)')
    parser.add_argument('--boxes', type=int, default=8, help='ground-truth boxes per image')
    parser.add_argument('--iters', type=int, default=20, help='timed steps per row and round')
    parser.add_argument('--warmup', type=int, default=5, help='untimed steps per row before the first round')
    parser.add_argument('--round-warmup', type=int, default=1, help='untimed steps per row at the start of a round')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--lr', type=float, default=0.0, help='learning rate of the training steps (see above)')
    parser.add_argument('--realistic-per-class', type=int, default=300,
                        help='candidates per class of the realistic inference case (at most a third of the RoIs)')
    parser.add_argument('--profile-steps', type=int, default=5)
    parser.add_argument('--centernet-batch', type=int, nargs='+', default=[32, 64],
                        help='--mode centernet (with a CenterNet --cfg): training batch, then the inference batch')
    parser.add_argument('--trace-dir', default=None, help='also write the profiler traces (chrome JSON) here')
    loops = parser.add_argument_group('loops section')
    loops.add_argument('--train-dataset', default=None)
    loops.add_argument('--test-dataset', default=None)
    loops.add_argument('--catalog', default=None, help='dataset catalog file (DATASET_CATALOG)')
    loops.add_argument('--loop-iters', type=int, default=200, help="train_net's SOLVER.MAX_ITER")
    loops.add_argument('--loop-warmup', type=int, default=60,
                       help='json_stats lines logged before this iteration are warm-up')
    loops.add_argument('--loop-test-precision', choices=sorted(PRECISIONS), default='fp32',
                       help="precision of the synthetic row compared with test_net (test_net uses no autocast)")
    loops.add_argument('--loop-dir', default=None, help='where the loops write logs and outputs (default: a temp dir)')
    parser.add_argument('opts', nargs=argparse.REMAINDER,
                        help='config overrides KEY VALUE ... (also passed to the loops); after a list option '
                             '(--mode, --batch) separate them with --')
    args = parser.parse_args(argv)
    if args.opts[:1] == ['--']:
        args.opts = args.opts[1:]
    if args.profile and 'profile' not in args.mode:
        args.mode.append('profile')
    if 'loops' in args.mode and not (args.train_dataset and args.test_dataset):
        raise ConfigValueError('--mode loops needs --train-dataset NAME and --test-dataset NAME')
    return args


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------

def spread(values):
    """Median, min and max of a list of numbers."""
    values = [float(v) for v in values]
    return {'median': float(np.median(values)), 'min': min(values), 'max': max(values)}


def per_round_ratios(numerators, denominators):
    """numerators[i] / denominators[i]: rounds are paired, so machine drift cancels per round."""
    if len(numerators) != len(denominators):
        raise ValueError('ratios need the same number of rounds, got {} and {}'.format(
            len(numerators), len(denominators)))
    return [float(a) / float(b) for a, b in zip(numerators, denominators)]


# ---------------------------------------------------------------------------------------------
# Config, devices, inputs
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def cfg_values(values):
    """Temporarily set global cfg keys ({'STD_NMS': True, 'TEST.SCALE': 256, ...})."""
    frozen = cfg.is_frozen()
    cfg.immutable(False)
    saved = {}
    try:
        for key, value in values.items():
            node, leaf = _cfg_node(key)
            saved[key] = node[leaf]
            node[leaf] = value
        yield
    finally:
        for key, value in saved.items():
            node, leaf = _cfg_node(key)
            node[leaf] = value
        cfg.immutable(frozen)


def _cfg_node(key):
    *path, leaf = key.split('.')
    node = cfg
    for name in path:
        node = node[name]
    return node, leaf


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def autocast(device, precision):
    dtype = PRECISIONS[precision]
    return torch.autocast(device_type=device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def synthetic_images(num, height, width, seed):
    rng = np.random.RandomState(seed)
    return rng.randint(0, 256, size=(num, height, width, 3)).astype(np.uint8)


def synthetic_batch(batch, height, width, boxes, num_classes, seed=0):
    """Random images (uint8 BGR) and boxes (xyxy, pixels) with labels 1..num_classes-1."""
    rng = np.random.RandomState(seed)
    images = synthetic_images(batch, height, width, seed)
    xy = rng.uniform(0, [width * 0.7, height * 0.7], size=(batch, boxes, 2))
    wh = rng.uniform(min(32, height / 4), min(300, height / 2), size=(batch, boxes, 2))
    corners = np.concatenate([xy, np.minimum(xy + wh, [width - 1, height - 1])], axis=2)
    labels = rng.randint(1, num_classes, size=(batch, boxes))
    return images, corners.astype(np.float32), labels


def ours_train_inputs(images, boxes, labels, device):
    """The blob our loader would give: mean-subtracted BGR, padded to the coarsest FPN stride."""
    means = np.array(cfg.PIXEL_MEANS, np.float32).reshape(1, 1, 1, 3)
    b, h, w, _ = images.shape
    ph, pw = blob_utils.padded_size(h, w, cfg.FPN.COARSEST_STRIDE)
    blob = np.zeros((b, ph, pw, 3), np.float32)
    blob[:, :h, :w] = images.astype(np.float32) - means
    blob = torch.from_numpy(blob).permute(0, 3, 1, 2).contiguous().to(device)
    im_info = torch.tensor([[h, w, 1.0]] * b, device=device)
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'classes': torch.from_numpy(lb).long().to(device),
                'is_crowd': torch.zeros(len(lb), dtype=torch.bool, device=device)}
               for bx, lb in zip(boxes, labels)]
    return blob, im_info, targets


def torchvision_train_inputs(images, boxes, labels, device):
    """torchvision's API: RGB float images in [0, 1]; it normalises and batches them itself."""
    ims = [torch.from_numpy(im[:, :, ::-1].copy()).permute(2, 0, 1).float().div(255).to(device) for im in images]
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'labels': torch.from_numpy(lb).long().to(device)}
               for bx, lb in zip(boxes, labels)]
    return ims, targets


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def build_ours(device, num_classes=None):
    torch.manual_seed(0)
    with cfg_values({'MODEL.NUM_CLASSES': num_classes or cfg.MODEL.NUM_CLASSES}):
        return model_builder.create(cfg).to(device)


def build_ours_for_training(device, precision):
    """build_ours prepared as train_net prepares it (the model type's prepare_for_training, with
    SOLVER.AMP.ENABLED as the precision says)."""
    with cfg_values({'SOLVER.AMP.ENABLED': precision != 'fp32'}):
        return model_builder.get_model_type(cfg).prepare_for_training(cfg, build_ours(device))


def torchvision_settings(height, width):
    """FasterRCNN keyword arguments from our cfg (with the KL config they are torchvision's
    defaults), so that overriding our RPN / RoI settings keeps the work equal; no resize of
    height x width images."""
    return dict(
        min_size=min(height, width), max_size=max(height, width),
        rpn_pre_nms_top_n_train=cfg.TRAIN.RPN_PRE_NMS_TOP_N, rpn_post_nms_top_n_train=cfg.TRAIN.RPN_POST_NMS_TOP_N,
        rpn_pre_nms_top_n_test=cfg.TEST.RPN_PRE_NMS_TOP_N, rpn_post_nms_top_n_test=cfg.TEST.RPN_POST_NMS_TOP_N,
        rpn_nms_thresh=cfg.TRAIN.RPN_NMS_THRESH, rpn_fg_iou_thresh=cfg.TRAIN.RPN_POSITIVE_OVERLAP,
        rpn_bg_iou_thresh=cfg.TRAIN.RPN_NEGATIVE_OVERLAP, rpn_batch_size_per_image=cfg.TRAIN.RPN_BATCH_SIZE_PER_IM,
        rpn_positive_fraction=cfg.TRAIN.RPN_FG_FRACTION, box_score_thresh=cfg.TEST.SCORE_THRESH,
        box_nms_thresh=cfg.TEST.NMS, box_detections_per_img=cfg.TEST.DETECTIONS_PER_IM,
        box_fg_iou_thresh=cfg.TRAIN.FG_THRESH, box_bg_iou_thresh=cfg.TRAIN.BG_THRESH_HI,
        box_batch_size_per_image=cfg.TRAIN.BATCH_SIZE_PER_IM, box_positive_fraction=cfg.TRAIN.FG_FRACTION,
        bbox_reg_weights=tuple(cfg.MODEL.BBOX_REG_WEIGHTS))


def torchvision_equal_work(num_classes, **settings):
    """fasterrcnn_resnet50_fpn as built with ImageNet weights: FrozenBatchNorm2d, layer2-4 trainable
    (conv1 and layer1 frozen, our FREEZE_AT 2), but random weights."""
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name='resnet50', weights=None, norm_layer=FrozenBatchNorm2d,
                                   trainable_layers=3)
    return FasterRCNN(backbone, num_classes=num_classes, **settings)


def torchvision_all_stages_bn(num_classes, **settings):
    """weights=None's fasterrcnn_resnet50_fpn: BatchNorm2d with batch statistics, every stage
    trainable; more work than our FREEZE_AT 2 model (the unequal comparison)."""
    torch.manual_seed(0)
    return fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=num_classes, **settings)


def trainable_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def loaded_class_probs(num_classes, num_loaded=LOADED_CLASSES, score=LOADED_SCORE):
    """Softmax target of the loaded case: classes 1..num_loaded (at most all foreground classes)
    `score`, background the rest, any further class (nearly) 0."""
    num_loaded = min(num_loaded, num_classes - 1)
    background = 1.0 - num_loaded * score
    if num_loaded < 1 or background <= 0:
        raise ConfigValueError('the loaded case needs 2 or more classes and {} x {} < 1'.format(num_loaded, score))
    probs = np.full(num_classes, UNLOADED_PROB)
    probs[0] = background
    probs[1:num_loaded + 1] = score
    return probs


def realistic_class_head(features, num_classes, per_class, score_thresh, seed=0):
    """(weight, bias) of a box classifier under which about per_class RoIs of every foreground
    class score above score_thresh on these box-head features (R, D).

    Each foreground logit is a random projection of the features scaled to unit spread, plus a
    common shift found by bisection (every foreground probability grows with the shift), so the
    candidates vary with the RoI as a trained model's do.
    """
    x = features.detach().double().cpu()
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(x.shape[1], num_classes - 1, generator=gen, dtype=torch.float64)
    z = x @ proj
    mean, std = z.mean(0), z.std(0).clamp_min(1e-12)
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64)
    weight[1:] = (proj / std).T
    base = torch.zeros(num_classes, dtype=torch.float64)
    base[1:] = -mean / std
    foreground = torch.arange(num_classes) > 0
    target = per_class * (num_classes - 1)

    def candidates(shift):
        probs = torch.softmax(x @ weight.T + base + shift * foreground, dim=1)
        return int((probs[:, 1:] > score_thresh).sum())

    low, high = -60.0, 60.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if candidates(mid) < target else (low, mid)
    return weight.float(), (base + high * foreground).float()


def set_box_classifier(cls_score, box_regressors, weight, bias):
    """Box classifier <- (weight, bias); regressors <- 0, so every class's box is its RoI and
    KL's sigmas are 1: post-processing sees exactly the candidates the classifier lets through."""
    with torch.no_grad():
        cls_score.weight.copy_(weight)
        cls_score.bias.copy_(bias)
        for layer in box_regressors:
            layer.weight.zero_()
            layer.bias.zero_()


def set_loaded_classifier(cls_score, box_regressors, num_classes):
    bias = torch.as_tensor(np.log(loaded_class_probs(num_classes)), dtype=torch.float32)
    set_box_classifier(cls_score, box_regressors, torch.zeros_like(cls_score.weight), bias)


def ours_box_layers(model):
    outs = model.box_outs
    return outs.cls_score, [layer for layer in (outs.bbox_pred, outs.bbox_pred_std) if layer is not None]


def torchvision_box_layers(model):
    predictor = model.roi_heads.box_predictor
    return predictor.cls_score, [predictor.bbox_pred]


def capture(module, run, pick, pre=False):
    """pick(inputs) (pre=True) or pick(output) of the module's last call while run() runs."""
    seen = []
    if pre:
        handle = module.register_forward_pre_hook(lambda m, inputs: seen.append(pick(inputs)))
    else:
        handle = module.register_forward_hook(lambda m, inputs, output: seen.append(pick(output)))
    try:
        run()
    finally:
        handle.remove()
    return seen[-1]


# ---------------------------------------------------------------------------------------------
# Interleaved timing
# ---------------------------------------------------------------------------------------------

@dataclass
class Row:
    """One timed configuration: section 'train' values are images/s, 'test' values ms/image."""
    section: str
    name: str
    step: Callable[[], object]
    images_per_step: int
    resident: Callable[[], list] = list  # this row's tensors that stay allocated between rounds
    graph_owners: Callable[[], list] = list  # modules whose CUDA graphs (and their memory) the row holds
    cfg: dict = field(default_factory=dict)  # global cfg values while the row runs
    info: dict = field(default_factory=dict)  # facts measured once (RoIs, candidates, ...)
    after: Callable[[], dict] = dict  # facts read after the rounds (were the losses finite?)
    values: list = field(default_factory=list)
    peaks_mib: list = field(default_factory=list)
    # Timed steps per round instead of --iters: a row replaying a loop's inputs times whole passes
    # over them, so that every input counts once per round whatever the round's first input.
    steps_per_round: int = None

    def value(self, elapsed, iters):
        if self.section == 'train':
            return self.images_per_step * iters / elapsed
        return 1000.0 * elapsed / (iters * self.images_per_step)

    @property
    def unit(self):
        return 'images/s' if self.section == 'train' else 'ms/image'


def run_interleaved(rows, rounds, iters, warmup, round_warmup, device, clock=time.perf_counter):
    """Warm every row up, then `rounds` rounds in which each row in turn runs round_warmup untimed
    and `iters` (or its steps_per_round) timed steps between device synchronisations; fills
    row.values and, on CUDA, row.peaks_mib."""
    for row in rows:
        with cfg_values(row.cfg):
            for _ in range(warmup):
                row.step()
    for _ in range(rounds):
        for row in rows:
            with cfg_values(row.cfg):
                others = _start_memory_window(row, device)
                for _ in range(round_warmup):
                    row.step()
                steps = row.steps_per_round or iters
                sync(device)
                tic = clock()
                for _ in range(steps):
                    row.step()
                sync(device)
                row.values.append(row.value(clock() - tic, steps))
                if others is not None:
                    row.peaks_mib.append((torch.cuda.max_memory_allocated(device) - others) / 2 ** 20)


def _start_memory_window(row, device):
    """Resets the peak and returns the bytes held by everything but this row (the other rows'
    models stay allocated while rows interleave): the peak minus them is this row's; None off CUDA."""
    if device.type != 'cuda':
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    held = _cuda_bytes(row.resident()) + _graph_pool_bytes(row.graph_owners())
    return torch.cuda.memory_allocated(device) - held


def _graph_pool_bytes(owners):
    """Bytes in use in the memory pools of the owners' CUDA graphs, captured during a row's warm-up
    and held by it between steps like its tensors."""
    pools = {pool for owner in owners for pool in cuda_graphs.graph_pools(owner)}
    return pool_bytes(pools, torch.cuda.memory_snapshot()) if pools else 0


def pool_bytes(pools, segments):
    """Allocated bytes of the memory_snapshot() segments that belong to the given pools."""
    return sum(s['allocated_size'] for s in segments if tuple(s['segment_pool_id']) in pools)


def _cuda_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or not t.is_cuda or t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()
    return total


def _model_tensors(model, optimizer=None):
    tensors = list(model.parameters()) + list(model.buffers()) + [p.grad for p in model.parameters()]
    if optimizer is not None:
        tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return tensors


def _flat_tensors(nested):
    if torch.is_tensor(nested):
        return [nested]
    if isinstance(nested, dict):
        nested = list(nested.values())
    if isinstance(nested, (list, tuple)):
        return [t for item in nested for t in _flat_tensors(item)]
    return []


def free_device_memory(device):
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()


def in_turn(step_on, items, prime):
    """A step calling step_on on the items one after another, round and round (prime: after one
    untimed pass over all of them, as a loop meets each input shape before its timed part)."""
    for item in items if prime else ():
        step_on(item)
    items_in_turn = itertools.cycle(items)
    return lambda: step_on(next(items_in_turn))


# ---------------------------------------------------------------------------------------------
# Training rows
# ---------------------------------------------------------------------------------------------

def train_row(name, model, batches, box_head, batch, device, precision, lr, prime=False):
    """Steps of zero_grad, forward under autocast, sum of the losses, backward, optimizer step, on
    the input tuples of `batches` in turn (prime: one untimed pass over all of them first, as a
    training run meets each batch shape before its timed window). Both models get Detectron's
    momentum SGD with its parameter groups (our train_net's)."""
    model.train()
    optimizer = build_optimizer(model, base_lr=lr, momentum=cfg.SOLVER.MOMENTUM, weight_decay=cfg.SOLVER.WEIGHT_DECAY)
    last = {}

    def step_on(inputs):
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            losses = model(*inputs)
        total = sum(v for k, v in losses.items() if k.startswith('loss'))
        total.backward()
        optimizer.step()
        last['loss'] = total.detach()

    step = in_turn(step_on, batches, prime)
    rois = capture(box_head, step, lambda box_inputs: box_inputs[0].shape[0], pre=True)
    return Row('train', name, step, batch,
               resident=lambda: _model_tensors(model, optimizer) + _flat_tensors(batches),
               graph_owners=lambda: [model],
               info={'box_rois_per_image': rois / batch, 'trainable_params': trainable_parameters(model)},
               after=lambda: {'loss_finite': bool(torch.isfinite(last['loss']))})


def ours_train_row(args, batch, height, width, boxes, device, precision):
    images, gt_boxes, labels = synthetic_batch(batch, height, width, boxes, cfg.MODEL.NUM_CLASSES)
    ours = build_ours_for_training(device, precision)
    name = 'ours ({}, FREEZE_AT {})'.format(os.path.basename(args.cfg), cfg.TRAIN.FREEZE_AT)
    return train_row(name, ours, [ours_train_inputs(images, gt_boxes, labels, device)], ours.box_head,
                     batch, device, precision, args.lr)


def build_train_rows(args, batch, device, precision):
    """ours, torchvision at equal work, torchvision with BatchNorm everywhere (unequal)."""
    num_classes = cfg.MODEL.NUM_CLASSES
    images, gt_boxes, labels = synthetic_batch(batch, args.height, args.width, args.boxes, num_classes)
    tv_inputs = torchvision_train_inputs(images, gt_boxes, labels, device)
    settings = torchvision_settings(args.height, args.width)
    rows = [ours_train_row(args, batch, args.height, args.width, args.boxes, device, precision)]
    for name, build in (('torchvision, FrozenBN, 3 trainable layers (equal work)', torchvision_equal_work),
                        ('torchvision, BatchNorm in all stages (UNEQUAL: more work)', torchvision_all_stages_bn)):
        model = build(num_classes, **settings).to(device)
        rows.append(train_row(name, model, [tv_inputs], model.roi_heads.box_head, batch, device, precision, args.lr))
    return rows


def train_ratios(rows):
    ours, equal, unequal = rows
    return [('ours / torchvision equal work (speed-up)', ours, equal),
            ('ours / torchvision all-stages BN (UNEQUAL comparison)', ours, unequal)]


# ---------------------------------------------------------------------------------------------
# Inference rows
# ---------------------------------------------------------------------------------------------

def ours_detect(model, image, device, precision):
    with autocast(device, precision):
        return test_lib.im_detect_all(model, image)


def torchvision_detect(model, image, device, precision):
    """torchvision's whole inference: upload, RGB float, its transform, forward, post-processing."""
    with torch.no_grad(), autocast(device, precision):
        x = torch.from_numpy(image[:, :, ::-1].copy()).to(device).permute(2, 0, 1).float().div(255)
        out = model([x])[0]
    return {k: v.cpu() for k, v in out.items()}


def ours_test_facts(model, image, device, precision):
    with autocast(device, precision):
        scores = test_lib.im_detect_bbox(model, image, cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)[0]
    detections = sum(len(b) for b in ours_detect(model, image, device, precision)[1:])
    return {'rois': int(scores.shape[0]), 'candidates': int((scores[:, 1:] > cfg.TEST.SCORE_THRESH).sum()),
            'detections': int(detections)}


def torchvision_test_facts(model, image, device, precision):
    out = {}
    logits = capture(model.roi_heads.box_predictor,
                     lambda: out.update(torchvision_detect(model, image, device, precision)), lambda o: o[0])
    probs = torch.softmax(logits.float(), dim=1)
    return {'rois': int(probs.shape[0]),
            'candidates': int((probs[:, 1:] > model.roi_heads.score_thresh).sum()),
            'detections': int(out['boxes'].shape[0])}


def ours_test_row(name, model, image, device, precision, cfg_overrides):
    with cfg_values(cfg_overrides):
        facts = ours_test_facts(model, image, device, precision)
    return Row('test', name, lambda: ours_detect(model, image, device, precision), 1,
               resident=lambda: _model_tensors(model), graph_owners=lambda: [model], cfg=cfg_overrides, info=facts)


def torchvision_test_row(name, model, image, device, precision):
    return Row('test', name, lambda: torchvision_detect(model, image, device, precision), 1,
               resident=lambda: _model_tensors(model), info=torchvision_test_facts(model, image, device, precision))


def ours_test_name(case, std_nms):
    return 'ours, {}, STD_NMS {}'.format(case, std_nms)


def torchvision_test_name(case):
    return 'torchvision (equal work), {}'.format(case)


def calibrate_realistic(box_layers, box_head, run, per_class, score_thresh):
    """Bias this model's classifier so that about per_class RoIs per class pass score_thresh."""
    features = capture(box_head, run, lambda out: out.detach().float())
    per_class = min(per_class, features.shape[0] // 3)
    weight, bias = realistic_class_head(features, TEST_NUM_CLASSES, per_class, score_thresh)
    set_box_classifier(*box_layers, weight.to(features.device), bias.to(features.device))


def build_test_rows(args, device, precision):
    """Realistic and loaded cases on 6-class models; ours with STD_NMS False and True."""
    h, w = args.height, args.width
    image = synthetic_images(1, h, w, seed=1)[0]
    # No resize of the h x w image, as torchvision's min_size / max_size below.
    base = {'TEST.SCALE': min(h, w), 'TEST.MAX_SIZE': max(h, w), 'MODEL.NUM_CLASSES': TEST_NUM_CLASSES}
    std_options = [False, True] if cfg.PRED_STD else [False]
    ours = build_ours(device, TEST_NUM_CLASSES).eval()
    tv = torchvision_equal_work(TEST_NUM_CLASSES, **torchvision_settings(h, w)).to(device).eval()
    rows, ratios = [], []
    for case in ('realistic', 'loaded'):
        ours_case, tv_case = copy.deepcopy(ours), copy.deepcopy(tv)
        if case == 'realistic':
            with cfg_values(dict(base, STD_NMS=False)):
                calibrate_realistic(ours_box_layers(ours_case), ours_case.box_head,
                                    lambda: ours_detect(ours_case, image, device, precision),
                                    args.realistic_per_class, cfg.TEST.SCORE_THRESH)
            calibrate_realistic(torchvision_box_layers(tv_case), tv_case.roi_heads.box_head,
                                lambda: torchvision_detect(tv_case, image, device, precision),
                                args.realistic_per_class, tv_case.roi_heads.score_thresh)
        else:
            set_loaded_classifier(*ours_box_layers(ours_case), TEST_NUM_CLASSES)
            set_loaded_classifier(*torchvision_box_layers(tv_case), TEST_NUM_CLASSES)
        ours_rows = [ours_test_row(ours_test_name(case, std), ours_case, image, device, precision,
                                   dict(base, STD_NMS=std)) for std in std_options]
        tv_row = torchvision_test_row(torchvision_test_name(case), tv_case, image, device, precision)
        rows += ours_rows + [tv_row]
        ratios.append(('torchvision ms / ours ms (STD_NMS False), {}: our speed-up'.format(case), tv_row, ours_rows[0]))
        if len(ours_rows) > 1:
            ratios.append(('ours STD_NMS True / False, {} (cost of variance voting)'.format(case),
                           ours_rows[1], ours_rows[0]))
    return rows, ratios


# ---------------------------------------------------------------------------------------------
# Profile
# ---------------------------------------------------------------------------------------------

def profile_row(row, steps, warmup, device, trace_path=None):
    """Profile `steps` steps of a row after `warmup` (at least 1) unprofiled ones; returns
    summarise_profile's numbers (the wall time is that under the profiler)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with cfg_values(row.cfg):
        for _ in range(max(1, warmup)):
            row.step()
        sync(device)
        with torch.profiler.profile(activities=activities) as prof:
            tic = time.perf_counter()
            for _ in range(steps):
                row.step()
            sync(device)
            wall = time.perf_counter() - tic
    if trace_path:
        prof.export_chrome_trace(trace_path)
    events = [(e.name, e.device_type == torch.autograd.DeviceType.CUDA, e.time_range.start, e.time_range.end)
              for e in prof.events()]
    return summarise_profile(events, steps, wall)


def summarise_profile(events, steps, wall_s):
    """events: (name, on_gpu, start_us, end_us). GPU busy time is the union of the GPU events'
    intervals (kernels, copies, memsets); host synchronisations are the runtime's *Synchronize
    calls (a .item() or a D2H copy to pageable memory ends in cudaStreamSynchronize)."""
    gpu = sorted((start, end, name) for name, on_gpu, start, end in events if on_gpu)
    busy, reach = 0.0, float('-inf')
    for start, end, _ in gpu:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    per_kernel = {}
    for start, end, name in gpu:
        total, calls = per_kernel.get(name, (0.0, 0))
        per_kernel[name] = (total + end - start, calls + 1)
    top = sorted(per_kernel.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    wall_ms = 1000.0 * wall_s / steps
    return {
        'wall_ms_per_step': wall_ms,
        'gpu_busy_ms_per_step': busy / 1000.0 / steps,
        'gpu_busy_fraction': busy / 1000.0 / steps / wall_ms if wall_ms else 0.0,
        'gpu_kernel_sum_ms_per_step': sum(end - start for start, end, _ in gpu) / 1000.0 / steps,
        'gpu_ops_per_step': len(gpu) / steps,
        'host_syncs_per_step': sum(name.startswith(SYNC_API_NAMES) for name, on_gpu, _, _ in events if not on_gpu) / steps,
        'd2h_copies_per_step': sum('DtoH' in name for _, _, name in gpu) / steps,
        'top_kernels': [{'name': name, 'ms_per_step': total / 1000.0 / steps, 'calls_per_step': calls / steps}
                        for name, (total, calls) in top],
    }


def trace_path(args, name):
    """Where the profiler trace of `name` goes (--trace-dir), or None."""
    if not args.trace_dir:
        return None
    os.makedirs(args.trace_dir, exist_ok=True)
    return os.path.join(args.trace_dir, 'trace_{}.json'.format(name))


def profile_train_rows(rows, args, device, report, context):
    for name, row in zip(('ours', 'torchvision'), rows):
        trace = trace_path(args, 'train_' + name)
        report.add_profile(row.name, profile_row(row, args.profile_steps, args.warmup, device, trace), **context)


def profile_test_rows(rows, args, device, report):
    """The realistic case's inference, ours (STD_NMS False) and torchvision's, one image per step."""
    by_name = {row.name: row for row in rows}
    for name, row_name in (('ours', ours_test_name('realistic', False)),
                           ('torchvision', torchvision_test_name('realistic'))):
        row = by_name[row_name]
        report.add_profile(row.name, profile_row(row, args.profile_steps, args.warmup, device,
                                                 trace_path(args, 'test_' + name)),
                           batch=1, size=[args.height, args.width])


# ---------------------------------------------------------------------------------------------
# CenterNet (--mode centernet, --cfg a CenterNet config): training step, inference at batch 1 and B
# ---------------------------------------------------------------------------------------------

def centernet_rows(args, device, precision):
    """Training images/s at the first --centernet-batch (Adam, ctdet targets of random boxes on
    random images, built once); inference ms/image with the whole detector (forward, flip as
    configured, decode on the device, inverse affine, merge to cls_boxes) at batch 1 (detect) and at
    the second batch (detect_batch), on a prepared 640x480 image; and at the second batch the
    network and decode alone (forward_decode of inputs already on the device)."""
    from detectron.modeling import centernet, centernet_builder
    from detectron.roi_data.centernet import ctdet_train_sample
    train_batch, test_batch = (args.centernet_batch + args.centernet_batch[-1:])[:2]
    res = cfg.CENTERNET.INPUT_RES
    model = build_ours_for_training(device, precision)
    params = centernet_builder.ctdet_params(cfg)
    rng = np.random.RandomState(0)
    images = synthetic_images(train_batch, res, res, 0)
    samples = []
    for im in images:
        xy = rng.uniform(0, res * 0.7, size=(args.boxes, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(16, res * 0.3, size=(args.boxes, 2))], 1).astype(np.float32)
        samples.append(ctdet_train_sample(im, boxes, rng.randint(0, params.num_classes, args.boxes), rng, params))
    inputs, targets = centernet_builder.collate_samples(samples)
    inputs, targets = inputs.to(device), {k: v.to(device) for k, v in targets.items()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    model.train()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = model(inputs, targets)['loss']
        loss.backward()
        optimizer.step()

    test = centernet_builder.test_params(cfg)
    sample = centernet.prepare_test_image(synthetic_images(1, 480, 640, 1)[0], test)
    # The detect rows' own copy, switched to eval and prepared once as test_net's: model.eval() walks
    # every module (about 0.3-0.7 ms on these hosts), which a per-call switch would add to each image.
    test_model = model_builder.get_model_type(cfg).prepare_for_inference(cfg, copy.deepcopy(model).eval())

    def detect_one():
        with autocast(device, precision):
            centernet.detect(test_model, sample, test)

    batch_samples = [sample] * test_batch

    def detect_many():
        with autocast(device, precision):
            centernet.detect_batch(test_model, batch_samples, test)

    # The network and the decode alone, of inputs already on the device (no upload, no host
    # post-processing): what detect_batch adds to them is the difference of the rows.
    device_inputs = torch.as_tensor(np.concatenate([sample['inputs'][0]] * test_batch)).to(device)

    def forward_decode():
        with torch.no_grad(), autocast(device, precision):
            centernet.forward_decode(test_model, device_inputs, test)

    resident = lambda: (_model_tensors(model, optimizer) + _model_tensors(test_model)  # noqa: E731
                        + _flat_tensors([inputs, targets, device_inputs]))
    arch = cfg.CENTERNET.ARCH
    held = dict(resident=resident, graph_owners=lambda: [model, test_model])
    return [Row('train', '{} train'.format(arch), train_step, train_batch, **held),
            Row('test', '{} detect (decode, post-process)'.format(arch), detect_one, 1, **held),
            Row('test', '{} detect_batch (decode, post-process)'.format(arch), detect_many, test_batch,
                info={'inference_batch': test_batch}, **held),
            Row('test', '{} forward + decode only, inputs on the device'.format(arch), forward_decode, test_batch,
                info={'inference_batch': test_batch}, **held)]


def run_centernet(args, precision, report, timing):
    device = timing['device']
    rows = centernet_rows(args, device, precision)
    run_interleaved(rows, **timing)
    res = cfg.CENTERNET.INPUT_RES
    for row in rows:
        report.add_row(row, batch=row.images_per_step, precision=precision, size=[res, res])
    if 'profile' in args.mode:
        trace = trace_path(args, 'train_centernet')
        report.add_profile(rows[0].name, profile_row(rows[0], args.profile_steps, args.warmup, device, trace),
                           batch=rows[0].images_per_step, precision=precision)


# ---------------------------------------------------------------------------------------------
# Real loops: train_net / test_net as subprocesses, timed from their logs
# ---------------------------------------------------------------------------------------------

_IM_DETECT = re.compile(r'im_detect:.*?(\d+)/(\d+)\s+([0-9.]+)s \+ ([0-9.]+)s')
LOOP_TEST_WARMUP_IMAGES = 10


def json_stats(log_text):
    """The dicts of a training log's `json_stats: {...}` lines."""
    return [json.loads(line.split('json_stats:', 1)[1]) for line in log_text.splitlines() if 'json_stats:' in line]


def train_log_images_per_s(stats, global_batch, warmup_iter):
    """global_batch / 'time' (seconds per iteration) of each json_stats line at iteration >= warmup_iter."""
    times = [float(s['time']) for s in stats if int(s['iter']) >= warmup_iter]
    if not times:
        raise ConfigValueError('the training log has no json_stats line at iteration >= {}: raise --loop-iters '
                               'or lower --loop-warmup'.format(warmup_iter))
    return [global_batch / t for t in times]


def train_log_data_fraction(stats, warmup_iter):
    """Median over the json_stats lines at iteration >= warmup_iter of data_time / time: the share of
    an iteration spent waiting for the loader (None for logs without data_time)."""
    fractions = [float(s['data_time']) / float(s['time']) for s in stats
                 if int(s['iter']) >= warmup_iter and 'data_time' in s]
    return float(np.median(fractions)) if fractions else None


def test_log_ms_per_image(log_text, warmup_images=LOOP_TEST_WARMUP_IMAGES):
    """ms per image after the first warmup_images, from test_net's running means (`im_detect: ...
    done/total <detector s>s + <rest of the loop s>s`): (mean_b * n_b - mean_a * n_a) / (n_b - n_a)
    between the first line past the warm-up and the last, of their sum, of the detector's and of the
    rest of the loop's. Returns (the sum's, the last line's running mean of the sum, the detector's,
    the rest's), all in ms."""
    points = [(int(done), float(det), float(misc)) for done, _, det, misc in _IM_DETECT.findall(log_text)]
    start = next((p for p in points if p[0] > warmup_images), None)
    if start is None or points[-1][0] <= start[0]:
        raise ConfigValueError('the test log has too few im_detect lines past image {}: use a test dataset of '
                               'at least {} images'.format(warmup_images, warmup_images + 12))
    (n_a, det_a, misc_a), (n_b, det_b, misc_b) = start, points[-1]
    detector, rest = (1000.0 * (b * n_b - a * n_a) / (n_b - n_a) for a, b in ((det_a, det_b), (misc_a, misc_b)))
    return detector + rest, 1000.0 * (det_b + misc_b), detector, rest


def dataset_shape(name, scale, max_size):
    """Median original and resized (h, w) and mean non-crowd boxes per image of a COCO-format dataset."""
    with open(dataset_catalog.get_ann_fn(name)) as f:
        coco = json.load(f)
    heights = np.array([im['height'] for im in coco['images']])
    widths = np.array([im['width'] for im in coco['images']])
    scales = np.array([blob_utils.resize_scale(h, w, scale, max_size) for h, w in zip(heights, widths)])
    boxes = sum(1 for a in coco['annotations'] if not a.get('iscrowd', 0))
    return {'images': len(heights), 'height': int(np.median(heights)), 'width': int(np.median(widths)),
            'resized_height': int(np.median(np.round(heights * scales))),
            'resized_width': int(np.median(np.round(widths * scales))),
            'boxes_per_image': boxes / len(heights)}


def run_logged(tool, tool_args, log_path):
    """Run tools/<tool> with this checkout first on the path; returns its log text."""
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get('PYTHONPATH')) if p))
    with open(log_path, 'w') as log:
        code = subprocess.call([sys.executable, os.path.join(REPO, 'tools', tool)] + tool_args, cwd=REPO,
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    with open(log_path) as log:
        text = log.read()
    if code != 0:
        raise RuntimeError('{} exited with status {}; its log is {}'.format(tool, code, log_path))
    return text


def _dataset_arg(name):
    return "('{}',)".format(name)


LOOP_MIN_LR = 1e-12


def run_train_net(args, work, batch, precision):
    """train_net.py from random init (TRAIN.WEIGHTS '') for --loop-iters iterations at lr --lr
    (LOOP_MIN_LR for --lr 0, which train_net rejects)."""
    return run_logged('train_net.py', ['-c', os.path.abspath(args.cfg), '--skip-test'] + _loop_opts(args) + [
        'TRAIN.DATASETS', _dataset_arg(args.train_dataset), 'TRAIN.IMS_PER_BATCH', str(batch),
        'SOLVER.MAX_ITER', str(args.loop_iters), 'SOLVER.BASE_LR', str(args.lr or LOOP_MIN_LR), 'TRAIN.WEIGHTS', "''",
        'TRAIN.SNAPSHOT_ITERS', '100000000', 'SOLVER.AMP.ENABLED', str(precision != 'fp32'),
        'SOLVER.AMP.DTYPE', 'bfloat16', 'OUTPUT_DIR', os.path.join(work, 'train')],
        os.path.join(work, 'train_net.log'))


def run_test_net(args, work, weights):
    return run_logged('test_net.py', ['-c', os.path.abspath(args.cfg)] + _loop_opts(args) + [
        'TEST.WEIGHTS', weights, 'OUTPUT_DIR', os.path.join(work, 'test')], os.path.join(work, 'test_net.log'))


def _loop_opts(args):
    opts = list(args.opts) + ['NUM_GPUS', '1', 'TEST.DATASETS', _dataset_arg(args.test_dataset)]
    if args.catalog:
        opts += ['DATASET_CATALOG', os.path.abspath(args.catalog)]
    return opts


def train_net_batches(args, batch, device):
    """The batches train_net's loader gives in the timed window (iterations --loop-warmup to
    --loop-iters - 1): the same dataset, config, sampler seed and order, collated and pinned, then
    on the device as train_net's engine puts them there (model_type.batch_to_device)."""
    with cfg_values({'TRAIN.DATASETS': (args.train_dataset,), 'TRAIN.IMS_PER_BATCH': batch}):
        model_type = model_builder.get_model_type(cfg)
        batches = train_engine.training_batches(model_type, 0, device)
        on_device = model_type.batch_to_device(cfg, device)
        return [on_device(b) for b in itertools.islice(batches, args.loop_warmup, args.loop_iters)]


def replayed_train_row(args, batch, device, precision):
    """Our training step on train_net's own batches, held on the device: the same work as train_net
    without its loader, logging and checkpoints (one pass over them before timing, as train_net
    met each batch shape before its window)."""
    batches = train_net_batches(args, batch, device)
    ours = build_ours_for_training(device, precision)
    name = "ours, train_net's batches of iterations {}-{} replayed from memory".format(
        args.loop_warmup, args.loop_iters - 1)
    row = train_row(name, ours, batches, ours.box_head, batch, device, precision, args.lr, prime=True)
    row.steps_per_round = len(batches)
    return row


def test_net_samples(args):
    """The test dataset's images as test_net's loader workers prepare them, in test_net's order."""
    roidb = JsonDataset(args.test_dataset).get_roidb()
    loader = build_test_loader(roidb, range(len(roidb)), cfg.DATA_LOADER.NUM_THREADS,
                               model_builder.get_model_type(cfg).test_inputs(cfg))
    return [sample for sample, _ in loader]


def replayed_test_row(args, model, device):
    """test_net's detection on its own images, prepared in advance and taken in turn (one pass over
    all of them before timing, as test_net meets each size before most of its images)."""
    detect = model_builder.get_model_type(cfg).detector(cfg)
    samples = test_net_samples(args)

    def detect_on(sample):
        with autocast(device, args.loop_test_precision):
            return detect(model, sample)

    return Row('test', "ours, loaded weights, test_net's {} images replayed from memory".format(len(samples)),
               in_turn(detect_on, samples, prime=True), 1, resident=lambda: _model_tensors(model),
               graph_owners=lambda: [model], steps_per_round=len(samples))


def write_loaded_weights(path):
    """Our model (cfg's classes) whose classifier passes every RoI on 5 classes, saved for
    test_net: its post-processing work then does not depend on the images. Returns the model."""
    model = build_ours(torch.device('cpu')).eval()
    set_loaded_classifier(*ours_box_layers(model), cfg.MODEL.NUM_CLASSES)
    torch.save({'model': model.state_dict()}, path)
    return model


def run_loops(args, device, precision, report):
    """train_net and test_net on real datasets vs synthetic rows of the same model, batch and size."""
    if args.loop_dir:
        os.makedirs(args.loop_dir, exist_ok=True)
    # A fresh directory every run: train_net would resume from a model_final.pth left in OUTPUT_DIR.
    work = tempfile.mkdtemp(prefix='benchmark_loops_', dir=args.loop_dir)
    if args.catalog:
        dataset_catalog.register_catalog_file(args.catalog)
    batch = args.batch[0]
    train_shape = dataset_shape(args.train_dataset, cfg.TRAIN.SCALES[0], cfg.TRAIN.MAX_SIZE)
    test_shape = dataset_shape(args.test_dataset, cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)
    weights = os.path.join(work, 'loaded_weights.pth')
    loaded = write_loaded_weights(weights)

    stats = json_stats(run_train_net(args, work, batch, precision))
    train_net = Row('train', 'train_net.py on {} (json_stats time)'.format(args.train_dataset), None, batch,
                    values=train_log_images_per_s(stats, batch, args.loop_warmup),
                    # json_stats 'mem': max_memory_allocated in MiB (0 off CUDA), the peak column
                    peaks_mib=[max(float(s.get('mem', 0)) for s in stats)],
                    info={'iters': args.loop_iters, 'data_time_fraction': train_log_data_fraction(stats, args.loop_warmup),
                          'log': os.path.join(work, 'train_net.log')})
    test_ms, running_mean_ms, detector_ms, rest_ms = test_log_ms_per_image(run_test_net(args, work, weights))
    test_net = Row('test', 'test_net.py on {} (im_detect lines), loaded weights'.format(args.test_dataset), None, 1,
                   values=[test_ms], info={'running_mean_ms_incl_first_images': running_mean_ms,
                                           'detector_ms': detector_ms, 'rest_of_loop_ms': rest_ms,
                                           'log': os.path.join(work, 'test_net.log')})

    replayed_train = replayed_train_row(args, batch, device, precision)
    replayed_test = replayed_test_row(args, copy.deepcopy(loaded).to(device), device)
    train_hw = [train_shape['resized_height'], train_shape['resized_width']]
    synthetic_train = ours_train_row(args, batch, *train_hw, max(1, round(train_shape['boxes_per_image'])),
                                     device, precision)
    synthetic_train.name += ', synthetic {}x{}'.format(*train_hw)
    test_hw = [test_shape['height'], test_shape['width']]
    synthetic_test = ours_test_row('ours, loaded weights, synthetic {}x{} image resized as in test_net'.format(
        *test_hw), loaded.to(device), synthetic_images(1, *test_hw, seed=1)[0], device,
        args.loop_test_precision, {})
    run_interleaved([replayed_train, synthetic_train, replayed_test, synthetic_test], args.rounds, args.iters,
                    args.warmup, args.round_warmup, device)

    datasets = {'train_dataset': dict(train_shape, name=args.train_dataset),
                'test_dataset': dict(test_shape, name=args.test_dataset)}
    report.add_row(train_net, batch=batch, precision=precision, size=None, **datasets)
    report.add_row(replayed_train, batch=batch, precision=precision, size=None)
    report.add_row(synthetic_train, batch=batch, precision=precision, size=train_hw)
    report.add_row(test_net, batch=1, precision="test_net's own", size=None, **datasets)
    report.add_row(replayed_test, batch=1, precision=args.loop_test_precision, size=None)
    report.add_row(synthetic_test, batch=1, precision=args.loop_test_precision, size=test_hw)
    # Not interleaved (a subprocess cannot be): ratios of the medians. Against the loop's own inputs
    # replayed from memory, the loop's cost (loading, augmentation, logging) is all that differs: the
    # issue's targets. Against one synthetic size, the dataset's mix of sizes counts too.
    train_net_median = spread(train_net.values)['median']
    report.add_ratio('train_net / its batches replayed from memory, images/s (target >= 0.90)',
                     [train_net_median / spread(replayed_train.values)['median']])
    report.add_ratio('train_net / synthetic at the median size, images/s (size mix included)',
                     [train_net_median / spread(synthetic_train.values)['median']])
    report.add_ratio('test_net / its images replayed from memory, ms per image (target <= 1.15)',
                     [test_ms / spread(replayed_test.values)['median']])
    report.add_ratio('test_net / synthetic at the median size, ms per image (size mix and content included)',
                     [test_ms / spread(synthetic_test.values)['median']])


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def git_commit():
    try:
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ('+uncommitted' if dirty else '')


def run_meta(argv, device):
    return {'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
            'device': torch.cuda.get_device_name(device) if device.type == 'cuda'
            else 'cpu ({} threads)'.format(torch.get_num_threads()),
            'torch': torch.__version__, 'torchvision': torchvision.__version__, 'commit': git_commit(),
            'command': 'python tools/benchmark.py ' + shlex.join(argv)}


class Report:
    """JSON lines as rows finish, and the Markdown tables at the end."""

    def __init__(self, meta):
        self.meta = meta
        self.records = []

    def _emit(self, record):
        record = dict(self.meta, **record)
        self.records.append(record)
        print(json.dumps(record), flush=True)

    def add_row(self, row, **context):
        self._emit(dict(section=row.section, row=row.name, unit=row.unit, rounds=row.values, **spread(row.values),
                        peak_mem_mib=max(row.peaks_mib) if row.peaks_mib else None, **row.info, **row.after(),
                        **context))

    def add_ratio(self, name, ratios):
        self._emit(dict(section='ratio', row=name, unit='x', rounds=ratios, **spread(ratios)))

    def add_profile(self, name, summary, **context):
        self._emit(dict(section='profile', row=name, **summary, **context))

    def markdown(self):
        m = self.meta
        lines = ['{}, {}, torch {}, torchvision {}, commit {}'.format(
                     m['date'], m['device'], m['torch'], m['torchvision'], m['commit']),
                 '`{}`'.format(m['command']), '',
                 '| section | row | batch | precision | size | median | min | max | unit | peak MiB | notes |',
                 '|---|---|---|---|---|---|---|---|---|---|---|']
        for r in self.records:
            if r['section'] != 'profile':
                lines.append('| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |'.format(
                    r['section'], r['row'], r.get('batch', ''), r.get('precision', ''),
                    'x'.join(map(str, r['size'])) if r.get('size') else '', _fmt(r['median']), _fmt(r['min']),
                    _fmt(r['max']), r['unit'], _fmt(r.get('peak_mem_mib')), _notes(r)))
        profiles = [r for r in self.records if r['section'] == 'profile']
        if profiles:
            lines += ['', '| profiled row | wall ms/step | GPU busy ms/step | GPU busy | kernel sum ms/step '
                      '| GPU ops/step | host syncs/step | D2H copies/step |', '|---|---|---|---|---|---|---|---|']
            lines += ['| {} | {} | {} | {:.0%} | {} | {} | {} | {} |'.format(
                r['row'], _fmt(r['wall_ms_per_step']), _fmt(r['gpu_busy_ms_per_step']), r['gpu_busy_fraction'],
                _fmt(r['gpu_kernel_sum_ms_per_step']), _fmt(r['gpu_ops_per_step']), _fmt(r['host_syncs_per_step']),
                _fmt(r['d2h_copies_per_step'])) for r in profiles]
            lines += ['', '| profiled row | top GPU kernels | ms/step | calls/step |', '|---|---|---|---|']
            lines += ['| {} | `{}` | {} | {} |'.format(r['row'], k['name'][:90], _fmt(k['ms_per_step']),
                                                       _fmt(k['calls_per_step']))
                      for r in profiles for k in r['top_kernels']]
        return '\n'.join(lines)


def _fmt(value):
    if value is None:
        return ''
    return '{:.4g}'.format(value)


def _notes(record):
    keys = ('box_rois_per_image', 'trainable_params', 'loss_finite', 'rois', 'candidates', 'detections',
            'data_time_fraction', 'detector_ms', 'rest_of_loop_ms')
    notes = ['{} {}'.format(k, _fmt(record[k]) if isinstance(record[k], float) else record[k])
             for k in keys if record.get(k) is not None]
    if record['section'] == 'ratio' and len(record['rounds']) > 1:
        notes.append('median of {} per-round ratios'.format(len(record['rounds'])))
    return ', '.join(notes)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def main(argv):
    args = parse_args(argv)
    merge_cfg_from_file(args.cfg)
    merge_cfg_from_list(args.opts)
    assert_and_infer_cfg()
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True  # both sides of the comparisons with torchvision
    precision = args.precision or ('bf16' if device.type == 'cuda' else 'fp32')
    report = Report(run_meta(argv, device))
    timing = dict(rounds=args.rounds, iters=args.iters, warmup=args.warmup, round_warmup=args.round_warmup,
                  device=device)
    if 'centernet' in args.mode:
        run_centernet(args, precision, report, timing)
    else:
        run_rcnn_sections(args, precision, report, timing)
    print('\n' + report.markdown(), flush=True)
    return report


def run_rcnn_sections(args, precision, report, timing):
    """--mode train / test / profile / loops with an R-CNN --cfg."""
    device = timing['device']
    if 'train' in args.mode or 'profile' in args.mode:
        for i, batch in enumerate(args.batch):
            rows = build_train_rows(args, batch, device, precision)
            context = dict(batch=batch, precision=precision, size=[args.height, args.width], boxes=args.boxes)
            if 'train' in args.mode:
                run_interleaved(rows, **timing)
                for row in rows:
                    report.add_row(row, **context)
                for name, numerator, denominator in train_ratios(rows):
                    report.add_ratio('{}, batch {}'.format(name, batch),
                                     per_round_ratios(numerator.values, denominator.values))
            if 'profile' in args.mode and i == 0:
                profile_train_rows(rows[:2], args, device, report, context)
            del rows
            free_device_memory(device)
    if 'test' in args.mode:
        rows, ratios = build_test_rows(args, device, precision)
        run_interleaved(rows, **timing)
        for row in rows:
            report.add_row(row, batch=1, precision=precision, size=[args.height, args.width])
        for name, numerator, denominator in ratios:
            report.add_ratio(name, per_round_ratios(numerator.values, denominator.values))
        if 'profile' in args.mode:
            profile_test_rows(rows, args, device, report)
        del rows, ratios
        free_device_memory(device)
    if 'loops' in args.mode:
        # The loops' in-process rows autotune cuDNN as train_net / test_net do: as the config says.
        with cudnn_autotuning(cfg.CUDNN_BENCHMARK):
            run_loops(args, device, precision, report)


@contextlib.contextmanager
def cudnn_autotuning(enabled):
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


if __name__ == '__main__':
    run_tool(main, sys.argv[1:])
