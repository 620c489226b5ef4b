"""Fast R-CNN RoI sampling against a numpy transcription of what Detectron's training-time
CollectAndDistributeFpnRpnProposals does: json_dataset.add_proposals (crowd_thresh=0:
_merge_proposal_boxes_into_roidb, _add_class_assignments), roidb.compute_bbox_regression_targets
and roi_data/fast_rcnn.py _sample_rois / _expand_bbox_targets.

With a batch larger than every candidate set, Detectron's sampling keeps all fg and bg RoIs, so
the result is compared exactly; the random sampling is checked by its invariants.
"""
import numpy as np
import pytest
import torch

from detectron.roi_data.fast_rcnn import keyed_uniform, random_subset, sample_rois, sample_rois_of_padded_gt
from support.numpy_boxes import np_bbox_overlaps, np_bbox_transform_inv

NUM_CLASSES = 5
WEIGHTS = (10., 10., 5., 5.)


def np_detectron_rois(proposals, im_scales, gt_boxes, gt_classes, gt_crowd, fg_thresh,
                      bg_thresh_hi, bg_thresh_lo, bbox_thresh, cls_agnostic, xyxy):
    """Per image: roidb entry with gt, proposals merged, class assignments, regression targets;
    then _sample_rois keeping every fg and bg candidate (in np.where order)."""
    out_rois, out_labels, out_targets, out_inside = [], [], [], []
    for i, scale in enumerate(im_scales):
        # roidb gt entry (json_dataset._add_gt_annotations)
        boxes = gt_boxes[i].astype(np.float32)
        classes = gt_classes[i].astype(np.int32)
        is_crowd = gt_crowd[i].astype(bool)
        gt_overlaps = np.zeros((len(boxes), NUM_CLASSES), dtype=np.float32)
        for ix in range(len(boxes)):
            if is_crowd[ix]:
                gt_overlaps[ix, :] = -1.0
            else:
                gt_overlaps[ix, classes[ix]] = 1.0
        # add_proposals / _merge_proposal_boxes_into_roidb
        inv_im_scale = 1. / scale
        props = proposals[np.where(proposals[:, 0] == i)[0], 1:] * inv_im_scale
        prop_overlaps = np.zeros((len(props), NUM_CLASSES), dtype=np.float32)
        gt_inds = np.where(classes > 0)[0]
        if len(gt_inds) > 0:
            proposal_to_gt = np_bbox_overlaps(props, boxes[gt_inds])
            argmaxes = proposal_to_gt.argmax(axis=1)
            maxes = proposal_to_gt.max(axis=1)
            nonzero = np.where(maxes > 0)[0]
            prop_overlaps[nonzero, classes[gt_inds][argmaxes[nonzero]]] = maxes[nonzero]
        entry_boxes = np.append(boxes, props.astype(np.float32), axis=0)
        entry_classes = np.append(classes, np.zeros(len(props), dtype=np.int32))
        entry_crowd = np.append(is_crowd, np.zeros(len(props), dtype=bool))
        overlaps = np.append(gt_overlaps, prop_overlaps, axis=0)
        max_overlaps = overlaps.max(axis=1)
        max_classes = overlaps.argmax(axis=1)
        # compute_bbox_regression_targets
        targets = np.zeros((len(entry_boxes), 5), dtype=np.float32)
        real_gt = np.where((entry_classes > 0) & (entry_crowd == 0))[0]
        if len(real_gt) > 0:
            ex_inds = np.where(max_overlaps >= bbox_thresh)[0]
            ex_gt_overlaps = np_bbox_overlaps(entry_boxes[ex_inds], entry_boxes[real_gt])
            gt_assignment = ex_gt_overlaps.argmax(axis=1)
            targets[ex_inds, 0] = 1 if cls_agnostic else max_classes[ex_inds]
            targets[ex_inds, 1:] = np_bbox_transform_inv(
                entry_boxes[ex_inds], entry_boxes[real_gt[gt_assignment]], WEIGHTS, xyxy)
        # _sample_rois with every candidate taken
        fg_inds = np.where(max_overlaps >= fg_thresh)[0]
        bg_inds = np.where((max_overlaps < bg_thresh_hi) & (max_overlaps >= bg_thresh_lo))[0]
        keep = np.append(fg_inds, bg_inds)
        labels = max_classes[keep]
        labels[len(fg_inds):] = 0
        # _expand_bbox_targets
        num_reg = 2 if cls_agnostic else NUM_CLASSES
        expanded = np.zeros((len(keep), 4 * num_reg), dtype=np.float32)
        inside = np.zeros_like(expanded)
        for row, ind in enumerate(keep):
            cls = int(targets[ind, 0])
            if cls > 0:
                expanded[row, 4 * cls:4 * cls + 4] = targets[ind, 1:]
                inside[row, 4 * cls:4 * cls + 4] = 1.0
        out_rois.append(np.hstack((i * np.ones((len(keep), 1)), entry_boxes[keep] * scale)))
        out_labels.append(labels)
        out_targets.append(expanded)
        out_inside.append(inside)
    return (np.concatenate(out_rois).astype(np.float32), np.concatenate(out_labels),
            np.concatenate(out_targets), np.concatenate(out_inside))


