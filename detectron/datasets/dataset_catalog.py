"""Dataset names -> image directory, annotation file and image-name prefix.

Three sources are consulted on every lookup, first match wins:

1. datasets registered in this process with `register_dataset` / `register_catalog_file`;
2. the catalog file named by the environment variable `DETECTRON_DATASET_CATALOG`, read lazily
   at lookup time, so every spawned worker process that inherits the environment sees it;
3. the built-in names: Detectron's and KL-Loss's (paths under `detectron/datasets/data/`, usually
   symlinks, see data/README.md) and the synthetic `shapes_*` sets, generated on first lookup.

A catalog file is JSON (`.json`) or YAML (any other suffix) mapping each name to
`{image_directory, annotation_file[, image_prefix][, devkit_directory]}` (the devkit: a `voc_*`
dataset's VOCdevkit, which its evaluator reads); relative paths are taken relative to the
catalog file's own directory and `~` is expanded.
"""

import difflib
import json
import logging
import os

import yaml

from detectron.datasets import shapes
from detectron.utils.errors import DatasetError

logger = logging.getLogger(__name__)

CATALOG_ENV_VAR = 'DETECTRON_DATASET_CATALOG'

_DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')

_IM_DIR = 'image_directory'
_ANN_FN = 'annotation_file'
_IM_PREFIX = 'image_prefix'
_DEVKIT_DIR = 'devkit_directory'
_ENTRY_KEYS = (_IM_DIR, _ANN_FN, _IM_PREFIX, _DEVKIT_DIR)

# name -> (image directory, annotation file[, image prefix]), relative to _DATA_DIR.
# The coco_2017_train/val entries are KL-Loss's additions; the rest is Detectron's catalog.
_BUILTIN = {
    'cityscapes_fine_instanceonly_seg_train':
        ('cityscapes/images', 'cityscapes/annotations/instancesonly_gtFine_train.json'),
    'cityscapes_fine_instanceonly_seg_val':
        ('cityscapes/images', 'cityscapes/annotations/instancesonly_filtered_gtFine_val.json'),
    'cityscapes_fine_instanceonly_seg_test':
        ('cityscapes/images', 'cityscapes/annotations/instancesonly_gtFine_test.json'),
    'coco_2014_train': ('coco/coco_train2014', 'coco/annotations/instances_train2014.json'),
    'coco_2014_val': ('coco/coco_val2014', 'coco/annotations/instances_val2014.json'),
    'coco_2014_minival': ('coco/coco_val2014', 'coco/annotations/instances_minival2014.json'),
    'coco_2014_valminusminival':
        ('coco/coco_val2014', 'coco/annotations/instances_valminusminival2014.json'),
    'coco_2015_test': ('coco/coco_test2015', 'coco/annotations/image_info_test2015.json'),
    'coco_2015_test-dev': ('coco/coco_test2015', 'coco/annotations/image_info_test-dev2015.json'),
    'coco_2017_train': ('coco/coco_train2017', 'coco/annotations/instances_train2017.json'),
    'coco_2017_val': ('coco/coco_val2017', 'coco/annotations/instances_val2017.json'),
    # The 2017 test sets reuse the 2015 test images, whose file names carry the 2015 prefix.
    'coco_2017_test':
        ('coco/coco_test2015', 'coco/annotations/image_info_test2017.json', 'COCO_test2015_'),
    'coco_2017_test-dev':
        ('coco/coco_test2015', 'coco/annotations/image_info_test-dev2017.json', 'COCO_test2015_'),
    'coco_stuff_train': ('coco/coco_train2014', 'coco/annotations/coco_stuff_train.json'),
    'coco_stuff_val': ('coco/coco_val2014', 'coco/annotations/coco_stuff_val.json'),
    'keypoints_coco_2014_train':
        ('coco/coco_train2014', 'coco/annotations/person_keypoints_train2014.json'),
    'keypoints_coco_2014_val':
        ('coco/coco_val2014', 'coco/annotations/person_keypoints_val2014.json'),
    'keypoints_coco_2014_minival':
        ('coco/coco_val2014', 'coco/annotations/person_keypoints_minival2014.json'),
    'keypoints_coco_2014_valminusminival':
        ('coco/coco_val2014', 'coco/annotations/person_keypoints_valminusminival2014.json'),
    'keypoints_coco_2015_test':
        ('coco/coco_test2015', 'coco/annotations/image_info_test2015.json'),
    'keypoints_coco_2015_test-dev':
        ('coco/coco_test2015', 'coco/annotations/image_info_test-dev2015.json'),
    # KL-Loss-era COCO 2017 keypoint files (COCO's person_keypoints_*2017.json), beside Detectron's 2014 ones.
    'keypoints_coco_2017_train':
        ('coco/coco_train2017', 'coco/annotations/person_keypoints_train2017.json'),
    'keypoints_coco_2017_val':
        ('coco/coco_val2017', 'coco/annotations/person_keypoints_val2017.json'),
    'keypoints_coco_2017_test':
        ('coco/coco_test2015', 'coco/annotations/image_info_test2017.json', 'COCO_test2015_'),
    'keypoints_coco_2017_test-dev':
        ('coco/coco_test2015', 'coco/annotations/image_info_test-dev2017.json', 'COCO_test2015_'),
    'voc_2007_train': ('VOC2007/JPEGImages', 'VOC2007/annotations/voc_2007_train.json'),
    'voc_2007_trainval': ('VOC2007/JPEGImages', 'VOC2007/annotations/voc_2007_trainval.json'),
    'voc_2007_val': ('VOC2007/JPEGImages', 'VOC2007/annotations/voc_2007_val.json'),
    'voc_2007_test': ('VOC2007/JPEGImages', 'VOC2007/annotations/voc_2007_test.json'),
    'voc_2012_train': ('VOC2012/JPEGImages', 'VOC2012/annotations/voc_2012_train.json'),
    'voc_2012_val': ('VOC2012/JPEGImages', 'VOC2012/annotations/voc_2012_val.json'),
}

