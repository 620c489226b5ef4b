"""Export a model's whole inference (model_type.exporter) to ONNX or a torch.export program, and
verify the exported file (in onnxruntime, or the loaded program) against the PyTorch model's
detector (docs/EXPORT.md).

The verification matches the two detectors' detections by class and IoU (not by row order: equal
scores may come in either order) and fails past the tolerances below.
"""
import glob
import logging
import os
import warnings
from dataclasses import dataclass, field

import cv2
import numpy as np
import pycocotools.mask as mask_util
import torch

from detectron.core import test_engine
from detectron.core.config import cfg
from detectron.datasets import dataset_catalog, task_evaluation
from detectron.datasets.json_dataset import JsonDataset
from detectron.utils.errors import ConfigValueError, DatasetError

logger = logging.getLogger(__name__)

ONNX_OPSET = 18
FORMATS = ('onnx', 'exported_program')
# A pair of detections is the same detection when class and IoU >= MATCH_IOU agree; it must then
# agree within these tolerances (float32 kernels of onnxruntime and PyTorch differ by ~1e-6).
MATCH_IOU = 0.5
SCORE_TOL = 1e-3
BOX_TOL = 0.1  # pixels of the original image
MASK_IOU_MIN = 0.9  # binarised masks: only pixels at the threshold may flip


def export_model(model_type, model, fmt, output, example):
    """Write model's inference graph to `output`: ONNX (TorchScript tracing, opset ONNX_OPSET,
    dynamic image sizes where the graph has them) or a torch.export program (torch.export.save;
    shapes of `example`; on CUDA with the Triton kernels as custom ops). example: a test_inputs()
    sample to trace with, on the model's device. Returns the Exporter."""
    if fmt not in FORMATS:
        raise ConfigValueError('unknown export format {!r}: use one of {}'.format(fmt, ', '.join(FORMATS)))
    exporter = model_type.exporter(model)
    # Eval mode on the wrapper too: the ONNX exporter gives the exported module back its own mode.
    exporter.graph.eval()
    device = next(exporter.graph.parameters()).device
    inputs = tuple(x.to(device) for x in exporter.inputs(example))
    with torch.no_grad():
        # One eager run first: the model's caches (anchors, tap positions, tables) then hold real
        # tensors, not the tracer's or torch.export's fake ones, which later eager calls would read.
        exporter.graph(*inputs)
    with torch.no_grad(), warnings.catch_warnings():
        # The tracer warns about every shape check it records as a constant; the tests cover what it keeps.
        warnings.simplefilter('ignore')
        if fmt == 'onnx':
            torch.onnx.export(exporter.graph, inputs, output, dynamo=False, opset_version=ONNX_OPSET,
                              input_names=list(exporter.input_names), output_names=list(exporter.output_names),
                              dynamic_axes=exporter.dynamic_axes)
        else:
            torch.export.save(torch.export.export(exporter.graph, inputs, strict=False), output)
    logger.info('Wrote %s (%s)', os.path.abspath(output), fmt)
    return exporter


def onnx_detector(exporter, path):
    """fn(sample) -> the exported file's detections of a test sample, by onnxruntime on the CPU,
    ended on the host by exporter.detections as detector() returns them."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])

    def detect(sample):
        feeds = {name: x.numpy() for name, x in zip(exporter.input_names, exporter.inputs(sample))}
        return exporter.detections(session.run(list(exporter.output_names), feeds), sample)
    return detect


def program_detector(exporter, path):
    """fn(sample) -> the detections of a test sample by the torch.export program saved at `path`
    (torch.export.load), on the device of the exporter's model, ended by exporter.detections.
    The program has the input shapes it was traced with: other shapes are refused with one line."""
    program = torch.export.load(path)
    module = program.module()
    device = next(exporter.graph.parameters()).device
    traced = [tuple(spec.meta['val'].shape) for spec in program.graph.find_nodes(op='placeholder')
              if spec.name in program.graph_signature.user_inputs]

    def detect(sample):
        inputs = tuple(x.to(device) for x in exporter.inputs(sample))
        shapes = [tuple(x.shape) for x in inputs]
        if shapes != traced:
            raise ConfigValueError('the torch.export program {} takes inputs of shapes {} (those it was traced with); '
                                   'this image gives {}: verify it on images of that size, or export ONNX (any image '
                                   'size)'.format(path, traced, shapes))
        with torch.no_grad():
            outputs = module(*inputs)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return exporter.detections([x.cpu().numpy() for x in outputs], sample)
    return detect


@dataclass
class Comparison:
    """What match_detections found over one or more images."""
    matched: int = 0
    unmatched: list = field(default_factory=list)  # (side, class, score, tied) of each unmatched detection
    contested: int = 0  # how many of the tied ones tie at a decision the graph takes on other scores
    max_score_diff: float = 0.0
    max_box_diff: float = 0.0
    min_mask_iou: float = 1.0

    def failures(self):
        """Lines saying what exceeds the tolerances (none: the exported model agrees)."""
        score_tol, box_tol, mask_iou_min = SCORE_TOL, BOX_TOL, MASK_IOU_MIN
        lines = []
        if self.max_score_diff > score_tol:
            lines.append('largest score difference {:.3g} > {:g}'.format(self.max_score_diff, score_tol))
        if self.max_box_diff > box_tol:
            lines.append('largest box difference {:.3g} px > {:g} px'.format(self.max_box_diff, box_tol))
        if self.min_mask_iou < mask_iou_min:
            lines.append('smallest mask IoU {:.3g} < {:g}'.format(self.min_mask_iou, mask_iou_min))
        strays = [u for u in self.unmatched if not u[3]]
        if strays:
            side, cls, score, _ = max(strays, key=lambda u: u[2])
            lines.append('{} detections without a match, e.g. class {} score {:.4f} only in the {} model'.format(
                len(strays), cls, score, side))
        return lines


def compare(reference, exported, comparison=None, contested=None):
    """Add one image's detections to comparison (a new one when None) and return it: reference and
    exported are what detector() returns (cls_boxes, or (cls_boxes, cls_segms)). Detections pair
    up within a class by IoU >= MATCH_IOU, the highest IoU first (then the closest score), so row
    order does not matter. A detection left without a pair counts as a tie when its score is within
    score_tol of the other model's lowest score of the image (the cap or the threshold), of a
    detection of its class the other model left without a pair (equal scores at a top-k cut, where
    either model may keep either), or when it is one of `contested` (Exporter.contested's cls_boxes,
    its coordinates within BOX_TOL and its score within score_tol: kept or dropped by a decision
    within score_tol). A contested detection does not pair with a row whose score differs past
    score_tol: the other model dropped it (CenterNet's peak test leaves a zero score at its box)."""
    comparison = comparison or Comparison()
    score_tol = SCORE_TOL
    (ref_boxes, ref_segms), (exp_boxes, exp_segms) = _boxes_and_segms(reference), _boxes_and_segms(exported)
    lowest = {side: min((float(d[:, 4].min()) for d in boxes if len(d)), default=np.inf)
              for side, boxes in (('pytorch', ref_boxes), ('exported', exp_boxes))}
    for cls, (ref, exp) in enumerate(zip(ref_boxes, exp_boxes)):
        ref, exp = (np.asarray(d, np.float32).reshape(-1, 5) for d in (ref, exp))  # a class without boxes may be []
        decided = {side: _contested(dets, contested[cls] if contested is not None else None)
                   for side, dets in (('pytorch', ref), ('exported', exp))}
        pairs = [(i, j) for i, j in match_class(ref, exp) if abs(float(ref[i, 4]) - float(exp[j, 4])) <= score_tol
                 or not (decided['pytorch'][i] or decided['exported'][j])]
        for i, j in pairs:
            comparison.max_score_diff = max(comparison.max_score_diff, float(abs(ref[i, 4] - exp[j, 4])))
            comparison.max_box_diff = max(comparison.max_box_diff, float(np.abs(ref[i, :4] - exp[j, :4]).max()))
            if ref_segms is not None:
                comparison.min_mask_iou = min(comparison.min_mask_iou, mask_iou(ref_segms[cls][i], exp_segms[cls][j]))
        comparison.matched += len(pairs)
        unpaired = {'pytorch': _unpaired(len(ref), {i for i, _ in pairs}),
                    'exported': _unpaired(len(exp), {j for _, j in pairs})}
        left = {'pytorch': ref[unpaired['pytorch'], 4].astype(np.float64),
                'exported': exp[unpaired['exported'], 4].astype(np.float64)}
        for side, other in (('pytorch', 'exported'), ('exported', 'pytorch')):
            for score, at_decision in zip(left[side], decided[side][unpaired[side]]):
                cut = score <= lowest[other] + score_tol or bool(np.any(np.abs(left[other] - score) <= score_tol))
                comparison.contested += int(at_decision and not cut)
                comparison.unmatched.append((side, cls, float(score), bool(cut or at_decision)))
    return comparison


def _unpaired(count, paired):
    return np.array([k for k in range(count) if k not in paired], dtype=np.int64)


def _contested(rows, contested):
    """For each row (N, 5) [x1, y1, x2, y2, score], whether a contested row (M, 5) is the same
    detection within the tolerances (coordinates within BOX_TOL, score within SCORE_TOL)."""
    if contested is None or not len(rows) or not len(contested):
        return np.zeros(len(rows), bool)
    rows, contested = rows.astype(np.float64), contested.astype(np.float64)
    box_diff = np.abs(rows[:, None, :4] - contested[None, :, :4]).max(axis=2)
    score_diff = np.abs(rows[:, None, 4] - contested[None, :, 4])
    return ((box_diff <= BOX_TOL) & (score_diff <= SCORE_TOL)).any(axis=1)


def match_class(ref, exp, iou_thresh=MATCH_IOU):
    """[(i, j)]: rows of ref and exp (N, 5) [x1, y1, x2, y2, score] paired greedily, the pair closest
    in units of the tolerances first (max(score difference / SCORE_TOL, largest coordinate
    difference / BOX_TOL)), then by IoU: equal boxes in another row order, or tied scores, pair with
    their own copy. A pair needs IoU >= iou_thresh (+1 sides, as Detectron's) or boxes within
    BOX_TOL (an untrained model's inverted boxes have no IoU)."""
    if not len(ref) or not len(exp):
        return []
    ref, exp = ref.astype(np.float64), exp.astype(np.float64)
    iou = _iou(ref[:, :4], exp[:, :4])
    box_diff = np.abs(ref[:, None, :4] - exp[None, :, :4]).max(axis=2)
    closeness = np.maximum(np.abs(ref[:, None, 4] - exp[None, :, 4]) / SCORE_TOL, box_diff / BOX_TOL)
    candidates = np.argwhere((iou >= iou_thresh) | (box_diff <= BOX_TOL))
    i, j = candidates[:, 0], candidates[:, 1]
    pairs, used_i, used_j = [], set(), set()
    for a, b in candidates[np.lexsort((-iou[i, j], closeness[i, j]))]:
        if a not in used_i and b not in used_j:
            pairs.append((int(a), int(b)))
            used_i.add(a)
            used_j.add(b)
    return pairs


def mask_iou(a, b):
    """IoU of two COCO RLEs; two empty masks agree (1)."""
    if not mask_util.area(a) and not mask_util.area(b):
        return 1.0
    return float(mask_util.iou([a], [b], [0])[0, 0])


def _iou(a, b):
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo + 1, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2] + 1, axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2] + 1, axis=1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def _boxes_and_segms(result):
    return result if isinstance(result, tuple) else (result, None)


