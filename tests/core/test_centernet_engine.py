"""CenterNet through the engines: the epoch schedule and chunk sizes derived from CENTERNET.*, weight
files, the one-image detector against a hand computation, training with unequal per-GPU chunks on
two gloo processes (CenterNet's mean of per-GPU losses), and testing in one and two processes."""
import copy
import json
import os
import pathlib
import pickle
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from detectron.checkpoint import checkpointer
from detectron.core import config_finalize, test_engine, train_engine
from detectron.core import launch
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list, typed_keys
from detectron.datasets.json_dataset import JsonDataset
from detectron.modeling import centernet, centernet_builder, model_builder
from detectron.modeling.centernet import CenterNet
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.modeling.optimizer import build_optimizer
from detectron.roi_data.centernet import get_affine_transform
from detectron.roi_data.loader import build_train_loader
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, WeightsError
from support.tiny_runs import use_centernet, write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SUBDIR = os.path.join('train', 'tiny_train', 'centernet')
TEST_SUBDIR = os.path.join('test', 'tiny_val', 'centernet')

CPU = torch.device('cpu')

pytestmark = pytest.mark.usefixtures('private_dataset_registrations')


@pytest.fixture(scope='module')
def catalog(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('centernet'))


# ---------------------------------------------------------------------------------------------
# Schedule and chunk sizes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('name, gpus, images, chunks, per_epoch', [
    # CenterNet's experiment lines on COCO train2017 (118287 images, every one used).
    ('ctdet_coco_resdcn18.yaml', 4, 118287, (18, 32, 32, 32), 1037),
    ('ctdet_coco_dla_1x.yaml', 8, 118287, (9,) + (17,) * 7, 924),
])
def test_shipped_configs_derive_the_reference_schedule(monkeypatch, name, gpus, images, chunks, per_epoch):
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: [None] * images)
    merge_cfg_from_file(os.path.join(REPO, 'configs', 'centernet', name))
    lines = centernet_builder.derive_training_cfg(cfg, typed_keys())
    assert cfg.NUM_GPUS == gpus and tuple(cfg.TRAIN.RANK_IMS_PER_BATCH) == chunks
    assert cfg.SOLVER.MAX_ITER == 140 * per_epoch
    assert cfg.SOLVER.STEPS == [0, 90 * per_epoch, 120 * per_epoch]
    assert cfg.SOLVER.LRS == pytest.approx([5e-4, 5e-5, 5e-6], rel=1e-12)
    assert (cfg.SOLVER.BASE_LR, cfg.SOLVER.WARM_UP_ITERS) == (5e-4, 0)
    assert (cfg.SOLVER.OPTIMIZER, cfg.SOLVER.WEIGHT_DECAY, cfg.SOLVER.LR_POLICY) == ('adam', 0.0, 'steps_with_lrs')
    assert cfg.TRAIN.SNAPSHOT_ITERS == per_epoch * gpus  # a checkpoint every epoch
    assert 'per-GPU batches (chunk sizes) {}'.format(list(chunks)) in lines[1]
    assert_and_infer_cfg()
    schedule = train_engine.lr_schedule()
    # CenterNet's main.py: lr drops to 5e-5 after epoch 90 and to 5e-6 after epoch 120.
    for epoch, lr in ((1, 5e-4), (90, 5e-4), (91, 5e-5), (120, 5e-5), (121, 5e-6), (140, 5e-6)):
        assert schedule.lr_at((epoch - 1) * per_epoch) == pytest.approx(lr, rel=1e-6), epoch
    assert train_engine.checkpoint_period(gpus) == per_epoch


def _main_py_lr(base_lr, lr_step, num_epochs):
    """CenterNet's main.py, epoch by epoch: the LR each epoch trains with."""
    lr, lrs = base_lr, []
    for epoch in range(1, num_epochs + 1):
        lrs.append(lr)
        if epoch in lr_step:
            lr = base_lr * (0.1 ** (lr_step.index(epoch) + 1))
    return lrs


