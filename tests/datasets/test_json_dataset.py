"""JsonDataset and the training roidb on a hand-written COCO json whose expected values are worked
out by hand from Detectron's rules (x2 = x1 + max(0, w - 1), clip to W-1/H-1, keep area > 0 and
x2 > x1 and y2 > y1, crowd rows -1, flip x -> W - x - 1)."""

import json

import numpy as np
import pycocotools.mask as mask_util
import pytest

from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.roidb import combined_roidb_for_training, filter_for_training
from detectron.utils.errors import DatasetError


def _ann(ann_id, image_id, category_id, bbox, area, iscrowd=0, **extra):
    return dict(id=ann_id, image_id=image_id, category_id=category_id, bbox=bbox, area=area,
                iscrowd=iscrowd, segmentation=[], **extra)


TINY_COCO = {
    # Images and categories deliberately out of id order.
    'images': [
        {'id': 30, 'file_name': 'c.jpg', 'width': 64, 'height': 64, 'license': 1},
        {'id': 10, 'file_name': 'a.jpg', 'width': 100, 'height': 50, 'url': 'http://x'},
        {'id': 20, 'file_name': 'b.jpg', 'width': 40, 'height': 30},
    ],
    'categories': [{'id': 7, 'name': 'dog'}, {'id': 3, 'name': 'cat'}],
    'annotations': [
        _ann(1, 10, 7, [10, 5, 20, 10], 200),             # -> [10, 5, 29, 14], class 1
        _ann(2, 10, 3, [90, 40, 30, 20], 600),            # -> [90, 40, 119, 59] -> [.., 99, 49]
        _ann(3, 10, 7, [30, 30, 10, 10], 100, ignore=1),  # ignored
        _ann(4, 10, 7, [5, 5, 0.5, 10], 5),               # width < 1: x2 == x1, dropped
        _ann(5, 10, 3, [1, 1, 10, 10], 0),                # zero area, dropped
        _ann(6, 10, 7, [0, 0, 50, 50], 2500, iscrowd=1),  # crowd -> [0, 0, 49, 49], row -1
        _ann(7, 10, 3, [60, 10, 5, 6], 30),               # small: -> [60, 10, 64, 15]
        _ann(8, 10, 3, [150, 10, 10, 10], 100),           # right of the image: clipped to a line
        _ann(9, 20, 7, [0, 0, 10, 10], 100, iscrowd=1),   # image 20 has only a crowd region
    ],
}


@pytest.fixture
def tiny_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    image_dir = tmp_path / 'images'
    image_dir.mkdir()
    for image in TINY_COCO['images']:
        (image_dir / image['file_name']).write_bytes(b'')
    ann_file = tmp_path / 'tiny.json'
    ann_file.write_text(json.dumps(TINY_COCO))
    dataset_catalog.register_dataset('tiny', str(image_dir), str(ann_file))
    dataset_catalog.register_dataset('tiny_again', str(image_dir), str(ann_file))
    return tmp_path


def test_classes_and_id_maps_follow_category_list_order(tiny_dataset):
    ds = JsonDataset('tiny')
    assert ds.classes == ['__background__', 'dog', 'cat']
    assert ds.num_classes == 3
    assert ds.json_category_id_to_contiguous_id == {7: 1, 3: 2}
    assert ds.contiguous_category_id_to_json_id == {1: 7, 2: 3}
    assert ds.category_to_id_map == {'dog': 7, 'cat': 3}
    assert ds.get_image_ids() == [10, 20, 30]


def test_gt_roidb_applies_detectron_filtering(tiny_dataset):
    roidb = JsonDataset('tiny').get_roidb(gt=True)
    assert [e['id'] for e in roidb] == [10, 20, 30]
    entry = roidb[0]
    assert entry['image'] == str(tiny_dataset / 'images' / 'a.jpg')
    assert entry['flipped'] is False
    assert (entry['width'], entry['height']) == (100, 50)
    for dropped in ('file_name', 'url', 'license'):
        assert dropped not in entry
    np.testing.assert_array_equal(entry['boxes'], np.array(
        [[10, 5, 29, 14], [90, 40, 99, 49], [0, 0, 49, 49], [60, 10, 64, 15]], np.float32))
    assert entry['boxes'].dtype == np.float32
    np.testing.assert_array_equal(entry['gt_classes'], [1, 2, 1, 2])
    assert entry['gt_classes'].dtype == np.int32
    np.testing.assert_array_equal(entry['seg_areas'], [200, 600, 2500, 30])
    np.testing.assert_array_equal(entry['is_crowd'], [False, False, True, False])
    np.testing.assert_array_equal(entry['gt_overlaps'], np.array(
        [[0, 1, 0], [0, 0, 1], [-1, -1, -1], [0, 0, 1]], np.float32))
    np.testing.assert_array_equal(entry['box_to_gt_ind_map'], [0, 1, 2, 3])
    np.testing.assert_array_equal(entry['max_overlaps'], [1, 1, -1, 1])
    np.testing.assert_array_equal(entry['max_classes'], [1, 2, 0, 2])
    assert entry['dataset'].name == 'tiny'

    crowd_only, empty = roidb[1], roidb[2]
    np.testing.assert_array_equal(crowd_only['boxes'], [[0, 0, 9, 9]])
    np.testing.assert_array_equal(crowd_only['gt_overlaps'], [[-1, -1, -1]])
    assert empty['boxes'].shape == (0, 4) and empty['gt_overlaps'].shape == (0, 3)
    assert empty['max_overlaps'].shape == (0,) and empty['max_classes'].shape == (0,)