# Detectron's VOC devkits (relative to _DATA_DIR), which its VOC evaluator reads.
_VOC_DEVKITS = {name: 'VOC{0}/VOCdevkit{0}'.format(name[4:8]) for name in _BUILTIN if name.startswith('voc_')}

_registered = {}
# (path, mtime_ns) -> entries, so a worker re-reads the env catalog only when the file changes.
_env_catalog_cache = {}


def register_dataset(name, image_directory, annotation_file, image_prefix='', devkit_directory=''):
    """Make `name` resolve to these paths in this process (shadows env and built-in names)."""
    entry = {
        _IM_DIR: os.path.abspath(os.path.expanduser(image_directory)),
        _ANN_FN: os.path.abspath(os.path.expanduser(annotation_file)),
        _IM_PREFIX: image_prefix,
        _DEVKIT_DIR: os.path.abspath(os.path.expanduser(devkit_directory)) if devkit_directory else '',
    }
    previous = _registered.get(name)
    if previous is not None and previous != entry:
        logger.warning('Dataset {} re-registered: {} -> {}'.format(name, previous, entry))
    _registered[name] = entry


def register_catalog_file(path):
    """Register every dataset of a JSON/YAML catalog file; an empty path registers nothing.

    The empty case lets callers pass a config value such as cfg.DATASET_CATALOG unconditionally.
    """
    if not path:
        return
    for name, entry in _read_catalog_file(path).items():
        register_dataset(name, entry[_IM_DIR], entry[_ANN_FN], entry[_IM_PREFIX], entry[_DEVKIT_DIR])


def datasets():
    """All names that resolve (registered, env catalog, built-in)."""
    return sorted(set(_registered) | set(_env_catalog()) | set(_BUILTIN) | set(shapes.SPLITS))


def contains(name):
    """Whether `name` resolves; never generates the synthetic data."""
    return (name in _registered or name in _env_catalog() or name in _BUILTIN
            or name in shapes.SPLITS)


def get_im_dir(name):
    """Image directory of dataset `name`."""
    return _entry(name)[_IM_DIR]


def get_ann_fn(name):
    """COCO-format annotation json of dataset `name`."""
    return _entry(name)[_ANN_FN]


def get_im_prefix(name):
    """String prepended to every image file name of dataset `name` ('' for most)."""
    return _entry(name)[_IM_PREFIX]


