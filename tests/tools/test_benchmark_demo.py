"""tools/benchmark.py --mode demo: a tiny demo run through main as a subprocess, its row checked against
the outputs it wrote (COCOeval run here on its results files) and its log read another way; the
evaluation's copypaste lines as task_evaluation logs them; the demos run in turn in fresh directories;
the CPU description and the refusals."""
import glob
import logging
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from detectron.datasets import task_evaluation
from detectron.utils.errors import ConfigValueError
from detectron.utils.logging import log_json_stats
from support.tiny_runs import TINY_OVERRIDES, json_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASK_DEMO = 'configs/getting_started/shapes_demo_mask_R-18-FPN.yaml'
BOX_DEMO = 'configs/getting_started/shapes_demo_R-18-FPN.yaml'
sys.path.insert(0, os.path.join(REPO, 'tools'))  # as when tools/benchmark.py runs

from benchmark_lib import cli, demo_rows, logs, report  # noqa: E402


def _coco_stats(ann_file, results_file, iou_type):
    coco = COCO(ann_file)
    evaluation = COCOeval(coco, coco.loadRes(results_file), iou_type)
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return evaluation.stats


# --- a tiny demo, end to end ----------------------------------------------------------------------

@pytest.mark.processes
def test_a_tiny_mask_demo_row_reads_what_the_run_wrote(tiny_catalog, tmp_path, monkeypatch):
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    report = cli.main(['--mode', 'demo', '--cfg', MASK_DEMO, '--loop-dir', str(tmp_path), '--']
                      + TINY_OVERRIDES + ['DATASET_CATALOG', str(tiny_catalog)])
    (record,) = report.records
    assert (record['section'], record['row'], record['unit']) == ('demo', 'shapes_demo_mask_R-18-FPN.yaml', 'min')
    log = open(record['log']).read()
    output = os.path.join(os.path.dirname(record['log']), 'output')
    assert os.path.isdir(os.path.join(output, 'train')) and 'Resuming from checkpoint' not in log

    # The final APs against COCOeval on the results files the run left, to the log's 4 decimals.
    ann_file = str(tiny_catalog.parent / 'all.json')
    results = logs.eval_log_results(log)
    assert list(results) == ['tiny_val'] and list(results['tiny_val']) == ['box', 'mask']
    for task, iou_type, prefix in (('box', 'bbox', 'bbox'), ('mask', 'segm', 'segmentations')):
        (results_file,) = glob.glob(os.path.join(output, 'test', 'tiny_val', '*', prefix + '_tiny_val_results.json'))
        stats = _coco_stats(ann_file, results_file, iou_type)
        logged = [results['tiny_val'][task][m] for m in ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl')]
        assert np.abs(np.array(logged) - stats[:6]).max() <= 5e-5 + 1e-12, (task, logged, stats[:6])
        assert record['metrics'][task + ' AP'] == logged[0] and record['metrics'][task + ' AP50'] == logged[1]
    assert sorted(record['metrics']) == ['box AP', 'box AP50', 'mask AP', 'mask AP50']

    # Seconds per iteration and the test's seconds, the log read by other means.
    _, stats = json_stats(log)
    assert len(stats) == 2 and record['s_per_iter'] == pytest.approx(np.median([float(s['time']) for s in stats]))
    (total,) = [line.rsplit(' ', 1)[1] for line in log.splitlines() if 'Total inference time' in line]
    assert record['test_s'] == float(total.rstrip('s'))
    assert record['median'] * 60 == pytest.approx(record['wall_s'], abs=0.05) and record['wall_s'] > record['test_s']
    assert record['threads'] == 1 and record['cpu'] == demo_rows.cpu_description()['cpu']


# --- the log's lines as the tools write them ------------------------------------------------------

def _evaluation_log(caplog, results):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=task_evaluation.logger.name):
        task_evaluation.log_copy_paste_friendly_results(results)
    return '\n'.join('INFO task_evaluation.py:  90: ' + r.getMessage() for r in caplog.records)


def test_copypaste_lines_of_several_datasets_and_tasks(caplog):
    box = dict(zip(task_evaluation.box_metric_names(), np.linspace(0.1, 0.9, 12).round(4).tolist()))
    recall = {'AR@100': 0.6232, 'ARs@100': 0.5, 'AR@1000': 0.635}
    results = {'shapes_val': {'box': box, 'mask': dict(box, AP=0.25)}, 'shapes_train': {'box_proposal': recall}}
    text = _evaluation_log(caplog, results)
    assert logs.eval_log_results(text) == results
    assert demo_rows.headline_metrics(results) == {
        'shapes_val box AP': 0.1, 'shapes_val box AP50': box['AP50'], 'shapes_val mask AP': 0.25,
        'shapes_val mask AP50': box['AP50'], 'shapes_train box_proposal AR@100': 0.6232,
        'shapes_train box_proposal AR@1000': 0.635}
    # A later evaluation of a dataset replaces the earlier one; one dataset needs no name in the row.
    later = {'shapes_val': {'box': dict(box, AP=0.5)}}
    assert logs.eval_log_results(text + '\n' + _evaluation_log(caplog, later)) == dict(results, **later)
    assert demo_rows.headline_metrics(later) == {'box AP': 0.5, 'box AP50': box['AP50']}


