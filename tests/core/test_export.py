"""core/export.py: each model family's graph against its PyTorch detector, eagerly, in onnxruntime
(ONNX, skipped without the `export` extra) and as a torch.export program; the verification's matching."""
import dataclasses
import functools

import numpy as np
import pytest
import torch

from detectron.core import export
from detectron.core.config import cfg
from detectron.modeling import model_builder, rcnn_builder, rcnn_inference
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import MASK_OVERRIDES, use_centernet, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

# Verified tolerances of the random-weight tiny models (docs/EXPORT.md): far inside export's.
SCORE_TOL = 1e-5
BOX_TOL = 1e-3


def _onnxruntime():
    return pytest.importorskip('onnxruntime', reason="onnxruntime is absent: pip install -e '.[export]'")


def _noise(shape, seed=1):
    return np.random.RandomState(seed).randint(0, 256, size=shape).astype(np.uint8)


def _rcnn(tiny_catalog, tmp_path, *overrides):
    use_tiny_config(tiny_catalog, tmp_path, *overrides)
    torch.manual_seed(0)
    model_type = model_builder.build_model_type(cfg)
    return model_type, model_builder.checked_model(model_type).eval()


def _centernet(tiny_catalog, tmp_path, arch, *overrides):
    """A random-weight CenterNet with its heads re-drawn at He scale and random BatchNorm statistics:
    untrained, its features are zero over whole regions, and a flat heat map ties the peak test
    `max-pool == heat` (and every score) to the last bit."""
    use_centernet(tiny_catalog, tmp_path, 'CENTERNET.ARCH', arch, *overrides)
    torch.manual_seed(0)
    model_type = model_builder.build_model_type(cfg)
    model = model_builder.checked_model(model_type).eval()
    with torch.no_grad():
        for name, weight in model.heads.named_parameters():
            if name.endswith('weight'):
                weight.normal_(0, (2.0 / weight[0].numel()) ** 0.5)
        for name, buffer in model.named_buffers():
            if name.endswith('running_var'):
                buffer.uniform_(0.5, 2)
            elif name.endswith('running_mean'):
                buffer.normal_(0, 0.2)
    return model_type, model


def _check_close(reference, exported, score_tol=SCORE_TOL, box_tol=BOX_TOL, contested=None):
    comparison = export.compare(reference, exported, contested=contested)
    assert comparison.matched > 0
    assert comparison.max_score_diff <= score_tol and comparison.max_box_diff <= box_tol, comparison
    assert all(tied for *_, tied in comparison.unmatched), comparison.unmatched
    return comparison


def _export_and_run(model_type, model, path, example, images, fmt='onnx'):
    """[(PyTorch detector's result, exported file's result)] on each image."""
    exporter = export.export_model(model_type, model, fmt, str(path), example)
    detect_exported = (export.onnx_detector if fmt == 'onnx' else export.program_detector)(exporter, str(path))
    prepare, detect = model_type.test_inputs(), model_type.detector()
    results = []
    for im in images:
        sample = prepare(im)
        with torch.no_grad():
            results.append((detect(model, sample), detect_exported(sample)))
    return results


def test_rcnn_graph_eagerly_equals_the_detector(tiny_catalog, tmp_path):
    """The graph's own ops (torchvision NMS, graph RoIAlign, the cap) give the detector's cls_boxes:
    same detections to float32 rounding, none missing."""
    model_type, model = _rcnn(tiny_catalog, tmp_path)
    exporter = model_type.exporter(model)
    for shape in ((64, 96, 3), (80, 60, 3)):
        sample = model_type.test_inputs()(_noise(shape))
        with torch.no_grad():
            outputs = [x.numpy() for x in exporter.graph(*exporter.inputs(sample))]
            reference = model_type.detector()(model, sample)
        comparison = _check_close(reference, exporter.detections(outputs, sample), score_tol=1e-6, box_tol=1e-4)
        assert not comparison.unmatched
        assert comparison.matched == sum(len(b) for b in reference)


