"""Mask R-CNN targets (Detectron's add_mask_rcnn_blobs) on hand-built RoIs and polygons, and
against Detectron's host computation (bbox_overlaps, polys_to_mask_wrt_box) on random and COCO ones."""
import importlib.util
import os
import warnings

import numpy as np
import pytest
import torch

from detectron.roi_data.loader import to_device
from detectron.roi_data.mask_rcnn import mask_targets
from detectron.roi_data.minibatch import gt_targets
from detectron.utils import segms as segm_utils
from tests.support.host_reads import HostReads

# Detectron's host computation, the reference, and the coco_tiny batch live in the benchmark script.
_spec = importlib.util.spec_from_file_location('mask_targets_bench', os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), 'dev', 'mask_targets_bench.py'))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _square(x0, y0, x1, y1):
    return [np.array([x0, y0, x1, y0, x1, y1, x0, y1], np.float32)]


def _packed(segms, crowd):
    """An image's objects (None for a crowd region) as gt_targets hands them to the model."""
    entry = {'boxes': np.zeros((len(segms), 4), np.float32), 'gt_classes': np.ones(len(segms), np.int32),
             'is_crowd': np.array(crowd, bool), 'segms': segms}
    return gt_targets(entry)


_DEVICES = ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda,
                                               pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')])]


def test_fg_rois_take_the_best_overlapping_non_crowd_polygon_in_their_class_channel():
    # Image 0 at scale 2: objects A (square 0..8) and B (square 20..36), a crowd region covering both.
    # Image 1 at scale 1: one object C.
    images = [_packed([_square(0, 0, 8, 8), _square(20, 20, 36, 36), None], [False, False, True]),
              _packed([_square(4, 4, 12, 12)], [False])]
    rois = torch.tensor([
        [0, 40, 40, 72, 72],  # fg of B in original coordinates (20, 20, 36, 36): B's square fills it
        [0, 0, 0, 32, 32],    # bg
        [0, 0, 0, 16, 16],    # fg on A: (0, 0, 8, 8)
        [1, 4, 4, 20, 20],    # fg on C, RoI twice C's size: C fills its top-left quarter
    ])
    labels = torch.tensor([2, 0, 3, 1])
    t = mask_targets(rois, labels, torch.tensor([2.0, 1.0]), images, resolution=4, cls_specific=True)
    assert torch.equal(t.rois, rois[[0, 2, 3]]) and t.rows.tolist() == [0, 2, 3]  # roi_has_mask's positions
    assert t.classes.tolist() == [2, 3, 1]
    assert t.masks.dtype == torch.int8
    assert t.masks[0].tolist() == [[1] * 4] * 4
    assert t.masks[1].tolist() == [[1] * 4] * 4
    assert t.masks[2].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    agnostic = mask_targets(rois, labels, torch.tensor([2.0, 1.0]), images, resolution=4, cls_specific=False)
    assert agnostic.classes.tolist() == [0, 0, 0]
    assert torch.equal(agnostic.masks, t.masks)


def test_the_polygon_is_chosen_by_its_own_box_not_by_the_sampled_gt():
    # The RoI overlaps B's polygon box most although A's box is listed first and also overlaps.
    images = [_packed([_square(0, 0, 10, 10), _square(6, 0, 16, 10)], [False, False])]
    t = mask_targets(torch.tensor([[0, 7.0, 0, 16, 10]]), torch.tensor([1]), torch.tensor([1.0]), images,
                     resolution=2, cls_specific=True)
    # Against B (6..16): the RoI 7..16 lies inside it, so every cell is 1; against A the right half would be 0.
    assert t.masks[0].tolist() == [[1, 1], [1, 1]]


@pytest.mark.parametrize('device', _DEVICES)
def test_equal_overlaps_take_the_first_object(device):
    # A triangle and a square with the same tight box (0, 0, 8, 8): the RoI on it overlaps both by 1.
    triangle, square = [np.array([0, 0, 8, 0, 0, 8], np.float32)], _square(0, 0, 8, 8)
    rois = torch.tensor([[0, 0.0, 0, 8, 8], [1, 0.0, 0, 8, 8]], device=device)
    images = [_packed([triangle, square], [False, False]), _packed([square, triangle], [False, False])]
    images = to_device(images, device)
    t = mask_targets(rois, torch.tensor([1, 1], device=device), torch.ones(2, device=device), images,
                     resolution=4, cls_specific=True)
    assert t.masks[0].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert t.masks[1].tolist() == [[1] * 4] * 4


def test_a_batch_without_fg_gets_one_ignored_roi():
    rois = torch.tensor([[0, 1.0, 1, 5, 5], [0, 2.0, 2, 6, 6]])
    t = mask_targets(rois, torch.tensor([0, 0]), torch.tensor([1.0]), [_packed([_square(0, 0, 4, 4)], [False])],
                     resolution=3, cls_specific=True)
    assert torch.equal(t.rois, rois[:1]) and t.classes.tolist() == [0] and t.rows.tolist() == [0]
    assert (t.masks == -1).all() and t.masks.shape == (1, 3, 3)


