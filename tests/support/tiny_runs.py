"""The tiny datasets (8 drawn images, two categories with non-contiguous json ids) and the tiny
R-CNN and CenterNet configs on them: runs that train or test in about a second on one CPU core.
Shared by the engine tests (tests/core), tests/datasets, tests/tools and tests/utils; the fixtures
tiny_catalog and private_dataset_registrations are in tests/conftest.py."""
import json
import os
import pickle

import cv2
import numpy as np
import torch

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from detectron.utils import keypoints as keypoint_utils

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES_CFG = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_R-18-FPN.yaml')

# Two classes with non-contiguous json ids, so the contiguous <-> json id mapping matters.
TINY_CATEGORIES = [{'id': 7, 'name': 'red'}, {'id': 3, 'name': 'blue'}]
_CATEGORY_COLORS = {7: (40, 40, 220), 3: (220, 60, 40)}  # BGR
TINY_IMAGE_SIZES = [(64, 96)] * 6 + [(96, 64)] * 2  # (height, width): landscape and portrait groups

# The shapes demo shrunk to run an iteration in well under a second on one CPU core.
TINY_OVERRIDES = [
    'TRAIN.DATASETS', "('tiny_train',)", 'TEST.DATASETS', "('tiny_val',)", 'MODEL.NUM_CLASSES', '3',
    'FPN.DIM', '32', 'FAST_RCNN.MLP_HEAD_DIM', '64', 'GROUP_NORM.NUM_GROUPS', '32',
    'TRAIN.SCALES', '(64,)', 'TRAIN.MAX_SIZE', '96', 'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96',
    'TRAIN.RPN_PRE_NMS_TOP_N', '200', 'TRAIN.RPN_POST_NMS_TOP_N', '64',
    'TEST.RPN_PRE_NMS_TOP_N', '100', 'TEST.RPN_POST_NMS_TOP_N', '50',
    'TRAIN.BATCH_SIZE_PER_IM', '32', 'TRAIN.IMS_PER_BATCH', '2', 'DATA_LOADER.NUM_THREADS', '0',
    'SOLVER.MAX_ITER', '4', 'TRAIN.SNAPSHOT_ITERS', '2', 'SOLVER.WARM_UP_ITERS', '2',
]
TRAIN_SUBDIR = os.path.join('train', 'tiny_train', 'generalized_rcnn')


def _draw_image(rng, height, width, categories):
    """A noisy grey image with one filled rectangle per category; returns (image, COCO bboxes)."""
    image = rng.randint(150, 200, size=(height, width, 3)).astype(np.uint8)
    boxes = []
    for category in categories:
        w, h = rng.randint(14, 30), rng.randint(14, 30)
        x, y = rng.randint(0, width - w), rng.randint(0, height - h)
        image[y:y + h, x:x + w] = _CATEGORY_COLORS[category]
        boxes.append([x, y, w, h])
    return image, boxes


def write_tiny_datasets(root):
    """Write 8 images and the catalog of 'tiny_train', 'tiny_val' (all 8), 'tiny_val_small' (images 3..5)
    and 'tiny_keypoints' (all 8, write_tiny_keypoints) into root; returns the catalog path (for the
    DATASET_CATALOG key)."""
    rng = np.random.RandomState(0)
    (root / 'images').mkdir()
    images, annotations = [], []
    for i, (height, width) in enumerate(TINY_IMAGE_SIZES):
        categories = [7, 3][:1 + i % 2] if i % 3 else [3]
        image, boxes = _draw_image(rng, height, width, categories)
        name = 'im{}.png'.format(i)
        cv2.imwrite(str(root / 'images' / name), image)
        images.append({'id': 100 + i, 'file_name': name, 'width': width, 'height': height})
        annotations += [{'id': len(annotations) + 1, 'image_id': 100 + i, 'category_id': c, 'bbox': b,
                         'area': b[2] * b[3], 'iscrowd': 0, 'segmentation': [_outline(*b)]}
                        for c, b in zip(categories, boxes)]
    write_coco(root / 'all.json', images, annotations)
    small = images[3:6]
    write_coco(root / 'small.json', small, [a for a in annotations if 103 <= a['image_id'] <= 105])
    write_tiny_keypoints(root / 'keypoints.json', images, annotations, rng)
    catalog = {name: {'image_directory': 'images', 'annotation_file': ann}
               for name, ann in (('tiny_train', 'all.json'), ('tiny_val', 'all.json'),
                                 ('tiny_val_small', 'small.json'), ('tiny_keypoints', 'keypoints.json'))}
    path = root / 'catalog.json'
    path.write_text(json.dumps(catalog))
    return path


def write_tiny_keypoints(path, images, annotations, rng):
    """The tiny objects as one category 'person' with COCO's 17 keypoint names, each object with its 17
    keypoints at random pixels inside its box, visible (v 2): a Keypoint R-CNN's tiny training data."""
    names, _ = keypoint_utils.get_keypoints()
    person = [{'id': 1, 'name': 'person', 'keypoints': names, 'skeleton': []}]
    with_keypoints = []
    for ann in annotations:
        x, y, w, h = ann['bbox']
        points = np.stack([rng.randint(x, x + w, len(names)), rng.randint(y, y + h, len(names)),
                           np.full(len(names), 2)], axis=1)
        with_keypoints.append(dict(ann, category_id=1, keypoints=points.ravel().tolist(), num_keypoints=len(names)))
    path.write_text(json.dumps({'images': images, 'annotations': with_keypoints, 'categories': person}))


