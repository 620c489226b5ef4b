"""Keypoint R-CNN targets (Detectron's add_keypoint_rcnn_blobs) on a hand-made batch."""
import torch

from detectron.roi_data.keypoint_rcnn import keypoint_targets


def _targets():
    # Image 0: one object (10, 10, 50, 50) with a visible keypoint inside, a visible one outside the box and
    # an unlabelled one; image 1: one object whose keypoints are all unlabelled.
    kps0 = torch.tensor([[[20., 60., 30.], [30., 30., 40.], [2., 2., 0.]]])
    return [
        {'boxes': torch.tensor([[10., 10., 50., 50.]]), 'classes': torch.tensor([1]),
         'is_crowd': torch.tensor([False]), 'keypoints': kps0},
        {'boxes': torch.tensor([[0., 0., 30., 30.]]), 'classes': torch.tensor([1]),
         'is_crowd': torch.tensor([False]), 'keypoints': torch.zeros(1, 3, 3)},
    ]


# Network-input proposals at scale 2: one on image 0's object, one far from it, one on image 1's object.
PROPOSALS = torch.tensor([[0, 20., 20., 100., 100.], [0, 150., 150., 190., 190.], [1, 0., 0., 60., 60.]])
SCALES = torch.tensor([2.0, 2.0])


def test_keypoint_rois_are_fg_candidates_with_a_visible_keypoint_inside():
    kt = keypoint_targets(PROPOSALS, SCALES, _targets(), fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8)
    # The gt row of image 0, then its proposal; image 1's candidates have no labelled keypoint.
    torch.testing.assert_close(kt.rois, torch.tensor([[0, 20., 20., 100., 100.]] * 2))
    # Keypoint 0 at (20, 30) in the 40-pixel box from (10, 10): cell (floor(10 / 5), floor(20 / 5)) = (2, 4).
    assert kt.labels.tolist() == [[34, 0, 0]] * 2
    assert kt.weights.tolist() == [[1.0, 0.0, 0.0]] * 2


def test_keypoint_rois_per_image_are_capped_and_padding_proposals_never_sampled():
    capped = keypoint_targets(PROPOSALS, SCALES, _targets(), fg_thresh=0.5, fg_rois_per_image=1, heatmap_size=8)
    assert len(capped.rois) == 1 and capped.weights.sum() == 1
    valid = torch.tensor([False, True, True])
    only_gt = keypoint_targets(PROPOSALS, SCALES, _targets(), fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8,
                               proposal_valid=valid)
    assert len(only_gt.rois) == 1


def test_a_batch_without_keypoint_rois_gives_one_zero_weight_roi():
    targets = _targets()
    targets[0]['keypoints'][0, 2] = 0  # nothing labelled anywhere
    kt = keypoint_targets(PROPOSALS, SCALES, targets, fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8)
    assert len(kt.rois) == 1 and kt.weights.sum() == 0


def test_candidates_shared_with_the_box_sampling_give_the_same_targets():
    from detectron.roi_data.fast_rcnn import candidate_assignments
    targets = _targets()
    shared = candidate_assignments(PROPOSALS, SCALES, [t['boxes'] for t in targets], [t['classes'] for t in targets],
                                   [t['is_crowd'] for t in targets])
    alone = keypoint_targets(PROPOSALS, SCALES, targets, fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8)
    given = keypoint_targets(PROPOSALS, SCALES, targets, fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8,
                             candidates=shared)
    for a, b in zip(alone, given):
        assert torch.equal(a, b)
