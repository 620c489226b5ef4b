"""What CenterNet (ctdet, "Objects as Points") trains on, and how it prepares a test image.

Numerics follow CenterNet's src/lib/utils/image.py, datasets/sample/ctdet.py, datasets/dataset/coco.py
and detectors/base_detector.py:
gaussian radius and splats, the centre/scale affine transform, colour jitter, the per-image training
targets (hm, wh, reg, ind, reg_mask), a roidb of all images and annotations of COCO json datasets,
and the test-time input tensor with its meta (c, s, output size).

All functions take plain arguments; a builder fills CtdetParams from cfg.CENTERNET.
"""

import dataclasses
import functools
import math

import cv2
import numpy as np

from detectron.datasets.json_dataset import JsonDataset
from detectron.utils.errors import DatasetError

# COCO colour statistics (BGR, images scaled to [0, 1]) and PCA lighting basis of CenterNet's coco.py.
COCO_MEAN = (0.40789654, 0.44719302, 0.47026115)
COCO_STD = (0.28863828, 0.27408164, 0.27809835)
COCO_EIG_VAL = np.array([0.2141788, 0.01817699, 0.00341571], dtype=np.float32)
COCO_EIG_VEC = np.array([[-0.58752847, -0.69563484, 0.41340352],
                         [-0.5832747, 0.00994535, -0.81221408],
                         [-0.56089297, 0.71832671, 0.41158938]], dtype=np.float32)

# Random-crop zooms 0.6, 0.7, ..., 1.3: the float values np.arange produces, as CenterNet draws them.
RAND_CROP_SCALES = np.arange(0.6, 1.4, 0.1)
_CROP_BORDER = 128
_COLOR_JITTER = 0.4
_LIGHTING_STD = 0.1


@dataclasses.dataclass(frozen=True)
class CtdetParams:
    """Plain values that shape a ctdet sample (CenterNet's opts / dataset attributes).

    rand_crop False is CenterNet's --not_rand_crop (Gaussian shift/scale jitter instead of the random
    crop); scale and shift are its --scale and --shift. cat_spec_wh / reg_offset select the
    wh target layout and whether the offset target is produced, as --cat_spec_wh / --not_reg_offset.
    input_on_device: the sample's input stays the warped uint8 picture (input_h, input_w, 3), BGR, with
    its colour jitter's draw as jitter_* arrays, for the training device to jitter and normalise
    (modeling.centernet.normalize_training_images).
    """
    input_h: int = 512
    input_w: int = 512
    down_ratio: int = 4
    num_classes: int = 80
    max_objs: int = 128
    mean: tuple = COCO_MEAN
    std: tuple = COCO_STD
    flip: float = 0.5
    rand_crop: bool = True
    scale: float = 0.4
    shift: float = 0.1
    color_aug: bool = True
    cat_spec_wh: bool = False
    reg_offset: bool = True
    input_on_device: bool = False

    @property
    def output_h(self):
        return self.input_h // self.down_ratio

    @property
    def output_w(self):
        return self.input_w // self.down_ratio


# ------------------------------------------------------------------------------------------------
# Gaussian targets
# ------------------------------------------------------------------------------------------------

def gaussian_radius(det_size, min_overlap=0.7):
    """CornerNet/CenterNet Gaussian radius for a (height, width) box: the smallest of three
    corner-shift bounds for IoU >= min_overlap, each root computed as (b + sqrt(b^2 - 4ac)) / 2.

    The division by 2 (not 2a) is the reference's inherited bug, kept on purpose: a 10x10 box gives
    2.733 (radius 2 after int()).
    """
    height, width = det_size
    t = min_overlap
    quadratics = (
        (1, height + width, width * height * (1 - t) / (1 + t)),
        (4, 2 * (height + width), (1 - t) * width * height),
        (4 * t, -2 * t * (height + width), (t - 1) * width * height),
    )
    return min((b + np.sqrt(b ** 2 - 4 * a * c)) / 2 for a, b, c in quadratics)


