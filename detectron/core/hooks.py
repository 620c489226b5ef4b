"""The training loop's duties besides stepping, one hook each (core/train_loop.py says how hooks are
called). train_engine.training_hooks lists them in the order they run."""
import collections
import datetime
import logging
import math
import os
import time

import numpy as np
import torch

from detectron.modeling.optimizer import lr_change_ratio, set_lr
from detectron.checkpoint import checkpointer
from detectron.utils import comm
from detectron.utils.errors import DetectronError
from detectron.utils.logging import log_json_stats
from detectron.utils.tensorboard import EventWriter
from detectron.utils.training_curves import write_training_curves

logger = logging.getLogger(__name__)

LOG_PERIOD = 20  # Detectron logs json_stats every 20 iterations
# Seconds per iteration measured on the host, logged as means (the losses as medians): the whole
# iteration, and the part spent waiting for the loader's next batch (detectron2's data_time).
_HOST_TIMES = ('time', 'data_time')


class NonFiniteLossError(DetectronError, FloatingPointError):
    """The training loss became NaN or inf."""


class LRScheduler:
    """Sets the learning rate of each iteration (lr_at_iter) and logs a change past threshold."""

    def __init__(self, lr_at_iter, log_change_threshold=1.1):
        self.lr_at_iter = lr_at_iter
        self.log_change_threshold = log_change_threshold
        self.lr = None

    def before_train(self, loop):
        self.lr = self.lr_at_iter(loop.start_iter - 1) if loop.start_iter > 0 else None

    def before_step(self, loop):
        lr, previous = self.lr_at_iter(loop.iter), self.lr
        if previous is not None and lr != previous and lr_change_ratio(previous, lr) > self.log_change_threshold:
            logger.info('Changing learning rate %.6f -> %.6f at iter %d', previous, lr, loop.iter)
        set_lr(loop.optimizer, lr)
        self.lr = loop.storage['lr'] = lr


class NonFiniteCheck:
    """Remembers on the device, without a host sync, the first iteration whose loss is not finite, and
    raises before any hook writes a log line, checkpoint or evaluation of a diverged run. Runs first."""

    def __init__(self, output_dir):
        self.output_dir = output_dir
        self.first_nonfinite = None

    def before_train(self, loop):
        self.first_nonfinite = torch.tensor(-1, device=loop.device)

    def after_step(self, loop):
        bad = ~torch.isfinite(loop.total.detach())
        self.first_nonfinite.masked_fill_(bad & (self.first_nonfinite < 0), loop.iter)
        if loop.writes_at(loop.iter):
            self._raise_if_nonfinite(loop.outputs)

    def _raise_if_nonfinite(self, outputs):
        first = int(self.first_nonfinite)
        if first < 0:
            return
        parts = ', '.join('{}={:.4g}'.format(k, float(v.detach())) for k, v in outputs.items()
                          if k.startswith('loss'))
        raise NonFiniteLossError(
            'Loss is not finite since iteration {} (now: {}). The last good checkpoint in {} is intact; '
            'lower SOLVER.BASE_LR or check the data.'.format(first, parts, self.output_dir))


