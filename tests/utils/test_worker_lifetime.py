"""No process of a job outlives its launcher, and a dead rank ends the job (real processes, gloo, CPU).

A small script reads images through test_net's DataLoader (roi_data/loader.py build_test_loader, 1
worker): in its own process as single-process test_net does (0), in launch.launch's process (1),
or in each of two ranks that launch spawned (2). The tests kill the launcher (SIGTERM, SIGKILL) or one rank (SIGKILL) and look at
/proc for every process of the job.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support.processes import (DEADLINE_S, alive, descendants, job_env, survivors_after,
                               wait_for_files)

pytestmark = pytest.mark.skipif(not sys.platform.startswith('linux'),
                                reason='parent-death signals and /proc are Linux features')

JOB_SCRIPT = textwrap.dedent('''
    import os, sys, time
    import cv2
    import numpy as np
    from detectron.core import launch
    from detectron.roi_data.loader import build_test_loader
    from detectron.utils import comm
    from detectron.utils.errors import run_tool

    def read_forever(image, ready_dir):
        # test_net's loader: 3 MB decoded images through a pipe, which fills when its reader dies.
        for i, _ in enumerate(build_test_loader([{'image': image}] * 10 ** 6, range(10 ** 6), num_workers=1)):
            if i == 0:
                open(os.path.join(ready_dir, 'rank{}'.format(comm.get_rank())), 'w').close()
            time.sleep(0.05)

    def main(argv):
        image = os.path.join(argv[1], 'image.png')
        cv2.imwrite(image, np.random.RandomState(0).randint(0, 256, (1000, 1000, 3)).astype(np.uint8))
        if argv[0] == '0':  # like single-process test_net: no launch at all
            read_forever(image, argv[1])
        else:
            launch.launch(read_forever, int(argv[0]), args=(image, argv[1]), device='cpu')

    if __name__ == '__main__':
        run_tool(main, sys.argv[1:])
''')





def start_job(tmp_path, script_text, *args):
    script = tmp_path / 'job.py'
    script.write_text(script_text)
    return subprocess.Popen([sys.executable, str(script)] + [str(a) for a in args], env=job_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.processes
@pytest.mark.parametrize('num_processes', [0, 1, 2])
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL], ids=['SIGTERM', 'SIGKILL'])
def test_no_process_of_the_job_outlives_the_launcher(tmp_path, num_processes, sig):
    launcher = start_job(tmp_path, JOB_SCRIPT, num_processes, tmp_path)
    try:
        wait_for_files(tmp_path, ['rank{}'.format(r) for r in range(max(1, num_processes))], launcher)
        job = descendants(launcher.pid)
        # Every rank and its DataLoader worker (the launcher reads itself with 0 or 1 process).
        assert len(job) >= (2 * num_processes if num_processes > 1 else 1), job
        launcher.send_signal(sig)
        died = time.monotonic()
        out, err = launcher.communicate(timeout=DEADLINE_S + 5)
        assert survivors_after(job, DEADLINE_S - (time.monotonic() - died)) == []
    finally:
        for pid in descendants(launcher.pid) + [launcher.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert launcher.returncode == 128 + signal.SIGTERM
        assert err.endswith('\n') and err.count('\n') == 1, err
        assert err.startswith('error: stopped by SIGTERM; all worker processes were stopped')
    else:
        assert launcher.returncode == -signal.SIGKILL


TRAIN_SCRIPT = textwrap.dedent('''
    import os, sys, time
    import torch
    from detectron.checkpoint import checkpointer
    from detectron.core import launch
    from detectron.utils import comm
    from detectron.utils.errors import run_tool

    def train(output_dir, last_iter, step_s):
        with open(os.path.join(output_dir, 'rank{}.pid'.format(comm.get_rank())), 'w') as f:
            f.write(str(os.getpid()))
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _, start_iter, _, _ = checkpointer.resume_from_last(output_dir, model, optimizer)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for iteration in range(start_iter, last_iter + 1):
            optimizer.zero_grad()
            ddp(torch.full((3, 4), float(iteration + comm.get_rank()))).square().mean().backward()
            optimizer.step()
            rng_states = checkpointer.gather_rng_states()
            if comm.is_main_process():
                checkpointer.save_checkpoint(os.path.join(output_dir, checkpointer.checkpoint_name(iteration)), model,
                                             optimizer, iteration, rng_states=rng_states)
            comm.synchronize()
            time.sleep(step_s)
        return start_iter

    def main(argv):
        start_iter = launch.launch(train, 2, args=(argv[0], int(argv[1]), float(argv[2])), device='cpu')
        print('started at iteration', start_iter, flush=True)

    if __name__ == '__main__':
        run_tool(main, sys.argv[1:])
''')


@pytest.mark.slow
@pytest.mark.processes
def test_a_rank_killed_by_sigkill_ends_the_job_and_a_restart_resumes(tmp_path):
    """torchrun's semantics: a dead member ends the whole job at once, with the member named."""
    output_dir = tmp_path / 'out'
    output_dir.mkdir()
    launcher = start_job(tmp_path, TRAIN_SCRIPT, output_dir, 10 ** 6, 0.2)
    try:
        wait_for_files(output_dir, ['rank0.pid', 'rank1.pid', 'model_iter2.pth'], launcher)
        job = descendants(launcher.pid)
        os.kill(int((output_dir / 'rank1.pid').read_text()), signal.SIGKILL)
        killed = time.monotonic()
        out, err = launcher.communicate(timeout=DEADLINE_S + 5)
        assert time.monotonic() - killed < DEADLINE_S
        assert survivors_after(job, 1.0) == []
    finally:
        for pid in descendants(launcher.pid) + [launcher.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert launcher.returncode == 2
    assert err == 'error: worker rank 1 of 2 was killed by SIGKILL (often the out-of-memory killer; see dmesg)\n'
    saved = sorted(int(name[len('model_iter'):-len('.pth')]) for name in os.listdir(output_dir)
                   if name.startswith('model_iter'))
    restart = start_job(tmp_path, TRAIN_SCRIPT, output_dir, saved[-1] + 2, 0)
    out, err = restart.communicate(timeout=120)
    assert restart.returncode == 0, err
    assert 'started at iteration {}\n'.format(saved[-1] + 1) in out
    assert os.path.exists(output_dir / 'model_iter{}.pth'.format(saved[-1] + 2))
