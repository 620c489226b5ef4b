"""Mask R-CNN training targets (Detectron's roi_data/mask_rcnn.py `add_mask_rcnn_blobs`), built on
the RoIs' device from the polygons the loader packs (minibatch.gt_targets)."""
import functools
from dataclasses import dataclass

import torch

from detectron.utils import segms as segm_utils
from detectron.utils.boxes import box_iou_t


@dataclass
class MaskTargets:
    """rois (N, 5) network-input RoIs the mask head sees; classes (N,) int64 the logit channel of
    each; masks (N, M, M) int8 in {-1 (ignored), 0, 1}; rows (N,) int64 their positions among the
    sampled RoIs (Detectron's roi_has_mask, which the C4 head slices the box head's res5 map with)."""
    rois: torch.Tensor
    classes: torch.Tensor
    masks: torch.Tensor
    rows: torch.Tensor


def mask_targets(rois, labels, im_scales, gt_polygons, resolution, cls_specific, max_rows=None):
    """Targets of the foreground RoIs (labels > 0) of a sampled R-CNN batch.

    rois (R, 5) (batch index, box) in network-input coordinates; labels (R,); im_scales (B,);
    gt_polygons per image: a dict with the image's non-crowd objects' 'segm_boxes' (G, 4) (their
    polygons' tight boxes, segms.polys_to_boxes), 'segm_edges', 'segm_polygon_edges' and
    'segm_object_polygons' (their polygons, segms.packed_polygons), on the RoIs' device. As Detectron,
    per image: each fg RoI (in original coordinates, RoI / im_scale) takes the non-crowd object whose
    polygons' tight box overlaps it most (bbox_overlaps, first maximum) and its polygons rasterised in
    the RoI at resolution x resolution (polys_to_mask_wrt_box, > 0); a fg RoI of an image without such
    objects gets an all -1 (ignored) target. The logit channel is the RoI's class with cls_specific
    [MRCNN.CLS_SPECIFIC_MASK], else 0. A batch without fg RoIs gets its first RoI with class 0 and an
    all -1 target, so the head still runs (Detectron's per-image rule; the loss is the same).

    max_rows (the fixed-size sampling's bound on its fg RoIs, images x fg_rois_per_image): the targets
    have max_rows rows whatever the number of fg RoIs, the fg RoIs' first and the rest all -1 (ignored,
    on the first RoI), and nothing waits for the device: the polygons are laid out in slots of the
    batch's most edges and polygons of one object (the host counts 'segm_most_edges' and
    'segm_most_polygons' of minibatch.polygon_targets). The same targets for the fg RoIs, bit for bit.
    """
    device = rois.device
    objects = _Objects(gt_polygons, device)
    image = rois[:, 0].long()
    boxes = rois[:, 1:5].float() / im_scales.float()[image].unsqueeze(1)
    own = objects.image.unsqueeze(0) == image.unsqueeze(1)
    best = torch.where(own, box_iou_t(boxes, objects.boxes), -1.0).argmax(dim=1)
    fg = labels > 0
    drawn = fg & own.any(dim=1)
    if max_rows is None:
        rows, drawn, masks = _compact_masks(boxes, best, fg, drawn, objects, resolution)
    else:
        rows, drawn, masks = _fixed_size_masks(boxes, best, fg, drawn, objects, resolution,
                                               min(max_rows, len(labels)), _slots(gt_polygons))
    masks = torch.where(drawn[:, None, None], masks.to(torch.int8), -1)
    classes = labels[rows] if cls_specific else torch.zeros_like(rows)
    return MaskTargets(rois[rows], classes.long(), masks, rows)


def _compact_masks(boxes, best, fg, drawn, objects, resolution):
    """mask_targets' rows (the fg RoIs, else the first RoI), whether each is drawn, and its (M, M) mask:
    each RoI's object's polygons and edges listed exactly, sized by one host sync."""
    device = boxes.device
    num_polygons = torch.where(drawn, objects.polygons[best], 0)
    num_edges = torch.where(drawn, objects.edges[best], 0)
    # The one host sync: the sizes of the mask head's batch and of the rasterisation. Little work is
    # queued before it: the proposals and the sampling.
    num_fg, total_polygons, total_edges = torch.stack((fg.sum(), num_polygons.sum(), num_edges.sum())).tolist()
    if num_fg == 0:  # the first RoI, not drawn: its class is 0 (no RoI is fg) and its target all -1
        first = torch.zeros(1, dtype=torch.int64, device=device)
        return first, first.bool(), torch.zeros(1, resolution, resolution, dtype=torch.bool, device=device)
    rows = _true_rows(fg, num_fg)
    best, num_polygons = best[rows], num_polygons[rows]
    # Each fg RoI's object's polygons, then their edges, listed one after the other.
    polygon_mask, rank = segm_utils.expand_counts(num_polygons, total_polygons)
    polygon = objects.first_polygon[best][polygon_mask] + rank
    edge_polygon, rank = segm_utils.expand_counts(objects.polygon_edges[polygon], total_edges)
    edges = objects.all_edges[objects.first_edge[polygon][edge_polygon] + rank]
    return rows, drawn[rows], segm_utils.polys_to_masks_wrt_boxes(edges, edge_polygon, polygon_mask, boxes[rows],
                                                                  resolution)


