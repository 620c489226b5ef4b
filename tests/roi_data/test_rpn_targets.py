"""RPN anchor targets against a numpy transcription of Detectron's roi_data/rpn.py _get_rpn_blobs.

The labelling before sampling and the targets are compared exactly (with a batch so large that
Detectron's sampling keeps every candidate); the random sampling is checked by its invariants.
The numpy helpers bbox_overlaps and bbox_transform_inv are in tests/support/numpy_boxes.py.
"""
import numpy as np
import pytest
import torch

from detectron.modeling.rpn_heads import fpn_anchors
from detectron.roi_data.fast_rcnn import padded_gt_columns
from detectron.roi_data.rpn import rpn_targets, rpn_targets_of_padded_gt
from support.numpy_boxes import np_bbox_overlaps, np_bbox_transform_inv

FEATURE_SHAPES = [(16, 20), (8, 10), (4, 5), (2, 3), (1, 2)]
NO_SUBSAMPLING = 10 ** 6


# ------------------------------------------------------------------------------------------------
# numpy transcriptions of Detectron / KL-Loss
# ------------------------------------------------------------------------------------------------

def np_rpn_blobs(all_anchors, level_shapes, im_height, im_width, gt_boxes, straddle_thresh,
                 positive_overlap=0.7, negative_overlap=0.3, xyxy=False):
    """_get_rpn_blobs with a batch so large that no fg is disabled and every bg candidate is
    enabled (len(bg_inds) <= num_bg). Also returns the fg / bg candidate masks (full anchor set)."""
    total_anchors = all_anchors.shape[0]
    if straddle_thresh >= 0:
        inds_inside = np.where(
            (all_anchors[:, 0] >= -straddle_thresh) & (all_anchors[:, 1] >= -straddle_thresh)
            & (all_anchors[:, 2] < im_width + straddle_thresh)
            & (all_anchors[:, 3] < im_height + straddle_thresh))[0]
    else:
        inds_inside = np.arange(total_anchors)
    anchors = all_anchors[inds_inside, :]
    num_inside = len(inds_inside)
    labels = np.empty((num_inside,), dtype=np.int32)
    labels.fill(-1)
    # Detectron would raise NameError without gt; the port treats every IoU as 0.
    anchor_to_gt_max = np.zeros(num_inside, dtype=np.float32)
    anchor_to_gt_argmax = np.zeros(num_inside, dtype=int)
    if len(gt_boxes) > 0:
        anchor_by_gt_overlap = np_bbox_overlaps(anchors, gt_boxes)
        anchor_to_gt_argmax = anchor_by_gt_overlap.argmax(axis=1)
        anchor_to_gt_max = anchor_by_gt_overlap[np.arange(num_inside), anchor_to_gt_argmax]
        gt_to_anchor_argmax = anchor_by_gt_overlap.argmax(axis=0)
        gt_to_anchor_max = anchor_by_gt_overlap[gt_to_anchor_argmax,
                                                np.arange(anchor_by_gt_overlap.shape[1])]
        anchors_with_max_overlap = np.where(anchor_by_gt_overlap == gt_to_anchor_max)[0]
        labels[anchors_with_max_overlap] = 1
        labels[anchor_to_gt_max >= positive_overlap] = 1
    fg_inds = np.where(labels == 1)[0]
    fg_candidates = labels == 1
    bg_inds = np.where(anchor_to_gt_max < negative_overlap)[0]
    labels[bg_inds] = 0
    bbox_targets = np.zeros((num_inside, 4), dtype=np.float32)
    if len(gt_boxes) > 0:
        bbox_targets[fg_inds, :] = np_bbox_transform_inv(
            anchors[fg_inds, :], gt_boxes[anchor_to_gt_argmax[fg_inds], :], (1., 1., 1., 1.), xyxy)
    bbox_inside_weights = np.zeros((num_inside, 4), dtype=np.float32)
    bbox_inside_weights[labels == 1, :] = (1.0, 1.0, 1.0, 1.0)
    bbox_outside_weights = np.zeros((num_inside, 4), dtype=np.float32)
    num_examples = np.sum(labels >= 0)
    bbox_outside_weights[labels == 1, :] = 1.0 / num_examples
    bbox_outside_weights[labels == 0, :] = 1.0 / num_examples

    def unmap(data, fill):
        ret = np.empty((total_anchors,) + data.shape[1:], dtype=data.dtype)
        ret.fill(fill)
        ret[inds_inside] = data
        return ret

    blobs = dict(labels=unmap(labels, -1), bbox_targets=unmap(bbox_targets, 0),
                 bbox_inside_weights=unmap(bbox_inside_weights, 0),
                 bbox_outside_weights=unmap(bbox_outside_weights, 0))
    per_level = []
    start = 0
    for height, width, num_cell in level_shapes:
        end = start + height * width * num_cell
        per_level.append({
            'labels': blobs['labels'][start:end].reshape((1, height, width, num_cell)).transpose(0, 3, 1, 2),
            **{k: blobs[k][start:end].reshape((1, height, width, 4 * num_cell)).transpose(0, 3, 1, 2)
               for k in ('bbox_targets', 'bbox_inside_weights', 'bbox_outside_weights')}})
        start = end
    bg_candidates = unmap((anchor_to_gt_max < negative_overlap).astype(np.int32), 0) == 1
    return per_level, unmap(fg_candidates.astype(np.int32), 0) == 1, bg_candidates


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------

