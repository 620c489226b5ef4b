"""The user's keys win: config.typed_keys records what the user typed (file or command line), and
CenterNet's epoch schedule derives only the keys left at their defaults, says what it derived, and
stops with one line naming both keys when a typed key contradicts a typed CENTERNET key."""
import os
import subprocess
import sys

import pytest

from detectron.core.config import (assert_and_infer_cfg, cfg, merge_cfg_from_command_line, merge_cfg_from_file,
                                   merge_cfg_from_list, typed_keys)
from detectron.core import train_engine
from detectron.modeling import centernet_builder, model_builder
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESDCN18 = os.path.join(REPO, 'configs', 'centernet', 'ctdet_coco_resdcn18.yaml')
# The shipped COCO config on one GPU at batch 32 (its LR scales to 5e-4 x 32 / 114).
ONE_GPU = ['NUM_GPUS', '1', 'CENTERNET.BATCH_SIZE', '32', 'CENTERNET.MASTER_BATCH_SIZE', '-1']


@pytest.fixture
def eighty_images(monkeypatch):
    """An 80-image training set: 80 // 32 = 2 iterations per epoch at batch 32."""
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: [None] * 80)


def derive():
    return centernet_builder.derive_training_cfg(cfg, typed_keys())


def test_typed_keys_name_their_file_or_the_command_line(tmp_path):
    path = tmp_path / 'mine.yaml'
    path.write_text('SOLVER:\n  MAX_ITER: 90\n  WARMUP_ITERS: 7\n')
    merge_cfg_from_file(str(path))
    merge_cfg_from_list(['SOLVER.CHECKPOINT_PERIOD', '300', 'SOLVER.MAX_ITER', '100'])
    # Aliases are recorded under the key they set; the last merge names the source.
    assert typed_keys() == {'SOLVER.MAX_ITER': 'command line', 'SOLVER.WARM_UP_ITERS': str(path),
                            'TRAIN.SNAPSHOT_ITERS': 'command line'}


def test_a_typed_checkpoint_period_is_kept_and_the_rest_derived(eighty_images):
    # The run: TRAIN.SNAPSHOT_ITERS 1000000 on the command line used to become one epoch (2).
    merge_cfg_from_file(RESDCN18)
    merge_cfg_from_list(ONE_GPU + ['TRAIN.SNAPSHOT_ITERS', '1000000'])
    lines = derive()
    assert cfg.TRAIN.SNAPSHOT_ITERS == 1000000
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS) == (140 * 2, [0, 90 * 2, 120 * 2])
    assert cfg.SOLVER.BASE_LR == pytest.approx(5e-4 * 32 / 114, rel=1e-12)
    assert lines[-1] == (
        "CenterNet's epoch schedule: derived TRAIN.RANK_IMS_PER_BATCH (32,), TRAIN.IMS_PER_BATCH 32, "
        "SOLVER.ITER_SIZE 1, SOLVER.MAX_ITER 280, SOLVER.BASE_LR 0.000140351, SOLVER.LR_POLICY steps_with_lrs, "
        "SOLVER.STEPS [0, 180, 240], SOLVER.LRS [0.000140351, 1.40351e-05, 1.40351e-06], SOLVER.WARM_UP_ITERS 0, "
        "SOLVER.WEIGHT_DECAY 0; kept TRAIN.SNAPSHOT_ITERS 1000000 (typed; CenterNet's epoch schedule would "
        "make 2)")


def test_max_iter_against_the_files_num_epochs_is_one_error_naming_both(eighty_images):
    merge_cfg_from_file(RESDCN18)
    merge_cfg_from_list(ONE_GPU + ['SOLVER.MAX_ITER', '1000'])
    with pytest.raises(ConfigValueError) as error:
        derive()
    assert str(error.value) == (
        "SOLVER.MAX_ITER 1000 (from command line) contradicts CENTERNET.NUM_EPOCHS 140 (from {}), from which "
        "CenterNet's epoch schedule makes SOLVER.MAX_ITER 280: give only one of them".format(RESDCN18))


def test_contradicting_keys_in_one_file_name_that_file(tmp_path, eighty_images):
    path = tmp_path / 'short.yaml'
    path.write_text('MODEL:\n  TYPE: centernet\nCENTERNET:\n  BATCH_SIZE: 32\n  LR: 0.001\n'
                    'SOLVER:\n  BASE_LR: 0.02\n')
    merge_cfg_from_file(str(path))
    with pytest.raises(ConfigValueError, match=r'^SOLVER.BASE_LR 0.02 \(from {0}\) contradicts CENTERNET.LR 0.001 '
                                               r'\(from {0}\)'.format(str(path).replace('.', r'\.'))):
        derive()


