"""The fused frozen affine + (shortcut) + ReLU: its Triton kernel (compiled on a CUDA machine, else
run by Triton's interpreter in a subprocess) against a float64 transcription of Detectron's
AffineChannel -> Sum -> Relu, and against PyTorch's element-wise path."""

import pytest
import torch
from triton_subprocess import tensor_kernel_results

from detectron.modeling.ResNet import ResNet
from detectron.ops import affine_relu as ar

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
needs_triton = pytest.mark.skipif(ar.triton is None, reason='triton is not installed: the kernel cannot run')

SHAPE = (2, 24, 5, 7)


def case_tensors(seed, dtype=torch.float32, shape=SHAPE):
    """x, weight, bias, residual, upstream gradient; x holds a NaN, and exact zeros of the affine."""
    g = torch.Generator().manual_seed(seed)
    x, residual, grad = (torch.randn(shape, generator=g) for _ in range(3))
    weight, bias = torch.randn(shape[1], generator=g), torch.randn(shape[1], generator=g)
    x[0, 0, 0, 0] = float('nan')
    x[1, 1, 2, :] = 0.0
    bias[1] = 0.0  # relu(0 * w + 0): an output of exactly 0, whose gradient must be 0
    return [t.to(dtype) for t in (x, weight, bias, residual, grad)]


def reference(x, weight, bias, residual, grad, residual_weight=None, residual_bias=None):
    """Detectron's ops in float64, rounded to the dtype after each op as the eager path stores
    them: AffineChannel (and the projection shortcut's own AffineChannel), then Sum with the
    shortcut, then Relu; gradients by threshold_backward's rule (zero where the output is <= 0,
    passed where it is NaN) times each affine's weight."""
    dtype = x.dtype
    w, b = weight.double().view(1, -1, 1, 1), bias.double().view(1, -1, 1, 1)
    y = (x.double() * w + b).to(dtype)
    if residual is not None and residual_weight is not None:
        rw, rb = residual_weight.double().view(1, -1, 1, 1), residual_bias.double().view(1, -1, 1, 1)
        residual = (residual.double() * rw + rb).to(dtype)
    if residual is not None:
        y = (y.double() + residual.double()).to(dtype)
    y = torch.where(y.isnan(), y, y.clamp(min=0))
    passed = torch.where(y <= 0, torch.zeros_like(grad), grad)
    grad_residual = passed if residual is not None else None
    if residual_weight is not None:
        grad_residual = (passed.double() * rw).to(dtype)
    return y, (passed.double() * w).to(dtype), grad_residual


_INTERPRETER_SCRIPT = '''
import sys
import torch
from detectron.ops import affine_relu as ar
inputs = torch.load(sys.argv[1])
results = {}
for name, (x, weight, bias, residual, grad, residual_weight, residual_bias) in inputs.items():
    x = x.requires_grad_()
    if residual is not None:
        residual = residual.requires_grad_()
    y = ar._AffineReLU.apply(x, weight, bias, residual, residual_weight, residual_bias)
    grads = torch.autograd.grad(y, [x] + ([residual] if residual is not None else []), grad)
    results[name] = (y.detach(), grads[0], grads[1] if residual is not None else None,
                     y.is_contiguous(memory_format=torch.channels_last))
torch.save(results, sys.argv[2])
'''


def interpreter_cases():
    cases = {}
    # Shapes of one tile, and of several along both axes with partial last tiles (channels_last:
    # 256 channels a tile; NCHW: 1024 pixels a tile).
    # The shortcut is absent, the identity, or a projection with its own affine.
    for layout, shape, residuals in (('nchw', SHAPE, ('none', 'identity', 'projection')),
                                     ('channels_last', SHAPE, ('none', 'identity', 'projection')),
                                     ('nchw', (2, 3, 40, 40), ('identity',)),
                                     ('channels_last', (2, 300, 3, 5), ('identity', 'projection'))):
        for shortcut in residuals:
            x, weight, bias, residual, grad = case_tensors(seed=len(cases), shape=shape)
            if layout == 'channels_last':
                x, residual, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, residual, grad))
            residual_affine = (None, None)
            if shortcut == 'projection':
                g = torch.Generator().manual_seed(len(cases))
                residual_affine = (torch.rand(shape[1], generator=g) + 0.5, torch.randn(shape[1], generator=g))
            name = f'{layout}/{"x".join(map(str, shape))}/shortcut={shortcut}'
            cases[name] = (x, weight, bias, None if shortcut == 'none' else residual, grad, *residual_affine)
    # bfloat16: the affine's result is rounded before the shortcut is added. 1 + 2**-9 rounds to 1
    # (a quarter of bf16's step 2**-7 at 1), and 1 + 2**-8 is a tie that rounds to even (1); summed
    # unrounded, 1 + 2**-9 + 2**-8 would round up to 1 + 2**-7.
    one = torch.ones(1, 1, 1, 1, dtype=torch.bfloat16)
    cases['bfloat16/rounding'] = (one, torch.ones(1, dtype=torch.bfloat16), torch.full((1,), 2.0 ** -9).bfloat16(),
                                  torch.full_like(one, 2.0 ** -8), torch.ones_like(one), None, None)
    # The shortcut's affine is rounded too: 2**-8 * 1 + 2**-18 rounds to 2**-8 (bf16's step there is
    # 2**-15), and 1 + 2**-8 is a tie that rounds to 1; unrounded, the sum would round up.
    cases['bfloat16/shortcut rounding'] = (one, torch.ones(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.bfloat16),
                                           torch.full_like(one, 2.0 ** -8), torch.ones_like(one),
                                           torch.ones(1, dtype=torch.bfloat16), torch.full((1,), 2.0 ** -18).bfloat16())
    return cases