@pytest.mark.parametrize('overrides', [
    (), ('MODEL.BBOX_REG_WEIGHTS', '(5., 5., 2., 2.)'),
    ('PRED_STD', 'True', 'XYXY', 'True', 'STD_NMS', 'True', 'TEST.DETECTIONS_PER_IM', '20'),
    ('TEST.SOFT_NMS.ENABLED', 'True', 'TEST.SOFT_NMS.METHOD', 'gaussian', 'TEST.DETECTIONS_PER_IM', '20'),
], ids=['rcnn', 'weights', 'kl_std_nms', 'soft_nms'])
def test_rcnn_onnx_matches_pytorch_at_other_image_sizes(tiny_catalog, tmp_path, overrides):
    """Traced on one image size, the ONNX graph detects on others (its sizes are dynamic), with
    greedy NMS, KL-Loss's soft-NMS with variance voting and Detectron's soft-NMS."""
    _onnxruntime()
    model_type, model = _rcnn(tiny_catalog, tmp_path, *overrides)
    example = model_type.test_inputs()(_noise((64, 96, 3), seed=0))
    for reference, exported in _export_and_run(model_type, model, tmp_path / 'r.onnx', example,
                                               [_noise((64, 96, 3)), _noise((96, 64, 3)), _noise((50, 70, 3))]):
        _check_close(reference, exported)


def test_mask_rcnn_onnx_masks_match_pytorch(tiny_catalog, tmp_path):
    """Masks pasted from the ONNX graph's M x M probabilities agree with the detector's RLEs; the
    probabilities themselves with the PyTorch graph's within 1e-5. THRESH_BINARIZE 0.3: an untrained
    head's probabilities sit at 0.5, where the last bit decides a pixel."""
    onnxruntime = _onnxruntime()
    model_type, model = _rcnn(tiny_catalog, tmp_path, *MASK_OVERRIDES, 'MRCNN.THRESH_BINARIZE', '0.3')
    example = model_type.test_inputs()(_noise((64, 96, 3), seed=0))
    results = _export_and_run(model_type, model, tmp_path / 'm.onnx', example, [_noise((64, 96, 3))])
    comparison = _check_close(*results[0])
    assert comparison.min_mask_iou > 0.99
    exporter = model_type.exporter(model)
    inputs = exporter.inputs(example)
    session = onnxruntime.InferenceSession(str(tmp_path / 'm.onnx'), providers=['CPUExecutionProvider'])
    got = session.run(['scores', 'masks'], {n: x.numpy() for n, x in zip(exporter.input_names, inputs)})
    with torch.no_grad():
        expected = exporter.graph(*inputs)
    order, expected_order = np.argsort(-got[0], kind='stable'), np.argsort(-expected[1].numpy(), kind='stable')
    assert got[1].shape[1:] == (14, 14) and len(got[1]) > 0
    np.testing.assert_allclose(got[1][order], expected[3].numpy()[expected_order], atol=1e-5)


def test_kl_rcnn_sigmas_are_the_decoded_stds(tiny_catalog, tmp_path):
    """With PRED_STD the graph also gives each detection's sigmas exp(alpha / 2), those that
    decode_detections computes for its RoI and class."""
    model_type, model = _rcnn(tiny_catalog, tmp_path, 'PRED_STD', 'True', 'XYXY', 'True')
    exporter = model_type.exporter(model)
    assert exporter.output_names == ('boxes', 'scores', 'classes', 'sigmas')
    sample = model_type.test_inputs()(_noise((64, 96, 3)))
    blob, im_info, im_hw = exporter.inputs(sample)
    with torch.no_grad():
        boxes, scores, classes, sigmas = exporter.graph(blob, im_info, im_hw)
        out = model(blob, im_info)
    decode = rcnn_builder.decode_params(cfg)
    all_scores, all_boxes, confs = rcnn_inference.decode_detections(
        out, float(im_info[0, 2]), (64, 96), dataclasses.replace(decode, std_nms=True))
    assert len(boxes) > 0
    for box, score, cls, sigma in zip(boxes, scores, classes, sigmas):
        row = (all_scores[:, cls] == score).nonzero().squeeze(1)
        row = row[(all_boxes[row, 4 * cls:4 * cls + 4] - box).abs().amax(1).argmin()]
        torch.testing.assert_close(sigma, confs[row, 4 * cls:4 * cls + 4], rtol=0, atol=0)


