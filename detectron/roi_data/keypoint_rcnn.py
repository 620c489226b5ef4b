"""Keypoint R-CNN training targets (Detectron's roi_data/keypoint_rcnn.py `add_keypoint_rcnn_blobs`),
built on the proposals' device from the keypoints the loader packs (minibatch.gt_targets), and, on
precomputed proposals, the validity of a minibatch (its `finalize_keypoint_minibatch`)."""
from typing import NamedTuple

import numpy as np
import torch

from detectron.datasets.proposal_files import proposal_rows
from detectron.roi_data.fast_rcnn import candidate_assignments, count_per_image, random_subset
from detectron.roi_data.loader import scale_rng
from detectron.roi_data.minibatch import drawn_scale, gt_targets
from detectron.utils.blob import resize_scale
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
    When every target has 'keypoint_priority' (with_keypoint_priority: its gt rows' then its proposals'
    draws) the RoIs are drawn by those, so that the loader's sampler can judge the minibatch beforehand
    (invalid_keypoint_minibatch); otherwise from generator.
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
    chosen = random_subset(eligible, c.image_ids, quota, generator, priority=_candidate_priority(targets, device),
                           row_keys=c.row_keys)
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


def _candidate_priority(targets, device):
    """The targets' 'keypoint_priority' in candidate order (every image's gt rows, then the proposals), or None."""
    if not all('keypoint_priority' in t for t in targets):
        return None
    gt_rows = [t['keypoint_priority'][:len(t['boxes'])] for t in targets]
    proposal_rows_ = [t['keypoint_priority'][len(t['boxes']):] for t in targets]
    return torch.cat(gt_rows + proposal_rows_).to(device=device, dtype=torch.float64)


def _num_candidates(entry):
    return int((np.asarray(entry['gt_classes']) > 0).sum()) + len(proposal_rows(entry))


def with_keypoint_priority(entry, rng, prepare):
    """prepare(entry, rng)'s training sample of a Keypoint R-CNN on precomputed proposals, its targets with
    'keypoint_priority': a uniform draw per candidate RoI (gt rows, then proposals), drawn from rng before
    prepare draws (so that invalid_keypoint_minibatch draws them again without reading the image)."""
    priority = rng.random_sample(_num_candidates(entry))
    sample = prepare(entry, rng)
    sample[-1]['keypoint_priority'] = torch.from_numpy(priority)
    return sample


# The roidb fields that decide a minibatch's keypoint RoIs.
_CHECK_KEYS = ('boxes', 'gt_classes', 'is_crowd', 'gt_keypoints', 'max_overlaps')


def visible_keypoint_count(entries, iteration, seed, scales, max_size, fg_thresh, fg_rois_per_image, heatmap_size):
    """The visible keypoints inside the keypoint RoIs the model samples for these roidb entries at this
    iteration (the weight sum of keypoint_targets: Detectron's np.sum(keypoint_weights)), from the draws
    of with_keypoint_priority and the scale the loader's sample has (loader.scale_rng, then
    minibatch.prepare_training_entry's draw)."""
    targets, rois, im_scales = [], [], []
    for i, (index, entry) in enumerate(entries):
        rng = scale_rng(seed, iteration, index)
        priority = rng.random_sample(_num_candidates(entry))
        scale = np.float32(resize_scale(entry['height'], entry['width'], drawn_scale(scales, rng), max_size))
        t = gt_targets({key: entry[key] for key in _CHECK_KEYS})
        t['keypoint_priority'] = torch.from_numpy(priority)
        targets.append(t)
        im_scales.append(scale)
        # As the model's rois: the proposals in network-input coordinates (generalized_rcnn._target_rois).
        rois.append(torch.cat((torch.full_like(t['proposals'][:, :1], i), t['proposals'] * torch.tensor(scale)), dim=1))
    kt = keypoint_targets(torch.cat(rois), torch.tensor(np.array(im_scales)), targets, fg_thresh, fg_rois_per_image,
                          heatmap_size)
    return int(kt.weights.sum())


def _fewest_visible_keypoints(entries, fg_rois_per_image):
    """A lower bound of visible_keypoint_count from the gt rows alone, without the proposals' overlaps: per image
    the visible keypoints inside the non-crowd gt rows' own boxes (each such row a keypoint RoI candidate), or
    fg_rois_per_image when fewer (more candidates than that give as many RoIs, each with a visible keypoint)."""
    total = 0
    for entry in entries:
        keypoints = np.asarray(entry['gt_keypoints'], dtype=np.float32)
        num_gt = len(keypoints)  # the gt rows lead the entry's rows
        rows = (np.asarray(entry['gt_classes'][:num_gt]) > 0) & ~np.asarray(entry['is_crowd'][:num_gt], dtype=bool)
        boxes = np.asarray(entry['boxes'], dtype=np.float32).reshape(-1, 4)[:num_gt][rows]
        x, y, v = keypoints[rows, 0], keypoints[rows, 1], keypoints[rows, 2]
        inside = (x >= boxes[:, 0:1]) & (x <= boxes[:, 2:3]) & (y >= boxes[:, 1:2]) & (y <= boxes[:, 3:4]) & (v > 0)
        total += min(int(inside.sum()), fg_rois_per_image)
    return total


def invalid_keypoint_minibatch(rank_batches, iteration, roidb, min_count, **count_args):
    """samplers.GroupedDistributedBatchSampler's check for a Keypoint R-CNN on precomputed proposals: why the
    global batch is invalid, or None. As Detectron's finalize_keypoint_minibatch judges each GPU's minibatch,
    each rank's part is invalid unless its keypoint RoIs hold more than min_count
    [KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH] visible keypoints (count_args: visible_keypoint_count's).
    A part whose gt rows alone guarantee more is not counted: every rank judges every part at each step (and, from
    a checkpoint without the sampler's stored position, again for the steps before a resume)."""
    for batch in rank_batches:
        entries = [roidb[i] for i in batch]
        if _fewest_visible_keypoints(entries, count_args['fg_rois_per_image']) > min_count:
            continue
        count = visible_keypoint_count(list(zip(batch, entries)), iteration, **count_args)
        if count <= min_count:
            return ('the keypoint RoIs of {} hold {} visible keypoints, not more than '
                    'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH {}'.format(
                        ', '.join(str(roidb[i]['image']) for i in batch), count, min_count))
    return None