def _anchors():
    return fpn_anchors(FEATURE_SHAPES)


def _flat(anchors):
    return torch.cat([a.reshape(-1, 4) for a in anchors]).numpy()


def _level_shapes(anchors):
    return [tuple(a.shape[:3]) for a in anchors]


def _batch():
    """Two images (padded 64 x 80); image 0 has a crowd box, a box equal to a P2 anchor and a
    2 px box whose best anchor IoU is far below 0.3."""
    im_info = torch.tensor([[60., 75., 2.0], [52., 80., 1.25]])
    gt_boxes = [
        torch.tensor([[1., 1., 16.5, 16.5],        # x2 = P2 ratio-1 anchor at cell (4, 4): [2, 2, 33, 33]
                      [10., 3., 30., 20.],
                      [32., 24., 33., 25.],        # tiny, away from the others
                      [0., 10., 12., 28.]]),       # crowd
        torch.tensor([[3., 4., 40., 30.], [30., 2., 55., 38.]]),
    ]
    gt_is_crowd = [torch.tensor([False, False, False, True]), torch.tensor([False, False])]
    return gt_boxes, gt_is_crowd, im_info


def _reference(anchors, gt_boxes, gt_is_crowd, im_info, straddle_thresh=0, xyxy=False, **kw):
    out = []
    for boxes, crowd, info in zip(gt_boxes, gt_is_crowd, im_info.numpy()):
        rpn_gt = boxes.numpy()[~crowd.numpy()] * info[2]
        out.append(np_rpn_blobs(_flat(anchors), _level_shapes(anchors), info[0], info[1], rpn_gt,
                                straddle_thresh, xyxy=xyxy, **kw))
    return out


def _stack_levels(reference, key, level):
    return np.concatenate([per_image[0][level][key] for per_image in reference])


# ------------------------------------------------------------------------------------------------
# deterministic part
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('xyxy', [False, True])
@pytest.mark.parametrize('straddle_thresh', [0, 8, -1])
def test_labels_targets_and_weights_match_detectron(xyxy, straddle_thresh):
    anchors = _anchors()
    gt_boxes, gt_is_crowd, im_info = _batch()
    targets = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, batch_size_per_im=NO_SUBSAMPLING,
                          straddle_thresh=straddle_thresh, xyxy=xyxy)
    reference = _reference(anchors, gt_boxes, gt_is_crowd, im_info, straddle_thresh, xyxy)
    for level in range(len(anchors)):
        np.testing.assert_array_equal(targets.labels[level].numpy(),
                                      _stack_levels(reference, 'labels', level))
        for key in ('bbox_targets', 'bbox_inside_weights', 'bbox_outside_weights'):
            np.testing.assert_allclose(getattr(targets, key)[level].numpy(),
                                       _stack_levels(reference, key, level), rtol=1e-5, atol=1e-6)
    num_fg = sum(int((l == 1).sum()) for l in targets.labels)
    assert num_fg >= 5


