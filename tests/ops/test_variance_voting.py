"""KL-Loss's soft-NMS with variance voting: the compiled CPU kernel (cython_nms) and the Triton
kernel (run by Triton's interpreter in a subprocess) against a plain numpy transcription of
KL-Loss's py_cpu_nms.soft and against values worked out by hand."""
import json
import math
import sys
import time

import numpy as np
import pytest
import torch
from support.soft_nms_cases import F32, clustered_sets, kl_settings, large_cases, small_cases
from triton_subprocess import run_kernel_script

from detectron.ops import variance_voting
from detectron.utils import cython_nms


# ---------------------------------------------------------------------------------------------
# Independent reference: KL-Loss's py_cpu_nms.soft on one set, step by step in numpy with its
# dtypes (float32 dets and sigmas, a float64 matrix holding the float32 IoUs), tracking rows.
# ---------------------------------------------------------------------------------------------

def kl_soft_reference(boxes, scores, sigmas, vote_thresh, iou_sigma, vote, hard_nms_thresh):
    """Returns the input rows kept in selection order, their voted boxes and the final score of
    every input row."""
    dets = np.hstack([boxes, scores[:, None]]).astype(F32)
    confidence = sigmas.astype(F32)
    rows = np.arange(len(dets))
    n = len(dets)
    x1, y1, x2, y2 = (dets[:, c].copy() for c in range(4))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    ious = np.zeros((n, n))
    for r in range(n):
        w = np.maximum(0.0, np.minimum(x2[r], x2) - np.maximum(x1[r], x1) + 1.)
        h = np.maximum(0.0, np.minimum(y2[r], y2) - np.maximum(y1[r], y1) + 1.)
        inter = w * h
        ious[r] = inter / (areas[r] + areas - inter)

    def swap(a, b):
        for array in (dets, confidence, rows):
            array[[a, b]] = array[[b, a]]
        ious[[a, b]] = ious[[b, a]]
        ious[:, [a, b]] = ious[:, [b, a]]

    i = 0
    while i < n:
        swap(i, i + dets[i:n, 4].argmax())
        if vote:
            voters = i + np.flatnonzero(ious[i, i:n] > vote_thresh)
            p = np.exp(-(1 - ious[i, voters]) ** 2 / iou_sigma)
            dets[i, :4] = (p.dot(dets[voters, :4] / confidence[voters] ** 2)
                           / p.dot(1. / confidence[voters] ** 2))
        pos = i + 1
        while pos < n:
            ovr = ious[i, pos]
            if ovr > 0:
                if hard_nms_thresh is not None:
                    if ovr > hard_nms_thresh:
                        dets[pos, 4] = 0
                else:
                    dets[pos, 4] *= np.exp(-(ovr * ovr) / 0.5)
                if dets[pos, 4] < 0.001:
                    swap(pos, n - 1)
                    n -= 1
                    continue
            pos += 1
        i += 1
    final_scores = np.empty(len(dets), F32)
    final_scores[rows] = dets[:, 4]
    return rows[:n], dets[:n, :4], final_scores


def as_tensors(inputs):
    return [torch.from_numpy(a) for a in inputs]


