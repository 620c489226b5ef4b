"""Replaying a fixed-shape GPU computation from a CUDA graph instead of launching its kernels one
by one: at batch 1 a detector's forward is a few hundred small kernels, and launching them costs more
than running them; a training step of the R-CNN body at 2 images launches about 800 (forward and
backward), and the host, not the GPU, sets its pace."""
import collections
import contextlib
import logging
import weakref

import torch

logger = logging.getLogger(__name__)


# owner (e.g. a model) -> {key: GraphedCallable}; an owner that is garbage-collected drops its graphs.
_PER_OWNER = weakref.WeakKeyDictionary()

# Input shapes a test-time callable graphs unless told otherwise (TEST.CUDA_GRAPHS_MAX_SHAPES' default).
DEFAULT_MAX_GRAPHS = 4


def graphed_method(owner, key, fn, max_graphs=DEFAULT_MAX_GRAPHS, **options):
    """The GraphedCallable of (*inputs) -> fn(owner, *inputs) for this owner and key, made on first use
    (with max_graphs and GraphedCallable's options; later calls get that one). It holds the owner
    weakly, so the graphs (and their memory pool) go with the owner."""
    return _owned(owner, key, lambda owner_ref: GraphedCallable(lambda *inputs: fn(owner_ref(), *inputs),
                                                                max_graphs=max_graphs, **options))


def graphed_training_method(owner, key, fn, max_graphs):
    """The TrainingGraphedCallable of x -> fn(owner, x) for this owner (an nn.Module) and key, made on
    first use and held like graphed_method's."""
    return _owned(owner, key, lambda owner_ref: TrainingGraphedCallable(owner_ref, fn, max_graphs=max_graphs))


def graph_pools(owner):
    """The memory-pool handles, (int, int) as memory_snapshot()'s segment_pool_id, of the graphs
    made for owner: the GPU memory they hold between calls is allocated there."""
    return [tuple(c._pool) for c in _PER_OWNER.get(owner, {}).values() if c._pool is not None]


def _owned(owner, key, make):
    """The callable kept for (owner, key), made by make(weak reference to owner) on first use."""
    per_owner = _PER_OWNER.setdefault(owner, {})
    if key not in per_owner:
        per_owner[key] = make(weakref.ref(owner))
    return per_owner[key]


class ShapeSlots:
    """Which input shapes hold one of a callable's max_graphs captures. A shape is captured the second
    time it comes (the first runs the kernels directly), while places are free. With `replaces`, a
    shape seen more than REPLACE_FACTOR x + REPLACE_MARGIN times as often as the least-seen captured
    one takes that one's place: the captures follow the commonest shapes, and the margin keeps shapes
    of similar frequency from trading places back and forth (each capture costs a few steps)."""

    REPLACE_FACTOR = 1.25
    REPLACE_MARGIN = 2

    def __init__(self, replaces=False):
        self.replaces = replaces
        self.seen = collections.Counter()

    def admit(self, key, captured, max_graphs):
        """Count a call of key; returns (capture it, the key of `captured` (a dict keyed by shape,
        holding refused captures too) to drop first or None)."""
        self.seen[key] += 1
        if key in captured or self.seen[key] < 2:
            return False, None
        if len(captured) < max_graphs:
            return True, None
        if not self.replaces or not captured:
            return False, None
        rarest = min(captured, key=self.seen.__getitem__)
        if self.seen[key] > self.REPLACE_FACTOR * self.seen[rarest] + self.REPLACE_MARGIN:
            return True, rarest
        return False, None


