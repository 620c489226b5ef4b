"""Training and test data loaders over a roidb (torch DataLoader based), for any model.

Detectron fed GPUs from Python threads and queues; here DataLoader worker processes prepare
samples and a batch sampler (roi_data/samplers.py) decides which entries form each batch. What a
sample is (R-CNN's scaled image and gt, CenterNet's affine crop and heatmaps) is the model's: the
model builder hands in a `prepare` function and a `collate` function.

Reproducibility: a training sample's random draws come from a RandomState seeded by
(seed, iteration, roidb index), so batches do not depend on the number of workers or on which
worker built them, and a resumed run draws the same as an uninterrupted one.

Unreadable images: a worker returns the DatasetError instead of raising it, and the loader raises
it in the main process. Raised in a worker, DataLoader would re-raise it with the worker's whole
traceback as its message, and the user should read one line naming the file.

Stalled reads: a worker that delivers no batch within `timeout` seconds (DATA_LOADER.TIMEOUT_S; an image on
a hung network mount never finishes reading) ends the run with one LoaderWorkerError line naming the
images it was reading; DataLoader then stops its workers.
"""

import functools
import pickle
import signal
import sys

import cv2
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, get_worker_info

from detectron.datasets.proposal_files import proposal_rows
from detectron.roi_data.minibatch import read_entry_image
from detectron.roi_data.shared_memory import empty_for_main_process
from detectron.utils.errors import DEAD_WORKER_HINT, DatasetError, LoaderWorkerError, dead_loader_workers_as_errors
from detectron.utils.lifetime import die_with_parent

class PackedList:
    """Read-only list stored as one pickled byte buffer.

    Forked workers touching a list of dicts bump every object's refcount and so copy the roidb's
    memory pages one by one; a single numpy buffer has no per-item objects to touch.
    """

    def __init__(self, objects):
        chunks = [np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
                  for obj in objects]
        self._ends = np.cumsum([len(chunk) for chunk in chunks], dtype=np.int64)
        self._buffer = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)

    def __len__(self):
        return len(self._ends)

    def __getitem__(self, index):
        start = 0 if index == 0 else int(self._ends[index - 1])
        return pickle.loads(self._buffer[start:int(self._ends[index])].tobytes())


def aspect_ratio_groups(roidb):
    """Per entry: True if landscape or square (width >= height), Detectron's ASPECT_GROUPING split."""
    return [entry['width'] >= entry['height'] for entry in roidb]


def scale_rng(seed, iteration, index):
    """RandomState owned by one (seed, iteration, roidb index) draw."""
    return np.random.RandomState(np.random.SeedSequence((seed, iteration, index)).generate_state(4))


class TrainingDataset(Dataset):
    """Prepared training samples, addressed by (iteration, roidb index) keys.

    prepare(entry, rng) -> sample; the iteration is part of the key so an entry seen at two
    iterations gets independent draws. keys: the entry fields to keep (None: all).

    batch_input: None, or the (shape, dtype) of every sample's 'input', which prepare(entry, rng,
    out=) then writes into its row of one tensor per batch (in shared memory in a worker): the
    samples' inputs are that tensor's rows, which collate's stacked_batch takes as they are instead
    of copying each image once more (BENCHMARKS.md, "CenterNet speed").
    """

    def __init__(self, roidb, prepare, seed, keys=None, batch_input=None):
        self._entries = PackedList(entry if keys is None else {key: entry[key] for key in keys}
                                   for entry in roidb)
        self._prepare = prepare
        self._seed = seed
        self._batch_input = batch_input

    def __len__(self):
        return len(self._entries)

    def image_of(self, key):
        """The image file of a (iteration, roidb index) key (for the stalled-read error)."""
        return self._entries[key[1]].get('image', 'roidb entry {}'.format(key[1]))

    def __getitem__(self, key):
        return self._sample(key)

    def __getitems__(self, keys):
        """The samples of one batch (DataLoader's batched fetch)."""
        if self._batch_input is None:
            return [self._sample(key) for key in keys]
        shape, dtype = self._batch_input
        inputs = empty_for_main_process((len(keys),) + tuple(shape), dtype)
        samples = [self._sample(key, out=row.numpy()) for key, row in zip(keys, inputs)]
        for sample, row in zip(samples, inputs):
            if not isinstance(sample, DatasetError):
                sample['input'] = row
        return samples

    def _sample(self, key, **out):
        iteration, index = key
        try:
            return self._prepare(self._entries[index], scale_rng(self._seed, iteration, index), **out)
        except DatasetError as err:
            return err