def test_straddling_anchors_are_ignored():
    anchors = _anchors()
    gt_boxes, gt_is_crowd, im_info = _batch()
    targets = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, batch_size_per_im=NO_SUBSAMPLING)
    labelled_inside = 0
    for level_anchors, labels, outside in zip(anchors, targets.labels, targets.bbox_outside_weights):
        a = level_anchors.permute(2, 0, 1, 3)  # (A, H, W, 4) like the labels
        for im_i, (height, width, _) in enumerate(im_info.tolist()):
            leaves = (a[..., 0] < 0) | (a[..., 1] < 0) | (a[..., 2] >= width) | (a[..., 3] >= height)
            assert torch.all(labels[im_i][leaves] == -1)
            assert torch.all(outside[im_i].view(-1, 4, *leaves.shape[1:]).transpose(0, 1)[:, leaves] == 0)
            labelled_inside += int((labels[im_i][~leaves] >= 0).sum())
    assert labelled_inside > 50


def test_anchor_equal_to_a_gt_box_is_fg_and_crowd_boxes_are_not_gt():
    anchors = _anchors()
    gt_boxes, gt_is_crowd, im_info = _batch()
    targets = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, batch_size_per_im=NO_SUBSAMPLING)
    # P2 ratio-1 anchor (index 1) at cell (y=4, x=4) is [2, 2, 33, 33] = gt 0 x 2: IoU 1, target 0
    assert anchors[0][4, 4, 1].tolist() == [2., 2., 33., 33.]
    assert targets.labels[0][0, 1, 4, 4] == 1
    assert torch.all(targets.bbox_targets[0][0, 4:8, 4, 4] == 0)
    # The crowd box x 2 = [0, 20, 24, 56]; its best inside anchor, P2 ratio-2 at cell (y=8, x=3)
    # = [2, 10, 25, 57] (IoU 851 / 1226 = 0.694), would be fg as a best match if it were RPN gt.
    crowd = (gt_boxes[0][3] * 2).numpy().reshape(1, 4)
    assert anchors[0][8, 3, 2].tolist() == [2., 10., 25., 57.]
    iou = np_bbox_overlaps(anchors[0][8, 3, 2].numpy().reshape(1, 4), crowd)[0, 0]
    assert iou == pytest.approx(851 / 1226, rel=1e-6)
    assert targets.labels[0][0, 2, 8, 3] != 1
    as_gt = [torch.zeros(4, dtype=torch.bool), gt_is_crowd[1]]
    targets = rpn_targets(anchors, gt_boxes, as_gt, im_info, batch_size_per_im=NO_SUBSAMPLING)
    assert targets.labels[0][0, 2, 8, 3] == 1