@pytest.mark.parametrize('lr_step', [(3, 6), (5, 8, 9), (9,), ()])
def test_lr_steps_follow_main_py_also_when_out_of_range(monkeypatch, lr_step):
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: [None] * 40)
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1', 'CENTERNET.BATCH_SIZE', '10',
                         'CENTERNET.LR_BATCH_SIZE', '10', 'CENTERNET.LR', '0.001', 'CENTERNET.NUM_EPOCHS', '8',
                         'CENTERNET.LR_STEP', str(lr_step)])
    centernet_builder.derive_training_cfg(cfg, typed_keys())
    assert_and_infer_cfg()
    schedule = train_engine.lr_schedule()
    per_epoch = 4
    got = [schedule.lr_at(epoch * per_epoch + i) for epoch in range(8) for i in (0, per_epoch - 1)]
    want = [lr for lr in _main_py_lr(0.001, list(lr_step), 8) for _ in (0, 1)]
    assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize('lr_step', [(3, 3), (3, 3, 6), (6, 3), (0, 4)])
def test_repeated_unordered_or_zero_lr_steps_are_refused(lr_step):
    # main.py would raise the LR again after the later index of a repeated or unordered epoch; epoch 0
    # is never reached (core/config_domains.py).
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'CENTERNET.LR_STEP', str(lr_step)])
    with pytest.raises(ConfigValueError) as err:
        assert_and_infer_cfg()
    assert str(err.value) == 'CENTERNET.LR_STEP must be a tuple of increasing integers >= 1, got {!r}'.format(lr_step)


def test_lr_scales_linearly_with_the_global_batch(monkeypatch):
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: [None] * 1000)
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '4', 'CENTERNET.BATCH_SIZE', '12',
                         'CENTERNET.MASTER_BATCH_SIZE', '4'])
    centernet_builder.derive_training_cfg(cfg, typed_keys())
    # CenterNet's "1.25e-4 for batch size 32": 12 images -> 4.6875e-5; chunks as opts.py: [4, 3, 3, 2].
    assert cfg.SOLVER.BASE_LR == pytest.approx(1.25e-4 * 12 / 32)
    assert tuple(cfg.TRAIN.RANK_IMS_PER_BATCH) == (4, 3, 3, 2)
    assert cfg.SOLVER.MAX_ITER == 140 * (1000 // 12)


def test_explicit_chunk_sizes_override_and_bad_ones_are_refused(monkeypatch):
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: [None] * 100)
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '2', 'CENTERNET.BATCH_SIZE', '10',
                         'CENTERNET.CHUNK_SIZES', '(7, 3)'])
    centernet_builder.derive_training_cfg(cfg, typed_keys())
    assert tuple(cfg.TRAIN.RANK_IMS_PER_BATCH) == (7, 3)
    cfg.CENTERNET.CHUNK_SIZES = (7, 2)
    with pytest.raises(ConfigValueError, match='CENTERNET'):
        centernet_builder.derive_training_cfg(cfg, typed_keys())


def test_freeze_conv_body_is_refused_for_centernet():
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'TRAIN.FREEZE_CONV_BODY', 'True'])
    with pytest.raises(ConfigValueError, match='TRAIN.FREEZE_CONV_BODY True freezes an R-CNN body'):
        model_builder.build_model_type(cfg).check()


def _run_tool(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'train_net.py')] + list(args),
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


@pytest.mark.processes
def test_print_config_shows_the_derived_schedule_and_chunks(catalog):
    result = _run_tool('--cfg', 'configs/getting_started/shapes_demo_centernet_res18.yaml', '--print-config',
                       'DATASET_CATALOG', str(catalog), 'TRAIN.DATASETS', "('tiny_train',)", 'NUM_GPUS', '2',
                       'CENTERNET.BATCH_SIZE', '8', 'CENTERNET.MASTER_BATCH_SIZE', '2')
    assert result.returncode == 0, result.stderr
    assert 'CenterNet: 8 training images // CENTERNET.BATCH_SIZE 8 = 1 iterations per epoch' in result.stdout
    assert 'CenterNet: per-GPU batches (chunk sizes) [2, 6]' in result.stdout
    assert 'images per iteration: 8 (TRAIN.RANK_IMS_PER_BATCH (2, 6) x SOLVER.ITER_SIZE 1)' in result.stdout