def _collate_or_error(items, collate):
    errors = [item for item in items if isinstance(item, DatasetError)]
    if errors:
        return errors[0]
    batch = collate(items)
    return packed_leaves(batch, _travels_packed) if get_worker_info() is not None else batch


def _travels_packed(leaf):
    # Each tensor sent on its own costs the main process a connection (BENCHMARKS.md, "Real loops"): the
    # targets and unresized images of a batch share one tensor. A large tensor the worker already wrote into
    # shared memory (a blob, a stacked CenterNet batch) travels on its own: a copy would cost more.
    return isinstance(leaf, torch.Tensor) and (leaf.nbytes < SHARED_ARRAY_MIN_BYTES or not leaf.is_shared())


class IterationTaggedBatches:
    """Batch sampler adapter: yields [(iteration, index), ...] for the dataset's keys."""

    def __init__(self, batch_sampler, start_iter):
        self._batch_sampler = batch_sampler
        self._start_iter = start_iter

    def __iter__(self):
        for iteration, batch in enumerate(self._batch_sampler, start=self._start_iter):
            yield [(iteration, int(index)) for index in batch]


class RaisingLoader:
    """Iterates a DataLoader, raising the DatasetErrors its workers returned, and a worker's death
    as one LoaderWorkerError line instead of DataLoader's traceback; with groups, the DataLoader's
    items are lists, whose elements it yields one by one. With eager, iter() starts the workers at
    once; otherwise they start with the first item asked for (DataLoader's start draws its base seed
    from torch's generator, which a training run draws from too: resumed runs replay that order)."""

    def __init__(self, data_loader, groups=False, eager=False, numbered=None):
        self.data_loader = data_loader
        self.groups = groups
        self.eager = eager
        self.numbered = numbered  # the NumberedIndices the DataLoader draws from, if any
        self.current = None  # the DataLoader iterator being read

    def ready_batches(self):
        """Items the workers have finished that the main process has not taken yet (Detectron's
        `mb_qsize`): those waiting in DataLoader's queue (past the pin-memory thread, with CUDA) and
        those received ahead of their turn. 0 without workers, or where the queue cannot tell its size."""
        queue = getattr(self.current, '_data_queue', None)
        try:
            waiting = queue.qsize() if queue is not None else 0
        except (NotImplementedError, OSError):  # multiprocessing queues on macOS; a closed queue
            waiting = 0
        early = getattr(self.current, '_task_info', {})
        return waiting + sum(1 for info in list(early.values()) if len(info) == 2)

    def __iter__(self):
        if not self.eager:
            return self._raising(self.data_loader)
        with dead_loader_workers_as_errors():
            items = iter(self.data_loader)
        return self._raising(items)

    def _raising(self, items):
        iterator = None
        try:
            with dead_loader_workers_as_errors():
                iterator = self.current = iter(items)
                for item in iterator:
                    if isinstance(item, DatasetError):
                        raise item
                    item = item.unpacked() if isinstance(item, SharedLeaves) else item
                    yield from item if self.groups else (item,)
        except ConnectionError as err:
            # A worker killed while its batch was being received (torch's SIGCHLD error follows).
            raise LoaderWorkerError('a DataLoader worker died while sending a batch ({}: {}) {}'.format(
                type(err).__name__, err, DEAD_WORKER_HINT)) from None
        except RuntimeError as err:
            if not str(err).startswith('DataLoader timed out'):
                raise
            raise LoaderWorkerError(stalled_batch_message(self.data_loader, iterator, self.numbered)) from None


# DataLoader's timeout error names no file; the loader's names the images that stalled.
_MAX_NAMED_IMAGES = 4


