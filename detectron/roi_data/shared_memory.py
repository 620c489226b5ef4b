"""Batch tensors that leave a DataLoader worker without a copy.

A worker sends a tensor to the main process as a file descriptor when its storage already is in
shared memory; any other tensor is first copied into a new shared segment. So a batch is written
where it will travel, and the worker's CPU, which the loader workers share with the main process,
is not spent on a second copy (BENCHMARKS.md, "Real loops").
"""
import numpy as np
import torch
from torch.utils.data import get_worker_info


def stacked_batch(arrays):
    """np.stack(arrays) (equal shapes and dtypes) as a torch tensor, with the data copied once (not
    at all for the rows of one tensor, in order: that tensor).

    In a DataLoader worker the tensor is allocated in shared memory (as torch's default_collate
    does), so the batch reaches the main process as a file descriptor; a tensor in ordinary memory
    would be copied into shared memory once more when the worker sends it. Every byte is written
    here, zeros too: a shared page the worker leaves unwritten is cleared when the main process
    first reads it, which is slower than reading a written page, on the process that feeds
    the GPU.
    """
    whole = _whole_tensor(arrays)
    if whole is not None:
        return whole
    batch = empty_for_main_process((len(arrays),) + tuple(arrays[0].shape), torch.as_tensor(arrays[0]).dtype)
    np.stack(arrays, out=batch.numpy())
    return batch


def _whole_tensor(rows):
    """The tensor whose rows, in order, rows are (a batch written in place: loader.TrainingDataset's
    batch_input), else None."""
    whole = getattr(rows[0], '_base', None)
    if whole is None or len(whole) != len(rows) or not whole.is_contiguous():
        return None
    stride = whole.stride(0) * whole.element_size()
    if all(getattr(row, '_base', None) is whole and row.shape == whole.shape[1:]
           and row.data_ptr() == whole.data_ptr() + i * stride for i, row in enumerate(rows)):
        return whole
    return None


def empty_for_main_process(shape, dtype):
    """An empty tensor, in shared memory when made in a DataLoader worker (see stacked_batch)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape)
