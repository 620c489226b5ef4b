"""Every test may change the global cfg freely: it is restored (values and frozen state) afterwards.

The one way tests change global cfg keys: plain assignment (`cfg.TEST.NMS = 0.4`), `cfg.merge_from_list`,
or the `set_cfg` fixture for dotted names; the autouse fixtures below give every value back. Never
`monkeypatch.setattr` a cfg node: a yacs key is a dict item, and pytest 9.2's undo deletes it."""

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
