"""Dataset inputs that used to end in a traceback from deep in the loader or the evaluation, or were used
in silence: segmentations (Mask R-CNN), annotation and image records, and images whose pixels disagree
with the json. Each is one DatasetError line naming the file, image id and annotation id, raised when
the roidb is built (images: when decoded); what Detectron drops on purpose is dropped with a warning.
Direct roidb calls for the many variants, then tools/train_net.py and tools/test_net.py end to end
(1 and 2 gloo processes): one `error:` line, exit 2, no traceback, no process left."""
import copy
import json
import logging
import os
import re
import subprocess
import sys

import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest
from PIL import Image

from detectron.datasets import annotations
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.roi_data.loader import build_test_loader
from detectron.roi_data.minibatch import read_entry_image
from detectron.utils.errors import DatasetError

from support.processes import DEADLINE_S, job_env, session_processes, survivors_after
from support.tiny_runs import (MASK_OVERRIDES, REPO, SHAPES_CFG, TINY_OVERRIDES, register_annotations,
                               write_tiny_datasets)

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """(catalog path, the tiny COCO dict with unique annotation ids): 8 images, 2 categories."""
    catalog = write_tiny_datasets(tmp_path_factory.mktemp('inputs'))
    coco = json.loads((catalog.parent / 'all.json').read_text())
    for i, ann in enumerate(coco['annotations']):
        ann['id'] = i + 1
    return catalog, coco


def _register(tiny, name, coco):
    """Register dataset `name` of the tiny images with annotation file `coco` (test_data_faults' way);
    returns (its path, the catalog file that adds it to the tiny ones, for DATASET_CATALOG)."""
    return register_annotations(tiny, name, coco), str(tiny[0].parent / 'catalog_{}.json'.format(name))


REMOVED = object()


def _changed(tiny, ann_id=1, **fields):
    """The tiny COCO dict with annotation ann_id's fields set (REMOVED: taken out)."""
    coco = copy.deepcopy(tiny[1])
    ann = next(a for a in coco['annotations'] if a['id'] == ann_id)
    for key, value in fields.items():
        if value is REMOVED:
            ann.pop(key)
        else:
            ann[key] = value
    return coco


def _head(path, ann_id=1, image_id=100, name='x'):
    return 'Annotation {} (image {}) in {} (dataset {}) '.format(ann_id, image_id, path, name)


# --- segmentations (class 1) ----------------------------------------------------------------------

_CROWD = 7  # an annotation made a crowd region for the RLE cases

SEGMENTATIONS = [
    ('empty', 1, {'segmentation': []}, 'has no polygon of 3 or more points in its segmentation, so Mask R-CNN has '
                                       'no mask for it; fix the annotation or remove it'),
    ('two_points', 1, {'segmentation': [[10, 10, 20, 20]]},
     'has no polygon of 3 or more points (only 1 of fewer than 3 points) in its segmentation, so Mask R-CNN has no '
     'mask for it; fix the annotation or remove it'),
    ('odd_length', 1, {'segmentation': [[10, 10, 20, 10, 20, 20, 15]]},
     'has a polygon of 7 numbers, an odd count: a polygon is x, y pairs; fix the annotation or remove it'),
    ('flat_list', 1, {'segmentation': [10, 10, 20, 10, 20, 20]},
     'has segmentation [10, 10, 20, 10, 20, 20]: a flat list, where COCO gives a list of polygons ([[x0, y0, x1, '
     'y1, ...], ...]); fix the annotation or remove it'),
    ('null', 1, {'segmentation': None}, 'has segmentation None: COCO gives a list of polygons or an RLE dict; fix '
                                          'the annotation or remove it'),
    ('missing', 1, {'segmentation': REMOVED}, 'has no "segmentation", which Mask R-CNN (MODEL.MASK_ON) needs; fix the '
                                           'annotation or remove it'),
    ('text_coordinate', 1, {'segmentation': [[10, 10, 20, 10, 20, '20']]},
     "has polygon [10, 10, 20, 10, 20, '20'], whose coordinates are not all finite numbers; fix the annotation or "
     "remove it"),
    ('crowd_rle_garbage', _CROWD, {'iscrowd': 1, 'segmentation': {'size': [64, 96], 'counts': '!!garbage'}},
     "has RLE counts '!!garbage' that are not a valid COCO run-length encoding of its 64 x 96 mask; fix the "
     "annotation or remove it"),
    ('crowd_rle_short', _CROWD, {'iscrowd': 1, 'segmentation': {'size': [64, 96], 'counts': [100, 20, 30]}},
     'has RLE counts [100, 20, 30] that are not a valid COCO run-length encoding of its 64 x 96 mask (its runs '
     'cover 150 pixels, not 6144); fix the annotation or remove it'),
    ('crowd_rle_other_size', _CROWD, {'iscrowd': 1, 'segmentation': {'size': [32, 96], 'counts': [3072]}},
     'has an RLE segmentation of size [32, 96] but its image is [64, 96] (height, width); fix the annotation or '
     'remove it'),
]


