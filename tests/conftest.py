"""Every test may change the global cfg freely: it is restored (values and frozen state) afterwards.

The one way tests change global cfg keys: plain assignment (`cfg.TEST.NMS = 0.4`), `cfg.merge_from_list`,
or the `set_cfg` fixture for dotted names; the autouse fixtures below give every value back. Never
`monkeypatch.setattr` a cfg node: a yacs key is a dict item, and pytest 9.2's undo deletes it."""

import copy
import os

import pytest
import torch

from detectron.core.config import CfgNode, cfg
from detectron.datasets import dataset_catalog
from support.tiny_runs import write_tiny_datasets


def _restore_in_place(node, snapshot):
    # In place, so that modules and tests holding cfg or one of its sections see the restored values.
    for key in list(node.keys()):
        if key not in snapshot:
            dict.__delitem__(node, key)
    for key, value in snapshot.items():
        current = node.get(key)
        if isinstance(value, CfgNode) and isinstance(current, CfgNode):
            _restore_in_place(current, value)
        else:
            dict.__setitem__(node, key, value)
    # The frozen state and the record of typed keys (config.typed_keys) live in the node's __dict__.
    node.__dict__.clear()
    node.__dict__.update(snapshot.__dict__)


def pytest_configure(config):
    """Under pytest-xdist (`-n N`, the README's command) each worker computes on one intra-op thread, as
    the tools' subprocesses in the tests do: N workers of several threads each on N cores would
    oversubscribe them, and OpenMP's spinning threads then slow every worker many times over."""
    if os.environ.get('PYTEST_XDIST_WORKER'):
        torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope='session')
def no_fsync_in_this_process():
    """os.fsync does nothing in the test process: its temporary checkpoints need no durability, and
    flushing each (~100 MB with momentum) to disk was a tenth of an in-process training test. The
    atomic writes are otherwise unchanged (temporary file, rename); tools run as subprocesses still sync."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, 'fsync', lambda fd: None)
        yield


@pytest.fixture(autouse=True)
def restore_global_cfg():
    """Also a function that restores the cfg within the test, for one that sets up two configs."""
    snapshot = copy.deepcopy(cfg)
    yield lambda: _restore_in_place(cfg, snapshot)
    _restore_in_place(cfg, snapshot)


@pytest.fixture(autouse=True, scope='module')
def restore_global_cfg_after_module():
    """A module-scoped fixture that sets up a config runs before the per-test snapshot above: what it
    leaves in the cfg is restored when its module ends, so no later module sees it."""
    snapshot = copy.deepcopy(cfg)
    yield
    _restore_in_place(cfg, snapshot)


def _set_cfg_key(dotted, value):
    node, *path = cfg, *dotted.split('.')
    for name in path[:-1]:
        node = node[name]
    if path[-1] not in node:
        raise KeyError(f'{dotted} is not a cfg key')
    node[path[-1]] = value


@pytest.fixture
def set_cfg(restore_global_cfg):
    """set_cfg({'MODEL.NUM_CLASSES': 4, 'MRCNN.THRESH_BINARIZE': 0.6}) sets keys by their dotted names (an
    unknown name fails); the values are given back after the test by restore_global_cfg."""
    def set_keys(values):
        for dotted, value in values.items():
            _set_cfg_key(dotted, value)
    return set_keys


# Fixtures of the tests that train or test on the tiny datasets (tests/support/tiny_runs.py).

@pytest.fixture
def private_dataset_registrations(monkeypatch):
    """For a module's every test (pytestmark = pytest.mark.usefixtures(...)): the engines register
    DATASET_CATALOG in this process; keep that out of other tests."""
    monkeypatch.setattr(dataset_catalog, '_registered', {})


@pytest.fixture(scope='module')
def tiny_catalog(tmp_path_factory):
    """The catalog path of the tiny datasets, written once per module."""
    return write_tiny_datasets(tmp_path_factory.mktemp('tiny'))


@pytest.fixture
def one_thread_per_process(monkeypatch):
    """One intra-op thread here and in every spawned worker (they honour OMP_NUM_THREADS): CPU kernels
    reduce in an order that depends on the thread count, which moves scores by up to ~1e-4."""
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def on_the_cpu(monkeypatch):
    """The expected lines name the CPU (no memory statistics): hide a GPU the machine may have."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')


@pytest.fixture
def deterministic_cudnn():
    """cuDNN's deterministic algorithms, no autotuning: graphed and eager GPU runs compare value for value."""
    previous = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous
