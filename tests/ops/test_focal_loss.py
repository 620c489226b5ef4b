"""CenterNet's heat map focal loss: the eager reference formula by hand and against a loop, and its
Triton kernels (compiled on a CUDA machine, else run by Triton's interpreter in a subprocess)
against autograd through the eager formula in float64."""
import math

import pytest
import torch
from triton_subprocess import tensor_kernel_results

from detectron.ops import focal_loss as fl


def test_sigmoid_clamps_out_of_place():
    x = torch.tensor([-20.0, 0.0, 20.0])
    y = fl.clamped_sigmoid(x)
    torch.testing.assert_close(y, torch.tensor([1e-4, 0.5, 1 - 1e-4]))
    assert x[1] == 0.0


def test_neg_loss_by_hand():
    # positive p = 0.5: log(0.5) (1 - 0.5)^2 = -0.173287; negative p = 0.2 at gt 0.5:
    # log(0.8) 0.2^2 (1 - 0.5)^4 = -0.000557859; one positive -> loss 0.173845
    pred = torch.tensor([[[[0.5, 0.2]]]])
    gt = torch.tensor([[[[1.0, 0.5]]]])
    expected = -(math.log(0.5) * 0.25 + math.log(0.8) * 0.04 * 0.0625)
    assert fl.neg_loss(pred, gt).item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.173845, abs=1e-6)


def _neg_loss_loop(pred, gt):
    pos_sum, neg_sum, num_pos = 0.0, 0.0, 0
    for p, g in zip(pred.flatten().tolist(), gt.flatten().tolist()):
        if g == 1:
            pos_sum += math.log(p) * (1 - p) ** 2
            num_pos += 1
        elif g < 1:
            neg_sum += math.log(1 - p) * p ** 2 * (1 - g) ** 4
    return -(pos_sum + neg_sum) / num_pos if num_pos else -neg_sum


@pytest.mark.parametrize('positives', [0, 1, 3])
def test_neg_loss_against_loop_over_the_whole_batch(positives):
    gen = torch.Generator().manual_seed(positives)
    gt = torch.rand(2, 3, 5, 6, generator=gen) * 0.99
    for b, c, y, x in [(0, 1, 2, 3), (1, 0, 4, 4), (1, 2, 0, 5)][:positives]:
        gt[b, c, y, x] = 1
    pred = fl.clamped_sigmoid(torch.randn(2, 3, 5, 6, generator=gen) * 3)
    expected = _neg_loss_loop(pred.double(), gt.double())
    assert fl.neg_loss(pred, gt).item() == pytest.approx(expected, rel=1e-5)


def test_off_cuda_the_loss_is_the_eager_formula_on_float32_logits():
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 4, 5, generator=gen) * 4).bfloat16()
    gt = torch.rand(2, 3, 4, 5, generator=gen) * 0.99
    gt[1, 2, 3, 4] = 1
    loss = fl.heatmap_focal_loss(logits, gt)
    assert loss.dtype == torch.float32
    assert torch.equal(loss, fl.neg_loss(fl.clamped_sigmoid(logits.float()), gt))


# ------------------------------------------------------------------------------------------------
# The kernels
# ------------------------------------------------------------------------------------------------

_KERNEL_SCRIPT = '''
import sys
import torch
from detectron.ops import focal_loss as fl
results = {}
for name, (logits, gt, grad) in torch.load(sys.argv[1]).items():
    logits = logits.requires_grad_()
    loss = fl._HeatmapFocalLoss.apply(logits, gt)
    again = fl._HeatmapFocalLoss.apply(logits.detach(), gt)
    (grad_logits,) = torch.autograd.grad(loss, [logits], grad)
    results[name] = (loss.detach(), again, grad_logits)
torch.save(results, sys.argv[2])
'''


