"""Out of device memory in training or testing (a simulated torch.OutOfMemoryError on the CPU): one
`error:` line with the iteration or image, the rank, the device's memory and the settings that lower
memory for the model type; the checkpoints already written stay intact."""
import itertools
import types

import pytest
import torch

from detectron.checkpoint import checkpointer
from detectron.core import test_engine, train_engine
from detectron.core.config import cfg, merge_cfg_from_list
from detectron.modeling import fast_rcnn_heads, model_builder
from detectron.modeling.rcnn_builder import GeneralizedRCNNType
from detectron.utils.errors import DeviceOutOfMemory, run_tool
from detectron.utils.memory import describe_device_memory
from support.out_of_memory import out_of_memory_from_call
from support.tiny_runs import TRAIN_SUBDIR, use_tiny_config

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')

RCNN_TRAINING = ('lower TRAIN.IMS_PER_BATCH 2, raising SOLVER.ITER_SIZE 1 by the same factor (the same images per '
                 'iteration); TRAIN.CHECKPOINT_ACTIVATIONS True (recompute backbone activations in the backward); '
                 'lower TRAIN.BATCH_SIZE_PER_IM 32 (RoIs per image)')


def test_training_out_of_memory_is_one_error_line_and_keeps_the_checkpoint(tiny_catalog, monkeypatch, capsys,
                                                                           on_the_cpu):
    output_dir = tiny_catalog.parent / 'oom'
    use_tiny_config(tiny_catalog, output_dir)
    out_of_memory_from_call(monkeypatch, fast_rcnn_heads, 'fast_rcnn_losses', 3)  # one call per iteration
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_status:
        run_tool(lambda argv: train_engine.train_model(), [])
    assert exit_status.value.code == 2
    train_dir = output_dir / TRAIN_SUBDIR
    last = train_dir / 'model_iter1.pth'
    assert capsys.readouterr().err.splitlines() == [
        'error: out of memory at iteration 3 on rank 0 (cpu): no memory statistics on the cpu. To lower it: {}. '
        'The checkpoints are intact: started again, the run resumes from {}.'.format(RCNN_TRAINING, last)]
    assert sorted(p.name for p in train_dir.iterdir()) == ['model_iter1.pth', 'tensorboard', 'training_curves.png']
    assert checkpointer.load_checkpoint(str(last), model_builder.create(cfg))['iteration'] == 1


def test_testing_out_of_memory_names_the_image_and_the_test_settings(tiny_catalog, monkeypatch, tmp_path,
                                                                     on_the_cpu):
    use_tiny_config(tiny_catalog, tmp_path, 'TEST.CUDA_GRAPHS', 'False')
    torch.save({'model': model_builder.create(cfg).state_dict()}, tmp_path / 'weights.pth')
    real_detector = GeneralizedRCNNType.detector
    calls = itertools.count()

    def detector(self):
        detect = real_detector(self)

        def failing_on_the_second_image(model, sample):
            if next(calls) == 1:
                raise torch.OutOfMemoryError('CUDA out of memory.')
            return detect(model, sample)
        return failing_on_the_second_image
    monkeypatch.setattr(GeneralizedRCNNType, 'detector', detector)
    with pytest.raises(DeviceOutOfMemory) as err:
        test_engine.test_net(model_builder.build_model_type(cfg), str(tmp_path / 'weights.pth'), 'tiny_val',
                             str(tmp_path / 'test'))
    image = test_engine.JsonDataset('tiny_val').get_roidb()[1]['image']
    assert str(err.value) == ('out of memory at image 2 of 8 ({}) on rank 0 (cpu): no memory statistics on the '
                              'cpu. To lower it: lower TEST.SCALE 64 / TEST.MAX_SIZE 96.'.format(image))


def test_gpu_memory_is_described_in_gib(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'max_memory_allocated', lambda device: 131 * 2 ** 30 + 2 ** 29)
    monkeypatch.setattr(torch.cuda, 'max_memory_reserved', lambda device: 133 * 2 ** 30)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda device: types.SimpleNamespace(
        total_memory=int(139.8 * 2 ** 30)))
    assert describe_device_memory(torch.device('cuda', 1)) == (
        'peak 131.50 GiB allocated (133.00 GiB reserved) of 139.80 GiB total')


def test_each_model_type_names_its_own_memory_settings():
    cfg.defrost()
    merge_cfg_from_list(['NUM_GPUS', '2', 'CENTERNET.BATCH_SIZE', '32', 'CENTERNET.MASTER_BATCH_SIZE', '4',
                         'SOLVER.ITER_SIZE', '2', 'CENTERNET.FLIP_TEST', 'True', 'CENTERNET.TEST_SCALES', '(0.5, 1.0)'])
    centernet = model_builder.registered_model_types()['centernet'](cfg)
    assert centernet.memory_settings(training=True) == (
        'lower CENTERNET.MASTER_BATCH_SIZE 4 (rank 0 takes 4 of the 32 images) or CENTERNET.BATCH_SIZE 32; '
        'raise SOLVER.ITER_SIZE 2 to accumulate the batch over more steps; '
        'TRAIN.CHECKPOINT_ACTIVATIONS True (recompute backbone activations in the backward)')
    assert centernet.memory_settings(training=False) == (
        'fewer or smaller CENTERNET.TEST_SCALES (0.5, 1.0); CENTERNET.FLIP_TEST False; CENTERNET.CUDA_GRAPHS False')
    merge_cfg_from_list(['CENTERNET.MASTER_BATCH_SIZE', '-1', 'CENTERNET.CHUNK_SIZES', '(20, 12)'])
    assert centernet.memory_settings(training=True).startswith(
        'lower CENTERNET.CHUNK_SIZES (20, 12) or CENTERNET.BATCH_SIZE 32; raise SOLVER.ITER_SIZE 2 ')
    merge_cfg_from_list(['TRAIN.CHECKPOINT_ACTIVATIONS', 'True', 'TRAIN.RANK_IMS_PER_BATCH', '(2, 1)'])
    rcnn = model_builder.registered_model_types()['generalized_rcnn'](cfg)
    assert rcnn.memory_settings(training=True) == (
        'lower TRAIN.RANK_IMS_PER_BATCH (2, 1), raising SOLVER.ITER_SIZE 2 by the same factor (the same images per '
        'iteration); lower TRAIN.BATCH_SIZE_PER_IM 64 (RoIs per image)')
    assert rcnn.memory_settings(training=False) == (
        'lower TEST.SCALE 600 / TEST.MAX_SIZE 1000; TEST.CUDA_GRAPHS False')
    merge_cfg_from_list(['TEST.BBOX_AUG.ENABLED', 'True', 'TEST.BBOX_AUG.SCALES', '(400, 1200)'])
    assert rcnn.memory_settings(training=False) == (
        'lower TEST.SCALE 600 / TEST.MAX_SIZE 1000; lower the largest TEST.BBOX_AUG.SCALES (400, 1200) / '
        'TEST.BBOX_AUG.MAX_SIZE 4000; TEST.CUDA_GRAPHS False')
