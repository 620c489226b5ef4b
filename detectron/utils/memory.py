"""Running out of device memory as one error line: where it happened, the memory the device had, the
settings that lower it (each model type names its own) and what is left on disk."""
import torch

from detectron.utils.errors import DeviceOutOfMemory

_GIB = 2 ** 30


def out_of_memory_error(where, rank, device, lower_memory, saved=''):
    """The DeviceOutOfMemory to raise for a torch.OutOfMemoryError caught at `where` ('iteration 12',
    'image 3 of 500') on this rank and device. lower_memory: the settings the model type names;
    saved: what the run leaves intact, as a sentence."""
    return DeviceOutOfMemory('out of memory at {} on rank {} ({}): {}. To lower it: {}.{}'.format(
        where, rank, device, describe_device_memory(device), lower_memory, ' ' + saved if saved else ''))


def describe_device_memory(device):
    """Peak memory PyTorch allocated and reserved on device since the start (or its last reset),
    and the device's total."""
    if device.type != 'cuda':
        return 'no memory statistics on the {}'.format(device.type)
    total = torch.cuda.get_device_properties(device).total_memory
    return 'peak {:.2f} GiB allocated ({:.2f} GiB reserved) of {:.2f} GiB total'.format(
        torch.cuda.max_memory_allocated(device) / _GIB, torch.cuda.max_memory_reserved(device) / _GIB,
        total / _GIB)
