"""Torch weight files: digests catch damaged tensors on every load; truncated and code-carrying files
are refused with one line (through resume and through TRAIN.WEIGHTS / TEST.WEIGHTS)."""
import logging
import os
import struct
import zipfile

import pytest
import torch

from detectron.checkpoint import checkpointer
from detectron.checkpoint.c2_weights import load_weights
from detectron.checkpoint.torch_file import read_torch_file, with_digest
from detectron.utils.digest import content_digest
from detectron.utils.errors import WeightsError


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8, 4)


def _saved_checkpoint(path):
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.fc(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    checkpointer.save_checkpoint(str(path), model, optimizer, 7, extra={'cfg': 'A: 1\n'})
    return str(path)


def _tensor_data_span(path):
    """(offset, size) in the file of the largest tensor's bytes (torch stores them uncompressed)."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if '/data/' in i.filename), key=lambda i: i.file_size)
    with open(path, 'rb') as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_length, extra_length = struct.unpack('<HH', header[26:30])  # the zip local file header
    return info.header_offset + 30 + name_length + extra_length, info.file_size


def _overwrite(path, offset, data):
    with open(path, 'r+b') as f:
        f.seek(offset)
        f.write(data)


def _assert_one_line_damaged_error(err, path):
    message = str(err.value)
    assert '\n' not in message
    assert message.startswith('{} is damaged: its tensors do not match the digest written with them'.format(path))


def test_one_flipped_byte_in_a_tensor_is_refused_on_every_load(tmp_path):
    path = _saved_checkpoint(tmp_path / 'model_final.pth')
    offset, size = _tensor_data_span(path)
    with open(path, 'rb') as f:
        f.seek(offset + size // 2)
        byte = f.read(1)[0]
    _overwrite(path, offset + size // 2, bytes([byte ^ 0x01]))
    assert torch.load(path, weights_only=True)['iteration'] == 7  # torch itself loads it silently
    with pytest.raises(WeightsError) as err:
        checkpointer.load_checkpoint(path, _Net())
    _assert_one_line_damaged_error(err, path)
    with pytest.raises(WeightsError) as err:  # model_final.pth as TRAIN.WEIGHTS / TEST.WEIGHTS
        load_weights(_Net(), path)
    _assert_one_line_damaged_error(err, path)


def test_four_zeroed_kilobytes_inside_a_tensor_are_refused(tmp_path):
    torch.manual_seed(1)
    path = str(tmp_path / 'model_iter9.pth')
    model = torch.nn.Linear(64, 64)
    checkpointer.save_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1), 9)
    offset, size = _tensor_data_span(path)
    assert size == 64 * 64 * 4
    _overwrite(path, offset + 4096, bytes(4096))
    with pytest.raises(WeightsError) as err:
        checkpointer.load_checkpoint(path, torch.nn.Linear(64, 64))
    _assert_one_line_damaged_error(err, path)


def test_files_without_a_digest_load_and_say_so(tmp_path, caplog):
    source = _Net()
    path = str(tmp_path / 'old.pth')
    torch.save({'model': source.state_dict()}, path)  # an older checkpoint, torchvision-style file
    target = _Net()
    with caplog.at_level(logging.INFO, logger='detectron.checkpoint.torch_file'):
        assert load_weights(target, path) == ([], [])
    assert '{} carries no digest'.format(path) in caplog.text
    assert torch.equal(target.fc.weight, source.fc.weight)


def test_the_digest_covers_values_types_and_structure():
    digests = {content_digest(c) for c in (
        {'a': 1}, {'a': 1.0}, {'a': True}, {'a': '1'}, {'a': [1]}, {'a': (1,)}, {'a': None},
        {'a': ['ab']}, {'a': ['a', 'b']}, {'b': 1}, {'a': torch.ones(2)}, {'a': torch.ones(2, 1)},
        {'a': torch.ones(2, dtype=torch.float64)}, {'a': torch.tensor([1.0, 1.0 + 2 ** -23])})}
    assert len(digests) == 14
    content = {'model': {'w': torch.arange(6.0).reshape(2, 3)[:, 1]}, 'iteration': 3}
    # A strided view digests as its values; the digest entry itself is left out.
    assert content_digest(content) == content_digest({'model': {'w': torch.tensor([1.0, 4.0])}, 'iteration': 3})
    assert content_digest(with_digest(content)) == content_digest(content)


def test_a_truncated_file_says_so_in_one_line(tmp_path):
    path = _saved_checkpoint(tmp_path / 'model_iter14.pth')
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size * 2 // 3)
    expected = ('{} is truncated or not a complete checkpoint ({} bytes, the end of its zip archive is missing: '
                'an interrupted save or copy); delete it or copy it again'.format(path, size * 2 // 3))
    for load in (checkpointer.load_checkpoint, lambda p, model: load_weights(model, p)):
        with pytest.raises(WeightsError) as err:
            load(path, _Net())
        assert str(err.value) == expected
    open(path, 'wb').close()
    with pytest.raises(WeightsError, match=r'is empty \(0 bytes\)'):
        read_torch_file(path)


class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, ('touch {}'.format(self.marker),)


def test_a_file_with_code_is_refused_without_suggesting_to_run_it(tmp_path):
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'model_final.pth')
    torch.save({'model': _Net().state_dict(), 'payload': _RunsShell(marker)}, path)
    for load in (checkpointer.load_checkpoint, lambda p, model: load_weights(model, p)):
        with pytest.raises(WeightsError) as err:
            load(path, _Net())
        message = str(err.value)
        assert message == ('{} contains code objects (posix.system) that a weights file never needs; it is '
                           'refused for safety: do not load it, get the weights from a source you trust'.format(path))
        assert 'weights_only' not in message
    assert not marker.exists()


def test_a_text_file_is_unreadable_not_code(tmp_path):
    # weights_only cannot parse it at all ("Unsupported operand"): no global is refused, so no warning
    # about code, the one-line "not a readable torch file" instead.
    path = tmp_path / 'notes.pth'
    path.write_text('not a checkpoint\n')
    with pytest.raises(WeightsError) as err:
        read_torch_file(str(path))
    assert str(err.value).startswith('{} is not a readable torch file ('.format(path))
    assert 'code objects' not in str(err.value) and '\n' not in str(err.value)
