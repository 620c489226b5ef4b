"""Proposal files read as Detectron's json_dataset reads them (gt boxes first, clipped, duplicates and small
boxes dropped, PROPOSAL_LIMIT, the crowd filter), checked against a numpy re-implementation
(tests/support/proposal_recall.py); TRAIN.BBOX_THRESH in the sampled RoIs; the mismatch error; our
pickles read back and Python 2 pickles (bytes keys, latin1 numpy data) read."""
import pickle

import numpy as np
import pytest
import torch

from detectron.datasets import proposal_files
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.json_dataset_evaluator import evaluate_box_proposals
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.roi_data.fast_rcnn import sample_rois
from detectron.utils.errors import DatasetError
from support.proposal_recall import file_proposals, gt_of_image, iou_plus_one

# Two images; image 1 has a crowd region. Category 5 is contiguous class 1, category 9 class 2.
COCO = {
    'images': [{'id': 1, 'file_name': 'a.png', 'width': 100, 'height': 80},
               {'id': 2, 'file_name': 'b.png', 'width': 60, 'height': 60}],
    'annotations': [
        {'id': 1, 'image_id': 1, 'category_id': 5, 'bbox': [10, 10, 30, 20], 'area': 600, 'iscrowd': 0},
        {'id': 2, 'image_id': 1, 'category_id': 9, 'bbox': [50, 30, 40, 40], 'area': 1600, 'iscrowd': 0},
        {'id': 3, 'image_id': 1, 'category_id': 5, 'bbox': [0, 60, 40, 19], 'area': 760, 'iscrowd': 1},
        {'id': 4, 'image_id': 2, 'category_id': 9, 'bbox': [5, 5, 20, 30], 'area': 600, 'iscrowd': 0},
    ],
    'categories': [{'id': 5, 'name': 'five'}, {'id': 9, 'name': 'nine'}],
}
RNG = np.random.RandomState(3)


def _random_boxes(n, width, height):
    xy = RNG.uniform(-10, [width, height], size=(n, 2))
    wh = RNG.uniform(1, 50, size=(n, 2))
    return np.hstack((xy, xy + wh)).astype(np.float32)


def _proposals():
    """Image 2 listed first (files need not follow the dataset's order), with exact and rounding duplicates,
    boxes of side <= 2 and boxes reaching outside the image; an extra image the dataset lacks."""
    first = np.vstack((_random_boxes(30, 100, 80), [[12, 11, 38, 29], [12.2, 11.1, 38.3, 28.9], [5, 5, 6, 40],
                                                    [1, 61, 30, 78], [-5, -5, 200, 200]])).astype(np.float32)
    second = np.vstack((_random_boxes(20, 60, 60), [[6, 6, 24, 34], [6, 6, 24, 34]])).astype(np.float32)
    return {'boxes': [second, first, _random_boxes(3, 10, 10)], 'scores': [np.zeros(len(second)),
            np.zeros(len(first)), np.zeros(3)], 'ids': [2, 1, 77]}


def _write(path, content):
    with open(path, 'wb') as f:
        pickle.dump(content, f, protocol=2)
    return str(path)


def _expected_entry(coco, image, boxes, crowd_thresh, limit=-1):
    """Detectron's roidb entry fields after _add_proposals_from_file, from the json and the raw boxes."""
    gt, _, crowd, cats = gt_of_image(coco, image)
    classes = np.array([{5: 1, 9: 2}[c] for c in cats])
    props = file_proposals(boxes, image['height'], image['width'], limit=limit)
    overlaps = iou_plus_one(props, gt)
    max_overlaps = np.where(overlaps.max(axis=1) > 0, overlaps.max(axis=1), 0)
    max_classes = np.where(max_overlaps > 0, classes[overlaps.argmax(axis=1)], 0)
    if crowd_thresh > 0 and crowd.any():
        # COCO's crowd IoU: the intersection over the proposal's area.
        inter = iou_plus_one(props, gt[crowd])  # IoU -> intersection: I = IoU * (a + b) / (1 + IoU)
        area_p = (props[:, 2] - props[:, 0] + 1) * (props[:, 3] - props[:, 1] + 1)
        area_c = (gt[crowd][:, 2] - gt[crowd][:, 0] + 1) * (gt[crowd][:, 3] - gt[crowd][:, 1] + 1)
        intersection = inter * (area_p[:, None] + area_c[None, :]) / (1 + inter)
        filtered = (intersection / area_p[:, None]).max(axis=1) > crowd_thresh
        max_overlaps = np.where(filtered, -1, max_overlaps)
        max_classes = np.where(filtered, 0, max_classes)
    gt_overlap = np.where(crowd, -1.0, 1.0)
    gt_class = np.where(crowd, 0, classes)
    return (np.vstack((gt, props)), np.concatenate((gt_overlap, max_overlaps)),
            np.concatenate((gt_class, max_classes)))


