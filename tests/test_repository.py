"""The repository's shape: imports go only downward, no module is too long to read, and the files
speak of the product (no development diary, no paths of one machine)."""
import ast
import os
import re
import subprocess

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# docs/DESIGN.md "Rooms and import direction": a room imports only the rooms after it.
LAYERS = ('tools', 'core', 'modeling', 'roi_data', 'datasets', 'checkpoint', 'ops', 'utils')
MAX_LINES = 600


def _python_files(*tops):
    for top in tops:
        for folder, dirs, files in os.walk(os.path.join(REPO_ROOT, top)):
            dirs[:] = [d for d in dirs if d != '__pycache__']
            for name in sorted(files):
                if name.endswith('.py'):
                    yield os.path.join(folder, name)


def _layer(path):
    rel = os.path.relpath(path, REPO_ROOT).split(os.sep)
    return 'tools' if rel[0] == 'tools' else rel[1] if len(rel) > 2 else None


def _module_name(path):
    rel = os.path.relpath(path, REPO_ROOT)[:-3].split(os.sep)
    return '.'.join(rel[:-1] if rel[-1] == '__init__' else rel)


def _imported_detectron_modules(path):
    """Every `detectron.x.y` module a file imports, at any depth of the file (function bodies too)."""
    tree = ast.parse(open(path, encoding='utf-8').read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [node.module + '.' + alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith('detectron.'):
                yield name


def _import_edges():
    files = {_module_name(p): p for p in _python_files('detectron')}
    edges = {}
    for path in list(_python_files('detectron', 'tools')):
        module = _module_name(path)
        targets = {name for name in _imported_detectron_modules(path) if name in files}
        edges[module] = (path, targets)
    return files, edges


def test_imports_go_only_downward():
    files, edges = _import_edges()
    upward = []
    for module, (path, targets) in edges.items():
        here = _layer(path)
        for target in targets:
            there = _layer(files[target])
            if here in LAYERS and there in LAYERS and LAYERS.index(there) < LAYERS.index(here):
                upward.append('{} ({}) imports {} ({})'.format(module, here, target, there))
    assert upward == []


def test_the_import_graph_has_no_cycles():
    _, edges = _import_edges()
    graph = {module: {t for t in targets if t in edges} for module, (_, targets) in edges.items()}
    state, cycles = {}, []

    def visit(module, stack):
        state[module] = 'open'
        for target in sorted(graph[module]):
            if state.get(target) == 'open':
                cycles.append(' -> '.join(stack[stack.index(target):] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[module] = 'done'

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    """The check above can fail: two modules importing each other are reported."""
    fake = {'detectron.utils.a': ('a.py', {'detectron.utils.b'}), 'detectron.utils.b': ('b.py', {'detectron.utils.a'})}
    monkeypatch.setattr(__import__(__name__), '_import_edges', lambda: ({}, fake))
    with pytest.raises(AssertionError):
        test_the_import_graph_has_no_cycles()


def test_no_module_is_longer_than_a_reader_can_hold():
    long_files = []
    for path in _python_files('detectron', 'tools'):
        with open(path, encoding='utf-8') as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            long_files.append('{}: {} lines'.format(os.path.relpath(path, REPO_ROOT), lines))
    assert long_files == []


# A development diary's words and one machine's paths, in any tracked text file.
_DIARY = re.compile(
    r'\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|'
    r'fourteenth|fifteenth|\d+(st|nd|rd|th))\s+(session|sitting)\b|\bsitting\b|\blent\b|\bthe lead\b|'
    r'/work/|/check/|/tmp/site\b|/root/', re.IGNORECASE)


def _tracked_text_files():
    listed = subprocess.run(['git', 'ls-files'], cwd=REPO_ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip('not a git checkout: the tracked files are unknown')
    for rel in listed.stdout.split():
        if rel.endswith(('.py', '.md', '.yaml', '.yml', '.sh', '.txt', '.cfg', '.toml', '.pyx')) or '/' not in rel:
            path = os.path.join(REPO_ROOT, rel)
            if os.path.isfile(path):
                yield rel, path


@pytest.mark.processes
def test_files_speak_of_the_product_not_of_its_development():
    found = []
    for rel, path in _tracked_text_files():
        if rel == 'tests/test_repository.py':
            continue
        with open(path, encoding='utf-8', errors='replace') as f:
            for number, line in enumerate(f, 1):
                match = _DIARY.search(line)
                if match:
                    found.append('{}:{}: {}'.format(rel, number, match.group(0)))
    assert found == []


@pytest.mark.parametrize('text', ['ninth session', '12th sitting', 'lent', '/tmp/site', '/work/'])
def test_the_diary_pattern_catches(text):
    assert _DIARY.search(text)


def _monkeypatched_cfg_nodes(source):
    """`monkeypatch.setattr(X, ...)` calls whose X reads the global cfg (`cfg`, `cfg.MODEL`, ...)."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == 'setattr'
                and isinstance(node.func.value, ast.Name) and node.func.value.id == 'monkeypatch' and node.args):
            target = node.args[0]
            while isinstance(target, ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name) and target.id == 'cfg':
                yield node.lineno


def test_no_test_monkeypatches_a_cfg_node():
    # tests/conftest.py: a yacs key is a dict item; monkeypatch's undo deletes it (pytest 9.2).
    found = [f'{os.path.relpath(path, REPO_ROOT)}:{line}' for path in _python_files('tests')
             for line in _monkeypatched_cfg_nodes(open(path, encoding='utf-8').read())]
    assert found == []


def test_the_cfg_monkeypatch_finder_finds_one():
    source = "def t(monkeypatch):\n    monkeypatch.setattr(cfg.MRCNN, 'X', 1)\n    monkeypatch.setattr(os, 'sep', 1)\n"
    assert list(_monkeypatched_cfg_nodes(source)) == [2]


def _imports_of_test_modules(source, test_modules):
    """Line numbers of the imports (at any depth) of a module named in test_modules."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        if any(name.split('.')[0] in test_modules for name in names):
            yield node.lineno


def test_no_test_module_imports_another():
    # Shared helpers live in tests/support/ and fixtures in a conftest.py: importing a test module
    # runs its module-level code in another module and drags its fixtures along.
    paths = list(_python_files('tests'))
    test_modules = {os.path.basename(path)[:-3] for path in paths if os.path.basename(path).startswith('test_')}
    found = [f'{os.path.relpath(path, REPO_ROOT)}:{line}' for path in paths
             for line in _imports_of_test_modules(open(path, encoding='utf-8').read(), test_modules)]
    assert found == []


def test_the_test_module_import_finder_finds_them():
    source = ('import os\nimport test_cli\nfrom test_train_engine import write_tiny_datasets\n'
              'from detectron.core import test_engine\nfrom support.tiny_runs import use_tiny_config\n'
              'def f():\n    import test_cli.sub\n')
    assert list(_imports_of_test_modules(source, {'test_cli', 'test_train_engine', 'test_engine'})) == [2, 3, 7]