@pytest.mark.processes
def test_impossible_chunks_are_one_error_line_before_any_process_starts(catalog):
    # CenterNet issue #115: --batch_size 4 --master_batch 15 on two GPUs gives the chunks [15, -11].
    result = _run_tool('--cfg', 'configs/getting_started/shapes_demo_centernet_res18.yaml',
                       'DATASET_CATALOG', str(catalog), 'TRAIN.DATASETS', "('tiny_train',)", 'NUM_GPUS', '2',
                       'CENTERNET.BATCH_SIZE', '4', 'CENTERNET.MASTER_BATCH_SIZE', '15')
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and 'CENTERNET.MASTER_BATCH_SIZE' in lines[0]


# ---------------------------------------------------------------------------------------------
# The detector against a hand computation
# ---------------------------------------------------------------------------------------------

class _FixedHeads(torch.nn.Module):
    """Raw head outputs with one peak: class 1 at output cell (x 10, y 5) with offset (0.25, 0.5)
    and size (8, 4) output pixels; the peak logit is 2 for the first image of a batch, 1 for others."""

    def __init__(self, num_classes, size):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        self.num_classes, self.size = num_classes, size

    def forward(self, images):
        batch, out = images.shape[0], self.size // 4
        hm = torch.full((batch, self.num_classes, out, out), -10.0)
        hm[:, 1, 5, 10] = 1.0
        hm[0, 1, 5, 10] = 2.0
        wh = torch.zeros(batch, 2, out, out)
        wh[:, 0, 5, 10], wh[:, 1, 5, 10] = 8.0, 4.0
        reg = torch.zeros(batch, 2, out, out)
        reg[:, 0, 5, 10], reg[:, 1, 5, 10] = 0.25, 0.5
        return {'hm': hm + self.anchor, 'wh': wh, 'reg': reg}


def test_test_options_reach_the_detector_params():
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'CENTERNET.NMS', 'True', 'CENTERNET.FLIP_TEST', 'True',
                         'CENTERNET.TEST_SCALES', '(0.5, 1.0)', 'CENTERNET.KEEP_RES', 'True', 'CENTERNET.K', '50'])
    params = centernet_builder.test_params(cfg)
    assert (params.nms, params.flip, params.scales, params.keep_res, params.K) == (True, True, (0.5, 1.0), True, 50)


def test_detector_maps_a_peak_back_through_the_inverse_affine():
    params = centernet.TestParams(input=centernet_builder.CtdetParams(input_h=64, input_w=64, num_classes=3), K=5)
    im = np.zeros((40, 100, 3), np.uint8)  # w 100, h 40: fix_res centre (50, 20), scale 100
    sample = centernet.prepare_test_image(im, params)
    assert sample['inputs'][0].shape == (1, 3, 64, 64)
    cls_boxes = centernet.detect(_FixedHeads(3, 64), sample, params)
    assert len(cls_boxes) == 4 and cls_boxes[0].shape == (0, 5)
    # Output grid 16 x 16 spans the 100-px square around the centre: 6.25 px per cell, origin at
    # (50 - 50, 20 - 50) = (0, -30). Centre (10.25, 5.5), half size (4, 2) -> output box
    # (6.25, 3.5, 14.25, 7.5) -> image box (39.0625, -8.125, 89.0625, 16.875).
    score = 1 / (1 + np.exp(-2.0))
    top = cls_boxes[2][np.argmax(cls_boxes[2][:, 4])]
    np.testing.assert_allclose(top, [39.0625, -8.125, 89.0625, 16.875, score], rtol=1e-5)
    # No score threshold: K = 5 detections in all (CenterNet's decode), the other four at ~sigmoid(-10).
    assert sum(len(b) for b in cls_boxes) == 5
    inverse = get_affine_transform(np.array([50, 20], np.float32), 100.0, 0, (16, 16), inv=1)
    np.testing.assert_allclose(inverse @ [6.25, 3.5, 1], [39.0625, -8.125], rtol=1e-5)


