"""Data mistakes that used to train or test in silence, or end in a traceback: each is one DatasetError
naming the file. Annotation files that are not JSON or lack "images" / "categories", a repeated image
id, testing on a dataset without images, a JPEG with garbled bytes (a warning naming it), a record whose width and height disagree with the decoded image, CenterNet trained
on images without a single box, and infer_simple on a folder without images."""
import importlib.util
import json
import logging
import os

import cv2
import numpy as np
import pytest

from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import model_builder
from detectron.roi_data.minibatch import prepare_training_entry, read_image
from detectron.utils.errors import DatasetError
from support.tiny_runs import register_annotations, use_centernet, write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def private_dataset_registrations(monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """(catalog path, the tiny COCO dict): 8 images, 2 categories."""
    catalog = write_tiny_datasets(tmp_path_factory.mktemp('faults'))
    return catalog, json.loads((catalog.parent / 'all.json').read_text())


@pytest.mark.parametrize('name, content, message', [
    ('cut', '{"images": [{"id": 1, "file_na', 'is not valid JSON (Unterminated string starting at: line 1 column 23 '
                                             '(char 22)); restore or regenerate it'),
    ('no_categories', {'images': [], 'annotations': []}, 'has no "categories" list: it is not a COCO-format '
                                                          'detection file'),
    ('a_list', [1, 2], 'has no "images" or "categories" list: it is not a COCO-format detection file'),
])
def test_unusable_annotation_files_are_one_line_naming_the_file(tiny, name, content, message):
    path = register_annotations(tiny, name, content)
    with pytest.raises(DatasetError) as err:
        JsonDataset(name)
    assert str(err.value) == 'Annotation file {} of dataset {} {}'.format(path, name, message)


def test_a_repeated_image_id_is_refused(tiny):
    coco = dict(tiny[1])
    coco['images'] = coco['images'] + [dict(coco['images'][3], file_name='im4.png')]
    path = register_annotations(tiny, 'twice', coco)
    with pytest.raises(DatasetError) as err:
        JsonDataset('twice')
    assert str(err.value) == ('Annotation file {} of dataset twice lists image id 103 2 times (1 ids repeated): '
                              'each image needs its own id'.format(path))


def test_an_image_record_of_another_size_than_the_image_is_refused_naming_the_file(tiny):
    coco = dict(tiny[1])
    coco['images'] = [dict(image, width=image['width'] * 3, height=image['height'] * 3) if image['id'] == 101
                      else image for image in coco['images']]
    register_annotations(tiny, 'tripled', coco)
    roidb = JsonDataset('tripled').get_roidb(gt=True)
    prepare_training_entry(roidb[0], np.random.RandomState(0), (64,), 96, cfg.PIXEL_MEANS)  # a right record
    with pytest.raises(DatasetError) as err:
        prepare_training_entry(roidb[1], np.random.RandomState(0), (64,), 96, cfg.PIXEL_MEANS)
    assert str(err.value) == (
        "Image '{}' is 96 x 64 pixels (width x height) but its record in the annotation file says 288 x 192; fix "
        "the image's width and height there (or the image)".format(tiny[0].parent / 'images' / 'im1.png'))


def test_centernet_refuses_a_training_set_without_boxes(tiny, tmp_path):
    register_annotations(tiny, 'bare', dict(tiny[1], annotations=[]))
    use_centernet(tiny[0], tmp_path, 'DATASET_CATALOG', str(tiny[0].parent / 'catalog_bare.json'),
                  'TRAIN.DATASETS', "('tiny_train',)")
    model_type = model_builder.build_model_type(cfg)
    assert len(model_type.training_roidb()) == 8  # with boxes: trains
    cfg.defrost()
    cfg.TRAIN.DATASETS = ('bare',)
    with pytest.raises(DatasetError) as err:
        model_type.training_roidb()
    assert str(err.value) == ("No training images with annotations in TRAIN.DATASETS ('bare',): none of the 8 images "
                              "has a box; check the annotation files")


def test_infer_simple_on_a_folder_without_images_is_one_line(tmp_path):
    spec = importlib.util.spec_from_file_location('infer_simple', os.path.join(REPO, 'tools', 'infer_simple.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    (tmp_path / 'a.png').write_bytes(b'')
    with pytest.raises(DatasetError) as err:
        tool._image_paths(str(tmp_path), 'jpg')
    assert str(err.value) == 'folder {} holds no *.jpg image; pass --image-ext for other images, or another ' \
                             'folder'.format(tmp_path)
    assert tool._image_paths(str(tmp_path), 'png') == [str(tmp_path / 'a.png')]


def test_testing_a_dataset_without_images_is_one_line(tiny, tmp_path):
    path = register_annotations(tiny, 'empty', {'images': [], 'annotations': [], 'categories': tiny[1]['categories']})
    use_centernet(tiny[0], tmp_path, 'DATASET_CATALOG', str(tiny[0].parent / 'catalog_empty.json'),
                  'TEST.DATASETS', "('empty',)")
    with pytest.raises(DatasetError) as err:
        test_engine.test_net(model_builder.build_model_type(cfg), str(tmp_path / 'never_read.pth'), 'empty',
                             str(tmp_path))
    assert str(err.value) == ('dataset empty ({}) lists no images: there is nothing to test; check TEST.DATASETS and '
                              'the annotation file'.format(path))


def test_a_jpeg_with_garbled_bytes_is_named_in_a_warning(tmp_path, caplog, capfd):
    image = (np.random.RandomState(0).rand(64, 96, 3) * 255).astype(np.uint8)
    data = bytearray(cv2.imencode('.jpg', image)[1].tobytes())
    middle = len(data) // 2
    data[middle:middle + 40] = bytes((b * 7 + 13) % 256 for b in data[middle:middle + 40])
    path = tmp_path / 'garbled.jpg'
    path.write_bytes(bytes(data))
    capfd.readouterr()
    with caplog.at_level(logging.WARNING):
        decoded = read_image(str(path))
    assert decoded.shape == (64, 96, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "Image '{}' holds corrupt JPEG data (libjpeg: Corrupt JPEG data: 608 extraneous bytes before marker 0xd9): "
        "it decodes with wrong pixels; restore the file or remove it from the dataset".format(path)]
    assert 'Corrupt JPEG' not in capfd.readouterr().err  # not also libjpeg's line without the file name
    caplog.clear()
    path.write_bytes(cv2.imencode('.jpg', image)[1].tobytes())
    with caplog.at_level(logging.WARNING):
        read_image(str(path))
    assert not caplog.records  # the intact file
