"""The device rasteriser segms.polys_to_masks_wrt_boxes against Detectron's pycocotools path
polys_to_mask_wrt_box, bit for bit: hand cases, random polygons and boxes, real COCO polygons."""
import json
import os

import numpy as np
import pytest
import torch

from detectron.utils import segms

COCO_TINY_TRAIN = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'shared', 'data', 'coco_tiny',
    'annotations', 'instances_train2017.json'))


def _device_masks(objects, boxes, M, device='cpu'):
    edges, polygon_edges, object_polygons = segms.packed_polygons(objects)
    edge_polygon = torch.repeat_interleave(torch.arange(len(polygon_edges)), polygon_edges)
    polygon_mask = torch.repeat_interleave(torch.arange(len(object_polygons)), object_polygons)
    boxes = torch.as_tensor(np.asarray(boxes, np.float32)).reshape(-1, 4)
    masks = segms.polys_to_masks_wrt_boxes(edges.to(device), edge_polygon.to(device), polygon_mask.to(device),
                                           boxes.to(device), M)
    assert masks.dtype == torch.bool and masks.shape == (len(objects), M, M)
    return masks.cpu().numpy()


def _reference_masks(objects, boxes, M):
    return np.stack([segms.polys_to_mask_wrt_box(o, b, M) > 0
                     for o, b in zip(objects, np.asarray(boxes, np.float32).reshape(-1, 4))])


def test_packed_polygons_close_each_polygon():
    edges, polygon_edges, object_polygons = segms.packed_polygons(
        [[[0, 0, 4, 0, 4, 3]], [[1, 1, 2, 1, 2, 2], [5, 5, 6, 5, 6, 6, 5, 6]]])
    assert edges.dtype == torch.float32 and edges.shape == (10, 4)
    assert edges[:3].tolist() == [[0, 0, 4, 0], [4, 0, 4, 3], [4, 3, 0, 0]]
    assert edges[5].tolist() == [2, 2, 1, 1] and edges[9].tolist() == [5, 6, 5, 5]
    assert polygon_edges.tolist() == [3, 3, 4] and object_polygons.tolist() == [1, 2]


def test_expand_counts_lists_each_group_s_items():
    group, rank = segms.expand_counts(torch.tensor([2, 0, 3, 1]), 6)
    assert group.tolist() == [0, 0, 2, 2, 2, 3] and rank.tolist() == [0, 1, 0, 1, 2, 0]


def test_rectangle_in_a_box_gives_the_exact_square():
    # Box 56 x 56 at (10, 20): M / w = 0.5, so x 24..52, y 34..62 map to 7..21 on both axes.
    mask = _device_masks([[[24, 34, 52, 34, 52, 62, 24, 62]]], [10, 20, 66, 76], 28)[0]
    expected = np.zeros((28, 28), bool)
    expected[7:21, 7:21] = True
    assert np.array_equal(mask, expected)


def test_triangle_matches_pycocotools_row_by_row():
    # Right triangle with its right angle at the box's top-left corner, legs 20 of the 28 pixels.
    triangle = [[0, 0, 20, 0, 0, 20]]
    mask = _device_masks([triangle], [0, 0, 28, 28], 28)[0]
    reference = _reference_masks([triangle], [0, 0, 28, 28], 28)[0]
    assert np.array_equal(mask, reference)
    # Row y holds the pixels whose centre lies strictly inside, x + y + 1 < 20: 19 - y of them.
    assert mask.sum(axis=1).tolist() == [19 - y for y in range(20)] + [0] * 8


def _random_object(rng, center, size):
    polygons = []
    for _ in range(rng.randint(1, 4)):
        k = rng.randint(3, 13)
        vertices = center + rng.randn(k, 2) * size * rng.choice([0.2, 0.6, 2.0])
        kind = rng.randint(6)
        if kind == 0:  # integer and half-integer vertices: ties on the sampling grid
            vertices = np.round(vertices * 2) / 2
        elif kind == 1:  # repeated vertices
            vertices = np.repeat(vertices, rng.randint(1, 3, size=k), axis=0)
        elif kind == 2:  # collinear runs: midpoints inserted on every edge
            vertices = np.stack([vertices, (vertices + np.roll(vertices, -1, axis=0)) / 2], 1).reshape(-1, 2)
        polygons.append(vertices.astype(np.float32).reshape(-1))
    return polygons


