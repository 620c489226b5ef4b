import numpy as np
import pycocotools.mask as mask_util

from detectron.utils.vis import convert_from_cls_format, vis_one_image


def test_convert_from_cls_format_collects_classes():
    cls_boxes = [[], np.array([[0, 0, 9, 9, 0.9]], np.float32), [],
                 np.array([[1, 1, 5, 5, 0.3], [2, 2, 8, 8, 0.7]], np.float32)]
    boxes, classes = convert_from_cls_format(cls_boxes)
    assert boxes.shape == (3, 5)
    assert classes.tolist() == [1, 3, 3]
    np.testing.assert_allclose(boxes[:, 4], [0.9, 0.3, 0.7], rtol=1e-6)


def test_vis_draws_only_boxes_above_threshold():
    im = np.zeros((40, 40, 3), np.uint8)
    cls_boxes = [[], np.array([[20, 20, 35, 35, 0.9]], np.float32), np.array([[2, 2, 10, 10, 0.1]], np.float32)]
    out = vis_one_image(im, cls_boxes, ['__background__', 'a', 'b'], thresh=0.5)
    assert out[35, 27].any()          # bottom edge of the kept box is drawn
    assert not out[6, 2].any()        # the low-score box is not
    assert not im.any()               # input untouched


def test_vis_blends_and_outlines_the_masks_of_drawn_detections():
    im = np.full((60, 60, 3), 100, np.uint8)
    kept, dropped = np.zeros((60, 60), np.uint8), np.zeros((60, 60), np.uint8)
    kept[10:40, 12:44] = 1
    dropped[45:58, 2:20] = 1
    cls_boxes = [[], np.array([[12, 10, 43, 39, 0.9]], np.float32), np.array([[2, 45, 19, 57, 0.2]], np.float32)]
    cls_segms = [[], [mask_util.encode(np.asfortranarray(kept))], [mask_util.encode(np.asfortranarray(dropped))]]
    out = vis_one_image(im, cls_boxes, ['__background__', 'a', 'b'], thresh=0.5, cls_segms=cls_segms)
    # Inside the kept mask, away from its outline and label: 0.6 * 100 + 0.4 * the first colour (189, 114, 0).
    assert out[30, 30].tolist() == [int(60 + 0.4 * 189), int(60 + 0.4 * 114), 60]
    assert out[10, 30].tolist() != out[30, 30].tolist()  # the outline on the mask's top row
    assert (out[50, 5:15] == 100).all()  # the low-score detection's mask is not drawn
    assert (out[50:59, 50:59] == 100).all()
