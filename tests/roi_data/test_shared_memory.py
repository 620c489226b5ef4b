import numpy as np
import pytest
import torch

from detectron.roi_data.minibatch import collate_minibatch, collate_unresized
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


def _collate_unresized_in_worker(items):
    images, im_info, targets = collate_unresized(items)
    return images.images, [image.is_shared() for image in images.images], images.scales, im_info


@pytest.mark.processes
def test_unresized_images_of_a_worker_are_copied_into_shared_memory():
    rng = np.random.RandomState(5)
    ims = [rng.randint(0, 256, (h, w, 3)).astype(np.uint8) for h, w in ((30, 50), (45, 20))]
    items = [(im, 1.5 + k, np.array([1, 2, 3], np.float32), {}) for k, im in enumerate(ims)]
    loader = torch.utils.data.DataLoader(items, batch_size=2, num_workers=1, collate_fn=_collate_unresized_in_worker)
    (images, shared_in_worker, scales, im_info), = list(loader)
    assert shared_in_worker == [True, True]
    assert [image.numpy().tobytes() for image in images] == [im.tobytes() for im in ims]
    assert scales == [1.5, 2.5]
    np.testing.assert_array_equal(im_info.numpy(), [[1, 2, 3], [1, 2, 3]])