def _outline(x, y, w, h):
    """The polygon along the pixel edges of a filled rectangle: pycocotools rasterises it to exactly
    its w x h pixels (Mask R-CNN's targets and the segm evaluation)."""
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def write_tiny_proposals(catalog, path, dataset='tiny_keypoints'):
    """A Detectron-format proposal file at path for the images of dataset (tiny_keypoints: all 8, so it serves
    tiny_train and tiny_val too): each gt box shifted, plus boxes spread over the image, scored in decreasing
    order."""
    dataset_catalog.register_catalog_file(str(catalog))
    roidb = JsonDataset(dataset).get_roidb(gt=True)
    rng = np.random.RandomState(0)
    boxes, scores, ids = [], [], []
    for entry in roidb:
        shifted = entry['boxes'] + rng.uniform(-3, 3, size=entry['boxes'].shape)
        spread = np.sort(rng.uniform(0, 60, size=(20, 4)).reshape(20, 2, 2), axis=1).transpose(0, 2, 1).reshape(20, 4)
        entry_boxes = np.vstack([shifted, spread]).astype(np.float32)
        boxes.append(entry_boxes)
        scores.append(np.linspace(1, 0.1, len(entry_boxes)).astype(np.float32))
        ids.append(entry['id'])
    with open(path, 'wb') as f:
        pickle.dump({'boxes': boxes, 'scores': scores, 'ids': ids}, f)
    return str(path)


def write_coco(path, images, annotations):
    path.write_text(json.dumps({'images': images, 'annotations': annotations, 'categories': TINY_CATEGORIES}))


def use_tiny_config(catalog, output_dir, *overrides):
    """Set the global cfg to the tiny model on the tiny datasets (tests/conftest.py restores it)."""
    cfg.defrost()
    finalize_cfg(SHAPES_CFG, TINY_OVERRIDES + ['DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(output_dir)]
                 + list(overrides), training=True)


def json_stats(stdout):
    """The raw json_stats lines' text and their parsed dicts."""
    lines = [line[len('json_stats: '):] for line in stdout.splitlines() if line.startswith('json_stats: ')]
    return lines, [json.loads(line) for line in lines]


def use_centernet(catalog, output_dir, *overrides):
    """res_18 at 64 px on the tiny datasets (2 categories), 2 images per iteration, float32."""
    cfg.defrost()
    return finalize_cfg(
        os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_centernet_res18.yaml'),
        ['SOLVER.AMP.ENABLED', 'False', 'DATASET_CATALOG', str(catalog), 'TRAIN.DATASETS', "('tiny_train',)",
         'TEST.DATASETS', "('tiny_val',)", 'CENTERNET.NUM_CLASSES', '2', 'CENTERNET.INPUT_RES', '64',
         'CENTERNET.BATCH_SIZE', '2', 'CENTERNET.LR', '0.001', 'CENTERNET.LR_BATCH_SIZE', '2',
         'CENTERNET.NUM_EPOCHS', '1', 'CENTERNET.LR_STEP', '(1,)', 'DATA_LOADER.NUM_THREADS', '0',
         'OUTPUT_DIR', str(output_dir)] + list(overrides), training=True)


# The mask head of the tiny model (MODEL.MASK_ON).
MASK_OVERRIDES = ['MODEL.MASK_ON', 'True', 'MRCNN.ROI_MASK_HEAD', 'mask_rcnn_heads.mask_rcnn_fcn_head_v1up4convs',
                  'MRCNN.RESOLUTION', '14', 'MRCNN.ROI_XFORM_RESOLUTION', '7', 'MRCNN.ROI_XFORM_SAMPLING_RATIO', '2',
                  'MRCNN.DILATION', '1', 'MRCNN.DIM_REDUCED', '16']


def save_random_mask_model(path):
    """Save a randomly initialised model of the global cfg (a Mask R-CNN), its mask head drawn large
    enough for masks to show, as a checkpoint at path."""
    torch.manual_seed(0)
    model = model_builder.create(cfg)
    with torch.no_grad():
        for param in model.mask_head.parameters():
            param.normal_(0.0, 0.3)
    torch.save({'model': model.state_dict()}, path)


def register_annotations(tiny, name, text):
    """Register dataset `name` whose annotation file holds `text` (a str or a dict to dump); returns its path."""
    catalog, _ = tiny
    path = catalog.parent / '{}.json'.format(name)
    path.write_text(text if isinstance(text, str) else json.dumps(text))
    entries = json.loads(catalog.read_text())
    entries[name] = {'image_directory': 'images', 'annotation_file': path.name}
    variant = catalog.parent / 'catalog_{}.json'.format(name)
    variant.write_text(json.dumps(entries))
    dataset_catalog.register_catalog_file(str(variant))
    return str(path)


RETINANET_CFG = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_retinanet_R-18-FPN.yaml')


def use_retinanet(catalog, output_dir, *overrides):
    """The RetinaNet shapes demo shrunk as TINY_OVERRIDES shrink the R-CNN one, on the tiny datasets."""
    cfg.defrost()
    return finalize_cfg(RETINANET_CFG, [
        'TRAIN.DATASETS', "('tiny_train',)", 'TEST.DATASETS', "('tiny_val',)", 'MODEL.NUM_CLASSES', '3',
        'FPN.DIM', '32', 'GROUP_NORM.NUM_GROUPS', '16', 'RETINANET.NUM_CONVS', '1', 'TRAIN.SCALES', '(64,)',
        'TRAIN.MAX_SIZE', '96', 'TEST.SCALE', '64', 'TEST.MAX_SIZE', '96', 'TRAIN.IMS_PER_BATCH', '2',
        'DATA_LOADER.NUM_THREADS', '0', 'SOLVER.MAX_ITER', '4', 'TRAIN.SNAPSHOT_ITERS', '2', 'SOLVER.WARM_UP_ITERS',
        '2', 'DATASET_CATALOG', str(catalog), 'OUTPUT_DIR', str(output_dir)] + list(overrides), training=True)