IMAGE_EXTENSIONS = ('jpg', 'jpeg', 'png', 'bmp')


def verify(model_type, model, exporter, path, source, output_dir, fmt='onnx'):
    """Verify the exported file `path` of format fmt (ONNX in onnxruntime, or a torch.export program)
    against model on `source` (a registered dataset name, an image or a folder of images); True when
    within the tolerances (report logs the numbers)."""
    detect_exported = onnx_detector(exporter, path) if fmt == 'onnx' else program_detector(exporter, path)
    contested = _contested_of(exporter, model)
    if dataset_catalog.contains(source):
        return report(*verify_dataset(model_type, model, detect_exported, source, output_dir, contested), runtime=fmt)
    return report(verify_images(model_type, model, detect_exported, image_paths(source), contested), runtime=fmt)


def _contested_of(exporter, model):
    """fn(sample) -> the PyTorch model's contested detections (Exporter.contested) or None."""
    if exporter.contested is None:
        return lambda sample: None
    return lambda sample: exporter.contested(model, sample, SCORE_TOL)


def image_paths(source):
    """The image file `source`, or the images (IMAGE_EXTENSIONS) of the folder `source`."""
    if not os.path.isdir(source):
        if not os.path.isfile(source):
            raise DatasetError('--verify {}: neither a registered dataset, an image nor a folder'.format(source))
        return [source]
    paths = sorted(p for ext in IMAGE_EXTENSIONS for p in glob.glob(os.path.join(source, '*.' + ext)))
    if not paths:
        raise DatasetError('folder {} holds no image ({})'.format(source, ', '.join(IMAGE_EXTENSIONS)))
    return paths