def test_fg_rois_of_a_batch_without_non_crowd_objects_are_ignored():
    rois = torch.tensor([[0, 1.0, 1, 5, 5], [1, 2.0, 2, 6, 6], [1, 0.0, 0, 3, 3]])
    images = [_packed([None], [True]), _packed([], [])]
    t = mask_targets(rois, torch.tensor([3, 0, 2]), torch.tensor([1.0, 2.0]), images, resolution=3, cls_specific=True)
    assert torch.equal(t.rois, rois[[0, 2]]) and t.classes.tolist() == [3, 2]
    assert t.masks.shape == (2, 3, 3) and (t.masks == -1).all()


def test_gt_targets_pack_the_polygons_of_non_crowd_gt_rows():
    entry = {'boxes': np.zeros((4, 4), np.float32), 'gt_classes': np.array([1, 0, 2, 3], np.int32),
             'is_crowd': np.array([False, False, True, False]),
             'segms': [[[0, 0, 1, 0, 1, 1]], [[5, 5, 6, 5, 6, 6]], {'size': [2, 2], 'counts': [4]},
                       [[2, 3, 4, 3, 4, 5, 2, 5], [7, 1, 8, 1, 8, 2]]]}
    targets = gt_targets(entry)
    assert targets['segm_boxes'].tolist() == [[0, 0, 1, 1], [2, 1, 8, 5]]
    assert targets['segm_object_polygons'].tolist() == [1, 2] and targets['segm_polygon_edges'].tolist() == [3, 4, 3]
    assert targets['segm_edges'].shape == (10, 4) and targets['segm_edges'].dtype == torch.float32
    assert targets['segm_edges'][:3].tolist() == [[0, 0, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]]
    assert targets['segm_edges'][9].tolist() == [8, 2, 7, 1]
    assert targets['segm_most_edges'] == 7 and targets['segm_most_polygons'] == 2  # the second object: 4 + 3
    del entry['segms']
    assert not [k for k in gt_targets(entry) if k.startswith('segm')]


@pytest.mark.parametrize('device', _DEVICES)
def test_random_batch_matches_detectrons_host_computation(device):
    # Three images: overlapping random objects with a crowd region, an image with only a crowd
    # region (its fg RoIs stay ignored), and one with a single object; bg RoIs mixed in.
    rng = np.random.RandomState(0)
    square = _square(10, 10, 30, 40)
    polys = [[(rng.rand(8) * 60).astype(np.float32) for _ in range(rng.randint(1, 3))] for _ in range(6)]
    images = [polys[:5], [], [polys[5]]]
    packed = [_packed(polys[:5] + [None], [False] * 5 + [True]), _packed([None], [True]), _packed([polys[5]], [False])]
    im_scales = torch.tensor([1.5, 1.0, 0.7])
    rois = bench.jittered_rois(rng, [segm_utils.polys_to_boxes(p) if p else np.array(square[0][[0, 1, 4, 5]])[None]
                                for p in images], im_scales.numpy(), per_object=8)
    labels = torch.from_numpy(rng.randint(0, 4, size=len(rois)))
    on_device = to_device(packed, device)
    t = mask_targets(rois.to(device), labels.to(device), im_scales.to(device), on_device, resolution=28,
                     cls_specific=True)
    reference = bench.host_mask_targets(rois, labels, im_scales, images, 28)
    assert (reference == -1).all(axis=(1, 2)).sum() == (labels[rois[:, 0] == 1] > 0).sum() > 0
    assert t.masks.device.type == device and np.array_equal(t.masks.cpu().numpy(), reference)
    assert torch.equal(t.classes.cpu(), labels[labels > 0])


def _assert_fixed_size_equals_compact(rois, labels, im_scales, packed, max_rows, cls_specific=True):
    compact = mask_targets(rois, labels, im_scales, packed, resolution=28, cls_specific=cls_specific)
    fixed = mask_targets(rois, labels, im_scales, packed, resolution=28, cls_specific=cls_specific, max_rows=max_rows)
    num_fg = int((labels > 0).sum())
    assert fixed.masks.shape == (max_rows, 28, 28) and len(fixed.rois) == len(fixed.classes) == len(fixed.rows) == max_rows
    for name in ('rois', 'classes', 'masks', 'rows'):
        assert torch.equal(getattr(fixed, name)[:num_fg], getattr(compact, name)[:num_fg]), name
    assert (fixed.masks[num_fg:] == -1).all() and (fixed.rows[num_fg:] == 0).all()
    return fixed


