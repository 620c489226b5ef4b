"""Validation of a COCO-format annotation file's records, in the process that reads it, before any
loader worker starts: one DatasetError line naming the file, the image id and the annotation id for
what cannot be trained or evaluated, instead of a KeyError / ValueError from deep in the loader, in
pycocotools or in the evaluation after detection.

Two places, one per kind of input:

- check_records (JsonDataset, when the json is read: training and testing alike): every image
  record's id, file_name, width and height; every annotation's id (unique), image_id (an image of
  the file), category_id (a category of the file), bbox (4 finite numbers), area (a finite number)
  and iscrowd (0 or 1). Polygons of fewer than 3 points are dropped there, as Detectron's roidb
  drops them, so that training and the mask evaluation (pycocotools reads a first polygon of 4
  numbers as a box) see the same segmentations.
- usable_segmentation (JsonDataset.get_roidb with segms=True: Mask R-CNN training, and testing
  before detection so that the mask evaluation cannot fail after it): the segmentation of each
  annotation, polygons or RLE, against its image's size.

What Detectron drops on purpose (boxes of no width or height inside the image, area <= 0, short
polygons) is still dropped, with a logged warning giving the count and the first annotation ids
(json_dataset.JsonDataset.get_roidb).
"""
import logging
import math

import numpy as np

from detectron.utils.errors import DatasetError

_NUMBER = (int, float)  # JSON numbers; bool is another type, so true / false are not numbers here
_ID = (int, str)
FIRST_IDS = 5  # how many annotation ids a warning lists

logger = logging.getLogger(__name__)


class Source:
    """Where records come from, for the messages: the annotation file and the dataset name."""

    def __init__(self, annotation_file, name):
        self.annotation_file = annotation_file
        self.name = name

    def image_error(self, image_id, problem):
        return DatasetError('Image record {} in {} (dataset {}) {}; fix the record (a COCO image has an id, a '
                            'file_name and its width and height in pixels)'.format(
                                image_id, self.annotation_file, self.name, problem))

    def annotation_error(self, ann, problem, advice='fix the annotation or remove it'):
        return DatasetError('Annotation {} (image {}) in {} (dataset {}) {}; {}'.format(
            ann.get('id'), ann.get('image_id'), self.annotation_file, self.name, problem, advice))


def check_records(content, annotation_file, name):
    """Refuse (DatasetError) image and annotation records of the parsed COCO json `content` that
    training or the evaluation cannot use; drop polygons of fewer than 3 points from segmentation
    lists (Detectron's rule). Returns {annotation id: number of polygons dropped}."""
    source = Source(annotation_file, name)
    image_ids = set()
    for index, image in enumerate(content['images']):
        _check_image(image, index, source)
        image_ids.add(image['id'])
    annotations = content.get('annotations', [])
    if not isinstance(annotations, list):
        raise DatasetError('Annotation file {} of dataset {} has an "annotations" entry that is not a list: it is not '
                           'a COCO-format detection file'.format(annotation_file, name))
    category_ids = {c.get('id') for c in content['categories'] if isinstance(c, dict)}
    seen, repeated, dropped = set(), [], {}
    for index, ann in enumerate(annotations):
        # The common case in one expression (COCO train's 860k annotations); _check_annotation says what is wrong.
        try:
            usable = (_REQUIRED <= ann.keys() and type(ann['id']) in _ID and ann['image_id'] in image_ids
                      and ann['category_id'] in category_ids and _is_box(ann['bbox']) and _is_number(ann['area'])
                      and _is_crowd_flag(ann['iscrowd']))
        except (AttributeError, TypeError):  # not a dict, an unhashable id
            usable = False
        if not usable:
            _check_annotation(ann, index, image_ids, category_ids, source)
        if ann['id'] in seen:
            repeated.append(ann['id'])
        seen.add(ann['id'])
        segm = ann.get('segmentation')
        if type(segm) is list and _has_short_item(segm) and all(type(p) is list for p in segm):
            ann['segmentation'] = [p for p in segm if len(p) >= 6]
            dropped[ann['id']] = len(segm) - len(ann['segmentation'])
    if repeated:
        # An error would be right, but datasets in use (the tests' tiny sets among them) repeat ids.
        logger.warning('Annotation file %s (dataset %s): %d annotations repeat the id of an earlier one (ids %s); '
                       'pycocotools, in training and in the evaluation, reads the last annotation of an id in place '
                       'of every annotation with that id: give each annotation its own id', annotation_file, name,
                       len(repeated), first_ids(repeated))
    return dropped


def first_ids(ids):
    """The first FIRST_IDS ids of a list, for a warning."""
    shown = ', '.join(str(i) for i in ids[:FIRST_IDS])
    return shown + (', ...' if len(ids) > FIRST_IDS else '')