def gaussian2D(shape, sigma=1):
    """Unnormalised 2-D Gaussian on a (rows, cols) grid centred in the middle, float64, peak 1;
    values below float64 eps times the peak are set to 0."""
    half_rows, half_cols = [(size - 1.) / 2. for size in shape]
    y, x = np.ogrid[-half_rows:half_rows + 1, -half_cols:half_cols + 1]
    g = np.exp(-(x * x + y * y) / (2 * sigma * sigma))
    g[g < np.finfo(g.dtype).eps * g.max()] = 0
    return g


@functools.lru_cache(maxsize=1024)
def _splat(radius):
    """The (2r+1)^2 Gaussian of draw_umich_gaussian, computed once per radius (a sample draws many
    boxes, mostly of a few small radii); read-only, as every caller shares it."""
    diameter = 2 * radius + 1
    gaussian = gaussian2D((diameter, diameter), sigma=diameter / 6)
    gaussian.flags.writeable = False
    return gaussian


def draw_umich_gaussian(heatmap, center, radius, k=1):
    """Splat a (2r+1)^2 Gaussian (sigma (2r+1)/6) scaled by k onto heatmap (H, W) at the integer
    part of center = (x, y), in place, as the element-wise max with what is there; the window is
    clipped at the borders. Returns heatmap."""
    gaussian = _splat(radius)
    x, y = int(center[0]), int(center[1])
    height, width = heatmap.shape[0:2]
    left, right = min(x, radius), min(width - x, radius + 1)
    top, bottom = min(y, radius), min(height - y, radius + 1)
    window = heatmap[y - top:y + bottom, x - left:x + right]
    patch = gaussian[radius - top:radius + bottom, radius - left:radius + right]
    if min(patch.shape) > 0 and min(window.shape) > 0:
        np.maximum(window, patch * k, out=window)
    return heatmap


# ------------------------------------------------------------------------------------------------
# Centre/scale affine transform
# ------------------------------------------------------------------------------------------------

def _third_point(a, b):
    """The point that makes (a, b, result) a right angle at b: b + (a - b) rotated by +90 degrees."""
    d = a - b
    return b + np.array([-d[1], d[0]], dtype=np.float32)


def get_affine_transform(center, scale, rot, output_size, shift=(0, 0), inv=0):
    """2x3 float64 affine (cv2.getAffineTransform of three float32 point pairs) that maps the square
    of side scale[0] around center + scale * shift onto output_size = (w, h), rotated by -rot degrees.

    scale is a scalar or a (w, h) pair; only its width sets the zoom (output_w / scale_w on both
    axes): the map is a similarity. inv=1 gives the map from output to source.
    """
    center = np.asarray(center, dtype=np.float32)
    if np.ndim(scale) == 0:
        scale = np.array([scale, scale], dtype=np.float32)
    else:
        scale = np.asarray(scale)
    offset = scale * np.asarray(shift, dtype=np.float32)
    dst_w, dst_h = output_size[0], output_size[1]
    rot_rad = np.pi * rot / 180
    half = scale[0] * -0.5
    # The vector (0, -scale_w / 2) rotated by rot_rad.
    src_dir = np.array([-half * np.sin(rot_rad), half * np.cos(rot_rad)])

    src = np.zeros((3, 2), dtype=np.float32)
    dst = np.zeros((3, 2), dtype=np.float32)
    src[0] = center + offset
    src[1] = center + src_dir + offset
    dst[0] = [dst_w * 0.5, dst_h * 0.5]
    dst[1] = np.array([dst_w * 0.5, dst_h * 0.5], np.float32) + np.array([0, dst_w * -0.5], np.float32)
    src[2] = _third_point(src[0], src[1])
    dst[2] = _third_point(dst[0], dst[1])
    if inv:
        return cv2.getAffineTransform(dst, src)
    return cv2.getAffineTransform(src, dst)


def affine_transform(pt, t):
    """Point (x, y), cast to float32, through the 2x3 affine t: float64 (2,)."""
    return np.dot(t, np.array([pt[0], pt[1], 1.], dtype=np.float32))


def affine_transform_points(pts, t):
    """affine_transform of each row of pts (N, 2), bit for bit: float64 (N, 2).

    affine_transform's (and CenterNet's) one np.dot per point is a BLAS gemv; np.matmul of t with a
    stack of (3, 1) points calls the same gemv once per point from C, without a Python loop. One
    (N, 3) x (3, 2) product (gemm) or elementwise arithmetic rounds differently in the last float64
    place for some points when cv2's solve leaves a ~1e-16 off-diagonal term (non-square grids).
    """
    pts = np.asarray(pts, dtype=np.float32).reshape(-1, 2)  # affine_transform's float32 cast
    points = np.ones((pts.shape[0], 3, 1), dtype=np.float64)
    points[:, :2, 0] = pts
    return np.matmul(t, points).reshape(-1, 2)


# ------------------------------------------------------------------------------------------------
# Colour augmentation and normalisation
# ------------------------------------------------------------------------------------------------

# float32(v) / 255 for every uint8 value v: the reference's inp.astype(np.float32) / 255., as a table.
UNIT_VALUES = np.arange(256, dtype=np.float32) / 255.


def _blend(image, alpha, other):
    image *= alpha
    image += other * (1 - alpha)


def _brightness(image, alpha, gray, gray_mean):
    image *= alpha


def _contrast(image, alpha, gray, gray_mean):
    # The reference's numpy expressions as today's numpy evaluates them: gray_mean (a float32
    # scalar) * (1 - alpha) is float32 under numpy 2; CenterNet's numpy 1 took it in float64 and
    # rounded once (1 ulp apart in about half the jittered images; the flipped not_rand_crop centre
    # below likewise).
    _blend(image, alpha, gray_mean)


def _saturation(image, alpha, gray, gray_mean):
    _blend(image, alpha, gray)


_COLOR_OPS = (_brightness, _contrast, _saturation)
# The ops' codes in a jitter's order (draw_color_jitter, jitter_arrays).
CONTRAST, SATURATION = _COLOR_OPS.index(_contrast), _COLOR_OPS.index(_saturation)


@dataclasses.dataclass(frozen=True)
class ColorJitter:
    """One draw of CenterNet's (CornerNet's) colour jitter: the order of the ops (indices into
    brightness, contrast, saturation), their alphas in that order, and the PCA lighting offset
    eig_vec . (eig_val * N(0, 0.1)^3) per BGR channel (float64, as the reference adds it)."""
    order: tuple
    alphas: tuple
    lighting: np.ndarray


def draw_color_jitter(rng, eig_val=COCO_EIG_VAL, eig_vec=COCO_EIG_VEC):
    """The jitter's random draws from `rng` (a numpy RandomState), in the reference's order: the op
    order (a permutation of 3), one alpha = 1 + U(-0.4, 0.4) per op, then 3 lighting normals.

    Deviation from the reference: every draw, the order included, comes from `rng`. CenterNet
    shuffles with Python's `random` and draws the rest from one RandomState(123) made at dataset
    construction, which every DataLoader worker copies (and re-copies each epoch), so its jitter
    sequence repeats per worker and epoch.
    """
    order = tuple(int(op) for op in rng.permutation(len(_COLOR_OPS)))
    alphas = tuple(1. + rng.uniform(low=-_COLOR_JITTER, high=_COLOR_JITTER) for _ in order)
    lighting = np.dot(eig_vec, eig_val * rng.normal(scale=_LIGHTING_STD, size=(3,)))
    return ColorJitter(order, alphas, lighting)


# Rows of the CHW input processed together: 64 rows of 3 x 512 float32 (384 KiB) stay in the L2
# cache through all the steps, where a pass over the whole 3 MiB image per step would not.
_BLOCK_ROWS = 64


