"""Work that must not move the random streams a training run draws from (an evaluation inside training)."""
import contextlib
import random

import numpy as np
import torch


@contextlib.contextmanager
def preserved_random_streams():
    """torch's (CPU and the current CUDA device), numpy's and Python's random states are as they were
    before the block when it ends (a DataLoader started in the block draws its seed from torch's)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    numpy_state, python_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=devices):
        yield
    np.random.set_state(numpy_state)
    random.setstate(python_state)