class Metrics:
    """Detectron's json_stats every LOG_PERIOD iterations and at the last (medians of the last 20
    values, averaged over ranks), the progress line with ETA, TensorBoard scalars; rank 0 writes.
    Its history (every logged json_stats) is what the training curves plot."""

    state_key = 'progress'

    def __init__(self, output_dir, max_iter):
        self.output_dir, self.max_iter = output_dir, max_iter
        self.history = []
        self.window = collections.defaultdict(lambda: collections.deque(maxlen=LOG_PERIOD))
        self.events = None
        self.tic = None
        self.device = None
        self.ready_batches = lambda: 0

    def writes_at(self, iteration):
        return iteration % LOG_PERIOD == 0 or iteration == self.max_iter - 1

    def before_train(self, loop):
        self.device = loop.device
        self.ready_batches = getattr(loop.batches, 'ready_batches', self.ready_batches)
        if comm.is_main_process():
            self.events = EventWriter(os.path.join(self.output_dir, 'tensorboard'))

    def before_step(self, loop):
        # An iteration's time ends at this hook: checkpoints and evaluations after it are not in it.
        self.tic = time.time()

    def after_step(self, loop):
        self.window['time'].append(time.time() - self.tic)
        self.window['data_time'].append(loop.data_time)
        self.window['loss'].append(loop.total.detach().float())
        for k, v in loop.outputs.items():
            self.window[k].append(v.detach().float())
        if loop.grad_norm is not None:
            self.window['grad_norm'].append(loop.grad_norm.detach().float())
        if self.writes_at(loop.iter):
            self._log(loop.iter, loop.storage['lr'])

    def after_train(self, loop):
        if self.events is not None:
            self.events.close()

    def log_extra(self, iteration, values):
        """A json_stats line and TensorBoard scalars of other values (e.g. an evaluation's AP) at
        iteration, added to the history the curves plot (rank 0 only)."""
        if not comm.is_main_process():
            return
        stats = dict({'iter': iteration}, **values)
        log_json_stats(stats)
        self.history.append(stats)
        self.events.add_scalars({k: v for k, v in values.items() if isinstance(v, float)}, iteration)

    def _log(self, cur_iter, lr):
        medians = {k: torch.stack(list(q)).median() for k, q in self.window.items() if k not in _HOST_TIMES}
        medians = comm.reduce_dict(medians, average=True)
        if not comm.is_main_process():
            return
        stats = self._json_stats(cur_iter, lr, medians)
        log_json_stats(stats)
        self.history.append(stats)
        self.events.add_scalars({k: v for k, v in stats.items() if isinstance(v, float)}, cur_iter)
        logger.info('[%d/%d %5.1f%%] loss %.4f lr %.6f eta %s', cur_iter + 1, self.max_iter,
                    100.0 * (cur_iter + 1) / self.max_iter, stats['loss'], lr, stats['eta'])

    def _json_stats(self, cur_iter, lr, medians):
        mean_time = float(np.mean(self.window['time']))
        eta = datetime.timedelta(seconds=int(mean_time * (self.max_iter - cur_iter)))
        stats = {'iter': cur_iter, 'lr': float(lr), 'time': mean_time, 'eta': str(eta),
                 'data_time': float(np.mean(self.window['data_time'])),
                 'mb_qsize': self.ready_batches(), 'mem': _max_memory_mib(self.device)}
        stats.update({k: float(v) for k, v in medians.items()})
        return stats

    def state_dict(self):
        """The logged history and the smoothing windows (plain numbers, so checkpoints stay
        weights_only-loadable): a resumed run logs and plots as the uninterrupted one."""
        windows = {k: [float(v) for v in q] for k, q in self.window.items()}
        return {'history': list(self.history), 'windows': windows}

    def load_state_dict(self, state):
        self.history = list(state['history'])
        for k, values in state['windows'].items():
            as_tensor = (lambda v: v) if k in _HOST_TIMES else (lambda v: torch.tensor(v, device=self.device))
            self.window[k].extend(as_tensor(v) for v in values)


def _max_memory_mib(device):
    if device is None or device.type != 'cuda':
        return 0
    return int(math.ceil(torch.cuda.max_memory_allocated(device) / 1024 ** 2))


class Checkpointer:
    """Detectron's model_iterN.pth every period iterations (names and retention from the model type's
    Retention), with every rank's RNG state and the hooks' states; model_final.pth after training.
    sampler_state: fn(iteration) -> the plain sampler state to store with the checkpoint after iteration.
    Rank 0 writes; saving is a collective."""

    def __init__(self, output_dir, period, retention, extra=None, sampler_state=lambda iteration: None,
                 final_name=None):
        self.output_dir, self.period, self.retention = output_dir, period, retention
        self.extra = extra or {}
        self.sampler_state = sampler_state
        self.final_name = final_name or checkpointer.FINAL_CHECKPOINT_NAME
        self.start_iter = 0
        self.written_at = None  # the iteration of the last checkpoint this run wrote

    def _names(self, iteration):
        periodic = (iteration + 1) % self.period == 0 and iteration > self.start_iter
        return self.retention.names(iteration, periodic)

    def writes_at(self, iteration):
        return bool(self._names(iteration))

    def before_train(self, loop):
        self.start_iter = loop.start_iter

    def after_step(self, loop):
        names = self._names(loop.iter)
        if names:
            self.save(loop, loop.iter, *names)

    def after_train(self, loop):
        log_replica_agreement(loop.model_without_ddp, loop.max_iter - 1)
        self.save(loop, loop.max_iter - 1, self.final_name)

    def save(self, loop, iteration, name, *copies):
        """Checkpoint after iteration into output_dir/name (and byte copies under the names in copies),
        then remove the numbered files the retention no longer keeps (a collective)."""
        rng_states = checkpointer.gather_rng_states()
        if comm.is_main_process():
            path = os.path.join(self.output_dir, name)
            extra = dict(self.extra, **loop.hook_states())
            checkpointer.save_checkpoint(path, loop.model_without_ddp, loop.optimizer, iteration, extra=extra,
                                       rng_states=rng_states, sampler_state=self.sampler_state(iteration))
            for copy_name in copies:
                checkpointer.copy_checkpoint(path, os.path.join(self.output_dir, copy_name))
            logger.info('Wrote checkpoint %s', ', '.join(os.path.join(self.output_dir, n) for n in (name,) + copies))
            for removed in checkpointer.prune_checkpoints(self.output_dir, self.retention.keep):
                logger.info('Removed %s (TRAIN.KEEP_CHECKPOINTS %d)', removed, self.retention.keep)
        self.written_at = iteration
        comm.synchronize()


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


