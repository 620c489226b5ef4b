"""Mask R-CNN training targets (Detectron's roi_data/mask_rcnn.py `add_mask_rcnn_blobs`)."""
from dataclasses import dataclass

import numpy as np
import torch

from detectron.utils import segms as segm_utils
from detectron.utils.boxes import bbox_overlaps


@dataclass
class MaskTargets:
    """rois (N, 5) network-input RoIs the mask head sees; classes (N,) int64 the logit channel of
    each; masks (N, M, M) int8 in {-1 (ignored), 0, 1}."""
    rois: torch.Tensor
    classes: torch.Tensor
    masks: torch.Tensor


def mask_targets(rois, labels, im_scales, gt_segms, gt_is_crowd, resolution, cls_specific):
    """Targets of the foreground RoIs (labels > 0) of a sampled R-CNN batch.

    rois (R, 5) (batch index, box) in network-input coordinates; labels (R,); im_scales (B,);
    gt_segms / gt_is_crowd per image: the gt objects' polygon lists (crowd entries unused) and
    crowd flags. As Detectron, per image: each fg RoI (in original coordinates, RoI / im_scale) takes
    the non-crowd object whose polygons' tight box overlaps it most (bbox_overlaps, first maximum)
    and its polygons rasterised in the RoI at resolution x resolution (polys_to_mask_wrt_box, > 0).
    The logit channel is the RoI's class with cls_specific [MRCNN.CLS_SPECIFIC_MASK], else 0.
    A batch without fg RoIs gets its first RoI with class 0 and an all -1 (ignored) target, so the
    head still runs (Detectron's per-image rule; the loss is the same).
    """
    device = rois.device
    fg = torch.nonzero(labels > 0).squeeze(1)
    if len(fg) == 0:
        masks = torch.full((1, resolution, resolution), -1, dtype=torch.int8)
        return MaskTargets(rois[:1], torch.zeros(1, dtype=torch.int64, device=device), masks.to(device))
    fg_rois = rois[fg].float().cpu().numpy()
    scales = im_scales.float().cpu().numpy()
    masks = np.full((len(fg), resolution, resolution), -1, dtype=np.int8)
    for b, (segms, crowd) in enumerate(zip(gt_segms, gt_is_crowd)):
        rows = np.nonzero(fg_rois[:, 0] == b)[0]
        polys = [s for s, c in zip(segms, crowd.tolist()) if not c]
        if len(rows) == 0 or not polys:
            continue
        boxes = fg_rois[rows, 1:5] / scales[b]
        best = bbox_overlaps(boxes, segm_utils.polys_to_boxes(polys)).argmax(axis=1)
        for row, box, k in zip(rows, boxes, best):
            masks[row] = segm_utils.polys_to_mask_wrt_box(polys[k], box, resolution) > 0
    classes = labels[fg] if cls_specific else torch.zeros_like(fg)
    return MaskTargets(rois[fg], classes.long(), torch.from_numpy(masks).to(device, non_blocking=True))
