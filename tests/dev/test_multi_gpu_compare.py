"""dev/multi_gpu_compare.py, the comparisons of dev/gpu_checks.sh's multi_gpu step, on the CPU."""
import importlib.util
import math
import os

import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from detectron.utils.io import save_object

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location('multi_gpu_compare', os.path.join(REPO, 'dev', 'multi_gpu_compare.py'))
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def test_relative_update_difference_by_hand():
    initial = {'w': torch.tensor([1.0, 1.0]), 'b': torch.tensor([2.0]), 'steps': torch.tensor(0)}
    reference = {'w': torch.tensor([4.0, 1.0]), 'b': torch.tensor([6.0]), 'steps': torch.tensor(50)}
    run = {'w': torch.tensor([4.0, 1.5]), 'b': torch.tensor([6.0]), 'steps': torch.tensor(7)}
    # moved: sqrt(3^2 + 4^2) = 5; apart: 0.5 (the integer counter is not a weight)
    assert compare.relative_update_difference(run, reference, initial) == pytest.approx(0.1, abs=1e-12)
    assert compare.relative_update_difference(reference, reference, initial) == 0.0
    with pytest.raises(ValueError, match=r"different tensors: \['extra'\]"):
        compare.relative_update_difference(dict(run, extra=torch.zeros(1)), reference, initial)
    with pytest.raises(ValueError, match='did not move'):
        compare.relative_update_difference(run, initial, initial)


def _all_boxes():
    # 2 classes (background empty) x 2 images: rows of x1, y1, x2, y2, score
    dets = np.array([[1.0, 2.0, 30.0, 40.0, 0.9], [5.0, 5.0, 9.0, 9.0, 0.3]], np.float32)
    return [[[], []], [dets, dets[:1].copy()]]


def test_detections_difference_is_exact():
    assert compare.detections_difference(_all_boxes(), _all_boxes()) == (True, 3, 0.0)
    changed = _all_boxes()
    changed[1][1][0, 4] += 0.25
    assert compare.detections_difference(changed, _all_boxes()) == (False, 3, 0.25)
    fewer = _all_boxes()
    fewer[1][0] = fewer[1][0][:1]
    assert compare.detections_difference(fewer, _all_boxes()) == (False, 3, math.inf)


def test_the_command_prints_one_pass_or_fail_line(tmp_path, capsys):
    save_object({'all_boxes': _all_boxes()}, str(tmp_path / 'a.pkl'))
    changed = _all_boxes()
    changed[1][0][1, 0] = 6.0
    save_object({'all_boxes': changed}, str(tmp_path / 'b.pkl'))
    (tmp_path / 'train.log').write_text('INFO a\nINFO Parameters after iteration 49 are bitwise equal on all 2 ranks\n')
    compare.main(['detections', str(tmp_path / 'a.pkl'), str(tmp_path / 'a.pkl'), 'same'])
    compare.main(['detections', str(tmp_path / 'b.pkl'), str(tmp_path / 'a.pkl'), 'changed'])
    compare.main(['log', str(tmp_path / 'train.log'), r'bitwise equal on all 2 ranks', 'ranks equal'])
    compare.main(['log', str(tmp_path / 'train.log'), r'differ from rank 0', 'ranks differ'])
    compare.main(['weights', str(tmp_path / 'missing.pth'), str(tmp_path / 'missing.pth'), '0.1', 'no run'])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        'PASS same: 3 detections, largest difference 0',
        'FAIL changed: 3 detections, largest difference 1',
        'PASS ranks equal: INFO Parameters after iteration 49 are bitwise equal on all 2 ranks',
        "FAIL ranks differ: no line matches 'differ from rank 0' in {}".format(tmp_path / 'train.log'),
    ]
    assert lines[4].startswith('FAIL no run: WeightsError: ') and len(lines) == 5


def test_weights_are_compared_as_updates_from_the_rebuilt_initial_weights(tmp_path, capsys):
    finalize_cfg('configs/getting_started/shapes_demo_R-18-FPN.yaml', ['RNG_SEED', '7'])
    torch.manual_seed(7)
    initial = model_builder.create(cfg).state_dict()
    floating = {k for k, v in initial.items() if v.is_floating_point()}
    # the reference moved every weight by 1, the run by 1.05: 5 % of the update apart
    for name, step in (('reference', 1.0), ('run', 1.05)):
        model = {k: v + step if k in floating else v for k, v in initial.items()}
        torch.save({'model': model, 'extra': {'cfg': cfg.dump()}}, tmp_path / f'{name}.pth')
    run, reference = str(tmp_path / 'run.pth'), str(tmp_path / 'reference.pth')
    compare.main(['weights', run, reference, '0.06', 'within'])
    compare.main(['weights', run, reference, '0.04', 'beyond'])
    compare.main(['weights-apart', run, reference, '0.04', 'control'])
    assert capsys.readouterr().out.splitlines() == [
        'PASS within: relative update difference 0.05 (tolerance 0.06)',
        'FAIL beyond: relative update difference 0.05 (tolerance 0.04)',
        'PASS control: relative update difference 0.05 (tolerance 0.04)',
    ]