def example_sample(model_type, source):
    """The sample to trace with: the first image of a folder or file source, else a fixed random image."""
    if source and not dataset_catalog.contains(source):
        return model_type.test_inputs()(cv2.imread(image_paths(source)[0]))
    im = np.random.RandomState(0).randint(0, 256, size=(EXAMPLE_SIZE[0], EXAMPLE_SIZE[1], 3)).astype(np.uint8)
    return model_type.test_inputs()(im)


EXAMPLE_SIZE = (480, 640)


def verify_images(model_type, model, detect_exported, paths, contested):
    """Comparison of model's detector with detect_exported (onnx_detector, program_detector) on the image files;
    contested(sample): compare's `contested`."""
    detect = model_type.detector()
    prepare = model_type.test_inputs()
    comparison = Comparison()
    for path in paths:
        im = cv2.imread(path)
        if im is None:
            raise ConfigValueError('cannot read image {}'.format(path))
        sample = prepare(im)
        with torch.no_grad():
            reference = detect(model, sample)
        compare(reference, detect_exported(sample), comparison, contested(sample))
    return comparison


class _ExportedModelType:
    """model_type whose detector is the exported file's (for test_engine.test_net); it also keeps
    each image's contested(sample) in `contested`, in the images' order."""

    def __init__(self, model_type, detect_exported, contested):
        self._model_type, self._detect, self._contested = model_type, detect_exported, contested
        self.contested = []

    def __getattr__(self, name):
        return getattr(self._model_type, name)

    def batch_detector(self):
        def detect(_model, samples):
            self.contested += [self._contested(sample) for sample in samples]
            return [self._detect(sample) for sample in samples]
        return detect


def verify_dataset(model_type, model, detect_exported, name, output_dir, contested):
    """(Comparison, {'pytorch': results, 'exported': results}) on dataset `name`: both detectors
    through test_engine.test_net and COCO's evaluation (task_evaluation.evaluate_all);
    contested(sample): compare's `contested`."""
    comparison, results, detections = Comparison(), {}, {}
    exported_type = _ExportedModelType(model_type, detect_exported, contested)
    for side, typed in (('pytorch', model_type), ('exported', exported_type)):
        side_dir = os.path.join(output_dir, side)
        os.makedirs(side_dir, exist_ok=True)
        _, (all_boxes, all_segms, _) = test_engine.test_net(typed, None, name, side_dir, model=model)
        detections[side] = (all_boxes, all_segms)
        results[side] = task_evaluation.evaluate_all(
            JsonDataset(name), all_boxes, side_dir, competition_mode=cfg.TEST.COMPETITION_MODE,
            results_format=model_type.results_format(), all_segms=all_segms)[name]
    (ref_boxes, ref_segms), (exp_boxes, exp_segms) = detections['pytorch'], detections['exported']
    for i in range(len(ref_boxes[0])):
        reference = [c[i] for c in ref_boxes]
        exported = [c[i] for c in exp_boxes]
        if ref_segms is not None:
            reference, exported = (reference, [c[i] for c in ref_segms]), (exported, [c[i] for c in exp_segms])
        compare(reference, exported, comparison, exported_type.contested[i])
    return comparison, results


RUNTIMES = {'onnx': 'onnxruntime', 'exported_program': 'torch.export'}


def report(comparison, results=None, runtime='onnx'):
    """Log the comparison (and both models' APs, the exported one's named by its format `runtime`);
    True when it is within the tolerances."""
    tied = sum(1 for u in comparison.unmatched if u[3])
    logger.info('verify: %d detections matched by class and IoU >= %g (or boxes within %g px); %d without a '
                'match (%d of them ties at a cut, %d at a decision within the score tolerance)', comparison.matched,
                MATCH_IOU, BOX_TOL, len(comparison.unmatched), tied - comparison.contested, comparison.contested)
    logger.info('verify: largest score difference %.3g (tolerance %g), largest box difference %.3g px '
                '(tolerance %g px)', comparison.max_score_diff, SCORE_TOL, comparison.max_box_diff, BOX_TOL)
    if comparison.min_mask_iou < 1.0:
        logger.info('verify: smallest mask IoU %.4f (tolerance %g)', comparison.min_mask_iou, MASK_IOU_MIN)
    for task in (results or {}).get('pytorch', {}):
        logger.info('verify: %s AP pytorch %.4f, %s %.4f', task, results['pytorch'][task]['AP'], RUNTIMES[runtime],
                    results['exported'][task]['AP'])
    failures = comparison.failures()
    for line in failures:
        logger.error('verify: FAILED: %s', line)
    if not failures:
        logger.info('verify: PASSED')
    return not failures