@pytest.mark.parametrize('arch', ['res_18', 'resdcn_18', 'dla_34'])
def test_centernet_onnx_matches_pytorch(tiny_catalog, tmp_path, arch):
    """Every arch with its decode, DCN included (grid_sample + matmul)."""
    _onnxruntime()
    model_type, model = _centernet(tiny_catalog, tmp_path, arch)
    example = model_type.test_inputs()(_noise((64, 64, 3), seed=0))
    for reference, exported in _export_and_run(model_type, model, tmp_path / 'c.onnx', example,
                                               [_noise((64, 64, 3)), _noise((64, 64, 3), seed=2)]):
        _check_close(reference, exported)


def test_centernet_dla_onnx_differs_from_pytorch_only_at_contested_peaks(tiny_catalog, tmp_path):
    """At 128 px the random dla_34's nearly flat heat map has neighbours equal to 1e-7, and
    onnxruntime's last bits decide some of their peak tests otherwise than PyTorch's (as on
    shapes_val, BENCHMARKS.md "Export"): the plain tie rules fail; with the contested peaks
    (Exporter.contested) every difference is a tie and the scores agree within 1e-5."""
    _onnxruntime()
    model_type, model = _centernet(tiny_catalog, tmp_path, 'dla_34', 'CENTERNET.INPUT_RES', '128')
    sample = model_type.test_inputs()(_noise((149, 152, 3)))
    exporter = export.export_model(model_type, model, 'onnx', str(tmp_path / 'd.onnx'), sample)
    with torch.no_grad():
        reference = model_type.detector()(model, sample)
    exported = export.onnx_detector(exporter, str(tmp_path / 'd.onnx'))(sample)
    assert export.compare(reference, exported).failures()
    comparison = _check_close(reference, exported, contested=exporter.contested(model, sample, export.SCORE_TOL))
    assert comparison.contested > 0


def test_verify_a_centernet_on_a_dataset_asks_for_each_images_contested_peaks(tiny_catalog, tmp_path):
    """export.verify on a dataset (both detectors through test_net, the exported one here the
    PyTorch detector itself) compares each image with its own contested peaks, in the images' order."""
    model_type, model = _centernet(tiny_catalog, tmp_path, 'res_18')
    exporter = model_type.exporter(model)
    asked, compared = [], []

    def contested(model, sample, tol):
        asked.append(exporter.contested(model, sample, tol))
        return asked[-1]

    real_compare = export.compare

    def compare(reference, exported, comparison=None, contested=None):
        compared.append(contested)
        return real_compare(reference, exported, comparison, contested)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export, 'compare', compare)
        patch.setattr(export, 'onnx_detector', lambda *_: functools.partial(model_type.detector(), model))
        assert export.verify(model_type, model, dataclasses.replace(exporter, contested=contested),
                             'unused.onnx', 'tiny_val_small', str(tmp_path / 'verify'))
    assert len(asked) == 3 and all(a is b for a, b in zip(compared, asked, strict=True))


