"""A built-in synthetic COCO-format detection dataset, so a first run needs no download.

Each image is a random size between IMAGE_SIDE_RANGE pixels per side (small on purpose, so the
CPU demo trains in minutes), filled with a textured background: a random base colour, smooth colour
blotches (TEXTURE_AMPLITUDE) and per-pixel Gaussian noise (PIXEL_NOISE_STD) that also covers the
objects. It holds OBJECTS_PER_IMAGE solid shapes of the CLASSES ('square', 'circle', 'triangle'),
sized log-uniformly in OBJECT_SIZE_RANGE pixels (COCO small, medium and, for the biggest squares,
large), coloured away from the background colour and never touching each other, so every box is the
tight box of a fully visible object. Triangles are rotated at random.

Splits (names as in dataset_catalog):
- `shapes_train`: NUM_TRAIN_IMAGES images; `shapes_val`: NUM_VAL_IMAGES other images.
- `shapes_noisy_train`: the shapes_train images with noisy labels: every box edge moved by an
  independent Gaussian offset of std NOISY_BOX_STD x the box width (left/right edges) or height
  (top/bottom edges), then clipped to the image. It shows the KL-Loss head coping with label noise.

- `shapes_keypoints_train` / `shapes_keypoints_val` (KEYPOINT_NUM_IMAGES): a keypoint variant in its own
  cache directory (KEYPOINT_CACHE_NAME), drawn from its own seed, with one category, 'square': squares
  turned by up to KEYPOINT_MAX_ANGLE degrees, each with five named keypoints (KEYPOINT_NAMES: the corners
  in the square's own frame and its centre, all visible) as COCO's person keypoints, and per-keypoint OKS
  sigmas in the category ('keypoint_oks_sigmas', KEYPOINT_OKS_SIGMA). A horizontal flip turns a square by
  -angle and takes each left corner to the place of its right one: the flip pairs are left_* / right_*.

Boxes follow Detectron's convention: bbox = [x1, y1, w, h] with x2 = x1 + w - 1 the last object
pixel column. Each segmentation is one polygon along the pixel edges of the drawn object, so
pycocotools' rasterisation of it (what Mask R-CNN's targets and the segm evaluation use) gives
exactly the object's pixels. Everything is drawn from fixed seeds (SEED), so a generation is byte-identical to any
other on the same software stack. The data is generated once into
`$DETECTRON_DATA_CACHE/shapes_v3` (default `~/.cache/detectron-port/shapes_v3`) with the layout
`train/*.jpg`, `val/*.jpg`, `annotations/<split name>.json`.
"""

import json
import logging
import os
import shutil
import tempfile

import cv2
import numpy as np

logger = logging.getLogger(__name__)

CACHE_ENV_VAR = 'DETECTRON_DATA_CACHE'
DEFAULT_CACHE_DIR = os.path.join('~', '.cache', 'detectron-port')
# The cache subdirectory: renamed whenever the generated files change, so an older copy is not reused.
CACHE_NAME = 'shapes_v3'

SEED = 2019
NUM_TRAIN_IMAGES = 400
NUM_VAL_IMAGES = 100
IMAGE_SIDE_RANGE = (128, 192)
OBJECT_SIZE_RANGE = (12, 110)
OBJECTS_PER_IMAGE = (1, 4)
CLASSES = ('square', 'circle', 'triangle')
TEXTURE_AMPLITUDE = 50.0
PIXEL_NOISE_STD = 12.0
NOISY_BOX_STD = 0.1
JPEG_QUALITY = 90

# Pixels kept free between objects (and tries per object) so boxes never overlap.
_OBJECT_GAP = 2
_PLACEMENT_TRIES = 30

KEYPOINT_CACHE_NAME = 'shapes_keypoints_v1'
KEYPOINT_NUM_IMAGES = {'shapes_keypoints_train': 300, 'shapes_keypoints_val': 60}
KEYPOINT_SIZE_RANGE = (24, 90)
KEYPOINT_MAX_ANGLE = 30.0
KEYPOINT_NAMES = ('left_top', 'right_top', 'right_bottom', 'left_bottom', 'center')
KEYPOINT_OKS_SIGMA = 0.05  # per keypoint: an OKS of 0.6 at 5 px from the truth on a 50 px square
# The five keypoints in the square's own frame, in half sides (y down).
_KEYPOINT_OFFSETS = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1], [0, 0]], dtype=np.float64)

