"""TRAIN.CHECKPOINT_ACTIVATIONS: run a block keeping only its inputs, and recompute its activations in
the backward pass (torch.utils.checkpoint, non-reentrant), trading compute for memory.

The recomputation runs the block's BatchNorm layers in training mode a second time; they would fold
the same batch statistics into their running averages twice. During it their momentum is 0, so the
running statistics (and the batch counter) stay as the forward left them: a checkpointed run trains
and evaluates as the plain one.
"""
import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpointed(enabled, block, *inputs):
    """block(*inputs), checkpointed when enabled and autograd records (a training forward)."""
    if not (enabled and torch.is_grad_enabled()):
        return block(*inputs)
    return checkpoint(block, *inputs, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _running_statistics_frozen(block)))


@contextlib.contextmanager
def _running_statistics_frozen(block):
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and m.training and m.track_running_stats]
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0  # running = (1 - 0) * running + 0 * batch statistic
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (momentum, count) in zip(norms, saved):
                m.momentum = momentum
                m.num_batches_tracked.copy_(count)