class GraphedCallable:
    """fn(*inputs) -> a tensor (or a tuple of tensors), replayed from one CUDA graph per shapes and
    dtypes of the inputs and autocast state; CPU inputs and shapes beyond max_graphs run fn directly.
    A shape is captured the second time it comes (the first runs fn directly): a size seen once, e.g.
    a rare image size in testing, neither pays for a capture nor takes one of the max_graphs places.
    With replaces, a much commoner shape takes the place of the rarest (ShapeSlots).

    fn must be free of host synchronisation and of data-dependent shapes. The returned tensors are
    the graph's own output buffers: read (copy) them before the next call. The graphs of all shapes
    share one memory pool (a graph costs its outputs, not a pool of its own): the next call, at any
    shape, may overwrite what the last one returned. A capture is kept only if its first replay
    gives bit for bit what running fn's kernels one by one gave on the same inputs: a kernel that is
    not safe to capture then costs speed, not correctness.

    With draws_random, fn may draw from the device's default random generator: each replay then
    draws what running fn's kernels would have drawn at that point of the generator's sequence and
    advances it as they would (checkpointed generator states resume the same draws), and a capture
    leaves the generator where it found it, so a graphed call draws as the eager call it replaces.
    """

    _what = 'input'  # in the log lines of a refused capture

    def __init__(self, fn, max_graphs=DEFAULT_MAX_GRAPHS, warmup_calls=2, replaces=False, draws_random=False):
        self.fn = fn
        self.max_graphs = max_graphs
        self.warmup_calls = warmup_calls
        self.draws_random = draws_random
        self._graphs = {}
        self._slots = ShapeSlots(replaces)
        self._pool = None
        self._stream = None

    def _shared_pool(self):
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _side_stream(self, device):
        """The one stream every capture of this callable (and its warm-up) runs on. The caching
        allocator reuses a freed block only on the stream it was allocated on, a graph pool's
        blocks included: with a new stream per capture, each shape kept its own warm-up blocks and
        the shared pool shared nothing (the likely reason why the test graphs' reserved memory grew
        with their count: BENCHMARKS.md, "CUDA graph memory")."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    def __call__(self, *inputs):
        entry = self._entry(inputs) if inputs[0].device.type == 'cuda' else None
        if not entry:  # a CPU input, a first sight, a failed capture or too many shapes: run the kernels
            return self.fn(*inputs)
        static_inputs, graph, static_output = entry
        for static, x in zip(static_inputs, inputs):
            static.copy_(x)
        graph.replay()
        return static_output

    def _entry(self, inputs):
        """The capture for the inputs' shapes (made on their second appearance), or None / False to run fn."""
        autocast = torch.is_autocast_enabled('cuda')
        key = (tuple((tuple(x.shape), x.dtype) for x in inputs), inputs[0].device, autocast,
               torch.get_autocast_dtype('cuda') if autocast else None)
        entry = self._graphs.get(key)
        capture, evicted = self._slots.admit(key, self._graphs, self.max_graphs)
        if evicted is not None:
            del self._graphs[evicted]  # its buffers go back to the shared pool
        if capture:
            entry = self._graphs[key] = self._capture(inputs, autocast)
        return entry

    def _capture(self, inputs, autocast):
        """Warm up, run eagerly for reference, record; the entry, or False when refused."""
        static_inputs = tuple(x.clone() for x in inputs)
        generator = torch.cuda.default_generators[inputs[0].device.index or 0]
        random_state = generator.get_state() if self.draws_random else None
        try:
            with _on_side_stream(self._side_stream(inputs[0].device)):
                for _ in range(self.warmup_calls):  # cuDNN autotuning and lazy init happen here
                    self._warm_up(static_inputs, autocast)
                # A host synchronisation would break the capture (and the stream with it): find it first.
                previous = torch.cuda.get_sync_debug_mode()
                torch.cuda.set_sync_debug_mode('error')
                try:
                    _restore(generator, random_state)
                    eager_output = _cloned(self._run(static_inputs, autocast))
                finally:
                    torch.cuda.set_sync_debug_mode(previous)
            eager_drawn = generator.get_state() if self.draws_random else None
            _restore(generator, random_state)
            entry, static_output = self._record(static_inputs, autocast)
            replay_drawn = generator.get_state() if self.draws_random else None
        except RuntimeError as err:
            # fn would most likely fail the same way at other shapes (a host sync, an uncapturable
            # kernel), and a capture that broke off may leave the allocator routing a stream's blocks
            # to its pool: capture no further shapes (the captured ones keep replaying).
            self.max_graphs = len(self._graphs)
            self._slots.replaces = False
            logger.warning('CUDA graph capture of %s %s failed, running without it (and capturing no further '
                           'shapes): %s', self._what, _shapes(inputs),
                           str(err).splitlines()[0] if str(err) else type(err).__name__)
            return False
        finally:
            _restore(generator, random_state)  # the call that follows draws what the eager call would
        if not _all_equal(static_output, eager_output):
            logger.warning('CUDA graph replay of %s %s differs from running its kernels one by one; '
                           'running without the graph', self._what, _shapes(inputs))
            return False
        if self.draws_random and not torch.equal(replay_drawn, eager_drawn):  # later replays would repeat draws
            logger.warning('CUDA graph replay of %s %s leaves the random generator elsewhere than its kernels '
                           'do; running without the graph', self._what, _shapes(inputs))
            return False
        return entry

    def _run(self, inputs, autocast):
        with _capture_autocast(autocast):
            return self.fn(*inputs)

    _warm_up = _run

    def _record(self, static_inputs, autocast):
        """(entry, its output buffers) of a graph of fn on static_inputs, replayed once."""
        graph = torch.cuda.CUDAGraph()
        with _capturing(graph, self._shared_pool(), self._side_stream(static_inputs[0].device), self.draws_random):
            static_output = self._run(static_inputs, autocast)
        graph.replay()
        return (static_inputs, graph, static_output), static_output