def test_low_iou_best_match_is_overwritten_to_bg_but_keeps_its_target():
    """Detectron computes targets for the fg set before drawing bg; an fg "best match" with IoU
    < 0.3 is also a bg candidate and, once drawn, ends up labelled 0 with zero weights. Its target
    points at the gt it overlaps most, which need not be the gt it best matches."""
    anchors = _anchors()
    gt_boxes, gt_is_crowd, im_info = _batch()
    targets = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, batch_size_per_im=NO_SUBSAMPLING)
    rpn_gt = (gt_boxes[0][:3] * 2).numpy()
    tiny = rpn_gt[2]                                  # [64, 48, 66, 50]
    flat_anchors = _flat(anchors)
    ious = np_bbox_overlaps(flat_anchors, tiny.reshape(1, 4))[:, 0]
    inside = ((flat_anchors[:, 0] >= 0) & (flat_anchors[:, 1] >= 0)
              & (flat_anchors[:, 2] < 75) & (flat_anchors[:, 3] < 60))
    best = np.where(inside & (ious == ious[inside].max()))[0]
    assert 0 < ious[best[0]] < 0.3
    labels = torch.cat([l[0].permute(1, 2, 0).reshape(-1) for l in targets.labels])
    flat_targets = torch.cat([t[0].permute(1, 2, 0).reshape(-1, 4) for t in targets.bbox_targets])
    inside_w = torch.cat([t[0].permute(1, 2, 0).reshape(-1, 4) for t in targets.bbox_inside_weights])
    for i in best:
        assert labels[i] == 0
        assert torch.all(inside_w[i] == 0)
        assigned = np_bbox_overlaps(flat_anchors[i:i + 1], rpn_gt)[0].argmax()
        expected = np_bbox_transform_inv(flat_anchors[i:i + 1], rpn_gt[assigned:assigned + 1],
                                         (1, 1, 1, 1), False)
        assert np.abs(expected).max() > 0.1
        np.testing.assert_allclose(flat_targets[i].numpy(), expected[0], rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------------

def _flat_labels(targets, im_i):
    return torch.cat([l[im_i].permute(1, 2, 0).reshape(-1) for l in targets.labels])


def _dense_fg_batch():
    """Dense 32 px anchors (stride 2) and positive_overlap 0.5: several hundred fg candidates."""
    anchors = fpn_anchors([(64, 64)], strides=(2,), sizes=(32,))
    im_info = torch.tensor([[128., 128., 1.0], [120., 128., 1.0]])
    gt_boxes = [torch.tensor([[4., 4., 35., 35.], [30., 8., 61., 39.], [10., 60., 41., 91.],
                              [70., 70., 110., 100.]]),
                torch.tensor([[2., 2., 40., 30.], [60., 65., 95., 120.], [80., 10., 115., 45.],
                              [20., 80., 50., 110.]])]
    gt_is_crowd = [torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool)]
    return anchors, gt_boxes, gt_is_crowd, im_info


def test_sampling_counts_stay_within_detectron_quotas():
    anchors, gt_boxes, gt_is_crowd, im_info = _dense_fg_batch()
    reference = _reference(anchors, gt_boxes, gt_is_crowd, im_info, positive_overlap=0.5)
    targets = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, positive_overlap=0.5,
                          generator=torch.Generator().manual_seed(0))
    for im_i, (_, fg_candidates, bg_candidates) in enumerate(reference):
        labels = _flat_labels(targets, im_i).numpy()
        assert fg_candidates.sum() > 128
        assert (labels == 1).sum() == 128                       # int(0.5 * 256), without replacement
        assert np.all(fg_candidates[labels == 1])
        assert np.all(bg_candidates[labels == 0])
        assert 0 < (labels == 0).sum() <= 256 - 128             # with replacement: maybe fewer
        outside = torch.cat([w[im_i].permute(1, 2, 0).reshape(-1, 4)
                             for w in targets.bbox_outside_weights]).numpy()
        np.testing.assert_allclose(outside[labels >= 0], 1.0 / (labels >= 0).sum(), rtol=1e-6)
        inside = torch.cat([w[im_i].permute(1, 2, 0).reshape(-1, 4)
                            for w in targets.bbox_inside_weights]).numpy()
        assert np.all(inside[labels == 1] == 1) and np.all(inside[labels != 1] == 0)


def test_sampling_is_reproducible_with_a_seeded_generator():
    anchors, gt_boxes, gt_is_crowd, im_info = _dense_fg_batch()
    runs = [rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, positive_overlap=0.5,
                        generator=torch.Generator().manual_seed(seed)) for seed in (7, 7, 8)]
    same = [torch.equal(a, b) for a, b in zip(runs[0].labels, runs[1].labels)]
    different = [torch.equal(a, b) for a, b in zip(runs[0].labels, runs[2].labels)]
    assert all(same) and not all(different)