def assert_matches_reference(outputs, inputs, settings):
    order, num_kept, voted, final_scores = (np.asarray(o) for o in outputs)
    boxes, scores, sigmas, counts = inputs
    num_sets, width = scores.shape
    assert order.shape == (num_sets, width) and order.dtype == np.int64
    assert num_kept.shape == (num_sets,) and num_kept.dtype == np.int64
    assert voted.shape == (num_sets, width, 4) and voted.dtype == np.float32
    assert final_scores.shape == (num_sets, width) and final_scores.dtype == np.float32
    for c, count in enumerate(counts):
        rows, ref_voted, ref_scores = kl_soft_reference(boxes[c, :count], scores[c, :count],
                                                        sigmas[c, :count], **settings)
        k = len(rows)
        assert num_kept[c] == k, c
        np.testing.assert_array_equal(order[c, :k], rows, err_msg=f'set {c}')
        np.testing.assert_allclose(voted[c, :k], ref_voted, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(final_scores[c, :count], ref_scores, rtol=1e-6, atol=0)
        # Beyond the kept ones: every other row in increasing order, with its original box.
        np.testing.assert_array_equal(order[c, k:], np.setdiff1d(np.arange(width), rows))
        np.testing.assert_array_equal(voted[c, k:], boxes[c, order[c, k:]])
        np.testing.assert_array_equal(final_scores[c, count:], scores[c, count:])


def assert_same_outputs(actual, expected):
    """Same kept rows in the same order; float outputs equal up to float rounding."""
    actual, expected = [np.asarray(o) for o in actual], [np.asarray(o) for o in expected]
    np.testing.assert_array_equal(actual[1], expected[1])
    for c, k in enumerate(expected[1]):
        np.testing.assert_array_equal(actual[0][c, :k], expected[0][c, :k])
        np.testing.assert_allclose(actual[2][c, :k], expected[2][c, :k], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(actual[3], expected[3], rtol=1e-6, atol=0)


def test_cases_drop_boxes_and_tie():
    # The cases exercise what they are meant to: drops (kept < count) and tied scores.
    kept_fewer = 0
    for (boxes, scores, sigmas, counts), settings in {**small_cases(), **large_cases()}.values():
        for c, count in enumerate(counts):
            rows, _, _ = kl_soft_reference(boxes[c, :count], scores[c, :count], sigmas[c, :count],
                                           **settings)
            kept_fewer += len(rows) < count
    assert kept_fewer >= 10
    assert len(np.unique(small_cases()['soft_vote_ties'][0][1][0])) < 6


# ---------------------------------------------------------------------------------------------
# Compiled CPU kernel
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name', list(small_cases()) + list(large_cases()))
def test_cpu_kernel_matches_kl_soft_transcription(name):
    inputs, settings = {**small_cases(), **large_cases()}[name]
    outputs = cython_nms.soft_nms_with_variance_voting(*inputs, **settings)
    assert_matches_reference(outputs, inputs, settings)


@pytest.mark.parametrize('hard', [False, True])
def test_threshold_set_by_hand(hard):
    name = 'thresholds_hard' if hard else 'thresholds_soft'
    (boxes, scores, sigmas, counts), settings = small_cases()[name]
    order, num_kept, voted, final = cython_nms.soft_nms_with_variance_voting(
        boxes, scores, sigmas, counts, **settings)
    # A first; B (IoU exactly 0.5) neither votes at vote_thresh 0.5 nor is zeroed at 0.5 in hard
    # mode, so A and B keep their boxes. C (IoU 0 with A and B) is never rescored until D is
    # selected; soft mode drops D instead, once B's decay takes it below 0.001.
    if hard:
        assert order[0].tolist() == [0, 1, 3, 2] and num_kept[0] == 3
        expected_final = [0.9, 0.8, 0.0005, 0.0010001]
    else:
        assert order[0].tolist() == [0, 1, 2, 3] and num_kept[0] == 3
        d_after_a = 0.0010001 * math.exp(-(1 / 199) ** 2 / 0.5)
        assert d_after_a > 0.001 > d_after_a * math.exp(-(10 / 290) ** 2 / 0.5)
        expected_final = [0.9, 0.8 * math.exp(-0.25 / 0.5), 0.0005,
                          d_after_a * math.exp(-(10 / 290) ** 2 / 0.5)]
    np.testing.assert_array_equal(voted[0, :2], boxes[0, :2])
    np.testing.assert_allclose(final[0], expected_final, rtol=1e-6)


def test_drops_swap_with_the_last_live_box_and_ties_follow_positions():
    # Selecting A zeroes rows 1 and 2 (hard NMS at 0.5). Scanning forward, row 1 is swapped with
    # the last live box (row 6), which is examined in its place; then row 2 with row 5. The
    # positions are now A, 6, 5, 3, 4, so the tied far boxes are selected in that order.
    (boxes, scores, sigmas, counts), settings = small_cases()['drop_swaps_then_ties']
    order, num_kept, voted, final = cython_nms.soft_nms_with_variance_voting(
        boxes, scores, sigmas, counts, **settings)
    assert order[0].tolist() == [0, 6, 5, 3, 4, 1, 2] and num_kept[0] == 5
    np.testing.assert_array_equal(final[0], np.array([0.9, 0, 0, 0.3, 0.3, 0.3, 0.3], F32))


def test_vote_by_hand():
    # A = [0, 0, 9, 9] (area 100), B = [1, 2, 11, 13] (area 132): IoU = 72 / 160 = 0.45, and
    # iou_sigma 0.55^2 gives B the vote weight exp(-(1 - 0.45)^2 / 0.3025) = e^-1. B's sigma of
    # 10 in column 2 divides its weight there by 100.
    boxes = np.array([[0, 0, 9, 9], [1, 2, 11, 13]], F32)
    sigmas = np.array([[1, 1, 1, 1], [1, 1, 10, 1]], F32)
    order, num_kept, voted, final = cython_nms.soft_nms_with_variance_voting(
        boxes, np.array([0.9, 0.8], F32), sigmas, None, vote_thresh=0.01, iou_sigma=0.3025)
    assert order.tolist() == [0, 1] and num_kept == 2
    p = np.array([math.exp(-1)] * 4)
    p[2] /= 100
    np.testing.assert_allclose(voted[0], (boxes[0] + p * boxes[1]) / (1 + p), rtol=1e-6)
    np.testing.assert_allclose(final, [0.9, 0.8 * math.exp(-0.45 ** 2 / 0.5)], rtol=1e-6)


def test_cpu_kernel_single_set_and_argument_errors():
    (boxes, scores, sigmas, counts), settings = small_cases()['soft_vote']
    one = cython_nms.soft_nms_with_variance_voting(boxes[0], scores[0], sigmas[0], None, **settings)
    batched = cython_nms.soft_nms_with_variance_voting(boxes[:1], scores[:1], sigmas[:1], None,
                                                       **settings)
    assert isinstance(one[1], int) and one[1] == batched[1][0]
    for single, in_batch in zip(one, batched):
        np.testing.assert_array_equal(single, in_batch[0])
    with pytest.raises(ValueError, match='counts'):
        cython_nms.soft_nms_with_variance_voting(boxes, scores, sigmas, counts + 100, **settings)
    with pytest.raises(ValueError, match='sigmas'):
        cython_nms.soft_nms_with_variance_voting(boxes, scores, sigmas[:, :-1], counts, **settings)


# ---------------------------------------------------------------------------------------------
# Compiled CPU kernel on sets stored one after another (the host path of box_results_with_nms_and_limit)
# ---------------------------------------------------------------------------------------------

def grouped(inputs):
    """The padded sets' rows stored one after another: dets (A, 5), sigmas (A, 4), counts."""
    boxes, scores, sigmas, counts = inputs
    dets = np.zeros((0, 5), F32)
    dets = np.concatenate([dets] + [np.hstack([boxes[c, :k], scores[c, :k, None]]) for c, k in enumerate(counts)])
    sigmas = np.concatenate([np.zeros((0, 4), F32)] + [sigmas[c, :k] for c, k in enumerate(counts)])
    return dets, sigmas, counts


def reference_after(inputs, settings):
    """Each set's rows as KL-Loss's soft leaves them (kept: voted box and final score, in selection
    order; then the other rows in increasing row order with their boxes and final scores), and
    the kept flags."""
    boxes, scores, sigmas, counts = inputs
    after, kept = [np.zeros((0, 5), F32)], [np.zeros(0, bool)]
    for c, count in enumerate(counts):
        rows, voted, final = kl_soft_reference(boxes[c, :count], scores[c, :count], sigmas[c, :count], **settings)
        others = np.setdiff1d(np.arange(count), rows)
        after += [np.hstack([voted, final[rows, None]]), np.hstack([boxes[c, others], final[others, None]])]
        kept += [np.ones(len(rows), bool), np.zeros(len(others), bool)]
    return np.concatenate(after), np.concatenate(kept)


def limited(after, kept, max_kept):
    """The kept rows that Detectron's per-image limit keeps: scores at least the max_kept-th best."""
    dets = after[kept]
    if len(dets) <= max_kept:
        return dets
    return dets[dets[:, 4] >= np.sort(dets[:, 4])[-max_kept]]


@pytest.mark.parametrize('name', list(small_cases()) + list(large_cases()))
def test_grouped_kernel_matches_kl_soft_transcription_and_padded_kernel(name):
    inputs, settings = {**small_cases(), **large_cases()}[name]
    after, kept = cython_nms.soft_nms_with_variance_voting_grouped(*grouped(inputs), **settings)
    expected_after, expected_kept = reference_after(inputs, settings)
    np.testing.assert_array_equal(kept, expected_kept)
    np.testing.assert_allclose(after, expected_after, rtol=1e-6, atol=1e-6)
    # The padded kernel's outputs, bit for bit.
    order, num_kept, voted, final = cython_nms.soft_nms_with_variance_voting(*inputs, **settings)
    padded = [np.hstack([voted[c, :k], final[c, order[c, :k], None]]) for c, k in enumerate(inputs[3])]
    np.testing.assert_array_equal(after, np.concatenate([np.zeros((0, 5), F32)] + padded))
    assert kept.sum() == num_kept.sum()


@pytest.mark.parametrize('max_kept', [1, 4, 15, 40])
@pytest.mark.parametrize('name', ['soft_vote_150', 'hard_vote_150_ties'])
def test_grouped_kernel_selects_what_the_per_image_limit_keeps(name, max_kept):
    inputs, settings = large_cases()[name]
    full = reference_after(inputs, settings)
    after, kept = cython_nms.soft_nms_with_variance_voting_grouped(*grouped(inputs), **settings, max_kept=max_kept)
    expected = limited(*full, max_kept)
    np.testing.assert_allclose(limited(after, kept, max_kept), expected, rtol=1e-6, atol=1e-6)
    # At least the limit's boxes are selected; below the 30 a full run keeps, fewer than those.
    assert len(expected) <= kept.sum() <= full[1].sum()
    assert full[1].sum() >= 30 and (max_kept >= 30 or kept.sum() < full[1].sum())
    # Each set's selections are the first ones of its full run.
    starts = np.cumsum(inputs[3]) - inputs[3]
    for first, count in zip(starts, inputs[3]):
        k = kept[first:first + count].sum()
        assert kept[first:first + count].tolist() == [True] * k + [False] * (count - k)
        np.testing.assert_allclose(after[first:first + k], full[0][first:first + k], rtol=1e-6, atol=1e-6)


def test_grouped_kernel_runs_every_set_to_its_end_with_non_finite_scores():
    inputs, settings = large_cases()['soft_vote_150']
    dets, sigmas, counts = grouped(inputs)
    dets[3, 4] = np.nan  # selected scores may then increase: no early stop
    after, kept = cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts, **settings, max_kept=4)
    full_after, full_kept = cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts, **settings)
    np.testing.assert_array_equal(kept, full_kept)
    np.testing.assert_array_equal(after, full_after)


