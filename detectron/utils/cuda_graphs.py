"""Replaying a fixed-shape GPU computation from a CUDA graph instead of launching its kernels one
by one: at batch 1 a detector's forward is a few hundred small kernels, and launching them costs more
than running them."""
import logging
import weakref

import torch

logger = logging.getLogger(__name__)


# owner (e.g. a model) -> {key: GraphedCallable}; an owner that is garbage-collected drops its graphs.
_PER_OWNER = weakref.WeakKeyDictionary()


def graphed_method(owner, key, fn):
    """The GraphedCallable of x -> fn(owner, x) for this owner and key, made on first use. It holds
    the owner weakly, so the graphs (and their memory pools) go with the owner."""
    per_owner = _PER_OWNER.setdefault(owner, {})
    if key not in per_owner:
        owner_ref = weakref.ref(owner)
        per_owner[key] = GraphedCallable(lambda x: fn(owner_ref(), x))
    return per_owner[key]


class GraphedCallable:
    """fn(x) -> a tensor (or a tuple of tensors), replayed from one CUDA graph per input shape and
    dtype and autocast state; CPU tensors and shapes beyond max_graphs run fn directly. A shape is
    captured the second time it comes (the first runs fn directly): a size seen once, e.g. a rare
    image size in testing, neither pays for a capture nor takes one of the max_graphs places.

    fn must be free of host synchronisation and of data-dependent shapes. The returned tensors are
    the graph's own output buffers: read (copy) them before the next call. A capture is kept only
    if its first replay gives bit for bit what running fn's kernels one by one gave on the same
    input: a kernel that is not safe to capture then costs speed, not correctness.
    """

    def __init__(self, fn, max_graphs=4, warmup_calls=2):
        self.fn = fn
        self.max_graphs = max_graphs
        self.warmup_calls = warmup_calls
        self._graphs = {}
        self._seen_once = set()

    def __call__(self, x):
        if x.device.type != 'cuda':
            return self.fn(x)
        autocast = torch.is_autocast_enabled('cuda')
        key = (tuple(x.shape), x.dtype, x.device, autocast, torch.get_autocast_dtype('cuda') if autocast else None)
        entry = self._graphs.get(key)
        if entry is None and key not in self._seen_once:
            self._seen_once.add(key)
        elif entry is None and len(self._graphs) < self.max_graphs:
            entry = self._graphs[key] = self._capture(x, autocast)
        if not entry:  # capture failed, or too many shapes: run the kernels one by one
            return self.fn(x)
        static_input, graph, static_output = entry
        static_input.copy_(x)
        graph.replay()
        return static_output

    def _call_fn(self, x, autocast):
        if not autocast:
            return self.fn(x)
        # Autocast's cast cache must be off while a graph is captured (and while it warms up).
        with torch.autocast('cuda', dtype=torch.get_autocast_dtype('cuda'), cache_enabled=False):
            return self.fn(x)

    def _capture(self, x, autocast):
        static_input = x.clone()
        try:
            side = torch.cuda.Stream(device=x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup_calls):  # cuDNN autotuning and lazy init happen here
                    self._call_fn(static_input, autocast)
                # A host synchronisation would break the capture (and the stream with it): find it first.
                previous = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode('error')
                try:
                    eager_output = _cloned(self._call_fn(static_input, autocast))
                finally:
                    torch.cuda.set_sync_debug_mode(previous)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_output = self._call_fn(static_input, autocast)
            graph.replay()
        except RuntimeError as err:
            logger.warning('CUDA graph capture of input %s failed, running without it: %s', tuple(x.shape),
                           str(err).splitlines()[0] if str(err) else type(err).__name__)
            return False
        if not _all_equal(static_output, eager_output):
            logger.warning('CUDA graph replay of input %s differs from running its kernels one by one; '
                           'running without the graph', tuple(x.shape))
            return False
        return static_input, graph, static_output


def _as_tuple(output):
    return output if isinstance(output, (tuple, list)) else (output,)


def _cloned(output):
    return tuple(t.clone() for t in _as_tuple(output))


def _all_equal(output, expected):
    return all(torch.equal(a, b) for a, b in zip(_as_tuple(output), expected))
