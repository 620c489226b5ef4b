"""The training loop: iterations of micro-steps, AMP, gradient clipping and the optimizer step, with
everything else done by hooks (detectron2's SimpleTrainer and HookBase shape).

A hook may define `before_train(loop)`, `before_step(loop)`, `after_step(loop)`, `after_train(loop)`;
the loop calls them in the order of its hook list. During `after_step`, `loop.iter` is the iteration
just stepped and `loop.total` / `loop.outputs` its loss and the model's outputs (last micro-step).
A hook that writes something a diverged run must not write (a log line, a checkpoint, an evaluation)
answers True from `writes_at(iteration)`, so that the non-finite check runs first. A hook with state
that a resumed run needs names it `state_key` and gives `state_dict()` / `load_state_dict(state)`:
the checkpoints carry those states under their keys.
"""
import contextlib
import time
from dataclasses import dataclass

import torch

from detectron.roi_data.prefetch import DevicePrefetcher
from detectron.utils.errors import raise_if_stopped

AMP_DTYPES = {'float16': torch.float16, 'bfloat16': torch.bfloat16}  # SOLVER.AMP.DTYPE


@dataclass(frozen=True)
class GradientClipping:
    """detectron2's SOLVER.CLIP_GRADIENTS: each parameter group of the optimizer clipped on its own
    (as detectron2's per-group clipper), by value (every element into [-value, value]) or by norm
    (the group's norm_type norm scaled down to at most value)."""
    clip_type: str = 'value'
    value: float = 1.0
    norm_type: float = 2.0


@dataclass(frozen=True)
class StepOptions:
    """One optimizer step: SOLVER.ITER_SIZE micro-batches, autocast, loss scaling and clipping."""
    iter_size: int = 1
    amp: bool = False
    amp_dtype: str = 'float16'
    loss_scale: float = 0.0  # 0: dynamic loss scaling with float16
    clipping: GradientClipping = None  # None: gradients are not clipped


class TrainLoop:
    """Iterations start_iter .. max_iter - 1 of `model(*batch_to_device(batch))`, which returns a dict
    of scalar tensors whose keys starting with 'loss' are summed into the objective."""

    def __init__(self, model, optimizer, batches, device, start_iter, max_iter, step=StepOptions(), hooks=(),
                 batch_to_device=None, ddp_model=None, out_of_memory=None):
        self.model_without_ddp = model
        self.model = ddp_model or model
        self.optimizer = optimizer
        self.device = device
        self.start_iter, self.max_iter = start_iter, max_iter
        self.step = step
        self.hooks = list(hooks)
        # Each micro-batch moved to the device while the step before it runs.
        self.batches = DevicePrefetcher(batches, batch_to_device or (lambda batch: batch), device,
                                        count=max(max_iter - start_iter, 0) * step.iter_size)
        self.out_of_memory = out_of_memory
        self.amp_dtype = AMP_DTYPES[step.amp_dtype]
        self.scaler = self._make_scaler()
        self.iter = start_iter - 1
        self.total, self.outputs, self.data_time, self.grad_norm = None, {}, 0.0, None
        self.storage = {}  # values hooks hand each other (the learning rate, the latest evaluation)

    def _make_scaler(self):
        fp16 = self.step.amp and self.amp_dtype == torch.float16
        if not fp16 or self.step.loss_scale > 0:
            return None
        return torch.amp.GradScaler(self.device.type)

    def run(self):
        self.model.train()
        try:
            self._call('before_train')
            for self.iter in range(self.start_iter, self.max_iter):
                self._call('before_step')
                self.run_step()
                self._call('after_step')
                raise_if_stopped()
            self._call('after_train')
        except torch.OutOfMemoryError:
            if self.out_of_memory is None:
                raise
            raise self.out_of_memory(self.iter) from None

    def _call(self, event):
        for hook in self.hooks:
            method = getattr(hook, event, None)
            if method is not None:
                method(self)

    def writes_at(self, iteration):
        """Whether some hook writes a log line, checkpoint or evaluation after this iteration."""
        return any(getattr(hook, 'writes_at', lambda it: False)(iteration) for hook in self.hooks)

    def hook_states(self):
        return {hook.state_key: hook.state_dict() for hook in self.hooks if getattr(hook, 'state_key', None)}

    def load_hook_states(self, states):
        for hook in self.hooks:
            key = getattr(hook, 'state_key', None)
            if key and states.get(key):
                hook.load_state_dict(states[key])

    def run_step(self):
        self.optimizer.zero_grad(set_to_none=True)
        self.data_time = 0.0
        for micro in range(self.step.iter_size):
            batch = self._timed_data(lambda: next(self.batches))
            self.total, self.outputs = self._micro_step(batch, sync=micro == self.step.iter_size - 1)
            if micro < self.step.iter_size - 1:
                self._timed_data(self.batches.prefetch)
        self._unscale_gradients()
        self.grad_norm = self._clip_gradients()
        self._optimizer_step()
        # The next batch's upload is queued behind this step's kernels on another stream.
        self._timed_data(self.batches.prefetch)

    def _timed_data(self, fn):
        """fn(), its time added to data_time (the step's wait for the loader)."""
        tic = time.time()
        result = fn()
        self.data_time += time.time() - tic
        return result

    def _micro_step(self, batch, sync):
        no_sync = getattr(self.model, 'no_sync', None)
        context = contextlib.nullcontext() if sync or no_sync is None else no_sync()
        with context:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.step.amp):
                outputs = self.model(*batch)
            total = sum(v for k, v in outputs.items() if k.startswith('loss'))
            scaled = total / self.step.iter_size
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            elif self.step.loss_scale > 0 and self.step.amp:
                scaled = scaled * self.step.loss_scale
            scaled.backward()
        return total, outputs

    def _unscale_gradients(self):
        """The gradients of the objective itself, before clipping and the step (float16 loss scaling
        undone: dynamically by the scaler, which then skips a step with inf / NaN, or by the static scale)."""
        if self.scaler is not None:
            if self.step.clipping is not None:
                self.scaler.unscale_(self.optimizer)
            return
        if self.step.amp and self.step.loss_scale > 0:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / self.step.loss_scale)

    def _clip_gradients(self):
        """Clip each parameter group's gradients; returns the largest group's norm before clipping (a
        device tensor, read only when logged), or None without clipping."""
        clipping = self.step.clipping
        if clipping is None:
            return None
        norms = []
        for group in self.optimizer.param_groups:
            params = [p for p in group['params'] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            norm_type = clipping.norm_type if clipping.clip_type == 'norm' else 2.0
            norms.append(torch.nn.utils.get_total_norm(grads, norm_type))
            if clipping.clip_type == 'norm':
                torch.nn.utils.clip_grads_with_norm_(params, clipping.value, norms[-1])
            else:
                torch._foreach_clamp_min_(grads, -clipping.value)
                torch._foreach_clamp_max_(grads, clipping.value)
        return torch.stack(norms).max() if norms else None

    def _optimizer_step(self):
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
