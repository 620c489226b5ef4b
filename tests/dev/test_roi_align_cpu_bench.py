import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_benchmark_checks_equality_then_times_both():
    run = subprocess.run([sys.executable, os.path.join('dev', 'roi_align_cpu_bench.py'), '--rois', '24', '--channels',
                          '3', '--rounds', '2'], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS='1'))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].endswith('pooled features and gradients bit-equal: True')
    counts = [int(c) for c in lines[0].split('[')[1].split(']')[0].split(',')]
    assert sum(counts) == 24
    assert 'torchvision per level' in lines[1] and 'sparse_roi_align' in lines[2]
    tv, sparse = (float(line.split(': ')[1].split(' ms')[0]) for line in lines[1:3])
    # The ratio of the unrounded medians; the printed ones are rounded to 0.01 ms.
    assert float(lines[3].split()[1].rstrip('x')) == pytest.approx(tv / sparse, rel=0.1, abs=0.02)