def get_devkit_dir(name):
    """The VOCdevkit directory of dataset `name` (a `voc_*` dataset's evaluation reads it)."""
    devkit = _entry(name)[_DEVKIT_DIR]
    if not devkit:
        raise DatasetError('Dataset {} has no devkit_directory: the VOC evaluator (chosen by the name\'s voc_ '
                           'prefix) reads the VOCdevkit; give one in its catalog entry'.format(name))
    return devkit


def _entry(name):
    if name in _registered:
        return _registered[name]
    env_entries = _env_catalog()
    if name in env_entries:
        return env_entries[name]
    if name in _BUILTIN:
        return _builtin_entry(name, *_BUILTIN[name])
    if name in shapes.SPLITS:
        return _shapes_entry(name)
    raise DatasetError(_unknown_name_message(name))


def _builtin_entry(name, image_directory, annotation_file, image_prefix=''):
    return {
        _IM_DIR: os.path.join(_DATA_DIR, image_directory),
        _ANN_FN: os.path.join(_DATA_DIR, annotation_file),
        _IM_PREFIX: image_prefix,
        _DEVKIT_DIR: os.path.join(_DATA_DIR, _VOC_DEVKITS[name]) if name in _VOC_DEVKITS else '',
    }


def _shapes_entry(name):
    image_directory, annotation_file = shapes.split_files(name)
    return {
        _IM_DIR: image_directory,
        _ANN_FN: annotation_file,
        _IM_PREFIX: '',
        _DEVKIT_DIR: '',
    }


def _unknown_name_message(name):
    close = difflib.get_close_matches(name, datasets(), n=3, cutoff=0.6)
    hint = ' Did you mean {}?'.format(', '.join(close)) if close else ''
    return (
        'Unknown dataset name: {}.{} Register a custom dataset with '
        'dataset_catalog.register_dataset(name, image_directory, annotation_file), a catalog file '
        'in cfg.DATASET_CATALOG or the {} environment variable (see docs/DATASETS.md).'
        .format(name, hint, CATALOG_ENV_VAR)
    )


def _env_catalog():
    path = os.environ.get(CATALOG_ENV_VAR, '')
    if not path:
        return {}
    try:
        key = (os.path.abspath(path), os.stat(path).st_mtime_ns)
    except OSError:
        raise DatasetError(
            'Dataset catalog file {} (from ${}) not found; fix or unset the variable.'
            .format(path, CATALOG_ENV_VAR)
        )
    if key not in _env_catalog_cache:
        _env_catalog_cache.clear()
        _env_catalog_cache[key] = _read_catalog_file(path)
    return _env_catalog_cache[key]


def _read_catalog_file(path):
    """Parse and validate a catalog file into {name: entry with absolute paths}."""
    try:
        with open(path) as f:
            content = json.load(f) if path.endswith('.json') else yaml.safe_load(f)
    except OSError:
        raise DatasetError('Dataset catalog file {} not found or unreadable.'.format(path))
    except (ValueError, yaml.YAMLError) as e:
        raise DatasetError('Dataset catalog file {} does not parse: {}'.format(path, e))
    if not isinstance(content, dict):
        raise DatasetError(
            'Dataset catalog file {} must map dataset names to '
            '{{image_directory, annotation_file}}.'.format(path)
        )
    base_dir = os.path.dirname(os.path.abspath(path))
    return {name: _catalog_file_entry(path, base_dir, name, entry)
            for name, entry in content.items()}


def _catalog_file_entry(path, base_dir, name, entry):
    if not isinstance(entry, dict) or not {_IM_DIR, _ANN_FN} <= set(entry):
        raise DatasetError(
            'Dataset {} in catalog file {} needs both image_directory and annotation_file.'
            .format(name, path)
        )
    unknown = set(entry) - set(_ENTRY_KEYS)
    if unknown:
        raise DatasetError(
            'Dataset {} in catalog file {} has unknown keys {}; allowed: {}.'
            .format(name, path, sorted(unknown), ', '.join(_ENTRY_KEYS))
        )

    def resolve(p):
        return os.path.normpath(os.path.join(base_dir, os.path.expanduser(str(p))))

    return {
        _IM_DIR: resolve(entry[_IM_DIR]),
        _ANN_FN: resolve(entry[_ANN_FN]),
        _IM_PREFIX: str(entry.get(_IM_PREFIX, '')),
        _DEVKIT_DIR: resolve(entry[_DEVKIT_DIR]) if entry.get(_DEVKIT_DIR) else '',
    }
