"""Training: one process per GPU (or CPU worker), DDP, Detectron's schedule and outputs, any model.

`train_model()` is what tools/train_net.py calls. It starts cfg.NUM_GPUS workers itself, or joins the
job that torchrun / a cluster launcher started (see detectron/utils/comm.py), and returns the
path of the final model. `train_worker` builds the model type once from the cfg it is handed
(model_builder.build_model_type) and, through it, the model, optimizer, LR schedule and batch
source, and hands them to `TrainLoop`, which knows nothing about the model (detectron2's
SimpleTrainer shape). Rank 0 alone
writes checkpoints, logs, TensorBoard events and the training-curve PNG.
"""
import collections
import contextlib
import datetime
import inspect
import itertools
import logging
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from detectron.checkpoint import checkpointer
from detectron.checkpoint.download import cache_url
from detectron.checkpoint.weights_fit import check_weights_fit
from detectron.core import launch, run_lock
from detectron.core.config import cfg, get_output_dir, images_per_iter
from detectron.core.config_finalize import receive_cfg
from detectron.modeling import model_builder
from detectron.modeling.optimizer import DetectronSGD, build_optimizer, load_momentum, lr_change_ratio, set_lr
from detectron.ops import triton_cache
from detectron.roi_data.loader import build_train_loader, to_device
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, DetectronError
from detectron.utils.logging import log_file, log_json_stats
from detectron.utils.lr_policy import LRSchedule
from detectron.utils.memory import out_of_memory_error
from detectron.utils.tensorboard import EventWriter
from detectron.utils.training_curves import write_training_curves

logger = logging.getLogger(__name__)

LOG_PERIOD = 20  # Detectron logs json_stats every 20 iterations
# Seconds per iteration measured on the host, logged as means (the losses as medians): the whole
# iteration, and the part spent waiting for the loader's next batch (detectron2's data_time).
_HOST_TIMES = ('time', 'data_time')

# Buffers (BN statistics, rank 0's saved) are not re-broadcast before every forward. torch >= 2.14
# names this forward_sync_buffers (broadcast_buffers warns there); the GPU machines' 2.11 does not.
_NO_FORWARD_BUFFER_SYNC = ({'forward_sync_buffers': False} if 'forward_sync_buffers' in
                           inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                           else {'broadcast_buffers': False})


class NonFiniteLossError(DetectronError, FloatingPointError):
    """The training loss became NaN or inf."""


def train_model():
    """Train the model described by the finished cfg; returns {'final': path of model_final.pth}."""
    output_dir = get_output_dir(cfg.TRAIN.DATASETS, training=True)
    final_path = os.path.join(output_dir, 'model_final.pth')
    if cfg.TRAIN.AUTO_RESUME and os.path.exists(final_path):
        logger.info('model_final.pth exists; no need to train!')
        return {'final': final_path}
    # A second run on this directory is refused (its PID named); temporaries of dead runs go.
    with run_lock.exclusive_run(output_dir):
        launch.launch(train_worker, cfg.NUM_GPUS, args=(cfg.clone(),), backend=cfg.DIST_BACKEND)
    return {'final': final_path}


def train_worker(cfg_snapshot):
    """One rank of a training job: everything model-specific comes from the model type it builds, once,
    from the cfg it receives."""
    receive_cfg(cfg_snapshot)
    model_type = model_builder.build_model_type(cfg)
    # Spawned workers write OUTPUT_DIR/log.txt themselves (their tool's process already does).
    with log_file(cfg.OUTPUT_DIR, comm.get_rank()):
        _train(model_type)