def _random_cases(rng, n):
    objects, boxes = [], []
    for _ in range(n):
        size = rng.choice([0.3, 3.0, 40.0, 400.0, 3000.0]) * rng.uniform(0.5, 2)
        center = rng.uniform(-2, 2, size=2) * size * rng.choice([0.1, 1.0, 10.0])  # negative coordinates too
        objects.append(_random_object(rng, center, size))
        wh = size * rng.uniform(0.05, 2.5, size=2)
        if rng.rand() < 0.15:
            wh[rng.randint(2)] = rng.uniform(0, 1)  # narrower than a pixel: the side counts as 1
        x0, y0 = center + rng.randn(2) * size * 0.5 - wh / 2
        boxes.append([x0, y0, x0 + wh[0], y0 + wh[1]])
    return objects, boxes


@pytest.mark.parametrize('M', [28, 14, 5])
def test_random_polygons_and_boxes_match_pycocotools(M):
    objects, boxes = _random_cases(np.random.RandomState(M), 1500)
    masks = _device_masks(objects, boxes, M)
    reference = _reference_masks(objects, boxes, M)
    assert np.array_equal(masks, reference)
    # The cases draw: some masks empty, some full, most partial.
    areas = reference.reshape(len(objects), -1).mean(axis=1)
    assert (areas == 0).mean() < 0.3 and ((areas > 0) & (areas < 1)).mean() > 0.5 and (areas == 1).any()


def test_vertices_on_and_just_outside_the_box_edges_match_pycocotools():
    # Upsampled coordinates around 0 and 5M in 1/20-pixel steps: the half-way ties of (int)(5x + .5),
    # and negative ones, which truncate towards zero (two edges meeting there do not share the point).
    rng = np.random.RandomState(3)
    near = np.concatenate([np.arange(-1, 1.01, 0.05), 28 + np.arange(-1, 1.01, 0.05), [7, 14.5, 21]])
    objects = [[rng.choice(near, size=2 * rng.randint(3, 8)).astype(np.float32) for _ in range(rng.randint(1, 3))]
               for _ in range(1500)]
    boxes = [[0, 0, 28, 28]] * len(objects)
    reference = _reference_masks(objects, boxes, 28)
    assert np.array_equal(_device_masks(objects, boxes, 28), reference)
    assert ((reference.sum(axis=(1, 2)) > 0).mean()) > 0.5


@pytest.mark.skipif(not os.path.isfile(COCO_TINY_TRAIN), reason=f'coco_tiny not found at {COCO_TINY_TRAIN}')
def test_coco_tiny_polygons_in_jittered_proposals_match_pycocotools():
    with open(COCO_TINY_TRAIN) as f:
        annotations = json.load(f)['annotations']
    objects = [[np.asarray(p, np.float32) for p in segms.valid_polygons(a['segmentation'])]
               for a in annotations if not a['iscrowd']]
    objects = [o for o in objects if o]
    rng = np.random.RandomState(0)
    tight = segms.polys_to_boxes(objects)
    wh = tight[:, 2:] - tight[:, :2]
    boxes = tight + rng.randn(len(tight), 4) * np.tile(wh, 2) * 0.15
    boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2])
    masks = _device_masks(objects, boxes, 28)
    assert len(objects) > 600 and np.array_equal(masks, _reference_masks(objects, boxes, 28))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_random_polygons_on_cuda_match_pycocotools():
    objects, boxes = _random_cases(np.random.RandomState(1), 3000)
    assert np.array_equal(_device_masks(objects, boxes, 28, device='cuda'), _reference_masks(objects, boxes, 28))