def kernel_cases():
    """name -> (logits, gt in the logits' memory order, upstream gradient of the loss)."""
    cases = {}
    for name, shape, positives, dtype, layout in (
            ('one tile', (2, 3, 5, 7), 3, torch.float32, 'nchw'),
            ('tiles, the last partial', (2, 5, 30, 31), 6, torch.float32, 'nchw'),
            ('channels_last', (2, 5, 30, 31), 6, torch.float32, 'channels_last'),
            ('bfloat16 channels_last', (2, 5, 30, 31), 6, torch.bfloat16, 'channels_last'),
            ('no positive', (2, 3, 5, 7), 0, torch.float32, 'nchw')):
        gen = torch.Generator().manual_seed(len(cases))
        logits = torch.randn(shape, generator=gen) * 5  # |x| > 9.2 in places: clamped, no gradient
        logits.view(-1)[:4] = torch.tensor([-20.0, 20.0, 0.0, math.log(1e-4 / (1 - 1e-4))])
        gt = torch.rand(shape, generator=gen) * 0.999
        gt.view(-1)[4:12] = 0.0
        for k in torch.randperm(gt.numel(), generator=gen)[:positives]:
            gt.view(-1)[k] = 1.0
        logits = logits.to(dtype)
        if layout == 'channels_last':
            logits, gt = (t.contiguous(memory_format=torch.channels_last) for t in (logits, gt))
        cases[name] = (logits, gt, torch.tensor(0.75))
    return cases


def reference(logits, gt, grad):
    """The eager formula in float64 on the logits' values, and autograd's gradient through it."""
    x = logits.double().requires_grad_()
    loss = fl.neg_loss(fl.clamped_sigmoid(x), gt.double())
    (grad_x,) = torch.autograd.grad(loss, [x], grad.double())
    return loss.detach(), grad_x


@pytest.fixture(scope='module')
def kernel_results(tmp_path_factory):
    cases = kernel_cases()
    return cases, tensor_kernel_results(
        _KERNEL_SCRIPT, cases, tmp_path_factory.mktemp('focal_loss'),
        skip_reason='triton is not installed: the kernels cannot run (the eager path serves)')


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', list(kernel_cases()))
def test_kernels_give_the_eager_loss_and_gradient(kernel_results, name):
    cases, results = kernel_results
    loss, again, grad = results[name]
    logits = cases[name][0]
    want_loss, want_grad = reference(*cases[name])
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(want_loss.item(), rel=1e-5)
    assert torch.equal(loss, again)  # fixed tile order: the same sum every time
    assert grad.dtype == logits.dtype and grad.stride() == logits.stride()
    # float32 sigmoid and logs against float64: a few ulps of the largest entry; bfloat16 rounds once.
    rtol = 2 ** -7 if logits.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(grad.double(), want_grad, rtol=rtol, atol=rtol * want_grad.abs().max().item())
    # Where the clamp holds the probability, no gradient, as torch.clamp's backward.
    held = (logits.float().abs() > 9.3)
    assert held.any() and torch.all(grad[held] == 0)
    assert torch.count_nonzero(grad) > grad.numel() // 2


@pytest.mark.processes
@pytest.mark.cuda
def test_without_positives_the_loss_is_the_negative_term_alone(kernel_results):
    cases, results = kernel_results
    logits, gt, _ = cases['no positive']
    p = fl.clamped_sigmoid(logits.double())
    negative = (torch.log(1 - p) * p ** 2 * (1 - gt.double()) ** 4).sum()
    assert results['no positive'][0].item() == pytest.approx(-negative.item(), rel=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_on_cuda_a_nan_logit_makes_the_loss_nan_and_nchw_targets_follow_channels_last_logits():
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 4, 9, 11, generator=gen) * 3).cuda()
    gt = (torch.rand(2, 4, 9, 11, generator=gen) * 0.99).cuda()
    gt[0, 1, 2, 3] = 1
    want = fl.neg_loss(fl.clamped_sigmoid(logits.double()), gt.double()).item()
    got = fl.heatmap_focal_loss(logits.contiguous(memory_format=torch.channels_last), gt)
    assert got.item() == pytest.approx(want, rel=1e-5)
    logits[1, 2, 3, 4] = float('nan')
    assert torch.isnan(fl.heatmap_focal_loss(logits, gt))


def test_the_kernels_take_dense_tensors_in_any_dimension_order():
    x = torch.zeros(2, 3, 4, 5)
    assert fl._dense(x) and fl._dense(x.contiguous(memory_format=torch.channels_last))
    assert fl._dense(torch.zeros(1, 3, 1, 5).contiguous(memory_format=torch.channels_last))
    assert not fl._dense(x[:, :, :, :4]) and not fl._dense(x[:, :2]) and not fl._dense(x[:1].expand(2, 3, 4, 5))