def test_max_iter_alone_is_kept_and_the_lr_steps_stay_in_epochs(eighty_images):
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1', 'SOLVER.MAX_ITER', '100'])
    lines = derive()
    assert cfg.SOLVER.MAX_ITER == 100  # 50 epochs of 2 iterations; the LR drops after epoch 90 are not reached
    assert cfg.SOLVER.STEPS == [0, 180, 240]
    assert lines[0] == ('CenterNet: 80 training images // CENTERNET.BATCH_SIZE 32 = 2 iterations per epoch; '
                        'SOLVER.MAX_ITER 100 = 50 epochs')
    assert 'kept SOLVER.MAX_ITER 100 (typed; CenterNet\'s epoch schedule would make 280)' in lines[-1]


def test_typed_warm_up_weight_decay_and_accumulation_are_kept(eighty_images):
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1', 'CENTERNET.LR', '0.001',
                         'CENTERNET.LR_BATCH_SIZE', '32', 'CENTERNET.NUM_EPOCHS', '10', 'CENTERNET.LR_STEP', '(5,)',
                         'SOLVER.WARM_UP_ITERS', '3', 'SOLVER.WEIGHT_DECAY', '0.0001', 'SOLVER.ITER_SIZE', '2'])
    lines = derive()
    assert (cfg.SOLVER.WARM_UP_ITERS, cfg.SOLVER.WEIGHT_DECAY, cfg.SOLVER.ITER_SIZE) == (3, 1e-4, 2)
    # 64 images per optimizer step: 80 // 64 = 1 iteration per epoch, the LR scaled for 64 images.
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS, cfg.TRAIN.SNAPSHOT_ITERS) == (10, [0, 5], 1)
    assert cfg.SOLVER.BASE_LR == pytest.approx(0.002, rel=1e-12)
    assert cfg.SOLVER.LRS == pytest.approx([0.002, 0.0002], rel=1e-12)
    assert lines[0].startswith('CenterNet: 80 training images // CENTERNET.BATCH_SIZE 32 x SOLVER.ITER_SIZE 2 = 1 ')
    assert 'SOLVER.WARM_UP_ITERS 3 (typed' in lines[-1] and 'SOLVER.ITER_SIZE 2 (typed' in lines[-1]


def test_untyped_keys_take_centernets_values_whatever_they_held(eighty_images):
    cfg.SOLVER.WARM_UP_ITERS, cfg.SOLVER.WEIGHT_DECAY, cfg.SOLVER.ITER_SIZE = 500, 1e-4, 4  # set, not typed
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1'])
    derive()
    assert (cfg.SOLVER.WARM_UP_ITERS, cfg.SOLVER.WEIGHT_DECAY, cfg.SOLVER.ITER_SIZE) == (0, 0.0, 1)


def test_a_typed_value_equal_to_the_derived_one_is_no_contradiction(eighty_images):
    merge_cfg_from_file(RESDCN18)
    merge_cfg_from_list(ONE_GPU + ['SOLVER.MAX_ITER', '280', 'SOLVER.BASE_LR', str(5e-4 * 32 / 114)])
    lines = derive()
    assert cfg.SOLVER.MAX_ITER == 280 and 'kept' not in lines[-1]


def test_a_typed_base_lr_alone_sets_the_lrs(eighty_images):
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1', 'SOLVER.BASE_LR', '0.01'])
    derive()
    assert cfg.SOLVER.LRS == pytest.approx([0.01, 0.001, 0.0001], rel=1e-12)


def test_per_gpu_batches_come_only_from_the_centernet_keys(eighty_images):
    merge_cfg_from_list(['MODEL.TYPE', 'centernet', 'NUM_GPUS', '1', 'TRAIN.IMS_PER_BATCH', '4'])
    with pytest.raises(ConfigValueError, match=r'^TRAIN.IMS_PER_BATCH 4 \(from command line\) contradicts '
                                               r'CENTERNET.BATCH_SIZE 32 \(from its default\)'):
        derive()


