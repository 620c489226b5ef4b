"""CenterNet ctdet data: gaussian targets, affine transform, colour jitter, samples, roidb, test input.

Expected values are worked out by hand (the derivations are in the comments) or by an independent
float64 transcription of the reference formulas.
"""
import json
import math

import cv2
import numpy as np
import pytest

from detectron.datasets import dataset_catalog
from detectron.roi_data import centernet as cn
from detectron.utils.errors import DatasetError

MEAN = np.array(cn.COCO_MEAN, dtype=np.float32)
STD = np.array(cn.COCO_STD, dtype=np.float32)


@pytest.fixture(autouse=True, scope='module')
def single_threaded_opencv():
    """Keep OpenCV's thread pool from starting in the pytest process: once it has, a forked
    DataLoader worker that calls cv2.setNumThreads (roi_data/loader.py's worker init) deadlocks,
    which hangs the loader tests that run later in the same session."""
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    yield
    cv2.setNumThreads(threads)


def _random_image(h, w, seed=0):
    return np.random.RandomState(seed).randint(0, 256, (h, w, 3)).astype(np.uint8)


# ------------------------------------------------------------------------------------------------
# gaussian_radius, gaussian2D, draw_umich_gaussian
# ------------------------------------------------------------------------------------------------

def test_gaussian_radius_10x10_is_2_733():
    # Third quadratic: a = 2.8, b = -2 * 0.7 * 20 = -28, c = -0.3 * 100 = -30:
    # (b + sqrt(b^2 - 4ac)) / 2 = (-28 + sqrt(784 + 336)) / 2 = 2.7332; the others are larger
    # (r1 = (20 + sqrt(400 - 70.588)) / 2 = 19.07, r2 = (40 + sqrt(1600 - 480)) / 2 = 36.73).
    r = cn.gaussian_radius((10, 10))
    assert r == pytest.approx((-28 + math.sqrt(1120)) / 2, abs=1e-12)
    assert r == pytest.approx(2.7332, abs=1e-4)
    assert int(r) == 2
    # The textbook root (divided by 2a = 5.6) would be 0.976: the /2 quirk is kept.
    assert r != pytest.approx((-28 + math.sqrt(1120)) / 5.6, abs=1e-3)


@pytest.mark.parametrize('size, expected', [
    # (20, 30): r3 = (-70 + sqrt(4900 + 4 * 2.8 * 180)) / 2 = (-70 + sqrt(6916)) / 2
    ((20, 30), (-70 + math.sqrt(6916)) / 2),
    # (20, 20): r3 = (-56 + sqrt(3136 + 4 * 2.8 * 120)) / 2 = (-56 + sqrt(4480)) / 2 = 5.466
    ((20, 20), (-56 + math.sqrt(4480)) / 2),
    # (2, 100): r3 = (-142.8 + sqrt(142.8^2 + 4 * 2.8 * 60)) / 2 = 1.167 (r1 = 101.65, r2 = 202.8)
    ((2, 100), (-142.8 + math.sqrt(142.8 ** 2 + 672)) / 2),
    # min_overlap 0.5, 10 x 10: r3 = (-20 + sqrt(400 + 4 * 2 * 50)) / 2 = (-20 + sqrt(800)) / 2
    # = 4.142; r1 = (20 + sqrt(400 - 4 * 100 / 3)) / 2 = 18.165
    ((10, 10, 0.5), (-20 + math.sqrt(800)) / 2),
])
def test_gaussian_radius_by_hand(size, expected):
    args = (size[:2], size[2]) if len(size) == 3 else (size,)
    assert cn.gaussian_radius(*args) == pytest.approx(expected, abs=1e-9)


def test_gaussian2d_values_by_hand():
    g = cn.gaussian2D((5, 5), sigma=5 / 6)   # 2 sigma^2 = 50 / 36
    assert g.dtype == np.float64 and g.shape == (5, 5)
    assert g[2, 2] == 1.0
    assert g[2, 3] == pytest.approx(math.exp(-36 / 50))
    assert g[1, 3] == pytest.approx(math.exp(-72 / 50))
    assert g[0, 0] == pytest.approx(math.exp(-288 / 50))
    assert np.array_equal(g, g.T) and np.array_equal(g, g[::-1, ::-1])
    rect = cn.gaussian2D((3, 5), sigma=1)
    assert rect.shape == (3, 5) and rect[1, 2] == 1.0 and rect[0, 0] == pytest.approx(math.exp(-5 / 2))


def test_gaussian2d_zeroes_values_below_eps():
    g = cn.gaussian2D((41, 41), sigma=1)
    assert g[20, 28] == pytest.approx(math.exp(-32))   # 1.3e-14 > eps = 2.2e-16: kept
    assert g[20, 29] == 0.0                            # exp(-40.5) = 2.6e-18 < eps: zeroed
    assert g[0, 0] == 0.0


E2, E4 = math.exp(-2), math.exp(-4)   # radius 1: sigma = 3 / 6, 2 sigma^2 = 0.5


