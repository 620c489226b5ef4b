"""Keypoint R-CNN training targets (Detectron's roi_data/keypoint_rcnn.py `add_keypoint_rcnn_blobs`),
built on the proposals' device from the keypoints the loader packs (minibatch.gt_targets)."""
from typing import NamedTuple

import torch

from detectron.roi_data.fast_rcnn import candidate_assignments, count_per_image, random_subset
from detectron.utils.keypoints import keypoints_to_heatmap_labels


class KeypointTargets(NamedTuple):
    rois: torch.Tensor     # (N, 5) batch index, box in network-input coordinates
    labels: torch.Tensor   # (N, K) int64 linear heatmap positions (keypoint_locations_int32)
    weights: torch.Tensor  # (N, K) float32, 1 for a visible keypoint inside its RoI (keypoint_weights)


def keypoint_targets(proposals, im_scales, targets, fg_thresh, fg_rois_per_image, heatmap_size, proposal_valid=None,
                     generator=None, candidates=None):
    """The keypoint RoIs of a batch and their heatmap targets, as Detectron samples them per image.

    proposals (R, 5) and im_scales (B,) as fast_rcnn.sample_rois; targets: per image a dict with the
    gt rows' 'boxes' (G, 4), 'classes', 'is_crowd' and 'keypoints' (G, 3, K) float32 (x, y, v) in
    original coordinates. The candidates are the gt rows and the proposals (proposal_valid: the real
    rows of fixed-size proposals); each takes the gt it overlaps most, crowd included (a gt row its own:
    Detectron's box_to_gt_ind_map). A candidate is keypoint-fg when its max overlap is >= fg_thresh
    [TRAIN.FG_THRESH] and one of that gt's visible keypoints lies inside it (edges included); per
    image up to fg_rois_per_image [round(TRAIN.FG_FRACTION x TRAIN.BATCH_SIZE_PER_IM)] of them are drawn
    uniformly without replacement, independently of the box head's fg RoIs, as Detectron does. Their
    heatmap labels are keypoints_to_heatmap_labels of the gt keypoints in the RoI (original
    coordinates). The RoIs come in candidate order (gt rows of every image, then the proposals).
    A batch without keypoint-fg candidate gets its first candidate with zero weights, so the head runs.
    candidates: fast_rcnn.candidate_assignments of the same batch when the caller has them already.
    """
    gt_boxes = [t['boxes'] for t in targets]
    c = candidates
    if c is None:
        c = candidate_assignments(proposals, im_scales, gt_boxes, [t['classes'] for t in targets],
                                  [t['is_crowd'] for t in targets])
    device = c.boxes.device
    num_images, num_gt = c.present.shape
    keypoints = _padded_keypoints(targets, num_gt, device)
    best = c.overlaps.masked_fill(~c.present[c.image_ids], -1.0).argmax(dim=1)
    num_gt_rows = int(sum(len(b) for b in gt_boxes))
    own = torch.cat([torch.arange(len(b), device=device) for b in gt_boxes]
                    + [torch.zeros(len(c.boxes) - num_gt_rows, dtype=torch.int64, device=device)])
    best = torch.where(c.is_gt_row, own, best)
    kps = keypoints[c.image_ids, best]  # (M, 3, K)
    boxes = c.boxes
    inside = ((kps[:, 0] >= boxes[:, 0:1]) & (kps[:, 0] <= boxes[:, 2:3])
              & (kps[:, 1] >= boxes[:, 1:2]) & (kps[:, 1] <= boxes[:, 3:4]) & (kps[:, 2] > 0))
    eligible = (c.max_overlap >= fg_thresh) & inside.any(dim=1)
    if proposal_valid is not None:
        eligible[num_gt_rows:] &= proposal_valid
    quota = count_per_image(eligible, c.image_ids, num_images).clamp(max=int(fg_rois_per_image))
    chosen = random_subset(eligible, c.image_ids, quota, generator)
    rows = chosen.nonzero().squeeze(1)  # the one host sync: the size of the keypoint head's batch
    empty = len(rows) == 0
    if empty:
        rows = torch.zeros(1, dtype=torch.int64, device=device)
    labels, weights = keypoints_to_heatmap_labels(kps[rows], boxes[rows], heatmap_size)
    if empty:
        weights = torch.zeros_like(weights)
    image = c.image_ids[rows]
    rois = torch.cat((image.unsqueeze(1).to(boxes.dtype), boxes[rows] * im_scales[image].unsqueeze(1).to(boxes.dtype)),
                     dim=1)
    return KeypointTargets(rois, labels, weights)


def _padded_keypoints(targets, num_gt, device):
    """(B, G, 3, K) the images' gt keypoints padded with zeros (visibility 0) to num_gt columns."""
    num_keypoints = max(t['keypoints'].shape[-1] for t in targets)
    padded = torch.zeros(len(targets), num_gt, 3, num_keypoints, device=device)
    for i, t in enumerate(targets):
        padded[i, :len(t['keypoints'])] = t['keypoints'].to(device=device, dtype=padded.dtype)
    return padded