def test_row_from_a_log_of_json_stats_test_and_evaluation(caplog, capsys):
    for i, t in ((0, 1.5), (19, 0.5), (39, 0.25), (40, None), (49, 0.75)):
        log_json_stats({'iter': i, 'time': t} if t is not None else {'iter': i, 'box/AP': 0.3})  # 40: an evaluation
    text = capsys.readouterr().out + 'INFO test_engine.py:  80: Total inference time: 12.500s\n'
    text += _evaluation_log(caplog, {'shapes_val': {'box': {'AP': 0.7462, 'AP50': 0.9128, 'AP75': 0.8696}}})
    row = demo_rows.row_from_log('demo.yaml', 90.0, text, {'threads': 2, 'log': 'x.log'})
    assert (row.section, row.name, row.unit, row.values) == ('demo', 'demo.yaml', 'min', [1.5])
    assert row.info == {'wall_s': 90.0, 's_per_iter': 0.625, 'test_s': 12.5, 'threads': 2, 'log': 'x.log',
                        'metrics': {'box AP': 0.7462, 'box AP50': 0.9128}}
    # Two tested datasets: their inference seconds add up; no test at all (--skip-test's log): None.
    twice = text + '\nINFO test_engine.py:  80: Total inference time: 2.000s\n'
    assert demo_rows.row_from_log('d', 1.0, twice, {}).info['test_s'] == 14.5
    untested = demo_rows.row_from_log('d', 1.0, text.split('INFO test_engine')[0], {})
    assert untested.info['test_s'] is None and untested.info['metrics'] == {}
    with pytest.raises(ConfigValueError):
        logs.train_log_s_per_iter(logs.json_stats('json_stats: {"iter": 40, "box/AP": 0.3}\n'))


# --- the demos in turn, the machine ---------------------------------------------------------------

def test_demos_run_in_turn_each_in_a_fresh_output_dir(monkeypatch, tmp_path, capsys):
    calls = []

    def run_logged(tool, tool_args, log_path):
        calls.append((tool, tool_args, log_path, os.path.exists(tool_args[3])))
        return 'json_stats: {"iter": 0, "time": "0.5"}\n'

    monkeypatch.setattr(demo_rows, 'run_logged', run_logged)
    monkeypatch.setattr(demo_rows, 'child_threads', lambda: 7)
    args = cli.parse_args(['--mode', 'demo', '--demo-cfgs', BOX_DEMO, MASK_DEMO, '--loop-dir', str(tmp_path), '--',
                           'SOLVER.MAX_ITER', '4'])
    rep = report.Report({'command': 'benchmark.py'})
    demo_rows.run_demos(args, rep, lambda: cli.work_dir(args, 'demo'))
    rows = rep.records
    assert [r['row'] for r in rows] == [os.path.basename(BOX_DEMO), os.path.basename(MASK_DEMO)]
    assert [c[1][:2] for c in calls] == [['--cfg', os.path.join(REPO, BOX_DEMO)], ['--cfg', os.path.join(REPO, MASK_DEMO)]]
    assert all(tool == 'train_net.py' and a[2] == 'OUTPUT_DIR' and a[4:] == ['SOLVER.MAX_ITER', '4'] and not existed
               for tool, a, _, existed in calls)
    dirs = [os.path.dirname(log) for _, _, log, _ in calls]
    assert len(set(dirs)) == 2 and all(os.path.dirname(d) == str(tmp_path) for d in dirs)
    assert [c[1][3] for c in calls] == [os.path.join(d, 'output') for d in dirs]
    assert all(r['threads'] == 7 and r['log'] == os.path.join(d, 'train_net.log') and r['s_per_iter'] == 0.5
               for r, d in zip(rows, dirs))
    # Each run announced on stderr with its log (stdout is the report's).
    assert capsys.readouterr().err.splitlines() == ['{}: train_net.py running, its log {}'.format(r['row'], r['log'])
                                                    for r in rows]


def test_cpu_description_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / 'cpuinfo'
    cpuinfo.write_text('processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n'
                       'flags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8\n\n'
                       'processor\t: 1\nmodel name\t: another\nflags\t\t: fpu\n')
    assert demo_rows.cpu_description(str(cpuinfo)) == {
        'cpu': 'Intel(R) Xeon(R) Platinum 8480+', 'cpu_flags': ['avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile',
                                                                'amx_int8']}
    cpuinfo.write_text('processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n')
    assert demo_rows.cpu_description(str(cpuinfo)) == {'cpu': 'AMD EPYC', 'cpu_flags': []}
    assert demo_rows.cpu_description(str(tmp_path / 'absent'))['cpu_flags'] is None


# --- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize('argv, message', [
    (['--mode', 'demo', '--cfg', BOX_DEMO, 'OUTPUT_DIR', '/tmp/mine'], 'drop OUTPUT_DIR'),
    (['--mode', 'demo', '--demo-cfgs', BOX_DEMO, 'configs/nowhere.yaml'], 'no config file configs/nowhere.yaml'),
    (['--mode', 'train', '--demo-cfgs', BOX_DEMO], '--demo-cfgs is read by --mode demo only'),
])
def test_refusals(argv, message):
    with pytest.raises(ConfigValueError, match=message):
        cli.parse_args(argv)


@pytest.mark.processes
def test_the_tool_refuses_with_one_error_line():
    result = subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'benchmark.py'), '--mode', 'demo',
                             '--demo-cfgs', 'configs/nowhere.yaml'], cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2 and result.stderr.splitlines() == [
        'error: --mode demo: no config file configs/nowhere.yaml'], shlex.join(result.args) + '\n' + result.stderr
