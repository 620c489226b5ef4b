import numpy as np
import pytest
import torch
from torchvision.ops import roi_align

from detectron.ops.roi_pooling import map_rois_to_fpn_levels, roi_feature_transform


def _square(side, x0=0.0, y0=0.0):
    return [x0, y0, x0 + side - 1, y0 + side - 1]


def test_level_mapping_verified_vectors():
    # Detectron's map_rois_to_fpn_levels on squares of side s (+1 widths): verified values.
    sides = [224, 112, 111, 448, 1000, 10, 223, 447]
    boxes = torch.tensor([_square(s) for s in sides], dtype=torch.float32)
    levels = map_rois_to_fpn_levels(boxes)
    assert levels.dtype == torch.int64
    assert levels.tolist() == [4, 3, 2, 5, 5, 2, 3, 4]


def test_level_mapping_uses_area_not_side_and_custom_range():
    # 56 x 896 has the area of 224 x 224; a reversed box has a negative area, taken absolute.
    boxes = torch.tensor([[0, 0, 55, 895], [223, 223, 0, 0], [0, 0, 31, 31]], dtype=torch.float32)
    # reversed: w = h = 0 - 223 + 1 = -222, area 222^2 -> level 3 (side < 224).
    assert map_rois_to_fpn_levels(boxes).tolist() == [4, 3, 2]
    assert map_rois_to_fpn_levels(boxes, k_min=3, k_max=6).tolist() == [4, 3, 3]
    assert map_rois_to_fpn_levels(boxes, canonical_scale=112).tolist() == [5, 4, 2]


def _pyramid(seed, batch=2, channels=3, size=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, channels, size // 2 ** k, size // 2 ** k, generator=g)
            for k in range(4)]


def test_roi_feature_transform_pools_each_roi_on_its_level_in_input_order():
    features = _pyramid(0, size=256)
    scales = (1 / 4, 1 / 8, 1 / 16, 1 / 32)
    # (batch index, side, expected level), deliberately not grouped by level.
    layout = [(0, 500, 5), (1, 40, 2), (0, 150, 3), (1, 300, 4), (0, 20, 2), (1, 120, 3),
              (1, 250, 4), (0, 60, 2)]
    rois = torch.tensor([[b] + _square(s, x0=3.5 * i, y0=2.25 * i)
                         for i, (b, s, _) in enumerate(layout)], dtype=torch.float32)
    pooled = roi_feature_transform(features, rois, scales, output_size=7, sampling_ratio=2)
    assert pooled.shape == (len(layout), 3, 7, 7)
    for r, (_, _, level) in enumerate(layout):
        expected = roi_align(features[level - 2], rois[r:r + 1], 7, spatial_scale=scales[level - 2],
                             sampling_ratio=2, aligned=False)
        torch.testing.assert_close(pooled[r:r + 1], expected, rtol=0, atol=0)


