"""Training checkpoints: write atomically with a digest, keep the files a model type asks for
(`Retention`), find the newest intact one, load, resume.

Starting from a file means one of two different things; they are separate functions on purpose:
- `resume_from(path, model, optimizer)` continues an interrupted run: model, optimizer (momentum),
  iteration, RNG states and the sampler position (the iteration, or the stored draw count where a check
  drops draws). The learning rate is not stored: as in Detectron it is recomputed from the iteration.
- Initialising from weights (TRAIN.WEIGHTS: a Detectron .pkl, torchvision weights or a
  model_final.pth) loads model tensors only and starts at iteration 0 with a fresh optimizer; that is
  detectron/checkpoint/c2_weights.py's `load_weights`, not this module.

In a multi-process run only rank 0 writes (the caller checks `is_main_process()`; the functions here
do not look at the rank) and every rank reads, into CPU memory first, so that no rank puts a copy of
the file on GPU 0. Files hold only tensors, numbers, strings and plain containers, so they load with
torch.load(weights_only=True): reading a checkpoint never runs pickled code.

Integrity: a checkpoint is written only when every parameter and optimizer state is finite and short of
float32 overflow, it carries a digest of its content (checkpoint/torch_file.py) that every load checks, and
resuming skips newer files that are truncated or damaged (an interrupted copy, a full disk) for the
newest intact one.
"""
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass

import numpy as np
import torch

from detectron.checkpoint.torch_file import read_torch_file, write_torch_file
from detectron.utils.comm import all_gather_object, get_rank, get_world_size, unwrap_model
from detectron.utils.errors import DetectronError, WeightsError
from detectron.utils.io import _write_atomically

logger = logging.getLogger(__name__)

FINAL_CHECKPOINT_NAME = 'model_final.pth'
LAST_CHECKPOINT_NAME = 'model_last.pth'
_ITERATION_CHECKPOINT = re.compile(r'^model_iter(\d+)\.pth$')
_PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None))
_REQUIRED_KEYS = ('model', 'optimizer', 'iteration', 'world_size', 'rng_states')
# sqrt of float32's largest value: the product of two such numbers is inf. No trained detector comes near
# it (weights are O(1)), while a diverging run passes it (BASE_LR 1e6: 3e20 one step before the loss is NaN).
DIVERGED_MAGNITUDE = float(np.sqrt(np.finfo(np.float32).max))


class DivergedWeightsError(DetectronError, FloatingPointError):
    """A parameter or optimizer state holds NaN, inf or a diverged value: no checkpoint is written."""


def checkpoint_name(iteration):
    """Detectron's name for the checkpoint written after iteration `iteration` (0-based)."""
    return 'model_iter{}.pth'.format(iteration)


@dataclass(frozen=True)
class Retention:
    """Which checkpoint files a run writes and keeps (a model type's choice, see ModelType).

    last: every checkpoint overwrites LAST_CHECKPOINT_NAME (CenterNet's model_last.pth) instead of
      adding a model_iterN.pth each period (Detectron's rule, the default).
    milestones: iterations after which model_iterN.pth is written and kept whatever the period
      (CenterNet's checkpoint at each LR step, taken before the drop).
    keep: how many model_iterN.pth files stay, the oldest removed first; 0 keeps all
      (TRAIN.KEEP_CHECKPOINTS). model_last.pth and model_final.pth are never removed.
    """
    last: bool = False
    milestones: frozenset = frozenset()
    keep: int = 0

    def names(self, iteration, periodic):
        """The files to write after iteration (0-based); periodic: the checkpoint period ends there."""
        numbered = [checkpoint_name(iteration)] if iteration in self.milestones or (periodic and not self.last) else []
        # With `last`, model_last.pth is written with any other file, so it is always the newest one.
        return ([LAST_CHECKPOINT_NAME] if self.last and (periodic or numbered) else []) + numbered

    def describe(self):
        """Where the checkpoints go and which stay, for the schedule print-out."""
        kept = 'all kept' if self.keep <= 0 else 'the {} newest kept (TRAIN.KEEP_CHECKPOINTS)'.format(self.keep)
        if not self.last:
            return 'into model_iterN.pth, {}'.format(kept)
        steps = ', '.join(str(it) for it in sorted(self.milestones)) or 'none'
        return 'into model_last.pth (overwritten); model_iterN.pth after iterations {}, {}'.format(steps, kept)


