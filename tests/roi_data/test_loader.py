import functools
import itertools

import cv2
import numpy as np
import pytest
import torch

from detectron.roi_data.loader import (SHARED_ARRAY_MIN_BYTES, PackedList, SharedLeaves, TrainingDataset,
                                       aspect_ratio_groups, packed_leaves, build_test_loader, build_train_loader)
from detectron.roi_data.minibatch import TRAINING_KEYS, collate_minibatch, prepare_training_entry
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils.errors import DatasetError

PIXEL_MEANS = (102.9801, 115.9465, 122.7717)
# (height, width) of the tiny dataset's images
SIZES = [(40, 60), (64, 40), (50, 50), (30, 90), (70, 20), (20, 70)]


@pytest.fixture
def roidb(tmp_path):
    rng = np.random.RandomState(0)
    entries = []
    for i, (height, width) in enumerate(SIZES):
        path = tmp_path / 'im{}.png'.format(i)
        assert cv2.imwrite(str(path), rng.randint(0, 256, (height, width, 3)).astype(np.uint8))
        entries.append({
            'image': str(path), 'height': height, 'width': width, 'flipped': i % 2 == 1,
            'boxes': np.array([[1, 2, 10, 12], [3, 3, 8, 9]], dtype=np.float32) + i,
            'gt_classes': np.array([i + 1, 0], dtype=np.int32),
            'is_crowd': np.array([i == 3, False]),
            'max_overlaps': np.ones(2, dtype=np.float32),
            'gt_overlaps': np.zeros((2, 81), dtype=np.float32),   # heavy field the loader must not need
        })
    return entries


BATCHES = [[0, 2], [1, 3], [3, 0], [2, 1], [0, 1], [2, 3]]
SCALES = (16, 24, 32, 40)


def _train_loader(roidb, batches=BATCHES, num_workers=0, seed=3, start_iter=0, scales=SCALES):
    """R-CNN's training loader, assembled as rcnn_builder does from cfg."""
    prepare = functools.partial(prepare_training_entry, scales=scales, max_size=1000, pixel_means=PIXEL_MEANS)
    dataset = TrainingDataset(roidb, prepare, seed=seed, keys=TRAINING_KEYS)
    return build_train_loader(dataset, batches, functools.partial(collate_minibatch, stride=32),
                              num_workers=num_workers, start_iter=start_iter)


def _assert_batches_equal(first, second):
    assert len(first) == len(second)
    for (images_a, info_a, targets_a), (images_b, info_b, targets_b) in zip(first, second):
        assert torch.equal(images_a, images_b)
        assert torch.equal(info_a, info_b)
        for ta, tb in zip(targets_a, targets_b):
            assert all(torch.equal(ta[k], tb[k]) for k in ('boxes', 'classes', 'is_crowd'))


def test_aspect_ratio_groups(roidb):
    # 60 wide x 40 high, 40x64, 50x50 (square counts as horizontal), 90x30, 20x70, 70x20.
    assert aspect_ratio_groups(roidb) == [True, False, True, True, False, True]


def test_packed_list_round_trip():
    objects = [{'image': 'a.jpg', 'boxes': np.arange(8.0).reshape(2, 4)}, 'b', 3]
    packed = PackedList(objects)
    assert len(packed) == 3
    np.testing.assert_array_equal(packed[0]['boxes'], objects[0]['boxes'])
    assert packed[0]['image'] == 'a.jpg'
    assert (packed[1], packed[2]) == ('b', 3)
    assert len(PackedList([])) == 0


def test_train_batches_follow_the_contract(roidb):
    batches = list(_train_loader(roidb))
    assert len(batches) == len(BATCHES)
    for indices, (images, im_info, targets) in zip(BATCHES, batches):
        assert images.dtype == torch.float32 and im_info.dtype == torch.float32
        assert images.shape[:2] == (2, 3)
        assert images.shape[2] % 32 == 0 and images.shape[3] % 32 == 0
        assert im_info.shape == (2, 3)
        for i, index in enumerate(indices):
            height, width = SIZES[index]
            scale = im_info[i, 2].item()
            assert round(min(height, width) * scale) in SCALES
            assert im_info[i, :2].tolist() == [round(height * scale), round(width * scale)]
            assert images.shape[2] >= im_info[i, 0] and images.shape[3] >= im_info[i, 1]
        assert [t['classes'].tolist() for t in targets] == [[index + 1] for index in indices]
        for t, index in zip(targets, indices):
            assert t['boxes'].dtype == torch.float32 and t['boxes'].tolist() == [
                [1 + index, 2 + index, 10 + index, 12 + index]]
            assert t['classes'].dtype == torch.int64
            assert t['is_crowd'].dtype == torch.bool and t['is_crowd'].tolist() == [index == 3]