def _train(model_type):
    device = comm.get_device()
    torch.backends.cudnn.benchmark = cfg.CUDNN_BENCHMARK
    output_dir = get_output_dir(cfg.TRAIN.DATASETS, training=True)
    torch.manual_seed(cfg.RNG_SEED)  # identical init on every rank (DDP also broadcasts rank 0's)
    model = model_builder.checked_model(model_type).to(device)
    # Anchor and RoI sampling draw from torch's generator: give every rank its own stream.
    torch.manual_seed(cfg.RNG_SEED + comm.get_rank())
    np.random.seed(cfg.RNG_SEED + comm.get_rank())
    model = model_type.prepare_for_training(with_sync_batchnorm(model, device))
    schedule = lr_schedule()
    optimizer = build_optimizer(
        model, base_lr=schedule.lr_at(0), momentum=cfg.SOLVER.MOMENTUM, weight_decay=cfg.SOLVER.WEIGHT_DECAY,
        weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_GN, scale_momentum=cfg.SOLVER.SCALE_MOMENTUM,
        scale_momentum_threshold=cfg.SOLVER.SCALE_MOMENTUM_THRESHOLD, name=cfg.SOLVER.OPTIMIZER)
    start_iter, saved_progress = _resume_or_initialise(model_type, model, optimizer, output_dir)
    batches = training_batches(model_type, start_iter, device)
    retention = checkpoint_retention(model_type, schedule)
    loop = TrainLoop(model, optimizer, schedule.lr_at, batches, device, output_dir, start_iter,
                     train_options(model_type, retention), progress=saved_progress,
                     batch_to_device=model_type.batch_to_device(device))
    loop.run()
    log_replica_agreement(model, cfg.SOLVER.MAX_ITER - 1)
    loop.save(cfg.SOLVER.MAX_ITER - 1, checkpointer.FINAL_CHECKPOINT_NAME)


def log_replica_agreement(model, iteration):
    """Say whether the parameters are bitwise equal on every rank, as DDP promises (a collective)."""
    if comm.get_world_size() == 1:
        return
    digest, differing = comm.ranks_differing_from_rank0(dict(model.named_parameters()))
    if differing:
        logger.warning('Parameters after iteration %d differ from rank 0\'s on rank(s) %s of %d',
                       iteration, ', '.join(map(str, differing)), comm.get_world_size())
    else:
        logger.info('Parameters after iteration %d are bitwise equal on all %d ranks (sha256 %s)',
                    iteration, comm.get_world_size(), digest[:16])


def lr_schedule():
    """cfg.SOLVER's learning-rate schedule."""
    s = cfg.SOLVER
    return LRSchedule(policy=s.LR_POLICY, base_lr=s.BASE_LR, max_iter=s.MAX_ITER, gamma=s.GAMMA,
                      step_size=s.STEP_SIZE, steps=tuple(s.STEPS), lrs=tuple(s.LRS),
                      warm_up_iters=s.WARM_UP_ITERS, warm_up_factor=s.WARM_UP_FACTOR,
                      warm_up_method=s.WARM_UP_METHOD)


def train_options(model_type, retention=checkpointer.Retention()):
    return TrainOptions(retention=retention,
        max_iter=cfg.SOLVER.MAX_ITER, iter_size=cfg.SOLVER.ITER_SIZE, amp=cfg.SOLVER.AMP.ENABLED,
        amp_dtype=cfg.SOLVER.AMP.DTYPE, loss_scale=cfg.SOLVER.AMP.LOSS_SCALE,
        checkpoint_period=checkpoint_period(),
        log_lr_change_threshold=cfg.SOLVER.LOG_LR_CHANGE_THRESHOLD,
        checkpoint_extra={'cfg': cfg.dump()}, sampler_state=_sampler_state(),
        memory_settings=model_type.memory_settings(training=True))


def with_sync_batchnorm(model, device):
    """MODEL.SYNC_BN: the model's BatchNorm layers normalise with statistics over all ranks' images."""
    if not cfg.MODEL.SYNC_BN or comm.get_world_size() == 1:
        return model
    if device.type != 'cuda':
        # torch's SyncBatchNorm refuses CPU tensors; fail before DDP does with a traceback.
        raise ConfigValueError("MODEL.SYNC_BN True needs CUDA GPUs: torch's SyncBatchNorm does not run on the "
                               "{}; set MODEL.SYNC_BN False for this run".format(device.type))
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _sampler_state():
    return {'seed': cfg.RNG_SEED, 'global_batch_size': images_per_step()}


