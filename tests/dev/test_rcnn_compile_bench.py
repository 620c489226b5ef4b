"""dev/rcnn_compile_bench.py on the CPU with the tiny R-CNN: the compiled body + heads (aot_eager
backend: the same graphs without code generation) give the eager detector's detections, the heads
padded to their fixed row count; the script prints its table."""
import importlib.util
import os

import pytest
import torch

from detectron.core import export
from detectron.core.config import cfg
from detectron.modeling import model_builder
from support.tiny_runs import MASK_OVERRIDES, REPO, SHAPES_CFG, TINY_OVERRIDES, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


def _bench():
    spec = importlib.util.spec_from_file_location('rcnn_compile_bench', os.path.join(REPO, 'dev', 'rcnn_compile_bench.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_padded_rows_equal_the_head_on_the_real_rows():
    head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5))
    padded = _bench().PaddedRows(head, 8, 'aot_eager')
    x = torch.randn(3, 3, 2, 2)
    torch.testing.assert_close(padded(x), head(x))
    assert padded(torch.randn(9, 3, 2, 2)).shape == (9, 5)  # past the fixed rows: the head itself


@pytest.mark.parametrize('mask', [False, True], ids=['kl_rcnn', 'mask_rcnn'])
def test_compiled_detector_equals_the_eager_one(tiny_catalog, tmp_path, restore_global_cfg, capsys, mask):
    overrides = TINY_OVERRIDES + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(tmp_path)]
    overrides += list(MASK_OVERRIDES) if mask else ['PRED_STD', 'True', 'XYXY', 'True', 'STD_NMS', 'True']
    use_tiny_config(tiny_catalog, tmp_path, *overrides[len(TINY_OVERRIDES) + 4:])
    torch.manual_seed(0)
    weights = tmp_path / 'random.pth'
    torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    restore_global_cfg()
    cfg.defrost()
    comparison = _bench().main(['--cfg', SHAPES_CFG, '--wts', str(weights), '--device', 'cpu', '--size', '64', '96',
                                '--images', '2', '--rounds', '1', '--backend', 'aot_eager'] + overrides)
    assert comparison.matched > 0 and not comparison.unmatched
    assert comparison.max_score_diff <= export.SCORE_TOL and comparison.max_box_diff <= 1e-3
    printed = capsys.readouterr().out
    assert '| detector, compiled body + heads |' in printed and 'first compiled image' in printed