def test_roi_feature_transform_caffe2_convention_on_a_ramp():
    # Feature value = x (column index) on P2 (scale 1/4). RoI x from 8 to 35: feature-space
    # start 2.0, width (35 - 8) / 4 = 6.75, no half-pixel offset (aligned=False). Bilinear sampling
    # of a linear ramp is exact, so bin b averages to 2 + (b + 0.5) * 6.75 / 7.
    width = 32
    ramp = torch.arange(width, dtype=torch.float32).expand(1, 1, 16, width).contiguous()
    features = [ramp] + [torch.zeros(1, 1, 16 // 2 ** k, width // 2 ** k) for k in range(1, 4)]
    rois = torch.tensor([[0.0, 8.0, 4.0, 35.0, 31.0]])  # 28 x 28 -> level 2
    pooled = roi_feature_transform(features, rois)
    expected = 2.0 + (np.arange(7) + 0.5) * 6.75 / 7
    np.testing.assert_allclose(pooled[0, 0].numpy(), np.tile(expected, (7, 1)), rtol=1e-6)


def test_roi_feature_transform_levels_follow_spatial_scales_and_gradients_flow():
    # Levels 3..5 only (scales 1/8..1/32): a 40 px RoI maps to level 2 and is clipped to 3.
    features = [f.requires_grad_() for f in _pyramid(1, size=256)[1:]]
    rois = torch.tensor([[0] + _square(40), [1] + _square(600, 1, 1)], dtype=torch.float32)
    pooled = roi_feature_transform(features, rois, spatial_scales=(1 / 8, 1 / 16, 1 / 32))
    expected0 = roi_align(features[0], rois[:1], 7, 1 / 8, 2, False)
    torch.testing.assert_close(pooled[:1], expected0, rtol=0, atol=0)
    pooled.sum().backward()
    assert features[0].grad[0].abs().sum() > 0 and features[0].grad[1].abs().sum() == 0
    assert features[1].grad.abs().sum() == 0
    assert features[2].grad[1].abs().sum() > 0


def test_roi_feature_transform_empty_and_dtype():
    features = [f.double() for f in _pyramid(2)]
    pooled = roi_feature_transform(features, torch.zeros(0, 5, dtype=torch.float32))
    assert pooled.shape == (0, 3, 7, 7) and pooled.dtype == torch.float64


@pytest.mark.parametrize('side,level', [(223, 3), (224, 4)])
def test_roi_feature_transform_level_boundary(side, level):
    features = _pyramid(3, size=256)
    rois = torch.tensor([[0] + _square(side)], dtype=torch.float32)
    expected = roi_align(features[level - 2], rois, 7, 2.0 ** -level, 2, False)
    torch.testing.assert_close(roi_feature_transform(features, rois), expected, rtol=0, atol=0)


def test_roi_feature_transform_half_features_pool_with_float32_rois():
    # 1100.75 is not a float16 number (spacing 1 above 1024): RoIs must keep float32 precision.
    features = [f.half() for f in _pyramid(4, batch=1, size=512)]
    rois = torch.tensor([[0, 1001.5, 3.25, 1100.75, 90.5]], dtype=torch.float32)
    pooled = roi_feature_transform(features, rois)
    assert pooled.dtype == torch.float16
    expected = roi_align(features[0].float(), rois, 7, 1 / 4, 2, False)
    torch.testing.assert_close(pooled.float(), expected.half().float(), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU (the Triton RoIAlign kernels)')
@pytest.mark.parametrize('layout', [torch.contiguous_format, torch.channels_last])
def test_roi_feature_transform_on_cuda_takes_the_kernels_and_matches_the_eager_path(layout):
    # bfloat16 levels as the channels_last body gives them under autocast, RoIs on every level.
    from detectron.ops import multilevel_roi_align
    features = [f.to('cuda', torch.bfloat16).contiguous(memory_format=layout).requires_grad_()
                for f in _pyramid(5, size=256)]
    sides = [20, 40, 60, 120, 150, 250, 300, 500]
    rois = torch.tensor([[i % 2] + _square(s, x0=2.5 * i, y0=1.75 * i) for i, s in enumerate(sides)],
                        dtype=torch.float32, device='cuda')
    assert multilevel_roi_align.kernel_applies(features, rois, 2)
    pooled = roi_feature_transform(features, rois)
    grads = torch.autograd.grad(pooled.float().square().sum(), features)
    eager_features = [f.detach().cpu().float().requires_grad_() for f in features]
    expected = roi_feature_transform(eager_features, rois.cpu())
    expected_grads = torch.autograd.grad(expected.to(torch.bfloat16).float().square().sum(), eager_features)
    assert pooled.dtype == torch.bfloat16
    torch.testing.assert_close(pooled.cpu().float(), expected.to(torch.bfloat16).float(), rtol=2 ** -7, atol=1e-5)
    for grad, want, feature in zip(grads, expected_grads, features):
        assert grad.dtype == torch.bfloat16 and grad.stride() == feature.stride()
        torch.testing.assert_close(grad.cpu().float(), want.to(torch.bfloat16).float(), rtol=2 ** -6, atol=1e-3)