class NumberedIndices:
    """A DataLoader's sampler or batch sampler that remembers what it handed out, by position in the current
    pass: DataLoader numbers its tasks in the same order (its iterator's `_rcvd_idx` is the one it waits
    for), so a timed-out wait can name the images of the batch it waited for. Keeps the last `window`."""

    def __init__(self, indices, window=4096):
        self.indices = indices
        self.window = window
        self.issued = {}

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        self.issued = {}
        for position, item in enumerate(self.indices):
            self.issued[position] = item
            self.issued.pop(position - self.window, None)
            yield item


def stalled_batch_message(data_loader, iterator, numbered):
    """One sentence for a DataLoader that timed out: its worker, the images of the batch it owes, the key."""
    waited_for = getattr(iterator, '_rcvd_idx', None)
    task = getattr(iterator, '_task_info', {}).get(waited_for)
    worker = task[0] if task else None
    keys = numbered.issued.get(waited_for) if numbered is not None else None
    keys = [] if keys is None else keys if isinstance(keys, list) else [keys]
    image_of = getattr(data_loader.dataset, 'image_of', None)
    images = [str(image_of(key)) for key in keys] if image_of is not None else []
    workers = getattr(iterator, '_workers', [])
    who = ('DataLoader worker {} (pid {})'.format(worker, workers[worker].pid)
           if worker is not None and worker < len(workers) else 'a DataLoader worker')
    reading = ('; the batch it owes holds {}{}'.format(', '.join(images[:_MAX_NAMED_IMAGES]),
                                                  ' and {} more'.format(len(images) - _MAX_NAMED_IMAGES)
                                                  if len(images) > _MAX_NAMED_IMAGES else '')
               if images else '')
    return ('{} delivered no batch in {:g} s (DATA_LOADER.TIMEOUT_S){}: a read that never finishes (e.g. a file on '
            'a stalled network mount, or a pipe); check those files and their filesystem, or raise '
            'DATA_LOADER.TIMEOUT_S for slow storage; the loader workers were stopped'.format(
                who, data_loader.timeout, reading))


def _init_worker(worker_id):
    # A worker must not outlive its process, even one killed by SIGKILL (it would keep reading
    # images for minutes, reparented to init).
    die_with_parent()
    # torch's worker loop has just set a C handler that lets SIGTERM kill the worker, which makes torch's
    # SIGCHLD handler raise in the main process while that stops the job with its one line
    # (errors.termination_signals_raise). SIGTERM ends a worker quietly instead, as Ctrl-C does (the
    # loop swallows KeyboardInterrupt).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    # Each worker resizes its own images; OpenCV's own thread pool in every worker would
    # oversubscribe the CPU cores the workers already share.
    cv2.setNumThreads(1)
    # Shared-memory tensors leave a worker as file descriptors handed over by a multiprocessing
    # thread (resource_sharer), which prints a traceback when the main process dies mid-handover;
    # the main process's own error line says what happened.
    sys.excepthook = _silent_when_the_peer_vanished(sys.excepthook)


def _silent_when_the_peer_vanished(excepthook):
    def hook(exc_type, exc, traceback):
        if not issubclass(exc_type, (ConnectionResetError, BrokenPipeError)):
            excepthook(exc_type, exc, traceback)
    return hook


def _single_threaded_opencv_before_fork(num_workers):
    """A forked worker that changes the thread count of an OpenCV pool its parent had started
    deadlocks; with the parent's count already 1 the worker's call changes nothing."""
    if num_workers > 0:
        cv2.setNumThreads(1)


def build_train_loader(dataset, batch_sampler, collate, num_workers, start_iter=0, timeout=0):
    """Iterable of training batches: collate(list of dataset samples) for each sampler batch.

    timeout: seconds a worker may take over a batch (DATA_LOADER.TIMEOUT_S; 0: forever; only with workers).

    batch_sampler: iterable of roidb index lists for this process (GroupedDistributedBatchSampler),
    started at start_iter; start_iter must match so resumed runs draw the same samples.
    """
    _single_threaded_opencv_before_fork(num_workers)
    numbered = NumberedIndices(IterationTaggedBatches(batch_sampler, start_iter))
    return RaisingLoader(DataLoader(
        dataset,
        batch_sampler=numbered,
        collate_fn=functools.partial(_collate_or_error, collate=collate),
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        worker_init_fn=_init_worker,
        timeout=_worker_timeout(num_workers, timeout),
    ), numbered=numbered)


