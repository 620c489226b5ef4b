import json
import os
import subprocess
import sys

import numpy as np
import pycocotools.mask as mask_util
import pytest

from detectron.datasets import shapes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tree_bytes(root):
    """{relative path: file bytes} of every file under root."""
    files = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, root)] = f.read()
    return files


def _load(root, split):
    with open(os.path.join(root, 'annotations', shapes.SPLITS[split][1])) as f:
        return json.load(f)


@pytest.fixture(scope='module')
def generated(tmp_path_factory):
    return shapes.ensure_shapes_dataset(str(tmp_path_factory.mktemp('first') / shapes.CACHE_NAME))


def test_generation_is_byte_identical(generated, tmp_path):
    second = shapes.ensure_shapes_dataset(str(tmp_path / 'shapes'))
    first_files, second_files = _tree_bytes(generated), _tree_bytes(second)
    expected_images = shapes.NUM_TRAIN_IMAGES + shapes.NUM_VAL_IMAGES
    # One annotation file per split, the keypoint splits (generated into their own directory) aside.
    assert len(first_files) == expected_images + len(shapes.SPLITS) - len(shapes.KEYPOINT_NUM_IMAGES)
    assert first_files == second_files


def test_existing_root_is_reused_untouched(generated):
    marker = os.path.join(generated, 'annotations', 'shapes_val.json')
    before = os.stat(marker).st_mtime_ns
    assert shapes.ensure_shapes_dataset(generated) == generated
    assert os.stat(marker).st_mtime_ns == before


def test_default_root_follows_cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv('DETECTRON_DATA_CACHE', str(tmp_path))
    assert shapes.default_root() == str(tmp_path / 'shapes_v3')
    monkeypatch.delenv('DETECTRON_DATA_CACHE')
    assert shapes.default_root() == os.path.expanduser('~/.cache/detectron-port/shapes_v3')


