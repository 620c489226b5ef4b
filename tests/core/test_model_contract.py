"""The model contract: model types register where they are defined; a second model type,
registered by this test alone (tiny_model_type.py), trains, checkpoints, resumes, tests in one and
in two gloo processes and is evaluated through the unchanged engines."""
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

import tiny_model_type
from detectron.core import test_engine, train_engine
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_list
from detectron.datasets import dataset_catalog
from detectron.modeling import model_builder
from detectron.modeling.model_type import ModelType, register_model_type, unregister_model_type
from detectron.utils.errors import ConfigValueError
from support.tiny_runs import write_tiny_datasets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SUBDIR = os.path.join('train', 'tiny_train', 'tiny')
TEST_SUBDIR = os.path.join('test', 'tiny_val', 'tiny')


@pytest.fixture(autouse=True)
def tiny_type_registered(monkeypatch):
    tiny_model_type.register()
    monkeypatch.setattr(dataset_catalog, '_registered', {})
    yield
    tiny_model_type.unregister()


@pytest.fixture(scope='module')
def catalog(tmp_path_factory):
    return write_tiny_datasets(tmp_path_factory.mktemp('contract'))


def use_tiny_type(catalog, output_dir, *overrides):
    cfg.defrost()
    merge_cfg_from_list(['MODEL.TYPE', 'tiny', 'MODEL.NUM_CLASSES', '3', 'DATASET_CATALOG', str(catalog),
                         'TRAIN.DATASETS', "('tiny_train',)", 'TEST.DATASETS', "('tiny_val',)",
                         'TRAIN.IMS_PER_BATCH', '2', 'SOLVER.BASE_LR', '0.5', 'SOLVER.WARM_UP_ITERS', '0',
                         'SOLVER.MAX_ITER', '3', 'TRAIN.SNAPSHOT_ITERS', '2', 'DATA_LOADER.NUM_THREADS', '0',
                         'OUTPUT_DIR', str(output_dir)] + list(overrides))
    assert_and_infer_cfg()


def _final_state(output_dir):
    return torch.load(os.path.join(output_dir, TRAIN_SUBDIR, 'model_final.pth'), weights_only=True)


def test_model_types_are_registered_where_they_are_defined_and_built_bound_to_the_cfg(set_cfg):
    from detectron.modeling.centernet_builder import CenterNetType
    from detectron.modeling.rcnn_builder import GeneralizedRCNNType
    from detectron.modeling.retinanet_builder import RetinaNetType
    registered = model_builder.registered_model_types()
    deprecated = {'fast_rcnn', 'faster_rcnn', 'mask_rcnn', 'keypoint_rcnn', 'mask_and_keypoint_rcnn', 'rpn', 'fpn_rpn'}
    assert {name: registered[name] for name in set(registered) - deprecated} == {
        'generalized_rcnn': GeneralizedRCNNType, 'centernet': CenterNetType, 'retinanet': RetinaNetType,
        'tiny': tiny_model_type.TinyModelType}
    # Detectron's deprecated names build the R-CNN type (its model_builder.py's aliases)
    assert all(issubclass(registered[name], GeneralizedRCNNType) and registered[name].name == name
               for name in deprecated)
    assert (GeneralizedRCNNType.name, CenterNetType.name, tiny_model_type.TinyModelType.name) == (
        'generalized_rcnn', 'centernet', 'tiny')
    for name, model_type_class in model_builder.registered_model_types().items():
        set_cfg({'MODEL.TYPE': name})
        model_type = model_builder.build_model_type(cfg)
        assert type(model_type) is model_type_class and model_type.cfg is cfg


def test_a_name_registers_one_model_type_until_it_is_unregistered():
    class Other(ModelType):
        pass

    with pytest.raises(ValueError, match="MODEL.TYPE 'tiny' is registered already, by TinyModelType"):
        register_model_type('tiny')(Other)
    register_model_type('tiny')(tiny_model_type.TinyModelType)  # the same class again: nothing changes
    register_model_type('other')(Other)
    try:
        assert model_builder.registered_model_types()['other'] is Other and Other.name == 'other'
    finally:
        unregister_model_type('other')
    assert 'other' not in model_builder.registered_model_types()


def test_an_unknown_model_type_is_one_config_error_naming_the_registered_ones(set_cfg):
    set_cfg({'MODEL.TYPE': 'rfcn'})
    with pytest.raises(ConfigValueError) as err:
        model_builder.build_model_type(cfg)
    assert str(err.value) == ("MODEL.TYPE 'rfcn' is not supported; use one of 'centernet', "
                              "'generalized_rcnn', 'retinanet', 'tiny'")


