"""Training: one process per GPU (or CPU worker), DDP, Detectron's schedule and outputs, any model.

`train_model()` is what tools/train_net.py calls. It starts cfg.NUM_GPUS workers itself, or joins the
job that torchrun / a cluster launcher started (see detectron/utils/comm.py), and returns the
path of the final model. `train_worker` builds the model type once from the cfg it is handed
(model_builder.build_model_type) and, through it, the model, optimizer, LR schedule and batch
source, and hands them to `TrainLoop`, which knows nothing about the model (detectron2's
SimpleTrainer shape). Rank 0 alone
writes checkpoints, logs, TensorBoard events and the training-curve PNG.
"""
import inspect
import itertools
import logging
import os

import numpy as np
import torch

from detectron.checkpoint import checkpointer
from detectron.checkpoint.download import cache_url
from detectron.checkpoint.weights_fit import check_weights_fit
from detectron.core import launch, run_lock
from detectron.core.config import cfg, get_output_dir, images_per_iter
from detectron.core.config_finalize import receive_cfg
from detectron.core.hooks import (BestCheckpoint, Checkpointer, Evaluation, LRScheduler, Metrics, NonFiniteCheck,
                                  TrainingCurves)
from detectron.core.test_engine import evaluate_during_training
from detectron.core.train_loop import GradientClipping, StepOptions, TrainLoop
from detectron.core.validation import validation_loss
from detectron.modeling import model_builder
from detectron.modeling.optimizer import DetectronSGD, build_optimizer, load_momentum
from detectron.ops import triton_cache
from detectron.roi_data.loader import build_train_loader
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, OutputDirError
from detectron.utils.logging import log_file
from detectron.utils.memory import out_of_memory_error
from detectron.utils.lr_policy import LRSchedule

logger = logging.getLogger(__name__)

# Buffers (BN statistics, rank 0's saved) are not re-broadcast before every forward. torch >= 2.14
# names this forward_sync_buffers (broadcast_buffers warns there); the GPU machines' 2.11 does not.
_NO_FORWARD_BUFFER_SYNC = ({'forward_sync_buffers': False} if 'forward_sync_buffers' in
                           inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                           else {'broadcast_buffers': False})


def train_model():
    """Train the model described by the finished cfg; returns {'final': path of model_final.pth}."""
    output_dir = get_output_dir(cfg.TRAIN.DATASETS, training=True)
    final_path = os.path.join(output_dir, 'model_final.pth')
    if cfg.TRAIN.AUTO_RESUME and os.path.exists(final_path):
        logger.info('model_final.pth exists; no need to train!')
        return {'final': final_path}
    # A second run on this directory is refused (its PID named); temporaries of dead runs go.
    with run_lock.exclusive_run(output_dir):
        if not cfg.TRAIN.AUTO_RESUME:
            refuse_other_runs_checkpoints(output_dir)
        launch.launch(train_worker, cfg.NUM_GPUS, args=(cfg.clone(),), backend=cfg.DIST_BACKEND)
    return {'final': final_path}


def refuse_other_runs_checkpoints(output_dir):
    """TRAIN.AUTO_RESUME False starts at iteration 0: over an earlier run's checkpoints it would overwrite
    some of them and leave its newer ones beside the new run's, so it is refused. Every rank sees the same
    files: none writes a checkpoint before all have joined the job."""
    found = checkpointer.checkpoints_newest_first(output_dir)
    if found:
        names = [os.path.basename(path) for path in found]
        raise OutputDirError(
            '{} holds checkpoints of an earlier run ({}{}) and TRAIN.AUTO_RESUME is False: this run would overwrite '
            'some and leave the others beside its own; set TRAIN.AUTO_RESUME True to resume that run, or set another '
            'OUTPUT_DIR, or remove those files'.format(output_dir, ', '.join(names[:5]),
                                                      ' and {} more'.format(len(names) - 5) if len(names) > 5 else ''))