def normalised_input(image, mean, std, jitter=None, out=None):
    """CHW float32 network input of a BGR uint8 (H, W, 3) image: image / 255, the colour jitter
    (a ColorJitter or None), then (x - mean) / std, as CenterNet's ctdet.py and color_aug; written
    into out (a C-contiguous (3, H, W) float32 array, e.g. a row of the batch) when given.

    Every value is bit-identical to the reference's float32 steps on the HWC image (astype / 255;
    gray = cvtColor of that, its mean; brightness x *= a, contrast x = x * a + mean_gray * (1 - a),
    saturation x = x * a + gray * (1 - a) in the drawn order; x += lighting in float64 rounded to
    float32; - mean; / std), in fewer passes: the steps are element-wise, so the ops before
    saturation, which see only the pixel's own uint8 value, are applied to a 256-entry table looked
    up per plane, and the rest run in place on the contiguous CHW planes (no transpose copy), a
    block of rows at a time.
    """
    height, width = image.shape[0:2]
    if out is None:
        out = np.empty((3, height, width), dtype=np.float32)
    planes = cv2.split(image)
    mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    if jitter is None:
        # No pixel-dependent step at all: each channel is one table of its 256 normalised values.
        tables = (UNIT_VALUES.reshape(1, 256) - mean.reshape(3, 1)) / std.reshape(3, 1)
        for channel in range(3):
            cv2.LUT(planes[channel], tables[channel], dst=out[channel])
        return out
    # cvtColor of image / 255 as the reference, a block of rows at a time (OpenCV converts row by
    # row): the float32 HWC image is never made whole.
    gray = np.empty((height, width), dtype=np.float32)
    for start in range(0, height, _BLOCK_ROWS):
        rows = slice(start, start + _BLOCK_ROWS)
        cv2.cvtColor(cv2.LUT(image[rows], UNIT_VALUES), cv2.COLOR_BGR2GRAY, dst=gray[rows])
    gray_mean = gray.mean()
    ops = list(zip(jitter.order, jitter.alphas))
    first_pixel_op = jitter.order.index(SATURATION)
    table = UNIT_VALUES.copy()
    for op, alpha in ops[:first_pixel_op]:
        _COLOR_OPS[op](table, alpha, None, gray_mean)
    # A (3, 1, 1) float64 array, not per-channel scalars: the sum is formed in float64 as the
    # reference's (3,) float64 vector does, under numpy 1's scalar casting rules too.
    lighting = jitter.lighting.reshape(3, 1, 1)
    for start in range(0, height, _BLOCK_ROWS):
        rows = slice(start, start + _BLOCK_ROWS)
        block = out[:, rows]
        for channel in range(3):
            cv2.LUT(planes[channel][rows], table, dst=block[channel])
        for op, alpha in ops[first_pixel_op:]:
            _COLOR_OPS[op](block, alpha, gray[rows], gray_mean)
        block += lighting
        block -= mean
        block /= std
    return out


# ------------------------------------------------------------------------------------------------
# Training / validation samples
# ------------------------------------------------------------------------------------------------

def _get_border(border, size):
    """The largest border / 2^k that leaves a non-empty range [border, size - border) for the
    random crop centre."""
    i = 1
    while size - border // i <= border // i:
        i *= 2
    return border // i


def _random_centre_scale(rng, c, s, width, height, params):
    """Random crop (choice of zoom, then centre x, then centre y) or, with rand_crop False,
    Gaussian shift/scale jitter; modifies c (float32) in place and returns the new s."""
    if params.rand_crop:
        s = s * rng.choice(RAND_CROP_SCALES)
        w_border = _get_border(_CROP_BORDER, width)
        h_border = _get_border(_CROP_BORDER, height)
        c[0] = rng.randint(low=w_border, high=width - w_border)
        c[1] = rng.randint(low=h_border, high=height - h_border)
        return s
    cf, sf = params.shift, params.scale
    c[0] += s * np.clip(rng.randn() * cf, -2 * cf, 2 * cf)
    c[1] += s * np.clip(rng.randn() * cf, -2 * cf, 2 * cf)
    return s * np.clip(rng.randn() * sf + 1, 1 - sf, 1 + sf)