def _resume_or_initialise(model_type, model, optimizer, output_dir):
    """Resume from the newest checkpoint (Detectron's AUTO_RESUME) or initialise from TRAIN.WEIGHTS.
    Returns (start iteration, the saved run's logging progress or None)."""
    if cfg.TRAIN.AUTO_RESUME:
        # The newest intact checkpoint: a truncated or damaged newer one is skipped with a warning.
        last, start_iter, extra = checkpointer.resume_from_last(output_dir, model, optimizer,
                                                                sampler_state=_sampler_state())
        if last:
            return start_iter, extra.get('progress')
    if cfg.TRAIN.WEIGHTS:
        path = cache_url(cfg.TRAIN.WEIGHTS, cfg.DOWNLOAD_CACHE)
        unwrapped = comm.unwrap_model(model)
        missing, unused, momentum = model_type.load_training_weights(unwrapped, path)
        check_weights_fit(unwrapped, path, missing, unused, model_type.name)
        logger.info('Initialised from %s (%d model params not in file, %d file blobs unused)',
                    path, len(missing), len(unused))
        if momentum and isinstance(optimizer, DetectronSGD):
            logger.info('SGD momentum of %d parameters from %s, as Detectron starts from it',
                        load_momentum(optimizer, unwrapped, momentum), path)
    else:
        logger.info('TRAIN.WEIGHTS is empty: training starts from random initialisation')
    return 0, None


def training_batches(model_type, start_iter, device):
    """This rank's iterator over training batches for device, positioned at start_iter (a resume)."""
    roidb = model_type.training_roidb()
    logger.info('%d roidb entries for training', len(roidb))
    sampler = GroupedDistributedBatchSampler(
        model_type.training_groups(roidb), None, seed=cfg.RNG_SEED, rank=comm.get_rank(),
        world_size=comm.get_world_size(), rank_batch_sizes=rank_batch_sizes(),
        start_iter=start_iter * cfg.SOLVER.ITER_SIZE)
    loader = build_train_loader(
        model_type.training_dataset(roidb, device), sampler, model_type.collate(device),
        num_workers=cfg.DATA_LOADER.NUM_THREADS, start_iter=start_iter * cfg.SOLVER.ITER_SIZE)
    batches = iter(loader)
    triton_cache.start_key_hashing(device)  # while the workers make the first batch
    # Starting a DataLoader draws its workers' base seed from torch's global generator. A resumed
    # run starts it after restoring the RNG states, so that draw is isolated (with the first batch)
    # to keep the random stream of the model's own sampling identical to the uninterrupted run's.
    with torch.random.fork_rng(devices=[]):
        first = next(batches)
    return itertools.chain([first], batches)


def rank_batch_sizes():
    """Images per micro-batch of every rank of the launched job, in rank order:
    TRAIN.RANK_IMS_PER_BATCH, or TRAIN.IMS_PER_BATCH on every rank. Each rank's loss weighs the
    same in DDP's gradient average, whatever its batch (as CenterNet's mean of per-GPU losses)."""
    return list(cfg.TRAIN.RANK_IMS_PER_BATCH) or [cfg.TRAIN.IMS_PER_BATCH] * comm.get_world_size()


def images_per_step():
    """Images of one micro-step over all processes (the sampler's global batch); an optimizer step
    takes SOLVER.ITER_SIZE of them."""
    return sum(rank_batch_sizes())


def checkpoint_period(world_size=None):
    """Detectron's rule: a checkpoint every int(SNAPSHOT_ITERS / NUM_GPUS) iterations, with the
    launched world size as NUM_GPUS."""
    world_size = comm.get_world_size() if world_size is None else world_size
    return max(1, int(cfg.TRAIN.SNAPSHOT_ITERS / world_size))


def checkpoint_retention(model_type, schedule):
    """The checkpoint files the model type writes and keeps on this LR schedule."""
    return model_type.checkpoint_retention(schedule.change_iters())


_MAX_LISTED_STEPS = 10