@pytest.fixture(scope='module')
def kernel_results(tmp_path_factory):
    cases = interpreter_cases()
    return cases, tensor_kernel_results(
        _INTERPRETER_SCRIPT, cases, tmp_path_factory.mktemp('affine_relu'),
        skip_reason='triton is not installed: the kernel cannot run (the eager path serves)')


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', list(interpreter_cases()))
def test_kernel_matches_detectrons_ops_in_float64(kernel_results, name):
    cases, results = kernel_results
    y, grad_x, grad_residual, channels_last = results[name]
    want_y, want_grad_x, want_grad_residual = reference(*cases[name])
    # float32: a fused multiply-add rounds once, the interpreter's numpy twice: apart by the last
    # bit of the product (|x * w| < 8 here), which cancellation may make large relative to the sum.
    tol = dict(rtol=2.0 ** -22, atol=8 * 2.0 ** -23, equal_nan=True)
    torch.testing.assert_close(y, want_y, **tol)
    torch.testing.assert_close(grad_x, want_grad_x, **tol)
    if want_grad_residual is not None:
        torch.testing.assert_close(grad_residual, want_grad_residual, **tol)
    assert torch.isnan(y).sum() == torch.isnan(want_y).sum()
    if name.startswith(('nchw', 'channels_last')):  # the output keeps the input's layout
        assert channels_last == name.startswith('channels_last')


@pytest.mark.processes
@pytest.mark.cuda
def test_kernel_rounds_the_affine_before_the_shortcut_sum(kernel_results):
    _, results = kernel_results
    for name in ('bfloat16/rounding', 'bfloat16/shortcut rounding'):
        y, grad_x, grad_residual, _ = results[name]
        assert y.dtype == torch.bfloat16 and y.item() == 1.0, name
        assert grad_x.item() == 1.0 and grad_residual.item() == 1.0, name


def test_zero_outputs_get_no_gradient_and_nan_outputs_pass_it():
    x, weight, bias, _, grad = case_tensors(seed=0)
    y, grad_x, _ = reference(x, weight, bias, None, grad)
    assert (y[1, 1, 2] == 0).all() and (grad_x[1, 1, 2] == 0).all()
    assert torch.isnan(y[0, 0, 0, 0]) and grad_x[0, 0, 0, 0] == grad[0, 0, 0, 0] * weight[0]


@pytest.mark.parametrize('projection', [False, True])
def test_cpu_tensors_take_the_eager_path_with_its_values(projection):
    x, weight, bias, residual, _ = case_tensors(seed=3)
    residual_affine = (weight.flip(0), bias.flip(0)) if projection else None
    assert not ar._use_kernel(x, weight, residual)
    got = ar.affine_relu(x, weight, bias, residual, residual_affine)
    want = reference(x, weight, bias, residual, x, *(residual_affine or (None, None)))[0]
    torch.testing.assert_close(got, want, rtol=2.0 ** -23, atol=1e-30, equal_nan=True)


@pytest.mark.cuda
@needs_cuda
@needs_triton
@pytest.mark.parametrize('layout', [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('projection', [False, True])
def test_cuda_kernel_equals_the_eager_cuda_ops(layout, dtype, projection):
    x, weight, bias, residual, grad = (t.cuda() for t in case_tensors(seed=5, dtype=dtype))
    x, residual, grad = (t.contiguous(memory_format=layout) for t in (x, residual, grad))
    residual_affine = (weight.flip(0), bias.flip(0)) if projection else None
    assert ar._use_kernel(x, weight, residual)
    outputs = []
    for fn in (ar.affine_relu, ar.eager_affine_relu):
        xs, rs = x.clone().requires_grad_(), residual.clone().requires_grad_()
        y = fn(xs, weight, bias, rs, residual_affine)
        outputs.append((y,) + torch.autograd.grad(y, (xs, rs), grad))
    for got, want in zip(*outputs):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.cuda
@needs_cuda
@needs_triton
def test_cuda_resnet50_body_under_bf16_autocast_keeps_the_eager_outputs_and_gradients(monkeypatch):
    torch.manual_seed(0)
    body = ResNet(50, freeze_at=2).cuda().to(memory_format=torch.channels_last)
    for module in body.modules():  # non-trivial affines, as ImageNet weights give
        if hasattr(module, 'weight') and module.weight is not None and module.weight.dim() == 1:
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.2, 0.2)
    images = torch.randn(2, 3, 128, 160, device='cuda').contiguous(memory_format=torch.channels_last)
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(ar, '_use_kernel', lambda *args: False)
        body.zero_grad(set_to_none=True)
        with torch.autocast('cuda', dtype=torch.bfloat16):
            outputs = body(images)
        sum(o.float().square().mean() for o in outputs).backward()
        results.append(([o.float() for o in outputs], [p.grad.clone() for p in body.parameters() if p.requires_grad]))
    (fused_out, fused_grads), (eager_out, eager_grads) = results
    for got, want in zip(fused_out + fused_grads, eager_out + eager_grads):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-3)