# Split name -> (image subdirectory, annotation file name).
SPLITS = {
    'shapes_train': ('train', 'shapes_train.json'),
    'shapes_val': ('val', 'shapes_val.json'),
    'shapes_noisy_train': ('train', 'shapes_noisy_train.json'),
    'shapes_keypoints_train': ('train', 'shapes_keypoints_train.json'),
    'shapes_keypoints_val': ('val', 'shapes_keypoints_val.json'),
}


def split_files(name):
    """(image directory, annotation file) of split `name`, its dataset generated first if needed."""
    if name in KEYPOINT_NUM_IMAGES:
        root = ensure_shapes_dataset(_cache_root(KEYPOINT_CACHE_NAME), generate=generate_keypoint_shapes)
    else:
        root = ensure_shapes_dataset()
    image_subdir, annotation_name = SPLITS[name]
    return os.path.join(root, image_subdir), os.path.join(root, 'annotations', annotation_name)


def default_root():
    """Cache location: $DETECTRON_DATA_CACHE/<CACHE_NAME>, default ~/.cache/detectron-port/<CACHE_NAME>."""
    return _cache_root(CACHE_NAME)


def _cache_root(name):
    cache_dir = os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR
    return os.path.abspath(os.path.join(os.path.expanduser(cache_dir), name))


def ensure_shapes_dataset(root=None, generate=None):
    """Generate the dataset into `root` unless it is there; return the absolute root.

    Safe when several processes call it at once: each generates into its own temporary directory
    next to `root` and renames it into place atomically; the losers drop their copy and use the
    winner's, so `root` is always complete when it exists.
    """
    root = os.path.abspath(root or default_root())
    if os.path.isdir(root):
        return root
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix='.shapes-tmp-', dir=parent)
    try:
        logger.info('Generating the synthetic shapes dataset into {}'.format(root))
        (generate or generate_shapes)(tmp_dir)
        os.chmod(tmp_dir, 0o755)  # mkdtemp makes it private to the user
        os.rename(tmp_dir, root)
    except OSError:
        if not os.path.isdir(root):
            raise
        logger.info('Another process generated {} first; using it'.format(root))
    finally:
        if os.path.isdir(tmp_dir):
            shutil.rmtree(tmp_dir)
    return root


def generate_shapes(out_dir):
    """Write all box splits (images and COCO json files) into the existing directory `out_dir`."""
    rng = np.random.RandomState(SEED)
    splits = {
        'shapes_train': _make_split(rng, NUM_TRAIN_IMAGES, os.path.join(out_dir, 'train')),
        'shapes_val': _make_split(rng, NUM_VAL_IMAGES, os.path.join(out_dir, 'val')),
    }
    splits['shapes_noisy_train'] = _with_noisy_boxes(
        splits['shapes_train'], np.random.RandomState(SEED + 1)
    )
    os.makedirs(os.path.join(out_dir, 'annotations'))
    for name, coco in splits.items():
        path = os.path.join(out_dir, 'annotations', SPLITS[name][1])
        with open(path, 'w') as f:
            json.dump(coco, f, sort_keys=True)


def generate_keypoint_shapes(out_dir):
    """Write the keypoint splits (images and COCO json files) into the existing directory `out_dir`."""
    rng = np.random.RandomState(SEED + 2)
    os.makedirs(os.path.join(out_dir, 'annotations'))
    for name, num_images in KEYPOINT_NUM_IMAGES.items():
        image_subdir, annotation_name = SPLITS[name]
        coco = _make_split(rng, num_images, os.path.join(out_dir, image_subdir), draw=_draw_keypoint_image)
        coco['categories'] = [{'id': 1, 'name': 'square', 'supercategory': 'shape', 'keypoints': list(KEYPOINT_NAMES),
                               'skeleton': [], 'keypoint_oks_sigmas': [KEYPOINT_OKS_SIGMA] * len(KEYPOINT_NAMES)}]
        with open(os.path.join(out_dir, 'annotations', annotation_name), 'w') as f:
            json.dump(coco, f, sort_keys=True)


def _draw_keypoint_image(rng, height, width):
    """A textured image of turned squares -> (uint8 BGR image, [(1, object mask, (K, 2) keypoints)])."""
    canvas, base_colour = _background(rng, height, width)
    occupied = np.zeros((height, width), dtype=bool)
    objects = []
    for _ in range(rng.randint(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1])):
        placed = _place_turned_square(rng, occupied)
        if placed is None:
            continue
        mask, keypoints = placed
        canvas[mask] = (base_colour + 128 + rng.uniform(-40, 40, size=3)) % 256
        occupied |= cv2.dilate(mask.astype(np.uint8), np.ones((3, 3), np.uint8), iterations=_OBJECT_GAP).astype(bool)
        objects.append((1, mask, keypoints))
    return _finished(rng, canvas), objects


