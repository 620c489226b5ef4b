"""Synthetic images and training batches, as our loader and as torchvision take them."""
import numpy as np
import pycocotools.mask as mask_util
import torch

from detectron.core.config import cfg
from detectron.roi_data.loader import to_device
from detectron.roi_data.minibatch import polygon_targets
from detectron.utils import blob as blob_utils


def synthetic_images(num, height, width, seed):
    rng = np.random.RandomState(seed)
    return rng.randint(0, 256, size=(num, height, width, 3)).astype(np.uint8)


def synthetic_batch(batch, height, width, boxes, num_classes, seed=0):
    """Random images (uint8 BGR) and boxes (xyxy, pixels) with labels 1..num_classes-1."""
    rng = np.random.RandomState(seed)
    images = synthetic_images(batch, height, width, seed)
    xy = rng.uniform(0, [width * 0.7, height * 0.7], size=(batch, boxes, 2))
    wh = rng.uniform(min(32, height / 4), min(300, height / 2), size=(batch, boxes, 2))
    corners = np.concatenate([xy, np.minimum(xy + wh, [width - 1, height - 1])], axis=2)
    labels = rng.randint(1, num_classes, size=(batch, boxes))
    return images, corners.astype(np.float32), labels


def ours_train_inputs(images, boxes, labels, device):
    """The blob our loader would give: mean-subtracted BGR, padded to the coarsest FPN stride."""
    means = np.array(cfg.PIXEL_MEANS, np.float32).reshape(1, 1, 1, 3)
    b, h, w, _ = images.shape
    ph, pw = blob_utils.padded_size(h, w, cfg.FPN.COARSEST_STRIDE)
    blob = np.zeros((b, ph, pw, 3), np.float32)
    blob[:, :h, :w] = images.astype(np.float32) - means
    blob = torch.from_numpy(blob).permute(0, 3, 1, 2).contiguous().to(device)
    im_info = torch.tensor([[h, w, 1.0]] * b, device=device)
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'classes': torch.from_numpy(lb).long().to(device),
                'is_crowd': torch.zeros(len(lb), dtype=torch.bool, device=device)}
               for bx, lb in zip(boxes, labels)]
    if cfg.MODEL.MASK_ON:  # each object the filled box: its outline polygon, packed as the loader packs it
        for target, bx in zip(targets, boxes):
            target.update(to_device(polygon_targets(_box_outlines(bx)), device))
    if cfg.MODEL.KEYPOINTS_ON:  # (N, 3, K) (x, y, v) rows, as minibatch.gt_targets packs them
        for target, kps in zip(targets, synthetic_keypoints(boxes)):
            target['keypoints'] = torch.from_numpy(kps.transpose(0, 2, 1).copy()).to(device)
    return blob, im_info, targets


def torchvision_train_inputs(images, boxes, labels, device):
    """torchvision's API: RGB float images in [0, 1]; it normalises and batches them itself."""
    ims = [torch.from_numpy(im[:, :, ::-1].copy()).permute(2, 0, 1).float().div(255).to(device) for im in images]
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'labels': torch.from_numpy(lb).long().to(device)}
               for bx, lb in zip(boxes, labels)]
    if cfg.MODEL.MASK_ON:  # the same filled boxes as (N, H, W) masks
        for target, bx, im in zip(targets, boxes, images):
            target['masks'] = torch.from_numpy(_box_masks(bx, *im.shape[:2])).to(device)
    if cfg.MODEL.KEYPOINTS_ON:  # the same keypoints, torchvision's (N, K, 3)
        for target, kps in zip(targets, synthetic_keypoints(boxes)):
            target['keypoints'] = torch.from_numpy(kps).to(device)
    return ims, targets


def synthetic_keypoints(boxes, seed=0):
    """Per image (N, K, 3) float32 keypoints: KRCNN.NUM_KEYPOINTS visible points (v 2) at whole pixels drawn
    uniformly inside each box (B, N, 4), the same for both models."""
    rng = np.random.RandomState(seed)
    per_image = []
    for bx in boxes:
        x = rng.uniform(bx[:, None, 0], bx[:, None, 2], size=(len(bx), cfg.KRCNN.NUM_KEYPOINTS))
        y = rng.uniform(bx[:, None, 1], bx[:, None, 3], size=(len(bx), cfg.KRCNN.NUM_KEYPOINTS))
        per_image.append(np.stack([np.floor(x), np.floor(y), np.full_like(x, 2)], axis=2).astype(np.float32))
    return per_image


def _box_masks(boxes, height, width):
    """(N, height, width) uint8 masks of the pixels pycocotools rasterises from each box outline
    (the polygon [x1, y1, x2, y1, x2, y2, x1, y2]), so both models learn the same masks."""
    polygons = _box_outlines(boxes.astype(np.float64))
    return np.stack([mask_util.decode(mask_util.frPyObjects(p, height, width))[:, :, 0] for p in polygons])


def _box_outlines(boxes):
    """Each box (x1, y1, x2, y2) as one object of one polygon, its outline [x1, y1, x2, y1, x2, y2, x1, y2]."""
    return [[[x1, y1, x2, y1, x2, y2, x1, y2]] for x1, y1, x2, y2 in boxes]
