"""Image -> network input blob: mean subtraction, Detectron's resize rule, stride padding.

prep_im_for_blob and im_list_to_blob: numpy in, numpy out (NCHW float32), as in Detectron; the
training loader workers use them (minibatch.prepare_training_image) when the device does not resize.
images_blob_t does the same on the images' device with cv2's resize arithmetic, from uint8 images:
for a training batch (TRAIN.RESIZE_ON_DEVICE) and, through get_image_blob_t, for a test image.
Pixel values stay BGR in 0..255 minus PIXEL_MEANS: Detectron .pkl weights expect exactly that.
"""

import functools

import cv2
import numpy as np
import torch


def resize_scale(im_height, im_width, target_size, max_size):
    """Scale that brings the short side to target_size unless the long side would exceed max_size.

    The cap compares the *rounded* long side, as Detectron does, so a long side of 1000.4 is not capped.
    """
    short_side = min(im_height, im_width)
    long_side = max(im_height, im_width)
    scale = float(target_size) / float(short_side)
    if np.round(scale * long_side) > max_size:
        scale = float(max_size) / float(long_side)
    return scale


def prep_im_for_blob(im, pixel_means, target_sizes, max_size):
    """Subtract BGR pixel means and resize `im` once per target size.

    Returns (list of float32 HxWx3 images, list of scales), one pair per entry of target_sizes.
    """
    # Detectron's `im -= pixel_means` on the float32 image with its float64 PIXEL_MEANS array: the
    # difference is taken in float64 and rounded to float32 once.
    im = (im.astype(np.float64) - np.asarray(pixel_means, dtype=np.float64).reshape(1, 1, 3)).astype(np.float32)
    ims, scales = [], []
    for target_size in target_sizes:
        scale = resize_scale(im.shape[0], im.shape[1], target_size, max_size)
        ims.append(cv2.resize(im, None, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR))
        scales.append(scale)
    return ims, scales


def padded_size(height, width, stride):
    """(height, width) rounded up to a multiple of stride; stride 0 or 1 leaves them as they are."""
    if stride <= 1:
        return int(height), int(width)
    return int(np.ceil(height / stride) * stride), int(np.ceil(width / stride) * stride)


def im_list_to_blob(ims, stride=32):
    """Stack HxWx3 images into a zero-padded float32 (B, 3, H, W) blob.

    Images sit at the top-left corner; H, W are the batch maxima rounded up to a multiple of stride
    (FPN.COARSEST_STRIDE), so every FPN level has an integer size.
    """
    blob = np.empty(blob_shape(ims, stride), dtype=np.float32)
    fill_blob(blob, ims)
    return blob


def blob_shape(ims, stride):
    """(B, 3, H, W) of im_list_to_blob(ims, stride)."""
    height, width = padded_size(max(im.shape[0] for im in ims), max(im.shape[1] for im in ims), stride)
    return len(ims), 3, height, width


def fill_blob(blob, ims):
    """Write im_list_to_blob(ims, ...) into blob, a (B, 3, H, W) array of its shape: every element
    once (the padding as zeros), so a blob in fresh shared memory has no page left untouched."""
    for i, im in enumerate(ims):
        height, width = im.shape[:2]
        blob[i, :, :height, :width] = im.transpose(2, 0, 1)
        blob[i, :, :height, width:] = 0
        blob[i, :, height:, :] = 0


@functools.lru_cache(maxsize=1024)
def _linear_taps(out_size, in_size, scale, device):
    """cv2.INTER_LINEAR's source taps along one axis for a resize by `scale`: for output pixel d,
    the source position (d + 0.5) / scale - 0.5, its two neighbours clamped to the image and the
    weight of the second one (fractional part taken in float64, then float32: float32 positions
    would be off by up to 6e-5 px at x ~ 1000, which moved values by 0.01 against cv2). Kept per
    (sizes, scale, device): a dataset has a few image sizes, and each tap table costs a dozen kernels."""
    positions = (torch.arange(out_size, dtype=torch.float64, device=device) + 0.5) * (1.0 / scale) - 0.5
    first = torch.floor(positions)
    weight = (positions - first).float()
    first = first.long()
    outside = (first < 0) | (first >= in_size - 1)
    weight = weight.masked_fill(outside, 0.0)
    first = first.clamp(0, in_size - 1)
    second = (first + 1).clamp(max=in_size - 1)
    return first, second, weight


def _resize_linear_t(im, scale):
    """Resize an (H, W, 3) float32 tensor like cv2.resize(fx=fy=scale, INTER_LINEAR): horizontal
    pass then vertical pass, each a two-tap weighted sum with cv2's border rule."""
    height, width = im.shape[:2]
    out_h, out_w = int(round(height * scale)), int(round(width * scale))
    if out_h == height and out_w == width and scale == 1.0:
        return im
    x0, x1, wx = _linear_taps(out_w, width, scale, im.device)
    rows = im[:, x0] * (1 - wx)[None, :, None] + im[:, x1] * wx[None, :, None]
    y0, y1, wy = _linear_taps(out_h, height, scale, im.device)
    return rows[y0] * (1 - wy)[:, None, None] + rows[y1] * wy[:, None, None]


def get_image_blob_t(im, target_scale, target_max_size, pixel_means, stride, device):
    """Test-time input for one BGR uint8 image, computed on `device`: uploads the uint8 image (4x
    less data than the float blob) and does the mean subtraction, cv2-equivalent resize and padding
    there (images_blob_t). Returns (blob tensor (1, 3, H, W), im_scale, im_info tensor (1, 3)).

    im_info holds the *padded* blob height and width (Detectron's test convention: the RPN clips
    proposals to it, and keeping it reproduces Detectron's published numbers exactly)."""
    image = torch.from_numpy(np.ascontiguousarray(im)).to(device, non_blocking=True)
    im_scale = resize_scale(im.shape[0], im.shape[1], target_scale, target_max_size)
    blob = images_blob_t([image], [im_scale], pixel_means, stride)
    im_info = torch.tensor([[blob.shape[2], blob.shape[3], im_scale]], dtype=torch.float32, device=device)
    return blob, im_scale, im_info


def images_blob_t(images, scales, pixel_means, stride):
    """prep_im_for_blob and im_list_to_blob on the images' device, for training batches and test
    images alike: BGR uint8 (H, W, 3) tensors, each
    resized by its scale (a float, as resize_scale gave it) -> float32 (B, 3, H, W) blob, equal to
    the numpy path up to float rounding (cv2's resize rounds its own way: within 1e-4 on these values)."""
    resized = [_resize_linear_t(_minus_means_t(image, pixel_means), scale) for image, scale in zip(images, scales)]
    height, width = padded_size(max(r.shape[0] for r in resized), max(r.shape[1] for r in resized), stride)
    blob = torch.zeros((len(resized), 3, height, width), dtype=torch.float32, device=resized[0].device)
    for i, r in enumerate(resized):
        blob[i, :, :r.shape[0], :r.shape[1]] = r.permute(2, 0, 1)
    return blob


def _minus_means_t(image, pixel_means):
    """float64 image minus the float64 means, then float32: prep_im_for_blob's (Detectron's) rounding."""
    return (image.double() - _means_t(tuple(np.asarray(pixel_means, np.float64).ravel()), image.device)).float()


@functools.lru_cache(maxsize=16)
def _means_t(pixel_means, device):
    # Made once per device: a host-to-device copy per image would wait for the GPU.
    return torch.tensor(pixel_means, dtype=torch.float64, device=device).reshape(1, 1, 3)
