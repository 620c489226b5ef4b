"""Detectron's proposal recall (json_dataset_evaluator.evaluate_box_proposals) and its reading of a
proposal file (_add_proposals_from_file), re-written here in plain numpy from the COCO json, to check the
port against."""
import numpy as np


def iou_plus_one(a, b):
    """(N, M) IoU of boxes with Detectron's inclusive +1 sides."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    area_a = (a[:, 2] - a[:, 0] + 1) * (a[:, 3] - a[:, 1] + 1)
    area_b = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]) + 1
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]) + 1
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    return np.where(inter > 0, inter / (area_a[:, None] + area_b[None, :] - inter), 0.0)


def file_proposals(boxes, height, width, min_size=2, limit=-1):
    """One image's proposals as Detectron reads them: clipped, the first of duplicates kept, sides
    (+1) above min_size, the first `limit`."""
    boxes = np.array(boxes, np.float32).reshape(-1, 4)
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, width - 1)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, height - 1)
    seen, keep = set(), []
    for i, box in enumerate(boxes):
        key = tuple(np.round(box).tolist())
        if key not in seen:
            seen.add(key)
            keep.append(i)
    boxes = boxes[keep]
    sides = boxes[:, 2:] - boxes[:, :2] + 1
    boxes = boxes[(sides[:, 0] > min_size) & (sides[:, 1] > min_size)]
    return boxes[:limit] if limit > 0 else boxes


def gt_of_image(coco, image):
    """(boxes xyxy clipped, areas, crowd flags, category ids) of an image's annotations."""
    anns = coco.loadAnns(coco.getAnnIds(imgIds=image['id'], iscrowd=None))
    boxes = np.array([[a['bbox'][0], a['bbox'][1], a['bbox'][0] + max(0, a['bbox'][2] - 1),
                       a['bbox'][1] + max(0, a['bbox'][3] - 1)] for a in anns], np.float64).reshape(-1, 4)
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, image['width'] - 1)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, image['height'] - 1)
    return (boxes, np.array([a['area'] for a in anns], np.float64), np.array([bool(a['iscrowd']) for a in anns]),
            [a['category_id'] for a in anns])


def detectron_proposal_ar(dataset, proposals, limit, area):
    """Class-agnostic AR of a proposal file's content on a JsonDataset (its .COCO), area (low, high)."""
    coco = dataset.COCO
    by_id = dict(zip(proposals['ids'], proposals['boxes']))
    covered, num_pos = [], 0
    for image_id in sorted(coco.getImgIds()):
        image = coco.imgs[image_id]
        boxes, areas, crowd, _ = gt_of_image(coco, image)
        gt = boxes[~crowd & (areas >= area[0]) & (areas <= area[1])]
        num_pos += len(gt)
        props = file_proposals(by_id[image_id], image['height'], image['width'])[:limit]
        if not len(props):
            continue
        overlaps = iou_plus_one(props, gt)
        found = np.zeros(len(gt))
        for j in range(min(overlaps.shape)):
            g = overlaps.max(axis=0).argmax()
            p = overlaps[:, g].argmax()
            found[j] = overlaps[p, g]
            overlaps[p, :] = -1
            overlaps[:, g] = -1
        covered.append(found)
    covered = np.concatenate(covered) if covered else np.zeros(0)
    return float(np.mean([(covered >= t).sum() / num_pos for t in np.arange(0.5, 0.95 + 1e-5, 0.05)]))
