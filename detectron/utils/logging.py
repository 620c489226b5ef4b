"""Detectron's log format and its `json_stats:` training lines."""

import json
import logging
import sys
from numbers import Integral, Real

_FORMAT = '%(levelname)s %(filename)s:%(lineno)4d: %(message)s'


def setup_logging(name, rank=None):
    """Log to stdout in Detectron's format and return the logger `name`.

    INFO and above; processes of a multi-process run other than rank 0 log WARNING and above
    only, so that each message appears once.
    """
    level = logging.WARNING if rank else logging.INFO
    # force: drop handlers that an earlier logging.basicConfig() (e.g. by a library) installed
    logging.basicConfig(level=level, format=_FORMAT, stream=sys.stdout, force=True)
    return logging.getLogger(name)


def log_json_stats(stats, sort_keys=True):
    """Print `json_stats: {...}` (no log prefix), the line Detectron's plotting scripts parse.

    Floats become strings with 6 decimals and integers stay integers, as in Detectron;
    numpy scalars are treated like the Python numbers they hold.
    """
    print('json_stats: {}'.format(json.dumps(
        {key: _json_value(value) for key, value in stats.items()}, sort_keys=sort_keys)))


def _json_value(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return '{:.6f}'.format(value)
    return value