def test_loader_batch_equals_the_batch_made_in_process(roidb):
    # With one training scale there is nothing random: both paths must give identical tensors.
    loaded = list(_train_loader(roidb, batches=[[1, 3]], scales=(24,)))
    rng = np.random.RandomState(0)
    direct = collate_minibatch([prepare_training_entry(roidb[i], rng, (24,), 1000, PIXEL_MEANS) for i in (1, 3)], 32)
    _assert_batches_equal(loaded, [direct])


@pytest.mark.processes
def test_same_seed_same_batches_whatever_the_workers(roidb):
    in_process = list(_train_loader(roidb, num_workers=0))
    with_workers = list(_train_loader(roidb, num_workers=2))
    _assert_batches_equal(in_process, with_workers)


def test_scale_draws_depend_on_seed_and_iteration(roidb):
    # Image 0 at twelve iterations: one draw per iteration, so its scale varies over them.
    repeated = [[0, 1]] * 12
    draws = torch.cat([info for _, info, _ in _train_loader(roidb, batches=repeated)])[0::2, 2]
    other_seed = torch.cat([info for _, info, _ in _train_loader(roidb, batches=repeated, seed=4)])[0::2, 2]
    short_sides = {round(40 * s) for s in draws.tolist()}
    assert len(short_sides) > 1 and short_sides <= set(SCALES)
    assert not torch.equal(draws, other_seed)


def test_resumed_loader_repeats_the_uninterrupted_run(roidb):
    full = list(_train_loader(roidb))
    resumed = list(_train_loader(roidb, batches=BATCHES[2:], start_iter=2))
    _assert_batches_equal(full[2:], resumed)


@pytest.mark.parametrize('num_workers', [0, 1])
def test_corrupt_image_raises_one_line_dataset_error_naming_it(roidb, tmp_path, num_workers):
    corrupt = tmp_path / 'corrupt.jpg'
    corrupt.write_bytes(b'\x00not an image')
    roidb[2]['image'] = str(corrupt)
    with pytest.raises(DatasetError) as info:
        list(_train_loader(roidb, batches=[[0, 1], [0, 2]], num_workers=num_workers))
    assert str(corrupt) in str(info.value)
    assert '\n' not in str(info.value)


@pytest.mark.processes
def test_missing_test_image_raises_one_line_dataset_error_naming_it(roidb):
    missing = roidb[1]['image'] + '.gone'
    roidb[1]['image'] = missing
    with pytest.raises(DatasetError) as info:
        list(build_test_loader(roidb, [0, 1, 2], num_workers=1))
    assert missing in str(info.value)
    assert '\n' not in str(info.value)


@pytest.mark.processes
def test_test_loader_yields_original_bgr_images_in_order(roidb):
    loaded = list(build_test_loader(roidb, [2, 0, 3], num_workers=1))
    assert [index for _, index in loaded] == [2, 0, 3]
    for sample, index in loaded:
        image = sample['image']
        assert isinstance(image, np.ndarray) and image.dtype == np.uint8
        np.testing.assert_array_equal(image, cv2.imread(roidb[index]['image']))


def _centernet_like_sample(im):
    """A prepared sample as CenterNet's: per-scale inputs in a list, small arrays in metas."""
    big = np.repeat(im[:, :, :1], 48, axis=2)      # at least SHARED_ARRAY_MIN_BYTES for the fixture's images
    return {'image': im, 'inputs': [big, big[::2, ::-1]], 'metas': [{'c': np.array([1.5, 2.5], np.float32),
                                                                     's': 7.0}], 'tag': 'x'}


def _sample_is_shared_in_worker(item):
    sample, index = item.skeleton
    return (index, isinstance(item, SharedLeaves) and item.buffer.is_shared(), len(item.layouts),
            isinstance(sample['metas'][0]['c'], np.ndarray))


@pytest.mark.processes
def test_large_test_arrays_leave_a_worker_in_one_shared_tensor(roidb):
    loader = build_test_loader(roidb, [0, 4], num_workers=1, prepare=_centernet_like_sample)
    loader.data_loader.collate_fn = _sample_is_shared_in_worker   # runs in the worker, sees what it sends
    # The first input in the shared tensor; the image, the half-size second input and the metas,
    # each under SHARED_ARRAY_MIN_BYTES, pickled as they are.
    assert list(loader.data_loader) == [(0, True, 1, True), (4, True, 1, True)]


