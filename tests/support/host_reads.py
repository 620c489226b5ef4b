"""What would make the host wait for a GPU, recorded on any device (the CPU included): a tensor's values
read on the host (item, int(), bool(), tolist()) and the operators whose output size depends on the
values (nonzero, masked_select, unique, boolean indexing, repeat_interleave without output_size), each
with the line of detectron/ that asked for it. Shared by tests/roi_data/test_mask_targets.py and
tests/modeling/test_fixed_size_training.py."""
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SIZED_BY_VALUES = ('aten.nonzero', 'aten.masked_select', 'aten.unique', 'aten._unique', 'aten._local_scalar_dense')


def _reads_on_the_host(name, args, kwargs):
    return (name.startswith(_SIZED_BY_VALUES)
            or (name.startswith('aten.index.Tensor') and any(i is not None and i.dtype == torch.bool for i in args[1]))
            or (name.startswith('aten.repeat_interleave') and kwargs.get('output_size') is None))


def _caller():
    """'path/under/detectron.py:line' of the innermost detectron/ frame, or '?'."""
    frames = [f for f in traceback.extract_stack() if '/detectron/' in f.filename]
    return '{}:{}'.format(frames[-1].filename.split('/detectron/')[-1], frames[-1].lineno) if frames else '?'


class HostReads(TorchDispatchMode):
    """Inside `with HostReads(monkeypatch) as r:`, r.reads lists (operator or 'tolist', caller) in order."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.reads = []
        tolist = torch.Tensor.tolist
        monkeypatch.setattr(torch.Tensor, 'tolist', lambda t: self.reads.append(('tolist', _caller())) or tolist(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _reads_on_the_host(str(func), args, kwargs):
            self.reads.append((str(func), _caller()))
        return func(*args, **kwargs)
