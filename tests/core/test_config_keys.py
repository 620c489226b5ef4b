"""Every key of the config is read by some code or refused by name: none is loaded and ignored.

"Read" is found in the source, independently of the config module: an attribute chain on cfg (or on
a name bound to one of its nodes, `solver = cfg.SOLVER`) or a string that is exactly the key (the
check tables that look keys up by name). A key this port does not act on must be in
config._NOT_ACTED_ON, which refuses any value but its default with one line.
"""
import ast
import os

import pytest

from detectron.core import config
from detectron.core.config import CfgNode, assert_and_infer_cfg, cfg, merge_cfg_from_list
from detectron.utils.errors import ConfigValueError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tables of key names that are not reads: the refusals, the merge rules' renames and aliases, the
# domains of the numeric keys.
_NAME_TABLES = {'_NOT_ACTED_ON', '_DEPRECATED_KEYS', '_RENAMED_KEYS', '_KEY_ALIASES', 'NAME_TUPLE_KEYS', 'DOMAINS',
                'NON_NUMERIC_SEQUENCES'}


def _leaf_keys(node, prefix=''):
    for key, value in node.items():
        if isinstance(value, CfgNode):
            yield from _leaf_keys(value, prefix + key + '.')
        else:
            yield prefix + key


ALL_KEYS = sorted(_leaf_keys(cfg))


def _source_files():
    for top in ('detectron', 'tools'):
        for folder, _, files in os.walk(os.path.join(REPO_ROOT, top)):
            for name in files:
                if name.endswith('.py') and name != 'config_defaults.py':
                    yield os.path.join(folder, name)


def _chain(node):
    """['cfg', 'SOLVER', 'AMP', 'ENABLED'] of the attribute expression cfg.SOLVER.AMP.ENABLED."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        names = names[::-1]
        # A model type reads the cfg it is bound to: self.cfg.SOLVER is cfg.SOLVER.
        return names[1:] if names[:2] == ['self', 'cfg'] else names
    return None


def _config_path(chain, aliases):
    """The config path an attribute chain reads ('SOLVER.AMP.ENABLED'), or None."""
    root, attrs = chain[0], chain[1:]
    prefix = aliases.get(root)
    if root in ('cfg', '__C', 'cfg_snapshot'):
        prefix = ''
    if prefix is None or not attrs or not attrs[0][0].isupper():
        return None
    upper = []
    for attr in attrs:  # key names start with a capital (BBOX_XFORM_CLIPe too); methods do not
        if not attr[0].isupper():
            break
        upper.append(attr)
    return prefix + '.'.join(upper)


def _reads_in(path):
    tree = ast.parse(open(path, encoding='utf-8').read())
    table_strings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in _NAME_TABLES
                                                for t in node.targets):
            table_strings.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    aliases = {}
    for node in ast.walk(tree):  # name = cfg.SOLVER -> 'SOLVER.'
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _chain(node.value)
            if chain and chain[0] in ('cfg', '__C') and len(chain) > 1:
                aliases[node.targets[0].id] = '.'.join(chain[1:]) + '.'
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain:
                path = _config_path(chain, aliases)
                if path:
                    reads.add(path)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in table_strings:
            reads.add(node.value)
    return reads


@pytest.fixture(scope='module')
def read_keys():
    reads = set()
    for path in _source_files():
        reads |= _reads_in(path)
    # A node read whole (e.g. PIXEL_MEANS via np.array(cfg.PIXEL_MEANS)) counts for its own path only.
    return {key for key in ALL_KEYS if key in reads}


def _refused(key):
    return key in config._NOT_ACTED_ON or key.rsplit('.', 1)[0] + '.' in config._NOT_ACTED_ON


def test_every_key_is_read_or_refused(read_keys):
    neither = [key for key in ALL_KEYS if key not in read_keys and not _refused(key)]
    assert neither == [], 'keys loaded and ignored: read them or add them to config._NOT_ACTED_ON'


def test_refused_keys_are_not_read(read_keys):
    stale = [key for key in ALL_KEYS if key in read_keys and _refused(key)]
    assert stale == [], 'refused keys that code reads: take them out of config._NOT_ACTED_ON'


def test_every_refusal_names_a_key():
    for entry in config._NOT_ACTED_ON:
        if entry.endswith('.'):
            assert any(key.startswith(entry) for key in ALL_KEYS), entry
        else:
            assert entry in ALL_KEYS, entry


@pytest.mark.parametrize('key, value, message', [
    ('TRAIN.GENERATE_PROPOSALS_ON_GPU', 'True',
     "TRAIN.GENERATE_PROPOSALS_ON_GPU True is not acted on by this port: proposals are always generated on the "
     "model's device; remove the key"),
    ('TEST.BBOX_AUG.SCALE_SIZE_DEP', 'True', 'TEST.BBOX_AUG.SCALE_SIZE_DEP True is not acted on by this port: size-dep'),
    ('MEMONGER', 'False', 'MEMONGER False is not acted on by this port: '),
    ('KRCNN.DILATION', '2', 'KRCNN.DILATION 2 is not acted on by this port: it serves the ResNet conv5 keypoint'),
])
def test_a_refused_key_away_from_its_default_is_one_line(key, value, message):
    merge_cfg_from_list([key, value])
    with pytest.raises(ConfigValueError) as err:
        assert_and_infer_cfg()
    assert str(err.value).startswith(message) and '\n' not in str(err.value)


def test_refused_keys_at_their_defaults_merge_as_detectron_configs_have_them():
    merge_cfg_from_list(['TRAIN.CROWD_FILTER_THRESH', '0.7', 'MEMONGER', 'True', 'TEST.BBOX_AUG.ENABLED', 'False',
                         'RETINANET.NUM_CONVS', '4'])
    assert_and_infer_cfg()
    assert cfg.TRAIN.CROWD_FILTER_THRESH == 0.7
