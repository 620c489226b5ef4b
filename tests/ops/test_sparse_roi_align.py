"""The CPU RoIAlign as sparse matrix products against torchvision's roi_align (aligned=False) per level."""
import pytest
import torch
from torchvision.ops import roi_align

from detectron.ops import sparse_roi_align
from detectron.ops.roi_pooling import roi_feature_transform

SCALES = (1 / 4, 1 / 8, 1 / 16, 1 / 32)


def _levels(channels=6, batch=2, height=24, width=36):
    torch.manual_seed(0)
    return [torch.randn(batch, channels, height // 2 ** k, width // 2 ** k, dtype=torch.float32) for k in range(4)]


def _rois(count, batch=2, extent=170.0):
    """RoIs of every size, many crossing the image's borders (samples outside, at and past the last pixel)."""
    torch.manual_seed(1)
    corner = torch.rand(count, 2) * (extent + 40) - 20
    size = torch.rand(count, 2) ** 2 * extent + 0.2
    return torch.cat([torch.randint(0, batch, (count, 1)).float(), corner, corner + size], 1)


def _per_level_reference(features, rois, levels, output_size, sampling_ratio):
    out = torch.zeros(len(rois), features[0].shape[1], output_size, output_size)
    for k, feature in enumerate(features):
        rows = (levels == k).nonzero().squeeze(1)
        out[rows] = roi_align(feature, rois[rows], output_size, spatial_scale=SCALES[k],
                              sampling_ratio=sampling_ratio, aligned=False)
    return out


@pytest.mark.parametrize('sampling_ratio', [1, 2, 3])
@pytest.mark.parametrize('output_size', [7, 14])
def test_pooled_features_and_gradients_are_torchvisions(sampling_ratio, output_size):
    features = [f.requires_grad_() for f in _levels()]
    rois = _rois(60)
    levels = torch.arange(60) % 4
    ours = sparse_roi_align.roi_align_levels(features, rois, levels, SCALES, output_size, sampling_ratio)
    theirs = _per_level_reference(features, rois, levels, output_size, sampling_ratio)
    assert torch.equal(ours, theirs)  # the same products and sums in the same order
    assert ours.is_contiguous() and ours.shape == (60, 6, output_size, output_size)
    grad = torch.randn_like(theirs)
    ours_grad = torch.autograd.grad(ours, features, grad)
    theirs_grad = torch.autograd.grad(theirs, features, grad)
    for a, b in zip(ours_grad, theirs_grad):
        if sampling_ratio == 3:  # torchvision's (g * w) / 9 against w * (g / 9): float32 rounding
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b)
    assert sum(int((g != 0).sum()) for g in ours_grad) > 1000  # the gradients reach many pixels


def test_a_bin_is_the_mean_of_its_bilinear_samples_by_hand():
    # One 4x4 map with value 10 * y + x, a RoI from (0.5, 0.5) to (2.5, 2.5) at scale 1, one 1x1 bin
    # with 2x2 samples at 1.0 and 2.0 on each axis: the mean of 11, 12, 21, 22 = 16.5. Its gradient
    # puts a quarter on each of those 4 pixels.
    feature = (torch.arange(4.0)[:, None] * 10 + torch.arange(4.0)[None, :])[None, None].requires_grad_()
    rois = torch.tensor([[0.0, 0.5, 0.5, 2.5, 2.5]])
    out = sparse_roi_align.roi_align_levels([feature], rois, torch.zeros(1, dtype=torch.long), (1.0,), 1, 2)
    assert out.item() == 16.5
    (grad,) = torch.autograd.grad(out.sum(), [feature])
    expected = torch.zeros(4, 4)
    expected[1:3, 1:3] = 0.25
    assert torch.equal(grad[0, 0], expected)


def test_samples_past_the_map_count_zero_and_the_last_pixel_is_held():
    # torchvision's rules: a sample below -1 or past the size adds 0 but still counts; one in
    # (size - 1, size] reads the last pixel.
    feature = torch.ones(1, 1, 4, 4)
    outside = torch.tensor([[0.0, -9.0, 0.0, -5.0, 1.0]])  # every x sample below -1
    edge = torch.tensor([[0.0, 3.0, 3.0, 3.9, 3.9]])  # sides of 1 bin: samples at 3.125 .. 3.875
    for rois, expected in ((outside, 0.0), (edge, 1.0)):
        ours = sparse_roi_align.roi_align_levels([feature], rois, torch.zeros(1, dtype=torch.long), (1.0,), 2, 2)
        assert torch.equal(ours, roi_align(feature, rois, 2, 1.0, 2, aligned=False))
        assert torch.all(ours == expected)


def test_no_rois_gives_an_empty_batch_and_zero_gradients():
    features = [f.requires_grad_() for f in _levels()]
    out = sparse_roi_align.roi_align_levels(features, torch.zeros(0, 5), torch.zeros(0, dtype=torch.long), SCALES, 7, 2)
    assert out.shape == (0, 6, 7, 7)
    grads = torch.autograd.grad(out.sum(), features, allow_unused=True)
    assert all(g is None or not g.any() for g in grads)


def _graph_node_names(node, depth=4):
    if node is None or depth == 0:
        return set()
    return {type(node).__name__}.union(*(_graph_node_names(n, depth - 1) for n, _ in node.next_functions))


def test_roi_feature_transform_takes_it_in_cpu_training_and_keeps_the_rois_order():
    features = [f.requires_grad_() for f in _levels()]
    rois = _rois(40)
    ours = roi_feature_transform(features, rois, SCALES, output_size=7, sampling_ratio=2)
    assert sparse_roi_align.applies(features, rois, 2)
    assert '_SampledPoolBackward' in _graph_node_names(ours.grad_fn)
    assert not sparse_roi_align.applies(features, rois, 0)  # the adaptive grid: torchvision per level
    assert not sparse_roi_align.applies([f.double() for f in features], rois, 2)
    with torch.no_grad():  # inference: torchvision's forward, the same numbers
        assert not sparse_roi_align.applies(features, rois, 2)
        plain = roi_feature_transform(features, rois, SCALES, output_size=7, sampling_ratio=2)
    assert not sparse_roi_align.applies([f.detach() for f in features], rois, 2)
    from detectron.ops.roi_pooling import map_rois_to_fpn_levels
    levels = map_rois_to_fpn_levels(rois[:, 1:5], 2, 5) - 2
    with torch.no_grad():
        expected = _per_level_reference(features, rois, levels, 7, 2)
    assert torch.equal(ours, expected) and torch.equal(plain, expected)