def check_resumable(path, start_iter, max_iter):
    """A checkpoint past SOLVER.MAX_ITER cannot be continued: training would write model_final.pth holding its
    weights under a smaller iteration."""
    if start_iter > max_iter:
        raise ConfigValueError(
            '{} holds iteration {}, past SOLVER.MAX_ITER {} (iterations 0 to {}): there is nothing left to train and '
            'model_final.pth would hold later weights than it says; raise SOLVER.MAX_ITER above {} to continue that '
            'run, or set another OUTPUT_DIR to start a new one'.format(path, start_iter - 1, max_iter, max_iter - 1,
                                                                        start_iter - 1))


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
    start_iter, saved_states, sampler_position = _resume_or_initialise(model_type, model, optimizer, output_dir)
    batches, sampler = training_batches(model_type, start_iter, device, sampler_position)
    hooks = training_hooks(model_type, schedule, output_dir, sampler)
    loop = TrainLoop(model, optimizer, batches, device, start_iter, cfg.SOLVER.MAX_ITER, step_options(), hooks,
                     batch_to_device=model_type.batch_to_device(device), ddp_model=wrap_ddp(model, device),
                     out_of_memory=lambda iteration: _out_of_memory(model_type, iteration, device, output_dir))
    if saved_states:
        loop.load_hook_states(saved_states)
    loop.run()


def training_hooks(model_type, schedule, output_dir, sampler=None):
    """The loop's hooks in the order they run: the LR before each step; after it, the non-finite check
    before anything is written, metrics, the evaluations and the best checkpoint (before the
    checkpoint of their iteration, so that a run stopped during one repeats it), checkpoints (with the
    position of sampler, the training batches', when given), then the curves of what was logged."""
    metrics = Metrics(output_dir, cfg.SOLVER.MAX_ITER)
    checkpointer = Checkpointer(output_dir, checkpoint_period(), checkpoint_retention(model_type, schedule),
                                extra={'cfg': cfg.dump()}, sampler_state=_checkpoint_sampler_state(sampler))
    evaluations = evaluation_hooks(model_type, metrics, output_dir)
    best = [BestCheckpoint(output_dir, *best_metric(model_type))] if evaluations else []
    return ([LRScheduler(schedule.lr_at, cfg.SOLVER.LOG_LR_CHANGE_THRESHOLD), NonFiniteCheck(output_dir), metrics]
            + evaluations + best + [checkpointer, TrainingCurves(output_dir, metrics, checkpointer)])


def evaluation_hooks(model_type, metrics, output_dir):
    """TEST.VAL_LOSS_PERIOD's validation loss and TEST.EVAL_PERIOD's AP evaluation, when on."""
    device = comm.get_device()

    def validate(model, iteration):
        return validation_loss(model_type, model, device)

    def evaluate(model, iteration):
        return evaluation_metrics(evaluate_during_training(model_type, model, iteration,
                                                           os.path.join(output_dir, 'evaluation')))

    hooks = []
    if cfg.TEST.VAL_LOSS_PERIOD > 0:
        hooks.append(Evaluation(cfg.TEST.VAL_LOSS_PERIOD, validate, metrics, 'validation_losses'))
    if cfg.TEST.EVAL_PERIOD > 0:
        hooks.append(Evaluation(cfg.TEST.EVAL_PERIOD, evaluate, metrics, 'evaluations'))
    return hooks


_TASK_NAMES = {'box': 'bbox', 'mask': 'segm'}


def evaluation_metrics(results):
    """{dataset: {'box': {'AP': ...}, 'mask': ...}} -> {'bbox/AP': ..., 'segm/AP50': ...}, prefixed
    with '<dataset>/' when TEST.DATASETS holds several."""
    prefix = (lambda name: name + '/') if len(results) > 1 else (lambda name: '')
    return {'{}{}/{}'.format(prefix(name), _TASK_NAMES.get(task, task), metric): float(value)
            for name, tasks in results.items() for task, values in tasks.items() for metric, value in values.items()}


def best_metric(model_type):
    """(metric, 'max' or 'min') that model_best.pth is chosen by: TEST.BEST_METRIC (a loss is lowest
    best, anything else highest), or the model type's choice."""
    if cfg.TEST.BEST_METRIC:
        return cfg.TEST.BEST_METRIC, 'min' if 'loss' in cfg.TEST.BEST_METRIC else 'max'
    return model_type.best_metric()


def step_options():
    """cfg.SOLVER's settings of one optimizer step."""
    s = cfg.SOLVER
    clip = cfg.SOLVER.CLIP_GRADIENTS
    clipping = (GradientClipping(clip_type=clip.CLIP_TYPE, value=clip.CLIP_VALUE, norm_type=clip.NORM_TYPE)
                if cfg.SOLVER.CLIP_GRADIENTS.ENABLED else None)
    return StepOptions(iter_size=s.ITER_SIZE, amp=s.AMP.ENABLED, amp_dtype=s.AMP.DTYPE,
                       loss_scale=s.AMP.LOSS_SCALE, clipping=clipping)


def wrap_ddp(model, device):
    """The model in DistributedDataParallel when the job has several processes, else None."""
    if comm.get_world_size() == 1:
        return None
    device_ids = [device.index] if device.type == 'cuda' else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **_NO_FORWARD_BUFFER_SYNC)