def _worker_timeout(num_workers, timeout):
    # DataLoader refuses a timeout without workers: the main process reads, and cannot time itself out.
    return float(timeout) if num_workers > 0 and timeout and timeout > 0 else 0


class InferenceImageDataset(Dataset):
    """prepare(original BGR uint8 image) with its roidb index; prepare returns a dict holding the
    image under 'image' plus whatever the model's test-time preprocessing adds. In a worker its
    large arrays are packed for the trip to the main process (SharedLeaves)."""

    def __init__(self, roidb, prepare, proposals=False):
        # The image and, where the entry has them, the width and height its decoded size must match;
        # with proposals, the entry's proposals (proposal_files.proposal_rows) go into the sample.
        self._entries = PackedList(dict({key: entry[key] for key in ('image', 'height', 'width') if key in entry},
                                        **({'proposals': proposal_rows(entry)} if proposals else {}))
                                   for entry in roidb)
        self._prepare = prepare

    def __len__(self):
        return len(self._entries)

    def image_of(self, index):
        """The image file of a roidb index (for the stalled-read error)."""
        return self._entries[index]['image']

    def __getitem__(self, index):
        return self._items([index], group=False)

    def __getitems__(self, indices):
        """DataLoader's call for a group of indices (build_test_loader's group > 1): the list of
        their (sample, index) pairs."""
        return self._items(indices, group=True)

    def _items(self, indices, group):
        try:
            items = [(self._sample(self._entries[i]), i) for i in indices]
        except DatasetError as err:
            return err
        item = items if group else items[0]
        return item if get_worker_info() is None else packed_leaves(item, _is_large_array)

    def _sample(self, entry):
        sample = self._prepare(read_entry_image(entry))
        if 'proposals' in entry:
            sample['proposals'] = entry['proposals']
        return sample


class SharedLeaves:
    """A loader worker's item (nested dicts, lists and tuples) on its way to the main process, some
    of its leaves (numpy arrays or tensors) packed into one uint8 tensor in shared memory.

    Shared memory, because a file descriptor crosses the pipe instead of the pickled bytes, which
    the main process (the one that feeds the GPU) would otherwise read and unpickle itself
    (the main process's CPU per image is what limits the loop). One tensor per item, because each
    descriptor handed over costs the receiving process a socket connection with an authentication
    round trip (BENCHMARKS.md, "Real loops"); torch sends
    every tensor of a batch by its own descriptor. pin_memory() lets DataLoader's pin-memory thread,
    which then also receives the items ahead of the main thread, copy it into pinned memory for
    asynchronous uploads.

    skeleton: the item with each packed leaf replaced by a _Packed; layouts: the (byte offset, numpy
    array or tensor, dtype, shape, bytes) of each packed leaf in the tensor."""

    def __init__(self, skeleton, buffer, layouts):
        self.skeleton = skeleton
        self.buffer = buffer
        self.layouts = layouts

    def pin_memory(self):
        """For DataLoader's pin-memory thread: the item unpacked from the tensor pinned, its other tensors
        pinned too (the large ones that travel on their own), as the thread pins the items it recurses
        into. Unpacked there, not by the main thread, which feeds the GPU."""
        return SharedLeaves(map_leaves(self.skeleton, _pinned), self.buffer.pin_memory(), self.layouts).unpacked()

    def leaves(self):
        """The packed leaves as views of the (shared or pinned) tensor, in their order."""
        leaves = []
        for offset, kind, dtype, shape, nbytes in self.layouts:
            piece = self.buffer[offset:offset + nbytes]
            leaves.append(piece.numpy().view(dtype).reshape(shape) if kind is np.ndarray
                          else piece.view(dtype).view(shape))
        return leaves

    def unpacked(self):
        """The item as it was made, its packed leaves views of the tensor."""
        leaves = self.leaves()
        return map_leaves(self.skeleton, lambda leaf: leaves[leaf.index] if isinstance(leaf, _Packed) else leaf)