def test_draw_interior_uses_integer_part_of_centre():
    hm = np.zeros((10, 12), dtype=np.float32)
    out = cn.draw_umich_gaussian(hm, (5.7, 4.2), 1)
    assert out is hm
    expected = np.zeros((10, 12), dtype=np.float32)
    expected[3:6, 4:7] = [[E4, E2, E4], [E2, 1, E2], [E4, E2, E4]]
    np.testing.assert_allclose(hm, expected, rtol=1e-6)


def test_draw_overlap_keeps_elementwise_max():
    hm = np.zeros((10, 12), dtype=np.float32)
    cn.draw_umich_gaussian(hm, (5, 4), 1)
    cn.draw_umich_gaussian(hm, (6, 4), 1)
    np.testing.assert_allclose(hm[4, 4:8], [E2, 1, 1, E2], rtol=1e-6)   # not 1 + e^-2
    np.testing.assert_allclose(hm[3, 4:8], [E4, E2, E2, E4], rtol=1e-6)
    assert hm.max() == 1.0


def test_draw_clips_at_borders():
    g5 = cn.gaussian2D((5, 5), sigma=5 / 6)
    hm = np.zeros((10, 12), dtype=np.float32)
    cn.draw_umich_gaussian(hm, (0, 0), 2)
    np.testing.assert_allclose(hm[0:3, 0:3], g5[2:5, 2:5], rtol=1e-6)
    assert hm[3:, :].sum() == 0 and hm[:, 3:].sum() == 0
    hm = np.zeros((10, 12), dtype=np.float32)
    cn.draw_umich_gaussian(hm, (11, 9), 2)
    np.testing.assert_allclose(hm[7:10, 9:12], g5[0:3, 0:3], rtol=1e-6)
    assert hm[:7].sum() == 0 and hm[:, :9].sum() == 0
    # x == width: right = 0 but left = 2, so the reference still draws the Gaussian's two left
    # columns at x - 2 .. x - 1 (ctdet never gets here: its centres are clipped to width - 1).
    hm = np.zeros((10, 12), dtype=np.float32)
    cn.draw_umich_gaussian(hm, (12, 5), 2)
    np.testing.assert_allclose(hm[3:8, 10:12], g5[:, 0:2], rtol=1e-6)
    assert hm[:, :10].sum() == 0


def test_draw_shares_one_gaussian_per_radius_without_changing_it():
    # Windows of radius 3 drawn with k = 0.25, then 1, then 0.25 again: each is the Gaussian times
    # its own k (a shared Gaussian scaled in place would carry the first k into the others).
    hm = np.zeros((3, 20, 20), dtype=np.float32)
    for channel, k in enumerate((0.25, 1, 0.25)):
        cn.draw_umich_gaussian(hm[channel], (5 + 4 * channel, 9), 3, k=k)
    g = cn.gaussian2D((7, 7), sigma=7 / 6)
    for channel, k in enumerate((0.25, 1, 0.25)):
        x = 5 + 4 * channel
        np.testing.assert_array_equal(hm[channel, 6:13, x - 3:x + 4], (g * k).astype(np.float32))


def test_draw_k_scales_and_keeps_larger_existing_values():
    hm = np.full((5, 5), 0.7, dtype=np.float32)
    cn.draw_umich_gaussian(hm, (2, 2), 1, k=0.5)
    assert hm[2, 2] == np.float32(0.7) and hm.max() == np.float32(0.7)
    hm = np.zeros((5, 5), dtype=np.float32)
    cn.draw_umich_gaussian(hm, (2, 2), 1, k=0.5)
    assert hm[2, 2] == 0.5 and hm[2, 1] == pytest.approx(0.5 * E2)


# ------------------------------------------------------------------------------------------------
# get_affine_transform, affine_transform
# ------------------------------------------------------------------------------------------------

def _apply(t, x, y):
    return cn.affine_transform((x, y), t)


def test_affine_maps_the_three_points():
    # c = (100, 50), s = 200 onto (128, 96): zoom 128 / 200 = 0.64, c -> (64, 48);
    # point 2: c + (0, -100) -> (64, 48 - 64); point 3: c + (-100, -100)... rotated: b + (-d_y, d_x)
    # with d = a - b = (0, 100) -> (0, -50) in the source, (0, -16) in the output.
    t = cn.get_affine_transform(np.array([100, 50], np.float32), 200, 0, [128, 96])
    assert t.shape == (2, 3) and t.dtype == np.float64
    np.testing.assert_allclose(_apply(t, 100, 50), [64, 48], atol=1e-5)
    np.testing.assert_allclose(_apply(t, 100, -50), [64, -16], atol=1e-5)
    np.testing.assert_allclose(_apply(t, 0, -50), [0, -16], atol=1e-5)
    # x' = 0.64 (x - 100) + 64 = 0.64 x; y' = 0.64 (y - 50) + 48 = 0.64 y + 16
    np.testing.assert_allclose(t, [[0.64, 0, 0], [0, 0.64, 16]], atol=1e-6)


