"""The command lines as a user runs them: help, --print-config, overrides, one-line errors."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from detectron.core import launch
from support.tools import load_tool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIAL_8GPU = 'configs/getting_started/tutorial_8gpu_e2e_faster_rcnn_R-50-FPN.yaml'


def _run(tool, *args):
    return subprocess.run([sys.executable, os.path.join('tools', tool)] + list(args), cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def _printed_config(stdout):
    """The YAML part of --print-config output (train_net appends the schedule after a blank line)."""
    return yaml.safe_load(stdout.split('\n\nimages per iteration')[0])


@pytest.mark.processes
@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
def test_no_arguments_prints_help_and_exits_1(tool):
    result = _run(tool)
    assert result.returncode == 1
    assert result.stdout.startswith('usage: {}'.format(tool))


@pytest.mark.processes
@pytest.mark.parametrize('tool, flags', [
    ('train_net.py', ['--cfg CFG_FILE, -c CFG_FILE', '--multi-gpu-testing', '--skip-test', '--print-config', 'opts']),
    ('test_net.py', ['--cfg CFG_FILE, -c CFG_FILE', '--multi-gpu-testing', '--range START END', '--vis',
                     '--print-config', 'opts']),
])
def test_help_documents_every_argument(tool, flags):
    result = _run(tool, '-h')
    assert result.returncode == 0
    for flag in flags:
        assert flag in result.stdout


@pytest.mark.processes
def test_print_config_with_overrides_and_schedule():
    result = _run('train_net.py', '-c', TUTORIAL_8GPU, '--print-config', 'NUM_GPUS', '2', 'SOLVER.BASE_LR', '0.005',
                  'SOLVER.WARMUP_ITERS', '1000')
    assert result.returncode == 0, result.stderr
    printed = _printed_config(result.stdout)
    assert printed['NUM_GPUS'] == 2
    assert printed['SOLVER']['BASE_LR'] == 0.005
    assert printed['SOLVER']['WARM_UP_ITERS'] == 1000
    assert printed['MODEL']['CONV_BODY'] == 'FPN.add_fpn_ResNet50_conv5_body'
    assert printed['RPN']['RPN_ON'] is True  # printed after assert_and_infer_cfg
    assert 'images per iteration: 4 (NUM_GPUS 2 x TRAIN.IMS_PER_BATCH 2 x SOLVER.ITER_SIZE 1)' in result.stdout
    assert 'LR step: iteration 3750 -> LR 0.0005' in result.stdout


@pytest.mark.processes
def test_print_config_applies_the_linear_scaling_rule():
    result = _run('train_net.py', '--cfg', TUTORIAL_8GPU, '--print-config', 'SOLVER.REFERENCE_WORLD_BATCH', '16',
                  'NUM_GPUS', '2')
    assert result.returncode == 0, result.stderr
    solver = _printed_config(result.stdout.split('\n', 1)[1])['SOLVER']  # first line: the scaling log
    assert (solver['BASE_LR'], solver['MAX_ITER'], solver['STEPS']) == (0.005, 30000, [0, 15000, 20000])
    assert 'SOLVER.MAX_ITER: 7500 -> 30000' in result.stdout.split('\n', 1)[0]


@pytest.mark.processes
def test_test_net_print_config_with_vis():
    result = _run('test_net.py', '-c', TUTORIAL_8GPU, '--vis', '--print-config', 'TEST.NMS', '0.6')
    assert result.returncode == 0, result.stderr
    printed = _printed_config(result.stdout)
    assert printed['VIS'] is True
    assert printed['TEST']['NMS'] == 0.6


@pytest.mark.processes
@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
@pytest.mark.parametrize('args, message', [
    (['SOLVER.BASE_LRR', '0.1'],
     'error: Non-existent key: SOLVER.BASE_LRR (from command line); closest valid key: SOLVER.BASE_LR'),
    (['TEST.SCALE', '800.0'],
     'error: Config key TEST.SCALE expects an integer (default: 600) but got float 800.0 (from command line)'),
    (['--cfg', 'configs/no_such_file.yaml'], 'error: Cannot read config file configs/no_such_file.yaml: No such file'),
    (['TEST.DATASET', 'coco_2014_minival'], 'error: Key TEST.DATASET was renamed to TEST.DATASETS;'),
    (['NUM_GPUS'], 'error: Config overrides must come in KEY VALUE pairs'),
])
def test_user_errors_are_one_line(tool, args, message):
    result = _run(tool, '--print-config', *args)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count('\n') == 1
    assert 'Traceback' not in result.stderr + result.stdout


@pytest.mark.processes
@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
@pytest.mark.parametrize('args, message', [
    (['SOLVER.BASE_LRR', '0.1'], 'error: Non-existent key: SOLVER.BASE_LRR'),
    (['TEST.NMS', '1.5'], 'error: TEST.NMS must be'),  # a domain check
    (['-h'], None),
])
def test_command_line_mistakes_and_help_come_before_torch_is_imported(tool, args, message):
    result = subprocess.run([sys.executable, '-X', 'importtime', os.path.join('tools', tool),
                             '-c', 'configs/getting_started/shapes_demo_R-18-FPN.yaml', *args], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    imported = {line.rsplit('|', 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith('import time:')}
    assert 'detectron.core.config' in imported and 'yaml' in imported  # the import log is complete
    assert 'torch' not in imported
    if message is None:
        assert result.returncode == 0 and result.stdout.startswith('usage: ' + tool)
    else:
        assert result.returncode == 2 and result.stderr.splitlines()[-1].startswith(message)


@pytest.mark.processes
def test_malformed_yaml_is_one_line(tmp_path):
    path = tmp_path / 'bad.yaml'
    path.write_text('SOLVER:\n  BASE_LR: [0.1\n')
    result = _run('train_net.py', '--cfg', str(path), '--print-config')
    assert result.returncode == 2
    assert result.stderr.startswith('error: Invalid YAML in {}: line 3, column 1: '.format(path))
    assert result.stderr.count('\n') == 1
    assert 'Traceback' not in result.stderr


@pytest.mark.processes
def test_test_net_without_weights_is_a_user_error():
    result = _run('test_net.py', '-c', TUTORIAL_8GPU, 'TEST.DATASETS', 'coco_2014_minival')
    assert result.returncode == 2
    assert result.stderr == 'error: TEST.WEIGHTS is empty: name the model to test, e.g. TEST.WEIGHTS model_final.pth\n'


def test_range_parses_to_two_ints():
    args = load_tool('test_net.py').parse_args(['--range', '0', '5', '-c', 'x.yaml', 'TEST.NMS', '0.5'])
    assert args.range == [0, 5]
    assert args.cfg_file == 'x.yaml'
    assert args.opts == ['TEST.NMS', '0.5']


@pytest.mark.parametrize('bounds', [['5', '0'], ['3', '3'], ['-1', '4']])
def test_range_must_be_increasing_and_non_negative(bounds, capsys):
    with pytest.raises(SystemExit) as err:
        load_tool('test_net.py').parse_args(['--range'] + bounds)
    assert err.value.code == 2
    assert '--range needs 0 <= START < END' in capsys.readouterr().err


def test_train_net_flags():
    args = load_tool('train_net.py').parse_args(['-c', 'a.yaml', '--skip-test', '--multi-gpu-testing', 'NUM_GPUS', '8'])
    assert (args.cfg_file, args.skip_test, args.multi_gpu_testing, args.print_config) == ('a.yaml', True, True, False)
    assert args.opts == ['NUM_GPUS', '8']


@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
@pytest.mark.parametrize('flags, multi_gpu_testing', [
    ([], False), (['--multi-gpu-testing'], True), (['--single-gpu-testing'], False)])
def test_testing_flags_of_detectron_and_kl_loss(tool, flags, multi_gpu_testing):
    args = load_tool(tool).parse_args(['-c', 'a.yaml'] + flags + ['NUM_GPUS', '8'])
    assert args.multi_gpu_testing is multi_gpu_testing
    assert args.opts == ['NUM_GPUS', '8']


@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
def test_single_and_multi_gpu_testing_exclude_each_other(tool, capsys):
    with pytest.raises(SystemExit) as err:
        load_tool(tool).parse_args(['--multi-gpu-testing', '--single-gpu-testing'])
    assert err.value.code == 2
    assert 'not allowed with argument' in capsys.readouterr().err


def test_test_net_accepts_detectrons_wait_flag():
    args = load_tool('test_net.py').parse_args(['-c', 'a.yaml', '--wait', 'False', 'TEST.NMS', '0.5'])
    assert args.opts == ['TEST.NMS', '0.5']


@pytest.mark.processes
@pytest.mark.parametrize('tool, extra', [('train_net.py', []), ('test_net.py', ['TEST.WEIGHTS', 'x.pth'])])
def test_unsupported_model_is_one_error_before_any_process_starts(tool, extra):
    # The CenterNet config asks for NUM_GPUS 4: the error must come once, from the tool itself.
    result = _run(tool, '--cfg', 'configs/centernet/ctdet_coco_resdcn18.yaml', *extra, 'MODEL.TYPE', 'yolo')
    assert result.returncode == 2
    assert result.stderr == ("error: MODEL.TYPE 'yolo' is not supported; use one of 'centernet', "
                             "'generalized_rcnn', 'retinanet'\n")


@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
@pytest.mark.parametrize('args', [
    ['-c', TUTORIAL_8GPU, 'NUM_GPUS', '2', 'SOLVER.BASE_LR', '-1e-3', '--print-config', 'TEST.NMS', '0.4'],
    ['NUM_GPUS', '2', '--cfg', TUTORIAL_8GPU, 'SOLVER.BASE_LR', '-1e-3', 'TEST.NMS', '0.4', '--print-config'],
])
def test_flags_are_accepted_anywhere_among_the_overrides(tool, args):
    parsed = load_tool(tool).parse_args(args)
    assert (parsed.cfg_file, parsed.print_config) == (TUTORIAL_8GPU, True)
    assert parsed.opts == ['NUM_GPUS', '2', 'SOLVER.BASE_LR', '-1e-3', 'TEST.NMS', '0.4']


@pytest.mark.processes
def test_print_config_after_the_overrides_prints_the_config():
    result = _run('train_net.py', '-c', TUTORIAL_8GPU, 'NUM_GPUS', '2', 'TEST.NMS', '0.4', '--print-config')
    assert result.returncode == 0, result.stderr
    printed = _printed_config(result.stdout)
    assert (printed['NUM_GPUS'], printed['TEST']['NMS']) == (2, 0.4)


def test_infer_simple_takes_flags_after_the_overrides():
    args = load_tool('infer_simple.py').parse_args(['--cfg', 'a.yaml', 'demo/', 'TEST.SCALE', '500', '--wts', 'm.pth',
                                                     '--thresh', '-0.5'])
    assert (args.wts, args.im_or_folder, args.opts, args.thresh) == ('m.pth', 'demo/', ['TEST.SCALE', '500'], -0.5)


@pytest.mark.processes
@pytest.mark.parametrize('tool', ['train_net.py', 'test_net.py'])
def test_a_negative_learning_rate_is_one_line(tool):
    result = _run(tool, '-c', TUTORIAL_8GPU, 'SOLVER.BASE_LR', '-0.02', '--print-config')
    assert (result.returncode, result.stderr) == (2, 'error: SOLVER.BASE_LR must be a finite number > 0, got -0.02\n')


@pytest.mark.processes
def test_a_binary_file_as_cfg_is_one_line(tmp_path):
    path = tmp_path / 'model_final.pth'
    path.write_bytes(bytes(range(256)))
    result = _run('train_net.py', '--cfg', str(path), '--print-config')
    assert result.returncode == 2
    assert result.stderr.startswith('error: Config file {} is not a YAML text file'.format(path))
    assert result.stderr.count('\n') == 1 and 'Traceback' not in result.stderr


@pytest.mark.processes
def test_an_output_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / 'a_file').write_text('')
    result = _run('train_net.py', '--cfg', 'configs/getting_started/shapes_demo_R-18-FPN.yaml',
                  'OUTPUT_DIR', str(tmp_path / 'a_file' / 'out'))
    assert result.returncode == 2
    assert result.stderr.startswith('error: OUTPUT_DIR {} cannot be used: '.format(tmp_path / 'a_file' / 'out'))
    assert result.stderr.count('\n') == 1 and 'Traceback' not in result.stderr


@pytest.mark.parametrize('spelling', [['--local-rank=1'], ['--local_rank', '1']])
def test_the_launchers_local_rank_flag_sets_or_matches_local_rank(spelling, monkeypatch):
    train_net = load_tool('train_net.py')
    monkeypatch.setenv('LOCAL_RANK', '')  # records the variable's state, so the flag's setting is undone
    monkeypatch.delenv('LOCAL_RANK')
    args = train_net.parse_args(['--cfg', TUTORIAL_8GPU] + spelling)
    assert args.local_rank == 1 and os.environ['LOCAL_RANK'] == '1'
    monkeypatch.setenv('LOCAL_RANK', '0')
    with pytest.raises(SystemExit) as exit_info:
        train_net.parse_args(['--cfg', TUTORIAL_8GPU] + spelling)
    assert exit_info.value.code == 2


@pytest.mark.slow
@pytest.mark.processes
def test_torch_distributed_launch_trains_as_torchrun(tmp_path):
    # The CenterNet guide's launcher: it passes --local-rank=N to each of its processes.
    env = {k: v for k, v in os.environ.items()
           if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS='1')
    port = str(launch._free_local_port())
    done = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.launch', '--nproc_per_node', '2', '--master_port', port,
         'tools/train_net.py', '--cfg', 'configs/getting_started/shapes_demo_R-18-FPN.yaml', '--skip-test',
         'SOLVER.MAX_ITER', '2', 'DATA_LOADER.NUM_THREADS', '0', 'OUTPUT_DIR', str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert 'images per iteration: 8 (NUM_GPUS 2 x TRAIN.IMS_PER_BATCH 4' in output
    assert os.path.exists(os.path.join(tmp_path, 'train', 'shapes_train', 'generalized_rcnn', 'model_final.pth'))
    # OUTPUT_DIR/log.txt: rank 0's log, its start marked once; rank 1 had no error to add.
    log = (tmp_path / 'log.txt').read_text().splitlines()
    assert log[0].startswith('=== started ') and log[0].endswith(
        ': tools/train_net.py --local-rank=0 ' + shlex.join(done.args[8:]))
    assert sum(line.startswith('=== started ') for line in log) == 1
    assert [line for line in log if line.startswith('json_stats: ')] == [
        line for line in done.stdout.splitlines() if line.startswith('json_stats: ')]
    assert not any(line.startswith('rank 1: ') for line in log)
