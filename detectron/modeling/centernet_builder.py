"""cfg -> CenterNet ctdet (MODEL.TYPE centernet): the model, its training samples (affine crop,
colour jitter, heatmap targets, built in the loader workers), its epoch schedule and per-GPU chunk
sizes, its test-time detector and how CenterNet / ImageNet weight files map onto it."""
import functools
import logging

import numpy as np
import torch

from detectron.checkpoint.c2_weights import require_weights_file
from detectron.checkpoint.c2_weights import load_weights as load_port_weights
from detectron.checkpoint.centernet_weights import (is_centernet_checkpoint, load_centernet_checkpoint,
                                                    load_imagenet_backbone, load_port_checkpoint)
from detectron.checkpoint.checkpointer import Retention
from detectron.checkpoint.torch_file import read_torch_file
from detectron.datasets.json_dataset_evaluator import ResultsFormat
from detectron.modeling import centernet, centernet_export
from detectron.modeling.centernet_backbones import build_centernet_backbone, check_centernet_arch, check_deconv_filters
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.modeling.model_type import Exporter, ModelType, checkpoint_setting, register_model_type, train_cuda_graphs
from detectron.roi_data.centernet import CtdetParams, centernet_roidb, ctdet_train_sample, ctdet_val_sample
from detectron.roi_data.loader import TrainingDataset, to_device
from detectron.roi_data.minibatch import read_entry_image
from detectron.roi_data.samplers import check_chunk_sizes, chunk_sizes
from detectron.roi_data.shared_memory import stacked_batch
from detectron.utils.derived_keys import Derivation
from detectron.utils.errors import ConfigValueError, DatasetError

logger = logging.getLogger(__name__)

# CenterNet's coco.py convert_eval_format: w = x2 - x1, boxes and scores rounded to 2 decimals.
CENTERNET_RESULTS = ResultsFormat(box_width_offset=0.0, decimals=2, dtype=np.float32)

# Stacked as they are; the heatmaps 'hm' travel sparse (collate_samples).
_STACKED_TARGET_KEYS = ('reg_mask', 'ind', 'wh', 'reg', 'cat_spec_wh', 'cat_spec_mask')
_JITTER_KEYS = ('jitter_order', 'jitter_alphas', 'jitter_lighting')


# The roidb fields a training or validation sample is made from (height and width: the decoded image is
# checked against them).
_SAMPLE_KEYS = ('image', 'height', 'width', 'boxes', 'classes')