# Arrays of a test sample at least this large go through shared memory; smaller ones (CenterNet's
# affine centres, ...) pickle faster. A training batch's tensors share one, but those at least this large
# that a worker wrote into shared memory itself (_travels_packed).
SHARED_ARRAY_MIN_BYTES = 64 * 1024
# Each leaf starts at a multiple of this many bytes of the shared tensor, so its view is aligned.
_ALIGN = 64


def _pinned(leaf):
    # Tensors and objects with a pin_memory of their own; not numpy arrays.
    return leaf.pin_memory() if hasattr(leaf, 'pin_memory') else leaf


class _Packed:
    """Where a packed leaf was in a SharedLeaves' skeleton (its index in layouts)."""

    def __init__(self, index):
        self.index = index


def map_leaves(sample, fn):
    """sample (nested dicts, lists, tuples and objects with a map_leaves of their own, such as
    minibatch.UnresizedImages) with fn applied to everything else in it."""
    if hasattr(sample, 'map_leaves'):
        return sample.map_leaves(lambda leaf: map_leaves(leaf, fn))
    if isinstance(sample, dict):
        return {key: map_leaves(value, fn) for key, value in sample.items()}
    if isinstance(sample, (list, tuple)):
        return type(sample)(map_leaves(value, fn) for value in sample)
    return fn(sample)


def packed_leaves(item, chosen):
    """The SharedLeaves of an item made in a worker, holding the leaves for which chosen(leaf) is
    true (the item itself if there are none)."""
    packed = []

    def take(leaf):
        if not chosen(leaf):
            return leaf
        packed.append(leaf)
        return _Packed(len(packed) - 1)

    skeleton = map_leaves(item, take)
    if not packed:
        return item
    layouts, offset = [], 0
    for leaf in packed:
        kind = np.ndarray if isinstance(leaf, np.ndarray) else torch.Tensor
        layouts.append((offset, kind, leaf.dtype, tuple(leaf.shape), leaf.nbytes))
        offset += -(-leaf.nbytes // _ALIGN) * _ALIGN
    shared = SharedLeaves(skeleton, empty_for_main_process((offset,), torch.uint8), layouts)
    for view, leaf in zip(shared.leaves(), packed):
        if isinstance(leaf, np.ndarray):
            view[...] = leaf
        else:
            view.copy_(leaf)
    return shared


def _is_large_array(leaf):
    return isinstance(leaf, np.ndarray) and leaf.nbytes >= SHARED_ARRAY_MIN_BYTES and not leaf.dtype.hasobject


def _unchanged(sample):
    # DataLoader's default would turn the numpy arrays into tensors; the detector takes them as prepared.
    return sample


def image_only(im):
    """A test-time sample of just the BGR image (models that preprocess on their device)."""
    return {'image': im}


def build_test_loader(roidb, indices, num_workers, prepare=image_only, group=1, timeout=0, proposals=False):
    """Iterable of (prepare(BGR uint8 HxWx3 image), roidb index) for `indices`, in their order,
    the samples' arrays as prepare made them (numpy). With CUDA the large ones come in pinned
    memory (asynchronous uploads), received ahead by DataLoader's pin-memory thread. The workers
    start reading when the loader is iterated (test_net does so before loading the model). A worker makes
    `group` consecutive samples at a time and sends them in one shared tensor: the main process
    pays a connection per tensor it receives (BENCHMARKS.md, "Real loops"). timeout: as
    build_train_loader's. proposals: each sample also holds its entry's proposals (a Fast R-CNN's)."""
    _single_threaded_opencv_before_fork(num_workers)
    indices = list(indices)
    # The same batches as batch_size=group would make, numbered for the stalled-read error.
    numbered = NumberedIndices(BatchSampler(indices, group, drop_last=False) if group > 1 else indices)
    return RaisingLoader(DataLoader(
        InferenceImageDataset(roidb, prepare, proposals),
        **({'batch_sampler': numbered} if group > 1 else {'sampler': numbered, 'batch_size': None}),
        collate_fn=_unchanged,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=_init_worker,
        timeout=_worker_timeout(num_workers, timeout),
    ), groups=group > 1, eager=True, numbered=numbered)


def to_device(batch, device):
    """A batch (tensors in dicts, lists and tuples) with its tensors on device; copies from
    pinned memory overlap with the GPU's work."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