def _input_image(im, c, s, rng, params, out=None):
    """{'input': the warped image, colour-jittered (when rng is given and params.color_aug) and
    normalised, CHW float32} (written into out when given); with params.input_on_device the warped
    uint8 image (H, W, 3) and the jitter's draw (jitter_arrays) instead."""
    trans_input = get_affine_transform(c, s, 0, [params.input_w, params.input_h])
    warped = out if params.input_on_device else None
    inp = cv2.warpAffine(im, trans_input, (params.input_w, params.input_h), dst=warped, flags=cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    jitter = draw_color_jitter(rng) if rng is not None and params.color_aug else None
    if params.input_on_device:
        return dict(jitter_arrays(jitter), input=inp)
    return {'input': normalised_input(inp, params.mean, params.std, jitter, out)}


def jitter_arrays(jitter):
    """A ColorJitter (None: none) as arrays for the device: jitter_order int64 (3,) the op of each
    step (0 brightness, 1 contrast, 2 saturation), jitter_alphas float64 (3,) its alpha, and
    jitter_lighting float64 (3,) the BGR lighting shift. No jitter is alpha 1 at every step and no
    lighting, which leave every value as it is."""
    if jitter is None:
        return {'jitter_order': np.arange(3, dtype=np.int64), 'jitter_alphas': np.ones(3),
                'jitter_lighting': np.zeros(3)}
    return {'jitter_order': np.asarray(jitter.order, dtype=np.int64),
            'jitter_alphas': np.asarray(jitter.alphas, dtype=np.float64),
            'jitter_lighting': np.asarray(jitter.lighting, dtype=np.float64).reshape(3)}


def _output_boxes(boxes, flipped, width, trans_output, params):
    """Boxes (N, 4) in output-grid pixels, float32: mirrored, both corners mapped, clipped to out-1."""
    boxes = np.array(boxes, dtype=np.float32).reshape(-1, 4)
    if flipped:
        boxes[:, [0, 2]] = width - boxes[:, [2, 0]] - 1
    boxes[:, 0:2] = affine_transform_points(boxes[:, 0:2], trans_output)
    boxes[:, 2:4] = affine_transform_points(boxes[:, 2:4], trans_output)
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, params.output_w - 1)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, params.output_h - 1)
    return boxes


def _targets(out_boxes, classes, params):
    """ctdet targets of the (already truncated) boxes; slot k is annotation k, empty boxes leave
    their slot at zero with reg_mask 0 (slots are not compacted)."""
    out_h, out_w, num_classes = params.output_h, params.output_w, params.num_classes
    hm = np.zeros((num_classes, out_h, out_w), dtype=np.float32)
    wh = np.zeros((params.max_objs, 2), dtype=np.float32)
    reg = np.zeros((params.max_objs, 2), dtype=np.float32)
    ind = np.zeros((params.max_objs,), dtype=np.int64)
    reg_mask = np.zeros((params.max_objs,), dtype=np.uint8)
    gt_det, drawn_rows = [], []
    for k, (box, cls) in enumerate(zip(out_boxes, classes)):
        h, w = box[3] - box[1], box[2] - box[0]
        if not (h > 0 and w > 0):
            continue
        radius = max(0, int(gaussian_radius((math.ceil(h), math.ceil(w)))))
        ct = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2], dtype=np.float32)
        ct_int = ct.astype(np.int32)
        draw_umich_gaussian(hm[cls], ct_int, radius)
        drawn_rows.append(cls * out_h + np.arange(max(0, ct_int[1] - radius), min(out_h, ct_int[1] + radius + 1)))
        wh[k] = w, h
        ind[k] = ct_int[1] * out_w + ct_int[0]
        reg[k] = ct - ct_int
        reg_mask[k] = 1
        gt_det.append([ct[0] - w / 2, ct[1] - h / 2, ct[0] + w / 2, ct[1] + h / 2, 1, cls])
    ret = {'hm': hm, 'hm_nonzero': _nonzero_in_rows(hm, drawn_rows), 'reg_mask': reg_mask, 'ind': ind}
    if params.cat_spec_wh:
        ret['cat_spec_wh'], ret['cat_spec_mask'] = _class_specific_wh(wh, reg_mask, classes, params)
    else:
        ret['wh'] = wh
    if params.reg_offset:
        ret['reg'] = reg
    gt_det = np.array(gt_det, dtype=np.float32) if gt_det else np.zeros((1, 6), dtype=np.float32)
    return ret, gt_det


def _nonzero_in_rows(hm, drawn_rows):
    """np.flatnonzero(hm), searched only in the rows of the heatmap's (classes x height, width) view
    that a Gaussian was drawn in (a list of row-number arrays): a COCO heatmap has 80 x 128 rows, of
    which a few hundred hold one (BENCHMARKS.md, "CenterNet speed")."""
    width = hm.shape[-1]
    rows = np.unique(np.concatenate(drawn_rows)) if drawn_rows else np.zeros(0, np.int64)
    row, column = np.nonzero(hm.reshape(-1, width)[rows])
    return rows[row] * width + column


