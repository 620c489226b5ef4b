import numpy as np
import pytest

from detectron.utils.blob import (blob_shape, fill_blob, get_image_blob_t, im_list_to_blob, padded_size,
                                  prep_im_for_blob, resize_scale)

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]])


@pytest.mark.parametrize('height, width, target, max_size, expected', [
    (480, 640, 600, 1000, 1.25),             # short side 480 -> 600, long side 800 fits
    (640, 480, 600, 1000, 1.25),             # portrait: same rule on the short side
    (300, 1200, 600, 1000, 1000 / 1200),     # long side would be 2400: capped
    (601, 1002, 600, 1000, 600 / 601),       # long side 1000.33 rounds to 1000: not capped
    (599, 999, 600, 1000, 1000 / 999),       # long side 1000.67 rounds to 1001: capped
    (600, 1000, 600, 1000, 1.0),
])
def test_resize_scale(height, width, target, max_size, expected):
    assert resize_scale(height, width, target, max_size) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize('height, width, target, expected_shape', [
    (480, 640, 600, (600, 800)),
    (300, 1200, 600, (250, 1000)),
    (601, 1002, 600, (600, 1000)),
    (333, 500, 600, (600, 901)),   # 500 * 600/333 = 900.9
])
def test_prep_im_for_blob_output_size(height, width, target, expected_shape):
    im = np.zeros((height, width, 3), dtype=np.uint8)
    ims, scales = prep_im_for_blob(im, PIXEL_MEANS, [target], 1000)
    assert ims[0].shape == expected_shape + (3,)
    assert ims[0].dtype == np.float32
    assert len(scales) == 1


def test_prep_im_for_blob_one_output_per_target_size():
    im = np.zeros((100, 200, 3), dtype=np.uint8)
    ims, scales = prep_im_for_blob(im, PIXEL_MEANS, [50, 200], 1000)
    assert [i.shape for i in ims] == [(50, 100, 3), (200, 400, 3)]
    assert scales == [0.5, 2.0]


def test_pixel_means_are_subtracted_per_bgr_channel_without_std():
    im = np.empty((4, 6, 3), dtype=np.uint8)
    im[..., 0], im[..., 1], im[..., 2] = 200, 100, 50   # B, G, R
    cfg_shaped_means = (((102.9801, 115.9465, 122.7717),),)   # how cfg.PIXEL_MEANS stores them
    ims, _ = prep_im_for_blob(im, cfg_shaped_means, [4], 1000)
    expected = np.array([200 - 102.9801, 100 - 115.9465, 50 - 122.7717], dtype=np.float32)
    np.testing.assert_allclose(ims[0], np.broadcast_to(expected, (4, 6, 3)), rtol=0, atol=1e-5)


def test_mean_subtraction_is_bitwise_detectrons():
    # Detectron's blob.py: im = im.astype(np.float32); im -= cfg.PIXEL_MEANS, a float64 (1, 1, 3)
    # array, so numpy subtracts in float64 and rounds once; every uint8 value in every channel
    # (scale 1 makes cv2.resize a copy). float32 means would round half of these differently.
    im = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    ims, scales = prep_im_for_blob(im, PIXEL_MEANS, [16], 1000)
    detectron = im.astype(np.float32)
    detectron -= np.array([[[102.9801, 115.9465, 122.7717]]])
    assert scales == [1.0]
    np.testing.assert_array_equal(ims[0].view(np.uint32), detectron.view(np.uint32))
    assert (im.astype(np.float32) - PIXEL_MEANS.astype(np.float32) != detectron).mean() > 0.4


def _bilinear_half_pixel(src, scale):
    """Plain-loop bilinear resize, pixel centres at +0.5, borders replicated (cv2 INTER_LINEAR)."""
    out_h, out_w = int(round(src.shape[0] * scale)), int(round(src.shape[1] * scale))
    out = np.zeros((out_h, out_w) + src.shape[2:], dtype=np.float64)
    for y in range(out_h):
        sy = min(max((y + 0.5) / scale - 0.5, 0), src.shape[0] - 1)
        y0 = int(np.floor(sy))
        y1, fy = min(y0 + 1, src.shape[0] - 1), sy - y0
        for x in range(out_w):
            sx = min(max((x + 0.5) / scale - 0.5, 0), src.shape[1] - 1)
            x0 = int(np.floor(sx))
            x1, fx = min(x0 + 1, src.shape[1] - 1), sx - x0
            top = src[y0, x0] * (1 - fx) + src[y0, x1] * fx
            bottom = src[y1, x0] * (1 - fx) + src[y1, x1] * fx
            out[y, x] = top * (1 - fy) + bottom * fy
    return out


