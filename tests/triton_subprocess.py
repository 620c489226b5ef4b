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


def tensor_kernel_results(script, cases, folder, skip_reason):
    """run_kernel_script on tensor cases ({name: tuple of tensors or None}), saved to `folder` on the
    kernels' device; the script writes {name: tuple of results}, returned with tensors on the CPU."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    inputs_path, results_path = str(folder / 'inputs.pt'), str(folder / 'results.pt')
    torch.save({name: tuple(t if t is None else t.to(device) for t in case) for name, case in cases.items()},
               inputs_path)
    run_kernel_script(script, inputs_path, results_path, skip_reason=skip_reason)
    return {name: tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in result)
            for name, result in torch.load(results_path).items()}
