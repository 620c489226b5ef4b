"""tools/export_model.py as a user runs it: export, --verify on images or a dataset, the exit status."""
import cv2
import numpy as np
import pytest
import torch

from detectron.core import export
from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import SHAPES_CFG, TINY_OVERRIDES, use_tiny_config
from support.tools import load_tool

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture
def tiny_rcnn(tiny_catalog, tmp_path, restore_global_cfg):
    """(weights file, overrides) of a random-weight tiny R-CNN, and a folder of two images."""
    pytest.importorskip('onnxruntime', reason="onnxruntime is absent: pip install -e '.[export]'")
    overrides = TINY_OVERRIDES + ['DATASET_CATALOG', str(tiny_catalog), 'OUTPUT_DIR', str(tmp_path / 'out')]
    use_tiny_config(tiny_catalog, tmp_path / 'out')
    torch.manual_seed(0)
    weights = tmp_path / 'random.pth'
    torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    restore_global_cfg()  # the tool finishes its own cfg
    folder = tmp_path / 'images'
    folder.mkdir()
    for i, shape in enumerate([(64, 96, 3), (90, 70, 3)]):
        cv2.imwrite(str(folder / '{}.png'.format(i)), np.random.RandomState(i).randint(0, 256, shape).astype(np.uint8))
    return weights, overrides, folder


def _main(weights, overrides, tmp_path, *args):
    cfg.defrost()
    load_tool('export_model.py').main(['--cfg', SHAPES_CFG, '--wts', str(weights), '--output',
                                       str(tmp_path / 'model.onnx'), *args] + overrides)


def _printed(capfd):
    out, err = capfd.readouterr()
    return out + err


def test_verify_on_images_passes_and_fails_past_the_tolerance(tiny_rcnn, tmp_path, capfd, monkeypatch):
    weights, overrides, folder = tiny_rcnn
    _main(weights, overrides, tmp_path, '--verify', str(folder))
    assert (tmp_path / 'model.onnx').stat().st_size > 0
    printed = _printed(capfd)
    assert 'verify: PASSED' in printed and 'largest box difference' in printed
    # The same differences (about 1e-5 px) past a tolerance of 1e-9 px: exit status 1.
    monkeypatch.setattr(export, 'BOX_TOL', 1e-9)
    with pytest.raises(SystemExit) as exit_info:
        _main(weights, overrides, tmp_path, '--verify', str(folder / '0.png'))
    assert exit_info.value.code == 1
    assert 'verify: FAILED: largest box difference' in _printed(capfd)


def test_verify_on_a_dataset_prints_both_aps(tiny_rcnn, tmp_path, capfd):
    weights, overrides, _ = tiny_rcnn
    _main(weights, overrides, tmp_path, '--verify', 'tiny_val')
    printed = _printed(capfd)
    aps = [line for line in printed.splitlines() if 'verify: box AP pytorch' in line]
    assert len(aps) == 1
    pytorch_ap, onnx_ap = (float(word.rstrip(',')) for word in aps[0].split()[-3::2])
    assert pytorch_ap == pytest.approx(onnx_ap, abs=5e-4)
    assert 'verify: PASSED' in printed


def test_verify_a_torch_export_program_at_its_traced_size(tiny_rcnn, tmp_path, capfd):
    """--verify runs a torch.export program too; traced on the first --verify image, it refuses an
    image of another size with one line."""
    weights, overrides, folder = tiny_rcnn
    _main(weights, overrides, tmp_path, '--format', 'exported_program', '--verify', str(folder / '0.png'))
    printed = _printed(capfd)
    assert 'verify: PASSED' in printed and 'verify: 0 detections' not in printed
    model_type = model_builder.build_model_type(cfg)  # the tool's config
    detect = export.program_detector(model_type.exporter(model_builder.checked_model(model_type).eval()),
                                     str(tmp_path / 'model.onnx'))  # the program, named as _main names it
    with pytest.raises(ConfigValueError, match=r'takes inputs of shapes \[\(1, 3, 64, 96\)'):
        detect(model_type.test_inputs()(cv2.imread(str(folder / '1.png'))))  # 90 x 70


def test_a_cuda_export_needs_torch_export(tiny_rcnn, tmp_path, capfd):
    weights, overrides, _ = tiny_rcnn
    with pytest.raises(SystemExit) as exit_info:
        _main(weights, overrides, tmp_path, '--device', 'cuda')
    assert exit_info.value.code == 2
    assert '--device cuda exports with torch.export' in _printed(capfd)
