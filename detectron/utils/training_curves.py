"""Draw the training-loss and learning-rate curves into a PNG with OpenCV (no plotting dependency).

800 x 500 panels, stacked: the losses against the iteration on linear axes from 0 (with the validation
loss, when evaluated, as dots), the learning rate on a log-scale axis (warm-up and steps span decades),
and, when the model was evaluated during training, its AP values. Both axes carry ticks at round
values with their labels, and the axis names say what is plotted.
"""
import math

import cv2
import numpy as np

from detectron.utils.io import _write_atomically

_WIDTH, _HEIGHT = 800, 500
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 30, 50, 60  # margins around the plot area
_TICK = 6  # tick length in pixels, outside the plot area
_COLORS = [(200, 80, 30), (40, 150, 40), (30, 30, 200), (150, 40, 150), (20, 160, 200)]
_BLACK, _GRID = (0, 0, 0), (225, 225, 225)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def nice_ticks(low, high, target=5):
    """Round tick values (1, 2 or 5 x 10^k apart) covering [low, high] with about `target` steps."""
    if not high > low:
        return [low]
    raw = (high - low) / target
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step - 1e-9)
    return [round(i * step, 12) for i in range(first, int(math.floor(high / step + 1e-9)) + 1)]


def log_ticks(low_decade, high_decade):
    """1, 2 and 5 x 10^k between two decades (only the decades when they are more than 3 apart)."""
    multiples = (1, 2, 5) if high_decade - low_decade <= 3 else (1,)
    return [m * 10.0 ** d for d in range(low_decade, high_decade + 1) for m in multiples
            if m * 10.0 ** d <= 10.0 ** high_decade * (1 + 1e-9)]


class _Axes:
    """Maps (iteration, value) to pixels of one panel; `log` maps log10 of the value."""

    def __init__(self, x_range, y_range, log=False):
        self.x_range, self.y_range, self.log = x_range, y_range, log

    def x(self, iters):
        x0, x1 = self.x_range
        return _LEFT + (np.asarray(iters, np.float64) - x0) / max(x1 - x0, 1e-12) * (_WIDTH - _LEFT - _RIGHT)

    def y(self, values):
        values = np.asarray(values, np.float64)
        y0, y1 = self.y_range
        if self.log:
            values, y0, y1 = np.log10(values), math.log10(y0), math.log10(y1)
        return _HEIGHT - _BOTTOM - (values - y0) / max(y1 - y0, 1e-12) * (_HEIGHT - _TOP - _BOTTOM)


def _finite_runs(xs, ys):
    """Pixel polylines through consecutive drawable points (NaN, inf and, on log axes, <= 0 break them)."""
    runs, run = [], []
    for x, y in zip(xs, ys):
        if np.isfinite(x) and np.isfinite(y):
            run.append((x, y))
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return [np.round(np.array(r)).astype(np.int32) for r in runs]


