"""training_curves: the PNG's size and where the curves land, from hand-computed pixel positions.

Each panel is 800 x 500 px with a 60 px margin: x = 60 + (iter - first) / (last - first) * 680 and
y = 440 - value / max_value * 380 (value 0 on the bottom edge of the plot area, the maximum on its top).
"""
import cv2
import numpy as np

from detectron.utils.training_curves import write_training_curves

LOSS_COLOR = (200, 80, 30)  # BGR of the first series of a panel ('loss', then 'lr')
CLS_COLOR = (30, 30, 200)  # third series: 'loss' then the sorted 'loss_bbox', 'loss_cls'
WHITE = (255, 255, 255)

HISTORY = [
    {'iter': 0, 'loss': 2.0, 'loss_cls': 1.0, 'loss_bbox': 0.5, 'lr': 0.01, 'eta': '0:01:00'},
    {'iter': 20, 'loss': 1.0, 'loss_cls': 0.6, 'loss_bbox': 0.3, 'lr': 0.02, 'eta': '0:00:40'},
    {'iter': 40, 'loss': 0.5, 'loss_cls': 0.25, 'loss_bbox': 0.1, 'lr': 0.02, 'eta': '0:00:20'},
]


def _has_color_near(image, x, y, color, radius=1):
    patch = image[y - radius:y + radius + 1, x - radius:x + radius + 1]
    return bool((patch == np.array(color, np.uint8)).all(axis=2).any())


def test_png_size_and_curve_pixels(tmp_path):
    path = tmp_path / 'training_curves.png'
    write_training_curves(str(path), HISTORY)
    image = cv2.imread(str(path))
    assert image.shape == (1000, 800, 3)  # loss panel above the lr panel
    # loss: (0, 2.0) -> (60, 60), (20, 1.0) -> (400, 250), (40, 0.5) -> (740, 345); midpoints of the segments:
    assert _has_color_near(image, 230, 155, LOSS_COLOR)
    assert _has_color_near(image, 570, 297, LOSS_COLOR)
    # loss_cls: (0, 1.0) -> (60, 250), (20, 0.6) -> (400, 326); midpoint (230, 288).
    assert _has_color_near(image, 230, 288, CLS_COLOR)
    # Above the curves near the last iteration the plot is empty (the loss is at y = 334 for x = 700).
    assert tuple(image[250, 700]) == WHITE
    # lr panel (rows 500..999), max 0.02: (0, 0.01) -> (60, 750), then flat at 0.02 along y = 560 from x = 400.
    assert _has_color_near(image, 230, 655, LOSS_COLOR)
    assert _has_color_near(image, 570, 560, LOSS_COLOR)
    assert tuple(image[900, 570]) == WHITE


def test_single_entry_draws_axes_without_a_curve(tmp_path):
    path = tmp_path / 'one.png'
    write_training_curves(str(path), HISTORY[:1])
    image = cv2.imread(str(path))
    assert image.shape == (1000, 800, 3)
    plot_area = image[62:438, 62:738]  # inside the loss panel's frame, below the legend
    assert not (plot_area == np.array(LOSS_COLOR, np.uint8)).all(axis=2)[40:].any()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['one.png']  # no temporary file left