@pytest.mark.parametrize('crowd_one', [False, True])
def test_padding_gt_columns_changes_nothing(crowd_one):
    """The graphed RPN stage pads the gt to a power of two: any number of padding columns gives the
    same labels, targets and weights from the same draws (one image with fewer gt than the other, and
    optionally a crowd box)."""
    anchors, gt_boxes, gt_is_crowd, im_info = _dense_fg_batch()
    gt_boxes[1] = gt_boxes[1][:2]
    gt_is_crowd = [gt_is_crowd[0].clone(), gt_is_crowd[1][:2]]
    gt_is_crowd[0][1] = crowd_one
    expected = rpn_targets(anchors, gt_boxes, gt_is_crowd, im_info, positive_overlap=0.5,
                           generator=torch.Generator().manual_seed(3))
    # As the graphed training stage pads them (generalized_rcnn._fixed_size_rpn_and_roi_targets).
    gt, _, crowd, present = padded_gt_columns(gt_boxes, [torch.ones(len(b), dtype=torch.long) for b in gt_boxes],
                                              gt_is_crowd, im_info, num_columns=16)
    gt_valid = present & ~crowd
    assert gt.shape == (2, 16, 4) and gt_valid.sum() == 6 - crowd_one
    padded = rpn_targets_of_padded_gt(anchors, gt * im_info[:, 2].view(-1, 1, 1), gt_valid, im_info,
                                      positive_overlap=0.5, generator=torch.Generator().manual_seed(3))
    assert (expected.labels[0] == 1).sum() > 0
    for field in expected._fields:
        for a, b in zip(getattr(expected, field), getattr(padded, field)):
            assert torch.equal(a, b), field


def test_background_is_drawn_with_replacement():
    # No gt at all: every inside anchor is a bg candidate; a 48 x 48 image holds 300 of these
    # 8 px anchors, and 256 draws with replacement from them repeat some anchors.
    anchors = fpn_anchors([(12, 12)], strides=(4,), sizes=(8,))
    im_info = torch.tensor([[48., 48., 1.0]])
    flat = _flat(anchors)
    inside = ((flat[:, 0] >= 0) & (flat[:, 1] >= 0) & (flat[:, 2] < 48) & (flat[:, 3] < 48)).sum()
    assert inside == 300
    counts = []
    for seed in range(3):
        targets = rpn_targets(anchors, [torch.zeros(0, 4)], [torch.zeros(0, dtype=torch.bool)],
                              im_info, generator=torch.Generator().manual_seed(seed))
        labels = _flat_labels(targets, 0)
        assert torch.all(labels <= 0)
        counts.append(int((labels == 0).sum()))
    # distinct anchors among 256 uniform draws from 300: 300 (1 - (299/300)^256) = 172 expected
    assert all(140 < c < 205 for c in counts) and len(set(counts)) > 1


def test_all_bg_candidates_are_kept_when_there_are_few():
    anchors = fpn_anchors([(4, 4)], strides=(8,), sizes=(16,))
    im_info = torch.tensor([[32., 32., 1.0]])
    targets = rpn_targets(anchors, [torch.tensor([[0., 0., 5., 5.]])], [torch.tensor([True])],
                          im_info, generator=torch.Generator().manual_seed(0))
    reference = np_rpn_blobs(_flat(anchors), _level_shapes(anchors), 32., 32., np.zeros((0, 4)), 0)
    # only the crowd box: no RPN gt, all inside anchors (< 256) are bg, weights 1 / their count
    np.testing.assert_array_equal(targets.labels[0].numpy(), reference[0][0]['labels'])
    np.testing.assert_allclose(targets.bbox_outside_weights[0].numpy(),
                               reference[0][0]['bbox_outside_weights'], rtol=1e-6)
    assert (targets.labels[0] == 0).sum() > 0
