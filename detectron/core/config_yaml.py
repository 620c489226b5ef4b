"""Reading config YAML: files, text and the configs Detectron dumped into its .pkl files, with only
the Python objects those dumps hold constructed."""

import importlib

import numpy as np
import yaml

from detectron.core.config_defaults import CfgNode
from detectron.utils.errors import ConfigValueError

# Values a config may hold once its YAML aliases are expanded: nested aliases are an exponential
# expansion, which would otherwise end as an error message hundreds of megabytes long.
MAX_EXPANDED_NODES = 100000


def load_cfg(cfg_to_load):
    """Parse YAML text or an open file, including configs dumped by Detectron into .pkl files.

    Detectron dumps carry Python tags (its AttrDict, numpy arrays and scalars); only those tags
    are constructed, so a config file cannot run arbitrary code.
    """
    if hasattr(cfg_to_load, 'read'):
        cfg_to_load = cfg_to_load.read()
    if not isinstance(cfg_to_load, str):
        raise ConfigValueError(
            'load_cfg expects YAML text or an open file, got {}'.format(type(cfg_to_load).__name__)
        )
    return yaml.load(cfg_to_load, Loader=_CfgYamlLoader)


def load_yaml_file(path):
    try:
        with open(path, 'r', encoding='utf-8') as f:
            text = f.read()
    except OSError as err:
        raise ConfigValueError('Cannot read config file {}: {}'.format(path, err.strerror))
    except UnicodeDecodeError as err:
        raise ConfigValueError(
            'Config file {} is not a YAML text file (the byte at offset {} is not UTF-8 text); pass the .yaml config '
            'with --cfg, and weights files with TRAIN.WEIGHTS / TEST.WEIGHTS'.format(path, err.start))
    try:
        return load_cfg(text)
    except yaml.YAMLError as err:
        raise ConfigValueError('Invalid YAML in {}: {}'.format(path, _describe_yaml_error(err)))


def _describe_yaml_error(err):
    mark = getattr(err, 'problem_mark', None)
    problem = getattr(err, 'problem', None) or str(err).splitlines()[0]
    if mark is None:
        return problem
    return 'line {}, column {}: {}'.format(mark.line + 1, mark.column + 1, problem)


def _numpy_multiarray():
    try:
        return importlib.import_module('numpy._core.multiarray')
    except ImportError:  # numpy < 2
        return importlib.import_module('numpy.core.multiarray')


def _yaml_python_names():
    """The only Python objects a config YAML may construct (what Detectron's dumps contain)."""
    multiarray = _numpy_multiarray()
    names = {
        'detectron.utils.collections.AttrDict': CfgNode,
        'utils.collections.AttrDict': CfgNode,  # Detectron's older module path
        'detectron.core.config.CfgNode': CfgNode,  # dumps made before the key tree moved
        'detectron.core.config_defaults.CfgNode': CfgNode,
        'yacs.config.CfgNode': CfgNode,
        'numpy.ndarray': np.ndarray,
        'numpy.dtype': np.dtype,
    }
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        names[module + '._reconstruct'] = multiarray._reconstruct
        names[module + '.scalar'] = multiarray.scalar
    return names


class _CfgYamlLoader(yaml.UnsafeLoader):
    """PyYAML's Python-object loader restricted to the names in _yaml_python_names(), refusing a key
    repeated in one mapping (PyYAML keeps the last silently: a second `SOLVER:` section would drop
    the first's keys) and aliases that expand past MAX_EXPANDED_NODES values."""

    def construct_document(self, node):
        _check_expanded_size(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(node)
        return super().construct_mapping(node, deep=deep)

    def find_python_name(self, name, mark, unsafe=False):
        allowed = _yaml_python_names()
        if name not in allowed:
            raise yaml.constructor.ConstructorError(
                None, None, 'refusing to construct Python object {!r} in a config'.format(name), mark
            )
        return allowed[name]

    def find_python_module(self, name, mark, unsafe=False):
        raise yaml.constructor.ConstructorError(
            None, None, 'refusing to import Python module {!r} in a config'.format(name), mark
        )


def _check_unique_keys(node):
    first_line = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == 'tag:yaml.org,2002:merge':
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in first_line:
            raise yaml.constructor.ConstructorError(
                None, None, 'key {!r} appears twice in one mapping (lines {} and {}); keep one'.format(
                    _bounded(key_node.value), first_line[key_node.value], line), key_node.start_mark)
        first_line[key_node.value] = line


def _check_expanded_size(root):
    sizes = {}

    def size(node):
        if id(node) not in sizes:
            sizes[id(node)] = None  # a recursive alias counts as no further values
            children = node.value if isinstance(node, yaml.SequenceNode) else (
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
            sizes[id(node)] = 1 + sum(size(child) or 0 for child in children)
        return sizes[id(node)] or 0

    if size(root) > MAX_EXPANDED_NODES:
        raise yaml.constructor.ConstructorError(
            None, None, 'its aliases expand to more than {} values; a config needs far fewer'.format(
                MAX_EXPANDED_NODES), root.start_mark)


def _bounded(text, limit=80):
    return text if len(text) <= limit else text[:limit] + '...'