@pytest.mark.parametrize('crowd_thresh, limit', [(0.7, -1), (0.0, 12)])
def test_proposals_join_the_roidb_as_detectron_reads_them(register_coco, tmp_path, crowd_thresh, limit):
    register_coco('props', COCO)
    content = _proposals()
    path = _write(tmp_path / 'p.pkl', content)
    dataset = JsonDataset('props')
    roidb = dataset.get_roidb(gt=True, proposals=proposal_files.load_proposals(path, str(tmp_path)),
                              proposal_limit=limit, crowd_filter_thresh=crowd_thresh)
    raw = dict(zip(content['ids'], content['boxes']))
    filtered_any = False
    for entry in roidb:
        boxes, max_overlaps, max_classes = _expected_entry(dataset.COCO, dataset.COCO.imgs[entry['id']],
                                                           raw[entry['id']], crowd_thresh, limit)
        np.testing.assert_allclose(entry['boxes'], boxes, atol=1e-4)
        np.testing.assert_allclose(entry['max_overlaps'], max_overlaps, atol=1e-6)
        np.testing.assert_array_equal(entry['max_classes'], max_classes)
        num_gt = len(gt_of_image(dataset.COCO, dataset.COCO.imgs[entry['id']])[0])
        assert (entry['gt_classes'][:num_gt] > 0).all() and (entry['gt_classes'][num_gt:] == 0).all()  # gt first
        filtered_any |= bool((max_overlaps == -1).sum() > (entry['is_crowd']).sum())
    assert filtered_any == (crowd_thresh > 0)  # the crowd region covers proposal [1, 61, 30, 78]
    if limit > 0:
        assert all((e['gt_classes'] == 0).sum() == limit for e in roidb)


def test_a_file_that_misses_an_image_is_one_error_naming_both(register_coco, tmp_path):
    register_coco('props', COCO)
    content = _proposals()
    content = {k: v[1:] for k, v in content.items()}  # image 2 gone
    path = _write(tmp_path / 'p.pkl', content)
    with pytest.raises(DatasetError) as err:
        JsonDataset('props').get_roidb(gt=True, proposals=proposal_files.load_proposals(path, str(tmp_path)))
    assert str(err.value) == (
        'proposal file {} does not match dataset props: it has proposals for 1 of its 2 images (image id 2 has '
        'none; the file lists 2 images); use the proposal file made on this dataset'.format(path))


def test_our_proposal_file_reads_back(tmp_path):
    content = _proposals()
    path = str(tmp_path / 'rpn_proposals.pkl')
    proposal_files.save_proposals(path, content['boxes'], content['scores'], content['ids'], 'MODEL: {}\n')
    loaded = proposal_files.load_proposals(path, str(tmp_path))
    assert loaded['ids'] == content['ids'] and loaded['count'] == 3
    for a, b in zip(loaded['boxes'], content['boxes']):
        np.testing.assert_array_equal(a, b)
    with open(path, 'rb') as f:
        assert pickle.load(f)['cfg'] == 'MODEL: {}\n'