def _check_image(image, index, source):
    if type(image) is not dict or 'id' not in image:
        raise DatasetError('Image record #{} (counted from 0) in {} (dataset {}) has no "id"; fix the record'.format(
            index, source.annotation_file, source.name))
    file_name = image.get('file_name')
    if type(file_name) is not str or not file_name:
        raise source.image_error(image['id'], 'has file_name {!r}, not a file name'.format(file_name))
    for key in ('width', 'height'):
        value = image.get(key)
        if key not in image:
            raise source.image_error(image['id'], 'has no "{}"'.format(key))
        if type(value) not in _NUMBER or not (value >= 1 and value == int(value)):
            raise source.image_error(image['id'], 'has {} {!r}, not a positive whole number of pixels'.format(
                key, value))


_REQUIRED = frozenset(('id', 'image_id', 'category_id', 'bbox', 'area', 'iscrowd'))


def _is_number(value):
    return type(value) in _NUMBER and math.isfinite(value)


def _is_box(bbox):
    # A sum of finite numbers is finite short of 1e308, which is no box either.
    return (type(bbox) is list and len(bbox) == 4 and type(bbox[0]) in _NUMBER and type(bbox[1]) in _NUMBER
            and type(bbox[2]) in _NUMBER and type(bbox[3]) in _NUMBER
            and math.isfinite(bbox[0] + bbox[1] + bbox[2] + bbox[3]))


def _has_short_item(segm):
    """Whether a segmentation list holds an item of fewer than 6 numbers (a polygon of fewer than 3 points)."""
    try:
        return min(map(len, segm), default=6) < 6
    except TypeError:  # numbers: a flat list, refused with masks (usable_segmentation)
        return False


def _is_crowd_flag(value):
    return type(value) in (int, bool) and value in (0, 1)


def _check_annotation(ann, index, image_ids, category_ids, source):
    """Raise the DatasetError that says what is wrong with an annotation check_records refuses."""
    if type(ann) is not dict:
        raise DatasetError('Annotation #{} (counted from 0) in {} (dataset {}) is not a JSON object; fix the '
                           'annotation or remove it'.format(index, source.annotation_file, source.name))
    missing = [key for key in ('id', 'image_id', 'category_id', 'bbox', 'area', 'iscrowd') if key not in ann]
    if missing:
        where = '' if 'id' in ann else ' (annotation #{} of the file, counted from 0)'.format(index)
        raise source.annotation_error(ann, 'has no "{}"{}; a COCO annotation has an id, image_id, category_id, '
                                           'bbox, area and iscrowd'.format('", "'.join(missing), where))
    for key in ('id', 'image_id', 'category_id'):
        if type(ann[key]) not in _ID:
            raise source.annotation_error(ann, 'has {} {}, not a whole number or text'.format(key, _short(ann[key])))
    if ann['image_id'] not in image_ids:
        raise source.annotation_error(ann, 'refers to image id {!r}, which is not in the "images" list'.format(
            ann['image_id']), 'fix its image_id, or remove it with the image it belonged to')
    if ann['category_id'] not in category_ids:
        raise DatasetError(
            'Annotation {} (image {}) of dataset {} has category_id {}, which is not in the "categories" of {} (ids '
            '{}); fix the annotation or add the category'.format(ann['id'], ann['image_id'], source.name,
                                                                  ann['category_id'], source.annotation_file,
                                                                  _sorted(category_ids)))
    if not _is_box(ann['bbox']):
        raise source.annotation_error(ann, 'has bbox {}: a COCO bbox is 4 finite numbers [x, y, width, '
                                           'height]'.format(_short(ann['bbox'])))
    if not _is_number(ann['area']):
        raise source.annotation_error(ann, 'has area {}, not a finite number'.format(_short(ann['area'])))
    if not _is_crowd_flag(ann['iscrowd']):
        raise source.annotation_error(ann, 'has iscrowd {}, not 0 or 1'.format(_short(ann['iscrowd'])))
    raise AssertionError('annotation {!r} passes every check'.format(ann))  # the fast path and these checks differ


def _sorted(ids):
    try:
        return sorted(ids)
    except TypeError:  # ids of several types
        return sorted(ids, key=repr)


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 5] + ' ...'


# ------------------------------------------------------------------------------------------------
# Segmentations (Mask R-CNN)
# ------------------------------------------------------------------------------------------------