def describe_schedule(model_type, num_images=None):
    """Lines that say what a training run will do, for a user about to spend GPU hours. Called
    before launch, where NUM_GPUS already is the world size the job will have (the tools reconcile
    it with a launcher's). model_type: the tool's (model_builder.build_model_type), whose checkpoint
    retention is described; num_images: size of the training set, to express the run in epochs."""
    schedule = lr_schedule()
    batch = images_per_iter()
    lines = [
        'images per iteration: {} ({} x SOLVER.ITER_SIZE {})'.format(
            batch, _describe_micro_batch(), cfg.SOLVER.ITER_SIZE),
        _describe_optimizer(schedule),
        _describe_warm_up(schedule),
    ]
    change_iters = schedule.change_iters()
    for it in change_iters[:_MAX_LISTED_STEPS]:
        lines.append('LR step: iteration {} -> LR {:.6g}'.format(it, schedule.lr_at(it)))
    if len(change_iters) > _MAX_LISTED_STEPS:
        lines.append('... {} more LR steps'.format(len(change_iters) - _MAX_LISTED_STEPS))
    lines += [
        'final LR: {:.6g} (iteration {})'.format(schedule.lr_at(schedule.max_iter - 1), schedule.max_iter - 1),
        'MAX_ITER: {} iterations = {} images'.format(schedule.max_iter, schedule.max_iter * batch),
    ]
    if num_images:
        lines.append('epochs: {:.2f} over {} training images'.format(schedule.max_iter * batch / num_images,
                                                                   num_images))
    retention = checkpoint_retention(model_type, schedule)
    lines.append('checkpoint every {} iterations (int(TRAIN.SNAPSHOT_ITERS {} / NUM_GPUS {})) {}'.format(
        checkpoint_period(cfg.NUM_GPUS), cfg.TRAIN.SNAPSHOT_ITERS, cfg.NUM_GPUS, retention.describe()))
    return lines


def _describe_optimizer(schedule):
    policy = 'LR policy: {}, base LR {:g}'.format(schedule.policy, schedule.base_lr)
    # Detectron's SGD is the default and goes unnamed, as in Detectron's own print-out.
    return policy if cfg.SOLVER.OPTIMIZER == 'sgd' else 'optimizer: {}, {}'.format(cfg.SOLVER.OPTIMIZER, policy)


def _describe_micro_batch():
    if cfg.TRAIN.RANK_IMS_PER_BATCH:
        return 'TRAIN.RANK_IMS_PER_BATCH {}'.format(tuple(cfg.TRAIN.RANK_IMS_PER_BATCH))
    return 'NUM_GPUS {} x TRAIN.IMS_PER_BATCH {}'.format(cfg.NUM_GPUS, cfg.TRAIN.IMS_PER_BATCH)


def _describe_warm_up(schedule):
    if schedule.warm_up_iters <= 0:
        return 'warm-up: none'
    return 'warm-up: {} iterations, {} from factor {:g} (LR {:.6g} at iteration 0)'.format(
        schedule.warm_up_iters, schedule.warm_up_method, schedule.warm_up_factor, schedule.lr_at(0))


@dataclass(frozen=True)
class TrainOptions:
    """The loop's settings as plain values (cfg.SOLVER and the checkpoint rule, read by train_worker)."""
    max_iter: int
    iter_size: int = 1
    amp: bool = False
    amp_dtype: str = 'float16'
    loss_scale: float = 0.0  # 0: dynamic loss scaling with float16
    checkpoint_period: int = 20000
    retention: checkpointer.Retention = checkpointer.Retention()  # which checkpoint files are written and kept
    log_lr_change_threshold: float = 1.1
    checkpoint_extra: dict = field(default_factory=dict)  # plain data saved with every checkpoint
    sampler_state: dict = None  # compared on resume
    memory_settings: str = ''  # what lowers the model's memory, named by an out-of-memory error