@pytest.mark.parametrize('testing', [False, True], ids=['training', 'testing'])
@pytest.mark.parametrize('name, ann_id, fields, problem', SEGMENTATIONS, ids=[s[0] for s in SEGMENTATIONS])
def test_an_unusable_segmentation_is_one_line_naming_file_image_and_annotation(tiny, name, ann_id, fields, problem,
                                                                              testing):
    coco = _changed(tiny, ann_id, **fields)
    path, _ = _register(tiny, name, coco)
    image_id = next(a['image_id'] for a in coco['annotations'] if a['id'] == ann_id)
    with pytest.raises(DatasetError) as err:
        if testing:  # test_net's roidb with MODEL.MASK_ON: before detection, not in the mask evaluation
            JsonDataset(name).get_roidb(segms=True)
        else:
            combined_roidb_for_training(name, segms=True)
    assert str(err.value) == _head(path, ann_id, image_id, name) + problem
    JsonDataset(name).get_roidb(gt=True)  # boxes only: the segmentation is not used


def _blob_mask(height, width):
    """A mask with two parts and a hole."""
    mask = np.zeros((height, width), np.uint8)
    mask[5:30, 10:40] = 1
    mask[12:20, 18:30] = 0
    mask[40:60, 50:90] = 1
    mask[45, 60] = 0
    return mask


@pytest.mark.parametrize('compressed', [True, False], ids=['compressed', 'uncompressed'])
def test_a_non_crowd_rle_trains_from_polygons_of_exactly_its_pixels(tiny, compressed):
    mask = _blob_mask(64, 96)
    rle = mask_util.encode(np.asfortranarray(mask))
    if compressed:
        rle = {'size': rle['size'], 'counts': rle['counts'].decode()}
    else:
        flat = mask.T.flatten()
        changes = np.flatnonzero(np.diff(np.concatenate(([0], flat, [1 - flat[-1]]))))
        rle = {'size': [64, 96], 'counts': np.diff(np.concatenate(([0], changes))).tolist()}
        assert sum(rle['counts']) == 64 * 96
    coco = _changed(tiny, 1, segmentation=rle, bbox=[10, 5, 80, 55], area=int(mask.sum()))
    _register(tiny, 'rle', coco)
    roidb = combined_roidb_for_training('rle', segms=True)
    original = roidb[0]
    flipped = next(e for e in roidb if e['flipped'] and e['id'] == original['id'])
    polygons = original['segms'][0]
    assert all(len(p) == 8 for p in polygons)  # rectangles along the pixel edges
    decoded = mask_util.decode(mask_util.merge(mask_util.frPyObjects(polygons, 64, 96)))
    np.testing.assert_array_equal(decoded, mask)
    assert flipped['segms'][0] == [[96 - x - 1 if i % 2 == 0 else x for i, x in enumerate(p)] for p in polygons]