def prune_checkpoints(output_dir, keep):
    """Remove all but the `keep` newest model_iterN.pth of output_dir (keep 0: none removed);
    returns the removed paths."""
    if keep <= 0:
        return []
    numbered = [path for path in checkpoints_newest_first(output_dir)
                if _ITERATION_CHECKPOINT.match(os.path.basename(path))]
    for path in numbered[keep:]:
        os.remove(path)
    return numbered[keep:]


def copy_checkpoint(source, path):
    """Make path a copy of the checkpoint file source, atomically, without serialising it again."""
    with open(source, 'rb') as f:
        _write_atomically(path, lambda out: shutil.copyfileobj(f, out, 1 << 24))


def save_checkpoint(path, model, optimizer, iteration, extra=None, rng_states=None, sampler_state=None):
    """Write a training checkpoint to path atomically (rank 0 only; see the module doc).

    iteration: the last completed iteration, Detectron's N of model_iterN; a resume starts at N + 1.
    rng_states: {rank: state} from gather_rng_states(), a collective every rank calls before rank 0
      saves; by default only this process's state is stored.
    sampler_state: plain values that must match on resume, e.g. {'seed': s, 'global_batch_size': g}, and
      others a resume reads back (resume_from_last), e.g. the sampler's 'position'.
    extra: plain data to keep alongside, e.g. {'cfg': cfg.dump()}.
    Readers see the old file or the complete new one, never a partial file. Raises
    DivergedWeightsError (and writes nothing) if a parameter or optimizer state is not finite or beyond
    DIVERGED_MAGNITUDE (see check_not_diverged).
    """
    _check_plain(extra, 'extra')
    _check_plain(sampler_state, 'sampler_state')
    check_not_diverged(model, optimizer, iteration, path)
    checkpoint = _on_host({
        'model': unwrap_model(model).state_dict(),
        'optimizer': optimizer.state_dict(),
        'iteration': int(iteration),
        'world_size': get_world_size(),
        'rng_states': rng_states if rng_states is not None else {get_rank(): capture_rng_state()},
        'sampler': sampler_state,
        'extra': extra if extra is not None else {},
    })
    write_torch_file(checkpoint, path)


def _on_host(value):
    """value with its tensors in host memory, contiguous: the one host copy of a checkpoint, which the
    digest and torch.save then read as it is. A device tensor is made contiguous on its device first
    (channels_last weights: a copy on the device, not a second one on the host); a host tensor is
    copied only if it is not contiguous, and otherwise saved as it is."""
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous().cpu()
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    return value


def check_not_diverged(model, optimizer, iteration, path):
    """Raise DivergedWeightsError naming the first tensors (model parameters and buffers, optimizer
    state) that hold NaN, inf or values beyond +-DIVERGED_MAGNITUDE. Checked on the tensors' device with
    one host sync."""
    named = [(name, t) for name, t in _named_floating_tensors(unwrap_model(model), optimizer) if t.numel()]
    if not named:
        return
    # amax(|t|) <= bound is False for NaN and inf too: one reduction per tensor covers all three.
    # The results meet on one device: optimizer state may hold CPU scalars (Adam's step) beside GPU tensors.
    device = named[0][1].device
    sane = torch.stack([(t.detach().abs().amax() <= DIVERGED_MAGNITUDE).to(device) for _, t in named])
    if bool(sane.all()):
        return
    bad = [name for (name, _), ok in zip(named, sane.tolist()) if not ok]
    raise DivergedWeightsError(
        'Training diverged by iteration {}: {} of {} tensors hold NaN, inf or values beyond {:.1e} (e.g. {}); {} was '
        'not written and earlier checkpoints are intact; lower SOLVER.BASE_LR (or add warm-up) or check the '
        'data'.format(iteration, len(bad), len(named), DIVERGED_MAGNITUDE, ', '.join(bad[:3]), path))