def test_affine_scale_pair_uses_only_its_width():
    c = np.array([100, 50], np.float32)
    scalar = cn.get_affine_transform(c, 200, 0, [128, 96])
    pair = cn.get_affine_transform(c, np.array([200, 50], np.float32), 0, [128, 96])
    np.testing.assert_allclose(pair, scalar, atol=1e-7)


def test_affine_shift_moves_the_source_centre():
    # c + s * shift = (100 + 20, 50 - 40) maps to the output centre.
    t = cn.get_affine_transform(np.array([100, 50], np.float32), 200, 0, [128, 96], shift=(0.1, -0.2))
    np.testing.assert_allclose(_apply(t, 120, 10), [64, 48], atol=1e-5)


def test_affine_rotation_90():
    # rot 90: the source direction (0, -s/2) rotated by 90 degrees is (s/2, 0) = (100, 0), which
    # maps to (64, 48 - 64): a quarter turn with zoom 0.64.
    t = cn.get_affine_transform(np.array([100, 50], np.float32), 200, 90, [128, 96])
    np.testing.assert_allclose(_apply(t, 100, 50), [64, 48], atol=1e-5)
    np.testing.assert_allclose(_apply(t, 200, 50), [64, -16], atol=1e-4)
    np.testing.assert_allclose(t[:, :2], [[0, 0.64], [-0.64, 0]], atol=1e-6)


def test_affine_inverse_composes_to_identity():
    c, s = np.array([320.5, 211], np.float32), np.array([700, 500], np.float32)
    fwd = np.vstack([cn.get_affine_transform(c, s, 0, [128, 128]), [0, 0, 1]])
    inv = np.vstack([cn.get_affine_transform(c, s, 0, [128, 128], inv=1), [0, 0, 1]])
    np.testing.assert_allclose(inv @ fwd, np.eye(3), atol=1e-5)
    np.testing.assert_allclose(fwd @ inv, np.eye(3), atol=1e-5)