def test_compressed_rle_counts_are_read_as_pycocotools_writes_them():
    rng = np.random.RandomState(0)
    for _ in range(20):
        mask = (rng.rand(23, 17) > rng.rand()).astype(np.uint8)
        flat = mask.T.flatten()
        runs, value, run = [], 0, 0
        for pixel in flat:
            if pixel != value:
                runs.append(run)
                value, run = pixel, 0
            run += 1
        runs.append(run)
        text = mask_util.encode(np.asfortranarray(mask))['counts'].decode()
        assert annotations.compressed_rle_counts(text).tolist() == runs
    assert annotations.compressed_rle_counts('') is None
    assert annotations.compressed_rle_counts('0a') is None  # ends inside a number ('a' has the continuation bit)


def test_short_polygons_beside_others_are_dropped_with_a_warning(tiny, caplog):
    coco = _changed(tiny, 2, segmentation=tiny[1]['annotations'][1]['segmentation'] + [[1, 1, 2, 2]])
    _register(tiny, 'short', coco)
    with caplog.at_level(logging.WARNING):
        roidb = combined_roidb_for_training('short', segms=True, use_flipped=False)
    entry = next(e for e in roidb if e['id'] == coco['annotations'][1]['image_id'])
    assert entry['segms'][0] == tiny[1]['annotations'][1]['segmentation']
    assert 'Dataset short ({}): 1 annotations have polygons of fewer than 3 points, dropped as in Detectron ' \
           '(ids 2)'.format(tiny[0].parent / 'short.json') in caplog.text


# --- annotation and image records (class 2) -------------------------------------------------------

RECORDS = [
    ('no_area', {'area': REMOVED}, 'has no "area"; a COCO annotation has an id, image_id, category_id, bbox, area and '
                                'iscrowd; fix the annotation or remove it'),
    ('no_iscrowd', {'iscrowd': REMOVED}, 'has no "iscrowd"; a COCO annotation has an id, image_id, category_id, bbox, '
                                      'area and iscrowd; fix the annotation or remove it'),
    ('three_numbers', {'bbox': [10, 10, 20]}, 'has bbox [10, 10, 20]: a COCO bbox is 4 finite numbers [x, y, width, '
                                             'height]; fix the annotation or remove it'),
    ('nan_bbox', {'bbox': [10, float('nan'), 20, 20]}, 'has bbox [10, nan, 20, 20]: a COCO bbox is 4 finite numbers '
                                                       '[x, y, width, height]; fix the annotation or remove it'),
    ('text_area', {'area': '400'}, "has area '400', not a finite number; fix the annotation or remove it"),
    ('crowd_2', {'iscrowd': 2}, 'has iscrowd 2, not 0 or 1; fix the annotation or remove it'),
]


@pytest.mark.parametrize('name, fields, problem', RECORDS, ids=[r[0] for r in RECORDS])
def test_a_malformed_annotation_is_one_line_naming_file_image_and_annotation(tiny, name, fields, problem):
    path, _ = _register(tiny, name, _changed(tiny, 1, **fields))
    with pytest.raises(DatasetError) as err:
        JsonDataset(name)  # training and testing both read the json through it
    assert str(err.value) == _head(path, 1, 100, name) + problem


def test_an_annotation_of_an_image_not_in_the_file_is_an_error_naming_both_ids(tiny):
    path, _ = _register(tiny, 'orphan', _changed(tiny, 3, image_id=999))
    with pytest.raises(DatasetError) as err:
        JsonDataset('orphan')
    assert str(err.value) == ('Annotation 3 (image 999) in {} (dataset orphan) refers to image id 999, which is not in '
                              'the "images" list; fix its image_id, or remove it with the image it belonged '
                              'to'.format(path))


@pytest.mark.parametrize('key, value, problem', [
    ('width', None, 'has no "width"'),
    ('height', 0, 'has height 0, not a positive whole number of pixels'),
    ('width', 95.5, 'has width 95.5, not a positive whole number of pixels'),
    ('file_name', None, 'has file_name None, not a file name'),
])
def test_a_malformed_image_record_is_one_line_naming_file_and_image(tiny, key, value, problem):
    coco = copy.deepcopy(tiny[1])
    if value is None:
        coco['images'][2].pop(key)
    else:
        coco['images'][2][key] = value
    path, _ = _register(tiny, 'image_record', coco)
    with pytest.raises(DatasetError) as err:
        JsonDataset('image_record')
    assert str(err.value) == ('Image record 102 in {} (dataset image_record) {}; fix the record (a COCO image has an '
                              'id, a file_name and its width and height in pixels)'.format(path, problem))