def _out_of_memory(model_type, iteration, device, output_dir):
    """The one-line error for running out of device memory in iteration; no checkpoint was touched."""
    last = checkpointer.find_last_checkpoint(output_dir)
    saved = ('The checkpoints are intact: started again, the run resumes from {}.'.format(last) if last
             else 'No checkpoint had been written yet.')
    return out_of_memory_error('iteration {}'.format(iteration), comm.get_rank(), device,
                               model_type.memory_settings(training=True), saved)


def lr_schedule():
    """cfg.SOLVER's learning-rate schedule."""
    s = cfg.SOLVER
    return LRSchedule(policy=s.LR_POLICY, base_lr=s.BASE_LR, max_iter=s.MAX_ITER, gamma=s.GAMMA,
                      step_size=s.STEP_SIZE, steps=tuple(s.STEPS), lrs=tuple(s.LRS),
                      warm_up_iters=s.WARM_UP_ITERS, warm_up_factor=s.WARM_UP_FACTOR,
                      warm_up_method=s.WARM_UP_METHOD)


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
    """What a resumed run's sampler must share with the saved one's: the stream's seed and global batch."""
    return {'seed': cfg.RNG_SEED, 'global_batch_size': images_per_step()}


def _checkpoint_sampler_state(sampler):
    """fn(iteration) -> the sampler state the checkpoint after iteration stores: _sampler_state() and, with a
    sampler, its position at the next iteration's first global batch (SOLVER.ITER_SIZE global batches each)."""
    iter_size = cfg.SOLVER.ITER_SIZE
    if sampler is None:
        return lambda iteration: _sampler_state()
    return lambda iteration: dict(_sampler_state(), position=sampler.position((iteration + 1) * iter_size))


def _resume_or_initialise(model_type, model, optimizer, output_dir):
    """Resume from the newest checkpoint (Detectron's AUTO_RESUME) or initialise from TRAIN.WEIGHTS.
    Returns (start iteration, the saved run's hook states (checkpoint extras) or None, the saved sampler
    position or None (none saved: a fresh run, or a checkpoint written before positions were stored))."""
    if cfg.TRAIN.AUTO_RESUME:
        # The newest intact checkpoint: a truncated or damaged newer one is skipped with a warning.
        last, start_iter, extra, saved_sampler = checkpointer.resume_from_last(output_dir, model, optimizer,
                                                                             sampler_state=_sampler_state())
        if last:
            check_resumable(last, start_iter, cfg.SOLVER.MAX_ITER)
            return start_iter, extra, (saved_sampler or {}).get('position')
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
    return 0, None, None


def training_batches(model_type, start_iter, device, sampler_position=None):
    """(This rank's iterator over training batches for device, positioned at start_iter (a resume), its
    sampler). sampler_position: the one the resumed checkpoint stored, or None."""
    roidb = model_type.training_roidb()
    logger.info('%d roidb entries for training', len(roidb))
    sampler = GroupedDistributedBatchSampler(
        model_type.training_groups(roidb), None, seed=cfg.RNG_SEED, rank=comm.get_rank(),
        world_size=comm.get_world_size(), rank_batch_sizes=rank_batch_sizes(),
        start_iter=start_iter * cfg.SOLVER.ITER_SIZE, check=model_type.training_batch_check(roidb),
        start_position=sampler_position, iter_size=cfg.SOLVER.ITER_SIZE)
    loader = build_train_loader(
        model_type.training_dataset(roidb, device), sampler, model_type.collate(device),
        num_workers=cfg.DATA_LOADER.NUM_THREADS, start_iter=start_iter * cfg.SOLVER.ITER_SIZE,
        timeout=cfg.DATA_LOADER.TIMEOUT_S)
    batches = iter(loader)
    triton_cache.start_key_hashing(device)  # while the workers make the first batch
    # Starting a DataLoader draws its workers' base seed from torch's global generator. A resumed
    # run starts it after restoring the RNG states, so that draw is isolated (with the first batch)
    # to keep the random stream of the model's own sampling identical to the uninterrupted run's.
    with torch.random.fork_rng(devices=[]):
        first = next(batches)
    return TrainingBatches(itertools.chain([first], batches), loader.ready_batches), sampler


class TrainingBatches:
    """The training loop's batch iterator, which also tells how many batches are ready (json_stats'
    `mb_qsize`)."""

    def __init__(self, batches, ready_batches):
        self.batches = batches
        self.ready_batches = ready_batches

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.batches)


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