def test_affine_transform_points_matches_single_points():
    t = cn.get_affine_transform(np.array([31, 17], np.float32), 90.5, 0, [128, 128])
    pts = np.array([[1.5, 2.25], [-3, 100], [60, 7]], np.float32)
    batch = cn.affine_transform_points(pts, t)
    assert batch.shape == (3, 2)
    for row, pt in zip(batch, pts):
        np.testing.assert_array_equal(row, cn.affine_transform(pt, t))
        np.testing.assert_allclose(row, t @ [pt[0], pt[1], 1.0], rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# colour augmentation
# ------------------------------------------------------------------------------------------------

def _color_aug_float64(image, rng):
    """The reference's colour jitter in float64, op by op from its description."""
    order = rng.permutation(3)
    b, g, r = image[..., 0], image[..., 1], image[..., 2]
    gray = 0.299 * r + 0.587 * g + 0.114 * b
    mean_gray = gray.mean()
    x = image.astype(np.float64)
    for op in order:
        alpha = 1 + rng.uniform(-0.4, 0.4)
        if op == 0:       # brightness
            x = alpha * x
        elif op == 1:     # contrast
            x = alpha * x + (1 - alpha) * mean_gray
        else:             # saturation
            x = alpha * x + (1 - alpha) * gray[..., None]
    light = rng.normal(scale=0.1, size=3)
    return x + cn.COCO_EIG_VEC.astype(np.float64) @ (cn.COCO_EIG_VAL.astype(np.float64) * light)


def _jittered(image, rng):
    """The colour jitter alone: image / 255 jittered, CHW (normalised with mean 0 and std 1, exact)."""
    return cn.normalised_input(image, (0., 0., 0.), (1., 1., 1.), cn.draw_color_jitter(rng))


@pytest.mark.parametrize('seed', [0, 1, 2, 3, 4, 5])
def test_color_aug_against_float64_transcription(seed):
    image = _random_image(7, 9, seed=100 + seed)
    expected = _color_aug_float64(image / 255., np.random.RandomState(seed))
    rng = np.random.RandomState(seed)
    out = _jittered(image, rng)
    assert out.dtype == np.float32 and out.shape == (3, 7, 9)
    np.testing.assert_allclose(out.transpose(1, 2, 0), expected, atol=2e-6)
    # Exactly 3 (order) + 3 uniforms + 3 normals were drawn, in that order.
    check = np.random.RandomState(seed)
    check.permutation(3), check.uniform(size=3), check.normal(size=3)
    assert rng.random_sample() == check.random_sample()


def _reference_input_float32(image, mean, std, rng=None):
    """CenterNet's ctdet.py input steps in float32 on the HWC image, op by op in the reference's
    order (utils/image.py color_aug with its in-place blends), then CHW."""
    inp = image.astype(np.float32) / 255.
    if rng is not None:
        order = rng.permutation(3)
        gray = cv2.cvtColor(inp, cv2.COLOR_BGR2GRAY)
        gray_mean = gray.mean()
        for op in order:
            alpha = 1. + rng.uniform(low=-0.4, high=0.4)
            inp *= alpha
            if op == 1:      # contrast: blend with the mean gray
                inp += gray_mean * (1 - alpha)
            elif op == 2:    # saturation: blend with the gray image
                inp += gray[:, :, None] * (1 - alpha)
        inp += np.dot(cn.COCO_EIG_VEC, cn.COCO_EIG_VAL * rng.normal(scale=0.1, size=(3,)))
    inp = (inp - np.asarray(mean, np.float32).reshape(1, 1, 3)) / np.asarray(std, np.float32).reshape(1, 1, 3)
    return inp.transpose(2, 0, 1)


def _assert_same_bits(a, b):
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


# Sizes with partial row blocks and widths that are no multiple of a SIMD vector.
INPUT_SIZES = [(512, 512), (100, 77), (37, 515), (1, 3), (130, 64)]


@pytest.mark.parametrize('size', INPUT_SIZES)
def test_normalised_input_with_jitter_is_bit_identical_to_the_float32_reference(size):
    # 24 seeds draw each of the 6 op orders several times; the content spans all 256 values.
    for seed in range(24):
        image = _random_image(*size, seed=seed)
        jitter_rng, reference_rng = np.random.RandomState(seed), np.random.RandomState(seed)
        out = cn.normalised_input(image, cn.COCO_MEAN, cn.COCO_STD, cn.draw_color_jitter(jitter_rng))
        _assert_same_bits(out, _reference_input_float32(image, cn.COCO_MEAN, cn.COCO_STD, reference_rng))
        assert out.flags.c_contiguous
        assert jitter_rng.random_sample() == reference_rng.random_sample()


@pytest.mark.parametrize('size', INPUT_SIZES)
def test_normalised_input_without_jitter_is_bit_identical_to_the_float32_reference(size):
    rng = np.random.RandomState(1)
    for seed in range(4):
        image = _random_image(*size, seed=seed)
        mean, std = tuple(rng.uniform(0, 1, 3)), tuple(rng.uniform(0.1, 2, 3))
        _assert_same_bits(cn.normalised_input(image, mean, std), _reference_input_float32(image, mean, std))


# ------------------------------------------------------------------------------------------------
# training / validation samples
# ------------------------------------------------------------------------------------------------

COLOUR = np.array([10, 200, 90], np.uint8)   # BGR


def _image():
    """256 x 256 black image with a coloured block at rows 100..139, columns 50..89."""
    im = np.zeros((256, 256, 3), np.uint8)
    im[100:140, 50:90] = COLOUR
    return im


def _normalised(bgr):
    return (np.asarray(bgr, np.float32) / np.float32(255.) - MEAN) / STD


# b0 -> output [20, 30, 40, 50] (zoom 1/2); b1 -> [20.5, 31, 41.5, 49.5]; b2 outside (empty after
# clipping); b3 -> [0, 0, 4.5, 2.5] at the corner; b4 -> [100, 120, 150, 140] clipped to 127.
BOXES = np.array([[40, 60, 80, 100], [41, 62, 83, 99], [300, 300, 400, 400], [0, 0, 9, 5],
                  [200, 240, 300, 280]], np.float32)
CLASSES = np.array([0, 2, 1, 0, 0])
STILL = cn.CtdetParams(num_classes=3, flip=0.0, rand_crop=False, scale=0.0, shift=0.0, color_aug=False)


@pytest.mark.parametrize('seed', range(6))
def test_sample_hm_nonzero_is_flatnonzero_of_its_heatmap(seed):
    # Many boxes of every size, overlapping, at and past the borders, under random crops and flips: the
    # positions found in the drawn rows are all the heatmap's nonzero ones, ascending.
    rng = np.random.RandomState(seed)
    corners = rng.uniform(-60, 300, (40, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(0.5, 200, (40, 2))], axis=1).astype(np.float32)
    classes = rng.randint(0, 3, 40)
    params = cn.CtdetParams(num_classes=3, max_objs=40)
    for sample in (cn.ctdet_train_sample(_image(), boxes, classes, rng, params),
                   cn.ctdet_val_sample(_image(), boxes, classes, params)):
        assert sample['hm'].any()
        assert sample['hm_nonzero'].dtype == np.int64
        assert sample['hm_nonzero'].tolist() == np.flatnonzero(sample['hm']).tolist()
    empty = cn.ctdet_val_sample(_image(), BOXES[2:3], CLASSES[2:3], params)   # its one box is outside
    assert not empty['hm'].any() and empty['hm_nonzero'].tolist() == []


def test_train_sample_without_jitter_by_hand():
    # rand_crop off with shift = scale = 0: c = (128, 128), s = 256; the output map is
    # x' = (x - 128) * 128 / 256 + 64 = x / 2, the input map x' = 2 x.
    sample = cn.ctdet_train_sample(_image(), BOXES, CLASSES, np.random.RandomState(0), STILL)
    assert sorted(sample) == ['hm', 'hm_nonzero', 'ind', 'input', 'reg', 'reg_mask', 'wh']
    assert sample['input'].shape == (3, 512, 512) and sample['input'].dtype == np.float32
    assert sample['hm'].shape == (3, 128, 128) and sample['hm'].dtype == np.float32
    assert sample['ind'].dtype == np.int64 and sample['reg_mask'].dtype == np.uint8
    assert sample['wh'].shape == sample['reg'].shape == (128, 2)

    np.testing.assert_array_equal(sample['reg_mask'][:6], [1, 1, 0, 1, 1, 0])
    assert sample['reg_mask'].sum() == 4
    # centres: b0 (30, 40); b1 (31, 40.25); b3 (2.25, 1.25); b4 ((100 + 127) / 2, (120 + 127) / 2)
    np.testing.assert_array_equal(sample['ind'][:5], [40 * 128 + 30, 40 * 128 + 31, 0, 1 * 128 + 2,
                                                      123 * 128 + 113])
    np.testing.assert_allclose(sample['wh'][:5], [[20, 20], [21, 18.5], [0, 0], [4.5, 2.5], [27, 7]])
    np.testing.assert_allclose(sample['reg'][:5], [[0, 0], [0, 0.25], [0, 0], [0.25, 0.25], [0.5, 0.5]])
    assert not sample['wh'][5:].any() and not sample['ind'][5:].any()

    hm = sample['hm']
    assert hm[0, 40, 30] == 1 and hm[2, 40, 31] == 1 and hm[0, 1, 2] == 1 and hm[0, 123, 113] == 1
    assert (hm[0] == 1).sum() == 3 and (hm[2] == 1).sum() == 1 and not hm[1].any()
    # b0: radius int(5.466) = 5, sigma 11 / 6: 5 pixels right of the peak exp(-25 / (2 sigma^2)),
    # 6 pixels right is outside the window.
    assert hm[0, 40, 35] == pytest.approx(math.exp(-25 * 36 / 242), rel=1e-6)
    assert hm[0, 40, 36] == 0
    # b3 (h, w = ceil(2.5), ceil(4.5) = 3, 5): radius int(1.030) = 1, window clipped at the top.
    assert hm[0, 0, 2] == pytest.approx(E2, rel=1e-6) and hm[0, 1, 4] == 0

    inp = sample['input']
    np.testing.assert_allclose(inp[:, 240, 140], _normalised(COLOUR), rtol=1e-6)   # image (70, 120)
    np.testing.assert_allclose(inp[:, 10, 10], _normalised([0, 0, 0]), rtol=1e-6)


def test_train_sample_flip_by_hand():
    # Flipped: c.x = 256 - 128 - 1 = 127, so x' = (x - 127) / 2 + 64 = x / 2 + 0.5 on the mirrored
    # boxes x1 = 256 - x2 - 1, x2 = 256 - x1 - 1. b0: [175, 215] -> [88, 108], centre 98.
    params = cn.CtdetParams(num_classes=3, flip=1.0, rand_crop=False, scale=0.0, shift=0.0,
                            color_aug=False)
    sample = cn.ctdet_train_sample(_image(), BOXES[:2], CLASSES[:2], np.random.RandomState(0), params)
    assert sample['ind'][0] == 40 * 128 + 98 and sample['hm'][0, 40, 98] == 1
    # b1: [256 - 83 - 1, 256 - 41 - 1] = [172, 214] -> [86.5, 107.5], centre 97, y as before.
    assert sample['ind'][1] == 40 * 128 + 97
    np.testing.assert_allclose(sample['wh'][:2], [[20, 20], [21, 18.5]])
    np.testing.assert_allclose(sample['reg'][:2], [[0, 0], [0, 0.25]])
    # Input column X shows original column 256 - X / 2: the block moves to X ~ 334..412.
    inp = sample['input']
    np.testing.assert_allclose(inp[:, 240, 373], _normalised(COLOUR), rtol=1e-6)
    np.testing.assert_allclose(inp[:, 240, 140], _normalised([0, 0, 0]), rtol=1e-6)


def test_get_border_by_hand():
    # 256: 256 - 128 <= 128 -> 64; 300 - 128 > 128 -> 128; 100: 36 <= 64 -> 68 > 32 -> 32.
    assert [cn._get_border(128, size) for size in (256, 300, 200, 100, 129, 1)] == [64, 128, 64, 32, 64, 0]


def test_train_sample_random_crop_draw_order():
    # Draws: zoom choice, centre x in [64, 192), centre y in [64, 192), flip coin.
    seed = 11
    check = np.random.RandomState(seed)
    s = 256 * check.choice(np.arange(0.6, 1.4, 0.1))
    cx, cy = check.randint(64, 192), check.randint(64, 192)
    flipped = check.random_sample() < 0.5
    params = cn.CtdetParams(num_classes=3, color_aug=False)
    rng = np.random.RandomState(seed)
    sample = cn.ctdet_train_sample(_image(), BOXES[:1], CLASSES[:1], rng, params)
    assert rng.random_sample() == check.random_sample()

    x1, x2 = (256 - 80 - 1, 256 - 40 - 1) if flipped else (40, 80)
    if flipped:
        cx = 256 - cx - 1
    zoom = 128 / s
    box = np.clip([(x1 - cx) * zoom + 64, (60 - cy) * zoom + 64,
                   (x2 - cx) * zoom + 64, (100 - cy) * zoom + 64], 0, 127)
    ct = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2])
    assert sample['reg_mask'][0] == 1
    assert sample['ind'][0] == int(ct[1]) * 128 + int(ct[0])
    np.testing.assert_allclose(sample['reg'][0], ct - ct.astype(int), atol=1e-4)
    np.testing.assert_allclose(sample['wh'][0], [box[2] - box[0], box[3] - box[1]], atol=1e-4)


