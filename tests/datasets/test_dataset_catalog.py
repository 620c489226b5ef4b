import json
import os
import subprocess
import sys
import textwrap

import pytest

from detectron.datasets import dataset_catalog, shapes
from detectron.utils.errors import DatasetError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_DIR = os.path.join(REPO_ROOT, 'detectron', 'datasets', 'data')


@pytest.fixture(autouse=True)
def isolated_catalog(monkeypatch, tmp_path):
    """Fresh registrations, no env catalog, and a private shapes cache for every test."""
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    monkeypatch.delenv(dataset_catalog.CATALOG_ENV_VAR, raising=False)
    monkeypatch.setenv('DETECTRON_DATA_CACHE', str(tmp_path / 'cache'))


@pytest.mark.parametrize('name, im_dir, ann_fn, prefix', [
    ('coco_2014_train', 'coco/coco_train2014', 'coco/annotations/instances_train2014.json', ''),
    ('coco_2014_minival', 'coco/coco_val2014', 'coco/annotations/instances_minival2014.json', ''),
    ('coco_2014_valminusminival', 'coco/coco_val2014',
     'coco/annotations/instances_valminusminival2014.json', ''),
    ('coco_2017_train', 'coco/coco_train2017', 'coco/annotations/instances_train2017.json', ''),
    ('coco_2017_val', 'coco/coco_val2017', 'coco/annotations/instances_val2017.json', ''),
    ('coco_2017_test-dev', 'coco/coco_test2015', 'coco/annotations/image_info_test-dev2017.json',
     'COCO_test2015_'),
    ('voc_2007_test', 'VOC2007/JPEGImages', 'VOC2007/annotations/voc_2007_test.json', ''),
])
def test_builtin_names_keep_detectron_paths(name, im_dir, ann_fn, prefix):
    assert dataset_catalog.contains(name)
    assert dataset_catalog.get_im_dir(name) == os.path.join(DATA_DIR, im_dir)
    assert dataset_catalog.get_ann_fn(name) == os.path.join(DATA_DIR, ann_fn)
    assert dataset_catalog.get_im_prefix(name) == prefix


def test_listing_includes_builtin_and_synthetic_without_generating(tmp_path):
    names = dataset_catalog.datasets()
    for name in ('coco_2014_train', 'coco_2017_test', 'voc_2012_val', 'shapes_train',
                 'shapes_val', 'shapes_noisy_train'):
        assert name in names
        assert dataset_catalog.contains(name)
    assert not dataset_catalog.contains('coco_2018_train')
    assert not (tmp_path / 'cache').exists()


def test_shapes_names_resolve_to_generated_cache(tmp_path):
    root = tmp_path / 'cache' / shapes.CACHE_NAME
    assert dataset_catalog.get_im_dir('shapes_noisy_train') == str(root / 'train')
    assert dataset_catalog.get_ann_fn('shapes_noisy_train') == str(
        root / 'annotations' / 'shapes_noisy_train.json')
    assert dataset_catalog.get_im_dir('shapes_val') == str(root / 'val')
    assert os.path.isfile(dataset_catalog.get_ann_fn('shapes_val'))


def test_register_dataset_makes_absolute_paths_and_shadows_builtin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dataset_catalog.register_dataset('my_set', 'images', 'ann/train.json', image_prefix='x_')
    assert dataset_catalog.contains('my_set')
    assert dataset_catalog.get_im_dir('my_set') == str(tmp_path / 'images')
    assert dataset_catalog.get_ann_fn('my_set') == str(tmp_path / 'ann' / 'train.json')
    assert dataset_catalog.get_im_prefix('my_set') == 'x_'
    assert 'my_set' in dataset_catalog.datasets()
    dataset_catalog.register_dataset('coco_2017_val', '/data/coco/val2017', '/data/coco/v.json')
    assert dataset_catalog.get_im_dir('coco_2017_val') == '/data/coco/val2017'
    assert dataset_catalog.get_im_prefix('coco_2017_val') == ''


