"""The skeleton drawn by vis_one_image (Detectron's vis_keypoints): edges between keypoints whose logit passes
the threshold, nothing for the others."""
import numpy as np

from detectron.utils.keypoints import get_keypoints
from detectron.utils.vis import vis_one_image

NAMES = get_keypoints()[0]


def test_only_edges_between_confident_keypoints_are_drawn():
    kps = np.zeros((4, 17), np.float32)
    kps[0], kps[1] = 5, 5  # every unnamed keypoint piled at (5, 5), logit 0: not drawn
    for name, (x, y) in {'left_shoulder': (30, 60), 'right_shoulder': (70, 60), 'left_hip': (30, 90)}.items():
        kps[:2, NAMES.index(name)] = (x, y)
        kps[2, NAMES.index(name)] = 5.0 if name != 'left_hip' else 1.0  # the hip under the threshold of 2
    im = np.zeros((100, 100, 3), np.uint8)
    cls_boxes = [np.zeros((0, 5), np.float32), np.array([[20, 40, 80, 95, 0.9]], np.float32)]
    out = vis_one_image(im, cls_boxes, ['bg', 'person'], thresh=0.5, cls_keyps=[[], [kps]])
    assert out[60, 50].any()  # on the shoulder-shoulder edge
    assert not out[75, 30].any()  # the shoulder-hip edge: the hip is not confident
    assert not out[5, 5].any()
    # Without keypoints the same detection leaves the edge's pixels alone.
    assert not vis_one_image(im, cls_boxes, ['bg', 'person'], thresh=0.5)[60, 50].any()