def test_train_sample_gaussian_jitter_draw_order():
    # --not_rand_crop: c += s * clip(N * 0.1, +-0.2) per axis, then s *= clip(N * 0.4 + 1, 0.6, 1.4).
    seed = 5
    check = np.random.RandomState(seed)
    cx = 128 + 256 * np.clip(check.randn() * 0.1, -0.2, 0.2)
    cy = 128 + 256 * np.clip(check.randn() * 0.1, -0.2, 0.2)
    s = 256 * np.clip(check.randn() * 0.4 + 1, 0.6, 1.4)
    assert check.random_sample() >= 0.5   # this seed does not flip
    params = cn.CtdetParams(num_classes=3, rand_crop=False, color_aug=False)
    sample = cn.ctdet_train_sample(_image(), BOXES[:1], CLASSES[:1], np.random.RandomState(seed), params)
    zoom = 128 / s
    ct = np.array([(60 - cx) * zoom + 64, (80 - cy) * zoom + 64])   # centre of b0 = (60, 80)
    assert sample['ind'][0] == int(ct[1]) * 128 + int(ct[0])
    np.testing.assert_allclose(sample['reg'][0], ct - ct.astype(int), atol=1e-4)
    np.testing.assert_allclose(sample['wh'][0], [40 * zoom, 40 * zoom], atol=1e-4)


