"""tools/infer_simple.py as a user runs it: a folder of images -> one visualised PNG per image."""
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch

from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.core.test import im_detect_all
from detectron.core.test_engine import load_test_model
from detectron.datasets.dummy_datasets import get_coco_dataset
from detectron.modeling import model_builder
from detectron.utils.vis import vis_one_image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES_CFG = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_R-18-FPN.yaml')
CLASS_NAMES = ['__background__', 'square', 'circle', 'triangle']
THRESH = 0.1


def _run(*args):
    return subprocess.run([sys.executable, os.path.join('tools', 'infer_simple.py')] + list(args), cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _random_image_folder(tmp_path, seed, shape):
    folder = tmp_path / 'images'
    folder.mkdir()
    image = np.random.RandomState(seed).randint(0, 255, size=shape).astype(np.uint8)
    cv2.imwrite(str(folder / 'one.jpg'), image)
    return folder


def _infer_with_random_weights(tmp_path, config, folder, overrides):
    """Save a random-weight model of config + overrides, run infer_simple on folder with it; returns
    (the tool's result, the model as test_net would load it)."""
    merge_cfg_from_file(config)
    merge_cfg_from_list(overrides)
    assert_and_infer_cfg()
    torch.manual_seed(0)
    weights = tmp_path / 'random.pth'
    torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    result = _run('--cfg', config, '--wts', str(weights), '--output-dir', str(tmp_path / 'vis'),
                  '--thresh', '0.0', str(folder), *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_test_model(model_builder.build_model_type(cfg), str(weights),
                           torch.device('cuda' if torch.cuda.is_available() else 'cpu'))


def _infer_with_a_drawn_head(tmp_path, config, folder, overrides, head):
    """_infer_with_random_weights with the model's `head` drawn from N(0, 0.3) (large enough to show); returns
    (the model type, the model as test_net would load it)."""
    merge_cfg_from_file(config)
    merge_cfg_from_list(overrides)
    assert_and_infer_cfg()
    torch.manual_seed(0)
    model = model_builder.create(cfg)
    with torch.no_grad():
        for param in getattr(model, head).parameters():
            param.normal_(0.0, 0.3)
    weights = tmp_path / 'random.pth'
    torch.save({'model': model.state_dict()}, weights)
    result = _run('--cfg', config, '--wts', str(weights), '--output-dir', str(tmp_path / 'vis'),
                  '--thresh', '0.0', str(folder), *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    model_type = model_builder.build_model_type(cfg)
    return model_type, load_test_model(model_type, str(weights),
                                       torch.device('cuda' if torch.cuda.is_available() else 'cpu'))


def _write_inputs(root):
    """Two JPEGs (and a PNG the default --image-ext skips), random-init weights, a names-only catalog."""
    rng = np.random.RandomState(0)
    folder = root / 'images'
    folder.mkdir()
    for name, (height, width) in (('first', (64, 96)), ('second', (80, 60))):
        image = rng.randint(0, 255, size=(height, width, 3)).astype(np.uint8)
        image[10:40, 12:50] = (30, 200, 30)
        cv2.imwrite(str(folder / (name + '.jpg')), image)
    cv2.imwrite(str(folder / 'skipped.png'), np.zeros((8, 8, 3), np.uint8))
    merge_cfg_from_file(SHAPES_CFG)
    assert_and_infer_cfg()
    torch.manual_seed(0)
    weights = root / 'random_init.pth'
    torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    names = root / 'names.json'
    names.write_text(json.dumps({'images': [], 'annotations': [], 'categories': [
        {'id': i, 'name': name} for i, name in enumerate(CLASS_NAMES[1:], start=1)]}))
    catalog = root / 'catalog.json'
    catalog.write_text(json.dumps({'names_only': {'image_directory': str(folder), 'annotation_file': str(names)}}))
    return folder, weights, catalog


@pytest.mark.processes
def test_folder_of_images_gives_one_visualised_png_each(tmp_path):
    folder, weights, catalog = _write_inputs(tmp_path)
    output_dir = tmp_path / 'vis'
    result = _run('--cfg', SHAPES_CFG, '--wts', str(weights), '--output-dir', str(output_dir),
                  '--thresh', str(THRESH), str(folder), 'DATASET_CATALOG', str(catalog),
                  'TEST.DATASETS', "('names_only',)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(output_dir)) == ['first.png', 'second.png']
    # The same detections drawn here, with the catalog's class names, give the same pixels.
    model_type = model_builder.build_model_type(cfg)
    model = load_test_model(model_type, str(weights), torch.device('cuda' if torch.cuda.is_available() else 'cpu'))
    for name in ('first', 'second'):
        image = cv2.imread(str(folder / (name + '.jpg')))
        cls_boxes = im_detect_all(model_type, model, image)
        assert sum(int((boxes[:, 4] >= THRESH).sum()) for boxes in cls_boxes[1:]) > 0
        written = cv2.imread(str(output_dir / (name + '.png')))
        assert written.shape == image.shape
        assert np.array_equal(written, vis_one_image(image, cls_boxes, CLASS_NAMES, THRESH))
        assert not np.array_equal(written, image)


@pytest.mark.processes
def test_without_arguments_prints_usage_and_exits_1():
    result = _run()
    assert result.returncode == 1
    assert result.stdout.startswith('usage: infer_simple.py')


@pytest.mark.processes
def test_coco_model_without_coco_on_disk_is_labelled_with_coco_names(tmp_path):
    """An 81-class model whose TEST.DATASETS (coco_2017_val) is absent still labels its boxes, with
    the COCO names, as Detectron's demo does; detections are the same as drawn with those names."""
    folder = _random_image_folder(tmp_path, 1, (64, 96, 3))
    # A random 81-class head scores every class near 1/81: no score threshold, so boxes get drawn.
    overrides = ['MODEL.NUM_CLASSES', '81', 'TEST.DATASETS', "('coco_2017_val',)", 'TEST.SCORE_THRESH', '0.0']
    model = _infer_with_random_weights(tmp_path, SHAPES_CFG, folder, overrides)
    image = cv2.imread(str(folder / 'one.jpg'))
    cls_boxes = im_detect_all(model_builder.build_model_type(cfg), model, image)
    assert sum(len(boxes) for boxes in cls_boxes[1:]) > 0
    written = cv2.imread(str(tmp_path / 'vis' / 'one.png'))
    assert np.array_equal(written, vis_one_image(image, cls_boxes, get_coco_dataset(), 0.0))
    assert not np.array_equal(written, vis_one_image(image, cls_boxes, None, 0.0))  # names are drawn


@pytest.mark.processes
def test_centernet_model_through_infer_simple(tmp_path):
    """The same tool runs a CenterNet: its detector draws the boxes test_net would report."""
    config = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_centernet_res18.yaml')
    folder = _random_image_folder(tmp_path, 2, (70, 90, 3))
    model = _infer_with_random_weights(tmp_path, config, folder, ['TEST.DATASETS', '()', 'CENTERNET.INPUT_RES', '64'])
    cls_boxes = im_detect_all(model_builder.build_model_type(cfg), model, cv2.imread(str(folder / 'one.jpg')))
    assert len(cls_boxes) == 4 and sum(len(boxes) for boxes in cls_boxes[1:]) == 100  # CenterNet's K
    written = cv2.imread(str(tmp_path / 'vis' / 'one.png'))
    assert np.array_equal(written, vis_one_image(cv2.imread(str(folder / 'one.jpg')), cls_boxes, None, 0.0))


@pytest.mark.processes
def test_mask_rcnn_through_infer_simple_draws_the_masks(tmp_path):
    """A Mask R-CNN's detections are drawn with their masks: the same pixels as vis_one_image of
    core/test's (cls_boxes, cls_segms)."""
    config = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_mask_R-18-FPN.yaml')
    folder = _random_image_folder(tmp_path, 3, (64, 80, 3))
    overrides = ['TEST.DATASETS', '()', 'TEST.SCORE_THRESH', '0.0', 'TEST.DETECTIONS_PER_IM', '5']
    # A mask head whose random masks are not all at the 0.5 threshold.
    model_type, model = _infer_with_a_drawn_head(tmp_path, config, folder, overrides, 'mask_head')
    image = cv2.imread(str(folder / 'one.jpg'))
    cls_boxes, cls_segms = im_detect_all(model_type, model, image)
    assert sum(int(mask_util.area(rle)) for segms in cls_segms for rle in segms) > 0
    written = cv2.imread(str(tmp_path / 'vis' / 'one.png'))
    assert np.array_equal(written, vis_one_image(image, cls_boxes, None, 0.0, cls_segms=cls_segms))
    assert not np.array_equal(written, vis_one_image(image, cls_boxes, None, 0.0))  # the masks are drawn


@pytest.mark.processes
def test_keypoint_rcnn_through_infer_simple_draws_the_skeleton(tmp_path):
    """A Keypoint R-CNN's detections are drawn with their keypoints and the skeleton of the dataset's names
    (each left keypoint joined to its right one): the pixels of vis_one_image with those names, and not those
    without names (no edges)."""
    config = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_keypoint_R-18-FPN.yaml')
    folder = _random_image_folder(tmp_path, 4, (64, 80, 3))
    names = ['left_top', 'right_top', 'right_bottom', 'left_bottom', 'center']
    annotations = tmp_path / 'names.json'
    annotations.write_text(json.dumps({'images': [], 'annotations': [], 'categories': [
        {'id': 1, 'name': 'square', 'keypoints': names, 'skeleton': [], 'keypoint_oks_sigmas': [0.05] * 5}]}))
    catalog = tmp_path / 'catalog.json'
    catalog.write_text(json.dumps({'names_only': {'image_directory': str(folder), 'annotation_file': str(annotations)}}))
    overrides = ['DATASET_CATALOG', str(catalog), 'TEST.DATASETS', "('names_only',)", 'TEST.SCORE_THRESH', '0.0',
                 'TEST.DETECTIONS_PER_IM', '5']
    # A keypoint head whose random logits pass the drawing threshold.
    model_type, model = _infer_with_a_drawn_head(tmp_path, config, folder, overrides, 'keypoint_head')
    image = cv2.imread(str(folder / 'one.jpg'))
    cls_boxes, _, cls_keyps = im_detect_all(model_type, model, image)
    written = cv2.imread(str(tmp_path / 'vis' / 'one.png'))
    classes = ['__background__', 'square']  # the labels the tool takes from the dataset
    with_skeleton = vis_one_image(image, cls_boxes, classes, 0.0, cls_keyps=cls_keyps, keypoint_names=names)
    assert np.array_equal(written, with_skeleton)
    assert not np.array_equal(written, vis_one_image(image, cls_boxes, classes, 0.0, cls_keyps=cls_keyps))