def _text(canvas, text, x, y, scale=0.45, color=_BLACK, align='left'):
    (width, _), _ = cv2.getTextSize(text, _FONT, scale, 1)
    x = {'left': x, 'right': x - width, 'center': x - width // 2}[align]
    cv2.putText(canvas, text, (int(x), int(y)), _FONT, scale, color, 1, cv2.LINE_AA)


def _draw_frame(canvas, axes, x_ticks, y_ticks, y_label, title):
    bottom, right = _HEIGHT - _BOTTOM, _WIDTH - _RIGHT
    for tick in x_ticks:
        x = int(round(float(axes.x(tick))))
        cv2.line(canvas, (x, _TOP), (x, bottom), _GRID, 1)
        cv2.line(canvas, (x, bottom), (x, bottom + _TICK), _BLACK, 1)
        _text(canvas, '{:g}'.format(tick), x, bottom + _TICK + 16, align='center')
    for tick in y_ticks:
        y = int(round(float(axes.y(tick))))
        cv2.line(canvas, (_LEFT, y), (right, y), _GRID, 1)
        cv2.line(canvas, (_LEFT - _TICK, y), (_LEFT, y), _BLACK, 1)
        _text(canvas, '{:g}'.format(tick), _LEFT - _TICK - 4, y + 5, align='right')
    cv2.rectangle(canvas, (_LEFT, _TOP), (right, bottom), _BLACK, 1)
    _text(canvas, 'iteration', (_LEFT + right) // 2, _HEIGHT - 12, 0.5, align='center')
    _text(canvas, y_label, 10, _TOP - 10, 0.5)
    _text(canvas, title, (_LEFT + right) // 2, 22, 0.6, align='center')


def draw_curves(iters, series, title, y_label, log=False, points=None):
    """Return a BGR panel plotting each named series (as long as iters) against the iteration, and
    each series of points ({name: (iterations, values)}, e.g. evaluations) as dots joined by lines."""
    points = points or {}
    canvas = np.full((_HEIGHT, _WIDTH, 3), 255, np.uint8)
    all_iters = list(iters) + [it for xs, _ in points.values() for it in xs]
    x_range = (float(min(all_iters)), float(max(all_iters))) if all_iters else (0.0, 1.0)
    if x_range[1] == x_range[0]:
        x_range = (x_range[0], x_range[0] + 1.0)
    values = np.concatenate([np.asarray(v, np.float64) for v in series.values()]
                            + [np.asarray(ys, np.float64) for _, ys in points.values()]) \
        if series or points else np.zeros(0)
    drawable = values[np.isfinite(values) & ((values > 0) if log else True)]
    if log:
        decades = (math.floor(math.log10(drawable.min())), math.ceil(math.log10(drawable.max()))) \
            if drawable.size else (-3, -2)
        decades = (decades[0], max(decades[1], decades[0] + 1))
        axes = _Axes(x_range, (10.0 ** decades[0], 10.0 ** decades[1]), log=True)
        y_ticks = log_ticks(*decades)
    else:
        top = float(drawable.max()) if drawable.size and drawable.max() > 0 else 1.0
        y_ticks = nice_ticks(0.0, top)
        if y_ticks[-1] < top * (1 - 1e-9):  # end the axis on the first tick above the maximum
            y_ticks.append(round(y_ticks[-1] + (y_ticks[1] - y_ticks[0]), 12))
        axes = _Axes(x_range, (0.0, y_ticks[-1]))
    _draw_frame(canvas, axes, nice_ticks(*x_range), y_ticks, y_label, title)
    lines = [(name, iters, ys, False) for name, ys in series.items()]
    lines += [(name, xs, ys, True) for name, (xs, ys) in points.items()]
    for i, (name, xs, ys, dots) in enumerate(lines):
        color = _COLORS[i % len(_COLORS)]
        ys = np.asarray(ys, np.float64)
        if log:
            ys = np.where(ys > 0, ys, np.nan)
        with np.errstate(invalid='ignore', divide='ignore'):
            runs = _finite_runs(axes.x(xs), axes.y(ys))
        cv2.polylines(canvas, [r for r in runs if len(r) > 1], False, color, 2)
        for x, y in (np.concatenate(runs) if dots and runs else []):
            cv2.circle(canvas, (int(x), int(y)), 4, color, -1, cv2.LINE_AA)
        _text(canvas, name, _WIDTH - _RIGHT - 130, _TOP + 20 + 20 * i, 0.5, color)
    return canvas


def write_training_curves(path, history):
    """history: list of json_stats dicts: training lines (iter, loss, lr, ...) and evaluation lines
    (iter, val/loss, bbox/AP, ...). Writes the loss panel (validation losses as dots), the learning
    rate panel and, when the history holds AP values, an evaluation panel, stacked."""
    training = [h for h in history if 'lr' in h]
    evaluations = [h for h in history if 'lr' not in h]
    iters = [h['iter'] for h in training]
    loss_keys = ['loss'] + sorted(k for k in training[0] if k in ('loss_cls', 'loss_bbox')) if training else ['loss']
    losses = {k: [float(h.get(k, np.nan)) for h in training] for k in loss_keys}
    lrs = {'lr': [float(h['lr']) for h in training]}
    panels = [draw_curves(iters, losses, 'training loss', 'loss', points=_evaluated(evaluations, ('val/loss',))),
              draw_curves(iters, lrs, 'learning rate', 'learning rate (log scale)', log=True)]
    ap_keys = sorted({k for h in evaluations for k in h if k.endswith('/AP')})
    if ap_keys:
        panels.append(draw_curves([], {}, 'evaluation', 'AP', points=_evaluated(evaluations, ap_keys)))
    image = np.concatenate(panels, axis=0)
    ok, png = cv2.imencode('.png', image)
    _write_atomically(path, lambda f: f.write(png.tobytes()))


def _evaluated(evaluations, keys):
    """{key: (iterations, values)} of the evaluation lines holding each key."""
    series = {key: ([h['iter'] for h in evaluations if key in h], [float(h[key]) for h in evaluations if key in h])
              for key in keys}
    return {key: xs_ys for key, xs_ys in series.items() if xs_ys[0]}