@pytest.mark.processes
@pytest.mark.parametrize('num_workers', [0, 2])
def test_grouped_test_samples_arrive_in_order_as_prepared(roidb, num_workers):
    """group 2 over 5 indices: the samples of ungrouped loading, in order; a worker sends each group
    (2, 2, then 1 sample) in one shared tensor."""
    indices = [3, 1, 5, 0, 4]
    grouped = list(build_test_loader(roidb, indices, num_workers=num_workers, prepare=_centernet_like_sample,
                                     group=2))
    single = list(build_test_loader(roidb, indices, num_workers=num_workers, prepare=_centernet_like_sample))
    assert [i for _, i in grouped] == [i for _, i in single] == indices
    for (got, _), (want, _) in zip(grouped, single):
        for a, b in [(got['image'], want['image'])] + list(zip(got['inputs'], want['inputs'])):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        np.testing.assert_array_equal(got['metas'][0]['c'], want['metas'][0]['c'])
    if num_workers:
        loader = build_test_loader(roidb, indices, num_workers=1, prepare=_centernet_like_sample, group=2)
        loader.data_loader.collate_fn = lambda item: (
            type(item).__name__, [i for _, i in item.skeleton], item.buffer.is_shared(), len(item.layouts))
        assert list(loader.data_loader) == [('SharedLeaves', [3, 1], True, 2), ('SharedLeaves', [5, 0], True, 2),
                                            ('SharedLeaves', [4], True, 1)]


@pytest.mark.processes
def test_a_missing_image_in_a_group_is_one_dataset_error(roidb):
    missing = roidb[4]['image'] + '.gone'
    roidb[4]['image'] = missing
    with pytest.raises(DatasetError, match=missing):
        list(build_test_loader(roidb, [0, 1, 2, 4, 5], num_workers=1, group=2))


def test_a_packed_sample_gives_back_its_arrays_aligned_with_their_dtypes_and_shapes():
    rng = np.random.RandomState(0)
    sample = {'a': rng.rand(129, 131).astype(np.float32), 'b': [rng.randint(0, 255, (257, 255, 3)).astype(np.uint8),
                                                                 rng.rand(3, 5)], 'c': (7, rng.rand(9000))}
    packed = packed_leaves(sample, lambda leaf: isinstance(leaf, np.ndarray) and leaf.nbytes >= 65536)
    # 67596 bytes of float32, then 196605 of uint8, each rounded up to a multiple of 64; then float64.
    assert [layout[0] for layout in packed.layouts] == [0, 67648, 67648 + 196608]
    assert packed.buffer.dtype == torch.uint8 and packed.buffer.numel() == 67648 + 196608 + 72000
    got = packed.unpacked()
    for key in 'ab':
        assert isinstance(got[key], type(sample[key]))
    for got_array, want in [(got['a'], sample['a']), (got['b'][0], sample['b'][0]), (got['c'][1], sample['c'][1])]:
        assert got_array.dtype == want.dtype and got_array.flags['ALIGNED']
        np.testing.assert_array_equal(got_array, want)
        assert np.shares_memory(got_array, packed.buffer.numpy())
    assert got['b'][1] is sample['b'][1] and got['c'][0] == 7  # small leaves stay as they were


class _TargetTensors(torch.utils.data.Dataset):
    """Training items shaped like R-CNN's: small target tensors of several dtypes, an empty one, a large one in
    ordinary memory (an unresized image) and a large one written into shared memory (a worker's blob)."""

    def __len__(self):
        return 8

    def __getitem__(self, key):
        _, index = key
        return {'boxes': torch.arange(8, dtype=torch.float32).view(2, 4) + index, 'classes': torch.tensor([index, -3]),
                'is_crowd': torch.tensor([index % 2 == 0, True]), 'edges': torch.zeros((0, 4)),
                'image': torch.full((128, 128), float(index)),   # 65536 bytes, packed with the rest
                'blob': torch.full((128, 128), -float(index)).share_memory_()}   # travels on its own


def _expected_targets(index):
    return _TargetTensors()[(0, index)]