def _class_specific_wh(wh, reg_mask, classes, params):
    """--cat_spec_wh targets: slot k's (w, h) in columns 2c, 2c+1 of its class c, mask likewise."""
    cat_spec_wh = np.zeros((params.max_objs, params.num_classes * 2), dtype=np.float32)
    cat_spec_mask = np.zeros((params.max_objs, params.num_classes * 2), dtype=np.uint8)
    for k in np.flatnonzero(reg_mask):
        cls = classes[k]
        cat_spec_wh[k, 2 * cls:2 * cls + 2] = wh[k]
        cat_spec_mask[k, 2 * cls:2 * cls + 2] = 1
    return cat_spec_wh, cat_spec_mask


def _ctdet_sample(im, boxes, classes, rng, params, out=None):
    """Training sample with rng (augmentation on), validation sample with rng None."""
    height, width = im.shape[0], im.shape[1]
    c = np.array([width / 2., height / 2.], dtype=np.float32)
    s = max(height, width) * 1.0
    flipped = False
    if rng is not None:
        s = _random_centre_scale(rng, c, s, width, height, params)
        if rng.random_sample() < params.flip:
            flipped = True
            im = cv2.flip(im, 1)  # the mirror image, like im[:, ::-1, :], in one fast copy
            c[0] = width - c[0] - 1
    inp = _input_image(im, c, s, rng, params, out)
    trans_output = get_affine_transform(c, s, 0, [params.output_w, params.output_h])
    num_objs = min(len(boxes), params.max_objs)
    out_boxes = _output_boxes(boxes[:num_objs], flipped, width, trans_output, params)
    ret, gt_det = _targets(out_boxes, np.asarray(classes[:num_objs], dtype=np.int64), params)
    ret.update(inp)
    return ret, c, s, gt_det


def ctdet_train_sample(im, boxes, classes, rng, params, out=None):
    """CenterNet's ctdet training sample (CTDetDataset.__getitem__ for split 'train').

    im: BGR uint8 (H, W, 3) as cv2.imread gives; boxes: (N, 4) [x, y, x + w, y + h] (CenterNet's
    convention, no Detectron -1); classes: (N,) 0-based; rng: numpy RandomState, the only source of
    randomness (draw order: crop zoom, centre x, centre y, flip coin, then colour jitter);
    params: CtdetParams; out: where the input is written (normalised_input), or None.

    Returns a dict of numpy arrays: input (3, input_h, input_w) float32; hm (num_classes, out_h,
    out_w) float32 and hm_nonzero, np.flatnonzero(hm); wh (max_objs, 2) float32 (or cat_spec_wh /
    cat_spec_mask (max_objs, 2C) with params.cat_spec_wh); reg (max_objs, 2) float32 (unless
    params.reg_offset is False); ind (max_objs,) int64; reg_mask (max_objs,) uint8. Only the first
    max_objs boxes are used.
    """
    ret, _, _, _ = _ctdet_sample(im, boxes, classes, rng, params, out)
    return ret


def ctdet_val_sample(im, boxes, classes, params, out=None):
    """The same targets without any augmentation (CenterNet's val split), plus 'meta' with the
    centre 'c', scale 's' and 'gt_det' (n, 6) float32 [x1, y1, x2, y2, 1, class] in output-grid
    pixels ((1, 6) zeros when no box is left)."""
    ret, c, s, gt_det = _ctdet_sample(im, boxes, classes, None, params, out)
    ret['meta'] = {'c': c, 's': s, 'gt_det': gt_det}
    return ret


# ------------------------------------------------------------------------------------------------
# Dataset records
# ------------------------------------------------------------------------------------------------

