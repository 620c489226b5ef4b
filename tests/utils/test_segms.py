"""COCO segmentation helpers (Detectron's utils/segms.py) against hand-computed masks."""
import numpy as np
import pycocotools.mask as mask_util

from detectron.utils import segms


def test_rectangle_polygon_in_a_box_gives_the_expected_square():
    # Box 56 x 56 at (10, 20): M / w = 0.5, so the rectangle x 24..52, y 34..62 maps to 7..21 on both axes.
    box = np.array([10, 20, 66, 76], np.float32)
    mask = segms.polys_to_mask_wrt_box([[24, 34, 52, 34, 52, 62, 24, 62]], box, 28)
    expected = np.zeros((28, 28), np.float32)
    expected[7:21, 7:21] = 1
    assert mask.dtype == np.float32 and np.array_equal(mask, expected)


def test_polygons_are_united_and_clipped_to_the_box():
    box = np.array([0, 0, 28, 14], np.float32)  # x scale 1, y scale 2
    polygons = [[0, 0, 4, 0, 4, 2, 0, 2], [2, 1, 6, 1, 6, 3, 2, 3], [20, 10, 40, 10, 40, 20, 20, 20]]
    mask = segms.polys_to_mask_wrt_box(polygons, box, 28)
    expected = np.zeros((28, 28), np.float32)
    expected[0:4, 0:4] = 1
    expected[2:6, 2:6] = 1
    expected[20:28, 20:28] = 1  # the part inside the box
    assert np.array_equal(mask, expected)


def test_polys_to_boxes_takes_the_extremes_over_all_polygons():
    boxes = segms.polys_to_boxes([[[1, 5, 3, 2, 7, 9]], [[0, 0, 1, 1, 2, 0], [10.5, 4, 11, 6, 9, 8]]])
    assert boxes.dtype == np.float32
    assert boxes.tolist() == [[1, 2, 7, 9], [0, 0, 11, 8]]


def test_flip_mirrors_polygons_and_rle():
    width, height = 10, 4
    mask = np.zeros((height, width), np.uint8)
    mask[1:3, 0:2] = 1
    rle = mask_util.encode(np.asfortranarray(mask))
    flipped_poly, flipped_rle = segms.flip_segms([[[0, 1, 2, 1, 2, 3]], rle], height, width)
    assert flipped_poly == [[9, 1, 7, 1, 7, 3]]
    assert np.array_equal(mask_util.decode(flipped_rle), mask[:, ::-1])


def test_short_polygons_are_dropped_and_rle_kept():
    assert segms.valid_polygons([[1, 2, 3, 4], [0, 0, 1, 0, 1, 1]]) == [[0, 0, 1, 0, 1, 1]]
    rle = {'size': [2, 2], 'counts': [0, 4]}
    assert segms.valid_polygons(rle) is rle
