"""How config values are read: strings as Python literals, then Detectron's type rules against each
key's default (docs/CONFIG.md, "Types"). Used by core/config.py's merges."""

import ast
import copy

import numpy as np

from detectron.utils.errors import ConfigValueError

# Tuple keys holding names or paths: a bare word or an unquoted "(a, b)" becomes a tuple of names.
NAME_TUPLE_KEYS = {
    'TRAIN.DATASETS',
    'TEST.DATASETS',
    'TRAIN.PROPOSAL_FILES',
    'TEST.PROPOSAL_FILES',
}


def decode_value(value):
    """Strings are Python literals when they parse as one, otherwise stay raw strings."""
    if not isinstance(value, str):
        return copy.deepcopy(value)
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


# ---------------------------------------------------------------------------------------------
def coerce_value(value, default, full_key, source):
    if full_key == 'PIXEL_MEANS':
        return _as_pixel_means(value, default, source)
    if full_key == 'TRAIN.RANK_IMS_PER_BATCH':
        return _as_image_counts(value, full_key, source)
    if full_key in NAME_TUPLE_KEYS:
        return _as_name_tuple(value, default, full_key, source)
    if type(value) is type(default):
        return value
    if isinstance(default, str):
        return str(value)
    if isinstance(default, float) and _is_real_number(value):
        return float(value)
    if isinstance(default, list) and isinstance(value, tuple):
        return list(value)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    raise _type_error(value, default, full_key, source)


def _is_real_number(value):
    return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)


def _as_name_tuple(value, default, full_key, source):
    if isinstance(value, str):
        value = _split_names(value)
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise _type_error(value, default, full_key, source)
    return tuple(value)


def _split_names(text):
    """'a' -> ('a',); '(a, b)' or '[a,b]' -> ('a', 'b'); quotes around names are dropped."""
    text = text.strip()
    if text[:1] + text[-1:] in ('()', '[]'):
        text = text[1:-1]
    names = (name.strip().strip('\'"') for name in text.split(','))
    return tuple(name for name in names if name)


def _as_image_counts(value, full_key, source):
    if isinstance(value, (tuple, list)) and all(_is_int(v) and v >= 1 for v in value):
        return tuple(int(v) for v in value)
    raise ConfigValueError(
        'Config key {} expects a tuple of integers >= 1, one per process (default: ()), but got {} {!r} '
        '(from {})'.format(full_key, type(value).__name__, value, source)
    )


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _as_pixel_means(value, default, source):
    try:
        means = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        means = None
    if means is None or means.size != 3:
        raise _type_error(value, default, 'PIXEL_MEANS', source)
    return ((tuple(float(m) for m in means.ravel()),),)


_TYPE_NAMES = {
    bool: 'True or False',
    int: 'an integer',
    float: 'a number',
    str: 'a string',
    tuple: 'a tuple',
    list: 'a list',
}


def _type_error(value, default, full_key, source):
    return ConfigValueError(
        'Config key {} expects {} (default: {!r}) but got {} {!r} (from {})'.format(
            full_key, _TYPE_NAMES.get(type(default), type(default).__name__), default,
            type(value).__name__, value, source
        )
    )