def test_resize_is_bilinear():
    im = np.random.RandomState(1).randint(0, 256, (4, 5, 3)).astype(np.uint8)
    ims, scales = prep_im_for_blob(im, np.zeros(3), [8], 1000)
    assert scales == [2.0]
    np.testing.assert_allclose(ims[0], _bilinear_half_pixel(im.astype(np.float64), 2.0), atol=1e-3)


@pytest.mark.parametrize('stride, expected', [(32, (64, 64)), (1, (45, 50)), (0, (45, 50)), (16, (48, 64))])
def test_im_list_to_blob_pads_to_stride(stride, expected):
    rng = np.random.RandomState(2)
    ims = [rng.uniform(-5, 5, (30, 50, 3)).astype(np.float32),
           rng.uniform(-5, 5, (45, 20, 3)).astype(np.float32)]
    blob = im_list_to_blob(ims, stride)
    assert blob.shape == (2, 3) + expected
    assert blob.dtype == np.float32
    for i, im in enumerate(ims):
        h, w = im.shape[:2]
        for c in range(3):
            np.testing.assert_array_equal(blob[i, c, :h, :w], im[:, :, c])
        # Everything outside the image (bottom and right) is zero.
        assert not blob[i, :, h:, :].any()
        assert not blob[i, :, :, w:].any()


def test_padded_size():
    assert padded_size(600, 800, 32) == (608, 800)
    assert padded_size(250, 1000, 32) == (256, 1024)
    assert padded_size(250, 1000, 1) == (250, 1000)


def get_image_blob(im, target_scale, target_max_size, pixel_means, stride):
    """Detectron's test-time blob by cv2 (prep_im_for_blob, im_list_to_blob): (blob (1, 3, H, W),
    im_scale, im_info (1, 3) float32 with the padded height and width), the numpy reference of
    get_image_blob_t."""
    ims, scales = prep_im_for_blob(im, pixel_means, [target_scale], target_max_size)
    blob = im_list_to_blob(ims, stride)
    return blob, scales[0], np.array([[blob.shape[2], blob.shape[3], scales[0]]], dtype=np.float32)


def test_get_image_blob_uses_padded_size_in_im_info():
    im = np.zeros((480, 640, 3), dtype=np.uint8)
    blob, im_scale, im_info = get_image_blob_t(im, 600, 1000, PIXEL_MEANS, 32, 'cpu')
    blob, im_info = blob.numpy(), im_info.numpy()
    assert blob.shape == (1, 3, 608, 800)
    assert im_scale == 1.25
    assert im_info.dtype == np.float32
    np.testing.assert_array_equal(im_info, np.array([[608, 800, 1.25]], dtype=np.float32))
    # The image occupies the top 600 rows (value -mean), the padding rows are zero.
    np.testing.assert_allclose(blob[0, :, :600, :], np.broadcast_to(
        -PIXEL_MEANS.reshape(3, 1, 1), (3, 600, 800)), atol=1e-4)
    assert not blob[0, :, 600:, :].any()


@pytest.mark.parametrize('height, width, target, max_size', [
    (480, 640, 800, 1333),   # upscale 5/3
    (600, 800, 600, 1000),   # scale 1: an exact copy
    (1000, 700, 500, 833),   # downscale
    (801, 1334, 800, 1333),  # capped by max_size, output near 1333 px wide
    (97, 131, 160, 224),
])
def test_device_blob_matches_cv2_blob(height, width, target, max_size):
    """get_image_blob_t (torch) against get_image_blob (cv2.resize): same size, im_info and scale,
    values equal to float32 rounding of 0..255-range numbers."""
    means = ((102.9801, 115.9465, 122.7717),)
    im = np.random.RandomState(height).randint(0, 256, (height, width, 3)).astype(np.uint8)
    blob, scale, im_info = get_image_blob(im, target, max_size, means, 32)
    blob_t, scale_t, im_info_t = get_image_blob_t(im, target, max_size, means, 32, 'cpu')
    assert scale_t == scale
    assert tuple(blob_t.shape) == blob.shape
    np.testing.assert_array_equal(im_info_t.numpy(), im_info)
    np.testing.assert_allclose(blob_t.numpy(), blob, rtol=0, atol=1e-4)
    if scale == 1.0:
        np.testing.assert_array_equal(blob_t.numpy(), blob)


def test_fill_blob_overwrites_every_element():
    # The blob may be fresh shared memory holding anything: the padding must be written as zeros.
    rng = np.random.RandomState(4)
    ims = [rng.uniform(-5, 5, (30, 50, 3)).astype(np.float32), rng.uniform(-5, 5, (45, 20, 3)).astype(np.float32)]
    blob = np.full(blob_shape(ims, 16), np.nan, dtype=np.float32)
    fill_blob(blob, ims)
    assert blob.shape == (2, 3, 48, 64)
    assert blob.tobytes() == im_list_to_blob(ims, 16).tobytes()
    assert not np.isnan(blob).any()
