"""training_curves: the PNG's size, where curves and ticks land (hand-computed pixel positions).

Each panel is 800 x 500 px; the plot area spans x 80..770 and y 50..440, so x = 80 + (iter - first) /
(last - first) * 690. Loss panel: linear from 0 to the first round tick at or above the maximum,
y = 440 - value / top * 390. Learning-rate panel (rows 500..999): log scale between whole decades,
y = 440 - (log10(lr) - low decade) / (high - low decade) * 390.
"""
import math

import cv2
import numpy as np
import pytest

from detectron.utils.training_curves import log_ticks, nice_ticks, write_training_curves

LOSS_COLOR = (200, 80, 30)  # BGR of the first series of a panel ('loss', then 'lr')
CLS_COLOR = (30, 30, 200)  # third series: 'loss' then the sorted 'loss_bbox', 'loss_cls'
WHITE, BLACK = (255, 255, 255), (0, 0, 0)

HISTORY = [
    {'iter': 0, 'loss': 2.0, 'loss_cls': 1.0, 'loss_bbox': 0.5, 'lr': 0.01, 'eta': '0:01:00'},
    {'iter': 20, 'loss': 1.0, 'loss_cls': 0.6, 'loss_bbox': 0.3, 'lr': 0.02, 'eta': '0:00:40'},
    {'iter': 40, 'loss': 0.5, 'loss_cls': 0.25, 'loss_bbox': 0.1, 'lr': 0.02, 'eta': '0:00:20'},
]


def _has_color_near(image, x, y, color, radius=1):
    patch = image[y - radius:y + radius + 1, x - radius:x + radius + 1]
    return bool((patch == np.array(color, np.uint8)).all(axis=2).any())


def _has_text(image, x0, x1, y0, y1):
    return bool((image[y0:y1, x0:x1] < 128).all(axis=2).any())


def test_nice_and_log_ticks():
    assert nice_ticks(0.0, 2.0) == [0.0, 0.5, 1.0, 1.5, 2.0]  # 2.0 / 5 = 0.4 -> step 0.5
    assert nice_ticks(0.0, 2.3) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert nice_ticks(0, 90000) == [0, 20000, 40000, 60000, 80000]  # 18000 -> step 20000
    assert nice_ticks(3, 3) == [3]
    assert log_ticks(-2, -1) == pytest.approx([0.01, 0.02, 0.05, 0.1])
    assert log_ticks(-6, -1) == pytest.approx([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1])  # decades only


def test_png_size_curves_and_ticks(tmp_path):
    path = tmp_path / 'training_curves.png'
    write_training_curves(str(path), HISTORY)
    image = cv2.imread(str(path))
    assert image.shape == (1000, 800, 3)  # loss panel above the lr panel
    # loss, axis 0..2: (0, 2.0) -> (80, 50), (20, 1.0) -> (425, 245), (40, 0.5) -> (770, 342.5); midpoints:
    assert _has_color_near(image, 252, 147, LOSS_COLOR)
    assert _has_color_near(image, 597, 294, LOSS_COLOR)
    # loss_cls: (0, 1.0) -> (80, 245), (20, 0.6) -> (425, 323); midpoint (252.5, 284).
    assert _has_color_near(image, 252, 284, CLS_COLOR)
    assert tuple(image[200, 700]) == WHITE  # above the curves, off the grid
    # Ticks below the x axis at iterations 0, 10, ..., 40 (step 10) and left of the y axis at 0, 0.5, ..., 2.
    for x in (80, 425, 770):
        assert tuple(image[444, x]) == BLACK
    assert tuple(image[444, 340]) == WHITE  # between ticks
    for y in (440, 342, 245, 50):
        assert tuple(image[y, 76]) == BLACK
        assert _has_text(image, 0, 72, y - 8, y + 8)  # its label
    assert _has_text(image, 380, 470, 470, 495)  # 'iteration' under the axis
    # lr panel, log scale over the decade 0.01..0.1: 0.01 -> y 940, 0.02 -> 940 - log10(2) * 390 = 822.6.
    assert _has_color_near(image, 252, 881, LOSS_COLOR)
    assert _has_color_near(image, 597, 823, LOSS_COLOR)
    assert tuple(image[900, 650]) == WHITE
    y_005 = int(round(940 - math.log10(5) * 390))  # the 0.05 tick
    assert tuple(image[y_005, 76]) == BLACK and _has_text(image, 0, 72, y_005 - 8, y_005 + 8)


def test_single_entry_draws_axes_without_a_curve(tmp_path):
    path = tmp_path / 'one.png'
    write_training_curves(str(path), HISTORY[:1])
    image = cv2.imread(str(path))
    assert image.shape == (1000, 800, 3)
    plot_area = image[120:438, 82:768]  # inside the loss panel's frame, below the legend
    assert not (plot_area == np.array(LOSS_COLOR, np.uint8)).all(axis=2).any()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['one.png']  # no temporary file left


def test_non_finite_losses_and_zero_learning_rates_only_break_the_curves(tmp_path):
    history = [dict(entry) for entry in HISTORY] + [{'iter': 60, 'loss': 0.4, 'loss_cls': 0.2, 'loss_bbox': 0.1,
                                                     'lr': 0.0}]
    history[1]['loss'] = float('nan')
    path = tmp_path / 'curves.png'
    write_training_curves(str(path), history)
    image = cv2.imread(str(path))
    # x = 80 + iter / 60 * 690; the loss runs only from iteration 40 (x 540, y 342.5) to 60 (x 770, y 362).
    assert _has_color_near(image, 655, 352, LOSS_COLOR)
    assert not _has_color_near(image, 195, 147, LOSS_COLOR, radius=3)  # no segment through the NaN
    # lr 0 at iteration 60 cannot be drawn on a log axis: the lr curve ends at iteration 40 (x 540).
    assert _has_color_near(image, 400, 823, LOSS_COLOR) and not _has_color_near(image, 700, 823, LOSS_COLOR, 3)
