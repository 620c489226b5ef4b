"""dev/gpu_checks.sh and dev/gpu_benchmarks.sh on the CPU: they parse, the steps their headers list
exist, gpu_tests selects the cuda-marked tests rather than listing files, the steps BENCHMARKS.md and
docs/ name are in the script they name, and the check verdicts read as documented."""
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(REPO, 'dev', 'gpu_checks.sh')
BENCHMARKS = os.path.join(REPO, 'dev', 'gpu_benchmarks.sh')
ENV = os.path.join(REPO, 'dev', 'gpu_env.sh')


def _bash(code, tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / 'out'), RUNS=str(tmp_path / 'runs'))
    return subprocess.run(['bash', '-c', code], check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=30)


def _read(path):
    with open(path) as f:
        return f.read()


def _defined(*paths):
    return {name for path in paths for name in re.findall(r'^([a-z_0-9]+)\(\) \{', _read(path), re.MULTILINE)}


@pytest.mark.processes
@pytest.mark.parametrize('script', ['gpu_checks.sh', 'gpu_benchmarks.sh', 'gpu_env.sh'])
def test_the_scripts_parse(script, tmp_path):
    done = _bash(f'bash -n dev/{script}', tmp_path)
    assert done.returncode == 0, done.stderr


def test_every_step_the_checks_header_lists_is_defined():
    header = _read(CHECKS).split('set -uo pipefail')[0]
    listed = set(re.findall(r'\b(?:mg_[a-z]+|multi_gpu|setup|gpu_tests|out_of_memory)\b', header))
    assert {'setup', 'gpu_tests', 'multi_gpu', 'mg_train', 'mg_centernet', 'mg_test', 'mg_kill'} <= listed
    assert listed - _defined(CHECKS, ENV) == set()


def test_every_step_the_benchmarks_header_lists_is_defined():
    header = _read(BENCHMARKS).split('set -uo pipefail')[0]
    steps = header.split('# Steps:')[1].split('# bench_before_after also')[0]
    listed = set(re.findall(r'\b[a-z][a-z_0-9]+\b', steps)) - {'setup', 'dev', 'gpu_env', 'sh', 'gpus'}
    assert {'bench', 'startup', 'rcnn_loops', 'noisy_kl', 'mask_targets'} <= listed
    assert listed - _defined(BENCHMARKS) == set()


def test_gpu_tests_runs_the_cuda_marked_tests_not_a_list_of_files():
    body = re.search(r'^gpu_tests\(\) \{.*?^\}', _read(CHECKS), re.MULTILINE | re.DOTALL).group(0)
    assert 'pytest -q -rs -m cuda tests' in body
    assert 'test_' not in body.replace('gpu_tests', '')


def test_the_steps_the_docs_name_are_in_the_script_they_name():
    docs = [os.path.join(REPO, 'BENCHMARKS.md'), os.path.join(REPO, 'README.md')] + [
        os.path.join(REPO, 'docs', name) for name in sorted(os.listdir(os.path.join(REPO, 'docs')))
        if name.endswith('.md')]
    scripts = {'gpu_checks.sh': _defined(CHECKS, ENV), 'gpu_benchmarks.sh': _defined(BENCHMARKS, ENV)}
    named, missing = 0, []
    for doc in docs:
        for script, steps in re.findall(r'(gpu_checks\.sh|gpu_benchmarks\.sh)((?: [a-z][a-z_0-9]*)+)', _read(doc)):
            for step in steps.split():
                named += 1
                if step not in scripts[script]:
                    missing.append(f'{os.path.basename(doc)}: {script} {step}')
    assert named > 10
    assert missing == []


@pytest.mark.processes
def test_verdicts_are_one_pass_or_fail_line_each_and_collected(tmp_path):
    done = _bash('source dev/gpu_checks.sh && mg_setup && mg_verdict 0 "kill: resumes" "exit 0" && '
                 'mg_verdict 1 "kill: ends" "exit 0 after 3 s" && mg_verdict $(( 0 || 1 )) "both" "x"', tmp_path)
    assert done.returncode == 0, done.stderr
    lines = ['PASS kill: resumes: exit 0', 'FAIL kill: ends: exit 0 after 3 s', 'FAIL both: x']
    assert done.stdout.splitlines() == lines
    assert (tmp_path / 'out' / 'multi_gpu' / 'results.txt').read_text().splitlines() == lines
