"""Training and test data loaders over a roidb (torch DataLoader based).

Detectron fed GPUs from Python threads and queues; here DataLoader worker processes prepare
images and a batch sampler (roi_data/samplers.py) decides which images form each batch.

Reproducibility: the training scale of an image is drawn from a RandomState seeded by
(seed, iteration, roidb index), so batches do not depend on the number of workers or on which
worker built them, and a resumed run draws the same scales as an uninterrupted one.

Unreadable images: a worker returns the DatasetError instead of raising it, and the loader raises
it in the main process. Raised in a worker, DataLoader would re-raise it with the worker's whole
traceback as its message, and the user should read one line naming the file.
"""

import functools
import pickle

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from detectron.roi_data.minibatch import collate_minibatch, prepare_training_image, read_image
from detectron.utils.errors import DatasetError

# The only roidb fields a training worker needs; the rest (gt_overlaps, segms, ...) stays behind.
_TRAINING_KEYS = ('image', 'flipped', 'boxes', 'gt_classes', 'is_crowd')


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


class TrainingImageDataset(Dataset):
    """Prepared training images, addressed by (iteration, roidb index) keys.

    The iteration is part of the key so an image seen at two iterations gets independent scale draws.
    """

    def __init__(self, roidb, scales, max_size, pixel_means, seed):
        self._entries = PackedList({key: entry[key] for key in _TRAINING_KEYS} for entry in roidb)
        self._scales = tuple(scales)
        self._max_size = max_size
        self._pixel_means = np.asarray(pixel_means, dtype=np.float32).reshape(3)
        self._seed = seed

    def __len__(self):
        return len(self._entries)

    def __getitem__(self, key):
        iteration, index = key
        target_size = self._scales[scale_rng(self._seed, iteration, index).randint(len(self._scales))]
        try:
            return prepare_training_image(self._entries[index], target_size, self._max_size,
                                          self._pixel_means)
        except DatasetError as err:
            return err


def _collate_or_error(items, stride):
    errors = [item for item in items if isinstance(item, DatasetError)]
    return errors[0] if errors else collate_minibatch(items, stride)


class IterationTaggedBatches:
    """Batch sampler adapter: yields [(iteration, index), ...] for the dataset's keys."""

    def __init__(self, batch_sampler, start_iter):
        self._batch_sampler = batch_sampler
        self._start_iter = start_iter

    def __iter__(self):
        for iteration, batch in enumerate(self._batch_sampler, start=self._start_iter):
            yield [(iteration, int(index)) for index in batch]


class RaisingLoader:
    """Iterates a DataLoader, raising the DatasetErrors its workers returned."""

    def __init__(self, data_loader):
        self.data_loader = data_loader

    def __iter__(self):
        for item in self.data_loader:
            if isinstance(item, DatasetError):
                raise item
            yield item


def _limit_worker_threads(worker_id):
    from detectron.utils.distributed import die_with_parent
    # A worker must not outlive its process, even one killed by SIGKILL (it would keep reading
    # images for minutes, reparented to init).
    die_with_parent()
    # Each worker resizes its own images; OpenCV's own thread pool in every worker would
    # oversubscribe the CPU cores the workers already share.
    cv2.setNumThreads(1)


def build_train_loader(roidb, batch_sampler, scales, max_size, pixel_means, stride, num_workers, seed,
                       start_iter=0):
    """Iterable of (images, im_info, targets) training batches (docs/DESIGN.md contract).

    batch_sampler: iterable of roidb index lists for this process (GroupedDistributedBatchSampler),
    started at start_iter; start_iter must match so resumed runs draw the same scales.
    """
    dataset = TrainingImageDataset(roidb, scales, max_size, pixel_means, seed)
    return RaisingLoader(DataLoader(
        dataset,
        batch_sampler=IterationTaggedBatches(batch_sampler, start_iter),
        collate_fn=functools.partial(_collate_or_error, stride=stride),
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        worker_init_fn=_limit_worker_threads,
    ))


class InferenceImageDataset(Dataset):
    """Original BGR uint8 images with their roidb index; the test engine does its own resizing."""

    def __init__(self, roidb):
        self._paths = PackedList(entry['image'] for entry in roidb)

    def __len__(self):
        return len(self._paths)

    def __getitem__(self, index):
        try:
            return read_image(self._paths[index]), index
        except DatasetError as err:
            return err


def _unchanged(sample):
    # DataLoader's default would turn the numpy image into a tensor; the test engine wants numpy.
    return sample


def build_test_loader(roidb, indices, num_workers):
    """Iterable of (BGR uint8 HxWx3 image, roidb index) for `indices`, in their order."""
    return RaisingLoader(DataLoader(
        InferenceImageDataset(roidb),
        sampler=list(indices),
        batch_size=None,
        collate_fn=_unchanged,
        num_workers=num_workers,
        worker_init_fn=_limit_worker_threads,
    ))
