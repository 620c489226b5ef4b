"""--mode demo: the CPU demos of the README ("Start here") as rows. For each of --demo-cfgs (default
--cfg), one after the other, `tools/train_net.py --cfg <config> OUTPUT_DIR <fresh directory> <overrides>`
runs once as a subprocess: the command a user types, training then the test of the final model, in a
process of its own with nothing to resume. A row is its wall clock in minutes, read with the seconds per
iteration (json_stats 'time'), the test's seconds (`Total inference time`) and the final evaluation's
headline metrics (copypaste lines) from its log, the threads it computes on and the CPU it ran on."""
import os
import platform
import subprocess
import sys
import time

from detectron.utils.errors import ConfigValueError

from .logs import eval_log_results, json_stats, run_logged, test_log_inference_s, train_log_s_per_iter
from .timing import Row

# Per task, the metrics a row keeps (those the task has): AP and AP50, or an RPN's proposal recall.
HEADLINE_METRICS = ('AP', 'AP50', 'AR@100', 'AR@1000')
# The instructions the demos' CPU speed turns on: AVX-512, bfloat16 dot products (CenterNet's demo
# trains in bfloat16 only with them or AMX), AMX tiles (every flag named amx*).
SPEED_FLAGS = ('avx512f', 'avx512_bf16')


def demo_cfgs(args):
    return args.demo_cfgs or [args.cfg]


def check_demo_args(args):
    """Refuse what would make a row other than the demo's fresh run: a config file that is not there
    (found before any earlier demo has run for minutes), or an OUTPUT_DIR of the user's, where
    train_net would resume from a checkpoint left there."""
    missing = [f for f in demo_cfgs(args) if not os.path.isfile(f)]
    if missing:
        raise ConfigValueError('--mode demo: no config file {}'.format(', '.join(missing)))
    if 'OUTPUT_DIR' in args.opts[::2]:
        raise ConfigValueError('--mode demo runs train_net in a fresh OUTPUT_DIR of its own (under --loop-dir '
                               'if given); drop OUTPUT_DIR from the overrides')


def run_demos(args, report, new_dir):
    """One row per demo config, run in turn (two trainings at once would slow each other many times
    over); new_dir() gives each its fresh directory."""
    machine = dict(cpu_description(), threads=child_threads())
    for cfg_file in demo_cfgs(args):
        report.add_row(demo_row(cfg_file, args.opts, new_dir(), machine))


def demo_row(cfg_file, opts, work, machine):
    """train_net on cfg_file with opts, its log and OUTPUT_DIR (output/) in work; its row."""
    log_path = os.path.join(work, 'train_net.log')
    # On stderr, so that stdout stays the report: a demo runs for minutes, its log can be followed.
    print('{}: train_net.py running, its log {}'.format(os.path.basename(cfg_file), log_path), file=sys.stderr,
          flush=True)
    tic = time.perf_counter()
    text = run_logged('train_net.py', ['--cfg', os.path.abspath(cfg_file), 'OUTPUT_DIR', os.path.join(work, 'output')]
                      + list(opts), log_path)
    return row_from_log(os.path.basename(cfg_file), time.perf_counter() - tic, text, dict(machine, log=log_path))


def row_from_log(name, wall_s, log_text, info):
    """The demo's row: minutes of the whole run, and what its log tells."""
    test_s = test_log_inference_s(log_text)
    return Row('demo', name, None, None, values=[wall_s / 60.0], info=dict(
        wall_s=round(wall_s, 1), s_per_iter=train_log_s_per_iter(json_stats(log_text)),
        test_s=sum(test_s) if test_s else None, metrics=headline_metrics(eval_log_results(log_text)), **info))


def headline_metrics(results):
    """{'<task> <metric>': value} of HEADLINE_METRICS for every task, the dataset's name first when
    the run tested several."""
    return {'{}{} {}'.format(dataset + ' ' if len(results) > 1 else '', task, metric): metrics[metric]
            for dataset, tasks in results.items() for task, metrics in tasks.items()
            for metric in HEADLINE_METRICS if metric in metrics}


def child_threads():
    """torch.get_num_threads() in a process started as train_net is (this environment, OMP_NUM_THREADS
    as the user has it): the threads a one-process demo computes on."""
    probe = subprocess.run([sys.executable, '-c', 'import torch; print(torch.get_num_threads())'],
                           capture_output=True, text=True, check=True)
    return int(probe.stdout)


def cpu_description(cpuinfo='/proc/cpuinfo'):
    """{'cpu': its model name, 'cpu_flags': those of SPEED_FLAGS and amx* it has} from cpuinfo's first
    processor; without the file (not Linux) the platform's processor name and flags None (unknown)."""
    try:
        with open(cpuinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return {'cpu': platform.processor() or platform.machine(), 'cpu_flags': None}
    fields = {}
    for line in lines:
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get('flags', '').split()
    return {'cpu': fields.get('model name') or platform.processor() or platform.machine(),
            'cpu_flags': [f for f in flags if f in SPEED_FLAGS or f.startswith('amx')]}