def test_gt_min_area_drops_small_annotations(tiny_dataset):
    entry = JsonDataset('tiny').get_roidb(gt=True, gt_min_area=31)[0]
    np.testing.assert_array_equal(entry['seg_areas'], [200, 600, 2500])
    entry = JsonDataset('tiny').get_roidb(gt=True, gt_min_area=30)[0]
    np.testing.assert_array_equal(entry['seg_areas'], [200, 600, 2500, 30])


def test_roidb_without_gt_is_empty_per_image(tiny_dataset):
    roidb = JsonDataset('tiny').get_roidb()
    assert [e['id'] for e in roidb] == [10, 20, 30]
    assert all(e['boxes'].shape == (0, 4) and e['gt_classes'].shape == (0,) for e in roidb)


def test_training_roidb_flips_and_filters(tiny_dataset):
    roidb = combined_roidb_for_training(['tiny', 'tiny_again'])
    # Images 20 (crowd only) and 30 (no gt) are dropped, with their flipped copies.
    assert [(e['dataset'].name, e['id'], e['flipped']) for e in roidb] == [
        ('tiny', 10, False), ('tiny', 10, True),
        ('tiny_again', 10, False), ('tiny_again', 10, True)]
    original, flipped = roidb[0], roidb[1]
    np.testing.assert_array_equal(original['boxes'][:2], [[10, 5, 29, 14], [90, 40, 99, 49]])
    # W = 100: x1' = 100 - x2 - 1, x2' = 100 - x1 - 1
    np.testing.assert_array_equal(flipped['boxes'], np.array(
        [[70, 5, 89, 14], [0, 40, 9, 49], [50, 0, 99, 49], [35, 10, 39, 15]], np.float32))
    assert flipped['image'] == original['image']
    np.testing.assert_array_equal(flipped['gt_classes'], original['gt_classes'])
    np.testing.assert_array_equal(flipped['is_crowd'], original['is_crowd'])


def test_training_roidb_without_flipping_accepts_a_single_name(tiny_dataset):
    roidb = combined_roidb_for_training('tiny', use_flipped=False, gt_min_area=31)
    assert [(e['id'], e['flipped']) for e in roidb] == [(10, False)]
    assert len(roidb[0]['boxes']) == 3


def test_filter_for_training_keeps_entries_with_a_non_crowd_gt():
    def entry(classes, crowd):
        # A gt-only roidb's max_overlaps: 1 for a non-crowd box, -1 for a crowd region.
        return {'gt_classes': np.array(classes, np.int32), 'is_crowd': np.array(crowd, bool),
                'max_overlaps': np.where(crowd, -1.0, 1.0).reshape(-1)}
    roidb = [entry([], []), entry([1], [True]), entry([2, 1], [True, False]), entry([3], [False])]
    assert filter_for_training(roidb) == [roidb[2], roidb[3]]


def test_filter_for_training_keeps_images_with_a_fg_or_bg_roi_as_detectron():
    def entry(*overlaps):
        return {'max_overlaps': np.array(overlaps, np.float64)}
    roidb = [entry(-1.0, 0.7), entry(-1.0, 0.4), entry(-1.0), entry(-1.0, 0.05), entry()]
    # FG_THRESH 0.6, bg in [0.1, 0.5): 0.7 is fg, 0.4 bg, 0.05 neither.
    assert filter_for_training(roidb, 0.6, 0.5, 0.1) == roidb[:2]


def test_missing_paths_raise_dataset_errors(tiny_dataset):
    dataset_catalog.register_dataset('no_images', str(tiny_dataset / 'nope'),
                                     str(tiny_dataset / 'tiny.json'))
    with pytest.raises(DatasetError, match='Image directory .*nope of dataset no_images not found'):
        JsonDataset('no_images')
    dataset_catalog.register_dataset('no_ann', str(tiny_dataset / 'images'),
                                     str(tiny_dataset / 'missing.json'))
    with pytest.raises(DatasetError, match='Annotation file .*missing.json of dataset no_ann'):
        JsonDataset('no_ann')
    (tiny_dataset / 'images' / 'b.jpg').unlink()
    with pytest.raises(DatasetError, match='Image .*b.jpg of dataset tiny not found'):
        JsonDataset('tiny').get_roidb()
    with pytest.raises(DatasetError, match='Unknown dataset name: tinny'):
        JsonDataset('tinny')