def test_boxes_detectron_drops_are_dropped_with_a_warning_naming_them(tiny, caplog):
    coco = _changed(tiny, 1, bbox=[10, 10, -5, 20])
    next(a for a in coco['annotations'] if a['id'] == 4)['area'] = 0
    path, _ = _register(tiny, 'invalid_boxes', coco)
    with caplog.at_level(logging.WARNING):
        roidb = JsonDataset('invalid_boxes').get_roidb(gt=True)
    assert len(roidb[0]['boxes']) == 0
    assert ('Dataset invalid_boxes ({}): 2 annotations have a box of no width or height inside their image or an '
            'area <= 0 and are not used, as in Detectron (ids 1, 4)'.format(path)) in caplog.text


def test_repeated_annotation_ids_are_named_in_a_warning(tiny, caplog):
    coco = _changed(tiny, 3, id=2)
    path, _ = _register(tiny, 'repeated', coco)
    with caplog.at_level(logging.WARNING):
        JsonDataset('repeated')
    assert 'Annotation file {} (dataset repeated): 1 annotations repeat the id of an earlier one (ids 2)'.format(
        path) in caplog.text


# --- images (class 6) -----------------------------------------------------------------------------

def _exif_jpeg(path, height, width, orientation):
    pixels = np.random.RandomState(1).randint(0, 256, (height, width, 3)).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, quality=95, exif=exif)
    return cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)


def test_an_exif_rotated_jpeg_is_read_as_stored_where_its_record_is(tmp_path):
    path = tmp_path / 'six.jpg'
    stored = _exif_jpeg(path, 64, 96, 6)
    assert cv2.imread(str(path)).shape == (96, 64, 3)  # cv2.imread's default turns it
    entry = {'image': str(path), 'height': 64, 'width': 96}
    np.testing.assert_array_equal(read_entry_image(entry), stored)  # training and testing read it so
    with pytest.raises(DatasetError) as err:  # a record of the turned view: the advice is not to swap
        read_entry_image(dict(entry, height=96, width=64))
    assert str(err.value) == (
        "Image '{}' is 96 x 64 pixels (width x height) but its record in the annotation file says 64 x 96; its EXIF "
        "orientation tag (6) turns it to the record's size, but images are read as stored, as COCO's annotations "
        "are; if the boxes were drawn on the turned view, store the image turned (e.g. PIL.ImageOps.exif_transpose) "
        "without the tag, do not swap the record's width and height".format(path))


@pytest.mark.parametrize('num_workers', [0, 1])
def test_a_test_image_of_another_size_than_its_record_is_one_line(tiny, num_workers):
    coco = copy.deepcopy(tiny[1])
    coco['images'][1].update(width=288, height=192)
    _register(tiny, 'tripled_test', coco)
    roidb = JsonDataset('tripled_test').get_roidb()
    assert len(list(build_test_loader(roidb, [0], num_workers=num_workers))) == 1
    with pytest.raises(DatasetError) as err:
        list(build_test_loader(roidb, [0, 1], num_workers=num_workers))
    assert str(err.value) == (
        "Image '{}' is 96 x 64 pixels (width x height) but its record in the annotation file says 288 x 192; fix "
        "the image's width and height there (or the image)".format(tiny[0].parent / 'images' / 'im1.png'))


# --- end to end: tools/train_net.py and tools/test_net.py -----------------------------------------

