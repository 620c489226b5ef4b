"""COCO segmentations (Detectron's utils/segms.py): a segm is a list of polygons (flat [x0, y0, x1,
y1, ...] lists) or, for crowd regions, an RLE dict."""
import numpy as np
import pycocotools.mask as mask_util


def is_poly(segm):
    """Whether a segm is in polygon format (a list) rather than RLE (a dict)."""
    return isinstance(segm, list)


def valid_polygons(segm):
    """Detectron's json_dataset filter: polygons of fewer than 3 points are dropped; RLE unchanged."""
    return [p for p in segm if len(p) >= 6] if is_poly(segm) else segm


def flip_segms(segms, height, width):
    """Left/right flip of each segm: polygon x -> width - x - 1; an RLE is decoded, flipped and
    re-encoded (Detectron's flip_segms)."""
    flipped = []
    for segm in segms:
        if is_poly(segm):
            flipped.append([_flip_poly(p, width) for p in segm])
        else:
            rle = mask_util.frPyObjects([segm], height, width) if isinstance(segm['counts'], list) else [segm]
            mask = mask_util.decode(rle)[:, ::-1, :]
            flipped.append(mask_util.encode(np.asfortranarray(mask))[0])
    return flipped


def _flip_poly(poly, width):
    flipped = np.array(poly)
    flipped[0::2] = width - flipped[0::2] - 1
    return flipped.tolist()


def polys_to_mask_wrt_box(polygons, box, M):
    """The polygons of one object rasterised into an M x M float32 {0, 1} mask of the box (x1, y1,
    x2, y2): coordinates mapped by (x - x1) * M / max(x2 - x1, 1) (y likewise), then pycocotools'
    frPyObjects / decode, the union of the polygons (Detectron's polys_to_mask_wrt_box)."""
    w = np.maximum(box[2] - box[0], 1)
    h = np.maximum(box[3] - box[1], 1)
    normalised = []
    for poly in polygons:
        p = np.array(poly, dtype=np.float32)
        p[0::2] = (p[0::2] - box[0]) * M / w
        p[1::2] = (p[1::2] - box[1]) * M / h
        normalised.append(p)
    rle = mask_util.frPyObjects(normalised, M, M)
    mask = np.sum(np.array(mask_util.decode(rle), dtype=np.float32), axis=2)
    return np.array(mask > 0, dtype=np.float32)


def polys_to_boxes(polys):
    """(N, 4) float32 tight boxes (x0, y0, x1, y1) of N objects, each a list of polygons."""
    boxes = np.zeros((len(polys), 4), dtype=np.float32)
    for i, poly in enumerate(polys):
        boxes[i] = [min(np.min(p[0::2]) for p in poly), min(np.min(p[1::2]) for p in poly),
                    max(np.max(p[0::2]) for p in poly), max(np.max(p[1::2]) for p in poly)]
    return boxes
