"""Draw the training-loss and learning-rate curves into a PNG with OpenCV (no plotting dependency)."""
import os

import cv2
import numpy as np

_WIDTH, _HEIGHT, _MARGIN = 800, 500, 60
_COLORS = [(200, 80, 30), (40, 150, 40), (30, 30, 200), (150, 40, 150), (20, 160, 200)]


def _to_pixels(xs, ys, x_range, y_range):
    x0, x1 = x_range
    y0, y1 = y_range
    px = _MARGIN + (np.asarray(xs, np.float64) - x0) / max(x1 - x0, 1e-12) * (_WIDTH - 2 * _MARGIN)
    py = _HEIGHT - _MARGIN - (np.asarray(ys, np.float64) - y0) / max(y1 - y0, 1e-12) * (_HEIGHT - 2 * _MARGIN)
    return np.stack([px, py], axis=1).round().astype(np.int32)


def draw_curves(iters, series, title):
    """Return a BGR image plotting each named series (same length as iters) against iteration."""
    canvas = np.full((_HEIGHT, _WIDTH, 3), 255, np.uint8)
    finite = [np.asarray(v, np.float64) for v in series.values()]
    finite = np.concatenate([v[np.isfinite(v)] for v in finite]) if finite else np.zeros(0)
    y_range = (0.0, float(finite.max()) if finite.size else 1.0)
    x_range = (float(min(iters)), float(max(iters))) if len(iters) else (0.0, 1.0)
    cv2.rectangle(canvas, (_MARGIN, _MARGIN), (_WIDTH - _MARGIN, _HEIGHT - _MARGIN), (0, 0, 0), 1)
    for i, (name, values) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        if len(iters) > 1:
            cv2.polylines(canvas, [_to_pixels(iters, values, x_range, y_range)], False, color, 2)
        cv2.putText(canvas, name, (_MARGIN + 10, _MARGIN + 20 + 20 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.5, color, 1)
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(canvas, title, (_MARGIN, _MARGIN - 20), font, 0.6, (0, 0, 0), 1)
    cv2.putText(canvas, '{:g}'.format(y_range[1]), (5, _MARGIN + 5), font, 0.4, (0, 0, 0), 1)
    cv2.putText(canvas, '0', (5, _HEIGHT - _MARGIN), font, 0.4, (0, 0, 0), 1)
    cv2.putText(canvas, 'iter {:g}'.format(x_range[0]), (_MARGIN, _HEIGHT - _MARGIN + 20), font, 0.4, (0, 0, 0), 1)
    cv2.putText(canvas, 'iter {:g}'.format(x_range[1]), (_WIDTH - _MARGIN - 80, _HEIGHT - _MARGIN + 20),
                font, 0.4, (0, 0, 0), 1)
    return canvas


def write_training_curves(path, history):
    """history: list of json_stats dicts (iter, loss, lr, ...). Writes loss and lr panels stacked."""
    iters = [h['iter'] for h in history]
    loss_keys = ['loss'] + sorted(k for k in history[0] if k in ('loss_cls', 'loss_bbox')) if history else ['loss']
    losses = {k: [float(h.get(k, np.nan)) for h in history] for k in loss_keys}
    lrs = {'lr': [float(h['lr']) for h in history]}
    image = np.concatenate([draw_curves(iters, losses, 'training loss'),
                            draw_curves(iters, lrs, 'learning rate')], axis=0)
    tmp = path + '.tmp.png'
    cv2.imwrite(tmp, image)
    os.replace(tmp, path)