class TrainingCurves:
    """training_curves.png of the metrics' history, redrawn whenever a checkpoint is written (rank 0)."""

    def __init__(self, output_dir, metrics, checkpointer):
        self.path = os.path.join(output_dir, 'training_curves.png')
        self.metrics, self.checkpointer = metrics, checkpointer

    def after_step(self, loop):
        if self.checkpointer.written_at == loop.iter:
            self._draw()

    def after_train(self, loop):
        self._draw()

    def _draw(self):
        if comm.is_main_process() and self.metrics.history:
            write_training_curves(self.path, self.metrics.history)


class Evaluation:
    """Every `period` iterations: evaluate(model, iteration) -> {metric: value} (the same numbers on
    every rank), kept in the history a resumed run continues, logged as a json_stats line, and left in
    loop.storage['evaluation'] for the best checkpoint. Runs before the checkpoint of its iteration, so
    a run stopped during an evaluation repeats it when resumed."""

    def __init__(self, period, evaluate, metrics, state_key):
        self.period, self.evaluate, self.metrics, self.state_key = period, evaluate, metrics, state_key
        self.history = []

    def writes_at(self, iteration):
        return (iteration + 1) % self.period == 0

    def after_step(self, loop):
        if not self.writes_at(loop.iter):
            return
        started = time.perf_counter()
        values = self.evaluate(loop.model_without_ddp, loop.iter)
        logger.info('%s after iteration %d took %.2f s', self.state_key, loop.iter, time.perf_counter() - started)
        self.history.append(dict(values, iter=loop.iter))
        loop.storage.setdefault('evaluation', {}).update(values)
        loop.storage['evaluated_at'] = loop.iter
        self.metrics.log_extra(loop.iter, values)

    def state_dict(self):
        return {'history': list(self.history)}

    def load_state_dict(self, state):
        self.history = list(state['history'])


class BestCheckpoint:
    """model_best.pth: the model after the iteration whose evaluation gave the best value of `metric`
    (the highest, or with mode 'min' the lowest), written atomically with the iteration and the value;
    never pruned. Its record travels in the checkpoints, so a resumed run keeps the best so far."""

    state_key = 'best'
    NAME = 'model_best.pth'

    def __init__(self, output_dir, metric, mode):
        self.path = os.path.join(output_dir, self.NAME)
        self.metric, self.mode = metric, mode
        self.best = None  # {'iter', 'metric', 'value'}

    def after_step(self, loop):
        if loop.storage.get('evaluated_at') != loop.iter:
            return
        values = loop.storage['evaluation']
        if self.metric not in values:
            raise DetectronError('TEST.BEST_METRIC {!r} is not among the evaluation\'s metrics {}; name one of '
                                 'them'.format(self.metric, sorted(values)))
        value = float(values[self.metric])
        if self.best is not None and not self._better(value, self.best['value']):
            return
        self.best = {'iter': loop.iter, 'metric': self.metric, 'value': value}
        rng_states = checkpointer.gather_rng_states()
        if comm.is_main_process():
            checkpointer.save_checkpoint(self.path, loop.model_without_ddp, loop.optimizer, loop.iter,
                                       extra={'best': dict(self.best)}, rng_states=rng_states)
            logger.info('Wrote %s: %s %.6g after iteration %d', self.path, self.metric, value, loop.iter)
        comm.synchronize()

    def _better(self, value, best):
        return value < best if self.mode == 'min' else value > best

    def state_dict(self):
        return dict(self.best) if self.best else {}

    def load_state_dict(self, state):
        self.best = dict(state)
