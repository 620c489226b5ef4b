"""Synthetic images and training batches, as our loader and as torchvision take them."""
import numpy as np
import torch

from detectron.core.config import cfg
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
    return blob, im_info, targets


def torchvision_train_inputs(images, boxes, labels, device):
    """torchvision's API: RGB float images in [0, 1]; it normalises and batches them itself."""
    ims = [torch.from_numpy(im[:, :, ::-1].copy()).permute(2, 0, 1).float().div(255).to(device) for im in images]
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'labels': torch.from_numpy(lb).long().to(device)}
               for bx, lb in zip(boxes, labels)]
    return ims, targets