def test_flip_test_averages_hm_and_wh_with_the_mirrored_pass():
    params = centernet.TestParams(input=centernet_builder.CtdetParams(input_h=64, input_w=64, num_classes=3),
                                  K=1, flip=True)
    sample = centernet.prepare_test_image(np.zeros((64, 64, 3), np.uint8), params)
    assert sample['inputs'][0].shape == (2, 3, 64, 64)
    top = centernet.detect(_FixedHeads(3, 64), sample, params)[2][0]
    # The mirrored pass (peak logit 1) has its peak at x = 15 - 10 = 5 once flipped back, so at
    # x 10 the averaged heat is (sigmoid(2) + sigmoid(-10)) / 2 and wh is (8, 4) / 2; reg is the
    # unflipped pass's (0.25, 0.5).
    score = (1 / (1 + np.exp(-2.0)) + 1 / (1 + np.exp(10.0))) / 2
    assert top[4] == pytest.approx(score, rel=1e-5)
    np.testing.assert_allclose(top[:4], np.array([10.25 - 2, 5.5 - 1, 10.25 + 2, 5.5 + 1]) * 4, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------

def test_weight_files_are_recognised(catalog, tmp_path):
    use_centernet(catalog, tmp_path)
    model_type = model_builder.build_model_type(cfg)
    model = model_builder.create(cfg)
    reference = {key[len('backbone.'):] if key.startswith('backbone.') else key[len('heads.'):]: value + 1
                 for key, value in model.state_dict().items()}
    torch.save({'epoch': 70, 'state_dict': {'module.' + k: v for k, v in reference.items()}}, tmp_path / 'ref.pth')
    missing, unused = model_type.load_weights(model, str(tmp_path / 'ref.pth'))
    assert (missing, unused) == ([], [])
    assert torch.equal(model.heads.hm[2].bias, reference['hm.2.bias'])
    imagenet = {k: v for k, v in reference.items() if k.startswith(('conv1', 'bn1', 'layer'))}
    imagenet['fc.weight'] = torch.zeros(1000, 512)
    torch.save(imagenet, tmp_path / 'resnet18.pth')
    fresh = model_builder.create(cfg)
    _, unused = model_type.load_weights(fresh, str(tmp_path / 'resnet18.pth'))
    assert unused == ['fc.weight'] and torch.equal(fresh.backbone.conv1.weight, reference['conv1.weight'])
    # Our own checkpoint (a 'model' state dict) loads by key; a missing file names the keys to check.
    torch.save({'model': fresh.state_dict()}, tmp_path / 'ours.pth')
    assert model_type.load_weights(model, str(tmp_path / 'ours.pth')) == ([], [])
    assert torch.equal(model.backbone.conv1.weight, reference['conv1.weight'])
    missing_file = str(tmp_path / 'absent.pth')
    with pytest.raises(WeightsError) as err:
        model_type.load_weights(model, missing_file)
    assert str(err.value) == 'weights file {} does not exist; check TRAIN.WEIGHTS / TEST.WEIGHTS'.format(missing_file)


# ---------------------------------------------------------------------------------------------
# bfloat16 autocast on the CPU (the CPU demo)
# ---------------------------------------------------------------------------------------------

def _final_model_after_training(catalog, output_dir, *overrides):
    use_centernet(catalog, output_dir, *overrides)
    train_engine.train_model()
    return torch.load(output_dir / TRAIN_SUBDIR / 'model_final.pth', weights_only=True)['model']


@pytest.mark.slow
def test_bfloat16_on_a_cpu_without_its_instructions_trains_exactly_as_float32(catalog, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(config_finalize, 'cpu_bfloat16_is_emulated', lambda: True)
    fallback = _final_model_after_training(catalog, tmp_path / 'bf16', 'SOLVER.AMP.ENABLED', 'True',
                                           'SOLVER.AMP.DTYPE', 'bfloat16')
    assert 'no bfloat16 instructions' in caplog.text and 'training in float32' in caplog.text
    float32 = _final_model_after_training(catalog, tmp_path / 'fp32')
    assert fallback.keys() == float32.keys()
    for key, value in float32.items():
        assert torch.equal(fallback[key], value), key


def test_bfloat16_instructions_are_probed_by_both_of_torchs_cpu_checks(monkeypatch):
    for avx512_bf16, amx, emulated in ((False, False, True), (True, False, False), (False, True, False)):
        monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.cpu, '_is_amx_tile_supported', lambda: amx, raising=False)
        assert config_finalize.cpu_bfloat16_is_emulated() == emulated
    monkeypatch.delattr(torch.cpu, '_is_amx_tile_supported')
    assert not config_finalize.cpu_bfloat16_is_emulated()  # a torch without the probe: autocast as asked


def test_bfloat16_training_on_the_cpu_stores_the_model_channels_last(catalog, tmp_path, monkeypatch):
    monkeypatch.setattr(config_finalize, 'cpu_bfloat16_is_emulated', lambda: False)  # whatever this CPU has
    use_centernet(catalog, tmp_path, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'bfloat16')
    model_type = model_builder.build_model_type(cfg)
    images, targets = _rank_batch(0, [2])
    torch.manual_seed(cfg.RNG_SEED)
    model = model_type.prepare_for_training(model_builder.create(cfg).train())
    # (1x1 kernels are contiguous in both layouts.)
    convs = [m.weight for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d))
             and m.weight.shape[-1] > 1]
    assert len(convs) > 20 and all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
                                   for w in convs)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        bf16_loss = model(images, targets)['loss']
    torch.manual_seed(cfg.RNG_SEED)
    with torch.no_grad():
        float32_loss = model_builder.create(cfg).train()(images, targets)['loss']
    # The same function in bfloat16: near the float32 loss, not equal to it.
    assert bf16_loss.dtype == torch.float32 and float(bf16_loss) != float(float32_loss)
    assert float(bf16_loss) == pytest.approx(float(float32_loss), rel=3e-2)
    for overrides in (['SOLVER.AMP.ENABLED', 'False'], ['SOLVER.AMP.DTYPE', 'float16']):
        use_centernet(catalog, tmp_path, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'bfloat16', *overrides)
        model = model_type.prepare_for_training(model_builder.create(cfg))
        assert all(m.weight.is_contiguous() for m in model.modules()
                   if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_autocast_training_on_cuda_stores_the_trunk_and_heads_channels_last_with_fused_adam(catalog, tmp_path):
    use_centernet(catalog, tmp_path, 'SOLVER.AMP.ENABLED', 'True', 'SOLVER.AMP.DTYPE', 'bfloat16')
    model_type = model_builder.build_model_type(cfg)
    images, targets = _rank_batch(0, [2])
    images, targets = images.cuda(), {k: v.cuda() for k, v in targets.items()}
    torch.manual_seed(cfg.RNG_SEED)
    nchw = model_builder.create(cfg).cuda().train()
    model = model_type.prepare_for_training(copy.deepcopy(nchw))

    def convs(module):
        return [m.weight for m in module.modules()
                if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and m.weight.shape[-1] > 1]
    trunk = [w for m in model.backbone.channels_last_modules() for w in convs(m)] + convs(model.heads)
    assert len(trunk) > 15 and all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
                                   for w in trunk)
    assert all(w.is_contiguous() for w in convs(model.backbone.deconv_layers))  # the up-sampling path: NCHW
    losses = []
    for m in (nchw, model):
        with torch.autocast('cuda', dtype=torch.bfloat16):
            losses.append(m(images, targets))
    for key in ('hm_loss', 'wh_loss', 'off_loss'):  # one function in two layouts: bfloat16 rounding apart
        assert float(losses[1][key]) == pytest.approx(float(losses[0][key]), rel=2e-2), key
    optimizer = build_optimizer(model, base_lr=1e-4, name='adam')
    assert optimizer.defaults['fused'] is True


