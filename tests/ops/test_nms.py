"""ops/nms.py: greedy NMS with Detectron's +1 areas and its order of equal scores, by each route."""
import numpy as np
import pytest
import torch
import torchvision

from detectron.ops import nms as nms_ops

F32 = np.float32


def _random_nms_case(seed, max_boxes, max_groups):
    """(boxes, scores, group ids) of random overlapping boxes; distinct scores (no tie order)."""
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, max_boxes, (), generator=gen))
    xy = torch.rand(n, 2, generator=gen) * 300
    boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * 120], dim=1)
    scores = torch.randperm(n, generator=gen).float() / n
    idxs = torch.randint(0, int(torch.randint(1, max_groups, (), generator=gen)), (n,), generator=gen)
    return boxes, scores, idxs


@pytest.mark.parametrize('seed', range(6))
def test_matrix_batched_nms_equals_torchvision_batched_nms(seed):
    """The tensor-only greedy NMS (used on CUDA) keeps exactly torchvision's boxes, in its order."""
    boxes, scores, idxs = _random_nms_case(seed, 700, 12)
    for thresh in (0.3, 0.5, 0.7):
        expected = torchvision.ops.batched_nms(
            torch.cat([boxes[:, :2], boxes[:, 2:] + 1], dim=1), scores, idxs, thresh)
        assert torch.equal(nms_ops.matrix_batched_nms_t(boxes, scores, idxs, thresh), expected)


def test_matrix_batched_nms_follows_suppression_chains():
    # a suppresses b, b would suppress c but is gone, so c stays; d is alone in its group.
    boxes = torch.tensor([[0, 0, 9, 9], [2, 0, 11, 9], [4, 0, 13, 9], [0, 0, 9, 9]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.1])
    idxs = torch.tensor([0, 0, 0, 1])
    # IoU(a, b) = 80/120, IoU(b, c) = 80/120, IoU(a, c) = 60/140
    assert nms_ops.matrix_batched_nms_t(boxes, scores, idxs, 0.5).tolist() == [0, 2, 3]


def test_matrix_batched_nms_resolves_a_chain_longer_than_its_rounds_between_checks():
    # 51 boxes, each 2 px right of the one before: neighbours overlap at IoU 80/120 > 0.5, every
    # second box at 60/140 < 0.5, so greedy NMS keeps boxes 0, 2, 4, ...: a 50-long chain.
    x = torch.arange(51, dtype=torch.float32) * 2
    boxes = torch.stack([x, torch.zeros_like(x), x + 9, torch.full_like(x, 9)], dim=1)
    scores = 1 - torch.arange(51, dtype=torch.float32) / 100
    idxs = torch.zeros(51, dtype=torch.long)
    assert nms_ops.matrix_batched_nms_t(boxes, scores, idxs, 0.5).tolist() == list(range(0, 51, 2))


def _matrix_nms(boxes, scores, idxs, thresh):
    return nms_ops.matrix_batched_nms_t(boxes, scores, idxs, nms_ops.torchvision_nms_thresh(thresh))


def test_nms_of_equal_scores_keeps_the_later_box_as_detectron():
    # Detectron's nms orders by scores.argsort()[::-1]: of equal scores the later box is taken first.
    boxes = torch.tensor([[10., 10., 109., 109.], [12., 12., 111., 111.], [300., 300., 320., 320.],
                          [0., 0., 50., 50.], [1., 1., 51., 51.], [2., 2., 52., 52.]])
    scores = torch.tensor([0.6, 0.6, 0.6, 1.0, 1.0, 1.0])
    idxs = torch.tensor([0, 0, 0, 1, 1, 1])
    assert _matrix_nms(boxes, scores, idxs, 0.3).tolist() == [5, 2, 1]
    assert nms_ops.nms_t(boxes[:3], scores[:3], 0.3).tolist() == [2, 1]


@pytest.mark.parametrize('nms', [nms_ops.batched_nms_t, _matrix_nms])
def test_nms_suppresses_an_iou_of_exactly_the_threshold_in_detectrons_arithmetic(nms):
    # (x2 - x1) + 1 sides give this pair an IoU of exactly 0.5 in float32: Detectron's kernel
    # suppresses it at NMS 0.5 (IoU >= thresh).
    boxes = torch.tensor([[331.2877, 17.7891, 448.5728, 127.5382], [370.7161, 17.7891, 488.0011, 127.5382]])
    dets = np.concatenate([boxes.numpy(), [[0.9], [0.8]]], axis=1).astype(F32)
    assert list(nms_ops.nms(dets, 0.5)) == [0]
    assert nms(boxes, torch.tensor([0.9, 0.8]), torch.tensor([0, 0]), 0.5).tolist() == [0]


@pytest.mark.parametrize('seed', range(4))
def test_cpu_batched_nms_is_detectrons_kernel_per_group(seed):
    boxes, scores, idxs = _random_nms_case(100 + seed, 600, 8)
    dets = torch.cat([boxes, scores[:, None]], dim=1).numpy()
    for thresh in (0.3, 0.7):
        expected = set()
        for g in idxs.unique().tolist():
            members = np.flatnonzero(idxs.numpy() == g)
            expected |= set(members[nms_ops.nms(dets[members], thresh)].tolist())
        kept = nms_ops.batched_nms_t(boxes, scores, idxs, thresh)
        assert set(kept.tolist()) == expected and len(kept) == len(expected)
        assert (scores[kept][:-1] >= scores[kept][1:]).all()


def _slots_of(scores, idxs, num_groups, width):
    """(num_groups, width) box indices per group by descending score, -1 after each group's boxes."""
    slots = torch.full((num_groups, width), -1, dtype=torch.long)
    for g in range(num_groups):
        members = (idxs == g).nonzero().squeeze(1)
        members = members[scores[members].argsort(descending=True)]
        slots[g, :len(members)] = members
    return slots


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('route', ['matrix', 'per-group kernel'])
def test_grouped_nms_keep_flags_the_boxes_batched_nms_keeps(seed, route, monkeypatch):
    # Each route of grouped_nms_keep (the fixed-size training proposals' NMS) against batched_nms_t;
    # 'per-group kernel' is the route of groups too wide for the bitmask and matrix ones.
    boxes, scores, idxs = _random_nms_case(seed, 400, 6)
    num_groups = int(idxs.max()) + 1
    slots = _slots_of(scores, idxs, num_groups, width=int(torch.bincount(idxs).max()) + 3)
    if route == 'per-group kernel':
        monkeypatch.setattr(nms_ops, 'MATRIX_NMS_MAX_PAIRS', 0)
    suppressed = 0
    for thresh in (0.3, 0.7):
        keep = nms_ops.grouped_nms_keep(boxes, slots, thresh)
        assert keep.shape == slots.shape and not keep[slots < 0].any()
        kept = set(slots[keep].tolist())
        assert kept == set(nms_ops.batched_nms_t(boxes, scores, idxs, thresh).tolist())
        suppressed += len(boxes) - len(kept)
    assert suppressed > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (the bitmask kernels)')
def test_grouped_nms_keep_on_cuda_equals_the_matrix_route():
    boxes, scores, idxs = _random_nms_case(7, 900, 8)
    slots = _slots_of(scores, idxs, int(idxs.max()) + 1, width=int(torch.bincount(idxs).max()))
    for thresh in (0.5, 0.7):
        expected = nms_ops.grouped_nms_keep(boxes, slots, thresh)
        assert torch.equal(nms_ops.grouped_nms_keep(boxes.cuda(), slots.cuda(), thresh).cpu(), expected)
