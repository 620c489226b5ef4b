"""CenterNet's per-GPU batch split (opts.py chunk_sizes) and its validation."""
import pytest

from detectron.roi_data.samplers import check_chunk_sizes, chunk_sizes
from detectron.utils.errors import ConfigValueError


@pytest.mark.parametrize('batch, master, gpus, expected', [
    (114, 18, 4, [18, 32, 32, 32]),   # experiments/ctdet_coco_resdcn18.sh
    (12, 4, 4, [4, 3, 3, 2]),         # rest 8 over 3: the first 8 % 3 = 2 get one more
    (128, 9, 8, [9] + [17] * 7),      # experiments/ctdet_coco_dla_1x.sh
    (32, -1, 3, [10, 11, 11]),        # master -1 -> 32 // 3 = 10, rest 22 -> 11, 11
    (32, 15, 2, [15, 17]),
    (32, -1, 4, [8, 8, 8, 8]),
    (32, -1, 1, [32]),
    (32, 18, 1, [32]),                # one GPU: the whole batch, the master size plays no role
])
def test_chunk_sizes_as_centernet(batch, master, gpus, expected):
    assert chunk_sizes(batch, master, gpus) == expected
    check_chunk_sizes(expected, batch, master, gpus)


def test_unvalidated_splits_are_returned_as_the_reference_computes_them():
    # CenterNet issue #697 and #115: the reference prints these and fails later.
    assert chunk_sizes(8, 2, 8) == [2, 1, 1, 1, 1, 1, 1, 0]
    assert chunk_sizes(4, 15, 2) == [15, -11]


def _message(chunks, batch, master, gpus):
    with pytest.raises(ConfigValueError) as err:
        check_chunk_sizes(chunks, batch, master, gpus)
    message = str(err.value)
    assert '\n' not in message
    return message


def test_master_larger_than_batch():
    message = _message(chunk_sizes(4, 15, 2), 4, 15, 2)
    assert 'CENTERNET.MASTER_BATCH_SIZE 15' in message and 'CENTERNET.BATCH_SIZE 4' in message


def test_zero_chunk():
    message = _message(chunk_sizes(8, 2, 8), 8, 2, 8)
    assert '[2, 1, 1, 1, 1, 1, 1, 0]' in message
    assert 'NUM_GPUS 8' in message and 'CENTERNET.BATCH_SIZE' in message


def test_batch_smaller_than_gpus_with_even_split():
    assert chunk_sizes(3, -1, 4) == [0, 1, 1, 1]
    assert 'gives a GPU no images' in _message([0, 1, 1, 1], 3, -1, 4)


def test_chunks_that_do_not_sum_to_the_batch():
    message = _message([16, 16, 16], 32, -1, 3)
    assert 'sum to 48' in message and 'CENTERNET.BATCH_SIZE 32' in message


def test_first_chunk_disagrees_with_explicit_master():
    message = _message([10, 11, 11], 32, 12, 3)
    assert 'CENTERNET.MASTER_BATCH_SIZE is 12' in message and 'CENTERNET.CHUNK_SIZES' in message


@pytest.mark.parametrize('chunks', [[16, 16], [8, 8, 8, 4, 4]])
def test_chunk_count_differs_from_gpus(chunks):
    message = _message(chunks, 32, -1, 4)
    assert 'NUM_GPUS 4' in message and '{} entries'.format(len(chunks)) in message
