"""ops/graph_soft_nms.py: the unrolled soft-NMS loops and box voting against the eager kernels
(KL-Loss's soft with variance voting, Detectron's soft-NMS, boxes.box_voting), eagerly and in
onnxruntime, and against values worked out by hand."""
import math

import numpy as np
import pytest
import torch
from support.soft_nms_cases import F32, clustered_sets, kl_settings, large_cases, small_cases

from detectron.ops import graph_soft_nms
from detectron.utils import boxes as box_utils
from detectron.utils import cython_nms

DETECTRON_DROP = 0.0001  # Detectron's soft-NMS score threshold at test


def _live(scores, counts):
    return torch.arange(scores.shape[1])[None] < torch.as_tensor(counts)[:, None]


def kl_selections(inputs, settings, steps):
    boxes, scores, sigmas, counts = (torch.from_numpy(np.asarray(a)) for a in inputs)
    vote = None
    if settings['vote']:
        vote = graph_soft_nms.KLVote(boxes, sigmas, settings['vote_thresh'], settings['iou_sigma'])
    return graph_soft_nms.soft_nms_selections(boxes, scores, _live(scores, counts), steps,
                                              graph_soft_nms.KLRescore(settings['hard_nms_thresh']),
                                              graph_soft_nms.KL_DROP_SCORE, vote)


def detectron_selections(inputs, method, steps, overlap_thresh=0.3, sigma=0.5):
    boxes, scores, _, counts = (torch.from_numpy(np.asarray(a)) for a in inputs)
    return graph_soft_nms.soft_nms_selections(boxes, scores, _live(scores, counts), steps,
                                              graph_soft_nms.DetectronRescore(method, sigma, overlap_thresh),
                                              DETECTRON_DROP)


def assert_first_selections(selections, expected_rows, expected_boxes, expected_scores, steps, box_atol=0.0):
    """Set c's first min(steps, kept) selections are the kernel's: rows, boxes and scores."""
    rows, valid, scores, boxes = (t.numpy() for t in selections)
    for c, (want_rows, want_boxes, want_scores) in enumerate(zip(expected_rows, expected_boxes, expected_scores)):
        n = min(steps, len(want_rows))
        assert valid[c].tolist() == [True] * n + [False] * (steps - n)
        assert rows[c, :n].tolist() == list(want_rows[:n])
        np.testing.assert_array_equal(scores[c, :n], want_scores[:n])
        np.testing.assert_allclose(boxes[c, :n], want_boxes[:n], rtol=0, atol=box_atol)


def kl_kernel(inputs, settings):
    order, num_kept, voted, final = cython_nms.soft_nms_with_variance_voting(*inputs, **settings)
    rows = [order[c, :k] for c, k in enumerate(num_kept)]
    return rows, [voted[c, :k] for c, k in enumerate(num_kept)], [final[c, r] for c, r in enumerate(rows)]


CASES = {**small_cases(), **large_cases()}


