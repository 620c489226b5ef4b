"""modeling/rcnn_export.py: the graph's per-class NMS variants (greedy, Detectron's soft-NMS,
KL-Loss's soft-NMS with variance voting, box voting) and the per-image cap give the eager test's
detections (rcnn_inference.final_detections_t) on random detections, eagerly and in onnxruntime."""
import dataclasses

import numpy as np
import pytest
import torch

from detectron.modeling import rcnn_export, rcnn_inference
from detectron.ops import graph_ops
from detectron.utils.errors import ConfigValueError

BASE = rcnn_inference.NMSParams(score_thresh=0.05, nms=0.5, detections_per_im=15)
VARIANTS = {
    'std_nms': dataclasses.replace(BASE, std_nms=True),
    'std_nms_hard_corrected': dataclasses.replace(BASE, std_nms=True, std_soft='hard', sigma_column_order='corrected'),
    'soft_linear': dataclasses.replace(BASE, soft_nms=True),
    'soft_gaussian': dataclasses.replace(BASE, soft_nms=True, soft_nms_method='gaussian'),
    'bbox_vote': dataclasses.replace(BASE, bbox_vote=True, bbox_vote_scoring_method='AVG'),
    'soft_bbox_vote': dataclasses.replace(BASE, soft_nms=True, bbox_vote=True),
}


def random_detections(seed, rois=80, classes=4, ties=False):
    """A box head's outputs on RoIs around 5 objects: scores (R, K), boxes and sigmas (R, 4K);
    with ties, scores from a few logit levels (rows of equal scores)."""
    gen = torch.Generator().manual_seed(seed)
    centres = (torch.rand(5, 2, generator=gen) * 150)[torch.randint(0, 5, (rois,), generator=gen)]
    centres = centres + torch.randn(rois, 2, generator=gen) * 6
    boxes = []
    for _ in range(classes):
        half = 10 + torch.rand(rois, 2, generator=gen) * 10
        jitter = torch.randn(rois, 2, generator=gen) * 3
        boxes.append(torch.cat([centres + jitter - half, centres + jitter + half], 1).clamp(0, 199))
    logits = torch.randn(rois, classes, generator=gen) * 2
    if ties:
        logits = (logits * 2).round() / 2
    sigmas = torch.rand(rois, 4 * classes, generator=gen) * 0.5 + 0.05
    return logits.softmax(1), torch.cat(boxes, 1), sigmas


class _Detections(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.params = params

    def forward(self, scores, boxes, sigmas):
        det_boxes, det_scores, classes, _ = rcnn_export.detections(scores, boxes, sigmas, self.params)
        keep = graph_ops.limit_detections(det_scores, self.params.detections_per_im)
        return det_boxes[keep], det_scores[keep], classes[keep]


def assert_same_detections(params, scores, boxes, sigmas, outputs, box_atol):
    """The outputs match the eager detections row for row once both are sorted by class and score."""
    dets, classes = rcnn_inference.final_detections_t(scores, boxes, sigmas, params)
    expected = sorted(zip(classes.tolist(), (-dets[:, 4]).tolist(), dets[:, :4].tolist()))
    det_boxes, det_scores, det_classes = (np.asarray(o) for o in outputs)
    actual = sorted(zip(det_classes.tolist(), (-det_scores).tolist(), det_boxes.tolist()))
    assert len(actual) == len(expected) > 5
    for (want_class, want_score, want_box), (got_class, got_score, got_box) in zip(expected, actual):
        assert got_class == want_class
        assert got_score == pytest.approx(want_score, abs=1e-6)
        np.testing.assert_allclose(got_box, want_box, rtol=0, atol=box_atol)
    return dets


@pytest.mark.parametrize('name', list(VARIANTS))
@pytest.mark.parametrize('seed', range(3))
def test_graph_detections_equal_the_eager_tests(name, seed):
    params = VARIANTS[name]
    # Greedy NMS visits equal scores in another order than Detectron's kernel: ties only for soft-NMS.
    inputs = random_detections(seed, ties=seed == 2 and not params.bbox_vote)
    with torch.no_grad():
        outputs = _Detections(params)(*inputs)
    # Box voting sums in another order than numpy's: float32 rounding of 200 px boxes.
    dets = assert_same_detections(params, *inputs, outputs, box_atol=5e-5 if params.bbox_vote else 0)
    if params.std_nms or params.bbox_vote:
        # The voted boxes are not the candidates' own boxes.
        scores, boxes, _ = inputs
        candidates = boxes.reshape(-1, 4)
        assert not all(any(torch.equal(d, c) for c in candidates) for d in dets[:, :4])


@pytest.mark.parametrize('name', ['std_nms', 'soft_linear', 'soft_gaussian', 'bbox_vote'])
def test_graph_detections_in_onnxruntime(tmp_path, name):
    onnxruntime = pytest.importorskip('onnxruntime', reason="onnxruntime is absent: pip install -e '.[export]'")
    params = VARIANTS[name]
    path = str(tmp_path / 'd.onnx')
    torch.onnx.export(_Detections(params), random_detections(0), path, dynamo=False, opset_version=18,
                      input_names=['scores', 'boxes', 'sigmas'],
                      dynamic_axes={'scores': {0: 'rois'}, 'boxes': {0: 'rois'}, 'sigmas': {0: 'rois'}})
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    for seed, rois in ((1, 50), (2, 120), (3, 90)):
        inputs = random_detections(seed, rois, ties=seed == 2 and not params.bbox_vote)
        feeds = dict(zip(['scores', 'boxes', 'sigmas'], (x.numpy() for x in inputs)))
        outputs = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        assert_same_detections(params, *inputs, outputs, box_atol=5e-5 if params.bbox_vote else 0)


@pytest.mark.parametrize('overrides,message', [
    (dict(std_nms=True, detections_per_im=0), 'set it above 0'),
    (dict(std_nms=True, bbox_vote=True), 'SCORING_METHOD'),
    (dict(soft_nms=True, bbox_vote=True, bbox_vote_scoring_method='AVG'), 'SCORING_METHOD'),
])
def test_soft_nms_settings_the_graph_cannot_bound_are_refused(overrides, message):
    params = rcnn_export.RCNNGraphParams(image=None, decode=None, nms=dataclasses.replace(BASE, **overrides))
    with pytest.raises(ConfigValueError, match=message):
        rcnn_export.check_exportable(params)
    rcnn_export.check_exportable(dataclasses.replace(params, nms=BASE))
