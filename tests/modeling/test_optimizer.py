import numpy as np
import torch

from detectron.modeling.optimizer import build_optimizer, set_lr


def _caffe2_reference(w, b, grads_w, grads_b, lrs, mu, wd, threshold=1.1):
    """Plain numpy transcription of Caffe2 MomentumSGDUpdate + Detectron's momentum rescaling."""
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    old = lrs[0]
    for lr, gw, gb in zip(lrs, grads_w, grads_b):
        if lr != old and old > 1e-7 and max(lr / old, old / lr) > threshold:
            vw *= lr / old
            vb *= lr / old
        old = lr
        vw = mu * vw + lr * (gw + wd * w)
        vb = mu * vb + 2 * lr * gb          # biases: 2x LR, no weight decay
        w = w - vw
        b = b - vb
    return w, b


def test_detectron_sgd_matches_caffe2_update_with_momentum_rescaling():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    w0, b0 = lin.weight.detach().numpy().copy(), lin.bias.detach().numpy().copy()
    lrs = [0.1, 0.1, 0.2, 0.205, 0.02]  # x2 rescales, x1.025 does not, /10.25 rescales
    rng = np.random.RandomState(1)
    gws = [rng.randn(2, 3).astype(np.float32) for _ in lrs]
    gbs = [rng.randn(2).astype(np.float32) for _ in lrs]
    opt = build_optimizer(lin, base_lr=lrs[0], momentum=0.9, weight_decay=1e-2)
    for it, (lr, gw, gb) in enumerate(zip(lrs, gws, gbs)):
        set_lr(opt, lr)  # the training loop sets the LR through param_groups
        lin.weight.grad = torch.from_numpy(gw.copy())  # the step adds the weight decay into .grad
        lin.bias.grad = torch.from_numpy(gb.copy())
        opt.step()
    ref_w, ref_b = _caffe2_reference(w0.astype(np.float64), b0.astype(np.float64), gws, gbs, lrs, 0.9, 1e-2)
    np.testing.assert_allclose(lin.weight.detach().numpy(), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.bias.detach().numpy(), ref_b, rtol=1e-5, atol=1e-6)


def test_frozen_parameters_are_left_out_and_state_round_trips():
    lin = torch.nn.Linear(2, 2)
    lin.bias.requires_grad_(False)
    opt = build_optimizer(lin, base_lr=0.5, momentum=0.9, weight_decay=0.0)
    assert [len(g['params']) for g in opt.param_groups] == [1]
    lin.weight.grad = torch.ones(2, 2)
    opt.step()
    set_lr(opt, 0.25)
    lin.weight.grad = torch.zeros(2, 2)
    opt.step()  # the momentum history is rescaled when a step sees the new LR
    state = opt.state_dict()
    opt2 = build_optimizer(lin, base_lr=1.0, momentum=0.9, weight_decay=0.0)
    opt2.load_state_dict(state)
    assert opt2.current_lr == 0.25
    buf = opt2.state[lin.weight]['momentum_buffer']
    # one step at lr 0.5 with unit gradient gives history 0.5, halved by the 0.5 -> 0.25 change,
    # then x momentum 0.9 by the step with zero gradient
    assert torch.allclose(buf, torch.full((2, 2), 0.5 * 0.5 * 0.9))


def test_weight_decay_goes_into_the_gradients_and_the_step_is_the_foreach_formula_bit_for_bit():
    """Detectron's update: grad += WD x param in place (WeightedSum), momentum = mu x momentum + lr x grad,
    param -= momentum; the same float32 operations as torch's out-of-place foreach ops, bit for bit, on
    tensors with vectorised bodies and scalar tails (biases: 2x LR, no weight decay)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7), torch.nn.Linear(129, 256), torch.nn.Linear(11, 5))
    named = list(model.named_parameters())
    reference = {name: p.detach().clone() for name, p in named}
    momenta = {name: torch.zeros_like(p) for name, p in named}
    opt = build_optimizer(model, base_lr=0.02, momentum=0.9, weight_decay=1e-4)
    for step in range(3):
        grads = {name: torch.randn(p.shape) for name, p in named}
        for name, p in named:
            p.grad = grads[name].clone()
        opt.step()
        for name, p in named:
            bias = name.endswith('bias')
            g = grads[name] if bias else torch._foreach_add([grads[name]], [reference[name]], alpha=1e-4)[0]
            momenta[name].mul_(0.9).add_(g, alpha=0.02 * (2.0 if bias else 1.0))
            reference[name] = reference[name] - momenta[name]
            assert torch.equal(p.grad, g), name
            assert torch.equal(p.detach(), reference[name]), name
