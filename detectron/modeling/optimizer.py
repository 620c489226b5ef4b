"""Detectron's SGD: Caffe2 MomentumSGDUpdate with Detectron's parameter groups.

Caffe2 folds the learning rate into the momentum history (v <- mu*v + lr*g; p <- p - v), unlike
torch.optim.SGD (v <- mu*v + g; p <- p - lr*v). The two agree while the LR is constant; when it changes,
Detectron rescales the history by new/old only if the change exceeds SCALE_MOMENTUM_THRESHOLD, so during
warm-up (small per-iteration changes) the Caffe2 form gives different updates. We implement the Caffe2
form so training curves match Detectron's.

Groups: biases get 2x LR and no weight decay (Detectron's optimizer.py); other trainable parameters get
the base LR and WEIGHT_DECAY; norm parameters of trainable GN/BN bodies are treated like Detectron's GN
parameters (WEIGHT_DECAY_GN).
"""
import logging

import torch

logger = logging.getLogger(__name__)


class DetectronSGD(torch.optim.Optimizer):
    """Momentum SGD in Caffe2's form; call set_lr() every iteration with the policy's LR."""

    def __init__(self, param_groups, lr, momentum=0.9, scale_momentum=True,
                 scale_momentum_threshold=1.1, log_lr_change_threshold=1.1):
        defaults = dict(lr=lr, lr_mult=1.0, momentum=momentum, weight_decay=0.0)
        super().__init__(param_groups, defaults)
        self.base_lr = float(lr)
        self.scale_momentum = scale_momentum
        self.scale_momentum_threshold = scale_momentum_threshold
        self.log_lr_change_threshold = log_lr_change_threshold

    @property
    def current_lr(self):
        return self.base_lr

    def set_lr(self, new_lr, cur_iter=None):
        """Move to new_lr, rescaling momentum histories as Detectron's UpdateWorkspaceLr does."""
        old_lr = self.base_lr
        new_lr = float(new_lr)  # lr_policy returns np.float32; checkpoints hold plain floats
        if new_lr == old_lr:
            return
        ratio = max(new_lr / old_lr, old_lr / new_lr) if old_lr > 0 and new_lr > 0 else float('inf')
        if ratio > self.log_lr_change_threshold:
            logger.info('Changing learning rate %.6f -> %.6f at iter %s', old_lr, new_lr, cur_iter)
        if self.scale_momentum and old_lr > 1e-7 and ratio > self.scale_momentum_threshold:
            for group in self.param_groups:
                for p in group['params']:
                    buf = self.state[p].get('momentum_buffer')
                    if buf is not None:
                        buf.mul_(new_lr / old_lr)
        self.base_lr = new_lr

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group['params'] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group['weight_decay'] != 0:
                grads = torch._foreach_add(grads, params, alpha=group['weight_decay'])
            bufs = []
            for p in params:
                state = self.state[p]
                if 'momentum_buffer' not in state:
                    state['momentum_buffer'] = torch.zeros_like(p)
                bufs.append(state['momentum_buffer'])
            torch._foreach_mul_(bufs, group['momentum'])
            torch._foreach_add_(bufs, grads, alpha=self.base_lr * group['lr_mult'])
            torch._foreach_sub_(params, bufs)
            group['lr'] = self.base_lr * group['lr_mult']
        return loss

    def state_dict(self):
        state = super().state_dict()
        state['base_lr'] = self.base_lr
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self.base_lr = state_dict.pop('base_lr', self.base_lr)
        super().load_state_dict(state_dict)


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


def build_optimizer(model, base_lr, momentum, weight_decay, weight_decay_norm=0.0,
                    scale_momentum=True, scale_momentum_threshold=1.1, log_lr_change_threshold=1.1):
    groups = detectron_param_groups(model, weight_decay, weight_decay_norm)
    return DetectronSGD(groups, lr=base_lr, momentum=momentum, scale_momentum=scale_momentum,
                        scale_momentum_threshold=scale_momentum_threshold,
                        log_lr_change_threshold=log_lr_change_threshold)