def test_torch_export_of_the_cpu_models(tiny_catalog, tmp_path, restore_global_cfg):
    """torch.export programs of the R-CNN (at other image sizes too) and of CenterNet resdcn_18 give
    the detector's detections."""
    model_type, model = _rcnn(tiny_catalog, tmp_path)
    example = model_type.test_inputs()(_noise((64, 96, 3), seed=0))
    for reference, exported in _export_and_run(model_type, model, tmp_path / 'r.pt2', example,
                                               [_noise((64, 96, 3))], fmt='exported_program'):
        _check_close(reference, exported)
    restore_global_cfg()
    model_type, model = _centernet(tiny_catalog, tmp_path, 'resdcn_18')
    example = model_type.test_inputs()(_noise((64, 64, 3), seed=0))
    for reference, exported in _export_and_run(model_type, model, tmp_path / 'c.pt2', example,
                                               [_noise((64, 64, 3))], fmt='exported_program'):
        _check_close(reference, exported)


def test_torch_export_of_the_kl_rcnn_with_variance_voting(tiny_catalog, tmp_path):
    """The unrolled soft-NMS with variance voting, its sets padded to a static width, in a torch.export
    program: the detector's detections (10 steps, one per detection kept: 7 and 3 of two classes here;
    each unrolled step adds to the time of export, serialisation and load)."""
    model_type, model = _rcnn(tiny_catalog, tmp_path, 'PRED_STD', 'True', 'XYXY', 'True', 'STD_NMS', 'True',
                              'TEST.DETECTIONS_PER_IM', '10')
    example = model_type.test_inputs()(_noise((64, 96, 3), seed=0))
    for reference, exported in _export_and_run(model_type, model, tmp_path / 'k.pt2', example,
                                               [_noise((64, 96, 3))], fmt='exported_program'):
        _check_close(reference, exported)


def test_export_refuses_settings_the_graph_does_not_run(tiny_catalog, tmp_path):
    model_type, model = _rcnn(tiny_catalog, tmp_path, 'TEST.SOFT_NMS.ENABLED', 'True', 'TEST.DETECTIONS_PER_IM', '0')
    with pytest.raises(ConfigValueError, match='TEST.DETECTIONS_PER_IM can keep; set it above 0'):
        model_type.exporter(model)
    with pytest.raises(ConfigValueError, match='unknown export format'):
        export.export_model(model_type, model, 'tflite', str(tmp_path / 'x'), None)


# ---- the verification's matching on hand-made detections ----

def _cls_boxes(*per_class):
    return [np.zeros((0, 5), np.float32)] + [np.array(rows, np.float32).reshape(-1, 5) for rows in per_class]


A = [10, 10, 50, 60, 0.9]
B = [100, 20, 140, 90, 0.7]
C = [12, 11, 52, 58, 0.7]  # overlaps A (IoU about 0.86), same score as B


def test_reordered_rows_match_their_own_copies():
    comparison = export.compare(_cls_boxes([A, B, C], [B]), _cls_boxes([C, B, A], [B]))
    assert comparison.matched == 4 and not comparison.unmatched
    assert comparison.max_score_diff == 0 and comparison.max_box_diff == 0
    assert not comparison.failures()


def test_equal_scores_pair_by_box_not_by_order():
    # B and C tie on score; the exported C is 0.01 px off: C pairs with C (not with A, IoU 0.86).
    c_moved = [C[0] + 0.01] + C[1:]
    comparison = export.compare(_cls_boxes([A, B, C]), _cls_boxes([c_moved, A, B]))
    assert comparison.matched == 3
    assert comparison.max_box_diff == pytest.approx(0.01, abs=1e-5)
    assert comparison.max_score_diff == 0


def test_differences_past_the_tolerance_fail():
    worse = [A[:4] + [A[4] - 0.01], B[:3] + [B[3] + 0.5, B[4]]]
    comparison = export.compare(_cls_boxes([A, B]), _cls_boxes(worse))
    assert comparison.matched == 2
    assert comparison.max_score_diff == pytest.approx(0.01, abs=1e-6)
    assert comparison.max_box_diff == pytest.approx(0.5)
    failures = comparison.failures()
    assert len(failures) == 2 and 'score difference 0.01' in failures[0] and 'box difference 0.5' in failures[1]