@register_model_type('centernet')
class CenterNetType(ModelType):
    def check(self):
        cfg = self.cfg
        c = cfg.CENTERNET
        check_centernet_arch(c.ARCH)
        check_deconv_filters(c.ARCH, c.DECONV_FILTERS)
        if c.NUM_CLASSES < 1:
            raise ConfigValueError('CENTERNET.NUM_CLASSES must be at least 1 (heatmaps, no background), '
                                   'got {}'.format(c.NUM_CLASSES))
        if c.INPUT_RES % 32 or c.DOWN_RATIO != 4:
            raise ConfigValueError('CENTERNET.INPUT_RES must be a multiple of 32 and CENTERNET.DOWN_RATIO 4 '
                                   '(the backbones have stride 4), got {} and {}'.format(c.INPUT_RES, c.DOWN_RATIO))
        if cfg.TEST.DETECTIONS_PER_IM < 1:
            raise ConfigValueError('TEST.DETECTIONS_PER_IM must be at least 1 with MODEL.TYPE centernet (its merge keeps '
                                   'the n best; 0, no cap, is for R-CNN), got {}'.format(cfg.TEST.DETECTIONS_PER_IM))
        if not c.TEST_SCALES or min(c.TEST_SCALES) <= 0:
            raise ConfigValueError('CENTERNET.TEST_SCALES must hold scales > 0, got {}'.format(c.TEST_SCALES))
        if c.NUM_EPOCHS < 1:
            raise ConfigValueError('CENTERNET.NUM_EPOCHS must be at least 1, got {}'.format(c.NUM_EPOCHS))
        if cfg.MODEL.MASK_ON:
            raise ConfigValueError('MODEL.MASK_ON True asks for Mask R-CNN\'s mask head, which CenterNet (ctdet) does '
                                   'not have: set MODEL.MASK_ON False, or MODEL.TYPE generalized_rcnn for masks')
        if cfg.TEST.BBOX_AUG.ENABLED or cfg.TEST.MASK_AUG.ENABLED:
            raise ConfigValueError('TEST.BBOX_AUG / TEST.MASK_AUG ENABLED asks for R-CNN\'s test-time augmentation; '
                                   'CenterNet augments with CENTERNET.TEST_SCALES and CENTERNET.FLIP_TEST')
        if cfg.TRAIN.FREEZE_CONV_BODY:
            raise ConfigValueError('TRAIN.FREEZE_CONV_BODY True freezes an R-CNN body; CenterNet trains its whole '
                                   'network, as CenterNet does: set it to False')
        rank_chunks(cfg)

    def derive_training_cfg(self, typed):
        return derive_training_cfg(self.cfg, typed)

    def checkpoint_retention(self, lr_change_iters):
        # CenterNet's main.py: model_last.pth overwritten every epoch, model_<epoch>.pth kept at each
        # LR step (the weights before the drop).
        return Retention(last=True, milestones=frozenset(it - 1 for it in lr_change_iters),
                         keep=self.cfg.TRAIN.KEEP_CHECKPOINTS)

    def build(self):
        c = self.cfg.CENTERNET
        backbone = build_centernet_backbone(c.ARCH, checkpoint_activations=self.cfg.TRAIN.CHECKPOINT_ACTIVATIONS,
                                            deconv_filters=c.DECONV_FILTERS)
        heads = {'hm': c.NUM_CLASSES, 'wh': 2 * c.NUM_CLASSES if c.CAT_SPEC_WH else 2}
        if c.REG_OFFSET:
            heads['reg'] = 2
        init = 'dla' if c.ARCH.startswith('dla') else 'resdcn' if c.ARCH.startswith('resdcn') else 'msra'
        head_conv = c.HEAD_CONV if c.HEAD_CONV >= 0 else (256 if 'dla' in c.ARCH else 64)
        loss_weights = centernet.LossWeights(hm=c.HM_WEIGHT, wh=c.WH_WEIGHT, off=c.OFF_WEIGHT,
                                             reg_offset=c.REG_OFFSET, cat_spec_wh=c.CAT_SPEC_WH)
        graph_shapes = self.cfg.TRAIN.CUDA_GRAPHS_MAX_SHAPES if train_cuda_graphs(self.cfg) else 0
        return centernet.CenterNet(backbone, CenterNetHeads(backbone.out_channels, heads, head_conv, init),
                                   loss_weights, train_max_graphs=graph_shapes)

    def output_classes(self):
        return self.cfg.CENTERNET.NUM_CLASSES + 1

    def load_weights(self, model, path):
        return load_weights(model, path, self.cfg.CENTERNET.ARCH)

    def training_roidb(self):
        cfg = self.cfg
        roidb = centernet_roidb(cfg.TRAIN.DATASETS)
        if not any(len(entry['boxes']) for entry in roidb):
            # CenterNet would train its heatmap towards all zeros, its size and offset losses 0.
            raise DatasetError('No training images with annotations in TRAIN.DATASETS {}: none of the {} images '
                               'has a box; check the annotation files'.format(tuple(cfg.TRAIN.DATASETS), len(roidb)))
        return roidb

    def training_dataset(self, roidb, device):
        params = ctdet_params(self.cfg, device)
        return TrainingDataset(roidb, functools.partial(prepare_training_sample, params=params),
                               seed=self.cfg.RNG_SEED, keys=_SAMPLE_KEYS, batch_input=_batch_input(params))

    def collate(self, device):
        return collate_samples

    def batch_to_device(self, device):
        params = ctdet_params(self.cfg, device)
        return functools.partial(_batch_to_device, device=device, mean=params.mean, std=params.std)

    def validation_dataset(self, device):
        # CenterNet's val split: the whole image at the input resolution, no flip, jitter or colour.
        cfg = self.cfg
        params = ctdet_params(cfg, device)
        return TrainingDataset(centernet_roidb(cfg.TEST.DATASETS),
                               functools.partial(prepare_validation_sample, params=params), seed=cfg.RNG_SEED,
                               keys=_SAMPLE_KEYS, batch_input=_batch_input(params))

    def validation_losses(self):
        return _validation_losses

    def best_metric(self):
        # CenterNet keeps model_best.pth by the validation loss (--val_intervals, --metric loss).
        return ('val/loss', 'min') if self.cfg.TEST.VAL_LOSS_PERIOD > 0 else ('bbox/AP', 'max')

    def test_inputs(self):
        return functools.partial(centernet.prepare_test_image, params=test_params(self.cfg))

    def detector(self):
        return functools.partial(centernet.detect, params=test_params(self.cfg))

    def batch_detector(self):
        return functools.partial(centernet.detect_runs, params=test_params(self.cfg))

    def exporter(self, model):
        params = test_params(self.cfg)
        centernet_export.check_exportable(params)
        return Exporter(centernet_export.CenterNetGraph(model, params), centernet_export.graph_inputs,
                        functools.partial(centernet_export.graph_detections, params=params),
                        centernet_export.CENTERNET_INPUT_NAMES, centernet_export.CENTERNET_OUTPUT_NAMES, {},
                        contested=functools.partial(centernet_export.contested_detections, params=params))

    def training_run_opts(self, datasets, batch, iterations, base_lr):
        # CENTERNET keys, from which the schedule is derived (a typed SOLVER key would contradict a
        # config's CENTERNET one): whole epochs, the one process taking the whole batch.
        per_epoch = len(centernet_roidb(datasets)) // batch
        if per_epoch < 1:
            raise ConfigValueError('TRAIN.DATASETS {} hold fewer images than one batch of {}'.format(
                tuple(datasets), batch))
        lr = base_lr * self.cfg.CENTERNET.LR_BATCH_SIZE / batch
        return ['TRAIN.DATASETS', str(tuple(datasets)), 'CENTERNET.BATCH_SIZE', str(batch),
                'CENTERNET.MASTER_BATCH_SIZE', '-1', 'CENTERNET.CHUNK_SIZES', '()',
                'CENTERNET.NUM_EPOCHS', str(-(-iterations // per_epoch)), 'CENTERNET.LR', repr(lr)]

    def prepare_for_training(self, model):
        # Under autocast on CUDA, the trunk and heads stored channels_last as for inference: cuDNN's
        # bfloat16 convolutions and BatchNorm's channels_last kernels need no layout conversions
        # (BENCHMARKS.md, "CenterNet speed"); the whole model channels_last is slower, since
        # grid_sample reads NCHW. bfloat16 autocast on the CPU: oneDNN's bfloat16 convolutions work
        # in NHWC, so the model stored channels_last spares their conversions (BENCHMARKS.md,
        # "CPU demos"). float32 keeps NCHW (float32 CPU kernels round differently in NHWC).
        cfg = self.cfg
        device = next(model.parameters()).device.type
        if cfg.SOLVER.AMP.ENABLED and device == 'cuda':
            model.use_channels_last()
        elif cfg.SOLVER.AMP.ENABLED and cfg.SOLVER.AMP.DTYPE == 'bfloat16' and device == 'cpu':
            model.to(memory_format=torch.channels_last)
        return model

    def prepare_for_inference(self, model):
        if next(model.parameters()).device.type == 'cuda':
            model.use_channels_last()
        return model

    def memory_settings(self, training):
        cfg = self.cfg
        c = cfg.CENTERNET
        if not training:
            batch = ['lower TEST.IMS_PER_BATCH {}'.format(cfg.TEST.IMS_PER_BATCH)] if cfg.TEST.IMS_PER_BATCH > 1 else []
            return '; '.join(batch + ['fewer or smaller CENTERNET.TEST_SCALES {}'.format(tuple(c.TEST_SCALES))]
                             + ['CENTERNET.{} False'.format(key) for key in ('FLIP_TEST', 'CUDA_GRAPHS') if c[key]])
        chunks = rank_chunks(cfg)
        share = ('CENTERNET.CHUNK_SIZES {}'.format(tuple(chunks)) if c.CHUNK_SIZES else
                 'CENTERNET.MASTER_BATCH_SIZE {} (rank 0 takes {} of the {} images)'.format(
                     c.MASTER_BATCH_SIZE, chunks[0], c.BATCH_SIZE))
        batch = ('lower {} or CENTERNET.BATCH_SIZE {}; raise SOLVER.ITER_SIZE {} to accumulate the batch over '
                 'more steps'.format(share, c.BATCH_SIZE, cfg.SOLVER.ITER_SIZE))
        return '; '.join([batch] + checkpoint_setting(cfg))

    def results_format(self):
        return CENTERNET_RESULTS


def ctdet_params(cfg, device=None):
    """The samples' CtdetParams; for training on `device` (a torch.device), the input normalised there
    with CENTERNET.NORMALIZE_ON_DEVICE on a GPU."""
    c = cfg.CENTERNET
    return CtdetParams(input_h=c.INPUT_RES, input_w=c.INPUT_RES, down_ratio=c.DOWN_RATIO, num_classes=c.NUM_CLASSES,
                       max_objs=c.MAX_OBJS, mean=tuple(c.MEAN), std=tuple(c.STD), flip=c.FLIP,
                       rand_crop=not c.NOT_RAND_CROP, scale=c.SCALE, shift=c.SHIFT, color_aug=not c.NO_COLOR_AUG,
                       cat_spec_wh=c.CAT_SPEC_WH, reg_offset=c.REG_OFFSET,
                       input_on_device=c.NORMALIZE_ON_DEVICE and device is not None and device.type == 'cuda')


def test_params(cfg):
    c = cfg.CENTERNET
    return centernet.TestParams(input=ctdet_params(cfg), scales=tuple(c.TEST_SCALES), flip=c.FLIP_TEST,
                                keep_res=c.KEEP_RES, nms=c.NMS, K=c.K, max_per_image=cfg.TEST.DETECTIONS_PER_IM,
                                cuda_graphs=c.CUDA_GRAPHS)


def _batch_input(params):
    # The loader writes each image's input into its row of the batch (TrainingDataset's batch_input).
    if params.input_on_device:
        return (params.input_h, params.input_w, 3), torch.uint8
    return (3, params.input_h, params.input_w), torch.float32


def prepare_training_sample(entry, rng, params, out=None):
    return ctdet_train_sample(read_entry_image(entry), entry['boxes'], entry['classes'], rng, params, out)


def prepare_validation_sample(entry, rng, params, out=None):
    """CenterNet's val-split sample (ctdet_val_sample: no augmentation, so rng is not drawn from)."""
    return ctdet_val_sample(read_entry_image(entry), entry['boxes'], entry['classes'], params, out)


def _validation_losses(model, batch):
    """CenterNet's validation: the losses of the model in eval mode (BatchNorm's running statistics)."""
    model.eval()
    try:
        with torch.no_grad():
            return model(*batch)
    finally:
        model.train()


def collate_samples(samples):
    """Stacked ctdet samples -> (images (B, 3, H, W), targets {name: (B, ...)}) for model(images, targets);
    samples whose input is left to the device (CtdetParams.input_on_device) -> (uint8 images (B, H, W,
    3), targets, their stacked jitter_* arrays), which _batch_to_device turns into the former.

    The heatmaps travel as their nonzero entries (centernet.sparse_heatmap_targets; the model
    scatters them back): a dense (B, classes, H/4, W/4) float32 batch is mostly zeros, 168 MB for 32
    COCO images at 512 px, and copying it to pinned memory held the GPU back."""
    images = stacked_batch([s['input'] for s in samples])
    targets = {k: stacked_batch([s[k] for s in samples]) for k in _STACKED_TARGET_KEYS if k in samples[0]}
    targets.update(centernet.sparse_heatmap_targets([s['hm'] for s in samples], [s['hm_nonzero'] for s in samples]))
    if 'jitter_order' not in samples[0]:
        return images, targets
    return images, targets, {k: stacked_batch([s[k] for s in samples]) for k in _JITTER_KEYS}


def _batch_to_device(batch, device, mean, std):
    """The batch on the training device; uint8 images with their jitter draws are jittered and
    normalised there (centernet.normalize_training_images)."""
    if len(batch) == 2:
        return to_device(batch, device)
    images, targets, jitter = to_device(batch, device)
    return centernet.normalize_training_images(images, jitter, mean, std), targets


def rank_chunks(cfg):
    """CenterNet's per-GPU batches for NUM_GPUS (the launched world size): CENTERNET.CHUNK_SIZES,
    or derived from BATCH_SIZE and MASTER_BATCH_SIZE exactly as CenterNet; checked."""
    c = cfg.CENTERNET
    if cfg.NUM_GPUS < 1:
        raise ConfigValueError('NUM_GPUS must be at least 1, got {}'.format(cfg.NUM_GPUS))
    if any(size != int(size) for size in c.CHUNK_SIZES):
        raise ConfigValueError('CENTERNET.CHUNK_SIZES must hold whole numbers of images per GPU, got {}'.format(
            tuple(c.CHUNK_SIZES)))
    chunks = [int(size) for size in c.CHUNK_SIZES] or chunk_sizes(c.BATCH_SIZE, c.MASTER_BATCH_SIZE, cfg.NUM_GPUS)
    check_chunk_sizes(chunks, c.BATCH_SIZE, c.MASTER_BATCH_SIZE, cfg.NUM_GPUS)
    return chunks


def derive_training_cfg(cfg, typed):
    """CenterNet's schedule in Detectron's keys, from CENTERNET.* and the training-set size, for every
    key the user left untyped (typed: {full key: where it was typed}; utils/derived_keys.py):
    per-rank batches (TRAIN.RANK_IMS_PER_BATCH) = the chunk sizes; iterations per epoch = images //
    (BATCH_SIZE x SOLVER.ITER_SIZE) (CenterNet's loader drops the last partial batch; ITER_SIZE 1
    unless typed); SOLVER.MAX_ITER = NUM_EPOCHS epochs; after an LR_STEP epoch e the LR is BASE_LR x
    0.1 ** (LR_STEP.index(e) + 1) until the next one (main.py's rule, also for repeated or unordered
    epochs); SOLVER.BASE_LR = CENTERNET.LR x the images per step / LR_BATCH_SIZE (CenterNet's "1.25e-4
    for batch 32", linearly scaled); no warm-up, no weight decay (CenterNet's Adam); a checkpoint every
    epoch (CenterNet's model_last.pth). A typed key that contradicts a typed CENTERNET key it would be
    derived from is a ConfigValueError naming both. Returns the lines to show."""
    c = cfg.CENTERNET
    if cfg.SOLVER.REFERENCE_WORLD_BATCH > 0:
        raise ConfigValueError('SOLVER.REFERENCE_WORLD_BATCH rescales a Detectron schedule; CenterNet derives its '
                               'schedule from CENTERNET.LR/BATCH_SIZE/NUM_EPOCHS: set it to 0')
    derive = Derivation(cfg, typed, "CenterNet's epoch schedule")
    chunks = rank_chunks(cfg)
    batch_keys = ('CENTERNET.BATCH_SIZE', 'CENTERNET.MASTER_BATCH_SIZE', 'CENTERNET.CHUNK_SIZES')
    derive.value('TRAIN.RANK_IMS_PER_BATCH', tuple(chunks), batch_keys, strict=True)
    derive.value('TRAIN.IMS_PER_BATCH', chunks[0], batch_keys, strict=True)
    iter_size = derive.value('SOLVER.ITER_SIZE', 1)
    num_images = len(centernet_roidb(cfg.TRAIN.DATASETS))
    per_epoch = num_images // (c.BATCH_SIZE * max(iter_size, 1))
    if per_epoch < 1:
        raise ConfigValueError('TRAIN.DATASETS {} hold {} images, fewer than one iteration (CENTERNET.BATCH_SIZE {} x '
                               'SOLVER.ITER_SIZE {}); lower the batch size'.format(
                                   tuple(cfg.TRAIN.DATASETS), num_images, c.BATCH_SIZE, iter_size))
    derive.value('TRAIN.SNAPSHOT_ITERS', per_epoch * cfg.NUM_GPUS)
    if c.VAL_INTERVALS > 0:
        derive.value('TEST.VAL_LOSS_PERIOD', c.VAL_INTERVALS * per_epoch, ('CENTERNET.VAL_INTERVALS',))
    max_iter = derive.value('SOLVER.MAX_ITER', c.NUM_EPOCHS * per_epoch, ('CENTERNET.NUM_EPOCHS',))
    base_lr = derive.value('SOLVER.BASE_LR', c.LR * c.BATCH_SIZE * iter_size / c.LR_BATCH_SIZE,
                           ('CENTERNET.LR', 'CENTERNET.LR_BATCH_SIZE'))
    # main.py drops the LR after finishing epoch e in lr_step (epochs count from 1): one in the last
    # epoch or beyond changes nothing, one below 1 is never reached.
    drops = sorted({epoch for epoch in c.LR_STEP if 1 <= epoch < c.NUM_EPOCHS})
    derive.value('SOLVER.LR_POLICY', 'steps_with_lrs', ('CENTERNET.LR_STEP',))
    steps = derive.value('SOLVER.STEPS', [0] + [epoch * per_epoch for epoch in drops], ('CENTERNET.LR_STEP',))
    # Typed steps drop the LR x0.1 each, as Detectron's steps_with_decay.
    factors = [0.1 ** (list(c.LR_STEP).index(epoch) + 1) for epoch in drops] \
        if 'SOLVER.STEPS' not in typed else [0.1 ** i for i in range(1, len(steps))]
    lrs = derive.value('SOLVER.LRS', [base_lr] + [base_lr * factor for factor in factors],
                       ('CENTERNET.LR_STEP', 'CENTERNET.LR'))
    derive.value('SOLVER.WARM_UP_ITERS', 0)
    derive.value('SOLVER.WEIGHT_DECAY', 0.0)
    if cfg.SOLVER.OPTIMIZER != 'adam':
        logger.warning("SOLVER.OPTIMIZER is %r: CenterNet trains with Adam ('adam')", cfg.SOLVER.OPTIMIZER)
    accumulated = ' x SOLVER.ITER_SIZE {}'.format(iter_size) if iter_size != 1 else ''
    return [
        'CenterNet: {} training images // CENTERNET.BATCH_SIZE {}{} = {} iterations per epoch; SOLVER.MAX_ITER {} '
        '= {:g} epochs'.format(num_images, c.BATCH_SIZE, accumulated, per_epoch, max_iter, max_iter / per_epoch),
        'CenterNet: per-GPU batches (chunk sizes) {}'.format(chunks),
        'CenterNet: LR after epochs {} (SOLVER.STEPS {}): SOLVER.LRS {}; SOLVER.BASE_LR {:g} (CENTERNET.LR {:g} x '
        'BATCH_SIZE {}{} / LR_BATCH_SIZE {})'.format(tuple(c.LR_STEP), list(steps), ['{:g}'.format(lr) for lr in lrs],
                                                     base_lr, c.LR, c.BATCH_SIZE, accumulated, c.LR_BATCH_SIZE),
        derive.summary(),
    ]


def load_weights(model, path, arch):
    """Our own .pth (a 'model' state dict), a CenterNet checkpoint ({'epoch', 'state_dict'} or its
    bare state dict with reference names) or an ImageNet backbone file; returns (missing, unused)."""
    if not str(path).endswith('.pth'):
        return load_port_weights(model, path)  # reports what it cannot read
    require_weights_file(path)
    content = read_torch_file(path)  # read once; digest-checked; one sentence for a bad file
    if isinstance(content, dict) and isinstance(content.get('model'), dict):
        return load_port_checkpoint(model, path, content['model'])
    if is_centernet_checkpoint(content):
        return load_centernet_checkpoint(model, path, content)
    return load_imagenet_backbone(model.backbone, path, arch, content)