def usable_segmentation(ann, height, width, source, dropped=0):
    """The segmentation of annotation `ann` of an image of height x width, as the roidb keeps it:
    polygons as given (check_records has dropped those of fewer than 3 points, `dropped` of them);
    a crowd region's RLE as given; a non-crowd object's RLE as polygons (rle_to_polygons), because
    the mask targets rasterise polygons. Anything else is a DatasetError naming the annotation."""
    if 'segmentation' not in ann:
        raise source.annotation_error(ann, 'has no "segmentation", which Mask R-CNN (MODEL.MASK_ON) needs')
    segm = ann['segmentation']
    if type(segm) is dict:
        counts = _checked_rle(segm, height, width, ann, source)
        return segm if ann['iscrowd'] else rle_to_polygons(counts, height, width)
    if type(segm) is not list:
        raise source.annotation_error(ann, 'has segmentation {}: COCO gives a list of polygons or an RLE '
                                           'dict'.format(_short(segm)))
    if segm and not all(type(p) is list for p in segm):
        raise source.annotation_error(ann, 'has segmentation {}: a flat list, where COCO gives a list of polygons '
                                           '([[x0, y0, x1, y1, ...], ...])'.format(_short(segm)))
    for poly in segm:
        if not all(type(v) in _NUMBER and math.isfinite(v) for v in poly):
            raise source.annotation_error(ann, 'has polygon {}, whose coordinates are not all finite '
                                               'numbers'.format(_short(poly)))
        if len(poly) % 2:
            raise source.annotation_error(ann, 'has a polygon of {} numbers, an odd count: a polygon is x, y '
                                               'pairs'.format(len(poly)))
    if not segm:
        shorter = ' (only {} of fewer than 3 points)'.format(dropped) if dropped else ''
        raise source.annotation_error(ann, 'has no polygon of 3 or more points{} in its segmentation, so Mask '
                                           'R-CNN has no mask for it'.format(shorter))
    return segm


def _checked_rle(segm, height, width, ann, source):
    """The run lengths of an RLE dict (compressed: counts a string; or uncompressed: a list), refused
    unless its size is the image's [height, width] and its runs cover the height x width pixels
    exactly (pycocotools would read past its buffer or fail inside, e.g. when a crowd region is flipped)."""
    size, counts = segm.get('size'), segm.get('counts')
    if size != [height, width]:
        raise source.annotation_error(ann, 'has an RLE segmentation of size {} but its image is [{}, {}] (height, '
                                           'width)'.format(_short(size), height, width))
    if type(counts) is str:
        runs = compressed_rle_counts(counts)
    elif type(counts) is list and all(type(c) is int and c >= 0 for c in counts):
        runs = np.array(counts, dtype=np.int64)
    else:
        runs = None
    if runs is None or runs.sum() != height * width:
        total = '' if runs is None else ' (its runs cover {} pixels, not {})'.format(runs.sum(), height * width)
        raise source.annotation_error(ann, 'has RLE counts {} that are not a valid COCO run-length encoding of its '
                                           '{} x {} mask{}'.format(_short(counts, 60), height, width, total))
    return runs


def compressed_rle_counts(text):
    """The run lengths (int64) of a compressed COCO RLE string, as pycocotools' rleFrString reads it
    (6 bits per character from '0', 5 of value and a continuation bit, the last character's fifth
    bit the sign, and counts from the fourth on given as differences to the count two before),
    or None when the string is not such an encoding."""
    try:
        chars = np.frombuffer(text.encode('ascii'), dtype=np.uint8).astype(np.int64) - 48
    except UnicodeEncodeError:
        return None
    if not len(chars) or chars.min() < 0 or chars.max() > 63 or chars[-1] & 0x20:
        return None
    ends = np.flatnonzero((chars & 0x20) == 0)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 7:  # more than 35 bits: no 32-bit count
        return None
    position = np.arange(len(chars)) - np.repeat(starts, lengths)
    values = np.add.reduceat((chars & 0x1f) << (5 * position), starts)
    negative = (chars[ends] & 0x10) != 0
    values[negative] -= np.left_shift(1, 5 * lengths[negative])
    counts = values.copy()
    counts[1::2] = np.cumsum(values[1::2])
    counts[2::2] = np.cumsum(values[2::2])
    return None if counts.min() < 0 else counts


def rle_to_polygons(runs, height, width):
    """A binary mask given by its column-major run lengths as polygons along its pixel edges, one
    rectangle per run of a row, merged with the same run of the rows below: pycocotools rasterises
    their union back to exactly the mask's pixels, holes included (a polygon list is a union)."""
    flat = np.repeat(np.arange(len(runs)) % 2, runs).astype(np.uint8)
    mask = flat.reshape(width, height).T
    edges = np.diff(np.pad(mask, ((0, 1), (1, 1))).astype(np.int8), axis=1)
    polygons, open_runs = [], {}
    for y, row in enumerate(edges):
        runs_here = set(zip(np.flatnonzero(row == 1).tolist(), np.flatnonzero(row == -1).tolist()))
        for run in [run for run in open_runs if run not in runs_here]:
            (x0, x1), y0 = run, open_runs.pop(run)
            polygons.append([x0, y0, x1, y0, x1, y, x0, y])
        for run in sorted(runs_here):
            open_runs.setdefault(run, y)
    return sorted(polygons, key=lambda p: (p[1], p[0]))