def centernet_roidb(dataset_names):
    """Per-image records of CenterNet training/evaluation for the catalog datasets, concatenated.

    Like CenterNet's coco.py / ctdet.py: every image of each dataset (also those without
    annotations) and every annotation of an image in the json's order, crowd and 'ignore' ones
    included (CenterNet filters nothing). Each record: {'image': path, 'id', 'width', 'height',
    'boxes': (N, 4) float32 [x, y, x + w, y + h], 'classes': (N,) int64 0-based}, classes numbered
    in ascending category-id order (CenterNet's _valid_ids order on COCO). Images in ascending id
    order within each dataset (the evaluator's order).
    """
    if isinstance(dataset_names, str):
        dataset_names = (dataset_names,)
    roidb, first_categories = [], None
    for name in dataset_names:
        dataset = JsonDataset(name)
        category_ids = sorted(dataset.COCO.getCatIds())
        if first_categories is None:
            first_categories = (name, category_ids)
        elif category_ids != first_categories[1]:
            raise DatasetError('Datasets {} and {} have different category ids; train on datasets '
                               'with the same categories.'.format(first_categories[0], name))
        contiguous = {cat_id: i for i, cat_id in enumerate(category_ids)}
        roidb.extend(_centernet_entry(dataset, entry, contiguous)
                     for entry in dataset.get_roidb(gt=False))
    return roidb


def _centernet_entry(dataset, entry, contiguous):
    coco = dataset.COCO
    # The records (category ids among the categories, 4-number boxes) were checked when the json was read.
    anns = coco.loadAnns(coco.getAnnIds(imgIds=[entry['id']]))
    # x + w and y + h in float64 (Python floats), then float32, as CenterNet's _coco_box_to_bbox.
    xywh = np.array([ann['bbox'] for ann in anns], dtype=np.float64).reshape(-1, 4)
    boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1).astype(np.float32)
    return {
        'image': entry['image'], 'id': entry['id'],
        'width': entry['width'], 'height': entry['height'],
        'boxes': boxes,
        'classes': np.array([contiguous[ann['category_id']] for ann in anns], dtype=np.int64),
    }


# ------------------------------------------------------------------------------------------------
# Test-time input
# ------------------------------------------------------------------------------------------------

def ctdet_test_inputs(im, scale, params, keep_res=False, flip=False, pad=31):
    """CenterNet's BaseDetector.pre_process: the network input of a BGR uint8 image at one scale.

    The image is cv2.resize'd to (int(w * scale), int(h * scale)) and warped. keep_res: a canvas of
    (n | pad) + 1 per side (always a strictly larger multiple of pad + 1), c = (new_w // 2,
    new_h // 2), s = [inp_w, inp_h]: a pure translation. Otherwise (fix_res) params.input_h x
    input_w with c = centre of the resized image and s = max(h, w) of the ORIGINAL image, as the
    reference. The warped image stays uint8: the normalisation (CenterNet's, in float64, then
    float32) runs on the model's device (modeling.centernet.normalize_test_images), so a quarter of
    the bytes travel from the loader workers and to the GPU.

    Returns (images uint8 (1, 3, inp_h, inp_w), or (2, ...) with the mirrored copy when flip,
    meta {'c', 's', 'out_height', 'out_width'}) with out_* = inp_* // params.down_ratio.
    """
    height, width = im.shape[0:2]
    new_height, new_width = int(height * scale), int(width * scale)
    if keep_res:
        inp_height, inp_width = (new_height | pad) + 1, (new_width | pad) + 1
        c = np.array([new_width // 2, new_height // 2], dtype=np.float32)
        s = np.array([inp_width, inp_height], dtype=np.float32)
    else:
        inp_height, inp_width = params.input_h, params.input_w
        c = np.array([new_width / 2., new_height / 2.], dtype=np.float32)
        s = max(height, width) * 1.0
    trans_input = get_affine_transform(c, s, 0, [inp_width, inp_height])
    resized = cv2.resize(im, (new_width, new_height))
    inp = cv2.warpAffine(resized, trans_input, (inp_width, inp_height), flags=cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    images = inp.transpose(2, 0, 1).reshape(1, 3, inp_height, inp_width)
    if flip:
        images = np.concatenate((images, images[:, :, :, ::-1]), axis=0)
    meta = {'c': c, 's': s,
            'out_height': inp_height // params.down_ratio,
            'out_width': inp_width // params.down_ratio}
    return np.ascontiguousarray(images), meta
