"""The keypoint head (Detectron's v1convX + add_keypoint_outputs) and its spatial softmax loss, against hand
computations."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detectron.modeling.keypoint_rcnn_heads import BilinearUpsample, KeypointRCNNHead, bilinear_kernel, keypoint_loss


def _log_softmax_rows(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_keypoint_loss_is_the_weighted_mean_of_spatial_cross_entropies():
    rng = np.random.RandomState(0)
    logits = rng.randn(3, 2, 4, 4).astype(np.float32)
    labels = np.array([[5, 15], [0, 7], [3, 9]])
    weights = np.array([[1, 0], [1, 1], [0, 1]], np.float32)
    # By hand: each (RoI, keypoint) row's 16 positions are the classes.
    rows = _log_softmax_rows(logits.reshape(6, 16).astype(np.float64))
    nll = -rows[np.arange(6), labels.ravel()]
    expected = (nll * weights.ravel()).sum() / weights.sum()
    loss = keypoint_loss(torch.from_numpy(logits), torch.from_numpy(labels), torch.from_numpy(weights))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    scaled = keypoint_loss(torch.from_numpy(logits), torch.from_numpy(labels), torch.from_numpy(weights),
                           loss_weight=2.0, normalizer=torch.tensor(0.25))
    assert scaled.item() == pytest.approx(0.5 * expected, rel=1e-6)


def test_keypoint_loss_without_visible_keypoints_is_zero_with_gradients():
    logits = torch.randn(1, 3, 4, 4, requires_grad=True)
    loss = keypoint_loss(logits, torch.zeros(1, 3, dtype=torch.int64), torch.zeros(1, 3))
    loss.backward()
    assert loss.item() == 0 and logits.grad is not None and not logits.grad.any()


def test_bilinear_kernel_is_the_fcn_filter():
    # size 4 (up_scale 2): factor 2, centre 1.5 -> 1 - |i - 1.5| / 2 = (0.25, 0.75, 0.75, 0.25) per axis.
    axis = np.array([0.25, 0.75, 0.75, 0.25])
    np.testing.assert_allclose(bilinear_kernel(4), np.outer(axis, axis))


def test_bilinear_upsample_is_detectrons_transposed_convolution():
    up = BilinearUpsample(3, 2)
    x = torch.randn(2, 3, 5, 5)
    full = torch.zeros(3, 3, 4, 4)
    for c in range(3):
        full[c, c] = torch.from_numpy(bilinear_kernel(4)).float()
    expected = F.conv_transpose2d(x, full, stride=2, padding=1)
    torch.testing.assert_close(up(x), expected)
    # Inside, it is bilinear interpolation: a constant map stays constant away from the border.
    assert torch.allclose(up(torch.ones(1, 3, 6, 6))[..., 2:-2, 2:-2], torch.ones(1, 3, 8, 8))
    assert set(dict(up.named_buffers())) == {'weight', 'bias'} and not list(up.parameters())


def test_head_of_detectrons_coco_config_gives_56_pixel_heatmaps():
    head = KeypointRCNNHead(16, 17, num_convs=8, conv_dim=8, use_deconv_output=True, up_scale=2)
    out = head(torch.randn(3, 16, 14, 14))
    assert out.shape == (3, 17, 56, 56)
    names = {n for n, _ in head.named_parameters()}
    assert names == {f'conv_fcn{i}.{p}' for i in range(1, 9) for p in ('weight', 'bias')} | {
        'kps_score_lowres.weight', 'kps_score_lowres.bias'}
    # MSRAFill of conv_fcn (Caffe2: std sqrt(2 / (out * k * k))), biases 0.
    assert head.conv_fcn2.weight.std().item() == pytest.approx((2 / (8 * 9)) ** 0.5, rel=0.15)
    assert not head.conv_fcn1.bias.any()


def test_head_with_deconv_and_no_upsampling_names_the_scores_kps_score():
    head = KeypointRCNNHead(4, 5, num_convs=2, conv_dim=8, conv_init='GaussianFill', use_deconv=True, deconv_dim=6,
                            use_deconv_output=False, up_scale=1)
    assert head(torch.randn(2, 4, 7, 7)).shape == (2, 5, 14, 14)
    assert isinstance(head.kps_score, torch.nn.Conv2d) and head.kps_deconv.weight.shape == (8, 6, 4, 4)
    assert head.conv_fcn1.weight.std().item() == pytest.approx(0.01, rel=0.2)


def test_gaussian_init_starts_at_the_uniform_spatial_softmax():
    # GaussianFill (std 0.01 convolutions, 0.001 scores): near-zero logits, a loss of log(M * M) per keypoint.
    torch.manual_seed(0)
    head = KeypointRCNNHead(8, 3, num_convs=2, conv_dim=8, conv_init='GaussianFill')
    logits = head(torch.randn(4, 8, 7, 7))
    loss = keypoint_loss(logits, torch.randint(0, 28 * 28, (4, 3)), torch.ones(4, 3))
    assert loss.item() == pytest.approx(np.log(28 * 28), abs=1e-3)