def test_grouped_kernel_argument_errors():
    dets, sigmas, counts = grouped(small_cases()['soft_vote'][0])
    with pytest.raises(ValueError, match='add up'):
        cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts + 1, **kl_settings())
    with pytest.raises(ValueError, match='sigmas'):
        cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas[:, :3], counts, **kl_settings())


@pytest.mark.parametrize('max_kept', [0, 30, 400])
@pytest.mark.parametrize('ties', [False, True])
def test_grouped_kernel_on_two_workers_keeps_what_one_keeps(max_kept, ties):
    # Three sets of at least 512 rows (the size from which a second worker steps) and a small one.
    dets, sigmas, counts = grouped(clustered_sets(20 + ties, 700, [700, 650, 600, 100], ties=ties))
    settings = kl_settings(hard_nms_thresh=0.5) if ties else kl_settings(iou_sigma=0.01)
    one_stats = []
    after, kept = cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts, **settings,
                                                                   max_kept=max_kept, stats=one_stats)
    assert one_stats == [kept.sum()]
    assert max_kept == 0 or kept.sum() < 0.5 * len(kept)  # the limit stops the stepping early
    for _ in range(10):
        stats = []
        after2, kept2 = cython_nms.soft_nms_with_variance_voting_grouped(
            dets, sigmas, counts, **settings, max_kept=max_kept, workers=2, stats=stats)
        np.testing.assert_array_equal(kept2, kept)
        np.testing.assert_array_equal(after2[kept2], after[kept])
        if max_kept == 0:
            np.testing.assert_array_equal(after2, after)
            assert sum(stats) == kept.sum()
        else:
            assert sum(stats) >= kept.sum()