def _place_turned_square(rng, occupied):
    """(mask, (5, 2) keypoints) of a turned square that misses `occupied`, or None after a few tries."""
    height, width = occupied.shape
    for _ in range(_PLACEMENT_TRIES):
        half = np.exp(rng.uniform(*np.log(KEYPOINT_SIZE_RANGE))) / 2
        angle = np.deg2rad(rng.uniform(-KEYPOINT_MAX_ANGLE, KEYPOINT_MAX_ANGLE))
        reach = half * np.sqrt(2) + 1
        if 2 * reach >= min(height, width):
            continue
        centre = np.array([rng.uniform(reach, width - reach), rng.uniform(reach, height - reach)])
        rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        keypoints = centre + half * _KEYPOINT_OFFSETS @ rotation.T
        mask = np.zeros((height, width), dtype=np.uint8)
        cv2.fillPoly(mask, [np.round(keypoints[:4]).astype(np.int32)], 1)
        mask = mask.astype(bool)
        if mask.any() and not (mask & occupied).any():
            return mask, keypoints
    return None


def _make_split(rng, num_images, image_dir, draw=None):
    os.makedirs(image_dir)
    images, annotations = [], []
    for image_id in range(1, num_images + 1):
        height, width = rng.randint(IMAGE_SIDE_RANGE[0], IMAGE_SIDE_RANGE[1] + 1, size=2)
        pixels, objects = (draw or _draw_image)(rng, int(height), int(width))
        file_name = '{:06d}.jpg'.format(image_id)
        cv2.imwrite(os.path.join(image_dir, file_name), pixels,
                    [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        images.append({'id': image_id, 'file_name': file_name,
                       'height': int(height), 'width': int(width)})
        for category_id, mask, *keypoints in objects:
            annotations.append(_annotation(len(annotations) + 1, image_id, category_id, mask, *keypoints))
    return {
        'info': {'description': 'detectron-port synthetic shapes (detectron/datasets/shapes.py)'},
        'images': images,
        'annotations': annotations,
        'categories': [{'id': i + 1, 'name': name, 'supercategory': 'shape'}
                       for i, name in enumerate(CLASSES)],
    }


def _background(rng, height, width):
    """(float canvas of the textured background, its base colour)."""
    base_colour = rng.uniform(0, 255, size=3)
    blotches = rng.uniform(-TEXTURE_AMPLITUDE, TEXTURE_AMPLITUDE, size=(4, 4, 3))
    return base_colour + cv2.resize(blotches.astype(np.float32), (width, height),
                                    interpolation=cv2.INTER_CUBIC), base_colour


def _finished(rng, canvas):
    """The canvas with per-pixel noise, as uint8."""
    canvas += rng.normal(0, PIXEL_NOISE_STD, size=canvas.shape)
    return np.clip(np.round(canvas), 0, 255).astype(np.uint8)


def _draw_image(rng, height, width):
    """Return a uint8 BGR image and [(category id, object mask)]."""
    canvas, base_colour = _background(rng, height, width)
    occupied = np.zeros((height, width), dtype=bool)
    objects = []
    for _ in range(rng.randint(OBJECTS_PER_IMAGE[0], OBJECTS_PER_IMAGE[1] + 1)):
        category_id = rng.randint(len(CLASSES)) + 1
        mask = _place_shape(rng, CLASSES[category_id - 1], occupied)
        if mask is None:
            continue
        # Half a colour wheel away per channel, so objects always stand out from the background.
        colour = (base_colour + 128 + rng.uniform(-40, 40, size=3)) % 256
        canvas[mask] = colour
        occupied |= cv2.dilate(mask.astype(np.uint8), np.ones((3, 3), np.uint8),
                               iterations=_OBJECT_GAP).astype(bool)
        objects.append((category_id, mask))
    return _finished(rng, canvas), objects


def _place_shape(rng, shape, occupied):
    """Mask of a new shape that misses `occupied`, or None when none fits after a few tries."""
    height, width = occupied.shape
    for _ in range(_PLACEMENT_TRIES):
        size = int(round(np.exp(rng.uniform(*np.log(OBJECT_SIZE_RANGE)))))
        x0 = rng.randint(0, width - size + 1)
        y0 = rng.randint(0, height - size + 1)
        mask = _shape_mask(rng, shape, x0, y0, size, (height, width))
        if mask.any() and not (mask & occupied).any():
            return mask
    return None


def _shape_mask(rng, shape, x0, y0, size, image_shape):
    """Filled `shape` inside the size x size square at (x0, y0), as a bool mask."""
    mask = np.zeros(image_shape, dtype=np.uint8)
    if shape == 'square':
        cv2.rectangle(mask, (x0, y0), (x0 + size - 1, y0 + size - 1), 1, thickness=-1)
    elif shape == 'circle':
        radius = (size - 1) // 2
        cv2.circle(mask, (x0 + radius, y0 + radius), radius, 1, thickness=-1)
    else:
        radius = (size - 1) / 2.0
        angles = rng.uniform(0, 2 * np.pi) + np.arange(3) * 2 * np.pi / 3
        corners = np.stack([x0 + radius * (1 + np.cos(angles)),
                            y0 + radius * (1 + np.sin(angles))], axis=1)
        cv2.fillPoly(mask, [np.round(corners).astype(np.int32)], 1)
    return mask.astype(bool)


def _annotation(annotation_id, image_id, category_id, mask, keypoints=None):
    """COCO's record of an object; with keypoints (K, 2), COCO's keypoint fields (rounded to pixels, visible)."""
    ys, xs = np.nonzero(mask)
    x1, y1 = int(xs.min()), int(ys.min())
    extra = {}
    if keypoints is not None:
        extra = {'keypoints': [int(v) for x, y in np.round(keypoints) for v in (x, y, 2)],
                 'num_keypoints': len(keypoints)}
    return {**extra,
        'id': annotation_id,
        'image_id': image_id,
        'category_id': category_id,
        'bbox': [x1, y1, int(xs.max()) - x1 + 1, int(ys.max()) - y1 + 1],
        'area': int(mask.sum()),
        'iscrowd': 0,
        'segmentation': [_outline_polygon(mask)],
    }


def _outline_polygon(mask):
    """The pixel-edge outline of a mask with one run of pixels per row (a filled convex shape) as a
    flat COCO polygon [x0, y0, x1, y1, ...]: down the right ends of the runs, up the left ends,
    corners only. Pixel (x, y) is the square [x, x + 1] x [y, y + 1]."""
    right, left = [], []
    for y in np.nonzero(mask.any(axis=1))[0]:
        xs = np.nonzero(mask[y])[0]
        if xs[-1] - xs[0] + 1 != len(xs):
            raise ValueError(f'row {y} of the mask has more than one run of pixels')
        right += [(xs[-1] + 1, y), (xs[-1] + 1, y + 1)]
        left += [(xs[0], y), (xs[0], y + 1)]
    ring = right + left[::-1]
    ring = [p for i, p in enumerate(ring) if p != ring[i - 1]]  # repeated points where runs share an end
    corners = [p for i, p in enumerate(ring)
               if not (ring[i - 1][0] == p[0] == ring[(i + 1) % len(ring)][0]
                       or ring[i - 1][1] == p[1] == ring[(i + 1) % len(ring)][1])]
    return [int(v) for p in corners for v in p]


def _with_noisy_boxes(coco, rng):
    """Copy of `coco` whose boxes have every edge jittered (see the module docstring)."""
    sizes = {image['id']: (image['width'], image['height']) for image in coco['images']}
    annotations = []
    for ann in coco['annotations']:
        x1, y1, w, h = ann['bbox']
        edges = np.array([x1, x1 + w - 1, y1, y1 + h - 1], dtype=np.float64)
        edges += rng.normal(0, NOISY_BOX_STD, size=4) * np.array([w, w, h, h])
        width, height = sizes[ann['image_id']]
        nx1, nx2 = np.clip(np.sort(edges[:2]), 0, width - 1)
        ny1, ny2 = np.clip(np.sort(edges[2:]), 0, height - 1)
        nw, nh = round(float(nx2 - nx1 + 1), 2), round(float(ny2 - ny1 + 1), 2)
        annotations.append(dict(ann, bbox=[round(float(nx1), 2), round(float(ny1), 2), nw, nh],
                                area=round(nw * nh, 2)))
    return dict(coco, annotations=annotations)
