"""dev/gpu_checks.sh on the CPU: it parses, its listed steps exist, and its verdict lines read as documented."""
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, 'dev', 'gpu_checks.sh')


def _bash(code, tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / 'out'), RUNS=str(tmp_path / 'runs'))
    return subprocess.run(['bash', '-c', code], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=30)


def test_every_step_the_header_lists_is_defined(tmp_path):
    with open(SCRIPT) as f:
        text = f.read()
    header = text.split('set -uo pipefail')[0]
    listed = set(re.findall(r'\b(?:mg_[a-z]+|multi_gpu|setup|gpu_tests|mask_train|startup)\b', header))
    defined = set(re.findall(r'^([a-z_0-9]+)\(\) \{', text, re.MULTILINE))
    assert {'setup', 'multi_gpu', 'mg_train', 'mg_centernet', 'mg_test', 'mg_kill'} <= listed
    assert listed - defined == set()
    done = _bash('bash -n dev/gpu_checks.sh', tmp_path)
    assert done.returncode == 0, done.stderr


def test_verdicts_are_one_pass_or_fail_line_each_and_collected(tmp_path):
    done = _bash('source dev/gpu_checks.sh && mg_setup && mg_verdict 0 "kill: resumes" "exit 0" && '
                 'mg_verdict 1 "kill: ends" "exit 0 after 3 s" && mg_verdict $(( 0 || 1 )) "both" "x"', tmp_path)
    assert done.returncode == 0, done.stderr
    lines = ['PASS kill: resumes: exit 0', 'FAIL kill: ends: exit 0 after 3 s', 'FAIL both: x']
    assert done.stdout.splitlines() == lines
    assert (tmp_path / 'out' / 'multi_gpu' / 'results.txt').read_text().splitlines() == lines