class _Python2Pickler(pickle._Pickler):
    """Writes bytes as Python 2's str opcodes (SHORT_BINSTRING / BINSTRING), numpy's array data and
    dtype codes included, as Detectron's Python 2 wrote its proposal files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + len(obj).to_bytes(4, 'little') + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


@pytest.mark.parametrize('bytes_keys', [False, True])
def test_python2_proposal_pickles_are_read(tmp_path, bytes_keys):
    content = _proposals()
    py2 = {(k.encode() if bytes_keys else k): v for k, v in content.items()}
    py2['indexes'.encode() if bytes_keys else 'indexes'] = py2.pop(b'ids' if bytes_keys else 'ids')  # 2017 files
    path = tmp_path / 'py2.pkl'
    with open(path, 'wb') as f:
        _Python2Pickler(f, protocol=2).dump(py2)
    with open(path, 'rb') as f:
        with pytest.raises(UnicodeDecodeError):
            pickle.load(f)  # the default ascii decoding fails on the array data, as for Detectron's files
    loaded = proposal_files.load_proposals(str(path), str(tmp_path))
    assert loaded['ids'] == content['ids']
    for a, b in zip(loaded['boxes'], content['boxes']):
        np.testing.assert_array_equal(a, b)


def test_bbox_thresh_gives_targets_to_the_rois_it_reaches(register_coco, tmp_path):
    """TRAIN.BBOX_THRESH 0.3 below FG_THRESH 0.5: bg RoIs with overlap in [0.3, 0.5) keep regression targets
    in their max class's columns (Detectron's add_bbox_regression_targets, before the bg labels)."""
    register_coco('props', COCO)
    path = _write(tmp_path / 'p.pkl', _proposals())
    roidb = combined_roidb_for_training('props', use_flipped=False, proposal_files=(path,), crowd_filter_thresh=0.7,
                                       cache_dir=str(tmp_path))
    entry = next(e for e in roidb if e['id'] == 1)
    proposals = proposal_files.proposal_rows(entry)
    is_gt = entry['gt_classes'] > 0
    rois = torch.cat((torch.zeros(len(proposals), 1), torch.from_numpy(proposals) * 2.0), dim=1)
    sampled = sample_rois(rois, torch.tensor([2.0]), [torch.from_numpy(entry['boxes'][is_gt])],
                          [torch.from_numpy(entry['gt_classes'][is_gt]).long()],
                          [torch.from_numpy(entry['is_crowd'][is_gt])], num_classes=3, batch_size_per_im=1000,
                          fg_fraction=0.5, bbox_thresh=0.3)
    usable = entry['max_overlaps'] >= 0
    overlaps = entry['max_overlaps'][usable]
    classes = entry['max_classes'][usable]
    assert len(sampled.labels) == usable.sum()  # every usable row sampled once: fg >= 0.5, bg below
    order = np.concatenate((np.where(overlaps >= 0.5)[0], np.where(overlaps < 0.5)[0]))
    weights = sampled.bbox_inside_weights.numpy().reshape(-1, 3, 4)[:, :, 0]
    expected = np.zeros_like(weights)
    reached = overlaps[order] >= 0.3
    expected[np.where(reached)[0], classes[order][reached]] = 1
    np.testing.assert_array_equal(weights, expected)
    assert ((overlaps >= 0.3) & (overlaps < 0.5)).any()  # the case is there
    np.testing.assert_array_equal(sampled.labels.numpy(), np.where(overlaps[order] >= 0.5, classes[order], 0))


def test_recall_of_a_known_proposal_set(register_coco, tmp_path):
    """Hand-made: image 1's non-crowd gt [10,10,39,29] and [50,30,89,69] and image 2's [5,5,24,34]; the proposals
    cover the first exactly, the second at IoU 0.6 and the third not at all (IoU 0)."""
    register_coco('props', COCO)
    second = [50, 30, 89, 69]
    shifted = [50, 30, 50 + 40 * 0.75 - 1, 69]  # 30 x 40 inside 40 x 40: IoU 0.75
    content = {'boxes': [np.array([[10, 10, 39, 29], shifted, [0, 0, 3, 3]], np.float32),
                         np.array([[40, 40, 55, 55]], np.float32)], 'scores': [np.zeros(3), np.zeros(1)], 'ids': [1, 2]}
    path = _write(tmp_path / 'p.pkl', content)
    dataset = JsonDataset('props')
    roidb = dataset.get_roidb(gt=True, proposals=proposal_files.load_proposals(path, str(tmp_path)))
    assert iou_plus_one([shifted], [second])[0, 0] == pytest.approx(0.75)
    stats = evaluate_box_proposals(dataset, roidb)
    thresholds = np.arange(0.5, 0.95 + 1e-5, 0.05)
    expected = ((1.0 >= thresholds).astype(float) + (0.75 >= thresholds)) / 3
    np.testing.assert_allclose(stats['recalls'], expected)
    assert stats['ar'] == pytest.approx(expected.mean()) and stats['num_pos'] == 3
    # The first proposal alone (limit 1): only the exact one counts.
    assert evaluate_box_proposals(dataset, roidb, limit=1)['ar'] == pytest.approx(1 / 3)
    # Class-specific: class 1's one gt found exactly; class 2's two gt, one at 0.75, one at 0.
    specific = evaluate_box_proposals(dataset, roidb, class_specific=True)
    assert specific['ar'] == pytest.approx((1.0 + (0.75 >= thresholds).mean() / 2) / 2)