@pytest.mark.skipif(not cython_nms.OPENMP, reason='the module was built without OpenMP: one worker steps')
def test_grouped_kernel_second_worker_takes_a_share():
    # A call lasts a fraction of a millisecond, so on a loaded machine the second thread may wake
    # after the first has stepped every set: repeat until it has stepped at least once.
    dets, sigmas, counts = grouped(clustered_sets(20, 700, [700, 650, 600, 100]))
    settings = kl_settings(iou_sigma=0.01)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = []
        cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts, **settings, workers=2,
                                                         stats=stats)
        assert len(stats) == 2
        if stats[1] > 0:
            return
    pytest.fail('the second worker made no selection in 20 s of repeated calls')


@pytest.mark.parametrize('workers', [1, 2])
@pytest.mark.parametrize('max_kept', [0, 40])
def test_grouped_kernel_returns_the_kept_rows_alone_with_their_sets(max_kept, workers):
    dets, sigmas, counts = grouped(clustered_sets(22, 600, [600, 0, 550, 130]))
    settings = kl_settings(iou_sigma=0.01)
    after, kept = cython_nms.soft_nms_with_variance_voting_grouped(dets, sigmas, counts, **settings,
                                                                   max_kept=max_kept)
    kept_dets, kept_sets = cython_nms.soft_nms_with_variance_voting_grouped(
        dets, sigmas, counts, **settings, max_kept=max_kept, workers=workers, kept_only=True)
    np.testing.assert_array_equal(kept_dets, after[kept])
    row_sets = np.repeat(np.arange(len(counts)), counts)
    np.testing.assert_array_equal(kept_sets, row_sets[kept])
    assert set(kept_sets.tolist()) == {0, 2, 3}


