"""Processes of a job as /proc shows them: who is alive, who descends from whom, who survives a deadline
(tests of process lifetime: a killed launcher or rank leaves nothing running)."""
import os
import time

from support.tiny_runs import REPO

DEADLINE_S = 10.0  # the promise: every process of the job is gone this long after the launcher


def job_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')
           and not k.startswith('SLURM_')}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS='1')
    return env


def parent_and_state(pid):
    """(parent pid, state letter) of a process, or None once it is gone."""
    try:
        with open('/proc/{}/stat'.format(pid)) as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(')', 1)[1].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0]


def descendants(root):
    """Pids of every living process below root."""
    children = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            info = parent_and_state(int(name))
            if info is not None:
                children.setdefault(info[0], []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid):
    info = parent_and_state(pid)
    return info is not None and info[1] != 'Z'  # a zombie has exited and waits to be reaped


def wait_for_files(directory, names, process, timeout=90):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(directory, n)) for n in names):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, 'the job did not start in {} s'.format(timeout)
        time.sleep(0.1)


def survivors_after(pids, deadline_s):
    """The pids still alive deadline_s seconds from now (returns as soon as all are gone)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def session_processes(session):
    """Pids of living processes of a session (a tool started as its leader)."""
    found = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/{}/stat'.format(name)) as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and alive(int(name)):
                found.append(int(name))
    return found
