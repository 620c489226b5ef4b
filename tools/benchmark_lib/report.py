"""The output: one JSON line per row as it finishes, the Markdown tables at the end."""
import datetime
import json
import shlex
import subprocess

import torch
import torchvision

from .logs import REPO
from .timing import spread


def git_commit():
    try:
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ('+uncommitted' if dirty else '')


def run_meta(argv, device):
    return {'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
            'device': torch.cuda.get_device_name(device) if device.type == 'cuda'
            else 'cpu ({} threads)'.format(torch.get_num_threads()),
            'torch': torch.__version__, 'torchvision': torchvision.__version__, 'commit': git_commit(),
            'command': 'python tools/benchmark.py ' + shlex.join(argv)}


class Report:
    """JSON lines as rows finish, and the Markdown tables at the end."""

    def __init__(self, meta):
        self.meta = meta
        self.records = []

    def _emit(self, record):
        record = dict(self.meta, **record)
        self.records.append(record)
        print(json.dumps(record), flush=True)

    def add_row(self, row, **context):
        self._emit(dict(section=row.section, row=row.name, unit=row.unit, rounds=row.values, **spread(row.values),
                        peak_mem_mib=max(row.peaks_mib) if row.peaks_mib else None, **row.info, **row.after(),
                        **context))

    def add_ratio(self, name, ratios):
        self._emit(dict(section='ratio', row=name, unit='x', rounds=ratios, **spread(ratios)))

    def add_profile(self, name, summary, **context):
        self._emit(dict(section='profile', row=name, **summary, **context))

    def markdown(self):
        m = self.meta
        lines = ['{}, {}, torch {}, torchvision {}, commit {}'.format(
                     m['date'], m['device'], m['torch'], m['torchvision'], m['commit']),
                 '`{}`'.format(m['command']), '',
                 '| section | row | batch | precision | size | median | min | max | unit | peak MiB | notes |',
                 '|---|---|---|---|---|---|---|---|---|---|---|']
        for r in self.records:
            if r['section'] != 'profile':
                lines.append('| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |'.format(
                    r['section'], r['row'], r.get('batch', ''), r.get('precision', ''),
                    'x'.join(map(str, r['size'])) if r.get('size') else '', _fmt(r['median']), _fmt(r['min']),
                    _fmt(r['max']), r['unit'], _fmt(r.get('peak_mem_mib')), _notes(r)))
        profiles = [r for r in self.records if r['section'] == 'profile']
        if profiles:
            lines += ['', ('| profiled row | wall ms/step | GPU busy ms/step | GPU busy | kernel sum ms/step '
                           '| GPU ops/step | host syncs/step | D2H copies/step |'), '|---|---|---|---|---|---|---|---|']
            lines += ['| {} | {} | {} | {:.0%} | {} | {} | {} | {} |'.format(
                r['row'], _fmt(r['wall_ms_per_step']), _fmt(r['gpu_busy_ms_per_step']), r['gpu_busy_fraction'],
                _fmt(r['gpu_kernel_sum_ms_per_step']), _fmt(r['gpu_ops_per_step']), _fmt(r['host_syncs_per_step']),
                _fmt(r['d2h_copies_per_step'])) for r in profiles]
            lines += ['', '| profiled row | top GPU kernels | ms/step | calls/step |', '|---|---|---|---|']
            lines += ['| {} | `{}` | {} | {} |'.format(r['row'], k['name'][:90], _fmt(k['ms_per_step']),
                                                       _fmt(k['calls_per_step']))
                      for r in profiles for k in r['top_kernels']]
        return '\n'.join(lines)


def _fmt(value):
    if value is None:
        return ''
    return '{:.4g}'.format(value)


def _note_value(value):
    """A note's value: numbers to 4 digits, a dict as its items (' / ' between), a list (CPU flags)
    joined ('none' if empty)."""
    if isinstance(value, float):
        return _fmt(value)
    if isinstance(value, dict):
        return ' / '.join('{} {}'.format(k, _note_value(v)) for k, v in value.items())
    if isinstance(value, list):
        return ' '.join(map(str, value)) or 'none'
    return value


def _notes(record):
    keys = ('box_rois_per_image', 'trainable_params', 'loss_finite', 'rois', 'candidates', 'detections',
            'data_time_fraction', 'detector_ms', 'rest_of_loop_ms', 'total_s', 'first_pass_ms_per_image',
            's_per_iter', 'test_s', 'metrics', 'threads', 'cpu', 'cpu_flags')
    notes = ['{} {}'.format(k, _note_value(record[k])) for k in keys if record.get(k) is not None]
    if record['section'] == 'ratio' and len(record['rounds']) > 1:
        notes.append('median of {} per-round ratios'.format(len(record['rounds'])))
    return ', '.join(notes)
