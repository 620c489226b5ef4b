"""CenterNet (ctdet) training losses: CenterNet's models/losses.py and trains/ctdet.py (the heat map
focal loss, ops/focal_loss.py, and the L1 losses of sizes and offsets)."""

import torch
import torch.nn.functional as F

from detectron.modeling.centernet_decode import transpose_and_gather_feat
from detectron.ops.focal_loss import heatmap_focal_loss


def reg_l1_loss(output, mask, ind, target):
    """CenterNet's RegL1Loss: L1 between output (B, C, H, W) read at ind (B, M) and target
    (B, M, C), over the slots with mask (B, M) set; divided by (mask expanded to (B, M, C)).sum()
    + 1e-4, i.e. by C times the number of objects."""
    pred = transpose_and_gather_feat(output, ind)
    mask = mask.unsqueeze(2).expand_as(pred).float()
    return F.l1_loss(pred * mask, target * mask, reduction='sum') / (mask.sum() + 1e-4)


def reg_weighted_l1_loss(output, mask, ind, target):
    """CenterNet's RegWeightedL1Loss (--cat_spec_wh): as reg_l1_loss with a per-channel mask
    (B, M, C) used as given."""
    pred = transpose_and_gather_feat(output, ind)
    mask = mask.float()
    return F.l1_loss(pred * mask, target * mask, reduction='sum') / (mask.sum() + 1e-4)


def ctdet_loss(outputs, batch, hm_weight=1, wh_weight=0.1, off_weight=1, reg_offset=True,
               cat_spec_wh=False):
    """CenterNet's CtdetLoss for one (per-GPU) batch.

    outputs: the heads' raw outputs {'hm' (logits), 'wh', 'reg'}; batch: targets as tensors
    {'hm', 'reg_mask', 'ind', 'wh' (or 'cat_spec_wh' / 'cat_spec_mask'), 'reg'}.
    Returns {'loss': hm_weight * hm_loss + wh_weight * wh_loss + off_weight * off_loss, 'hm_loss',
    'wh_loss', 'off_loss'}; a term whose weight is 0 (or off_loss without reg_offset) is not
    computed and reported as a zero tensor (the reference reports the int 0). Only 'loss' starts
    with 'loss'; the other entries are for logging.
    """
    hm = outputs['hm']
    zero = hm.new_zeros((), dtype=torch.float32)
    hm_loss = heatmap_focal_loss(hm, batch['hm'])
    wh_loss, off_loss = zero, zero
    if wh_weight > 0:
        if cat_spec_wh:
            wh_loss = reg_weighted_l1_loss(outputs['wh'], batch['cat_spec_mask'], batch['ind'],
                                           batch['cat_spec_wh'])
        else:
            wh_loss = reg_l1_loss(outputs['wh'], batch['reg_mask'], batch['ind'], batch['wh'])
    if reg_offset and off_weight > 0:
        off_loss = reg_l1_loss(outputs['reg'], batch['reg_mask'], batch['ind'], batch['reg'])
    loss = hm_weight * hm_loss + wh_weight * wh_loss + off_weight * off_loss
    return {'loss': loss, 'hm_loss': hm_loss, 'wh_loss': wh_loss, 'off_loss': off_loss}
