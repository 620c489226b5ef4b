"""Mask R-CNN targets (Detectron's add_mask_rcnn_blobs) on hand-built RoIs and polygons."""
import numpy as np
import torch

from detectron.roi_data.mask_rcnn import mask_targets
from detectron.roi_data.minibatch import gt_targets


def _square(x0, y0, x1, y1):
    return [np.array([x0, y0, x1, y0, x1, y1, x0, y1], np.float32)]


def test_fg_rois_take_the_best_overlapping_non_crowd_polygon_in_their_class_channel():
    # Image 0 at scale 2: objects A (square 0..8) and B (square 20..36), a crowd region covering both.
    # Image 1 at scale 1: one object C.
    segms = [[_square(0, 0, 8, 8), _square(20, 20, 36, 36), None], [_square(4, 4, 12, 12)]]
    crowd = [torch.tensor([False, False, True]), torch.tensor([False])]
    rois = torch.tensor([
        [0, 40, 40, 72, 72],  # fg of B in original coordinates (20, 20, 36, 36): B's square fills it
        [0, 0, 0, 32, 32],    # bg
        [0, 0, 0, 16, 16],    # fg on A: (0, 0, 8, 8)
        [1, 4, 4, 20, 20],    # fg on C, RoI twice C's size: C fills its top-left quarter
    ])
    labels = torch.tensor([2, 0, 3, 1])
    t = mask_targets(rois, labels, torch.tensor([2.0, 1.0]), segms, crowd, resolution=4, cls_specific=True)
    assert torch.equal(t.rois, rois[[0, 2, 3]])
    assert t.classes.tolist() == [2, 3, 1]
    assert t.masks.dtype == torch.int8
    assert t.masks[0].tolist() == [[1] * 4] * 4
    assert t.masks[1].tolist() == [[1] * 4] * 4
    assert t.masks[2].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    agnostic = mask_targets(rois, labels, torch.tensor([2.0, 1.0]), segms, crowd, resolution=4, cls_specific=False)
    assert agnostic.classes.tolist() == [0, 0, 0]
    assert torch.equal(agnostic.masks, t.masks)


def test_the_polygon_is_chosen_by_its_own_box_not_by_the_sampled_gt():
    # The RoI overlaps B's polygon box most although A's box is listed first and also overlaps.
    segms = [[_square(0, 0, 10, 10), _square(6, 0, 16, 10)]]
    t = mask_targets(torch.tensor([[0, 7.0, 0, 16, 10]]), torch.tensor([1]), torch.tensor([1.0]), segms,
                     [torch.tensor([False, False])], resolution=2, cls_specific=True)
    # Against B (6..16): the RoI 7..16 lies inside it, so every cell is 1; against A the right half would be 0.
    assert t.masks[0].tolist() == [[1, 1], [1, 1]]


def test_a_batch_without_fg_gets_one_ignored_roi():
    rois = torch.tensor([[0, 1.0, 1, 5, 5], [0, 2.0, 2, 6, 6]])
    t = mask_targets(rois, torch.tensor([0, 0]), torch.tensor([1.0]), [[_square(0, 0, 4, 4)]],
                     [torch.tensor([False])], resolution=3, cls_specific=True)
    assert torch.equal(t.rois, rois[:1]) and t.classes.tolist() == [0]
    assert (t.masks == -1).all() and t.masks.shape == (1, 3, 3)


def test_gt_targets_carry_polygons_of_gt_rows_and_none_for_crowd():
    entry = {'boxes': np.zeros((3, 4), np.float32), 'gt_classes': np.array([1, 0, 2], np.int32),
             'is_crowd': np.array([False, False, True]),
             'segms': [[[0, 0, 1, 0, 1, 1]], [[5, 5, 6, 5, 6, 6]], {'size': [2, 2], 'counts': [4]}]}
    targets = gt_targets(entry)
    assert len(targets['segms']) == 2 and targets['segms'][1] is None
    assert targets['segms'][0][0].dtype == np.float32 and targets['segms'][0][0].tolist() == [0, 0, 1, 0, 1, 1]
    del entry['segms']
    assert 'segms' not in gt_targets(entry)
