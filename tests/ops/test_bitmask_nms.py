"""The Triton bitmask NMS (compiled on a CUDA machine, else run by Triton's interpreter in a
subprocess) against Detectron's Cython NMS run group by group."""

import numpy as np
import pytest
import torch
from triton_subprocess import run_kernel_script

from detectron.ops import bitmask_nms
from detectron.ops import nms as nms_ops

F32 = np.float32


def random_case(seed, n, groups):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 300, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0, 120, (n, 2))], axis=1).astype(F32)
    scores = (rng.permutation(n) / n).astype(F32)
    return boxes, scores, rng.integers(0, groups, n), 0.3 if seed % 2 else 0.7


def tie_case():
    # Equal scores: Detectron's scores.argsort()[::-1] (a stable sort at this size) takes the later
    # box first, which then suppresses the earlier equal ones.
    boxes = np.array([[10, 10, 109, 109], [12, 12, 111, 111], [11, 11, 110, 110], [300, 300, 320, 320]], F32)
    return boxes, np.array([0.6, 0.6, 0.6, 0.9], F32), np.array([0, 0, 0, 0]), 0.3


def chain_case(n=150):
    # Each box 2 px right of the one before: neighbours overlap at IoU 80/120 > 0.5, every second box
    # at 60/140 < 0.5: greedy NMS keeps 0, 2, 4, ... through a chain longer than two 64-box blocks.
    x = np.arange(n, dtype=F32) * 2
    boxes = np.stack([x, np.zeros(n), x + 9, np.full(n, 9)], axis=1).astype(F32)
    return boxes, (1 - np.arange(n) / 1000).astype(F32), np.zeros(n, dtype=np.int64), 0.5


def threshold_case():
    # (x2 - x1) + 1 sides give this pair an IoU of exactly 0.5 in float32: suppressed at 0.5 (>=).
    boxes = np.array([[331.2877, 17.7891, 448.5728, 127.5382], [370.7161, 17.7891, 488.0011, 127.5382]], F32)
    return boxes, np.array([0.9, 0.8], F32), np.array([0, 0]), 0.5


CASES = {'random': random_case(0, 700, 6), 'random/0.3': random_case(1, 500, 3), 'ties': tie_case(),
         'chain': chain_case(), 'threshold': threshold_case()}

_SCRIPT = '''
import sys
import numpy as np
import torch
from detectron.ops import nms as nms_ops
device = 'cuda' if torch.cuda.is_available() else 'cpu'
results = {}
with np.load(sys.argv[1]) as inputs:
    for name in sorted({key.split(':')[0] for key in inputs.files}):
        boxes, scores, idxs = (torch.from_numpy(inputs[name + ':' + part]).to(device) for part in ('boxes', 'scores', 'idxs'))
        thresh = float(inputs[name + ':thresh'])
        # batched_nms_t's steps on CUDA, its kernel choice fixed to the bitmask kernels (which it
        # takes on CUDA with Triton; under Triton's interpreter on the CPU it would take Cython's).
        slots, counts = nms_ops._grouped_by_score(scores, idxs)
        keep = nms_ops._bitmask_keep(boxes, slots, counts, nms_ops.torchvision_nms_thresh(thresh))
        kept = nms_ops._kept_in_score_order(slots, keep, scores)
        if device == 'cuda':
            assert torch.equal(kept, nms_ops.batched_nms_t(boxes, scores, idxs, thresh))
        results[name] = kept.cpu().numpy()
np.savez(sys.argv[2], **results)
'''


@pytest.fixture(scope='module')
def kernel_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp('bitmask_nms')
    inputs_path, results_path = str(folder / 'inputs.npz'), str(folder / 'results.npz')
    np.savez(inputs_path, **{f'{name}:{part}': value for name, case in CASES.items()
                             for part, value in zip(('boxes', 'scores', 'idxs', 'thresh'), case)})
    run_kernel_script(_SCRIPT, inputs_path, results_path,
                      skip_reason='triton is not installed: the bitmask kernels cannot run (the other NMS paths serve)')
    with np.load(results_path) as results:
        return {key: results[key] for key in results.files}


def detectron_kept(boxes, scores, idxs, thresh):
    """Cython NMS of each group, the kept indices by descending score, of equal scores the later first."""
    dets = np.concatenate([boxes, scores[:, None]], axis=1).astype(F32)
    kept = np.concatenate([np.flatnonzero(idxs == g)[nms_ops.nms(dets[idxs == g], thresh)] for g in np.unique(idxs)])
    kept = np.sort(kept)
    order = np.argsort(scores[kept], kind='stable')[::-1]
    return kept[order]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.parametrize('name', list(CASES))
def test_bitmask_nms_keeps_detectrons_boxes_in_its_order(kernel_results, name):
    np.testing.assert_array_equal(kernel_results[name], detectron_kept(*CASES[name]))


@pytest.mark.processes
@pytest.mark.cuda
def test_the_chain_and_threshold_cases_say_what_they_test(kernel_results):
    assert kernel_results['chain'].tolist() == list(range(0, 150, 2))
    assert kernel_results['threshold'].tolist() == [0]
    assert kernel_results['ties'].tolist() == [3, 2]
    assert 1 < len(kernel_results['random']) < 700  # some suppressed, some kept


def test_groups_beyond_the_scan_block_are_refused():
    boxes = torch.zeros(1, bitmask_nms.MAX_GROUP_SIZE + 1, 4)
    with pytest.raises(ValueError, match='at most 4096 boxes a group'):
        bitmask_nms.greedy_keep(boxes, torch.tensor([boxes.shape[1]]), 0.5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or bitmask_nms.triton is None, reason='needs CUDA and triton')
def test_batched_nms_t_on_cuda_runs_the_kernels_for_a_training_batchs_groups(monkeypatch):
    calls = []
    greedy_keep = bitmask_nms.greedy_keep
    monkeypatch.setattr(bitmask_nms, 'greedy_keep', lambda *args: calls.append(args[0].shape) or greedy_keep(*args))
    boxes, scores, idxs, thresh = random_case(4, 20000, 80)  # 80 groups: torchvision would loop over them
    got = nms_ops.batched_nms_t(*(torch.from_numpy(a).cuda() for a in (boxes, scores, idxs)), thresh)
    assert len(calls) == 1 and calls[0][0] == 80
    np.testing.assert_array_equal(got.cpu().numpy(), detectron_kept(boxes, scores, idxs, thresh))
