"""The training loop: one process per GPU (or CPU worker), DDP, Detectron's schedule and outputs.

`train_model()` is what tools/train_net.py calls. It starts cfg.NUM_GPUS workers itself, or joins the
job that torchrun / a cluster launcher started (see detectron/utils/distributed.py), and returns the
path of the final model. Every worker builds its own model, data and optimizer from the cfg it is
handed; rank 0 alone writes checkpoints, logs, TensorBoard events and the training-curve PNG.
"""
import collections
import contextlib
import datetime
import itertools
import logging
import math
import os
import time

import numpy as np
import torch

from detectron.core.config import cfg, get_output_dir
from detectron.datasets import dataset_catalog
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer
from detectron.roi_data.loader import aspect_ratio_groups, build_train_loader
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import checkpoint, distributed, lr_policy
from detectron.utils.c2_weights import load_weights
from detectron.utils.errors import ConfigValueError, DetectronError
from detectron.utils.io import cache_url
from detectron.utils.logging import log_json_stats
from detectron.utils.tensorboard import EventWriter
from detectron.utils.training_curves import write_training_curves

logger = logging.getLogger(__name__)

LOG_PERIOD = 20  # Detectron logs json_stats every 20 iterations


class NonFiniteLossError(DetectronError, FloatingPointError):
    """The training loss became NaN or inf."""


def train_model():
    """Train the model described by cfg; returns {'final': path of model_final.pth}."""
    adopt_cfg(cfg)
    output_dir = get_output_dir(cfg.TRAIN.DATASETS, training=True)
    final_path = os.path.join(output_dir, 'model_final.pth')
    if cfg.TRAIN.AUTO_RESUME and os.path.exists(final_path):
        logger.info('model_final.pth exists; no need to train!')
        return {'final': final_path}
    distributed.launch(train_worker, cfg.NUM_GPUS, args=(cfg.clone(),))
    return {'final': final_path}


def adopt_cfg(snapshot):
    """Make this process's global cfg equal to `snapshot` (what a spawned worker received) and
    register the config's custom dataset catalog, so every worker resolves the same dataset names."""
    if snapshot is not cfg:
        cfg.defrost()
        cfg.merge_from_other_cfg(snapshot)
        cfg.freeze()
    if cfg.DATASET_CATALOG:
        dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)


def train_worker(cfg_snapshot):
    adopt_cfg(cfg_snapshot)
    device = distributed.get_device()
    output_dir = get_output_dir(cfg.TRAIN.DATASETS, training=True)
    torch.manual_seed(cfg.RNG_SEED)  # identical init on every rank (DDP also broadcasts rank 0's)
    model = model_builder.create(cfg).to(device)
    # Anchor and RoI sampling draw from torch's generator: give every rank its own stream.
    torch.manual_seed(cfg.RNG_SEED + distributed.get_rank())
    np.random.seed(cfg.RNG_SEED + distributed.get_rank())
    model = with_sync_batchnorm(model, device)
    optimizer = build_optimizer(
        model, base_lr=lr_policy.get_lr_at_iter(0), momentum=cfg.SOLVER.MOMENTUM,
        weight_decay=cfg.SOLVER.WEIGHT_DECAY, weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_GN,
        scale_momentum=cfg.SOLVER.SCALE_MOMENTUM,
        scale_momentum_threshold=cfg.SOLVER.SCALE_MOMENTUM_THRESHOLD,
        log_lr_change_threshold=cfg.SOLVER.LOG_LR_CHANGE_THRESHOLD)
    start_iter = _resume_or_initialise(model, optimizer, output_dir)
    loop = TrainLoop(model, optimizer, device, output_dir, start_iter)
    loop.run()
    loop.save('model_final.pth', cfg.SOLVER.MAX_ITER - 1)


def with_sync_batchnorm(model, device):
    """MODEL.SYNC_BN: the model's BatchNorm layers normalise with statistics over all ranks' images."""
    if not cfg.MODEL.SYNC_BN or distributed.get_world_size() == 1:
        return model
    if device.type != 'cuda':
        # torch's SyncBatchNorm refuses CPU tensors; fail before DDP does with a traceback.
        raise ConfigValueError("MODEL.SYNC_BN True needs CUDA GPUs: torch's SyncBatchNorm does not run on the "
                               "{}; set MODEL.SYNC_BN False for this run".format(device.type))
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _resume_or_initialise(model, optimizer, output_dir):
    """Resume from the newest checkpoint (Detectron's AUTO_RESUME) or initialise from TRAIN.WEIGHTS."""
    last = checkpoint.find_last_checkpoint(output_dir) if cfg.TRAIN.AUTO_RESUME else None
    if last:
        logger.info('========> Resuming from checkpoint %s', last)
        return checkpoint.resume_from(last, model, optimizer, sampler_state={
            'seed': cfg.RNG_SEED, 'global_batch_size': images_per_step()})
    if cfg.TRAIN.WEIGHTS:
        path = cache_url(cfg.TRAIN.WEIGHTS, cfg.DOWNLOAD_CACHE)
        missing, unused = load_weights(model, path)
        logger.info('Initialised from %s (%d model params not in file, %d file blobs unused)',
                    path, len(missing), len(unused))
    return 0