def _register_variant(tmp_path, name, coco):
    (tmp_path / (name + '.json')).write_text(json.dumps(coco))
    dataset_catalog.register_dataset(name, str(tmp_path / 'images'), str(tmp_path / (name + '.json')))


def test_a_category_id_missing_from_categories_is_one_dataset_error(tiny_dataset):
    coco = dict(TINY_COCO, annotations=TINY_COCO['annotations'] + [_ann(10, 30, 99, [1, 1, 5, 5], 25)])
    _register_variant(tiny_dataset, 'bad_category', coco)
    with pytest.raises(DatasetError) as err:
        JsonDataset('bad_category').get_roidb(gt=True)
    assert str(err.value) == (
        'Annotation 10 (image 30) of dataset bad_category has category_id 99, which is not in the "categories" '
        'of {} (ids [3, 7]); fix the annotation or add the category'.format(tiny_dataset / 'bad_category.json'))


def test_no_usable_annotation_at_all_names_the_training_datasets(tiny_dataset):
    # Only a crowd region, a zero-area box and an ignored one: nothing to train on.
    coco = dict(TINY_COCO, annotations=[a for a in TINY_COCO['annotations'] if a['id'] in (3, 5, 9)])
    _register_variant(tiny_dataset, 'nothing_usable', coco)
    with pytest.raises(DatasetError) as err:
        combined_roidb_for_training(('nothing_usable',))
    assert str(err.value) == (
        "No training images with usable annotations in TRAIN.DATASETS ('nothing_usable',): none of the 3 images "
        'has a non-crowd box of positive width, height and area (check the annotation files, and '
        'TRAIN.GT_MIN_AREA -1)')


def test_model_class_count_is_checked_against_the_categories(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    (tmp_path / 'images').mkdir()
    (tmp_path / 'a.json').write_text(json.dumps({
        'images': [{'id': 1, 'file_name': 'a.jpg', 'width': 4, 'height': 4}], 'annotations': [],
        'categories': [{'id': 3, 'name': 'x'}, {'id': 8, 'name': 'y'}]}))
    dataset_catalog.register_dataset('two_categories', str(tmp_path / 'images'), str(tmp_path / 'a.json'))
    dataset = JsonDataset('two_categories')
    dataset.check_model_classes(3)
    with pytest.raises(DatasetError, match=r'^the model has 2 classes .* 2 categories \+ background = 3; .*'
                                           r'MODEL.NUM_CLASSES 3, or CENTERNET.NUM_CLASSES 2'):
        dataset.check_model_classes(2, at_least=True)  # training: the loss would fail on class 2
    with pytest.raises(DatasetError, match='the model has 4 classes'):
        dataset.check_model_classes(4)  # testing: json ids would be wrong
    dataset.check_model_classes(4, at_least=True)
    assert 'never trained' in caplog.text


def test_mask_roidb_keeps_segmentations_and_flips_them(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    (tmp_path / 'a.jpg').write_bytes(b'')
    crowd_rle = {'size': [4, 10], 'counts': [0, 8, 32]}  # column-major: x = 0, 1 filled
    coco = {'images': [{'id': 1, 'file_name': 'a.jpg', 'width': 10, 'height': 4}],
            'categories': [{'id': 1, 'name': 'thing'}],
            'annotations': [
                dict(_ann(1, 1, 1, [1, 0, 3, 2], 6), segmentation=[[1, 0, 4, 0, 4, 2], [0, 0, 1, 1]]),
                dict(_ann(2, 1, 1, [0, 0, 2, 4], 8, iscrowd=1), segmentation=crowd_rle),
            ]}
    (tmp_path / 'segm.json').write_text(json.dumps(coco))
    dataset_catalog.register_dataset('segm', str(tmp_path), str(tmp_path / 'segm.json'))
    assert 'segms' not in JsonDataset('segm').get_roidb(gt=True)[0]
    original, flipped = combined_roidb_for_training('segm', segms=True)
    # Polygons of fewer than 3 points are dropped, as Detectron's roidb does; crowd RLE is kept.
    assert original['segms'] == [[[1, 0, 4, 0, 4, 2]], crowd_rle]
    assert flipped['segms'][0] == [[8, 0, 5, 0, 5, 2]]  # x -> W - x - 1
    decoded = mask_util.decode(flipped['segms'][1])
    assert decoded[:, 8:].all() and decoded[:, :8].sum() == 0
