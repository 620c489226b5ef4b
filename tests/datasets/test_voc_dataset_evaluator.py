"""The VOC evaluator (datasets/voc_eval.py, voc_dataset_evaluator.py) against hand-computed APs and an
independent numpy transcription of Detectron's voc_eval, chosen by the dataset name's voc_ prefix."""
import json
import os

import numpy as np
import pytest

from detectron.datasets import dataset_catalog, task_evaluation, voc_dataset_evaluator
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.voc_eval import voc_ap, voc_eval
from detectron.utils.errors import DatasetError
from detectron.utils.io import load_object

CLASSES = ('cat', 'dog')
# image -> [(class, [xmin, ymin, xmax, ymax] 1-based, difficult)]
GT = {
    'im_a': [('cat', [11, 11, 50, 60], 0), ('dog', [61, 21, 90, 70], 0), ('cat', [5, 70, 25, 95], 1)],
    'im_b': [('cat', [31, 31, 80, 80], 0), ('cat', [1, 1, 20, 20], 0)],
    'im_c': [('dog', [21, 11, 70, 50], 0), ('dog', [81, 61, 99, 99], 1)],
}
IMAGES = ('im_a', 'im_b', 'im_c')


def _reference_voc_eval(dets, gt, classname, use_07_metric):
    """Detectron's voc_eval and voc_ap, transcribed: dets [(image, score, box 1-based)]."""
    class_recs, npos = {}, 0
    for name in IMAGES:
        objs = [o for o in gt[name] if o[0] == classname]
        difficult = np.array([o[2] for o in objs]).astype(bool)
        class_recs[name] = {'bbox': np.array([o[1] for o in objs]), 'difficult': difficult, 'det': [False] * len(objs)}
        npos = npos + sum(~difficult)
    image_ids = [d[0] for d in dets]
    confidence = np.array([d[1] for d in dets])
    BB = np.array([d[2] for d in dets], dtype=float)
    sorted_ind = np.argsort(-confidence)
    BB = BB[sorted_ind, :]
    image_ids = [image_ids[x] for x in sorted_ind]
    nd = len(image_ids)
    tp, fp = np.zeros(nd), np.zeros(nd)
    for d in range(nd):
        R = class_recs[image_ids[d]]
        bb = BB[d, :]
        ovmax = -np.inf
        BBGT = R['bbox'].astype(float)
        if BBGT.size > 0:
            ixmin, iymin = np.maximum(BBGT[:, 0], bb[0]), np.maximum(BBGT[:, 1], bb[1])
            ixmax, iymax = np.minimum(BBGT[:, 2], bb[2]), np.minimum(BBGT[:, 3], bb[3])
            inters = np.maximum(ixmax - ixmin + 1., 0.) * np.maximum(iymax - iymin + 1., 0.)
            uni = ((bb[2] - bb[0] + 1.) * (bb[3] - bb[1] + 1.)
                   + (BBGT[:, 2] - BBGT[:, 0] + 1.) * (BBGT[:, 3] - BBGT[:, 1] + 1.) - inters)
            overlaps = inters / uni
            ovmax, jmax = np.max(overlaps), np.argmax(overlaps)
        if ovmax > 0.5:
            if not R['difficult'][jmax]:
                if not R['det'][jmax]:
                    tp[d] = 1.
                    R['det'][jmax] = 1
                else:
                    fp[d] = 1.
        else:
            fp[d] = 1.
    fp, tp = np.cumsum(fp), np.cumsum(tp)
    rec = tp / float(npos)
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    if use_07_metric:
        ap = 0.
        for t in np.arange(0., 1.1, 0.1):
            p = 0 if np.sum(rec >= t) == 0 else np.max(prec[rec >= t])
            ap = ap + p / 11.
        return ap
    mrec, mpre = np.concatenate(([0.], rec, [1.])), np.concatenate(([0.], prec, [0.]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1])


def _write_devkit(root, year, image_set):
    voc = root / 'VOCdevkit' / 'VOC{}'.format(year)
    (voc / 'Annotations').mkdir(parents=True)
    (voc / 'ImageSets' / 'Main').mkdir(parents=True)
    (voc / 'ImageSets' / 'Main' / (image_set + '.txt')).write_text('\n'.join(IMAGES) + '\n')
    for name, objects in GT.items():
        xml = ''.join('<object><name>{}</name><pose>Left</pose><truncated>0</truncated><difficult>{}</difficult>'
                      '<bndbox><xmin>{}</xmin><ymin>{}</ymin><xmax>{}</xmax><ymax>{}</ymax></bndbox></object>'
                      .format(c, d, *b) for c, b, d in objects)
        (voc / 'Annotations' / (name + '.xml')).write_text('<annotation>{}</annotation>'.format(xml))
    return root / 'VOCdevkit'


# Detections (0-based, as cls_boxes): a hit, a duplicate, a miss, a difficult hit, a near miss, ...
DETS = {
    'cat': {'im_a': [[10, 10, 49, 59, 0.9], [12, 11, 50, 58, 0.85], [4, 69, 24, 94, 0.95]],
            'im_b': [[30, 30, 79, 79, 0.7], [50, 0, 90, 30, 0.8], [0, 0, 12, 19, 0.6]],
            'im_c': [[20, 10, 69, 49, 0.75]]},
    'dog': {'im_a': [[60, 20, 89, 69, 0.6], [0, 0, 30, 30, 0.65]],
            'im_b': [],
            'im_c': [[20, 10, 69, 49, 0.9], [80, 60, 98, 98, 0.3]]},
}


def _reference_dets(cls):
    """The detections as the devkit's results file holds them: scores to 3 decimals, boxes 1-based to 0.1."""
    return [(im, float('{:.3f}'.format(d[4])), [float('{:.1f}'.format(v + 1)) for v in d[:4]])
            for im in IMAGES for d in DETS[cls][im]]