class TrainLoop:
    """Iterations from start_iter to MAX_ITER with gradient accumulation, AMP, logging, checkpoints."""

    def __init__(self, model, optimizer, device, output_dir, start_iter):
        self.device = device
        self.optimizer = optimizer
        self.output_dir = output_dir
        self.start_iter = start_iter
        self.model_without_ddp = model
        self.model = self._wrap_ddp(model)
        self.amp_dtype = {'float16': torch.float16, 'bfloat16': torch.bfloat16}[cfg.SOLVER.AMP.DTYPE]
        self.amp = cfg.SOLVER.AMP.ENABLED
        self.scaler = self._make_scaler()
        self.batches = self._build_batches()
        self.history = []
        self.first_nonfinite = torch.tensor(-1, device=device)
        self.window = collections.defaultdict(lambda: collections.deque(maxlen=LOG_PERIOD))
        self.events = EventWriter(os.path.join(output_dir, 'tensorboard')) \
            if distributed.is_main_process() else None

    def _wrap_ddp(self, model):
        if distributed.get_world_size() == 1:
            return model
        device_ids = [self.device.index] if self.device.type == 'cuda' else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                         broadcast_buffers=False)

    def _make_scaler(self):
        fp16 = self.amp and self.amp_dtype == torch.float16
        if not fp16 or cfg.SOLVER.AMP.LOSS_SCALE > 0:
            return None
        return torch.amp.GradScaler(self.device.type)

    def _build_batches(self):
        roidb = combined_roidb_for_training(cfg.TRAIN.DATASETS, cfg.TRAIN.USE_FLIPPED)
        logger.info('%d roidb entries for training', len(roidb))
        groups = aspect_ratio_groups(roidb) if cfg.TRAIN.ASPECT_GROUPING else [True] * len(roidb)
        sampler = GroupedDistributedBatchSampler(
            groups, cfg.TRAIN.IMS_PER_BATCH, seed=cfg.RNG_SEED, rank=distributed.get_rank(),
            world_size=distributed.get_world_size(), rank_batch_sizes=rank_batch_sizes(),
            start_iter=self.start_iter * cfg.SOLVER.ITER_SIZE)
        loader = build_train_loader(
            roidb, sampler, scales=cfg.TRAIN.SCALES, max_size=cfg.TRAIN.MAX_SIZE,
            pixel_means=cfg.PIXEL_MEANS, stride=cfg.FPN.COARSEST_STRIDE,
            num_workers=cfg.DATA_LOADER.NUM_THREADS, seed=cfg.RNG_SEED,
            start_iter=self.start_iter * cfg.SOLVER.ITER_SIZE)
        batches = iter(loader)
        # Starting a DataLoader draws its workers' base seed from torch's global generator. A resumed
        # run starts it after restoring the RNG states, so that draw is isolated (with the first batch)
        # to keep the random stream of RoI sampling identical to the uninterrupted run's.
        with torch.random.fork_rng(devices=[]):
            first = next(batches)
        return itertools.chain([first], batches)

    def _to_device(self, batch):
        images, im_info, targets = batch
        move = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731
        return move(images), move(im_info), [{k: move(v) for k, v in t.items()} for t in targets]

    def _micro_step(self, batch, sync):
        images, im_info, targets = self._to_device(batch)
        no_sync = getattr(self.model, 'no_sync', None)
        context = contextlib.nullcontext() if sync or no_sync is None else no_sync()
        with context:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp):
                outputs = self.model(images, im_info, targets)
            total = sum(v for k, v in outputs.items() if k.startswith('loss'))
            scaled = total / cfg.SOLVER.ITER_SIZE
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            elif cfg.SOLVER.AMP.LOSS_SCALE > 0 and self.amp:
                scaled = scaled * cfg.SOLVER.AMP.LOSS_SCALE
            scaled.backward()
        return total, outputs

    def _optimizer_step(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return
        if self.amp and cfg.SOLVER.AMP.LOSS_SCALE > 0:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / cfg.SOLVER.AMP.LOSS_SCALE)
        self.optimizer.step()

    def _note_nonfinite(self, total, cur_iter):
        """Remember, on the device and without a host sync, the first iteration whose loss is not finite."""
        bad = ~torch.isfinite(total.detach())
        self.first_nonfinite.masked_fill_(bad & (self.first_nonfinite < 0), cur_iter)

    def _raise_if_nonfinite(self, outputs):
        """Checked before every log line and checkpoint, so a non-finite run never overwrites one."""
        first = int(self.first_nonfinite)
        if first < 0:
            return
        parts = ', '.join('{}={:.4g}'.format(k, float(v.detach())) for k, v in outputs.items()
                          if k.startswith('loss'))
        raise NonFiniteLossError(
            'Loss is not finite since iteration {} (now: {}). The last good checkpoint in {} is intact; '
            'lower SOLVER.BASE_LR or check the data.'.format(first, parts, self.output_dir))

    def run(self):
        self.model.train()
        period = checkpoint_period()
        tic = time.time()
        for cur_iter in range(self.start_iter, cfg.SOLVER.MAX_ITER):
            lr = lr_policy.get_lr_at_iter(cur_iter)
            self.optimizer.set_lr(lr, cur_iter)
            self.optimizer.zero_grad(set_to_none=True)
            for micro in range(cfg.SOLVER.ITER_SIZE):
                total, outputs = self._micro_step(next(self.batches), sync=micro == cfg.SOLVER.ITER_SIZE - 1)
                self._note_nonfinite(total, cur_iter)
            self._optimizer_step()
            checkpoint_now = (cur_iter + 1) % period == 0 and cur_iter > self.start_iter
            last = cur_iter == cfg.SOLVER.MAX_ITER - 1
            if cur_iter % LOG_PERIOD == 0 or checkpoint_now or last:
                self._raise_if_nonfinite(outputs)
            self._record(cur_iter, lr, total, outputs, time.time() - tic)
            tic = time.time()
            if checkpoint_now:
                self.save(checkpoint.checkpoint_name(cur_iter), cur_iter)
        if self.events is not None:
            self.events.close()

    def save(self, name, iteration):
        """Checkpoint on rank 0 with every rank's RNG state (a collective: all ranks call it)."""
        rng_states = checkpoint.gather_rng_states()
        if distributed.is_main_process():
            path = os.path.join(self.output_dir, name)
            sampler_state = {'seed': cfg.RNG_SEED, 'global_batch_size': images_per_step()}
            checkpoint.save_checkpoint(path, self.model_without_ddp, self.optimizer, iteration,
                                       extra={'cfg': cfg.dump()}, rng_states=rng_states,
                                       sampler_state=sampler_state)
            logger.info('Wrote checkpoint %s', path)
            if self.history:
                write_training_curves(os.path.join(self.output_dir, 'training_curves.png'), self.history)
        distributed.synchronize()

    def _record(self, cur_iter, lr, total, outputs, iter_time):
        self.window['time'].append(iter_time)
        self.window['loss'].append(total.detach().float())
        for k, v in outputs.items():
            self.window[k].append(v.detach().float())
        if cur_iter % LOG_PERIOD and cur_iter != cfg.SOLVER.MAX_ITER - 1:
            return
        # Detectron logs the median of the last 20 values, averaged over GPUs.
        medians = {k: torch.stack(list(q)).median() for k, q in self.window.items() if k != 'time'}
        medians = distributed.reduce_dict(medians, average=True)
        if not distributed.is_main_process():
            return
        stats = self._json_stats(cur_iter, lr, medians)
        log_json_stats(stats)
        self.history.append(stats)
        self.events.add_scalars({k: v for k, v in stats.items() if isinstance(v, float)}, cur_iter)
        logger.info('[%d/%d %5.1f%%] loss %.4f lr %.6f eta %s', cur_iter + 1, cfg.SOLVER.MAX_ITER,
                    100.0 * (cur_iter + 1) / cfg.SOLVER.MAX_ITER, stats['loss'], lr, stats['eta'])

    def _json_stats(self, cur_iter, lr, medians):
        mean_time = float(np.mean(self.window['time']))
        eta = datetime.timedelta(seconds=int(mean_time * (cfg.SOLVER.MAX_ITER - cur_iter)))
        stats = {'iter': cur_iter, 'lr': float(lr), 'time': mean_time, 'eta': str(eta),
                 'mb_qsize': 0, 'mem': _max_memory_mib(self.device)}
        stats.update({k: float(v) for k, v in medians.items()})
        return stats


def rank_batch_sizes():
    """Images per micro-batch of every rank, in rank order: TRAIN.RANK_IMS_PER_BATCH, or
    TRAIN.IMS_PER_BATCH on every rank. Each rank's loss weighs the same in DDP's gradient average,
    whatever its batch (as CenterNet's mean of per-GPU losses)."""
    return list(cfg.TRAIN.RANK_IMS_PER_BATCH) or [cfg.TRAIN.IMS_PER_BATCH] * distributed.get_world_size()


def images_per_step():
    """Images of one micro-step over all processes (the sampler's global batch); an optimizer step
    takes SOLVER.ITER_SIZE of them."""
    return sum(rank_batch_sizes())


def checkpoint_period():
    """Detectron's rule: a checkpoint every int(SNAPSHOT_ITERS / NUM_GPUS) iterations."""
    return max(1, int(cfg.TRAIN.SNAPSHOT_ITERS / cfg.NUM_GPUS))


def _max_memory_mib(device):
    if device.type != 'cuda':
        return 0
    return int(math.ceil(torch.cuda.max_memory_allocated(device) / 1024 ** 2))