def test_second_model_type_trains_resumes_and_tests_through_the_engines(catalog, tmp_path, capsys):
    first = tmp_path / 'first'
    use_tiny_type(catalog, first)
    train_engine.train_model()
    train_dir = first / TRAIN_SUBDIR
    assert sorted(os.listdir(train_dir)) == ['model_final.pth', 'model_iter1.pth', 'tensorboard',
                                             'training_curves.png']
    final = _final_state(first)
    # Three SGD steps moved the box towards the mean ground-truth box.
    assert not torch.equal(final['model']['box'], torch.tensor([0.0, 0.0, 8.0, 8.0]))
    assert 'box_error' in capsys.readouterr().out  # a non-loss output is logged as a metric

    # Resume: a copy of the run stopped after model_iter1 continues to the same final weights.
    resumed = tmp_path / 'resumed'
    os.makedirs(resumed / TRAIN_SUBDIR)
    shutil.copy(train_dir / 'model_iter1.pth', resumed / TRAIN_SUBDIR)
    use_tiny_type(catalog, resumed)
    train_engine.train_model()
    for key, value in final['model'].items():
        assert torch.equal(_final_state(resumed)['model'][key], value), key

    # Testing and evaluation through the same engine code.
    results = test_engine.run_inference(model_builder.build_model_type(cfg), str(train_dir / 'model_final.pth'))
    assert set(results['tiny_val']['box']) >= {'AP', 'AP50', 'AP75'}
    with open(resumed / TEST_SUBDIR / 'detections.pkl', 'rb') as f:  # cfg.OUTPUT_DIR is the resumed run's
        all_boxes = pickle.load(f)['all_boxes']
    assert len(all_boxes) == 3 and len(all_boxes[1]) == 8  # classes (background included) x images
    box = final['model']['box'].numpy()
    for image_boxes in all_boxes[1]:
        assert image_boxes.shape == (1, 5)
    # Image 0 is 96 wide: the detector maps the 32-px box back by 96 / 32.
    np.testing.assert_allclose(all_boxes[1][0][0, :4], box * 3, rtol=1e-6)


@pytest.mark.processes
def test_two_gloo_processes_test_the_second_model_type_as_one(catalog, tmp_path):
    use_tiny_type(catalog, tmp_path / 'single', 'SOLVER.MAX_ITER', '2')
    weights = train_engine.train_model()['final']
    test_engine.run_inference(model_builder.build_model_type(cfg), weights)
    single = tmp_path / 'single' / TEST_SUBDIR / 'detections.pkl'

    config = tmp_path / 'multi.yaml'
    values = yaml.safe_load(cfg.dump())
    values.update(OUTPUT_DIR=str(tmp_path / 'multi'), NUM_GPUS=2)
    config.write_text(yaml.safe_dump(values))
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}
    env.update(PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, 'tests', 'core')]), OMP_NUM_THREADS='1',
               CUDA_VISIBLE_DEVICES='')
    done = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
                           tiny_model_type.__file__, str(config), weights],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(single, 'rb') as f:
        expected = pickle.load(f)['all_boxes']
    with open(tmp_path / 'multi' / TEST_SUBDIR / 'detections.pkl', 'rb') as f:
        actual = pickle.load(f)['all_boxes']
    assert len(actual) == len(expected)
    for actual_j, expected_j in zip(actual[1:], expected[1:]):
        assert len(actual_j) == len(expected_j) == 8
        for a, e in zip(actual_j, expected_j):
            np.testing.assert_array_equal(a, e)


def test_the_unported_pred_std_variant_is_one_config_error():
    # KL-Loss's PRED_STD_LOG False head (sigma^2 itself) would be read as log(sigma^2) everywhere.
    from detectron.core.config import merge_cfg_from_file
    from detectron.modeling import rcnn_builder
    from detectron.utils.errors import ConfigValueError
    merge_cfg_from_file(os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'e2e_faster_rcnn_R-50-FPN_2x.yaml'))
    merge_cfg_from_list(['PRED_STD', 'True', 'PRED_STD_LOG', 'False'])
    with pytest.raises(ConfigValueError, match='PRED_STD_LOG False .* is not ported'):
        rcnn_builder.check_supported(cfg)
    cfg.PRED_STD_LOG = True
    rcnn_builder.check_supported(cfg)


@pytest.mark.parametrize('key, value', [('FPN.ROI_MIN_LEVEL', '3'), ('FPN.RPN_MAX_LEVEL', '5'),
                                        ('FPN.ROI_MAX_LEVEL', '6'), ('FPN.RPN_MIN_LEVEL', '3')])
