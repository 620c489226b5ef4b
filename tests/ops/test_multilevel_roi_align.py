"""The multi-level RoIAlign kernels (compiled on a CUDA machine, else run by Triton's interpreter in a
subprocess) against torchvision's roi_align in float64 on each RoI's level, forward and gradients."""
import pytest
import torch
from torchvision.ops import roi_align
from triton_subprocess import tensor_kernel_results

SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)

_SCRIPT = '''
import sys
import torch
from detectron.ops.multilevel_roi_align import roi_align_levels
scales = (1 / 4, 1 / 8, 1 / 16, 1 / 32)
results = {}
for name, (f0, f1, f2, f3, rois, levels, grad_out, size, num_levels, channels_last) in torch.load(sys.argv[1]).items():
    layout = torch.channels_last if bool(channels_last) else torch.contiguous_format
    features = [f.contiguous(memory_format=layout).requires_grad_() for f in (f0, f1, f2, f3)][:int(num_levels)]
    out = roi_align_levels(features, rois, levels, scales[:int(num_levels)], int(size), 2)
    grads = torch.autograd.grad(out, features, grad_out)
    results[name] = (out.detach(), *grads, all(g.stride() == f.stride() for g, f in zip(grads, features)))
torch.save(results, sys.argv[2])
'''


def _case(seed, dtype, size=7, channels=5, batch=2, side=40, channels_last=False, num_levels=4):
    """A pyramid of `side` x `side` at P2, RoIs on every level but P4 (an empty level) of both images:
    inside, hanging over every border, beyond it, under one pixel, on the last row and column. With
    num_levels 3 the P5 RoIs pool on P3 instead (the kernels' unused level slot)."""
    g = torch.Generator().manual_seed(seed)
    features = [torch.randn(batch, channels, side // 2 ** k, side // 2 ** k, generator=g).to(dtype)
                for k in range(4)]
    in_pixels = side * 4  # network-input pixels of the P2 side
    boxes = [
        (0, 0, [10.0, 12.0, 60.5, 50.25]),            # P2, inside
        (1, 0, [-30.0, -20.0, 40.0, 30.0]),           # P2, over the top-left border
        (0, 1, [100.0, 90.0, in_pixels + 40.0, in_pixels + 25.0]),  # P3, over the bottom-right
        (1, 1, [in_pixels - 9.0, 0.0, in_pixels + 200.0, 80.0]),   # P3, mostly beyond the right edge
        (0, 3, [5.0, 5.0, 5.3, 5.6]),                 # P5, under a pixel: forced to one
        (1, 3, [in_pixels - 33.0, in_pixels - 33.0, in_pixels - 1.0, in_pixels - 1.0]),  # P5, last row/column
        (1, 0, [0.0, 0.0, 7.0, 3.0]),                 # P2, image 1's corner
    ]
    rois = torch.tensor([[b] + box for b, _, box in boxes], dtype=torch.float32)
    levels = torch.tensor([level if level < num_levels else 1 for _, level, _ in boxes], dtype=torch.int64)
    grad_out = torch.randn(len(boxes), channels, size, size, generator=g)
    return (*features, rois, levels, grad_out, torch.tensor(size), torch.tensor(num_levels),
            torch.tensor(channels_last))


def _reference(case):
    """torchvision's roi_align (aligned=False, sampling ratio 2) in float64 on each RoI's level; the
    gradients of sum(out * grad_out) by autograd (grad_out rounded to the features' dtype first, as
    autograd hands it to the kernels' backward)."""
    *features, rois, levels, grad_out, size, num_levels, _ = case
    features = features[:int(num_levels)]
    grad_out = grad_out.to(features[0].dtype)
    features = [f.double().requires_grad_() for f in features]
    out = torch.cat([roi_align(features[int(level)], rois[r:r + 1].double(), int(size), SCALES[int(level)], 2, False)
                     for r, level in enumerate(levels)])
    return (out.detach(), *torch.autograd.grad(out, features, grad_out.double(), allow_unused=True,
                                               materialize_grads=True))


CASES = {
    'float32 NCHW 7x7': _case(0, torch.float32),
    'float32 channels_last 7x7': _case(1, torch.float32, channels_last=True),
    'bfloat16 channels_last 7x7': _case(2, torch.bfloat16, channels_last=True),
    'float32 channels_last 14x14, 3 channels': _case(3, torch.float32, size=14, channels=3, channels_last=True),
    'bfloat16 NCHW, three levels': _case(5, torch.bfloat16, num_levels=3),
}


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    return tensor_kernel_results(_SCRIPT, CASES, tmp_path_factory.mktemp('multilevel_roi_align'),
                                 skip_reason='triton is not installed: the RoIAlign kernels cannot run')


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', sorted(CASES))
def test_forward_equals_torchvision_on_each_level(results, name):
    out, *_ = results[name]
    expected, *_ = _reference(CASES[name])
    dtype = CASES[name][0].dtype
    assert out.dtype == dtype and out.shape == expected.shape
    if dtype == torch.float32:  # float32 sample positions, as torchvision's float32 roi_align
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    else:  # the float32 result rounded once to bfloat16: at most one bfloat16 step apart
        torch.testing.assert_close(out.double(), expected.to(dtype).double(), rtol=2 ** -7, atol=1e-6)
    # A RoI beyond the image samples nothing there: RoI 3's last columns are zero.
    assert out[3, :, :, -1].abs().max() == 0
    assert out.abs().sum() > 0


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', sorted(CASES))
def test_gradients_equal_torchvision_in_the_features_layout(results, name):
    _, *grads, same_strides = results[name]
    _, *expected = _reference(CASES[name])
    dtype = CASES[name][0].dtype
    assert same_strides
    for grad, want in zip(grads, expected):
        assert grad.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(grad.double(), want, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(grad.double(), want.to(dtype).double(), rtol=2 ** -7, atol=1e-6)
    assert len(grads) == int(CASES[name][-2])
    assert grads[0].abs().max() > 0 and grads[1].abs().max() > 0 and grads[2].abs().max() == 0  # none on P4
    if len(grads) == 4:
        assert grads[3].abs().max() > 0


@pytest.mark.processes
@pytest.mark.cuda
def test_no_rois_give_an_empty_result_and_zero_gradients(tmp_path):
    *features, rois, levels, grad_out, size, num_levels, channels_last = _case(4, torch.float32)
    cases = {'empty': (*features, rois[:0], levels[:0], grad_out[:0], size, num_levels, channels_last)}
    out, *grads, _ = tensor_kernel_results(_SCRIPT, cases, tmp_path, skip_reason='triton is not installed')['empty']
    assert out.shape == (0, 5, 7, 7)
    assert all(g.shape == f.shape and g.abs().max() == 0 for g, f in zip(grads, features))