def _restore(generator, state):
    if state is not None:
        generator.set_state(state)


def _shapes(inputs):
    shapes = [tuple(x.shape) for x in inputs]
    return shapes[0] if len(shapes) == 1 else shapes


class TrainingGraphedCallable(GraphedCallable):
    """module_ref() -> an nn.Module, and x -> fn(module, x) a tuple of tensors, in training: the
    forward and its backward (the gradients of the module's trainable parameters) are replayed from
    a pair of CUDA graphs per input shape, dtype and autocast state, captured as GraphedCallable's
    (second appearance, at most max_graphs shapes, the first replay's outputs checked bit for bit
    against the eager ones), except that a much commoner shape takes the place of the rarest
    (ShapeSlots). Without grad mode, on the CPU, or for a model with SyncBatchNorm (its collectives
    are not captured) fn runs directly.

    The graphs read the parameters' memory: updates in place (optimizer steps, load_state_dict)
    are seen, moving the module (to another device or dtype) after a capture is not. The graphs of
    all shapes share one memory pool, as GraphedCallable's: a forward and its backward replay back
    to back, which is how a training step runs them (forward, losses, backward). Gradients reach
    the parameters through autograd as usual (AccumulateGrad: DDP's hooks see them and a second
    backward adds to .grad).
    """

    _what = 'training input'
    # A training run meets its batch shapes for hours: the commonest ones should hold the graphs, not
    # the first ones seen twice (BENCHMARKS.md, "Mask R-CNN": on coco_tiny, 13 of train_net's
    # iterations 100-199 ran eagerly with the first eight shapes' graphs, 7 with ShapeSlots).
    def __init__(self, module_ref, fn, max_graphs, warmup_calls=2):
        super().__init__(lambda x: fn(module_ref(), x), max_graphs=max_graphs, warmup_calls=warmup_calls,
                         replaces=True)
        self.module_ref = module_ref
        self.method = fn
        self._sync_batchnorm = None  # looked up on the first call (models are converted before training)

    def __call__(self, x):
        if self._sync_batchnorm is None:
            self._sync_batchnorm = any(isinstance(m, torch.nn.SyncBatchNorm) for m in self.module_ref().modules())
        usable = x.device.type == 'cuda' and torch.is_grad_enabled() and not self._sync_batchnorm
        entry = self._entry((x,)) if usable else None
        if not entry:
            return self.fn(x)
        return _ReplayTrainingGraphs.apply(entry, x, *entry.params)

    def _capture(self, inputs, autocast):
        module = self.module_ref()
        if len({p.dtype for p in self._trainable(module).values()}) != 1:
            logger.warning('CUDA graphs of training need trainable parameters of one dtype; running without them')
            return False
        # The warm-up, eager and captured runs would each update BatchNorm's running statistics.
        buffers = [(b, b.clone()) for b in module.buffers()]
        try:
            return super()._capture(inputs, autocast)
        finally:
            with torch.no_grad():
                for buffer, value in buffers:
                    buffer.copy_(value)

    def _warm_up(self, inputs, autocast):
        outputs, aliases = self._forward(inputs[0], autocast)
        torch.autograd.grad(outputs, aliases, [torch.ones_like(o) for o in outputs], allow_unused=True)

    def _run(self, inputs, autocast):
        return self._forward(inputs[0], autocast)[0]

    def _record(self, static_inputs, autocast):
        static_input, = static_inputs
        entry = _TrainingCapture(static_input, list(self._trainable(self.module_ref()).values()))
        entry.capture(lambda: self._forward(static_input, autocast), self._shared_pool(),
                      self._side_stream(static_input.device))
        return entry, entry.static_outputs

    @staticmethod
    def _trainable(module):
        return {name: p for name, p in module.named_parameters() if p.requires_grad}

    def _forward(self, x, autocast):
        """fn's outputs computed from aliases of the trainable parameters (views made here, on the
        capturing stream), and those aliases: the backward stops at them, so it never touches the
        parameters' AccumulateGrad nodes (DDP keeps those alive, made on another stream, and a
        capture may not wait on another stream)."""
        module = self.module_ref()
        aliases = {'module.' + name: p.view_as(p) for name, p in self._trainable(module).items()}
        with _capture_autocast(autocast):
            outputs = torch.func.functional_call(_MethodCall(module, self.method), aliases, (x,), strict=False)
        return tuple(outputs), list(aliases.values())


