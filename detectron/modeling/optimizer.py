"""Optimizers of SOLVER.OPTIMIZER: Detectron's SGD (Caffe2 MomentumSGDUpdate with Detectron's
parameter groups) and CenterNet's Adam; the training loop sets their LR through param_groups.

Caffe2 folds the learning rate into the momentum history (v <- mu*v + lr*g; p <- p - v), unlike
torch.optim.SGD (v <- mu*v + g; p <- p - lr*v). The two agree while the LR is constant; when it changes,
Detectron rescales the history by new/old only if the change exceeds SCALE_MOMENTUM_THRESHOLD, so during
warm-up (small per-iteration changes) the Caffe2 form gives different updates. We implement the Caffe2
form so training curves match Detectron's.

Groups: biases get 2x LR and no weight decay (Detectron's optimizer.py); other trainable parameters get
the base LR and WEIGHT_DECAY; norm parameters of trainable GN/BN bodies are treated like Detectron's GN
parameters (WEIGHT_DECAY_GN).
"""
import torch

from detectron.utils.errors import ConfigValueError


def lr_change_ratio(old_lr, new_lr):
    """How large a change from old_lr to new_lr is, either way (>= 1; inf when either is not positive),
    Detectron's measure for logging an LR change and for rescaling momentum."""
    return max(new_lr / old_lr, old_lr / new_lr) if old_lr > 0 and new_lr > 0 else float('inf')


class DetectronSGD(torch.optim.Optimizer):
    """Momentum SGD in Caffe2's form. The learning rate is set through param_groups (set_lr below);
    each group's lr is base LR x its lr_mult."""

    def __init__(self, param_groups, lr, momentum=0.9, scale_momentum=True, scale_momentum_threshold=1.1):
        defaults = dict(lr=lr, lr_mult=1.0, momentum=momentum, weight_decay=0.0)
        super().__init__(param_groups, defaults)
        for group in self.param_groups:
            group['lr'] = lr * group['lr_mult']
        # The base LR of the last step: a change is detected (and the momentum rescaled) at the next step.
        self.base_lr = float(lr)
        self.scale_momentum = scale_momentum
        self.scale_momentum_threshold = scale_momentum_threshold

    @property
    def current_lr(self):
        return self.base_lr

    def _rescale_momentum_on_lr_change(self, new_lr):
        """Detectron's UpdateWorkspaceLr: momentum histories x new/old when the change is large."""
        old_lr = self.base_lr
        if new_lr == old_lr:
            return
        if self.scale_momentum and old_lr > 1e-7 and lr_change_ratio(old_lr, new_lr) > self.scale_momentum_threshold:
            for group in self.param_groups:
                for p in group['params']:
                    buf = self.state[p].get('momentum_buffer')
                    if buf is not None:
                        buf.mul_(new_lr / old_lr)
        self.base_lr = new_lr

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        first = self.param_groups[0]
        self._rescale_momentum_on_lr_change(float(first['lr']) / first['lr_mult'])
        for group in self.param_groups:
            params = [p for p in group['params'] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group['weight_decay'] != 0:
                # Into the gradients, as Detectron's WeightedSum(grad, 1, param, WD) -> grad: a new set
                # of gradient tensors took half of the optimizer's time on the CPU (BENCHMARKS.md, "CPU demos").
                torch._foreach_add_(grads, params, alpha=group['weight_decay'])
            bufs = []
            for p in params:
                state = self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = torch.zeros_like(p)
                bufs.append(state['momentum_buffer'])
            torch._foreach_mul_(bufs, group['momentum'])
            torch._foreach_add_(bufs, grads, alpha=self.base_lr * group['lr_mult'])
            torch._foreach_sub_(params, bufs)
        return loss

    def state_dict(self):
        state = super().state_dict()
        state['base_lr'] = self.base_lr
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.base_lr = state_dict.pop('base_lr', self.base_lr)
        super().load_state_dict(state_dict)


def load_momentum(optimizer, model, momentum):
    """Start DetectronSGD's histories from {parameter name: tensor} (a Detectron checkpoint's
    `<blob>_momentum`, in Caffe2's lr-folded form like our buffers); returns how many were set."""
    params = dict(model.named_parameters())
    optimized = {p for group in optimizer.param_groups for p in group['params']}
    count = 0
    for name, history in momentum.items():
        p = params.get(name)
        if p is not None and p in optimized and history.shape == p.shape:
            optimizer.state[p]['momentum_buffer'] = history.to(device=p.device, dtype=p.dtype).clone()
            count += 1
    return count


def set_lr(optimizer, lr):
    """Set every param group's learning rate to lr x its lr_mult (1 for groups without one)."""
    for group in optimizer.param_groups:
        group['lr'] = float(lr) * group.get('lr_mult', 1.0)


_NORM_TYPES = (torch.nn.GroupNorm, torch.nn.BatchNorm2d, torch.nn.SyncBatchNorm)


def detectron_param_groups(model, weight_decay, weight_decay_norm=0.0, bias_lr_factor=2.0):
    """Split trainable parameters into Detectron's groups (weights, biases, norm affines)."""
    norm_params = set()
    for module in model.modules():
        if isinstance(module, _NORM_TYPES):
            norm_params.update(id(p) for p in module.parameters(recurse=False))
    weights, biases, norms = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in norm_params:
            norms.append(p)
        elif name.endswith('bias'):
            biases.append(p)
        else:
            weights.append(p)
    groups = [
        dict(params=weights, weight_decay=weight_decay, lr_mult=1.0),
        dict(params=biases, weight_decay=0.0, lr_mult=bias_lr_factor),
        dict(params=norms, weight_decay=weight_decay_norm, lr_mult=1.0),
    ]
    return [g for g in groups if g['params']]


def build_optimizer(model, base_lr, momentum=0.9, weight_decay=0.0, weight_decay_norm=0.0,
                    scale_momentum=True, scale_momentum_threshold=1.1, name='sgd'):
    """SOLVER.OPTIMIZER `name`: 'sgd' is Detectron's SGD with its parameter groups; 'adam' is
    CenterNet's torch.optim.Adam over all trainable parameters (one group, weight_decay as given;
    CenterNet uses none)."""
    if name == 'sgd':
        groups = detectron_param_groups(model, weight_decay, weight_decay_norm)
        return DetectronSGD(groups, lr=base_lr, momentum=momentum, scale_momentum=scale_momentum,
                            scale_momentum_threshold=scale_momentum_threshold)
    if name == 'adam':
        params = [p for p in model.parameters() if p.requires_grad]
        # On CUDA the fused kernel: one launch for all parameters instead of a dozen foreach
        # passes, whose launches showed in CenterNet's step (BENCHMARKS.md, "CenterNet speed").
        fused = bool(params) and all(p.is_cuda for p in params)
        return torch.optim.Adam(params, lr=float(base_lr), weight_decay=weight_decay, fused=fused or None)
    raise ConfigValueError("SOLVER.OPTIMIZER must be 'sgd' or 'adam', got {!r}".format(name))