@pytest.mark.parametrize('device', _DEVICES)
def test_fixed_size_targets_are_the_compact_ones_then_ignored_rows(device):
    # The random batch above: objects of one and two polygons, an image of only a crowd region, bg RoIs.
    rng = np.random.RandomState(0)
    polys = [[(rng.rand(2 * rng.randint(3, 9)) * 60).astype(np.float32) for _ in range(rng.randint(1, 4))]
             for _ in range(6)]
    packed = to_device([_packed(polys[:5] + [None], [False] * 5 + [True]), _packed([None], [True]),
                        _packed([polys[5]], [False])], device)
    im_scales = torch.tensor([1.5, 1.0, 0.7])
    square = np.array([10, 10, 30, 40], np.float32)[None]
    rois = bench.jittered_rois(rng, [segm_utils.polys_to_boxes(polys[:5]), square, segm_utils.polys_to_boxes(polys[5:])],
                               im_scales.numpy(), per_object=8)
    labels = torch.from_numpy(rng.randint(0, 4, size=len(rois)))
    rois, labels, im_scales = rois.to(device), labels.to(device), im_scales.to(device)
    assert packed[0]['segm_most_polygons'] >= 2 and int((labels > 0).sum()) > 20
    for cls_specific in (True, False):
        _assert_fixed_size_equals_compact(rois, labels, im_scales, packed, len(rois), cls_specific)
    _assert_fixed_size_equals_compact(rois, labels, im_scales, packed, int((labels > 0).sum()))
    # A batch without fg RoIs: every row ignored, so the loss is 0 as with the compact one's single row.
    fixed = mask_targets(rois, torch.zeros_like(labels), im_scales, packed, resolution=28, cls_specific=True, max_rows=6)
    assert fixed.masks.shape == (6, 28, 28) and (fixed.masks == -1).all()
    # A batch without objects at all (no edge to draw).
    empty = to_device([_packed([], []), _packed([None], [True]), _packed([], [])], device)
    fixed = _assert_fixed_size_equals_compact(rois, labels, im_scales, empty, len(rois))
    assert (fixed.masks == -1).all()


def test_fixed_size_targets_read_nothing_on_the_host(monkeypatch):
    """The CPU's view of mask_targets' host syncs on a GPU: the compact targets read their sizes once (the
    control), the max_rows layout reads nothing and calls no operator sized by values."""
    rng = np.random.RandomState(2)
    polys = [[(rng.rand(2 * rng.randint(3, 7)) * 60).astype(np.float32) for _ in range(rng.randint(1, 3))]
             for _ in range(4)]
    packed = [_packed(polys[:3], [False] * 3), _packed(polys[3:], [False])]
    rois = bench.jittered_rois(rng, [segm_utils.polys_to_boxes(polys[:3]), segm_utils.polys_to_boxes(polys[3:])],
                               [1.0, 2.0], per_object=6)
    labels = torch.from_numpy(rng.randint(0, 3, size=len(rois)))
    args = (rois, labels, torch.tensor([1.0, 2.0]), packed)
    with HostReads(monkeypatch) as compact:
        mask_targets(*args, resolution=14, cls_specific=True)
    with HostReads(monkeypatch) as fixed:
        mask_targets(*args, resolution=14, cls_specific=True, max_rows=len(rois))
    assert [read for read, _ in compact.reads] == ['tolist'] and fixed.reads == []


@pytest.mark.skipif(not os.path.isdir(bench.COCO_TINY), reason=f'coco_tiny not found at {bench.COCO_TINY}')
@pytest.mark.parametrize('device', _DEVICES)
def test_coco_tiny_batch_of_256_fg_rois_matches_detectrons_host_computation(device):
    rois, labels, im_scales, images = bench.coco_tiny_batch(bench.COCO_TINY, 256)
    packed = [to_device(_packed(image, [False] * len(image)), device) for image in images]
    t = mask_targets(rois.to(device), labels.to(device), im_scales.to(device), packed, resolution=28,
                     cls_specific=False)
    reference = bench.host_mask_targets(rois, labels, im_scales, images, 28)
    assert len(rois) == 256 and sum(len(image) for image in images) > 50
    assert 0.2 < (reference == 1).mean() < 0.8 and np.array_equal(t.masks.cpu().numpy(), reference)
    labels = labels.to(device)
    _assert_fixed_size_equals_compact(rois.to(device), labels, im_scales.to(device), packed, len(rois), cls_specific=False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_mask_targets_synchronise_with_the_host_once_on_cuda_and_never_with_max_rows():
    rng = np.random.RandomState(1)
    polys = [[(rng.rand(8) * 60).astype(np.float32)] for _ in range(4)]
    packed = [to_device(_packed(polys, [False] * 4), 'cuda')]
    rois = bench.jittered_rois(rng, [segm_utils.polys_to_boxes(polys)], [1.0], per_object=8).cuda()
    labels = torch.from_numpy(rng.randint(0, 3, size=len(rois))).cuda()
    scales = torch.ones(1, device='cuda')
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode('warn')
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            t = mask_targets(rois, labels, scales, packed, resolution=28, cls_specific=True)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    syncs = [w for w in caught if 'synchronizing' in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]
    assert np.array_equal(t.masks.cpu().numpy(), bench.host_mask_targets(rois, labels, scales, [polys], 28))
    # With max_rows (the fixed-size RoIs' bound) nothing waits for the device.
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('warn')
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            fixed = mask_targets(rois, labels, scales, packed, resolution=28, cls_specific=True, max_rows=len(rois))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert not [str(w.message) for w in caught if 'synchronizing' in str(w.message)]
    assert torch.equal(fixed.masks[:len(t.masks)], t.masks)
