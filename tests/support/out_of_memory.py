"""A simulated torch.OutOfMemoryError (on the CPU) from a chosen call of a function on."""
import itertools

import torch


def out_of_memory_from_call(monkeypatch, module, name, first_failing_call):
    """module.name raises torch.OutOfMemoryError from its call number first_failing_call (0-based)
    on; returns the real function."""
    real = getattr(module, name)
    calls = itertools.count()

    def failing(*args, **kwargs):
        if next(calls) >= first_failing_call:
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, failing)
    return real