class TrainLoop:
    """Iterations from start_iter to max_iter with gradient accumulation, AMP, logging, checkpoints.

    Given its model, optimizer, lr_at_iter function and batch iterator; `model(*batch_to_device(batch))`
    returns a dict of scalar tensors whose keys starting with 'loss' are summed into the objective.
    """

    def __init__(self, model, optimizer, lr_at_iter, batches, device, output_dir, start_iter, options,
                 progress=None, batch_to_device=None):
        self.device = device
        self.batch_to_device = batch_to_device or (lambda batch: to_device(batch, device))
        self.optimizer = optimizer
        self.lr_at_iter = lr_at_iter
        self.batches = batches
        self.output_dir = output_dir
        self.start_iter = start_iter
        self.options = options
        self.model_without_ddp = model
        self.model = self._wrap_ddp(model)
        self.amp_dtype = {'float16': torch.float16, 'bfloat16': torch.bfloat16}[options.amp_dtype]
        self.scaler = self._make_scaler()
        self.first_nonfinite = torch.tensor(-1, device=device)
        self.history = []
        self.window = collections.defaultdict(lambda: collections.deque(maxlen=LOG_PERIOD))
        self._restore_progress(progress)
        self.events = EventWriter(os.path.join(output_dir, 'tensorboard')) \
            if comm.is_main_process() else None

    def _wrap_ddp(self, model):
        if comm.get_world_size() == 1:
            return model
        device_ids = [self.device.index] if self.device.type == 'cuda' else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **_NO_FORWARD_BUFFER_SYNC)

    def _make_scaler(self):
        fp16 = self.options.amp and self.amp_dtype == torch.float16
        if not fp16 or self.options.loss_scale > 0:
            return None
        return torch.amp.GradScaler(self.device.type)

    def _micro_step(self, batch, sync):
        batch = self.batch_to_device(batch)
        no_sync = getattr(self.model, 'no_sync', None)
        context = contextlib.nullcontext() if sync or no_sync is None else no_sync()
        with context:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.options.amp):
                outputs = self.model(*batch)
            total = sum(v for k, v in outputs.items() if k.startswith('loss'))
            scaled = total / self.options.iter_size
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            elif self.options.loss_scale > 0 and self.options.amp:
                scaled = scaled * self.options.loss_scale
            scaled.backward()
        return total, outputs

    def _optimizer_step(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return
        if self.options.amp and self.options.loss_scale > 0:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / self.options.loss_scale)
        self.optimizer.step()

    def _set_lr(self, lr, cur_iter, previous_lr):
        if previous_lr is not None and lr != previous_lr:
            if lr_change_ratio(previous_lr, lr) > self.options.log_lr_change_threshold:
                logger.info('Changing learning rate %.6f -> %.6f at iter %d', previous_lr, lr, cur_iter)
        set_lr(self.optimizer, lr)

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
        options = self.options
        tic = time.time()
        lr = self.lr_at_iter(self.start_iter - 1) if self.start_iter > 0 else None
        cur_iter = self.start_iter
        try:
            for cur_iter in range(self.start_iter, options.max_iter):
                lr, previous_lr = self.lr_at_iter(cur_iter), lr
                self._set_lr(lr, cur_iter, previous_lr)
                self.optimizer.zero_grad(set_to_none=True)
                data_time = 0.0
                for micro in range(options.iter_size):
                    data_tic = time.time()
                    batch = next(self.batches)
                    data_time += time.time() - data_tic
                    total, outputs = self._micro_step(batch, sync=micro == options.iter_size - 1)
                    self._note_nonfinite(total, cur_iter)
                self._optimizer_step()
                periodic = (cur_iter + 1) % options.checkpoint_period == 0 and cur_iter > self.start_iter
                checkpoint_names = options.retention.names(cur_iter, periodic)
                last = cur_iter == options.max_iter - 1
                if cur_iter % LOG_PERIOD == 0 or checkpoint_names or last:
                    self._raise_if_nonfinite(outputs)
                self._record(cur_iter, lr, total, outputs, time.time() - tic, data_time)
                tic = time.time()
                if checkpoint_names:
                    self.save(cur_iter, *checkpoint_names)
        except torch.OutOfMemoryError:
            raise self._out_of_memory(cur_iter) from None
        if self.events is not None:
            self.events.close()

    def _out_of_memory(self, cur_iter):
        """The one-line error for running out of device memory in cur_iter; no checkpoint was touched."""
        last = checkpointer.find_last_checkpoint(self.output_dir)
        saved = ('The checkpoints are intact: started again, the run resumes from {}.'.format(last) if last
                 else 'No checkpoint had been written yet.')
        return out_of_memory_error('iteration {}'.format(cur_iter), comm.get_rank(), self.device,
                                   self.options.memory_settings, saved)

    def save(self, iteration, name, *copies):
        """Checkpoint after iteration into output_dir/name (and byte copies under the names in copies)
        on rank 0 with every rank's RNG state, then remove the numbered files the retention no longer
        keeps (a collective: all ranks call it)."""
        rng_states = checkpointer.gather_rng_states()
        if comm.is_main_process():
            path = os.path.join(self.output_dir, name)
            extra = dict(self.options.checkpoint_extra, progress=self._progress())
            checkpointer.save_checkpoint(path, self.model_without_ddp, self.optimizer, iteration,
                                         extra=extra, rng_states=rng_states,
                                         sampler_state=self.options.sampler_state)
            for copy_name in copies:
                checkpointer.copy_checkpoint(path, os.path.join(self.output_dir, copy_name))
            logger.info('Wrote checkpoint %s', ', '.join(os.path.join(self.output_dir, n) for n in (name,) + copies))
            for removed in checkpointer.prune_checkpoints(self.output_dir, self.options.retention.keep):
                logger.info('Removed %s (TRAIN.KEEP_CHECKPOINTS %d)', removed, self.options.retention.keep)
            if self.history:
                write_training_curves(os.path.join(self.output_dir, 'training_curves.png'), self.history)
        comm.synchronize()

    def _progress(self):
        """What a resumed run needs to log and plot as the uninterrupted one: the logged history and
        the smoothing windows (plain numbers, so checkpoints stay weights_only-loadable)."""
        windows = {k: [float(v) for v in q] for k, q in self.window.items()}
        return {'history': list(self.history), 'windows': windows}

    def _restore_progress(self, progress):
        if not progress:
            return
        self.history = list(progress['history'])
        for k, values in progress['windows'].items():
            as_tensor = (lambda v: v) if k in _HOST_TIMES else (lambda v: torch.tensor(v, device=self.device))
            self.window[k].extend(as_tensor(v) for v in values)

    def _record(self, cur_iter, lr, total, outputs, iter_time, data_time):
        self.window['time'].append(iter_time)
        self.window['data_time'].append(data_time)
        self.window['loss'].append(total.detach().float())
        for k, v in outputs.items():
            self.window[k].append(v.detach().float())
        if cur_iter % LOG_PERIOD and cur_iter != self.options.max_iter - 1:
            return
        # Detectron logs the median of the last 20 values, averaged over GPUs.
        medians = {k: torch.stack(list(q)).median() for k, q in self.window.items() if k not in _HOST_TIMES}
        medians = comm.reduce_dict(medians, average=True)
        if not comm.is_main_process():
            return
        stats = self._json_stats(cur_iter, lr, medians)
        log_json_stats(stats)
        self.history.append(stats)
        self.events.add_scalars({k: v for k, v in stats.items() if isinstance(v, float)}, cur_iter)
        max_iter = self.options.max_iter
        logger.info('[%d/%d %5.1f%%] loss %.4f lr %.6f eta %s', cur_iter + 1, max_iter,
                    100.0 * (cur_iter + 1) / max_iter, stats['loss'], lr, stats['eta'])

    def _json_stats(self, cur_iter, lr, medians):
        mean_time = float(np.mean(self.window['time']))
        eta = datetime.timedelta(seconds=int(mean_time * (self.options.max_iter - cur_iter)))
        stats = {'iter': cur_iter, 'lr': float(lr), 'time': mean_time, 'eta': str(eta),
                 'data_time': float(np.mean(self.window['data_time'])),
                 'mb_qsize': 0, 'mem': _max_memory_mib(self.device)}
        stats.update({k: float(v) for k, v in medians.items()})
        return stats


def _max_memory_mib(device):
    if device.type != 'cuda':
        return 0
    return int(math.ceil(torch.cuda.max_memory_allocated(device) / 1024 ** 2))
