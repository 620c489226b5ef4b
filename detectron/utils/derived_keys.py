"""Keys that a rule derives from others (CenterNet's epoch schedule, the linear scaling rule) next to
the keys the user typed: a typed key is never silently replaced.

A derived key the user left at its default gets the derived value. A typed key keeps its value; if it
differs from the derived one while a key it is derived from was typed too (SOLVER.MAX_ITER beside
CENTERNET.NUM_EPOCHS), the two say different things and the run stops with one line naming both.
"""
import math

from detectron.utils.errors import ConfigValueError


class Derivation:
    """One rule's derived keys. cfg: the (unfrozen) config node; typed: {full key: where it was typed}
    (core.config.typed_keys()); rule: the rule's name for messages, e.g. 'CenterNet's epoch schedule'."""

    def __init__(self, cfg, typed, rule):
        self.cfg, self.typed, self.rule = cfg, typed, rule
        self.derived, self.kept = [], []

    def value(self, full_key, derived, sources=(), strict=False):
        """Set full_key to `derived` unless the user typed it; returns the value in effect.

        sources: the keys `derived` follows from; a typed full_key that differs from `derived` while
        one of them is typed too (strict: always, naming the first) is a ConfigValueError naming both."""
        parent, _, leaf = full_key.rpartition('.')
        node = leaf_value(self.cfg, parent) if parent else self.cfg
        if full_key not in self.typed:
            node[leaf] = derived
            self.derived.append('{} {}'.format(full_key, _show(derived)))
            return derived
        typed = node[leaf]
        if not _same(typed, derived):
            for source in sources:
                if source in self.typed or strict:
                    raise ConfigValueError(
                        '{} {} (from {}) contradicts {} {} (from {}), from which {} makes {} {}: give only one '
                        'of them'.format(full_key, _show(typed), self.typed[full_key], source,
                                         _show(leaf_value(self.cfg, source)), self.typed.get(source, 'its default'),
                                         self.rule, full_key, _show(derived)))
            self.kept.append('{} {} (typed; {} would make {})'.format(full_key, _show(typed), self.rule,
                                                                      _show(derived)))
        return typed

    def summary(self):
        """One line: what the rule derived and which typed values it kept."""
        line = '{}: derived {}'.format(self.rule, ', '.join(self.derived) or 'nothing')
        return line + ('; kept {}'.format(', '.join(self.kept)) if self.kept else '')


def leaf_value(node, full_key):
    """The value at a dotted key of a config node, e.g. leaf_value(cfg, 'SOLVER.MAX_ITER')."""
    for name in full_key.split('.'):
        node = node[name]
    return node


def _same(a, b):
    """Equal values, numbers to float rounding (a typed 0.0005 equals a derived 5e-4 x 114 / 114)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _show(value):
    if isinstance(value, float):
        return '{:g}'.format(value)
    if isinstance(value, (list, tuple)):
        shown = ', '.join(_show(v) for v in value)
        if isinstance(value, list):
            return '[{}]'.format(shown)
        return '({}{})'.format(shown, ',' if len(value) == 1 else '')
    return str(value)
