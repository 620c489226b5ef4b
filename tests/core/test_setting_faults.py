"""Settings and files that used to end in a traceback, a silent no-op or a runaway launch: CenterNet's
NUM_GPUS 0, fractional CHUNK_SIZES, NUM_EPOCHS 0 and MODEL.MASK_ON; convert_pkl_to_pth into a missing
folder; NUM_GPUS 1000 on a CPU; a pre-1.6 (non-zip) torchvision .pth as R-CNN weights."""
import importlib.util
import os

import pytest
import torch
import torchvision
from support.tiny_runs import REPO, use_centernet, use_tiny_config, write_tiny_datasets

from detectron.checkpoint.c2_weights import load_weights, state_dict_to_detectron_blobs
from detectron.core import launch
from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigValueError, LaunchError, OutputDirError
from detectron.utils.io import save_object


# The engines register DATASET_CATALOG in this process: keep that out of other tests.
pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def catalog(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('settings'))


@pytest.mark.parametrize('overrides, message', [
    (['NUM_GPUS', '0'], 'NUM_GPUS must be at least 1, got 0'),
    (['NUM_GPUS', '2', 'CENTERNET.CHUNK_SIZES', '(2.5, 1.5)'],
     'CENTERNET.CHUNK_SIZES must hold whole numbers of images per GPU, got (2.5, 1.5)'),
    (['CENTERNET.NUM_EPOCHS', '0'], 'CENTERNET.NUM_EPOCHS must be at least 1, got 0'),
    (['MODEL.MASK_ON', 'True'], "MODEL.MASK_ON True asks for Mask R-CNN's mask head, which CenterNet (ctdet) does "
                                'not have: set MODEL.MASK_ON False, or MODEL.TYPE generalized_rcnn for masks'),
])
def test_centernet_settings_it_cannot_run_are_one_line(catalog, tmp_path, overrides, message):
    with pytest.raises(ConfigValueError) as err:
        use_centernet(catalog, tmp_path, *overrides)
    assert str(err.value) == message


def test_rcnn_refuses_several_test_images_per_detector_call(catalog, tmp_path):
    with pytest.raises(ConfigValueError) as err:
        use_tiny_config(catalog, tmp_path, 'TEST.IMS_PER_BATCH', '2')
    assert str(err.value) == ('TEST.IMS_PER_BATCH 2 asks R-CNN to detect on several images per call; it tests one '
                              'image at a time, as Detectron: set it to 1')


def test_converting_into_a_missing_folder_is_one_line(tmp_path):
    spec = importlib.util.spec_from_file_location('convert', os.path.join(REPO, 'tools', 'convert_pkl_to_pth.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    pkl = tmp_path / 'R-18.pkl'
    save_object({'blobs': state_dict_to_detectron_blobs({'conv_body.body.conv1.weight': torch.ones(4, 3, 7, 7)})},
                str(pkl))
    target = tmp_path / 'missing' / 'R-18.pth'
    with pytest.raises(OutputDirError) as err:
        tool.main([str(pkl), str(target)])
    assert str(err.value) == 'could not write {} (No such file or directory); check the disk and the directory'.format(
        target)
    tool.main([str(pkl), str(tmp_path / 'R-18.pth')])
    assert sorted(os.listdir(tmp_path)) == ['R-18.pkl', 'R-18.pth']


@pytest.mark.processes
def test_more_cpu_processes_than_cores_are_refused_before_any_starts(monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
    started = []
    monkeypatch.setattr(launch, '_spawn_and_watch', lambda *args: started.append(args))
    with pytest.raises(LaunchError) as err:
        launch.launch(print, 1000, device='cpu')
    assert str(err.value) == ('NUM_GPUS 1000 without GPUs starts 1000 CPU processes but this machine gives 2 CPU '
                              'cores; ask for at most NUM_GPUS 2, or run on GPUs')
    launch.launch(print, 2, device='cpu')
    assert len(started) == 1  # as many processes as cores start


def test_a_pre_1_6_torchvision_file_loads_into_the_r_cnn_body(catalog, tmp_path):
    use_tiny_config(catalog, tmp_path)
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18().state_dict()
    path = str(tmp_path / 'resnet18-5c106cde.pth')
    torch.save(resnet, path, _use_new_zipfile_serialization=False)
    with open(path, 'rb') as f:
        assert not f.read(4).startswith(b'PK')  # the old format, not a zip archive
    model = model_builder.create(cfg)
    missing, unused = load_weights(model, path)
    assert unused == ['fc.bias', 'fc.weight']
    assert not any(key.startswith('conv_body.body.res') for key in missing)
    conv = model.conv_body.body.res2[0].branch2a.weight
    assert torch.equal(conv, resnet['layer1.0.conv1.weight'])