def _batch(seed=0):
    """Two images; image 0 has a crowd box; proposals (input coordinates) interleave images like
    proposals collected over the batch, and include jittered copies of every gt box."""
    rng = np.random.RandomState(seed)
    im_scales = np.array([1.5, 0.8], dtype=np.float32)
    gt_boxes = [np.array([[10, 12, 60, 70], [80, 20, 140, 90], [30, 100, 90, 150]], np.float32),
                np.array([[5, 5, 50, 40], [60, 50, 120, 110]], np.float32)]
    gt_classes = [np.array([1, 3, 2]), np.array([2, 4])]
    gt_crowd = [np.array([False, False, True]), np.array([False, False])]
    proposals = []
    for i, scale in enumerate(im_scales):
        for box in gt_boxes[i]:
            for _ in range(12):
                proposals.append([i, *((box + rng.randn(4) * 8) * scale)])
        for _ in range(20):
            x1, y1 = rng.uniform(0, 120, size=2)
            w, h = rng.uniform(8, 60, size=2)
            proposals.append([i, *(np.array([x1, y1, x1 + w, y1 + h]) * scale)])
    proposals = np.array(proposals, dtype=np.float32)
    proposals = proposals[rng.permutation(len(proposals))]
    return proposals, im_scales, gt_boxes, gt_classes, gt_crowd


def _to_torch(proposals, im_scales, gt_boxes, gt_classes, gt_crowd):
    return (torch.from_numpy(proposals), torch.from_numpy(im_scales),
            [torch.from_numpy(b) for b in gt_boxes], [torch.from_numpy(c).long() for c in gt_classes],
            [torch.from_numpy(c) for c in gt_crowd])


