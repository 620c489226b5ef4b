"""Every test may change the global cfg freely: it is restored (values and frozen state) afterwards."""

import copy

import pytest

from detectron.core.config import CfgNode, cfg


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
