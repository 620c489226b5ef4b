"""YAML that PyYAML would read silently wrong (a repeated key keeps the last value) or expand without
bound (nested aliases) is refused with one line; every error line the tools print is bounded."""
import subprocess
import sys

import pytest

from detectron.core import config_yaml
from detectron.core.config import cfg, merge_cfg_from_file
from detectron.utils.errors import MAX_ERROR_LINE, ConfigValueError, error_line

REPO = __file__.rsplit('/tests/', 1)[0]


def _write(tmp_path, text):
    path = tmp_path / 'cfg.yaml'
    path.write_text(text)
    return str(path)


def test_a_second_section_of_the_same_name_is_an_error_naming_both_lines(tmp_path):
    path = _write(tmp_path, 'SOLVER:\n  BASE_LR: 0.01\n  MAX_ITER: 10\nTRAIN:\n  SCALES: (100,)\nSOLVER:\n'
                            '  STEPS: [0, 5]\n')
    with pytest.raises(ConfigValueError) as err:
        merge_cfg_from_file(path)
    assert str(err.value) == ("Invalid YAML in {}: line 6, column 1: key 'SOLVER' appears twice in one mapping "
                              "(lines 1 and 6); keep one".format(path))
    assert cfg.SOLVER.BASE_LR != 0.01  # nothing of the file was merged


def test_a_key_repeated_inside_a_section_is_an_error(tmp_path):
    path = _write(tmp_path, 'SOLVER:\n  BASE_LR: 0.01\n  MAX_ITER: 10\n  BASE_LR: 0.02\n')
    with pytest.raises(ConfigValueError, match=r"line 4, column 3: key 'BASE_LR' appears twice in one mapping "
                                               r"\(lines 2 and 4\)"):
        merge_cfg_from_file(path)


def test_the_same_key_in_two_sections_and_merge_keys_are_fine(tmp_path):
    path = _write(tmp_path, 'base: &base\n  BASE_LR: 0.03\n  MAX_ITER: 7\n'
                            'TRAIN:\n  MAX_SIZE: 333\nTEST:\n  MAX_SIZE: 444\n')
    loaded = config_yaml.load_yaml_file(path)
    assert loaded['TRAIN'] == {'MAX_SIZE': 333} and loaded['TEST'] == {'MAX_SIZE': 444}
    merged = config_yaml.load_cfg('a: &a {X: 1, Y: 2}\nb:\n  <<: *a\n  Y: 3\n')
    assert merged['b'] == {'X': 1, 'Y': 3}


def _nested_aliases(levels, width=9):
    lines = ['l0: &l0 [{}]'.format(', '.join(['1'] * width))]
    for level in range(1, levels):
        lines.append('l{0}: &l{0} [{1}]'.format(level, ', '.join(['*l{}'.format(level - 1)] * width)))
    return '\n'.join(lines) + '\n'


def test_nested_aliases_past_the_bound_are_refused_with_a_short_line(tmp_path):
    # 9 ** 6 = 531441 values once expanded, past the bound; 9 ** 4 = 6561 is not.
    with pytest.raises(ConfigValueError) as err:
        merge_cfg_from_file(_write(tmp_path, _nested_aliases(6)))
    assert str(err.value).endswith('line 1, column 1: its aliases expand to more than {} values; a config needs '
                                   'far fewer'.format(config_yaml.MAX_EXPANDED_NODES))
    assert len(config_yaml.load_cfg(_nested_aliases(4))['l3']) == 9


def test_expanded_size_counts_every_value_of_the_expansion():
    root = __import__('yaml').compose(_nested_aliases(3, width=2))
    # l0: 1 + 2; l1: 1 + 2 * 3; l2: 1 + 2 * 7; the mapping: 1 + 3 keys + 3 + 7 + 15 values.
    with pytest.raises(Exception, match='more than 28 values'):
        original = config_yaml.MAX_EXPANDED_NODES
        try:
            config_yaml.MAX_EXPANDED_NODES = 28
            config_yaml._check_expanded_size(root)
        finally:
            config_yaml.MAX_EXPANDED_NODES = original
    config_yaml._check_expanded_size(root)  # 29 values, within the real bound


def test_error_lines_are_bounded_keeping_both_ends():
    message = 'start ' + 'x' * 10000 + ' end'
    line = error_line(ConfigValueError(message))
    assert len(line) <= MAX_ERROR_LINE
    assert line.startswith('error: start xxx') and line.endswith('xxx end')
    assert '({} characters omitted)'.format(len('error: ' + message) - MAX_ERROR_LINE) in line
    assert error_line(ConfigValueError('short\nmessage')) == 'error: short message'


def test_a_huge_value_gives_a_bounded_error_line_from_the_tool(tmp_path):
    path = _write(tmp_path, 'MODEL:\n  NUM_CLASSES: [{}]\n'.format(', '.join(['1'] * 3000)))
    run = subprocess.run([sys.executable, 'tools/train_net.py', '--cfg', path, '--print-config'],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ''
    assert run.stderr.startswith('error: Config key MODEL.NUM_CLASSES expects an integer')
    assert len(run.stderr.rstrip('\n')) <= MAX_ERROR_LINE and run.stderr.count('\n') == 1