class _MethodCall(torch.nn.Module):
    """module and fn as one nn.Module whose forward is fn(module, x), for functional_call; made
    for a capture and dropped after it, so no graph holds the model."""

    def __init__(self, module, fn):
        super().__init__()
        self.module = module
        self.fn = fn

    def forward(self, x):
        return self.fn(self.module, x)


class _TrainingCapture:
    """The static input, the forward graph and its outputs, the backward graph, its incoming
    gradients and the parameter gradients it writes (flat, in one buffer). The parameters share
    one dtype (a model's float32 weights under autocast)."""

    def __init__(self, static_input, params):
        self.static_input = static_input
        self.params = params

    def capture(self, forward, pool, stream):
        self.forward_graph = torch.cuda.CUDAGraph()
        with _capturing(self.forward_graph, pool, stream):
            outputs, aliases = forward()
        self.static_outputs = tuple(o.detach() for o in outputs)
        self.static_grad_outputs = tuple(torch.empty_like(o) for o in outputs)
        self.backward_graph = torch.cuda.CUDAGraph()
        with _capturing(self.backward_graph, pool, stream):
            grads = torch.autograd.grad(outputs, aliases, self.static_grad_outputs, allow_unused=True)
            self.grad_layouts = [None if g is None else (p.shape, p.stride()) for g, p in zip(grads, self.params)]
            # All gradients in one buffer, so handing out a copy is one kernel, not one per parameter.
            self.flat_grads = flat_in_memory_order(grads, self.grad_layouts)
        self.forward_graph.replay()  # the outputs the eager run is compared with

    def param_grads(self):
        """A fresh copy of the last backward replay's gradients, one per parameter (None if unused),
        each with its parameter's strides: DDP's buckets are views in the parameters' memory order
        (channels_last convolutions), and a gradient in another order costs a copy and a warning."""
        return tuple(strided_views(self.flat_grads.clone(), self.grad_layouts))


def flat_in_memory_order(tensors, layouts):
    """The tensors (None skipped) one after the other in one 1-D tensor (one cat), each laid out in
    the memory order of its (shape, strides) layout, so that strided_views gives them back with those
    strides: a tensor already in that order is not copied before the cat."""
    flats = []
    for tensor, layout in zip(tensors, layouts):
        if tensor is not None:
            # Dimensions from the largest stride to the smallest: the layout's memory order.
            order = sorted(range(tensor.dim()), key=lambda d: -layout[1][d])
            flats.append(tensor.permute(order).reshape(-1))
    return torch.cat(flats)