def test_a_detection_at_the_cut_is_a_tie_but_one_above_it_fails():
    low = [200, 200, 220, 230, 0.3]
    lowest = [0, 0, 5, 5, 0.3]
    # Only PyTorch keeps `low`, and the exported model's lowest score is as low: a tie at the cap.
    comparison = export.compare(_cls_boxes([A, low], [lowest]), _cls_boxes([A], [lowest]))
    assert comparison.unmatched == [('pytorch', 1, pytest.approx(0.3), True)]
    assert not comparison.failures()
    # B (0.7) is above every exported score: a missing detection.
    comparison = export.compare(_cls_boxes([A, B], [lowest]), _cls_boxes([A], [lowest]))
    assert comparison.unmatched == [('pytorch', 1, pytest.approx(0.7), False)]
    assert 'class 1 score 0.7000 only in the pytorch model' in comparison.failures()[0]


def test_equal_scores_swapped_at_a_top_k_cut_are_ties():
    # Each model kept another of two equal-score detections of class 2 (a per-class top-k cut).
    other = [60, 60, 90, 90, 0.7]
    comparison = export.compare(_cls_boxes([A], [B]), _cls_boxes([A], [other]))
    assert comparison.matched == 1
    assert [u[3] for u in comparison.unmatched] == [True, True]
    assert not comparison.failures()
    # An exported class-2 detection of another score, above PyTorch's lowest, is no tie (PyTorch's
    # B, below every exported score, may have been cut by the cap).
    comparison = export.compare(_cls_boxes([A], [B]), _cls_boxes([A], [other[:4] + [0.95]]))
    assert [u[3] for u in comparison.unmatched] == [True, False]
    assert comparison.failures()


def test_a_detection_at_a_contested_peak_test_is_a_tie_and_no_pair_of_another_score():
    """CenterNet's peak test decided within the score tolerance (Exporter.contested): PyTorch keeps B,
    the exported model drops it and leaves a zero-score row at B's box. Without `contested`, B and
    its zero row pair with a 0.7 score difference; with it, both are unpaired and tied."""
    zero_at_b = B[:4] + [0.0]
    reference, exported = _cls_boxes([A, B], [A]), _cls_boxes([A, zero_at_b], [A])
    assert export.compare(reference, exported).max_score_diff == pytest.approx(0.7)
    contested = _cls_boxes([B[:3] + [B[3] + 0.05, B[4] + 2e-4]], [])
    comparison = export.compare(reference, exported, contested=contested)
    assert comparison.matched == 2 and comparison.max_score_diff == 0
    assert sorted(comparison.unmatched) == [('exported', 1, 0.0, True), ('pytorch', 1, pytest.approx(0.7), True)]
    assert comparison.contested == 1 and not comparison.failures()


def test_a_contested_detection_must_be_the_same_within_the_tolerances():
    """A stray is excused only by a contested detection of its class within BOX_TOL and SCORE_TOL."""
    high = B[:4] + [0.95]  # above every exported score: no tie at the cap
    reference, exported = _cls_boxes([A, high], [A]), _cls_boxes([A], [A])
    assert not export.compare(reference, exported, contested=_cls_boxes([high], [])).failures()
    for contested in (_cls_boxes([high[:4] + [high[4] + 2e-3]], []),    # score past SCORE_TOL
                      _cls_boxes([[high[0] + 0.2] + high[1:]], []),     # box past BOX_TOL
                      _cls_boxes([], [high])):                          # another class
        comparison = export.compare(reference, exported, contested=contested)
        assert comparison.unmatched == [('pytorch', 1, pytest.approx(0.95), False)] and comparison.failures()
    # A pair of different scores whose rows are not contested still fails.
    comparison = export.compare(_cls_boxes([A]), _cls_boxes([A[:4] + [0.5]]), contested=_cls_boxes([B]))
    assert comparison.max_score_diff == pytest.approx(0.4) and comparison.failures()