@pytest.mark.processes
@pytest.mark.parametrize('workers', [0, 1])
def test_the_loader_writes_each_input_into_its_row_of_the_batch(catalog, tmp_path, workers):
    # The batch the loader gives equals the samples prepared one by one and stacked, bit for bit; the
    # batch's images are written in place, not copied again when collated.
    use_centernet(catalog, tmp_path, 'CENTERNET.BATCH_SIZE', '3')
    model_type = model_builder.build_model_type(cfg)
    roidb = model_type.training_roidb()
    dataset, collate = model_type.training_dataset(roidb, CPU), model_type.collate(CPU)
    keys = [(4, 2), (4, 0), (4, 1)]
    samples = dataset.__getitems__(keys)
    images, targets = collate(samples)
    assert all(sample['input']._base is images for sample in samples)
    alone = [dataset[key] for key in keys]
    assert not any(isinstance(sample['input'], torch.Tensor) for sample in alone)
    expected_images, expected_targets = collate(alone)
    assert images.numpy().tobytes() == expected_images.numpy().tobytes()
    assert sorted(targets) == sorted(expected_targets)
    for key in targets:
        assert torch.equal(targets[key], expected_targets[key]), key
    loaded_images, _ = next(iter(build_train_loader(dataset, [[2, 0, 1]], collate, num_workers=workers, start_iter=4)))
    assert loaded_images.numpy().tobytes() == images.numpy().tobytes()