def test_fpn_levels_other_than_the_bodys_are_one_config_error(key, value):
    # The body gives P2..P6; other levels would pool or anchor on the wrong maps.
    from detectron.core.config import merge_cfg_from_file
    from detectron.modeling import rcnn_builder
    from detectron.utils.errors import ConfigValueError
    merge_cfg_from_file(os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'e2e_faster_rcnn_R-50-FPN_2x.yaml'))
    rcnn_builder.check_supported(cfg)
    merge_cfg_from_list([key, value])
    with pytest.raises(ConfigValueError, match='are not supported: the FPN body gives P2..P6'):
        rcnn_builder.check_supported(cfg)


def test_the_proposal_decode_reads_the_configured_clips():
    from detectron.core.config import merge_cfg_from_file
    from detectron.modeling import rcnn_builder
    merge_cfg_from_file(os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'e2e_faster_rcnn_R-50-FPN_2x.yaml'))
    merge_cfg_from_list(['BBOX_XFORM_CLIP', '2.5', 'BBOX_XFORM_CLIPe', '7.0'])
    assert rcnn_builder.rcnn_params(cfg, 5).bbox_xform_clips == (2.5, 7.0)


def test_design_doc_lists_exactly_the_contract_methods():
    """docs/DESIGN.md's contract table names every public method of ModelType, and nothing else."""
    import inspect
    import os
    import re

    from detectron.modeling.model_type import ModelType
    design = os.path.join(os.path.dirname(__file__), '..', '..', 'docs', 'DESIGN.md')
    text = open(design, encoding='utf-8').read()
    table = text[text.index('| method | what the entry says |'):]
    table = table[:table.index('\n\n')]
    listed = set()
    for row in table.splitlines()[2:]:
        listed.update(re.findall(r'`([a-z_]+)\(', row.split('|')[1]))
        listed.update(re.findall(r'`([a-z_]+)`', row.split('|')[1]))
    methods = {name for name, _ in inspect.getmembers(ModelType, inspect.isfunction) if not name.startswith('_')}
    assert listed == methods


def test_detectron_retention_keeps_the_newest_keep_checkpoints(catalog, tmp_path):
    use_tiny_type(catalog, tmp_path, 'SOLVER.MAX_ITER', '6', 'TRAIN.KEEP_CHECKPOINTS', '1')
    train_engine.train_model()
    # Checkpoints after iterations 1, 3 and 5; the two older ones removed as the next was written.
    assert sorted(os.listdir(tmp_path / TRAIN_SUBDIR)) == ['model_final.pth', 'model_iter5.pth', 'tensorboard',
                                                           'training_curves.png']


def test_a_model_types_retention_keeps_model_last_and_the_lr_steps_and_resumes_from_model_last(
        catalog, tmp_path, monkeypatch, caplog):
    # The tiny type keeps checkpoints as CenterNet does; its LR drops at iteration 3.
    monkeypatch.setattr(tiny_model_type.TinyModelType, 'checkpoint_retention',
                        model_builder.registered_model_types()['centernet'].checkpoint_retention)
    schedule = ('SOLVER.LR_POLICY', 'steps_with_decay', 'SOLVER.STEPS', '[0, 3]', 'SOLVER.MAX_ITER', '6')
    use_tiny_type(catalog, tmp_path / 'whole', *schedule)
    train_engine.train_model()
    train_dir = tmp_path / 'whole' / TRAIN_SUBDIR
    assert sorted(os.listdir(train_dir)) == ['model_final.pth', 'model_iter2.pth', 'model_last.pth', 'tensorboard',
                                             'training_curves.png']
    assert torch.load(train_dir / 'model_last.pth', weights_only=True)['iteration'] == 5
    assert torch.load(train_dir / 'model_iter2.pth', weights_only=True)['iteration'] == 2
    final = _final_state(tmp_path / 'whole')

    # Stopped after iteration 3 (model_final removed, as if killed before it): auto-resume finds model_last.
    use_tiny_type(catalog, tmp_path / 'stopped', *schedule[:4], 'SOLVER.MAX_ITER', '4')
    train_engine.train_model()
    os.remove(tmp_path / 'stopped' / TRAIN_SUBDIR / 'model_final.pth')
    use_tiny_type(catalog, tmp_path / 'stopped', *schedule)
    with caplog.at_level('INFO'):
        train_engine.train_model()
    assert 'Resuming from checkpoint {}'.format(tmp_path / 'stopped' / TRAIN_SUBDIR / 'model_last.pth') in caplog.text
    for key, value in final['model'].items():
        assert torch.equal(_final_state(tmp_path / 'stopped')['model'][key], value), key
