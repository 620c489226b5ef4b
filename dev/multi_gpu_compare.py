"""Comparisons behind dev/gpu_checks.sh's multi_gpu step; each prints one `PASS <label>: ...` or
`FAIL <label>: ...` line and exits 0 either way (the script goes on to its next check).

  python dev/multi_gpu_compare.py weights <run.pth> <reference.pth> <tolerance> <label>
      the relative update difference of two trainings from the same initial weights (below) is at
      most tolerance
  python dev/multi_gpu_compare.py weights-apart <run.pth> <reference.pth> <tolerance> <label>
      ... is above tolerance (the control: the tolerance rejects a run that trained differently)
  python dev/multi_gpu_compare.py detections <detections.pkl> <reference detections.pkl> <label>
      all_boxes bitwise identical (same images, classes, boxes and scores)
  python dev/multi_gpu_compare.py log <train log> <pattern> <label>
      a line of the log matches the regular expression

Relative update difference = ||w_run - w_ref|| / ||w_ref - w_init|| over all floating-point model
tensors: how far apart the two runs ended, as a fraction of how far training moved the reference.
w_init is rebuilt from the config saved in the checkpoint, as train_worker builds it (torch seeded
with RNG_SEED, the model created on the CPU; no TRAIN.WEIGHTS). docs/MULTI_GPU.md ("Checks on a GPU")
justifies the tolerance the script passes.
"""
import math
import re
import sys

import numpy as np
import torch

from detectron.checkpoint.torch_file import read_torch_file
from detectron.core.config import adopt_cfg, cfg, load_cfg
from detectron.core.config_defaults import CfgNode
from detectron.modeling import model_builder
from detectron.utils.io import load_object


def relative_update_difference(run, reference, initial):
    """||run - reference|| / ||reference - initial|| over the floating tensors of three state dicts."""
    if set(run) != set(reference):
        raise ValueError(f'the two models have different tensors: {sorted(set(run) ^ set(reference))}')
    apart = moved = 0.0
    for key, ref in reference.items():
        if not ref.is_floating_point():
            continue
        ref = ref.double()
        apart += float(((run[key].double() - ref) ** 2).sum())
        moved += float(((ref - initial[key].double()) ** 2).sum())
    if moved == 0.0:
        raise ValueError('the reference did not move from the initial weights')
    return math.sqrt(apart) / math.sqrt(moved)


def detections_difference(boxes, reference):
    """(identical, number of detections, largest absolute difference) of two all_boxes[class][image]."""
    shapes_equal = len(boxes) == len(reference) and all(
        len(a) == len(b) and all(np.shape(x) == np.shape(y) for x, y in zip(a, b))
        for a, b in zip(boxes, reference))
    count = sum(len(d) for per_class in reference for d in per_class)
    if not shapes_equal:
        return False, count, math.inf
    largest = max((float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
                   for a, b in zip(boxes, reference) for x, y in zip(a, b) if len(x)), default=0.0)
    return largest == 0.0, count, largest


def initial_model_state(checkpoint):
    """The weights train_worker started from, rebuilt from the config stored in the checkpoint."""
    adopt_cfg(CfgNode(load_cfg(checkpoint['extra']['cfg'])))
    torch.manual_seed(cfg.RNG_SEED)
    return model_builder.create(cfg).state_dict()


def _verdict(passed, label, detail):
    print('{} {}: {}'.format('PASS' if passed else 'FAIL', label, detail))


def compare_weights(run_path, reference_path, tolerance, label, apart=False):
    run, reference = read_torch_file(run_path), read_torch_file(reference_path)
    difference = relative_update_difference(run['model'], reference['model'], initial_model_state(reference))
    _verdict((difference > tolerance) if apart else (difference <= tolerance), label,
             f'relative update difference {difference:.4g} (tolerance {tolerance:g})')


def compare_detections(path, reference_path, label):
    identical, count, largest = detections_difference(load_object(path)['all_boxes'],
                                                      load_object(reference_path)['all_boxes'])
    _verdict(identical, label, f'{count} detections, largest difference {largest:.3g}')


def find_in_log(path, pattern, label):
    with open(path, errors='replace') as f:
        found = next((line.strip() for line in f if re.search(pattern, line)), None)
    _verdict(found is not None, label, found or f'no line matches {pattern!r} in {path}')


def main(argv):
    try:
        if argv[0] in ('weights', 'weights-apart'):
            compare_weights(argv[1], argv[2], float(argv[3]), argv[4], apart=argv[0] == 'weights-apart')
        elif argv[0] == 'detections':
            compare_detections(argv[1], argv[2], argv[3])
        elif argv[0] == 'log':
            find_in_log(argv[1], argv[2], argv[3])
        else:
            raise SystemExit(__doc__)
    except (OSError, ValueError, KeyError) as err:  # a run that left no file fails its check, not the script
        _verdict(False, argv[-1], f'{type(err).__name__}: {err}')


if __name__ == '__main__':
    main(sys.argv[1:])