def _write_catalog(directory, file_name, text):
    path = directory / file_name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_register_yaml_catalog_file_resolves_paths_against_its_directory(tmp_path):
    path = _write_catalog(tmp_path, 'catalog.yaml', """
        my_train:
          image_directory: imgs/train
          annotation_file: /abs/train.json
        my_test:
          image_directory: imgs/test
          annotation_file: ann/test.json
          image_prefix: T_
    """)
    dataset_catalog.register_catalog_file(path)
    assert dataset_catalog.get_im_dir('my_train') == str(tmp_path / 'imgs' / 'train')
    assert dataset_catalog.get_ann_fn('my_train') == '/abs/train.json'
    assert dataset_catalog.get_im_prefix('my_train') == ''
    assert dataset_catalog.get_ann_fn('my_test') == str(tmp_path / 'ann' / 'test.json')
    assert dataset_catalog.get_im_prefix('my_test') == 'T_'


def test_register_json_catalog_file_and_empty_path(tmp_path):
    path = tmp_path / 'catalog.json'
    path.write_text(json.dumps({'j': {'image_directory': 'i', 'annotation_file': 'a.json'}}))
    dataset_catalog.register_catalog_file('')
    assert not dataset_catalog.contains('j')
    dataset_catalog.register_catalog_file(str(path))
    assert dataset_catalog.get_im_dir('j') == str(tmp_path / 'i')


@pytest.mark.parametrize('text, expected', [
    ('[a, b]', 'must map dataset names'),
    ('bad:\n  image_directory: x\n', 'bad in catalog file'),
    ('bad:\n  image_directory: x\n  annotation_file: y\n  devkit: z\n', "unknown keys ['devkit']"),
    ('bad: [unclosed\n', 'does not parse'),
])
def test_malformed_catalog_file_names_the_problem(tmp_path, text, expected):
    path = _write_catalog(tmp_path, 'catalog.yaml', text)
    with pytest.raises(DatasetError) as err:
        dataset_catalog.register_catalog_file(path)
    assert expected in str(err.value)
    assert path in str(err.value)


def test_missing_catalog_file(tmp_path):
    with pytest.raises(DatasetError, match='not found'):
        dataset_catalog.register_catalog_file(str(tmp_path / 'nope.yaml'))


def test_env_catalog_is_read_at_lookup_time(tmp_path, monkeypatch):
    path = _write_catalog(tmp_path, 'catalog.yaml', """
        env_set: {image_directory: imgs, annotation_file: a.json}
    """)
    assert not dataset_catalog.contains('env_set')
    monkeypatch.setenv(dataset_catalog.CATALOG_ENV_VAR, path)
    assert dataset_catalog.get_im_dir('env_set') == str(tmp_path / 'imgs')
    dataset_catalog.register_dataset('env_set', '/explicit', '/explicit.json')
    assert dataset_catalog.get_im_dir('env_set') == '/explicit'


@pytest.mark.processes
def test_env_catalog_reaches_a_fresh_process(tmp_path):
    path = _write_catalog(tmp_path, 'catalog.yaml', """
        worker_set: {image_directory: imgs, annotation_file: ann/w.json}
    """)
    env = dict(os.environ, **{dataset_catalog.CATALOG_ENV_VAR: path})
    out = subprocess.run(
        [sys.executable, '-c', 'from detectron.datasets import dataset_catalog as c; '
                               'print(c.get_ann_fn("worker_set"))'],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout
    assert out.strip() == str(tmp_path / 'ann' / 'w.json')


def test_env_catalog_missing_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(dataset_catalog.CATALOG_ENV_VAR, str(tmp_path / 'gone.yaml'))
    with pytest.raises(DatasetError, match=dataset_catalog.CATALOG_ENV_VAR):
        dataset_catalog.get_im_dir('coco_2014_train')


def test_unknown_name_suggests_close_names_and_registration():
    with pytest.raises(DatasetError) as err:
        dataset_catalog.get_ann_fn('coco_2017_trian')
    message = str(err.value)
    assert message.startswith('Unknown dataset name: coco_2017_trian.')
    assert 'Did you mean coco_2017_train' in message
    assert 'register_dataset' in message and 'docs/DATASETS.md' in message
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetError) as err:
        dataset_catalog.get_im_dir('zzzz')
    assert 'Did you mean' not in str(err.value)