def test_train_sample_colour_aug_uses_the_same_rng_after_geometry():
    params = cn.CtdetParams(num_classes=3, flip=0.0, rand_crop=False, scale=0.0, shift=0.0)
    rng = np.random.RandomState(3)
    jittered = cn.ctdet_train_sample(_image(), BOXES[:1], CLASSES[:1], rng, params)['input']
    plain = cn.ctdet_train_sample(_image(), BOXES[:1], CLASSES[:1], np.random.RandomState(3), STILL)
    # Geometry draws (3 normals, flip coin) come first, then the colour jitter from the same stream.
    check = np.random.RandomState(3)
    check.randn(3), check.random_sample()
    inp = plain['input'].transpose(1, 2, 0) * STD + MEAN
    expected = (_color_aug_float64(inp.astype(np.float64), check) - MEAN) / STD
    np.testing.assert_allclose(jittered.transpose(1, 2, 0), expected, atol=2e-5)


@pytest.mark.parametrize('seed', [0, 1, 2, 3])   # seeds 1 and 3 flip
def test_train_sample_input_is_the_reference_pipeline_bit_for_bit(seed):
    # Random crop on a 420 x 300 image (borders 128 on both axes), the flip coin, the warp, then the
    # float32 colour jitter and normalisation, all from the one rng in this order.
    im = _random_image(300, 420, seed=seed)
    rng = np.random.RandomState(seed)
    sample = cn.ctdet_train_sample(im, BOXES, CLASSES, rng, cn.CtdetParams(num_classes=3))
    check = np.random.RandomState(seed)
    s = 420. * check.choice(np.arange(0.6, 1.4, 0.1))
    c = np.array([check.randint(128, 420 - 128), check.randint(128, 300 - 128)], np.float32)
    source = im
    if check.random_sample() < 0.5:
        source, c[0] = im[:, ::-1, :], 420 - c[0] - 1
    warped = cv2.warpAffine(np.ascontiguousarray(source), cn.get_affine_transform(c, s, 0, [512, 512]),
                            (512, 512), flags=cv2.INTER_LINEAR)
    _assert_same_bits(sample['input'], _reference_input_float32(warped, cn.COCO_MEAN, cn.COCO_STD, check))
    assert rng.random_sample() == check.random_sample()


