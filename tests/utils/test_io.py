import errno
import logging
import os
import pickle

import numpy as np
import pytest

from detectron.utils.errors import OutputDirError
from detectron.utils.io import load_object, remove_stale_temporary_files, save_object


def test_save_object_round_trip_with_protocol_2(tmp_path):
    path = tmp_path / 'obj.pkl'
    obj = {'blobs': {'conv1_w': np.arange(6, dtype=np.float32).reshape(2, 3)}, 'cfg': 'A: 1\n'}
    save_object(obj, str(path))
    assert path.read_bytes()[:2] == b'\x80\x02'
    loaded = load_object(str(path))
    assert loaded['cfg'] == 'A: 1\n'
    np.testing.assert_array_equal(loaded['blobs']['conv1_w'], obj['blobs']['conv1_w'])
    assert os.listdir(tmp_path) == ['obj.pkl']


def test_save_object_leaves_no_partial_file_on_error(tmp_path):
    path = tmp_path / 'model.pkl'
    save_object({'version': 1}, str(path))
    # A lambda cannot be pickled: the dump fails after the temporary file was opened.
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_object({'version': 2, 'bad': lambda: None}, str(path))
    assert os.listdir(tmp_path) == ['model.pkl']
    assert load_object(str(path)) == {'version': 1}
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_object({'bad': lambda: None}, str(tmp_path / 'new.pkl'))
    assert os.listdir(tmp_path) == ['model.pkl']


def test_load_object_decodes_python2_strings_as_latin1(tmp_path):
    path = tmp_path / 'py2.pkl'
    # Python 2 protocol-2 pickle of the byte string '\xe9\xff' (SHORT_BINSTRING).
    path.write_bytes(b'\x80\x02U\x02\xe9\xffq\x00.')
    assert load_object(str(path)) == '\xe9\xff'


def test_save_object_names_numpy_1_modules_so_old_numpy_can_read_it(tmp_path):
    path = tmp_path / 'model_final.pkl'
    save_object({'blobs': {'fc7_w': np.ones((2, 2), np.float32)}, 'score': np.float32(0.5)}, str(path))
    data = path.read_bytes()
    # What numpy 1 can import; numpy 2 pickles its arrays as numpy._core.multiarray._reconstruct.
    assert b'cnumpy.core.multiarray\n_reconstruct\n' in data and b'cnumpy.core.multiarray\nscalar\n' in data
    assert b'numpy._core' not in data
    assert pickle.dumps(np.ones(1), protocol=2).count(b'numpy._core') > 0  # the default would not do
    loaded = load_object(str(path))
    np.testing.assert_array_equal(loaded['blobs']['fc7_w'], np.ones((2, 2), np.float32))
    assert loaded['score'] == np.float32(0.5) and loaded['score'].dtype == np.float32


def test_stale_temporary_files_of_interrupted_saves_are_removed(tmp_path, caplog):
    stale = tmp_path / 'model_iter5000.pth.tmp.{}'.format('3f' * 16)
    stale.write_bytes(b'x' * (3 << 20))
    keep = ['model_iter4000.pth', 'model_iter5000.pth.tmp.not-ours', 'notes.tmp.txt']
    for name in keep:
        (tmp_path / name).write_bytes(b'')
    with caplog.at_level(logging.INFO, logger='detectron.utils.io'):
        assert remove_stale_temporary_files(str(tmp_path)) == [str(stale)]
    assert sorted(os.listdir(tmp_path)) == sorted(keep)
    assert 'Removed {} (3.0 MB), left by an interrupted save'.format(stale) in caplog.text
    assert remove_stale_temporary_files(str(tmp_path / 'missing')) == []


def test_a_read_only_directory_is_one_output_dir_error(tmp_path, monkeypatch):
    real_open = open

    def read_only_open(path, mode='r', *args, **kwargs):
        if 'w' in mode:
            raise OSError(errno.EROFS, 'Read-only file system', path)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr('builtins.open', read_only_open)
    with pytest.raises(OutputDirError) as err:
        save_object({'a': 1}, str(tmp_path / 'detections.pkl'))
    assert str(err.value) == ('could not write {} (Read-only file system); the filesystem is read-only: set '
                              'OUTPUT_DIR to a writable directory'.format(tmp_path / 'detections.pkl'))
    assert isinstance(err.value, OSError)
