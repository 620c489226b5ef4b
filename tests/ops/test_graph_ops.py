"""ops/graph_ops.py: the export-friendly ops equal the eager ones they stand in for."""
import pytest
import torch

from detectron.modeling import rcnn_inference, rpn_heads
from detectron.ops import graph_ops
from detectron.ops import nms as nms_ops
from detectron.ops.roi_pooling import roi_feature_transform


def _integer_boxes(seed, n, groups, score_levels=None):
    """Integer boxes (exact IoUs, some exactly at a threshold), group ids and scores: distinct, or
    with ties when score_levels is given."""
    gen = torch.Generator().manual_seed(seed)
    xy = torch.randint(0, 60, (n, 2), generator=gen).float()
    boxes = torch.cat([xy, xy + torch.randint(4, 30, (n, 2), generator=gen).float()], dim=1)
    if score_levels:
        scores = torch.randint(0, score_levels, (n,), generator=gen).float() / score_levels
    else:
        scores = torch.randperm(n, generator=gen).float() / n
    return boxes, scores, torch.randint(0, groups, (n,), generator=gen)


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('thresh', [0.3, 0.5, 0.7])
def test_batched_nms_equals_detectrons_kernel(seed, thresh):
    """Same kept boxes in the same order as batched_nms_t's CPU route, Detectron's Cython kernel
    per group (distinct scores: the kernel visits equal scores in numpy's unstable sort order)."""
    boxes, scores, groups = _integer_boxes(seed, 300, 5)
    expected = nms_ops.batched_nms_t(boxes, scores, groups, thresh)
    assert torch.equal(graph_ops.batched_nms(boxes, scores, groups, thresh), expected)


@pytest.mark.parametrize('seed', range(3))
def test_batched_nms_visits_equal_scores_later_first(seed):
    """With ties, the result of nms_t (later box first among equal scores) run group by group."""
    boxes, scores, groups = _integer_boxes(seed, 200, 4, score_levels=6)
    kept = []
    for g in range(4):
        rows = (groups == g).nonzero().squeeze(1)
        kept.append(rows[nms_ops.nms_t(boxes[rows], scores[rows], 0.5)])
    kept = torch.cat(kept).sort().values
    expected = kept[nms_ops._descending_later_first(scores[kept])]
    assert torch.equal(graph_ops.batched_nms(boxes, scores, groups, 0.5), expected)


def test_batched_nms_suppresses_at_the_threshold_and_takes_no_boxes():
    # IoU of [0,0,9,9] and [0,0,9,19] (+1 sides) is exactly 100 / 200: suppressed at 0.5, kept above.
    boxes = torch.tensor([[0., 0., 9., 9.], [0., 0., 9., 19.]])
    scores = torch.tensor([0.9, 0.8])
    groups = torch.zeros(2, dtype=torch.int64)
    assert graph_ops.batched_nms(boxes, scores, groups, 0.5).tolist() == [0]
    assert graph_ops.batched_nms(boxes, scores, groups, 0.51).tolist() == [0, 1]
    assert graph_ops.batched_nms(boxes, scores, groups + torch.tensor([0, 1]), 0.5).tolist() == [0, 1]
    empty = graph_ops.batched_nms(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64), 0.5)
    assert empty.shape == (0,)


@pytest.mark.parametrize('n', [1, 3, 50])
def test_top_n_per_group_equals_the_sorting_version(n):
    gen = torch.Generator().manual_seed(n)
    scores = torch.rand(200, generator=gen)
    groups = torch.randint(0, 5, (200,), generator=gen)
    order = scores.argsort(descending=True)
    expected = set(rpn_heads._top_n_per_group(scores, groups, n).tolist())
    kept = order[graph_ops.top_n_per_group(groups[order], 5, n)]
    assert set(kept.tolist()) == expected


@pytest.mark.parametrize('count,cap', [(30, 100), (150, 100), (150, 0), (7, 7)])
def test_limit_detections_equals_the_cap(count, cap):
    gen = torch.Generator().manual_seed(count)
    scores = torch.randint(0, 40, (count,), generator=gen).float() / 40  # ties at the cut
    dets = torch.cat([torch.zeros(count, 4), scores[:, None]], dim=1)
    classes = torch.arange(count)
    _, kept_classes = rcnn_inference._limit_detections_t(dets, classes, cap)
    assert torch.equal(graph_ops.limit_detections(scores, cap).nonzero().squeeze(1), kept_classes)


def test_multilevel_roi_align_equals_roi_feature_transform():
    """Every RoI on its FPN level, in RoI order, as the eager transform; one level gets no RoI."""
    gen = torch.Generator().manual_seed(0)
    features = [torch.randn(1, 3, 64 // 2 ** k, 96 // 2 ** k, generator=gen) for k in range(4)]
    xy = torch.rand(40, 2, generator=gen) * 200
    sides = torch.cat([torch.rand(20, 2, generator=gen) * 20, 100 + torch.rand(20, 2, generator=gen) * 150])
    rois = torch.cat([torch.zeros(40, 1), xy, xy + sides], dim=1)
    scales = (1 / 4, 1 / 8, 1 / 16, 1 / 32)
    expected = roi_feature_transform(features, rois, scales, output_size=7, sampling_ratio=2)
    got = graph_ops.multilevel_roi_align(features, rois, scales, 7, 2, 224, 4)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
