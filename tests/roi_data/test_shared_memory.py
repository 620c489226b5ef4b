import numpy as np
import pytest
import torch

from detectron.roi_data.loader import build_train_loader
from detectron.roi_data.minibatch import UnresizedImages, collate_minibatch, collate_unresized
from detectron.roi_data.shared_memory import stacked_batch
from detectron.utils.blob import im_list_to_blob


def _arrays(dtype, count):
    return [np.random.RandomState(seed).randint(0, 200, (4, 3, 5)).astype(dtype) for seed in range(count)]


def _assert_same_bits(batch, arrays):
    expected = np.stack(arrays)
    assert batch.dtype == torch.from_numpy(expected).dtype and tuple(batch.shape) == expected.shape
    assert batch.numpy().tobytes() == expected.tobytes()


@pytest.mark.parametrize('dtype', [np.float32, np.int64, np.uint8])
def test_stacked_batch_is_np_stack_as_a_tensor(dtype):
    arrays = _arrays(dtype, 3)
    batch = stacked_batch(arrays)
    _assert_same_bits(batch, arrays)
    assert not batch.is_shared()   # the main process keeps ordinary memory


def test_stacked_batch_takes_the_rows_of_one_tensor_in_order_as_that_tensor():
    whole = torch.empty(3, 2, 4)
    whole.copy_(torch.arange(24.).reshape(3, 2, 4))
    assert stacked_batch(list(whole)) is whole    # a batch written in place is not copied
    for rows in (list(whole)[::-1], list(whole)[:2], list(whole[:, 0]), [whole[0], whole[0].clone(), whole[2]]):
        batch = stacked_batch(rows)   # any other rows are stacked as np.stack does
        assert batch is not whole and batch.numpy().tobytes() == np.stack(rows).tobytes()


def _stack_in_worker(arrays):
    batch = stacked_batch(arrays)
    return batch, batch.is_shared()


@pytest.mark.processes
def test_stacked_batch_of_a_worker_is_built_in_shared_memory():
    # Built in shared memory, the batch is sent as a handle; built elsewhere it would be copied into
    # shared memory again on the way.
    arrays = _arrays(np.float32, 4)
    loader = torch.utils.data.DataLoader(arrays, batch_size=4, num_workers=1, collate_fn=_stack_in_worker)
    (batch, shared_in_worker), = list(loader)
    assert shared_in_worker
    _assert_same_bits(batch, arrays)


def _rcnn_items():
    rng = np.random.RandomState(3)
    sizes = [(30, 50), (45, 20)]
    return [(rng.uniform(-5, 5, (h, w, 3)).astype(np.float32), np.array([h, w, 1.0], np.float32), {'k': i})
            for i, (h, w) in enumerate(sizes)]


def _collate_in_worker(items):
    images, im_info, targets = collate_minibatch(items, stride=32)
    return images, images.is_shared(), im_info, targets


@pytest.mark.processes
def test_rcnn_blob_of_a_worker_is_written_in_shared_memory():
    items = _rcnn_items()
    loader = torch.utils.data.DataLoader(items, batch_size=2, num_workers=1, collate_fn=_collate_in_worker)
    (images, shared_in_worker, im_info, targets), = list(loader)
    assert shared_in_worker
    expected = np.zeros((2, 3, 64, 64), np.float32)
    for i, (im, _, _) in enumerate(items):
        expected[i, :, :im.shape[0], :im.shape[1]] = im.transpose(2, 0, 1)
    assert images.numpy().tobytes() == expected.tobytes()
    assert images.numpy().tobytes() == im_list_to_blob([im for im, _, _ in items], 32).tobytes()
    np.testing.assert_array_equal(im_info.numpy(), [[30, 50, 1], [45, 20, 1]])
    assert [t['k'] for t in targets] == [0, 1]


def test_rcnn_blob_in_the_main_process_is_ordinary_memory():
    images, _, _ = collate_minibatch(_rcnn_items(), stride=32)
    assert not images.is_shared() and images.shape == (2, 3, 64, 64)


class _UnresizedItems(torch.utils.data.Dataset):
    """prepare_unresized_training_entry's items: uint8 images of two sizes, scales, im_info, targets."""

    def __init__(self, ims):
        self.ims = ims

    def __len__(self):
        return len(self.ims)

    def __getitem__(self, key):
        _, index = key
        return self.ims[index], 1.5 + index, np.array([1, 2, index], np.float32), {'boxes': torch.full((2, 4), index)}


@pytest.mark.processes
def test_unresized_images_leave_a_worker_with_the_targets_in_one_shared_tensor():
    rng = np.random.RandomState(5)
    ims = [rng.randint(0, 256, (h, w, 3)).astype(np.uint8) for h, w in ((300, 500), (450, 200))]  # 450 and 270 kB
    (images, im_info, targets), = list(build_train_loader(_UnresizedItems(ims), [[0, 1]], collate_unresized,
                                                          num_workers=1))
    assert isinstance(images, UnresizedImages) and images.scales == [1.5, 2.5]
    assert [image.numpy().tobytes() for image in images.images] == [im.tobytes() for im in ims]
    np.testing.assert_array_equal(im_info.numpy(), [[1, 2, 0], [1, 2, 1]])
    assert [t['boxes'].tolist() for t in targets] == [[[0] * 4] * 2, [[1] * 4] * 2]
    # Views of one tensor: the main process received one file descriptor for the whole batch.
    tensors = images.images + [im_info] + [t['boxes'] for t in targets]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