# ---------------------------------------------------------------------------------------------
# Training with unequal chunks on two gloo processes, and testing
# ---------------------------------------------------------------------------------------------

def train_worker_recording_batch_sizes(cfg_snapshot, record_dir):
    """train_engine.train_worker, writing the batch of every training forward to record_dir/rank<r>.json.
    Module-level: spawned workers import it by name."""
    seen = []
    forward = centernet.CenterNet.forward

    def recording_forward(self, images, targets=None):
        seen.append(images.shape[0])
        return forward(self, images, targets)

    centernet.CenterNet.forward = recording_forward
    try:
        train_engine.train_worker(cfg_snapshot)
    finally:
        centernet.CenterNet.forward = forward
    (pathlib.Path(record_dir) / 'rank{}.json'.format(comm.get_rank())).write_text(json.dumps(seen))


def _rank_batch(rank, chunks):
    model_type = model_builder.build_model_type(cfg)
    roidb = model_type.training_roidb()
    sampler = GroupedDistributedBatchSampler(model_type.training_groups(roidb), None, seed=cfg.RNG_SEED,
                                             rank=rank, world_size=len(chunks), rank_batch_sizes=chunks)
    loader = build_train_loader(model_type.training_dataset(roidb, CPU), sampler, model_type.collate(CPU),
                                num_workers=0)
    return next(iter(loader))


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA: the 2 ranks share GPU 0 in the DIST_BACKEND gloo check mode')])])
def test_two_gloo_workers_with_unequal_chunks_take_the_mean_of_per_gpu_losses(catalog, tmp_path, monkeypatch, device):
    # 3 images on 2 GPUs with 1 on the master: CenterNet's chunk sizes [1, 2].
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    use_centernet(catalog, tmp_path, 'NUM_GPUS', '2', 'CENTERNET.BATCH_SIZE', '3', 'CENTERNET.MASTER_BATCH_SIZE', '1',
                  'CENTERNET.NUM_EPOCHS', '1')
    assert tuple(cfg.TRAIN.RANK_IMS_PER_BATCH) == (1, 2) and cfg.SOLVER.MAX_ITER == 8 // 3
    cfg.defrost()
    cfg.SOLVER.MAX_ITER = 1
    cfg.freeze()
    launch.launch(train_worker_recording_batch_sizes, 2, args=(cfg.clone(), str(tmp_path)), device=device,
                  backend='gloo')
    assert json.loads((tmp_path / 'rank0.json').read_text()) == [1]
    assert json.loads((tmp_path / 'rank1.json').read_text()) == [2]
    final = torch.load(tmp_path / TRAIN_SUBDIR / 'model_final.pth', weights_only=True)
    assert final['sampler'] == {'seed': cfg.RNG_SEED, 'global_batch_size': 3, 'position': {'draws': 1, 'skipped': 0}}

    # By hand: each rank's loss on its own chunk (own positives), gradients averaged, one Adam step.
    torch.set_num_threads(1)
    models, losses = [], []
    to_device = model_builder.build_model_type(cfg).batch_to_device(torch.device(device))
    for rank in range(2):
        torch.manual_seed(cfg.RNG_SEED)
        models.append(model_builder.create(cfg).to(device).train())
        losses.append(models[-1](*to_device(_rank_batch(rank, [1, 2])))['loss'])
        losses[-1].backward()
    for mine, other in zip(models[0].parameters(), models[1].parameters()):
        if mine.grad is not None:
            mine.grad = (mine.grad + other.grad) / 2
    torch.optim.Adam([p for p in models[0].parameters() if p.requires_grad], lr=cfg.SOLVER.BASE_LR).step()
    # On the CPU the arithmetic is deterministic and the step equal to 1e-6. On a GPU cuDNN's backward
    # adds with atomics: a gradient element near zero may change sign between the two computations, and
    # Adam's first step moves every weight by about lr in the direction of that sign.
    atol = 1e-6 if device == 'cpu' else 2.5 * cfg.SOLVER.BASE_LR
    for key, value in models[0].state_dict().items():
        torch.testing.assert_close(final['model'][key], value.cpu(), rtol=0, atol=atol, msg=key)


