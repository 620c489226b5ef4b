"""The docs as references: DESIGN.md's map names every product module (and only modules that exist),
and every test that RELIABILITY.md or MULTI_GPU.md cites exists."""
import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT_TOPS = ('detectron', 'tools')
MAPPED_TOPS = PRODUCT_TOPS + ('dev',)  # rooms whose modules the map names (lib/ holds Cython sources)


def _read(rel):
    with open(os.path.join(REPO_ROOT, rel), encoding='utf-8') as f:
        return f.read()


def product_modules(root=REPO_ROOT):
    """Every .py under detectron/ and tools/ except __init__.py, as paths relative to root."""
    found = set()
    for top in PRODUCT_TOPS:
        for dirpath, _, filenames in os.walk(os.path.join(root, top)):
            for name in filenames:
                if name.endswith('.py') and name != '__init__.py':
                    found.add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, '/'))
    return found


_ROOM = re.compile(r'^([\w.]+(?:/[\w.]+)*/)\s')
_MODULE = re.compile(r'(?<![\w./])((?:\w+/)*\w+\.py)\b')


def map_modules(design_text):
    """The modules DESIGN.md's room map names, as paths: each name joined to the room of its line
    (a line starting in column 0 opens a room, e.g. `detectron/core/`; indented lines continue it), for
    the rooms of MAPPED_TOPS."""
    start = design_text.index('## Rooms and import direction')
    block = design_text[design_text.index('```', start) + 3:]
    block = block[:block.index('```')]
    named, room = set(), None
    for line in block.splitlines():
        opened = _ROOM.match(line)
        if opened:
            room = opened.group(1)
            line = line[opened.end():]
        if room is None or room.split('/')[0] not in MAPPED_TOPS:
            continue
        for name in _MODULE.findall(line):
            named.add(room + name)
    return named


def map_problems(design_text, root=REPO_ROOT):
    """Product modules the map misses, and names it lists that are no file of the repository."""
    named = map_modules(design_text)
    missing = sorted(product_modules(root) - named)
    absent = sorted(path for path in named if not os.path.isfile(os.path.join(root, path)))
    return ['not in docs/DESIGN.md\'s map: ' + p for p in missing] + \
           ['named by docs/DESIGN.md\'s map but absent: ' + p for p in absent]


def test_the_design_map_lists_every_product_module_and_only_existing_ones():
    assert map_problems(_read('docs/DESIGN.md')) == []


def test_the_map_checker_finds_a_planted_module_and_a_stale_name(tmp_path):
    for rel in ('detectron/core/__init__.py', 'detectron/core/listed.py', 'detectron/core/planted.py',
                'tools/train_net.py'):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text('')
    design = ('## Rooms and import direction\n```\n'
              'tools/                 train_net.py (training)\n'
              'detectron/core/        listed.py (a module), gone.py (a module\n'
              '                       that was removed)\n```\n')
    assert map_problems(design, str(tmp_path)) == [
        "not in docs/DESIGN.md's map: detectron/core/planted.py",
        "named by docs/DESIGN.md's map but absent: detectron/core/gone.py"]


@pytest.mark.parametrize('needle, rel', [
    ('variance voting', 'detectron/ops/variance_voting.py'),
    ('multi-GPU launcher', 'detectron/core/launch.py'),
    ("CenterNet's decode", 'detectron/modeling/centernet_decode.py'),
    ('checkpoint writer', 'detectron/checkpoint/checkpointer.py'),
    ('training hooks', 'detectron/core/hooks.py'),
])
def test_a_newcomer_finds_these_in_the_map_next_to_their_module(needle, rel):
    design = _read('docs/DESIGN.md')
    assert rel in map_modules(design)
    name = os.path.basename(rel)
    entry = re.search(re.escape(name) + r' \(([^)]*)\)', design)
    assert entry and needle in ' '.join(entry.group(1).split())


_CITED_TEST = re.compile(r'(tests/[\w/]+\.py)::(\w+)')


def cited_tests(text):
    """(file, test name) for every `tests/...py::test_name` in text (parametrize ids stripped)."""
    return sorted(set(_CITED_TEST.findall(text)))


def missing_cited_tests(text, root=REPO_ROOT):
    missing = []
    for rel, name in cited_tests(text):
        path = os.path.join(root, rel)
        source = open(path, encoding='utf-8').read() if os.path.isfile(path) else ''
        if not re.search(r'^\s*(async\s+)?def {}\('.format(re.escape(name)), source, re.MULTILINE):
            missing.append('{}::{}'.format(rel, name))
    return missing


@pytest.mark.parametrize('doc', ['docs/RELIABILITY.md', 'docs/MULTI_GPU.md'])
def test_every_test_a_doc_cites_exists(doc):
    text = _read(doc)
    assert cited_tests(text)
    assert missing_cited_tests(text) == []


def test_the_citation_checker_finds_a_missing_test():
    text = ('tests/test_docs.py::test_every_test_a_doc_cites_exists[docs/RELIABILITY.md], '
            'tests/test_docs.py::test_that_is_not_there, tests/nowhere.py::test_x')
    assert missing_cited_tests(text) == ['tests/nowhere.py::test_x', 'tests/test_docs.py::test_that_is_not_there']
