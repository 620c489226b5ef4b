"""Mask R-CNN training targets (Detectron's roi_data/mask_rcnn.py `add_mask_rcnn_blobs`), built on
the RoIs' device from the polygons the loader packs (minibatch.gt_targets)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectron.utils import segms as segm_utils
from detectron.utils.boxes import box_iou_t


@dataclass
class MaskTargets:
    """rois (N, 5) network-input RoIs the mask head sees; classes (N,) int64 the logit channel of
    each; masks (N, M, M) int8 in {-1 (ignored), 0, 1}."""
    rois: torch.Tensor
    classes: torch.Tensor
    masks: torch.Tensor


def mask_targets(rois, labels, im_scales, gt_polygons, resolution, cls_specific):
    """Targets of the foreground RoIs (labels > 0) of a sampled R-CNN batch.

    rois (R, 5) (batch index, box) in network-input coordinates; labels (R,); im_scales (B,);
    gt_polygons per image: a dict with the image's non-crowd objects' 'segm_boxes' (G, 4) (their
    polygons' tight boxes, segms.polys_to_boxes), 'segm_edges' and 'segm_polygon_edges' (their
    polygons, segms.packed_polygons), on the RoIs' device. As Detectron, per image: each fg RoI (in
    original coordinates, RoI / im_scale) takes the non-crowd object whose polygons' tight box
    overlaps it most (bbox_overlaps, first maximum) and its polygons rasterised in the RoI at
    resolution x resolution (polys_to_mask_wrt_box, > 0); a fg RoI of an image without such objects
    gets an all -1 (ignored) target. The logit channel is the RoI's class with cls_specific
    [MRCNN.CLS_SPECIFIC_MASK], else 0. A batch without fg RoIs gets its first RoI with class 0 and
    an all -1 target, so the head still runs (Detectron's per-image rule; the loss is the same).
    """
    device = rois.device
    # The one host sync: the mask head's batch size. sample_rois has just synced on its own
    # selection, so the queue it waits for is short when called right after the sampler.
    fg = torch.nonzero(labels > 0).squeeze(1)
    if len(fg) == 0:
        masks = torch.full((1, resolution, resolution), -1, dtype=torch.int8, device=device)
        return MaskTargets(rois[:1], torch.zeros(1, dtype=torch.int64, device=device), masks)
    fg_rois = rois[fg].float()
    image = fg_rois[:, 0].long()
    boxes = fg_rois[:, 1:5] / im_scales.float()[image].unsqueeze(1)
    objects = _batch_objects(gt_polygons, device)
    if objects is None:
        masks = torch.full((len(fg), resolution, resolution), -1, dtype=torch.int8, device=device)
    else:
        object_boxes, edges, polygon_edges, object_image = objects
        own = object_image.unsqueeze(0) == image.unsqueeze(1)
        best = torch.where(own, box_iou_t(boxes, object_boxes), -1.0).argmax(dim=1)
        drawn = segm_utils.polys_to_masks_wrt_boxes(edges[best], polygon_edges[best], boxes, resolution)
        masks = torch.where(own.any(dim=1)[:, None, None], drawn.to(torch.int8), -1)
    classes = labels[fg] if cls_specific else torch.zeros_like(fg)
    return MaskTargets(rois[fg], classes.long(), masks)


def _batch_objects(gt_polygons, device):
    """The images' objects stacked, their edges and polygons padded to the batch's largest:
    (boxes (G, 4), edges (G, E, 4), polygon_edges (G, P), image index (G,)); None without objects."""
    if sum(len(p['segm_boxes']) for p in gt_polygons) == 0:
        return None
    num_edges = max(p['segm_edges'].shape[1] for p in gt_polygons)
    num_polygons = max(p['segm_polygon_edges'].shape[1] for p in gt_polygons)
    boxes = torch.cat([p['segm_boxes'] for p in gt_polygons])
    edges = torch.cat([F.pad(p['segm_edges'], (0, 0, 0, num_edges - p['segm_edges'].shape[1]))
                       for p in gt_polygons])
    polygon_edges = torch.cat([F.pad(p['segm_polygon_edges'], (0, num_polygons - p['segm_polygon_edges'].shape[1]))
                               for p in gt_polygons])
    image = torch.cat([torch.full((len(p['segm_boxes']),), i, dtype=torch.int64, device=device)
                       for i, p in enumerate(gt_polygons)])
    return boxes, edges, polygon_edges, image