def _named_floating_tensors(model, optimizer):
    names = {id(p): name for name, p in model.named_parameters()}
    named = [(name, t) for name, t in model.state_dict().items() if t.is_floating_point()]
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                named.append(('{} of {}'.format(key, names.get(id(param), 'a parameter')), value))
    return named


def _check_plain(value, where):
    # Exact types: a dict subclass such as a CfgNode would need unpickling code to load.
    if type(value) not in _PLAIN_TYPES and not isinstance(value, torch.Tensor):
        raise TypeError('{} is a {}; checkpoints hold only dicts, lists, tuples, strings, numbers, '
                        'None and tensors (pass cfg.dump(), not cfg)'.format(where, type(value).__name__))
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        _check_plain(item, '{}[{!r}]'.format(where, key))


def find_last_checkpoint(output_dir):
    """model_final.pth if present (training is complete), else model_last.pth (written with every
    checkpoint of a run that keeps one, so never older than its numbered files), else the
    model_iter{N}.pth with the largest N, else None. Unfinished temporary files are never returned.
    The file is not read: see resume_from_last for the newest one that is also intact."""
    candidates = checkpoints_newest_first(output_dir)
    return candidates[0] if candidates else None


def checkpoints_newest_first(output_dir):
    """The checkpoint files of output_dir (model_final.pth, model_last.pth, model_iterN.pth by falling N)."""
    if not os.path.isdir(output_dir):
        return []
    names = os.listdir(output_dir)
    named = [os.path.join(output_dir, name) for name in (FINAL_CHECKPOINT_NAME, LAST_CHECKPOINT_NAME) if name in names]
    iterations = sorted((int(m.group(1)) for m in map(_ITERATION_CHECKPOINT.match, names) if m), reverse=True)
    return named + [os.path.join(output_dir, checkpoint_name(i)) for i in iterations]


def resume_from_last(output_dir, model, optimizer, sampler_state=None):
    """Resume from the newest readable and intact checkpoint of output_dir (see resume_from).

    Returns (path, iteration to start at, the checkpoint's `extra` data, its sampler state or None), or
    (None, 0, {}, None) when output_dir has no checkpoint. Newer files
    that are truncated or damaged are skipped with a warning naming them; if every file is, the newest
    one's error is raised. A checkpoint that reads but does not fit the model is an error, not skipped.
    """
    candidates = checkpoints_newest_first(output_dir)
    skipped = []
    for path in candidates:
        try:
            checkpoint = _read(path)
        except WeightsError as err:
            skipped.append((path, err))
            continue
        if skipped:
            logger.warning('Skipping the newest checkpoint%s, which cannot be resumed: %s; resuming from the '
                           'newest intact one, %s', 's' if len(skipped) > 1 else '',
                           '; '.join(str(err) for _, err in skipped), path)
        logger.info('========> Resuming from checkpoint %s', path)
        return (path,) + _resume(path, checkpoint, model, optimizer, sampler_state) + (checkpoint['sampler'],)
    if skipped:
        raise skipped[0][1]
    return None, 0, {}, None


def load_checkpoint(path, model, optimizer=None):
    """Load model (and optimizer) state and this rank's RNG state from path; return the checkpoint.

    The returned dict has 'iteration', 'world_size', 'sampler' and 'extra'. Works whatever the world
    size of the saving run; RNG states are restored only when it is the same (see restore_rng_states).
    """
    checkpoint = _read(path)
    _load_into(path, checkpoint, model, optimizer)
    return checkpoint


def _load_into(path, checkpoint, model, optimizer):
    _load_model_state(unwrap_model(model), checkpoint['model'], path)
    if optimizer is not None:
        # Optimizer.load_state_dict moves the state (momentum) to each parameter's device.
        optimizer.load_state_dict(checkpoint['optimizer'])
    restore_rng_states(checkpoint['rng_states'], checkpoint['world_size'])