@pytest.mark.processes
def test_train_net_prints_the_contradiction_as_one_error_line(tmp_path):
    catalog = write_tiny_datasets(tmp_path)  # tiny_train: 8 images, one iteration per epoch at batch 8
    demo = os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_centernet_res18.yaml')
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, 'tools', 'train_net.py'), '--cfg', demo, '--print-config',
         'DATASET_CATALOG', str(catalog), 'TRAIN.DATASETS', "('tiny_train',)", 'CENTERNET.BATCH_SIZE', '8',
         'SOLVER.MAX_ITER', '1000'],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ['error: SOLVER.MAX_ITER 1000 (from command line) contradicts CENTERNET.NUM_EPOCHS 65 (from {}), '
                     "from which CenterNet's epoch schedule makes SOLVER.MAX_ITER 65: give only one "
                     'of them'.format(demo)]


def test_the_derived_config_passes_the_checks_and_says_which_checkpoints_stay(eighty_images):
    merge_cfg_from_file(RESDCN18)
    merge_cfg_from_list(ONE_GPU + ['TRAIN.SNAPSHOT_ITERS', '1000000', 'TRAIN.KEEP_CHECKPOINTS', '1'])
    derive()
    assert_and_infer_cfg()
    # LR drops after epochs 90 and 120 of 2 iterations: the checkpoints after iterations 179 and 239.
    assert train_engine.describe_schedule(model_builder.build_model_type(cfg))[-1] == (
        'checkpoint every 1000000 iterations (int(TRAIN.SNAPSHOT_ITERS 1000000 / NUM_GPUS 1)) into model_last.pth '
        '(overwritten); model_iterN.pth after iterations 179, 239, the 1 newest kept (TRAIN.KEEP_CHECKPOINTS)')


def test_a_negative_keep_checkpoints_is_refused():
    merge_cfg_from_list(['TRAIN.KEEP_CHECKPOINTS', '-1'])
    with pytest.raises(ConfigValueError, match=r'^TRAIN.KEEP_CHECKPOINTS must be at least 0 \(0: keep all\), got -1$'):
        assert_and_infer_cfg()


def test_a_tools_config_records_only_what_its_command_typed(tmp_path):
    merge_cfg_from_list(['SOLVER.BASE_LR', '0.5'])  # an earlier merge in the same process
    path = tmp_path / 'c.yaml'
    path.write_text('SOLVER:\n  MAX_ITER: 90\n')
    merge_cfg_from_command_line(str(path), ['TRAIN.SNAPSHOT_ITERS', '10'])
    assert typed_keys() == {'SOLVER.MAX_ITER': str(path), 'TRAIN.SNAPSHOT_ITERS': 'command line'}


def test_a_timed_centernet_run_takes_whole_epochs_at_the_asked_batch_and_base_lr(monkeypatch):
    # The shipped 4-GPU config (BATCH_SIZE 114, MASTER_BATCH_SIZE 18, 140 epochs, CENTERNET.LR typed)
    # run by a tool for 5 iterations of 32 images of 80: 2 iterations per epoch, so 3 epochs.
    seen = []
    monkeypatch.setattr(centernet_builder, 'centernet_roidb', lambda names: seen.append(names) or [None] * 80)
    merge_cfg_from_file(RESDCN18)
    opts = model_builder.build_model_type(cfg).training_run_opts(['a', 'b'], 32, 5, 1e-12)
    assert seen == [['a', 'b']]
    merge_cfg_from_list(opts + ['NUM_GPUS', '1'])
    derive()
    assert cfg.TRAIN.DATASETS == ('a', 'b')
    assert (cfg.TRAIN.RANK_IMS_PER_BATCH, cfg.TRAIN.IMS_PER_BATCH, cfg.SOLVER.MAX_ITER) == ((32,), 32, 6)
    assert cfg.SOLVER.BASE_LR == pytest.approx(1e-12, rel=1e-12)


def test_a_timed_detectron_run_types_the_batch_iterations_and_base_lr():
    merge_cfg_from_file(os.path.join(REPO, 'configs', 'e2e_faster_rcnn_R-50-FPN_2x.yaml'))
    opts = model_builder.build_model_type(cfg).training_run_opts(['a'], 3, 7, 0.5)
    merge_cfg_from_list(opts)
    assert (cfg.TRAIN.DATASETS, cfg.TRAIN.IMS_PER_BATCH, cfg.SOLVER.MAX_ITER, cfg.SOLVER.BASE_LR) == (('a',), 3, 7, 0.5)