def test_a_training_batch_travels_in_one_shared_tensor_but_its_large_shared_tensors(monkeypatch):
    from detectron.roi_data import loader as loader_module
    monkeypatch.setattr(loader_module, 'get_worker_info', lambda: object())   # as in a worker
    batch = loader_module._collate_or_error([_expected_targets(i) for i in (3, 6)], collate=list)
    assert isinstance(batch, SharedLeaves) and len(batch.layouts) == 10   # 5 tensors x 2 items
    assert [layout[0] % 64 for layout in batch.layouts] == [0] * 10
    for got, index in zip(batch.unpacked(), (3, 6)):
        for key, want in _expected_targets(index).items():
            assert got[key].dtype == want.dtype and got[key].shape == want.shape and torch.equal(got[key], want)
        assert got['blob'].untyped_storage().data_ptr() != batch.buffer.untyped_storage().data_ptr()
        for key in ('boxes', 'image'):
            assert got[key].untyped_storage().data_ptr() == batch.buffer.untyped_storage().data_ptr()


def test_pinning_a_packed_batch_pins_its_tensor_and_the_tensors_that_travel_on_their_own_then_unpacks(monkeypatch):
    from detectron.roi_data import loader as loader_module
    monkeypatch.setattr(loader_module, 'get_worker_info', lambda: object())   # as in a worker
    batch = loader_module._collate_or_error([_expected_targets(1)], collate=list)
    pinned = []

    def fake_pin(tensor):   # pin_memory needs CUDA; record what would be pinned, as a copy
        pinned.append(tensor.data_ptr())
        return tensor.clone()

    monkeypatch.setattr(torch.Tensor, 'pin_memory', fake_pin)
    blob = batch.skeleton[0]['blob']
    (targets,) = batch.pin_memory()   # unpacked by the pin-memory thread
    assert sorted(pinned) == sorted([batch.buffer.data_ptr(), blob.data_ptr()])
    assert targets['boxes'].untyped_storage().data_ptr() == targets['image'].untyped_storage().data_ptr() != \
        batch.buffer.untyped_storage().data_ptr()
    assert all(torch.equal(targets[key], want) for key, want in _expected_targets(1).items())
    assert targets['blob'].data_ptr() != blob.data_ptr() and torch.equal(targets['blob'], blob)


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (pinned memory)')
def test_on_cuda_every_tensor_of_a_batch_from_a_worker_is_pinned():
    loader = build_train_loader(_TargetTensors(), [[1, 2]], list, num_workers=1)
    (batch,) = list(loader)
    assert all(t.is_pinned() for item in batch for t in item.values())


@pytest.mark.processes
def test_training_batches_from_a_worker_equal_the_collated_items():
    loader = build_train_loader(_TargetTensors(), [[1, 2], [5, 0]], list, num_workers=1)
    for batch, indices in zip(loader, ([1, 2], [5, 0])):
        for got, index in zip(batch, indices):
            for key, want in _expected_targets(index).items():
                assert got[key].dtype == want.dtype and torch.equal(got[key], want)


@pytest.mark.parametrize('num_workers', [0, 2])
def test_test_samples_arrive_as_prepared_numpy_arrays(roidb, num_workers):
    loaded = list(build_test_loader(roidb, [3, 1, 5], num_workers=num_workers, prepare=_centernet_like_sample))
    assert [index for _, index in loaded] == [3, 1, 5]
    for sample, index in loaded:
        expected = _centernet_like_sample(cv2.imread(roidb[index]['image']))
        assert expected['inputs'][0].nbytes >= SHARED_ARRAY_MIN_BYTES > expected['image'].nbytes
        for got, want in [(sample['image'], expected['image'])] + list(zip(sample['inputs'], expected['inputs'])):
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
        assert isinstance(sample['inputs'], list) and sample['tag'] == 'x' and sample['metas'][0]['s'] == 7.0
        np.testing.assert_array_equal(sample['metas'][0]['c'], [1.5, 2.5])


def _indices_of(targets):
    return [int(t['classes'][0]) - 1 for t in targets]   # the fixture gives entry i class i + 1


def test_grouped_sampler_batches_hold_one_orientation(roidb):
    sampler = GroupedDistributedBatchSampler(aspect_ratio_groups(roidb), 2, seed=5, rank=0, world_size=1)
    for _, im_info, targets in itertools.islice(_train_loader(roidb, batches=sampler), 8):
        landscape = (im_info[:, 1] >= im_info[:, 0]).tolist()
        assert landscape[0] == landscape[1]
        assert [SIZES[i][1] >= SIZES[i][0] for i in _indices_of(targets)] == landscape


