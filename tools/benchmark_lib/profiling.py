"""torch.profiler traces of rows, summarised per step (GPU busy time, host syncs, top kernels)."""
import os
import time

import torch

from .rcnn_rows import ours_test_name, torchvision_test_name
from .timing import cfg_values, sync

SYNC_API_NAMES = ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize')


TOP_KERNELS = 10


def profile_row(row, steps, warmup, device, trace_path=None):
    """Profile `steps` steps of a row after `warmup` (at least 1) unprofiled ones; returns
    summarise_profile's numbers (the wall time is that under the profiler)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == 'cuda':
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with cfg_values(row.cfg):
        for _ in range(max(1, warmup)):
            row.step()
        sync(device)
        with torch.profiler.profile(activities=activities) as prof:
            tic = time.perf_counter()
            for _ in range(steps):
                row.step()
            sync(device)
            wall = time.perf_counter() - tic
    if trace_path:
        prof.export_chrome_trace(trace_path)
    events = [(e.name, e.device_type == torch.autograd.DeviceType.CUDA, e.time_range.start, e.time_range.end)
              for e in prof.events()]
    return summarise_profile(events, steps, wall)


def summarise_profile(events, steps, wall_s):
    """events: (name, on_gpu, start_us, end_us). GPU busy time is the union of the GPU events'
    intervals (kernels, copies, memsets); host synchronisations are the runtime's *Synchronize
    calls (a .item() or a D2H copy to pageable memory ends in cudaStreamSynchronize)."""
    gpu = sorted((start, end, name) for name, on_gpu, start, end in events if on_gpu)
    busy, reach = 0.0, float('-inf')
    for start, end, _ in gpu:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    per_kernel = {}
    for start, end, name in gpu:
        total, calls = per_kernel.get(name, (0.0, 0))
        per_kernel[name] = (total + end - start, calls + 1)
    top = sorted(per_kernel.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    wall_ms = 1000.0 * wall_s / steps
    return {
        'wall_ms_per_step': wall_ms,
        'gpu_busy_ms_per_step': busy / 1000.0 / steps,
        'gpu_busy_fraction': busy / 1000.0 / steps / wall_ms if wall_ms else 0.0,
        'gpu_kernel_sum_ms_per_step': sum(end - start for start, end, _ in gpu) / 1000.0 / steps,
        'gpu_ops_per_step': len(gpu) / steps,
        'host_syncs_per_step': sum(name.startswith(SYNC_API_NAMES) for name, on_gpu, _, _ in events if not on_gpu) / steps,
        'd2h_copies_per_step': sum('DtoH' in name for _, _, name in gpu) / steps,
        'top_kernels': [{'name': name, 'ms_per_step': total / 1000.0 / steps, 'calls_per_step': calls / steps}
                        for name, (total, calls) in top],
    }


def trace_path(args, name):
    """Where the profiler trace of `name` goes (--trace-dir), or None."""
    if not args.trace_dir:
        return None
    os.makedirs(args.trace_dir, exist_ok=True)
    return os.path.join(args.trace_dir, 'trace_{}.json'.format(name))


def profile_train_rows(rows, args, device, report, context):
    for name, row in zip(('ours', 'torchvision'), rows):
        trace = trace_path(args, 'train_' + name)
        report.add_profile(row.name, profile_row(row, args.profile_steps, args.warmup, device, trace), **context)


def profile_test_rows(rows, args, device, report):
    """The realistic case's inference, ours (STD_NMS False) and torchvision's, one image per step."""
    by_name = {row.name: row for row in rows}
    for name, row_name in (('ours', ours_test_name('realistic', False)),
                           ('torchvision', torchvision_test_name('realistic'))):
        row = by_name[row_name]
        report.add_profile(row.name, profile_row(row, args.profile_steps, args.warmup, device,
                                                 trace_path(args, 'test_' + name)),
                           batch=1, size=[args.height, args.width])
