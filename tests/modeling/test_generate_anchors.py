import math

import numpy as np
import pytest

from detectron.modeling.generate_anchors import generate_anchors

# Per-cell FPN RPN anchors (level l: stride 2^l, size 32 * 2^(l-2), ratios 0.5, 1, 2), verified by
# running Detectron's generate_anchors (reference notes, detectron.md section 5).
FPN_LEVEL_ANCHORS = {
    2: [[-22, -10, 25, 13], [-14, -14, 17, 17], [-10, -22, 13, 25]],
    3: [[-40, -20, 47, 27], [-28, -28, 35, 35], [-20, -44, 27, 51]],
    4: [[-84, -40, 99, 55], [-56, -56, 71, 71], [-36, -80, 51, 95]],
    5: [[-164, -72, 195, 103], [-112, -112, 143, 143], [-76, -168, 107, 199]],
    6: [[-332, -152, 395, 215], [-224, -224, 287, 287], [-148, -328, 211, 391]],
}


@pytest.mark.parametrize('level', sorted(FPN_LEVEL_ANCHORS))
def test_fpn_level_anchors_match_detectron(level):
    anchors = generate_anchors(stride=2 ** level, sizes=(32 * 2 ** (level - 2),),
                               aspect_ratios=(0.5, 1, 2))
    np.testing.assert_array_equal(anchors, np.array(FPN_LEVEL_ANCHORS[level], dtype=np.float64))


def _anchors_by_loops(stride, sizes, ratios):
    """Step-by-step transcription of Detectron's enumeration: reshape the base window per ratio
    (rounded sides), then scale each reshaped window per size, about the window centre."""
    center = (stride - 1) / 2.0
    out = []
    for ratio in ratios:
        w = float(np.round(math.sqrt(stride * stride / ratio)))
        h = float(np.round(w * ratio))
        for size in sizes:
            sw, sh = w * size / stride, h * size / stride
            out.append([center - (sw - 1) / 2, center - (sh - 1) / 2,
                        center + (sw - 1) / 2, center + (sh - 1) / 2])
    return np.array(out)


@pytest.mark.parametrize('stride, sizes, ratios', [
    (16, (32, 64, 128, 256, 512), (0.5, 1, 2)),   # Detectron's defaults (C4 RPN)
    (16, (64, 128, 256, 512), (0.5, 1, 2)),       # RPN.SIZES default
    (8, (24, 40), (0.25, 1.5, 3)),
    (6, (10,), (0.5,)),                           # sqrt(72) = 8.49 -> 8 (round), h = 4
])
def test_anchors_match_loop_transcription(stride, sizes, ratios):
    anchors = generate_anchors(stride, sizes, ratios)
    assert anchors.shape == (len(sizes) * len(ratios), 4)
    np.testing.assert_allclose(anchors, _anchors_by_loops(stride, sizes, ratios), rtol=0, atol=1e-12)


def test_default_anchor_hand_values():
    # Ratio 0.5 with stride 16: w = round(sqrt(512)) = round(22.63) = 23, h = round(11.5) = 12
    # (half to even), centre 7.5; size 32 doubles both: 46 x 24 -> [-15, -4, 30, 19].
    anchors = generate_anchors()
    np.testing.assert_array_equal(anchors[0], [-15.0, -4.0, 30.0, 19.0])
    # Ratio 1, size 32: 32 x 32 around 7.5.
    np.testing.assert_array_equal(anchors[5], [-8.0, -8.0, 23.0, 23.0])
    # Ratio 2 is the transpose of ratio 0.5: w = round(sqrt(128)) = 11, h = 22; size 512 -> 352 x 704.
    np.testing.assert_array_equal(anchors[14], [-168.0, -344.0, 183.0, 359.0])
