"""COCO segmentations (Detectron's utils/segms.py): a segm is a list of polygons (flat [x0, y0, x1,
y1, ...] lists) or, for crowd regions, an RLE dict."""
import numpy as np
import pycocotools.mask as mask_util
import torch


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


def packed_polygons(polys):
    """N objects' polygon lists as tensors: edges (E, 4) float32, every polygon's edges (x_start,
    y_start, x_end, y_end) in vertex order, closed by the edge back to its first vertex, polygon by
    polygon and object by object; polygon_edges (P,) int64, the edge count of each polygon;
    object_polygons (N,) int64, the polygon count of each object."""
    vertices = [np.asarray(p, dtype=np.float32).reshape(-1, 2) for poly in polys for p in poly]
    edges = np.zeros((sum(len(v) for v in vertices), 4), dtype=np.float32)
    if vertices:
        edges[:, :2] = np.concatenate(vertices)
        edges[:, 2:] = np.concatenate([np.roll(v, -1, axis=0) for v in vertices])
    return (torch.from_numpy(edges), torch.tensor([len(v) for v in vertices], dtype=torch.int64),
            torch.tensor([len(poly) for poly in polys], dtype=torch.int64))


def expand_counts(counts, total):
    """For `total` (= counts.sum(), passed to spare a host sync) items in consecutive groups of
    counts[i] items: (group of each item, its rank in the group), both (total,) int64."""
    group = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts, output_size=total)
    rank = torch.arange(total, device=counts.device) - (counts.cumsum(0) - counts)[group]
    return group, rank


# pycocotools' rleFrPoly walks the polygon at 5 times the mask's resolution.
_UPSAMPLE = 5


def polys_to_masks_wrt_boxes(edges, edge_polygon, polygon_mask, boxes, M):
    """polys_to_mask_wrt_box for R boxes at once, on their device, bit for bit: edges (N, 4) the
    polygon edges (as packed_polygons gives them) to draw, edge_polygon (N,) the polygon (0..Q-1) of
    each, polygon_mask (Q,) the box (0..R-1) each polygon is drawn in, boxes (R, 4) float32 ->
    (R, M, M) bool, the union of each box's polygons.

    The steps of pycocotools' rleFrPoly (maskApi.c): each vertex is mapped into its box in float32 as
    polys_to_mask_wrt_box does, then upsampled to the integer (int)(5 x + .5) (C's int conversion
    truncates towards zero). rleFrPoly draws each edge as the integer points of a line from its
    endpoint of smaller x (smaller y when the edge is steep), one point per step of the longer axis,
    the other coordinate (int)(start + slope * t + .5) in double. Mask column X gets a boundary point
    where that walk steps between upsampled x 5X + 2 and 5X + 3, at row ceil(clamp((v + .5) / 5 - .5,
    0, M)), v the smaller upsampled y of the step; a pixel is inside when an odd number of its
    polygon's boundary points lie at or before it in column-major order. Steps between two edges
    never count: edges share their endpoints except where an upsampled x is negative. Every edge is
    tested against the M columns, so the cost does not depend on the edge's length.
    """
    device = edges.device
    box = boxes[polygon_mask[edge_polygon]]
    x1, y1 = box[:, 0], box[:, 1]
    w = torch.clamp(box[:, 2] - x1, min=1)
    h = torch.clamp(box[:, 3] - y1, min=1)
    xs, xe = (_upsampled((edges[:, k] - x1) * M / w) for k in (0, 2))
    ys, ye = (_upsampled((edges[:, k] - y1) * M / h) for k in (1, 3))
    steep = (xe - xs).abs() < (ye - ys).abs()
    flip = torch.where(steep, ys > ye, xs > xe)
    xs, xe = torch.where(flip, xe, xs), torch.where(flip, xs, xe)
    ys, ye = torch.where(flip, ye, ys), torch.where(flip, ys, ye)
    # Along the longer axis a runs from a0 to a1; the other coordinate b starts at b0 with slope s.
    a0, a1 = torch.where(steep, ys, xs), torch.where(steep, ye, xe)
    b0, b1 = torch.where(steep, xs, ys), torch.where(steep, xe, ye)
    length = a1 - a0
    slope = (b1 - b0) / torch.clamp(length, min=1)

    def walk(t):  # the walk's other coordinate at step t, as rleFrPoly computes it
        return torch.trunc(b0 + slope * t + .5)

    # (M, N) from here: the columns outermost keep the inner loops long and contiguous.
    column = torch.arange(M, device=device, dtype=torch.float64).view(M, 1)
    low = _UPSAMPLE * column + 2  # column X's step: upsampled x from 5X + 2 to 5X + 3
    # Flat edges: x = a0 + t steps at t = low - a0 -> t + 1; the row comes from the smaller walk value.
    # Steep edges: x = walk(t) is monotonic; the first t at or past the step (the closed form is
    # within one of it) is settled by the exact expression at the three steps around the estimate.
    flat_t = low - a0
    estimate = torch.ceil((low + .5 - b0) / torch.where(slope == 0, 1.0, slope))
    first = torch.where(steep, estimate - 1, flat_t)
    walked = [walk(first + k) for k in range(3)]
    rising = slope > 0
    t1 = estimate - 1
    for value in walked:
        t1 = t1 + ((value >= low + 1) != rising).to(t1.dtype)
    v = torch.where(steep, a0 + t1 - 1, torch.minimum(walked[0], walked[1]))
    hit = torch.where(steep, (slope != 0) & (t1 >= 1) & (t1 <= length), (flat_t >= 0) & (flat_t + 1 <= length))
    row = torch.ceil(torch.clamp((v + .5) / _UPSAMPLE - .5, 0, M)).long()
    bins = M * M + 1  # the last: past the last pixel
    index = edge_polygon * bins + column.long() * M + row

    counts = torch.zeros(len(polygon_mask) * bins, dtype=torch.int32, device=device)
    counts.index_add_(0, index.flatten(), hit.flatten().to(torch.int32))
    inside = (counts.view(-1, bins).cumsum(1)[:, :M * M] % 2).to(torch.int32)
    drawn = torch.zeros(len(boxes), M * M, dtype=torch.int32, device=device).index_add_(0, polygon_mask, inside)
    # Column-major pixel index x * M + y -> (y, x).
    return (drawn > 0).view(len(boxes), M, M).transpose(1, 2)


def _upsampled(coordinate):
    return torch.trunc(coordinate.double() * _UPSAMPLE + .5)
