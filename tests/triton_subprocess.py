"""Run a script of Triton kernel calls where the kernels can run: in a subprocess, compiled on a CUDA
machine, else by Triton's interpreter (TRITON_INTERPRET=1 has to be set before triton is imported,
hence the subprocess). The script reads its inputs from and writes its results to files it is given."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_kernel_script(script, *args, skip_reason):
    """Runs `python -c script *args` in the repository; skips the test with skip_reason when triton
    is not installed; fails it with the script's error output when the script fails."""
    if importlib.util.find_spec('triton') is None:
        pytest.skip(skip_reason)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get('PYTHONPATH', '')]))
    if not torch.cuda.is_available():
        env['TRITON_INTERPRET'] = '1'
    proc = subprocess.run([sys.executable, '-c', script, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