@pytest.mark.slow
@pytest.mark.processes
def test_two_gloo_workers_train_with_zero_weighted_heads(catalog, tmp_path, monkeypatch):
    # ctdet_loss skips a term of weight 0, so its head gets no gradient; DDP stopped at the second
    # step ("Expected to have finished reduction in the prior iteration") until the head joined at 0.
    # Both weights at 0 in one run: a head that did not join would stop it.
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    use_centernet(catalog, tmp_path, 'NUM_GPUS', '2', 'CENTERNET.BATCH_SIZE', '2', 'CENTERNET.WH_WEIGHT', '0.0',
                  'CENTERNET.OFF_WEIGHT', '0.0')
    cfg.defrost()
    cfg.SOLVER.MAX_ITER = 3
    cfg.freeze()
    launch.launch(train_engine.train_worker, 2, args=(cfg.clone(),), device='cpu')
    final = torch.load(tmp_path / TRAIN_SUBDIR / 'model_final.pth', weights_only=True)
    torch.manual_seed(cfg.RNG_SEED)
    init = model_builder.create(cfg).state_dict()
    # Adam with zero gradients leaves the heads as initialised; the heatmap head has trained.
    for head in ('heads.wh.2.weight', 'heads.reg.2.weight'):
        torch.testing.assert_close(final['model'][head], init[head], rtol=0, atol=0, msg=head)
    assert not torch.equal(final['model']['heads.hm.2.weight'], init['heads.hm.2.weight'])


@pytest.mark.slow
@pytest.mark.processes
def test_one_and_two_process_testing_give_the_same_detections(catalog, tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the spawned workers run one thread each, as here
    try:
        use_centernet(catalog, tmp_path / 'train')
        model = model_builder.create(cfg)
        weights = tmp_path / 'weights.pth'
        torch.save({'model': model.state_dict()}, weights)
        use_centernet(catalog, tmp_path / 'single')
        single = test_engine.run_inference(model_builder.build_model_type(cfg), str(weights))
        use_centernet(catalog, tmp_path / 'multi', 'NUM_GPUS', '2')
        multi = test_engine.run_inference(model_builder.build_model_type(cfg), str(weights), multi_gpu_testing=True)
    finally:
        torch.set_num_threads(threads)
    assert single == multi
    boxes = [_all_boxes(tmp_path / d / TEST_SUBDIR / 'detections.pkl') for d in ('single', 'multi')]
    for one, two in zip(*boxes):
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)
    assert sum(len(d) for per_class in boxes[0][1:] for d in per_class) == 8 * 100  # K per image, no threshold