def test_scales_do_not_depend_on_the_number_of_ranks(roidb):
    # One rank with 2 images per batch and two ranks with 1 each see the same global batches,
    # and each image gets the same scale in both runs.
    groups = aspect_ratio_groups(roidb)

    def run(rank, world_size):
        sampler = GroupedDistributedBatchSampler(groups, 2 // world_size, seed=5, rank=rank,
                                                 world_size=world_size)
        return list(itertools.islice(_train_loader(roidb, batches=sampler), 6))

    single, rank0, rank1 = run(0, 1), run(0, 2), run(1, 2)
    for (_, info, targets), (_, info0, targets0), (_, info1, targets1) in zip(single, rank0, rank1):
        assert _indices_of(targets) == _indices_of(targets0) + _indices_of(targets1)
        assert torch.equal(info, torch.cat([info0, info1]))


def _killed_worker(entry, rng):
    import os
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.processes
def test_a_killed_loader_worker_is_one_line(roidb):
    from detectron.roi_data.loader import TrainingDataset
    from detectron.utils.errors import LoaderWorkerError
    dataset = TrainingDataset(roidb, _killed_worker, seed=0)
    with pytest.raises(LoaderWorkerError) as info:
        list(build_train_loader(dataset, [[0]], collate_minibatch, num_workers=1))
    message = str(info.value)
    assert message.startswith('DataLoader worker (pid') and ('killed by signal' in message or 'exited' in message)
    assert '\n' not in message and 'DATA_LOADER.NUM_THREADS' in message


def test_a_worker_dying_while_its_batch_is_received_is_one_line():
    # Seen in fault case 13: the worker is killed mid-transfer, the receiving end gets a
    # ConnectionResetError before torch's SIGCHLD check reports the death.
    from detectron.roi_data.loader import RaisingLoader
    from detectron.utils.errors import LoaderWorkerError

    def batches():
        yield 'first batch'
        raise ConnectionResetError(104, 'Connection reset by peer')
    got = []
    with pytest.raises(LoaderWorkerError) as info:
        for batch in RaisingLoader(batches()):
            got.append(batch)
    assert got == ['first batch']
    assert str(info.value).startswith('a DataLoader worker died while sending a batch (ConnectionResetError: ')
    assert '\n' not in str(info.value)


@pytest.mark.processes
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='pinned memory needs CUDA')
def test_large_test_arrays_arrive_in_pinned_memory_with_cuda(roidb):
    (sample, _), = list(build_test_loader(roidb, [0], num_workers=1, prepare=_centernet_like_sample))
    assert torch.from_numpy(sample['inputs'][0]).is_pinned()      # uploads can be asynchronous
    assert not torch.from_numpy(sample['image']).is_pinned()      # small: pickled as it was


class _MarkingPrepare:
    """A test-time prepare that leaves a file per image it prepared (in the worker)."""

    def __init__(self, folder):
        self.folder = folder

    def __call__(self, im):
        (self.folder / '{}x{}'.format(*im.shape[:2])).touch()
        return {'image': im}


@pytest.mark.processes
def test_the_test_loader_reads_ahead_as_soon_as_it_is_iterated(roidb, tmp_path):
    """test_net starts the workers before it loads the model: iter() alone has them prepare images."""
    import time
    marks = tmp_path / 'marks'
    marks.mkdir()
    images = iter(build_test_loader(roidb, [0, 1], num_workers=1, prepare=_MarkingPrepare(marks)))
    deadline = time.time() + 30
    while len(list(marks.iterdir())) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert len(list(marks.iterdir())) == 2  # both prepared, none asked for yet
    assert [index for _, index in images] == [0, 1]


@pytest.mark.processes
def test_ready_batches_count_what_the_workers_finished_and_the_loop_has_not_taken(roidb):
    """json_stats' mb_qsize: with 2 workers (2 batches each in flight) a loop that waits finds the
    workers' finished batches ready, at most the 4 in flight; taking them all leaves none; without
    workers there is no queue."""
    import time
    loader = _train_loader(roidb, num_workers=2)
    batches = iter(loader)
    next(batches)
    deadline = time.time() + 30
    while loader.ready_batches() < 4 and time.time() < deadline:
        time.sleep(0.05)
    assert loader.ready_batches() == 4  # 5 batches left, 4 of them requested from the workers and done
    assert len(list(batches)) == len(BATCHES) - 1
    assert loader.ready_batches() == 0
    in_process = _train_loader(roidb, num_workers=0)
    next(iter(in_process))
    assert in_process.ready_batches() == 0