@pytest.mark.slow
@pytest.mark.processes
def test_concurrent_generation_leaves_one_complete_dataset(generated, tmp_path):
    root = str(tmp_path / 'shapes')
    code = ('import sys; from detectron.datasets import shapes; '
            'print(shapes.ensure_shapes_dataset(sys.argv[1]))')
    procs = [subprocess.Popen([sys.executable, '-c', code, root], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert [out.strip() for out, _ in outputs] == [root] * 3
    assert os.listdir(str(tmp_path)) == ['shapes']  # no temporary directory left behind
    assert _tree_bytes(root) == _tree_bytes(generated)


def test_splits_have_documented_counts_and_sizes(generated):
    for split, num_images in (('shapes_train', shapes.NUM_TRAIN_IMAGES),
                              ('shapes_val', shapes.NUM_VAL_IMAGES)):
        coco = _load(generated, split)
        assert [c['name'] for c in coco['categories']] == ['square', 'circle', 'triangle']
        assert [im['id'] for im in coco['images']] == list(range(1, num_images + 1))
        for im in coco['images']:
            assert shapes.IMAGE_SIDE_RANGE[0] <= im['width'] <= shapes.IMAGE_SIDE_RANGE[1]
            assert shapes.IMAGE_SIDE_RANGE[0] <= im['height'] <= shapes.IMAGE_SIDE_RANGE[1]
            assert os.path.isfile(os.path.join(generated, shapes.SPLITS[split][0], im['file_name']))
        per_image = np.bincount([a['image_id'] for a in coco['annotations']],
                                minlength=num_images + 1)[1:]
        assert per_image.min() >= shapes.OBJECTS_PER_IMAGE[0]
        assert per_image.max() == shapes.OBJECTS_PER_IMAGE[1]
        assert {a['category_id'] for a in coco['annotations']} == {1, 2, 3}
        assert len({a['id'] for a in coco['annotations']}) == len(coco['annotations'])


def _disjoint(a, b):
    return a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1]


def test_boxes_are_tight_valid_and_inside_images(generated):
    coco = _load(generated, 'shapes_train')
    sizes = {im['id']: (im['width'], im['height']) for im in coco['images']}
    squares = {}
    for a in coco['annotations']:
        x, y, w, h = a['bbox']
        width, height = sizes[a['image_id']]
        assert x >= 0 and y >= 0 and x + w - 1 <= width - 1 and y + h - 1 <= height - 1
        assert 0 < a['area'] <= w * h
        assert max(w, h) <= shapes.OBJECT_SIZE_RANGE[1]
        if a['category_id'] in (1, 2):  # axis-aligned squares and circles have square boxes
            assert w == h
        if a['category_id'] == 1:
            assert a['area'] == w * h  # a square fills its box
            squares.setdefault(a['image_id'], []).append((x, y, x + w - 1, y + h - 1))
    # Objects never touch, so two squares' boxes are disjoint.
    for boxes in squares.values():
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                assert _disjoint(boxes[i], boxes[j])
    sides = [a['bbox'][2] for a in coco['annotations'] if a['category_id'] == 1]
    assert min(sides) <= 14 and max(sides) > 96  # COCO small and large objects both occur


def test_object_pixels_stand_out_from_background(generated):
    import cv2
    coco = _load(generated, 'shapes_val')
    heights = {im['id']: im['height'] for im in coco['images']}
    ann = next(a for a in coco['annotations'] if a['category_id'] == 1 and a['bbox'][2] >= 30
               and a['bbox'][1] >= 4 and a['bbox'][1] + a['bbox'][3] + 4 <= heights[a['image_id']])
    image = cv2.imread(os.path.join(generated, 'val', '{:06d}.jpg'.format(ann['image_id'])))
    x, y, w, h = ann['bbox']
    inside = image[y + 3:y + h - 3, x + 3:x + w - 3].reshape(-1, 3).astype(float).mean(0)
    # Two-pixel bands just above and below the square (one pixel away from its edge).
    outside = np.concatenate([image[y - 3:y - 1, x:x + w], image[y + h + 1:y + h + 3, x:x + w]])
    assert np.abs(inside - outside.reshape(-1, 3).astype(float).mean(0)).max() > 30


def test_noisy_train_jitters_each_edge_by_documented_std(generated):
    clean, noisy = _load(generated, 'shapes_train'), _load(generated, 'shapes_noisy_train')
    assert noisy['images'] == clean['images']
    assert [(a['id'], a['image_id'], a['category_id']) for a in noisy['annotations']] == \
        [(a['id'], a['image_id'], a['category_id']) for a in clean['annotations']]
    sizes = {im['id']: (im['width'], im['height']) for im in clean['images']}
    offsets = []
    for c, n in zip(clean['annotations'], noisy['annotations']):
        width, height = sizes[c['image_id']]
        cx, cy, cw, ch = c['bbox']
        nx, ny, nw, nh = n['bbox']
        assert nx >= 0 and ny >= 0 and nx + nw - 1 <= width - 1 + 1e-6
        assert ny + nh - 1 <= height - 1 + 1e-6
        edges = [(nx, cx, cw, width), (nx + nw - 1, cx + cw - 1, cw, width),
                 (ny, cy, ch, height), (ny + nh - 1, cy + ch - 1, ch, height)]
        for noisy_edge, clean_edge, size, limit in edges:
            if 0.01 < noisy_edge < limit - 1.01:  # clipped edges are not Gaussian
                offsets.append((noisy_edge - clean_edge) / size)
    offsets = np.array(offsets)
    assert len(offsets) > 3000
    assert abs(offsets.mean()) < 0.01
    assert abs(offsets.std() - shapes.NOISY_BOX_STD) < 0.01
    assert np.mean(np.abs(offsets) > 0.01) > 0.9  # nearly every edge moved


def test_catalog_names_load_as_json_datasets(generated, monkeypatch):
    from detectron.datasets.json_dataset import JsonDataset
    from detectron.datasets.roidb import combined_roidb_for_training
    monkeypatch.setenv('DETECTRON_DATA_CACHE', os.path.dirname(generated))
    ds = JsonDataset('shapes_val')
    assert ds.classes == ['__background__', 'square', 'circle', 'triangle']
    roidb = ds.get_roidb(gt=True)
    assert len(roidb) == shapes.NUM_VAL_IMAGES
    # Every synthetic box passes Detectron's gt filter.
    assert sum(len(e['boxes']) for e in roidb) == len(_load(generated, 'shapes_val')['annotations'])
    noisy = combined_roidb_for_training('shapes_noisy_train')
    assert len(noisy) == 2 * shapes.NUM_TRAIN_IMAGES
    assert noisy[0]['image'] == os.path.join(generated, 'train', '000001.jpg')


@pytest.mark.parametrize('shape', shapes.CLASSES)
def test_outline_polygon_rasterises_to_exactly_the_drawn_pixels(shape):
    rng = np.random.RandomState(3)
    for size in (12, 13, 40, 109):
        mask = shapes._shape_mask(rng, shape, 2, 5, size, (120, 116))
        polygon = shapes._outline_polygon(mask)
        decoded = mask_util.decode(mask_util.frPyObjects([polygon], 120, 116))[:, :, 0]
        assert np.array_equal(decoded.astype(bool), mask)
    if shape == 'square':  # 4 corners, clockwise from the top right
        assert polygon == [111, 5, 111, 114, 2, 114, 2, 5]


def test_segmentations_match_area_and_box(generated):
    coco = _load(generated, 'shapes_val')
    sizes = {im['id']: (im['height'], im['width']) for im in coco['images']}
    for ann in coco['annotations']:
        rle = mask_util.frPyObjects(ann['segmentation'], *sizes[ann['image_id']])
        assert int(mask_util.area(mask_util.merge(rle))) == ann['area']
        assert mask_util.toBbox(mask_util.merge(rle)).tolist() == ann['bbox']
