"""Detectron's anchor (reference box) enumeration for one feature-map cell.

Anchors are centred on the cell's base window (0, 0, stride - 1, stride - 1). For each aspect
ratio r (height / width) the base window is first reshaped to an integer width round(sqrt(A / r))
and height round(width * r) (A = stride^2, np.round rounds half to even), and that shape is then
scaled to every requested size. These roundings are why FPN anchors are not exact multiples of
their sizes; Detectron-trained RPN weights expect exactly these boxes.
"""
import numpy as np


def generate_anchors(stride=16, sizes=(32, 64, 128, 256, 512), aspect_ratios=(0.5, 1, 2)):
    """(len(aspect_ratios) * len(sizes), 4) float64 anchors (x1, y1, x2, y2), ratio-major order."""
    scales = np.asarray(sizes, dtype=float).reshape(-1) / stride  # one size or several (C4)
    ratios = np.asarray(aspect_ratios, dtype=float)
    base_area = float(stride * stride)
    ratio_widths = np.round(np.sqrt(base_area / ratios))
    ratio_heights = np.round(ratio_widths * ratios)
    widths = np.outer(ratio_widths, scales).ravel()
    heights = np.outer(ratio_heights, scales).ravel()
    return _boxes_around_center(widths, heights, center=0.5 * (stride - 1))


def _boxes_around_center(widths, heights, center):
    """Boxes of +1 side lengths widths x heights whose centre is (center, center)."""
    half_w = 0.5 * (widths - 1)
    half_h = 0.5 * (heights - 1)
    return np.stack([center - half_w, center - half_h, center + half_w, center + half_h], axis=1)