def test_grouped_kernel_takes_one_worker_for_small_sets():
    inputs, settings = large_cases()['soft_vote_150']  # sets of 150 and 120 rows
    stats = []
    cython_nms.soft_nms_with_variance_voting_grouped(*grouped(inputs), **settings, workers=2, stats=stats)
    assert len(stats) == 1


@pytest.mark.skipif(sys.platform != 'linux', reason='OpenMP is probed with the C compiler on Linux')
def test_nms_kernels_are_built_with_openmp_on_linux():
    assert cython_nms.OPENMP, ('cython_nms was built without OpenMP: setup.py found no C compiler that '
                               'builds an OpenMP program (gcc with libgomp), so variance voting uses one thread')


# ---------------------------------------------------------------------------------------------
# The dispatcher
# ---------------------------------------------------------------------------------------------

def test_dispatcher_on_cpu_tensors_uses_the_compiled_kernel():
    inputs, settings = large_cases()['soft_vote_150']
    outputs = variance_voting.soft_nms_with_variance_voting(*as_tensors(inputs), **settings)
    assert all(isinstance(o, torch.Tensor) and o.device.type == 'cpu' for o in outputs)
    assert [o.dtype for o in outputs] == [torch.int64, torch.int64, torch.float32, torch.float32]
    expected_outputs = cython_nms.soft_nms_with_variance_voting(*inputs, **settings)
    for actual, expected in zip(outputs, expected_outputs):
        np.testing.assert_array_equal(actual.numpy(), expected)