def test_train_sample_keeps_only_max_objs_annotations():
    params = cn.CtdetParams(num_classes=3, max_objs=3, flip=0.0, rand_crop=False, scale=0.0,
                            shift=0.0, color_aug=False)
    sample = cn.ctdet_train_sample(_image(), BOXES, CLASSES, np.random.RandomState(0), params)
    assert sample['ind'].shape == sample['reg_mask'].shape == (3,) and sample['wh'].shape == (3, 2)
    np.testing.assert_array_equal(sample['reg_mask'], [1, 1, 0])
    assert (sample['hm'] == 1).sum() == 2   # b3 and b4 are not drawn


def test_train_sample_without_boxes():
    sample = cn.ctdet_train_sample(_image(), np.zeros((0, 4), np.float32), np.zeros(0, np.int64),
                                   np.random.RandomState(0), STILL)
    assert not sample['hm'].any() and not sample['reg_mask'].any()


def test_train_sample_target_layout_options():
    params = cn.CtdetParams(num_classes=3, flip=0.0, rand_crop=False, scale=0.0, shift=0.0,
                            color_aug=False, cat_spec_wh=True, reg_offset=False)
    sample = cn.ctdet_train_sample(_image(), BOXES, CLASSES, np.random.RandomState(0), params)
    assert sorted(sample) == ['cat_spec_mask', 'cat_spec_wh', 'hm', 'hm_nonzero', 'ind', 'input', 'reg_mask']
    assert sample['cat_spec_wh'].shape == (128, 6) and sample['cat_spec_mask'].dtype == np.uint8
    np.testing.assert_allclose(sample['cat_spec_wh'][1], [0, 0, 0, 0, 21, 18.5])   # class 2
    np.testing.assert_allclose(sample['cat_spec_wh'][4], [27, 7, 0, 0, 0, 0])      # class 0
    np.testing.assert_array_equal(sample['cat_spec_mask'][:5],
                                  [[1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1], [0] * 6,
                                   [1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]])


def test_val_sample_has_no_augmentation_and_a_meta():
    params = cn.CtdetParams(num_classes=3)   # flip / random crop / colour jitter all enabled
    sample = cn.ctdet_val_sample(_image(), BOXES, CLASSES, params)
    still = cn.ctdet_train_sample(_image(), BOXES, CLASSES, np.random.RandomState(0), STILL)
    for key in ('hm', 'wh', 'reg', 'ind', 'reg_mask', 'input'):
        np.testing.assert_array_equal(sample[key], still[key])
    meta = sample['meta']
    np.testing.assert_array_equal(meta['c'], [128, 128])
    assert meta['c'].dtype == np.float32 and meta['s'] == 256
    # gt_det: [cx - w/2, cy - h/2, cx + w/2, cy + h/2, 1, class] of the 4 non-empty boxes
    np.testing.assert_allclose(meta['gt_det'], [[20, 30, 40, 50, 1, 0], [20.5, 31, 41.5, 49.5, 1, 2],
                                                [0, 0, 4.5, 2.5, 1, 0], [100, 120, 127, 127, 1, 0]])


# ------------------------------------------------------------------------------------------------
# roidb
# ------------------------------------------------------------------------------------------------

def _coco(categories, images, annotations):
    return {'images': [{'id': i, 'file_name': '{}.jpg'.format(i), 'width': 640, 'height': 480}
                       for i in images],
            'annotations': annotations,
            'categories': [{'id': c, 'name': 'cat{}'.format(c)} for c in categories]}


def _ann(ann_id, image_id, category_id, bbox, iscrowd=0):
    return {'id': ann_id, 'image_id': image_id, 'category_id': category_id, 'bbox': bbox,
            'iscrowd': iscrowd, 'area': bbox[2] * bbox[3]}


@pytest.fixture
def register(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})

    def register(name, coco):
        image_dir = tmp_path / name / 'images'
        image_dir.mkdir(parents=True)
        for image in coco['images']:
            (image_dir / image['file_name']).write_bytes(b'')
        ann_file = tmp_path / name / 'annotations.json'
        ann_file.write_text(json.dumps(coco))
        dataset_catalog.register_dataset(name, str(image_dir), str(ann_file))
        return image_dir

    return register


def test_roidb_keeps_all_images_and_annotations(register):
    image_dir = register('tiny', _coco(
        categories=[7, 1, 3], images=[7, 3, 5],
        annotations=[_ann(1, 7, 3, [10.5, 20.25, 30.1, 40.7]),
                     _ann(2, 3, 7, [0, 0, 50, 60], iscrowd=1),
                     _ann(3, 3, 1, [5, 6, 7, 8]),
                     _ann(4, 3, 3, [1, 1, 0, 0])]))   # degenerate: kept (CenterNet filters nothing)
    roidb = cn.centernet_roidb(['tiny'])
    assert [e['id'] for e in roidb] == [3, 5, 7]
    assert roidb[0]['image'] == str(image_dir / '3.jpg')
    assert (roidb[0]['width'], roidb[0]['height']) == (640, 480)
    # categories sorted 1, 3, 7 -> 0, 1, 2; annotations in the json's order, crowd included
    np.testing.assert_array_equal(roidb[0]['classes'], [2, 0, 1])
    assert roidb[0]['classes'].dtype == np.int64 and roidb[0]['boxes'].dtype == np.float32
    np.testing.assert_array_equal(roidb[0]['boxes'], [[0, 0, 50, 60], [5, 6, 12, 14], [1, 1, 1, 1]])
    assert roidb[1]['boxes'].shape == (0, 4) and roidb[1]['classes'].shape == (0,)
    # x + w summed in float64 then stored as float32
    np.testing.assert_array_equal(
        roidb[2]['boxes'], np.array([[10.5, 20.25, 10.5 + 30.1, 20.25 + 40.7]], np.float64).astype(np.float32))