def _command_line(pid):
    try:
        with open('/proc/{}/cmdline'.format(pid), 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return '(gone)'


def _run_tool(tool, catalog, output_dir, *overrides):
    process = subprocess.Popen(
        [sys.executable, os.path.join(REPO, 'tools', tool), '--cfg', SHAPES_CFG] + TINY_OVERRIDES
        + ['DATASET_CATALOG', catalog, 'OUTPUT_DIR', str(output_dir)] + list(overrides),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(), start_new_session=True)
    try:
        _, err = process.communicate(timeout=300)
        # The promise of docs/RELIABILITY.md: every process of the job gone within DEADLINE_S of the launcher.
        left = survivors_after(session_processes(process.pid), DEADLINE_S)
    finally:
        for pid in session_processes(process.pid):
            os.kill(pid, 9)
    assert left == [], [_command_line(pid) for pid in left]
    assert process.returncode == 2, err
    assert 'Traceback' not in err, err
    errors = [line for line in err.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    return errors[0]


def _image_of_another_size(tiny):
    coco = copy.deepcopy(tiny[1])
    for image in coco['images']:
        image.update(width=image['width'] * 3, height=image['height'] * 3)
    return coco


END_TO_END = [
    ('segmentation', lambda tiny: _changed(tiny, 1, segmentation=[10, 10, 20, 10, 20, 20]), MASK_OVERRIDES,
     'Annotation 1 (image 100) in {path} (dataset e2e_segmentation) has segmentation [10, 10, 20, 10, 20, 20]: a '
     'flat list'),
    ('record', lambda tiny: _changed(tiny, 1, bbox=[10, 10, 20]), [],
     'Annotation 1 (image 100) in {path} (dataset e2e_record) has bbox [10, 10, 20]: a COCO bbox is 4 finite '
     'numbers'),
    ('image_size', _image_of_another_size, [],
     r"Image '{images}/im\d\.png' is (96 x 64|64 x 96) pixels \(width x height\) but its record in the annotation "
     r"file says (288 x 192|192 x 288); fix the image's width and height there \(or the image\)$"),
]


# Each input in one process; in two, an annotation's error (read by each rank) and an image's (read by a
# loader in a rank): the segmentation's error takes the annotation's path there too.
END_TO_END_RUNS = [pytest.param(*case, 1, id='{}-1'.format(case[0])) for case in END_TO_END] + [
    pytest.param(*case, 2, id='{}-2'.format(case[0])) for case in END_TO_END if case[0] != 'segmentation']


@pytest.mark.processes
@pytest.mark.parametrize('kind, coco, overrides, message, num_gpus', END_TO_END_RUNS)
def test_train_net_on_an_unusable_input_is_one_error_line(tiny, tmp_path, kind, coco, overrides, message, num_gpus):
    name = 'e2e_' + kind
    path, catalog = _register(tiny, name, coco(tiny))
    line = _run_tool('train_net.py', catalog, tmp_path, 'TRAIN.DATASETS', "('{}',)".format(name), '--skip-test',
                     'NUM_GPUS', str(num_gpus), 'SOLVER.MAX_ITER', '2', *overrides)
    assert line.startswith('error: ' + ('rank ' if num_gpus > 1 else '')), line
    if kind == 'image_size':  # whichever image a rank reads first: its record's size and the size it has
        assert re.search(message.format(images=re.escape(str(tiny[0].parent / 'images'))), line), line
    else:
        assert message.format(path=path) in line, line


@pytest.mark.processes
@pytest.mark.parametrize('kind', ['segmentation', 'area'])
def test_test_net_refuses_unusable_ground_truth_before_detecting(tiny, tmp_path, kind):
    coco = _changed(tiny, 5, segmentation=[]) if kind == 'segmentation' else _changed(tiny, 5, area=REMOVED)
    path, catalog = _register(tiny, 'e2e_test_' + kind, coco)
    weights = tmp_path / 'never_read.pth'
    weights.write_bytes(b'not read: the dataset is refused first')
    line = _run_tool('test_net.py', catalog, tmp_path, 'TEST.DATASETS', "('e2e_test_{}',)".format(kind),
                     'TEST.WEIGHTS', str(weights), *(MASK_OVERRIDES if kind == 'segmentation' else []))
    problem = ('has no polygon of 3 or more points in its segmentation' if kind == 'segmentation' else
               'has no "area"')
    assert line.startswith('error: Annotation 5 (image 103) in {} (dataset e2e_test_{}) {}'.format(
        path, kind, problem)), line