def strided_views(flat, layouts):
    """Consecutive views of the 1-D tensor flat, one per (shape, strides) layout of a dense tensor
    (None gives None): each view covers numel elements of flat with those strides."""
    views, offset = [], 0
    for layout in layouts:
        if layout is None:
            views.append(None)
            continue
        shape, strides = layout
        views.append(flat.as_strided(shape, strides, offset))
        offset += shape.numel()
    return views


class _ReplayTrainingGraphs(torch.autograd.Function):
    """Forward: copy the input in, replay the forward graph. Backward: copy the incoming gradients
    in, replay the backward graph, hand out a copy of the parameter gradients (the graph's buffer
    is overwritten by the next replay; AccumulateGrad may keep what it is given as .grad)."""

    @staticmethod
    def forward(ctx, entry, x, *params):
        ctx.entry = entry
        entry.static_input.copy_(x)
        entry.forward_graph.replay()
        return tuple(o.detach() for o in entry.static_outputs)

    @staticmethod
    def backward(ctx, *grads):
        entry = ctx.entry
        for static, grad in zip(entry.static_grad_outputs, grads):
            static.copy_(grad)
        entry.backward_graph.replay()
        return (None, None) + entry.param_grads()


@contextlib.contextmanager
def _capturing(graph, pool, stream, draws_random=False):
    """Capture into graph (allocating from pool) the CUDA work of the block, on the side stream
    `stream`, so that a capture that fails leaves this process as it was (torch.cuda.graph would
    leave the side stream current and the random generator in capture mode, so that the next
    torch.rand raises).

    thread_local: only this thread's unsafe CUDA calls break the capture. torch's default 'global'
    mode also forbids them in other threads, such as the DataLoader's pin-memory thread allocating
    pinned memory: the likely cause of a training capture that broke in train_net (BENCHMARKS.md, "CUDA graph memory").
    Unless draws_random, the default generator's state is swapped for a copy while capturing: the
    graph registers and advances the copy, never the state eager code draws from. With draws_random
    the graph registers the generator's own state, and each replay draws from it and advances it; a
    capture that fails gives the generator a fresh state (the caller sets its seed and offset back)."""
    generator = torch.cuda.default_generators[stream.device.index]
    state = generator.graphsafe_get_state()
    if not draws_random:
        generator.graphsafe_set_state(state.clone_state())
    try:
        with _on_side_stream(stream):
            graph.capture_begin(pool=pool, capture_error_mode='thread_local')
            try:
                yield
            finally:
                graph.capture_end()
    except BaseException:
        if draws_random:
            generator.graphsafe_set_state(torch.Generator(stream.device).graphsafe_get_state())
        raise
    finally:
        if not draws_random:
            generator.graphsafe_set_state(state)


@contextlib.contextmanager
def _on_side_stream(side):
    """The block's CUDA work on the stream `side`, after the work queued so far on its device's
    current stream; the current stream's later work after the block's, even when the block raises."""
    caller = torch.cuda.current_stream(side.device)
    side.wait_stream(caller)
    try:
        with torch.cuda.stream(side):
            yield
    finally:
        caller.wait_stream(side)


def _capture_autocast(autocast):
    """Autocast as the caller had it, with its cast cache off: cached casts would not be redone by
    a replay (and the cache must be off while a graph is captured, and while it warms up)."""
    if not autocast:
        return contextlib.nullcontext()
    return torch.autocast('cuda', dtype=torch.get_autocast_dtype('cuda'), cache_enabled=False)


def _as_tuple(output):
    return output if isinstance(output, (tuple, list)) else (output,)


def _cloned(output):
    return tuple(t.clone() for t in _as_tuple(output))


def _all_equal(output, expected):
    return all(torch.equal(a, b) for a, b in zip(_as_tuple(output), expected))