def test_triton_kernel_refuses_sets_wider_than_its_limit(monkeypatch):
    monkeypatch.setattr(variance_voting, 'MAX_TRITON_SET_SIZE', 8)
    inputs, settings = small_cases()['soft_vote']
    with pytest.raises(ValueError, match='at most 8 boxes'):
        variance_voting.soft_nms_with_variance_voting_triton(*as_tensors(inputs), **settings)


# ---------------------------------------------------------------------------------------------
# Triton kernel, compiled on a CUDA machine, else run by Triton's interpreter (TRITON_INTERPRET=1
# must be set before triton is imported, hence the subprocess)
# ---------------------------------------------------------------------------------------------

_TRITON_SCRIPT = '''
import json, sys
import numpy as np
import torch
from detectron.ops import variance_voting
settings = json.loads(sys.argv[2])
device = 'cuda' if torch.cuda.is_available() else 'cpu'  # the compiled kernel, else the interpreter
results = {}
with np.load(sys.argv[1]) as inputs:
    for name in settings:
        tensors = [torch.from_numpy(inputs[f'{name}/{i}']).to(device) for i in range(4)]
        if name.endswith('/turns'):  # one set per turn of pair weights
            variance_voting.PAIR_WEIGHTS_BUDGET_BYTES = 1
        outputs = variance_voting.soft_nms_with_variance_voting_triton(*tensors, **settings[name])
        for key, value in zip(('order', 'num_kept', 'voted', 'final'), outputs):
            results[f'{name}/{key}'] = value.cpu().numpy()
np.savez(sys.argv[3], **results)
'''


@pytest.fixture(scope='module')
def triton_results(tmp_path_factory):
    """Outputs of the Triton kernel on every small case (and on 'soft_vote' with one set per
    turn), computed by a subprocess: compiled on a CUDA machine, under Triton's interpreter elsewhere."""
    cases = {**small_cases(), 'soft_vote/turns': small_cases()['soft_vote']}
    folder = tmp_path_factory.mktemp('triton')
    inputs_path, results_path = str(folder / 'inputs.npz'), str(folder / 'results.npz')
    np.savez(inputs_path, **{f'{name}/{i}': array for name, (inputs, _) in cases.items()
                             for i, array in enumerate(inputs)})
    settings = json.dumps({name: case_settings for name, (_, case_settings) in cases.items()})
    run_kernel_script(_TRITON_SCRIPT, inputs_path, settings, results_path,
                      skip_reason='triton is not installed: the Triton kernel cannot run (the CPU kernel, its '
                                  'fallback, is tested above)')
    with np.load(results_path) as results:
        return {key: results[key] for key in results.files}


def _triton_outputs(results, name):
    return [results[f'{name}/{key}'] for key in ('order', 'num_kept', 'voted', 'final')]


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', list(small_cases()))
def test_triton_kernel_matches_kl_soft_and_cpu_kernel(triton_results, name):
    inputs, settings = small_cases()[name]
    outputs = _triton_outputs(triton_results, name)
    assert_matches_reference(outputs, inputs, settings)
    cpu = cython_nms.soft_nms_with_variance_voting(*inputs, **settings)
    for actual, expected in zip(outputs, cpu):
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.processes
@pytest.mark.cuda
def test_triton_kernel_in_turns_of_sets(triton_results):
    for actual, expected in zip(_triton_outputs(triton_results, 'soft_vote/turns'),
                                _triton_outputs(triton_results, 'soft_vote')):
        np.testing.assert_array_equal(actual, expected)