def resume_from(path, model, optimizer, sampler_state=None):
    """Continue the run saved at path; returns the iteration to start at (saved iteration + 1).

    sampler_state: this run's, compared with the saved one's same keys: a different seed or global batch
    means the data order no longer continues the interrupted run (a warning, not an error: changing the
    global batch together with the schedule is a legitimate choice).
    """
    return _resume(path, _read(path), model, optimizer, sampler_state)[0]


def _resume(path, checkpoint, model, optimizer, sampler_state):
    """(start iteration, extra) after loading checkpoint into model and optimizer."""
    _load_into(path, checkpoint, model, optimizer)
    saved = checkpoint['sampler']
    if sampler_state is not None and saved is not None:
        # Other saved keys (the sampler's position) say where the run stood, not what must match.
        compared = {k: saved.get(k) for k in sampler_state}
        if compared != sampler_state:
            logger.warning('Resuming %s with sampler state %s, but it was saved with %s: the data order '
                           'does not continue the interrupted run', path, sampler_state, compared)
    return checkpoint['iteration'] + 1, checkpoint['extra']


def _read(path):
    if os.path.isdir(path):
        raise WeightsError('checkpoint {} is a directory, not a checkpoint file'.format(path))
    if not os.path.isfile(path):
        raise WeightsError('checkpoint {} does not exist'.format(path))
    checkpoint = read_torch_file(path)
    keys = set(checkpoint) if isinstance(checkpoint, dict) else set()
    missing = sorted(set(_REQUIRED_KEYS) - keys)
    if missing:
        raise WeightsError('{} is not a training checkpoint (it lacks {}); to start from its weights '
                           'use TRAIN.WEIGHTS instead of resuming'.format(path, ', '.join(missing)))
    return checkpoint


def _load_model_state(model, state_dict, path):
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    mismatched = ['{} {} vs {}'.format(k, tuple(v.shape), tuple(own[k].shape))
                  for k, v in state_dict.items() if k in own and v.shape != own[k].shape]
    if missing or unexpected or mismatched:
        raise WeightsError('checkpoint {} does not fit the model (missing {}, unexpected {}, shape '
                           'mismatches {}); resume with the config that wrote it'.format(
                               path, missing[:5], unexpected[:5], mismatched[:5]))
    model.load_state_dict(state_dict)


# ----------------------------------------------------------------------------------------------
# RNG states

def capture_rng_state():
    """This process's python, numpy, torch CPU and (if in use) current CUDA device generator states."""
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        'python': random.getstate(),
        # numpy's array becomes a list: weights_only loading accepts no numpy objects.
        'numpy': {'keys': keys.tolist(), 'position': int(position), 'has_gauss': int(has_gauss),
                  'cached_gaussian': float(cached_gaussian)},
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state):
    """Inverse of capture_rng_state (the CUDA state only if present and CUDA is in use)."""
    random.setstate(state['python'])
    numpy_state = state['numpy']
    np.random.set_state(('MT19937', np.asarray(numpy_state['keys'], dtype=np.uint32),
                         numpy_state['position'], numpy_state['has_gauss'], numpy_state['cached_gaussian']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state['cuda'])


def gather_rng_states():
    """{rank: capture_rng_state()} of every rank, on every rank. A collective: all ranks call it."""
    return dict(enumerate(all_gather_object(capture_rng_state())))


def restore_rng_states(rng_states, saved_world_size):
    """Give this rank its saved RNG state, if the saving run had the same world size and saved it.

    Otherwise the generators keep their seeded state: with another number of processes the random
    streams cannot continue those of the interrupted run anyway.
    """
    rank = get_rank()
    if saved_world_size != get_world_size() or rank not in rng_states:
        logger.info('Rank %d keeps its seeded RNG state (checkpoint saved by %d processes with states '
                    'of ranks %s, this run has %d)', rank, saved_world_size, sorted(rng_states),
                    get_world_size())
        return
    set_rng_state(rng_states[rank])
