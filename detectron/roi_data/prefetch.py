"""The training loop's batches, moved to its device one step ahead.

On a GPU the next batch's upload (and whatever else the model type's `batch_to_device` does there,
R-CNN's resizing) is queued on a side stream as soon as the current step is queued, so the copy
engine works while the step's kernels run. Queued in the training stream, the upload sat between
two steps' kernels: a CenterNet batch of 32 is 100 MB of float32 images (BENCHMARKS.md, "CenterNet
speed"). The batches, their order and their values are the same either way.
"""
import contextlib

import torch

from detectron.roi_data.loader import map_leaves


class DevicePrefetcher:
    """Iterator over `count` batches of `batches`, each as batch_to_device(batch) returns it.

    `prefetch()` starts moving the next batch (on CUDA, on a side stream); `next()` hands it over,
    fetching it first if no prefetch came before. Never more than `count` batches are drawn from
    `batches`, so a finite source is not read past the loop's last step."""

    def __init__(self, batches, batch_to_device, device, count):
        self.batches = batches
        self.batch_to_device = batch_to_device
        self.remaining = count
        self.stream = torch.cuda.Stream(device) if device.type == 'cuda' else None
        self.pending = None  # (the moved batch, the side stream's event after its upload) or None

    def ready_batches(self):
        """The source's count of batches ready to be taken (json_stats' mb_qsize), 0 if it keeps none."""
        return getattr(self.batches, 'ready_batches', lambda: 0)()

    def __iter__(self):
        return self

    def __next__(self):
        self.prefetch()
        if self.pending is None:
            raise StopIteration
        batch, uploaded = self.pending
        self.pending = None
        if self.stream is not None:
            stream = torch.cuda.current_stream(self.stream.device)
            stream.wait_event(uploaded)
            # The side stream allocated the batch; its memory must outlive this stream's use of it.
            map_leaves(batch, lambda leaf: _record_stream(leaf, stream))
        return batch

    def prefetch(self):
        """Draw the next batch and queue its move to the device, unless one is pending or all are drawn."""
        if self.pending is not None or self.remaining == 0:
            return
        batch = next(self.batches)
        self.remaining -= 1
        on_side = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with on_side:
            moved = self.batch_to_device(batch)
            uploaded = self.stream.record_event() if self.stream is not None else None
        self.pending = (moved, uploaded)


def _record_stream(leaf, stream):
    if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
        leaf.record_stream(stream)
