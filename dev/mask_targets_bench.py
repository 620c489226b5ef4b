"""Mask R-CNN training targets: mask_rcnn.mask_targets (on the RoIs' device, from the polygons the
loader packs) against Detectron's host computation (the RoIs copied to the host, bbox_overlaps, then
pycocotools' polys_to_mask_wrt_box RoI by RoI, the masks uploaded), on fg RoIs jittered around the
objects of the coco_tiny train images with the most objects.

  python dev/mask_targets_bench.py [--device cuda] [--rois 256] [--rounds 20] [--threads N] [--coco-tiny DIR]

prints `PASS mask_targets: ...` when both give the same targets (else FAIL), then the median time of
each over interleaved rounds. tests/roi_data/test_mask_targets.py takes its reference from here.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

from detectron.roi_data.mask_rcnn import mask_targets
from detectron.roi_data.loader import to_device
from detectron.roi_data.minibatch import polygon_targets
from detectron.utils import segms as segm_utils
from detectron.utils.boxes import bbox_overlaps

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COCO_TINY = os.path.normpath(os.path.join(REPO, '..', 'shared', 'data', 'coco_tiny'))


def host_mask_targets(rois, labels, im_scales, images, resolution):
    """Detectron's add_mask_rcnn_blobs on the host: (N, M, M) int8 targets of the fg RoIs, images[b]
    the polygon lists of image b's non-crowd objects."""
    fg_rois = rois[labels > 0].float().cpu().numpy()
    scales = im_scales.float().cpu().numpy()
    masks = np.full((len(fg_rois), resolution, resolution), -1, dtype=np.int8)
    for b, polys in enumerate(images):
        rows = np.nonzero(fg_rois[:, 0] == b)[0]
        if len(rows) == 0 or not polys:
            continue
        boxes = fg_rois[rows, 1:5] / scales[b]
        best = bbox_overlaps(boxes, segm_utils.polys_to_boxes(polys)).argmax(axis=1)
        for row, box, k in zip(rows, boxes, best):
            masks[row] = segm_utils.polys_to_mask_wrt_box(polys[k], box, resolution) > 0
    return masks


def jittered_rois(rng, image_boxes, im_scales, per_object):
    """(N, 5) network-input RoIs: per_object boxes around each object box (original coordinates),
    corners moved by 10% of its size, scaled by the image's scale."""
    rois = []
    for b, boxes in enumerate(image_boxes):
        for box in np.repeat(boxes, per_object, axis=0):
            jittered = box + rng.randn(4) * np.tile(box[2:] - box[:2] + 1, 2) * 0.1
            jittered[2:] = np.maximum(jittered[2:], jittered[:2])
            rois.append(np.concatenate([[b], jittered * im_scales[b]]))
    return torch.tensor(np.array(rois), dtype=torch.float32)


def coco_tiny_images(coco_tiny, num_images):
    """The polygon lists of the non-crowd objects of the coco_tiny train images with the most of them."""
    with open(os.path.join(coco_tiny, 'annotations', 'instances_train2017.json')) as f:
        annotations = json.load(f)['annotations']
    by_image = {}
    for a in annotations:
        polygons = segm_utils.valid_polygons(a['segmentation'])
        if not a['iscrowd'] and polygons:
            by_image.setdefault(a['image_id'], []).append([np.asarray(p, np.float32) for p in polygons])
    return sorted(by_image.values(), key=len, reverse=True)[:num_images]


def coco_tiny_batch(coco_tiny, num_rois, seed=0):
    """(rois, labels, im_scales, images) of num_rois fg RoIs over two coco_tiny images."""
    images = coco_tiny_images(coco_tiny, num_images=2)
    rng = np.random.RandomState(seed)
    im_scales = torch.tensor([1.6, 0.9])
    rois = jittered_rois(rng, [segm_utils.polys_to_boxes(p) for p in images], im_scales.numpy(), per_object=4)
    rois = rois[torch.from_numpy(rng.randint(len(rois), size=num_rois))]
    labels = torch.from_numpy(rng.randint(1, 81, size=num_rois))
    return rois, labels, im_scales, images


def _ms(run, device):
    start = time.perf_counter()
    run()
    if device.type == 'cuda':
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--rois', type=int, default=256)
    parser.add_argument('--rounds', type=int, default=20)
    parser.add_argument('--threads', type=int, help='torch CPU threads (default: torch\'s)')
    parser.add_argument('--coco-tiny', default=os.environ.get('COCO_TINY', COCO_TINY))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    rois, labels, im_scales, images = coco_tiny_batch(args.coco_tiny, args.rois)
    rois, labels, im_scales = rois.to(device), labels.to(device), im_scales.to(device)
    packed = [to_device(polygon_targets(p), device) for p in images]

    def new():
        return mask_targets(rois, labels, im_scales, packed, resolution=28, cls_specific=True).masks

    def old():
        return torch.from_numpy(host_mask_targets(rois, labels, im_scales, images, 28)).to(device)

    equal = torch.equal(new(), old())
    print('{} mask_targets: {} fg RoIs of {} coco_tiny objects on {}, device targets {} the host ones'.format(
        'PASS' if equal else 'FAIL', len(rois), sum(len(p) for p in images), device, 'equal' if equal else 'DIFFER FROM'))
    times = {'host (Detectron, pycocotools)': (old, []), 'device (mask_targets)': (new, [])}
    for _ in range(args.rounds):  # interleaved
        for run, measured in times.values():
            measured.append(_ms(run, device))
    for name, (_, measured) in times.items():
        print(f'{name:30s} median {statistics.median(measured):8.2f} ms over {len(measured)} rounds')
    return 0 if equal else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