def test_test_net_gives_the_detector_test_ims_per_batch_images_at_a_time(catalog, tmp_path, caplog, monkeypatch):
    """TEST.IMS_PER_BATCH 3 over tiny_val's 8 images: the batch detector gets images 1-3, 4-6 and
    7-8 in order, each image's detections land in its own slot of detections.pkl, and Detectron's log
    line comes after the batch holding image 1 and after the last."""
    import re
    use_centernet(catalog, tmp_path, 'TEST.IMS_PER_BATCH', '3')
    weights = tmp_path / 'weights.pth'
    torch.save({'model': model_builder.create(cfg).state_dict()}, weights)
    calls = []
    detect_runs = centernet.detect_runs

    def recording(model, samples, params):
        calls.append(([s['image'].copy() for s in samples], detect_runs(model, samples, params)))
        return calls[-1][1]
    monkeypatch.setattr(centernet, 'detect_runs', recording)
    with caplog.at_level('INFO', logger='detectron.core.test_engine'):
        test_engine.run_inference(model_builder.build_model_type(cfg), str(weights))
    done = [int(m.group(1)) for m in (re.search(r'im_detect: .*: (\d+)/8 ', r.getMessage()) for r in caplog.records)
            if m]
    assert done == [3, 8]
    assert [len(images) for images, _ in calls] == [3, 3, 2]
    roidb = JsonDataset('tiny_val').get_roidb()
    images = [im for batch, _ in calls for im in batch]
    assert len(images) == len(roidb) == 8
    for entry, image in zip(roidb, images):  # in dataset order
        np.testing.assert_array_equal(image, cv2.imread(entry['image']))
    detections = [d for _, batch in calls for d in batch]
    stored = _all_boxes(tmp_path / TEST_SUBDIR / 'detections.pkl')
    for i, cls_boxes in enumerate(detections):
        for j in range(1, len(cls_boxes)):
            np.testing.assert_array_equal(stored[j][i], cls_boxes[j])


def _assert_same_detections_up_to_ties(a, b):
    """Two per-class lists of (N, 5) arrays of one image: the same scores (to rounding), and the same
    (class, box, score) rows above the lowest score kept. At that score a flat image region has many
    equal peaks, and which of them fill the last top-K places depends on topk's order of ties."""
    rows = [np.concatenate([np.hstack([np.full((len(d), 1), j, np.float32), d]) for j, d in enumerate(x)])
            for x in (a, b)]
    scores = [np.sort(r[:, 5]) for r in rows]
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)
    cut = scores[0][0] + 1e-4
    above = [r[r[:, 5] > cut] for r in rows]
    above = [r[np.lexsort(np.round(r, 3).T[::-1])] for r in above]
    assert len(above[0]) >= 10
    np.testing.assert_allclose(above[0], above[1], rtol=1e-5, atol=1e-4)


def test_detect_runs_batches_only_images_of_one_input_size():
    params = centernet.TestParams(input=centernet.CtdetParams(input_h=64, input_w=64), keep_res=True)
    torch.manual_seed(0)
    backbone = build_centernet_backbone('res_18')
    model = CenterNet(backbone, CenterNetHeads(backbone.out_channels, {'hm': 2, 'wh': 2, 'reg': 2}, 64, 'resdcn')).eval()
    with torch.no_grad():  # heat maps that follow the images' content, not the initial prior 0.1 everywhere
        for p in model.heads.hm.parameters():
            p.normal_(std=0.5)
    rng = np.random.RandomState(0)
    samples = [centernet.prepare_test_image(rng.randint(0, 255, shape).astype(np.uint8), params)
               for shape in ((60, 64, 3), (60, 64, 3), (90, 64, 3), (60, 64, 3))]
    calls = []
    detect_batch = centernet.detect_batch

    def recording(model, run, params):
        calls.append(len(run))
        return detect_batch(model, run, params)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(centernet, 'detect_batch', recording)
        runs = centernet.detect_runs(model, samples, params)
    assert calls == [2, 1, 1]
    for sample, detections in zip(samples, runs):
        _assert_same_detections_up_to_ties(detections[1:], centernet.detect(model, sample, params)[1:])


def _all_boxes(path):
    with open(path, 'rb') as f:
        return pickle.load(f)['all_boxes']


def test_centernet_keeps_model_last_and_the_checkpoints_before_its_lr_drops():
    merge_cfg_from_list(['TRAIN.KEEP_CHECKPOINTS', '3'])
    centernet = model_builder.registered_model_types()['centernet'](cfg).checkpoint_retention([180, 240])
    assert centernet == checkpointer.Retention(last=True, milestones=frozenset({179, 239}), keep=3)
    # Detectron's configs: a numbered file every period.
    assert model_builder.registered_model_types()['generalized_rcnn'](cfg).checkpoint_retention([180]) == \
        checkpointer.Retention(keep=3)
