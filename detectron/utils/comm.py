"""Collectives for code running inside a job: world size, rank, device, barriers, gathers and reductions.

Every helper also works in a single process (world size 1, no process group). `core/launch.py` binds
each worker's local rank and device, and the gloo group for Python objects, in `_state`.
"""
import torch
import torch.distributed as dist

from detectron.utils.digest import content_digest

_state = {'local_rank': 0, 'device': None, 'object_group': None}


def in_process_group():
    return dist.is_available() and dist.is_initialized()


def get_world_size():
    return dist.get_world_size() if in_process_group() else 1


def get_rank():
    return dist.get_rank() if in_process_group() else 0


def get_local_rank():
    """Index of this process on its machine (its GPU index, except in check mode: see get_device)."""
    return _state['local_rank']


def is_main_process():
    return get_rank() == 0


def get_device():
    """The device launch bound this worker to; outside launch, the current CUDA device or the CPU."""
    if _state['device'] is not None:
        return _state['device']
    return torch.device('cuda', torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device('cpu')


def synchronize():
    """Barrier across all ranks."""
    if get_world_size() == 1:
        return
    if dist.get_backend() == 'nccl':
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_gather_object(obj):
    """List of every rank's picklable obj, in rank order (through host memory)."""
    if get_world_size() == 1:
        return [obj]
    gathered = [None] * get_world_size()
    dist.all_gather_object(gathered, obj, group=_state['object_group'])
    return gathered


def broadcast_object(obj, src=0):
    """Rank src's obj, on every rank."""
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=_state['object_group'])
    return box[0]


def ranks_differing_from_rank0(tensors):
    """(rank 0's SHA-256 of {name: tensor}, the ranks whose tensors are not bitwise equal to rank 0's):
    a collective, the same answer on every rank. DDP keeps the parameters equal on all ranks."""
    digests = all_gather_object(content_digest(tensors))
    return digests[0], [rank for rank, digest in enumerate(digests) if digest != digests[0]]


def reduce_dict(tensors, average=True):
    """{name: scalar tensor} summed (or averaged) over ranks, on every rank, without a host sync.

    Detectron logs each loss summed over GPUs after a 1/NUM_GPUS scaling, i.e. the average here.
    """
    if get_world_size() == 1:
        return {name: value.detach() for name, value in tensors.items()}
    names = sorted(tensors)  # the same order on every rank
    stacked = torch.stack([tensors[name].detach().reshape(()).float() for name in names])
    dist.all_reduce(stacked)
    if average:
        stacked /= get_world_size()
    return dict(zip(names, stacked.unbind()))



def unwrap_model(model):
    """The module inside a DistributedDataParallel / DataParallel wrapper (or model itself)."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model