def test_roidb_unknown_category_names_image_and_id(register):
    register('bad', _coco(categories=[1, 2], images=[4],
                          annotations=[_ann(9, 4, 1, [0, 0, 5, 5]), _ann(10, 4, 13, [0, 0, 5, 5])]))
    with pytest.raises(DatasetError) as err:
        cn.centernet_roidb(['bad'])
    message = str(err.value)
    assert '\n' not in message and 'image 4' in message and 'category_id 13' in message
    assert 'fix' in message


def test_roidb_concatenates_datasets_with_the_same_categories(register):
    register('a', _coco(categories=[1, 2], images=[2, 1], annotations=[_ann(1, 1, 2, [0, 0, 5, 5])]))
    register('b', _coco(categories=[2, 1], images=[9], annotations=[_ann(1, 9, 1, [0, 0, 5, 5])]))
    register('c', _coco(categories=[1, 3], images=[9], annotations=[]))
    roidb = cn.centernet_roidb(['a', 'b'])
    assert [e['id'] for e in roidb] == [1, 2, 9]
    assert roidb[0]['classes'].tolist() == [1] and roidb[2]['classes'].tolist() == [0]
    with pytest.raises(DatasetError, match='different category ids'):
        cn.centernet_roidb(['a', 'c'])


# ------------------------------------------------------------------------------------------------
# test-time input
# ------------------------------------------------------------------------------------------------

def test_test_inputs_keep_res_is_a_translation():
    # 60 x 100: canvas ((60 | 31) + 1, (100 | 31) + 1) = (64, 128); c = (50, 30), s = (128, 64):
    # x' = x - 50 + 64 = x + 14, y' = y - 30 + 32 = y + 2.
    im = _random_image(60, 100)
    images, meta = cn.ctdet_test_inputs(im, 1.0, cn.CtdetParams(), keep_res=True)
    assert images.shape == (1, 3, 64, 128) and images.dtype == np.uint8
    np.testing.assert_array_equal(meta['c'], [50, 30])
    np.testing.assert_array_equal(meta['s'], [128, 64])
    assert meta['c'].dtype == meta['s'].dtype == np.float32
    assert (meta['out_height'], meta['out_width']) == (16, 32)
    np.testing.assert_array_equal(images[0].transpose(1, 2, 0)[2:62, 14:114], im)
    np.testing.assert_array_equal(images[0, :, 0, 0], [0, 0, 0])


def test_test_inputs_keep_res_pads_to_a_strictly_larger_multiple_of_32():
    images, meta = cn.ctdet_test_inputs(_random_image(64, 96), 0.5, cn.CtdetParams(), keep_res=True)
    # resized 32 x 48 -> canvas (32 | 31) + 1 = 64, (48 | 31) + 1 = 64; c = (24, 16)
    assert images.shape == (1, 3, 64, 64)
    np.testing.assert_array_equal(meta['c'], [24, 16])
    np.testing.assert_array_equal(meta['s'], [64, 64])


def test_test_inputs_fix_res_uses_original_size_for_s():
    im = np.full((60, 100, 3), 77, np.uint8)
    params = cn.CtdetParams(input_h=384, input_w=512)
    images, meta = cn.ctdet_test_inputs(im, 0.5, params)
    assert images.shape == (1, 3, 384, 512)
    np.testing.assert_array_equal(meta['c'], [25, 15])   # centre of the 30 x 50 resized image
    assert meta['s'] == 100.0                            # max(h, w) of the original, not 50
    assert (meta['out_height'], meta['out_width']) == (96, 128)
    # zoom 512 / 100 on the 50 x 30 resized image: content spans x in 256 +- 128, y in 192 +- 76.8
    np.testing.assert_array_equal(images[0, :, 192, 256], [77, 77, 77])
    np.testing.assert_array_equal(images[0, :, 192, 100], [0, 0, 0])
    np.testing.assert_array_equal(images[0, :, 100, 256], [0, 0, 0])


def test_test_inputs_flip_adds_the_mirrored_copy():
    images, _ = cn.ctdet_test_inputs(_random_image(50, 70), 1.0, cn.CtdetParams(), keep_res=True,
                                     flip=True)
    assert images.shape == (2, 3, 64, 96)
    np.testing.assert_array_equal(images[1], images[0][:, :, ::-1])
