"""The tools run as subprocesses and their logs read: train_net's json_stats, test_net's im_detect lines,
the evaluation's copypaste lines."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from detectron.utils.errors import ConfigValueError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_logged(tool, tool_args, log_path, stop_when=None):
    """Run tools/<tool> with this checkout first on the path; returns its log text. stop_when(log
    text) -> True ends the run there, its process group terminated (a loop timed up to one line)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1',
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get('PYTHONPATH')) if p))
    with open(log_path, 'w') as log:
        process = subprocess.Popen([sys.executable, os.path.join(REPO, 'tools', tool)] + tool_args, cwd=REPO,
                                   stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=stop_when is not None)
        code = _wait(process, log_path, stop_when)
    with open(log_path) as log:
        text = log.read()
    if code != 0:
        raise RuntimeError('{} exited with status {}; its log is {}'.format(tool, code, log_path))
    return text


def _wait(process, log_path, stop_when, poll_s=0.2):
    """The exit status, or 0 once stop_when holds for the log (the process and its loader workers,
    one process group, are then terminated). With stop_when the tool runs in a session of its own,
    which a Ctrl-C here does not reach: it is terminated too when the wait ends in an exception."""
    try:
        while stop_when is not None and process.poll() is None:
            with open(log_path) as log:
                if stop_when(log.read()):
                    _terminate(process)
                    return 0
            time.sleep(poll_s)
        return process.wait()
    except BaseException:
        if stop_when is not None:
            _terminate(process)
        raise


def _terminate(process):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    process.wait()


_IM_DETECT = re.compile(r'im_detect:.*?(\d+)/(\d+)\s+([0-9.]+)s \+ ([0-9.]+)s')


LOOP_TEST_WARMUP_IMAGES = 10


def json_stats(log_text):
    """The dicts of a training log's `json_stats: {...}` lines (complete lines only: the last line of a
    running tool's log may be half written)."""
    return [json.loads(line.split('json_stats:', 1)[1]) for line in log_text.split('\n')[:-1]
            if 'json_stats:' in line]


def train_log_images_per_s(stats, global_batch, warmup_iter):
    """global_batch / 'time' (seconds per iteration) of each json_stats line at iteration >= warmup_iter."""
    times = [float(s['time']) for s in stats if int(s['iter']) >= warmup_iter]
    if not times:
        raise ConfigValueError('the training log has no json_stats line at iteration >= {}: raise --loop-iters '
                               'or lower --loop-warmup'.format(warmup_iter))
    return [global_batch / t for t in times]


def train_log_data_fraction(stats, warmup_iter):
    """Median over the json_stats lines at iteration >= warmup_iter of data_time / time: the share of
    an iteration spent waiting for the loader (None for logs without data_time)."""
    fractions = [float(s['data_time']) / float(s['time']) for s in stats
                 if int(s['iter']) >= warmup_iter and 'data_time' in s]
    return float(np.median(fractions)) if fractions else None


def test_log_ms_per_image(log_text, warmup_images=LOOP_TEST_WARMUP_IMAGES):
    """ms per image after the first warmup_images, from test_net's running means (`im_detect: ...
    done/total <detector s>s + <rest of the loop s>s`): (mean_b * n_b - mean_a * n_a) / (n_b - n_a)
    between the first line past the warm-up and the last, of their sum, of the detector's and of the
    rest of the loop's. Returns (the sum's, the last line's running mean of the sum, the detector's,
    the rest's), all in ms."""
    points = [(int(done), float(det), float(misc)) for done, _, det, misc in _IM_DETECT.findall(log_text)]
    start = next((p for p in points if p[0] > warmup_images), None)
    if start is None or points[-1][0] <= start[0]:
        raise ConfigValueError('the test log has too few im_detect lines past image {}: use a test dataset of '
                               'at least {} images'.format(warmup_images, warmup_images + 12))
    (n_a, det_a, misc_a), (n_b, det_b, misc_b) = start, points[-1]
    detector, rest = (1000.0 * (b * n_b - a * n_a) / (n_b - n_a) for a, b in ((det_a, det_b), (misc_a, misc_b)))
    return detector + rest, 1000.0 * (det_b + misc_b), detector, rest


_TOTAL_INFERENCE = re.compile(r'Total inference time: ([0-9.]+)s')


def test_log_first_image_s(log_text):
    """Seconds from the model being loaded to the first detection stored: test_net's first im_detect
    line comes after the batch holding image 1 (done/n, done = TEST.IMS_PER_BATCH or fewer), its
    running means per image times done are the detector's time on that batch plus the loop's wait."""
    lines = _IM_DETECT.findall(log_text)
    if not lines:
        raise ConfigValueError('the test log has no im_detect line')
    done, _, det, misc = lines[0]
    return int(done) * (float(det) + float(misc))


def test_log_inference_timed(log_text):
    """Whether test_net has logged its `Total inference time` (what follows is evaluation)."""
    return _TOTAL_INFERENCE.search(log_text) is not None


def test_log_inference_s(log_text):
    """The seconds of every `Total inference time` line (one per TEST.DATASETS entry tested)."""
    return [float(s) for s in _TOTAL_INFERENCE.findall(log_text)]


def test_log_total_inference_s(log_text):
    """test_net's `Total inference time: <s>s`: the whole testing of the dataset, model loading included."""
    times = test_log_inference_s(log_text)
    if not times:
        raise ConfigValueError('the test log has no "Total inference time" line')
    return times[0]


def train_log_first_iteration_s(stats):
    """Seconds from the first batch to the first training iteration done: json_stats of iteration 0
    ('time' is that iteration's, 'data_time' its wait for the batch)."""
    first = next((s for s in stats if int(s['iter']) == 0), None)
    if first is None:
        raise ConfigValueError('the training log has no json_stats line of iteration 0')
    return float(first['time']) - float(first.get('data_time', 0.0))


def train_log_s_per_iter(stats):
    """Median over the json_stats lines of 'time' (each the mean seconds per iteration over the
    iterations before it, up to 20); lines without one (an evaluation's APs) are skipped."""
    times = [float(s['time']) for s in stats if 'time' in s]
    if not times:
        raise ConfigValueError('the training log has no json_stats line with a time')
    return float(np.median(times))


_COPYPASTE = re.compile(r'copypaste: (.*)$', re.MULTILINE)


def eval_log_results(log_text):
    """task_evaluation's copypaste lines (`Dataset: <name>`, `Task: <task>`, the metrics' names, their
    values) as {dataset: {task: {metric: value}}}; a dataset logged again replaces what came before
    (the last evaluation counts)."""
    results, dataset, task, names = {}, None, None, None
    for line in _COPYPASTE.findall(log_text):
        if line.startswith('Dataset: '):
            dataset = line[len('Dataset: '):]
            results[dataset] = {}
        elif line.startswith('Task: '):
            task, names = line[len('Task: '):], None
        elif names is None:
            names = line.split(',')
        else:
            results[dataset][task] = dict(zip(names, (float(v) for v in line.split(','))))
    return results