def _write_results(path, dets):
    path.write_text(''.join('{} {:.3f} {:.1f} {:.1f} {:.1f} {:.1f}\n'.format(im, s, *b) for im, s, b in dets))


@pytest.mark.parametrize('use_07_metric', [True, False])
@pytest.mark.parametrize('cls', CLASSES)
def test_voc_eval_equals_detectron_s(tmp_path, cls, use_07_metric):
    devkit = _write_devkit(tmp_path, 2007, 'mini')
    _write_results(tmp_path / 'det_{}.txt'.format(cls), _reference_dets(cls))
    _, _, ap = voc_eval(str(tmp_path / 'det_{}.txt'), str(devkit / 'VOC2007' / 'Annotations' / '{:s}.xml'),
                        str(devkit / 'VOC2007' / 'ImageSets' / 'Main' / 'mini.txt'), cls, use_07_metric=use_07_metric)
    expected = _reference_voc_eval(_reference_dets(cls), GT, cls, use_07_metric)
    assert 0 < expected < 1
    assert ap == pytest.approx(expected, abs=1e-12)


def test_voc_ap_of_a_hand_computed_curve():
    # Two objects; detections by score: hit, false positive, hit.
    rec, prec = np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2.0 / 3.0])
    assert voc_ap(rec, prec) == pytest.approx(0.5 * 1.0 + 0.5 * 2.0 / 3.0)
    # 11 points: recall >= 0, ..., 0.5 see precision 1; 0.6, ..., 1.0 see 2/3.
    assert voc_ap(rec, prec, use_07_metric=True) == pytest.approx((6 * 1.0 + 5 * 2.0 / 3.0) / 11)


def _coco_dataset(root):
    """The VOC annotations as a COCO json (Detectron's converted files) beside empty image files."""
    (root / 'images').mkdir()
    for name in IMAGES:
        (root / 'images' / (name + '.jpg')).write_bytes(b'')
    images = [{'id': i + 1, 'file_name': name + '.jpg', 'width': 100, 'height': 100} for i, name in enumerate(IMAGES)]
    annotations = [{'id': 10 * i + k, 'image_id': i + 1, 'category_id': CLASSES.index(c) + 1,
                    'bbox': [b[0] - 1, b[1] - 1, b[2] - b[0] + 1, b[3] - b[1] + 1], 'area': 1.0, 'iscrowd': 0}
                   for i, name in enumerate(IMAGES) for k, (c, b, _) in enumerate(GT[name])]
    categories = [{'id': k + 1, 'name': c} for k, c in enumerate(CLASSES)]
    (root / 'voc.json').write_text(json.dumps({'images': images, 'annotations': annotations, 'categories': categories}))


@pytest.mark.parametrize('year, use_07_metric', [(2007, True), (2012, False)])
def test_a_voc_named_dataset_is_evaluated_by_the_voc_evaluator(tmp_path, monkeypatch, year, use_07_metric):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    devkit = _write_devkit(tmp_path, year, 'mini')
    _coco_dataset(tmp_path)
    name = 'voc_{}_mini'.format(year)
    dataset_catalog.register_dataset(name, str(tmp_path / 'images'), str(tmp_path / 'voc.json'),
                                     devkit_directory=str(devkit))
    all_boxes = [[]] + [[np.array(DETS[c][im], np.float32).reshape(-1, 5) for im in IMAGES] for c in CLASSES]
    out = tmp_path / 'out'
    results = task_evaluation.evaluate_boxes(JsonDataset(name), all_boxes, str(out))
    aps = [_reference_voc_eval(_reference_dets(c), GT, c, use_07_metric) for c in CLASSES]
    assert results[name]['box']['AP50'] == pytest.approx(np.mean(aps), abs=1e-12)
    assert results[name]['box']['AP'] == -1
    assert load_object(str(out / 'dog_pr.pkl'))['ap'] == pytest.approx(aps[1], abs=1e-12)
    # The results files moved out of the devkit into the output directory.
    assert len([f for f in os.listdir(out) if f.startswith('comp4_') and f.endswith('_cat.txt')]) == 1
    assert os.listdir(devkit / 'results' / 'VOC{}'.format(year) / 'Main') == []


def test_images_out_of_the_image_set_s_order_are_one_error(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    devkit = _write_devkit(tmp_path, 2007, 'mini')
    (devkit / 'VOC2007' / 'ImageSets' / 'Main' / 'mini.txt').write_text('im_b\nim_a\nim_c\n')
    _coco_dataset(tmp_path)
    dataset_catalog.register_dataset('voc_2007_mini', str(tmp_path / 'images'), str(tmp_path / 'voc.json'),
                                     devkit_directory=str(devkit))
    with pytest.raises(DatasetError, match='are not those of its VOC image set'):
        voc_dataset_evaluator.evaluate_boxes(JsonDataset('voc_2007_mini'), [[]] * 3, str(tmp_path / 'out'))


def test_detectron_s_voc_names_have_their_devkits():
    assert dataset_catalog.get_devkit_dir('voc_2007_test').endswith(os.path.join('VOC2007', 'VOCdevkit2007'))
    assert dataset_catalog.get_devkit_dir('voc_2012_val').endswith(os.path.join('VOC2012', 'VOCdevkit2012'))
    assert voc_dataset_evaluator.use_voc_evaluator('voc_2012_val')
    assert not voc_dataset_evaluator.use_voc_evaluator('coco_2014_minival')
    with pytest.raises(DatasetError, match='has no devkit_directory'):
        dataset_catalog.get_devkit_dir('coco_2014_minival')
