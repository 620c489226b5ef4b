import numpy as np

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