@pytest.mark.parametrize('name', [n for n in CASES if CASES[n][0][1].shape[1] > 0])
@pytest.mark.parametrize('truncated', [False, True])
def test_kl_selections_equal_the_compiled_kernel(name, truncated):
    """Rows, voted boxes and scores of every selection (or of the first few, as the per-image
    limit needs), equal to the kernel's: ties, drops and the swaps that order them included."""
    inputs, settings = CASES[name]
    width = inputs[1].shape[1]
    steps = max(1, width // 3) if truncated else width
    # The vote's float64 sums run in another order: the voted box may differ in its last bit.
    assert_first_selections(kl_selections(inputs, settings, steps), *kl_kernel(inputs, settings), steps,
                            box_atol=1e-4)


def test_kl_drops_swap_positions_and_ties_follow_them():
    # The kernel's worked case (tests/ops/test_variance_voting.py): after A zeroes rows 1 and 2,
    # the positions are A, 6, 5, 3, 4, and the far boxes tied at 0.3 are selected in that order.
    inputs, settings = small_cases()['drop_swaps_then_ties']
    rows, valid, scores, _ = kl_selections(inputs, settings, 6)
    assert rows[0].tolist()[:5] == [0, 6, 5, 3, 4] and valid[0].tolist() == [True] * 5 + [False]
    assert scores[0, :5].tolist() == pytest.approx([0.9, 0.3, 0.3, 0.3, 0.3])


def detectron_kernel(inputs, method, overlap_thresh=0.3, sigma=0.5):
    boxes, scores, _, counts = inputs
    rows, kept_boxes, kept_scores = [], [], []
    for c, count in enumerate(counts):
        dets = np.hstack([boxes[c, :count], scores[c, :count, None]])
        kept, index = cython_nms.soft_nms(dets, sigma, overlap_thresh, DETECTRON_DROP,
                                          {'hard': 0, 'linear': 1, 'gaussian': 2}[method])
        rows.append(index)
        kept_boxes.append(kept[:, :4])
        kept_scores.append(kept[:, 4])
    return rows, kept_boxes, kept_scores


@pytest.mark.parametrize('method', ['linear', 'gaussian', 'hard'])
@pytest.mark.parametrize('ties', [False, True])
def test_detectron_soft_nms_selections_equal_the_compiled_kernel(method, ties):
    inputs = clustered_sets(20 + ties, 40, [40, 25, 1, 0], ties=ties)
    # Scores near the drop score, so that the linear and Gaussian weights drop boxes too.
    inputs = (inputs[0], np.where(inputs[1] < 0.01, inputs[1] / 20, inputs[1]).astype(F32)) + inputs[2:]
    expected = detectron_kernel(inputs, method)
    assert sum(len(r) < n for r, n in zip(expected[0], inputs[3])) >= 1  # something is dropped
    for steps in (40, 7):
        assert_first_selections(detectron_selections(inputs, method, steps), *expected, steps)


@pytest.mark.parametrize('method', ['linear', 'gaussian'])
def test_detectron_soft_nms_by_hand(method):
    # A [0,0,9,9] 0.9 and B [0,0,9,19] 0.8: IoU 100 / 200 = 0.5 > 0.3, so B is rescored by
    # 1 - 0.5 (linear) or exp(-0.5^2 / 0.5) (Gaussian); C far away keeps 0.7 and comes second.
    boxes = np.array([[[0, 0, 9, 9], [0, 0, 9, 19], [50, 50, 59, 59]]], F32)
    inputs = (boxes, np.array([[0.9, 0.8, 0.7]], F32), np.ones((1, 3, 4), F32), np.array([3]))
    rows, valid, scores, kept_boxes = detectron_selections(inputs, method, 3)
    weight = 0.5 if method == 'linear' else math.exp(-0.25 / 0.5)
    assert rows[0].tolist() == [0, 2, 1] and valid.all()
    np.testing.assert_allclose(scores[0].numpy(), [0.9, 0.7, 0.8 * weight], rtol=1e-6)
    np.testing.assert_array_equal(kept_boxes[0].numpy(), boxes[0, [0, 2, 1]])


@pytest.mark.parametrize('method', ['ID', 'AVG', 'IOU_AVG', 'GENERALIZED_AVG', 'QUASI_SUM', 'TEMP_AVG'])
def test_box_voting_equals_detectrons_per_group(method):
    boxes, scores, _, _ = clustered_sets(30, 60, [60, 60, 60])
    groups = np.repeat(np.arange(3), 60)
    all_dets = np.hstack([boxes.reshape(-1, 4), scores.reshape(-1, 1)]).astype(F32)
    top = np.arange(0, 180, 4)
    top_dets = all_dets[top].copy()
    top_dets[:, 4] *= 0.5  # the kept detections' own (rescored) scores: kept by 'ID'
    voted = graph_soft_nms.box_voting(torch.from_numpy(top_dets), torch.from_numpy(groups[top]),
                                      torch.from_numpy(all_dets), torch.from_numpy(groups), 0.7, method, 2.0).numpy()
    for g in range(3):
        mine = groups[top] == g
        expected = box_utils.box_voting(top_dets[mine], all_dets[groups == g], 0.7, scoring_method=method, beta=2.0)
        np.testing.assert_allclose(voted[mine], expected, rtol=2e-6, atol=1e-4)
    assert not np.allclose(voted[:, :4], top_dets[:, :4])  # the cases do vote


class _Selections(torch.nn.Module):
    def __init__(self, steps, rescore, drop_below, vote_settings=None):
        super().__init__()
        self.steps, self.rescore, self.drop_below, self.vote_settings = steps, rescore, drop_below, vote_settings

    def forward(self, boxes, scores, sigmas, counts):
        vote = None
        if self.vote_settings:
            vote = graph_soft_nms.KLVote(boxes, sigmas, *self.vote_settings)
        live = torch.arange(scores.shape[1])[None] < counts[:, None]
        return graph_soft_nms.soft_nms_selections(boxes, scores, live, self.steps, self.rescore, self.drop_below,
                                                  vote)


@pytest.mark.parametrize('kind', ['kl_vote', 'kl_hard', 'detectron_gaussian', 'detectron_linear'])
def test_selections_in_onnxruntime(tmp_path, kind):
    """Traced on one case, run in onnxruntime on others of other sizes (ties, drops): the
    kernels' selections."""
    onnxruntime = pytest.importorskip('onnxruntime', reason="onnxruntime is absent: pip install -e '.[export]'")
    settings = kl_settings(hard_nms_thresh=0.5 if kind == 'kl_hard' else None)
    if kind.startswith('kl'):
        module = _Selections(6, graph_soft_nms.KLRescore(settings['hard_nms_thresh']), graph_soft_nms.KL_DROP_SCORE,
                             (settings['vote_thresh'], settings['iou_sigma']))
    else:
        module = _Selections(6, graph_soft_nms.DetectronRescore(kind.split('_')[1], 0.5, 0.3), DETECTRON_DROP)
    example = tuple(torch.from_numpy(a) for a in clustered_sets(40, 9, [9, 5]))
    path = str(tmp_path / 's.onnx')
    torch.onnx.export(module, example, path, dynamo=False, opset_version=18,
                      input_names=['boxes', 'scores', 'sigmas', 'counts'],
                      dynamic_axes={'boxes': {0: 'c', 1: 'n'}, 'scores': {0: 'c', 1: 'n'},
                                    'sigmas': {0: 'c', 1: 'n'}, 'counts': {0: 'c'}})
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    for inputs in (clustered_sets(41, 17, [17, 17, 9], ties=True), clustered_sets(42, 30, [30, 12]),
                   small_cases()['drop_swaps_then_ties'][0]):
        feeds = {i.name: np.asarray(inputs[['boxes', 'scores', 'sigmas', 'counts'].index(i.name)])
                 for i in session.get_inputs()}
        outputs = [torch.from_numpy(o) for o in session.run(None, feeds)]
        if kind.startswith('kl'):
            expected = kl_kernel(inputs, settings)
        else:
            expected = detectron_kernel(inputs, kind.split('_')[1])
        assert_first_selections(outputs, *expected, 6, box_atol=1e-4)