def _slots(gt_polygons):
    """(edge slots, polygon slots) per RoI of the fixed-size targets: the most of one object in the batch."""
    return (max([1] + [p['segm_most_edges'] for p in gt_polygons]),
            max([1] + [p['segm_most_polygons'] for p in gt_polygons]))


def _fixed_size_masks(boxes, best, fg, drawn, objects, resolution, num_rows, slots):
    """mask_targets' max_rows layout of _compact_masks: num_rows rows (the fg RoIs, then row 0, not drawn),
    each RoI's object's edges in edge_slots slots (an object's edges are consecutive, polygon after polygon)
    and its polygons in polygon_slots; the unused slots are drawn as one extra polygon in an extra box,
    which is dropped. No host sync."""
    device = boxes.device
    edge_slots, polygon_slots = slots
    rows = _true_rows(fg, num_rows)
    drawn = drawn[rows] & (torch.arange(num_rows, device=device) < fg.sum())
    best = best[rows]
    slot = torch.arange(edge_slots, device=device)
    used = drawn.unsqueeze(1) & (slot < objects.edges[best].unsqueeze(1))
    edge = torch.where(used, objects.first_object_edge[best].unsqueeze(1) + slot, len(objects.all_edges) - 1)
    polygon = objects.edge_polygon[edge] - objects.first_polygon[best].unsqueeze(1)
    extra = num_rows * polygon_slots
    polygon = torch.where(used, torch.arange(num_rows, device=device).unsqueeze(1) * polygon_slots + polygon, extra)
    polygon_box = torch.arange(extra + 1, device=device) // polygon_slots  # the extra polygon: box num_rows
    masks = segm_utils.polys_to_masks_wrt_boxes(
        objects.all_edges[edge.flatten()], polygon.flatten(), polygon_box,
        torch.cat((boxes[rows], boxes.new_zeros(1, 4))), resolution)[:num_rows]
    return rows, drawn, masks


class _Objects:
    """The batch's objects, image after image, then one without polygons in no image (index -1), so
    that every RoI has a best object: boxes (G, 4), image (G,), polygons / edges (G,) their polygon
    and edge counts, first_polygon (G,) and first_object_edge (G,); all_edges (E + 1, 4), the last a
    zero edge of no polygon, edge_polygon (E + 1,) the polygon of each edge, and per polygon polygon_edges
    (P,) its edge count and first_edge (P,)."""

    def __init__(self, gt_polygons, device):
        none = torch.zeros(1, dtype=torch.int64, device=device)
        self.boxes = torch.cat([p['segm_boxes'] for p in gt_polygons] + [torch.zeros(1, 4, device=device)])
        self.image = torch.cat([torch.full((len(p['segm_boxes']),), i, dtype=torch.int64, device=device)
                                for i, p in enumerate(gt_polygons)] + [none - 1])
        self.all_edges = torch.cat([p['segm_edges'] for p in gt_polygons] + [torch.zeros(1, 4, device=device)])
        self.polygon_edges = torch.cat([p['segm_polygon_edges'] for p in gt_polygons])
        self.polygons = torch.cat([p['segm_object_polygons'] for p in gt_polygons] + [none])
        self.first_edge = _starts(self.polygon_edges)
        self.first_polygon = _starts(self.polygons)
        # An object's edges run from its first polygon's first edge to the next object's.
        edge_bounds = torch.cat((self.first_edge, self.polygon_edges.sum(0, keepdim=True)))
        self.first_object_edge = edge_bounds[self.first_polygon]
        self.edges = edge_bounds[self.first_polygon + self.polygons] - self.first_object_edge

    @functools.cached_property
    def edge_polygon(self):  # read by the fixed-size layout only
        device = self.polygon_edges.device
        return torch.cat((torch.repeat_interleave(torch.arange(len(self.polygon_edges), device=device),
                                                  self.polygon_edges, output_size=len(self.all_edges) - 1),
                          torch.zeros(1, dtype=torch.int64, device=device)))


def _starts(counts):
    return counts.cumsum(0) - counts


def _true_rows(mask, count):
    """torch.nonzero(mask) given its length `count`, without a host sync: the positions of the True
    entries in order."""
    slot = torch.where(mask, mask.cumsum(0) - 1, count)  # False entries all go to the dropped slot
    rows = torch.zeros(count + 1, dtype=torch.int64, device=mask.device)
    return rows.scatter_(0, slot, torch.arange(len(mask), device=mask.device))[:count]