@pytest.mark.parametrize('xyxy', [False, True])
@pytest.mark.parametrize('cls_agnostic', [False, True])
@pytest.mark.parametrize('fg_thresh,bg_thresh_hi,bg_thresh_lo,bbox_thresh', [
    (0.5, 0.5, 0.0, 0.5),     # Detectron defaults
    (0.5, 0.5, 0.1, 0.3),     # sampled bg RoIs with IoU in [0.3, 0.5) get regression targets
    (0.5, 0.6, 0.0, 0.5),     # overlapping ranges: a RoI can be sampled as fg and as bg
])
def test_rois_labels_and_targets_match_detectron(xyxy, cls_agnostic, fg_thresh, bg_thresh_hi,
                                                 bg_thresh_lo, bbox_thresh):
    batch = _batch()
    expected = np_detectron_rois(*batch, fg_thresh, bg_thresh_hi, bg_thresh_lo, bbox_thresh,
                                 cls_agnostic, xyxy)
    out = sample_rois(*_to_torch(*batch), num_classes=NUM_CLASSES, batch_size_per_im=10000,
                      fg_fraction=0.25, fg_thresh=fg_thresh, bg_thresh_hi=bg_thresh_hi,
                      bg_thresh_lo=bg_thresh_lo, bbox_reg_weights=WEIGHTS,
                      bbox_thresh=bbox_thresh, cls_agnostic=cls_agnostic, xyxy=xyxy)
    rois, labels, targets, inside = expected
    assert out.labels.dtype == torch.int64
    np.testing.assert_array_equal(out.labels.numpy(), labels)
    np.testing.assert_allclose(out.rois.numpy(), rois, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(out.bbox_targets.numpy(), targets, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out.bbox_inside_weights.numpy(), inside)
    np.testing.assert_array_equal(out.bbox_outside_weights.numpy(), inside)
    assert out.bbox_targets.shape[1] == 4 * (2 if cls_agnostic else NUM_CLASSES)
    assert (labels > 0).sum() >= 30 and (labels == 0).sum() >= 20
    if bbox_thresh < fg_thresh:
        assert (inside[labels == 0] > 0).any()


def test_crowd_gt_is_never_sampled_and_proposals_on_it_are_fg_of_its_class():
    # gt A = [0, 0, 9, 9] class 1; crowd C = [20, 0, 29, 9] class 2; one proposal equal to C.
    out = sample_rois(
        torch.tensor([[0., 20., 0., 29., 9.]]), torch.tensor([1.0]),
        [torch.tensor([[0., 0., 9., 9.], [20., 0., 29., 9.]])], [torch.tensor([1, 2])],
        [torch.tensor([False, True])], num_classes=3, batch_size_per_im=8)
    assert out.rois.tolist() == [[0., 0., 0., 9., 9.], [0., 20., 0., 29., 9.]]
    assert out.labels.tolist() == [1, 2]
    # the proposal regresses towards A, its best non-crowd gt (IoU 0): dx = 10 * (5 - 25) / 10
    assert out.bbox_targets[1].tolist() == [0.] * 8 + [-20., 0., 0., 0.]
    assert out.bbox_inside_weights[1].tolist() == [0.] * 8 + [1.] * 4
    assert out.bbox_targets[0].tolist() == [0.] * 12
    assert out.bbox_inside_weights[0].tolist() == [0.] * 4 + [1.] * 4 + [0.] * 4


def test_class_agnostic_targets_use_the_second_four_columns():
    out = sample_rois(
        torch.tensor([[0., 0., 0., 19., 9.]]), torch.tensor([2.0]),
        [torch.tensor([[0., 0., 9., 4.]])], [torch.tensor([3])], [torch.tensor([False])],
        num_classes=4, batch_size_per_im=8, cls_agnostic=True)
    # proposal / 2 = [0, 0, 9.5, 4.5] vs gt [0, 0, 9, 4]: IoU 50 / 57.75 >= 0.5, fg of class 3
    assert out.labels.tolist() == [3, 3]
    assert out.bbox_targets.shape == (2, 8)
    assert out.bbox_inside_weights.tolist() == [[0.] * 4 + [1.] * 4] * 2
    assert out.rois.tolist() == [[0., 0., 0., 18., 8.], [0., 0., 0., 19., 9.]]
    w, h = 10.5, 5.5
    expected = [10 * (5 - 0.5 * w) / w, 10 * (2.5 - 0.5 * h) / h, 5 * np.log(10 / w), 5 * np.log(5 / h)]
    np.testing.assert_allclose(out.bbox_targets[1, 4:].numpy(), expected, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------

def _candidate_sets(batch):
    """Reference fg / bg RoIs (input coordinates) and fg labels, per image."""
    rois, labels, _, _ = np_detectron_rois(*batch, 0.5, 0.5, 0.0, 0.5, False, False)
    return rois, labels


def _row_index(rows, table):
    """Index of each row in table (rows are unique boxes)."""
    diffs = np.abs(rows[:, None, :] - table[None, :, :]).max(axis=2)
    assert np.all(diffs.min(axis=1) < 1e-3)
    return diffs.argmin(axis=1)


def test_sampling_respects_quotas_thresholds_and_draws_without_replacement():
    batch = _batch(seed=1)
    reference_rois, reference_labels = _candidate_sets(batch)
    out = sample_rois(*_to_torch(*batch), num_classes=NUM_CLASSES, batch_size_per_im=24,
                      generator=torch.Generator().manual_seed(0))
    rois, labels = out.rois.numpy(), out.labels.numpy()
    for i in range(2):
        image = rois[:, 0] == i
        is_fg_ref = (reference_rois[:, 0] == i) & (reference_labels > 0)
        is_bg_ref = (reference_rois[:, 0] == i) & (reference_labels == 0)
        assert is_fg_ref.sum() > 6 and is_bg_ref.sum() > 18
        assert (image & (labels > 0)).sum() == 6           # round(0.25 * 24)
        assert (image & (labels == 0)).sum() == 18
        fg_rows = _row_index(rois[image & (labels > 0)], reference_rois)
        bg_rows = _row_index(rois[image & (labels == 0)], reference_rois)
        assert np.all(is_fg_ref[fg_rows]) and np.all(is_bg_ref[bg_rows])
        np.testing.assert_array_equal(labels[image & (labels > 0)], reference_labels[fg_rows])
        assert len(set(fg_rows)) == len(fg_rows) and len(set(bg_rows)) == len(bg_rows)
    # image order, each image's fg first
    assert np.all(np.diff(rois[:, 0]) >= 0)
    for i in range(2):
        image_labels = labels[rois[:, 0] == i]
        assert np.all(image_labels[:6] > 0) and np.all(image_labels[6:] == 0)


def test_bg_fills_the_batch_only_up_to_what_exists():
    batch = _batch(seed=2)
    reference_rois, reference_labels = _candidate_sets(batch)
    out = sample_rois(*_to_torch(*batch), num_classes=NUM_CLASSES, batch_size_per_im=400,
                      fg_fraction=0.01, generator=torch.Generator().manual_seed(0))
    for i in range(2):
        image = out.rois[:, 0] == i
        available_bg = ((reference_rois[:, 0] == i) & (reference_labels == 0)).sum()
        assert int((out.labels[image] > 0).sum()) == 4      # round(0.01 * 400)
        assert int((out.labels[image] == 0).sum()) == available_bg < 396


def test_sampling_is_reproducible_with_a_seeded_generator():
    batch = _to_torch(*_batch(seed=3))
    runs = [sample_rois(*batch, num_classes=NUM_CLASSES, batch_size_per_im=16,
                        generator=torch.Generator().manual_seed(seed)) for seed in (5, 5, 6)]
    assert torch.equal(runs[0].rois, runs[1].rois)
    assert not torch.equal(runs[0].rois, runs[2].rois)


def test_images_without_gt_or_proposals_give_bg_or_nothing():
    out = sample_rois(torch.tensor([[1., 2., 2., 20., 20.]]), torch.tensor([1., 2.]),
                      [torch.zeros(0, 4)] * 2, [torch.zeros(0, dtype=torch.long)] * 2,
                      [torch.zeros(0, dtype=torch.bool)] * 2, num_classes=3, batch_size_per_im=8)
    assert out.rois.tolist() == [[1., 2., 2., 20., 20.]]
    assert out.labels.tolist() == [0]
    assert out.bbox_targets.tolist() == [[0.] * 12]
    empty = sample_rois(torch.zeros(0, 5), torch.tensor([1.]), [torch.zeros(0, 4)],
                        [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.bool)],
                        num_classes=3, batch_size_per_im=8)
    assert empty.rois.shape == (0, 5) and empty.bbox_targets.shape == (0, 12)


def _with_padding(proposals, num_padding):
    """The proposals followed by num_padding rows of zeros, and their validity flags (the layout of
    rpn_heads.collected_proposals_fixed_size)."""
    padded = torch.cat((proposals, torch.zeros(num_padding, 5)))
    return padded, torch.arange(len(padded)) < len(proposals)


def _padded(gt_boxes, gt_classes, gt_crowd, columns):
    """The per-image gt as sample_rois_of_padded_gt takes them: (B, columns, 4) boxes, classes, crowd, present."""
    boxes, classes = torch.zeros(len(gt_boxes), columns, 4), torch.zeros(len(gt_boxes), columns, dtype=torch.long)
    crowd, present = (torch.zeros(len(gt_boxes), columns, dtype=torch.bool) for _ in range(2))
    for i, (b, c, k) in enumerate(zip(gt_boxes, gt_classes, gt_crowd)):
        boxes[i, :len(b)], classes[i, :len(b)], crowd[i, :len(b)], present[i, :len(b)] = b, c, k, True
    return boxes, classes, crowd, present


@pytest.mark.parametrize('padded_gt', [False, True])
@pytest.mark.parametrize('bg_thresh_hi,batch_size_per_im', [(0.5, 24), (0.6, 24), (0.5, 10000)])
def test_fixed_size_sampling_gives_the_compact_rois_then_padding(bg_thresh_hi, batch_size_per_im, padded_gt):
    # Each candidate's draw depends on the seed and on what the candidate is, not on the rows around it: padding
    # proposal rows (and, with padded_gt, gt columns past each image's gt) are never sampled, and the valid rows
    # are the compact sampling's rows, from the same seed.
    proposals, im_scales, gt_boxes, gt_classes, gt_crowd = _to_torch(*_batch(seed=4))
    padded, proposal_valid = _with_padding(proposals, 7)
    args = dict(num_classes=NUM_CLASSES, batch_size_per_im=batch_size_per_im, bg_thresh_hi=bg_thresh_hi)
    if padded_gt:
        fixed = sample_rois_of_padded_gt(padded, proposal_valid, im_scales, *_padded(gt_boxes, gt_classes, gt_crowd, 8),
                                         generator=torch.Generator().manual_seed(1), **args)
    else:
        fixed = sample_rois(padded, im_scales, gt_boxes, gt_classes, gt_crowd, proposal_valid=proposal_valid,
                            generator=torch.Generator().manual_seed(1), **args)
    compact = sample_rois(proposals, im_scales, gt_boxes, gt_classes, gt_crowd,
                          generator=torch.Generator().manual_seed(1), **args)
    num_gt = 2 * 8 if padded_gt else sum(len(b) for b in gt_boxes)
    expected_slots = min(2 * batch_size_per_im, (len(padded) + num_gt) * (2 if bg_thresh_hi > 0.5 else 1))
    assert len(fixed.rois) == expected_slots
    num = len(compact.rois)
    assert 0 < num <= expected_slots
    if batch_size_per_im > 1000:
        assert num < expected_slots  # fewer candidates than slots: padding rows at the end
    else:
        assert (compact.labels > 0).sum() == 2 * 6  # int(0.25 x 24) fg of each image: a random subset of them
    assert fixed.valid[:num].all() and not fixed.valid[num:].any()
    for name in ('rois', 'labels', 'bbox_targets', 'bbox_inside_weights', 'bbox_outside_weights'):
        got, want = getattr(fixed, name), getattr(compact, name)
        assert torch.equal(got[:num], want), name
        assert got[num:].abs().sum() == 0, name
    assert compact.valid is None


def _splitmix64(state):
    """SplitMix64's output for a state, in Python's unbounded integers (Steele, Lea and Flood, 2014)."""
    mask = (1 << 64) - 1
    z = state & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_keyed_uniform_is_splitmix64_of_the_key_and_seed():
    keys = [0, 1, 2, 7, 3 * (1 << 24) + 5, (1 << 48) + 1999]
    for seed in (0, 12345, (1 << 62) - 1):
        got = keyed_uniform(torch.tensor(keys), torch.tensor([seed])).tolist()
        want = [(_splitmix64(seed + key * 0x9E3779B97F4A7C15) >> 11) / 2 ** 53 for key in keys]
        assert got == want
    draws = keyed_uniform(torch.arange(100000), torch.tensor([99])).numpy()
    assert 0 <= draws.min() and draws.max() < 1
    counts = np.histogram(draws, bins=10, range=(0, 1))[0]
    assert np.abs(counts - 10000).max() < 500  # about 4.5 standard deviations


def test_random_subset_draws_by_row_key_not_by_position():
    """The same rows, keys and seed give the same subset whatever other rows lie around them; every
    eligible row is chosen about quota / eligible of the time over seeds."""
    image_ids = torch.tensor([0] * 6 + [1] * 4)
    eligible = torch.tensor([1, 1, 0, 1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    keys = torch.arange(10) * 3 + 1
    quotas = torch.tensor([2, 1])
    # three ineligible rows with other keys inserted after the fourth row
    spread_ids = torch.cat([image_ids[:4], torch.tensor([0] * 3), image_ids[4:]])
    spread_eligible = torch.cat([eligible[:4], torch.zeros(3, dtype=torch.bool), eligible[4:]])
    spread_keys = torch.cat([keys[:4], torch.tensor([1000, 1001, 1002]), keys[4:]])
    times = torch.zeros(10)
    for seed in range(400):
        chosen = random_subset(eligible, image_ids, quotas, torch.Generator().manual_seed(seed), row_keys=keys)
        spread = random_subset(spread_eligible, spread_ids, quotas, torch.Generator().manual_seed(seed),
                               row_keys=spread_keys)
        assert torch.equal(torch.cat([spread[:4], spread[7:]]), chosen) and not spread[4:7].any()
        assert chosen[:6].sum() == 2 and chosen[6:].sum() == 1 and not chosen[~eligible].any()
        times += chosen
    np.testing.assert_allclose(times[eligible].numpy() / 400, [0.4] * 5 + [1 / 3] * 3, atol=0.1)
