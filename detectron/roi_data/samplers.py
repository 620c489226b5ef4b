"""Which dataset entries each process reads: training batches and inference ranges.

Training: one global stream of batches that depends only on (seed, global batch size, groups); each
rank takes a fixed slice of every global batch. Hence
- all ranks agree without communicating, and no entry is used twice within an epoch;
- the stream is the same whatever the number of processes, as long as the global batch is: a run
  resumed at iteration k on another number of GPUs sees what the uninterrupted run would have seen;
- the position is just the iteration number: batch k is computed directly, nothing is replayed (unless a
  check drops batches: then the position is the draw count, which checkpoints store; see
  GroupedDistributedBatchSampler).

Inference: Detectron's np.array_split ranges (contiguous, the first n % k one larger, no padding), so
merging the per-rank results in rank order gives the single-process order.
"""
import bisect
import logging

import numpy as np

from detectron.utils.errors import ConfigValueError

logger = logging.getLogger(__name__)


class GroupedDistributedBatchSampler:
    """Infinite iterator over this rank's training batches (lists of dataset indices).

    aspect_ratios: one group id (bool or int) per dataset entry; a batch only holds entries of one
      group. Detectron's ASPECT_GROUPING uses width >= height; pass one constant to disable grouping.
    ims_per_batch: images per rank per iteration (TRAIN.IMS_PER_BATCH).
    seed: the stream's seed, identical on all ranks.
    rank_batch_sizes: per-rank sizes that may differ (CenterNet's chunk sizes); overrides
      ims_per_batch. The global batch is their sum.
    start_iter: the first global batch to yield (resume).
    check: None, or fn(rank_batches, iteration) -> None for a valid global batch, else why it is not
      (rank_batches: every rank's slice, in rank order; iteration: the global batch it would be). An
      invalid global batch is dropped and the next drawn (Detectron's loader redraws a minibatch that
      get_minibatch calls invalid); every rank judges all slices, so the ranks drop the same ones and
      stand at the same position.
    start_position: position(start_iter) of the interrupted run (a checkpoint stores it), from which a
      resumed sampler draws what the uninterrupted one drew, judging no earlier draw. Without it (or when
      it is another global batch's) a check's draws before start_iter are judged again to find it.
    iter_size: global batches per training iteration (SOLVER.ITER_SIZE), for the log lines' iterations.

    Epoch e (a pass over the data) follows Detectron's roi_data/loader.py _shuffle_roidb_inds, with the
    global batch in place of the per-GPU one: shuffle each group, drop each group's remainder modulo
    the global batch, cut into global batches, shuffle the batch order. The generator of epoch e is
    seeded with (seed, e), so epochs differ and a run is reproducible. Up to (global batch - 1)
    entries per group are left out of each epoch (a different random few every epoch).
    With shuffle=False every epoch is the dataset order, group by group.
    """

    def __init__(self, aspect_ratios, ims_per_batch, seed, rank, world_size, shuffle=True,
                 rank_batch_sizes=None, start_iter=0, check=None, start_position=None, iter_size=1):
        sizes = list(rank_batch_sizes) if rank_batch_sizes is not None else [ims_per_batch] * world_size
        _check_rank_sizes(sizes, rank, world_size)
        self.seed = seed
        self.shuffle = shuffle
        self.start_iter = start_iter
        self.global_batch_size = sum(sizes)
        self._rank_slices = [slice(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(world_size)]
        self._rank_slice = self._rank_slices[rank]
        self._check = check
        self._stored_position = start_position
        self._iter_size = iter_size
        # The draws check dropped: how many before _skips began, then the global batch each was drawn for.
        self._skips_before, self._skips = 0, []
        self._next_minibatch = -1  # the next global batch to yield (none before iterating)
        _, self._group_of_entry = np.unique(np.asarray(aspect_ratios), return_inverse=True)
        self._group_of_entry = self._group_of_entry.reshape(-1)
        self.batches_per_epoch = _batches_per_epoch(self._group_of_entry, self.global_batch_size)
        self._epoch_cache = (None, None)

    def __iter__(self):
        position = self._start_position()
        draws = self._valid_draws(position)
        for _ in range(self.start_iter - _minibatch_of(position)):
            next(draws)  # no stored position: the check's draws before start_iter are judged again
        skipped = self.position(self.start_iter)['skipped']
        if skipped:
            logger.info('%d training minibatches skipped before iteration %d', skipped,
                        self.start_iter // self._iter_size)
        for batch in draws:
            yield batch[self._rank_slice].tolist()

    @property
    def skipped(self):
        """Global batches dropped by check so far, from the start of the run."""
        return self._skips_before + len(self._skips)

    def position(self, minibatch):
        """Where the stream stands when global batch `minibatch` is drawn, from the start of the run:
        {'draws': draws consumed before it, 'skipped': how many of them check dropped}. A checkpoint
        stores it for a resumed sampler's start_position; known from start_iter to the next batch to yield."""
        if not self.start_iter <= minibatch <= self._next_minibatch:
            raise ValueError('the stream position of global batch {} is not known: the sampler started at {} and '
                             'stands at {}'.format(minibatch, self.start_iter, self._next_minibatch))
        skipped = self._skips_before + bisect.bisect_left(self._skips, minibatch)
        return {'draws': minibatch + skipped, 'skipped': skipped}

    def _start_position(self):
        """The stored position when it is start_iter's; else that of the start of the run with a check (whose
        draws are then judged again), or start_iter's without one (every draw is valid)."""
        stored = self._stored_position
        if stored is not None and _minibatch_of(stored) == self.start_iter:
            return stored
        if stored is not None:
            logger.warning('The stored sampler position (draw %d, %d skipped) is not that of global batch %d (was '
                           'SOLVER.ITER_SIZE changed?): the position is found from the start of the run',
                           stored['draws'], stored['skipped'], self.start_iter)
        return {'draws': 0 if self._check is not None else self.start_iter, 'skipped': 0}

    def _valid_draws(self, position):
        """The global batches check keeps, in order, from stream position on; records the skipped draws."""
        self._skips_before, self._skips = position['skipped'], []
        self._next_minibatch = _minibatch_of(position)
        return self._kept_draws(position['draws'])

    def _kept_draws(self, draw):
        in_a_row = 0
        while True:
            batch = self.global_batch(draw)
            why = self._judge(batch)
            draw += 1
            if why is None:
                self._next_minibatch += 1
                in_a_row = 0
                yield batch
                continue
            self._skips.append(self._next_minibatch)
            in_a_row += 1
            # Two epochs' worth in a row hold a whole epoch: Detectron's loader would redraw forever.
            if in_a_row >= 2 * self.batches_per_epoch:
                raise ConfigValueError('no training minibatch of a whole epoch is valid ({} in a row); the last: '
                                       '{}'.format(in_a_row, why))
            if self._next_minibatch >= self.start_iter:
                logger.info('Training minibatch of images %s skipped at iteration %d: %s (%d skipped so far)',
                            batch.tolist(), self._next_minibatch // self._iter_size, why, self.skipped)

    def _judge(self, batch):
        if self._check is None:
            return None
        return self._check([batch[s].tolist() for s in self._rank_slices], self._next_minibatch)

    def global_batch(self, iteration):
        """Dataset indices of global batch `iteration`, all ranks' slices in rank order."""
        epoch, position = divmod(iteration, self.batches_per_epoch)
        return self._epoch_batches(epoch)[position]

    def _epoch_batches(self, epoch):
        cached_epoch, batches = self._epoch_cache
        if cached_epoch != epoch:
            batches = _grouped_batches(self._group_of_entry, self.global_batch_size,
                                       np.random.default_rng([self.seed, epoch]) if self.shuffle else None)
            self._epoch_cache = (epoch, batches)
        return batches


def _minibatch_of(position):
    return position['draws'] - position['skipped']


def _check_rank_sizes(sizes, rank, world_size):
    if len(sizes) != world_size:
        raise ConfigValueError('{} per-rank batch sizes given for {} processes; give one per process'
                               .format(len(sizes), world_size))
    if min(sizes) < 1:
        raise ConfigValueError('per-rank batch sizes {} must all be >= 1'.format(sizes))
    if not 0 <= rank < world_size:
        raise ValueError('rank {} is outside world size {}'.format(rank, world_size))


def _batches_per_epoch(group_of_entry, global_batch_size):
    group_sizes = np.bincount(group_of_entry)
    batches = int((group_sizes // global_batch_size).sum())
    if batches == 0:
        raise ConfigValueError(
            'no image group fills one global batch of {} images (group sizes {}); lower '
            'TRAIN.IMS_PER_BATCH / NUM_GPUS or turn off TRAIN.ASPECT_GROUPING'
            .format(global_batch_size, group_sizes.tolist()))
    return batches


def _grouped_batches(group_of_entry, global_batch_size, rng):
    """(batches_per_epoch, global_batch_size) array of one epoch; rng None keeps the data order."""
    per_group = []
    for group in range(group_of_entry.max() + 1):
        members = np.flatnonzero(group_of_entry == group)
        if rng is not None:
            members = rng.permutation(members)
        per_group.append(members[:len(members) // global_batch_size * global_batch_size])
    batches = np.concatenate(per_group).reshape(-1, global_batch_size)
    return batches[rng.permutation(len(batches))] if rng is not None else batches


def inference_ranges(num_items, num_parts):
    """Detectron's np.array_split ranges as [(start, end)]: 10 over 3 -> (0, 4), (4, 7), (7, 10)."""
    base, larger = divmod(num_items, num_parts)
    bounds = np.cumsum([0] + [base + 1] * larger + [base] * (num_parts - larger))
    return [(int(start), int(end)) for start, end in zip(bounds[:-1], bounds[1:])]


def chunk_sizes(batch_size, master_batch_size, num_gpus):
    """CenterNet's per-GPU split of one batch (opts.py): [master] + the rest spread over the other
    GPUs, the first (rest % (n - 1)) of them one larger. master_batch_size -1 means
    batch_size // num_gpus. 114/18/4 -> [18, 32, 32, 32]; 32/-1/3 -> [10, 11, 11].

    On one GPU the result is [batch_size]: CenterNet ignores its chunk sizes there (no
    DataParallel), whatever the master size. Nothing is validated here; see check_chunk_sizes.
    """
    if num_gpus == 1:
        return [batch_size]
    master = batch_size // num_gpus if master_batch_size == -1 else master_batch_size
    slaves, larger = divmod(batch_size - master, num_gpus - 1)
    return [master] + [slaves + 1 if i < larger else slaves for i in range(num_gpus - 1)]


def check_chunk_sizes(chunks, batch_size, master_batch_size, num_gpus):
    """Raise ConfigValueError unless chunks (derived or given as CENTERNET.CHUNK_SIZES) give every
    one of NUM_GPUS GPUs at least one image, sum to CENTERNET.BATCH_SIZE and start with an
    explicit CENTERNET.MASTER_BATCH_SIZE (a master size is ignored on one GPU, as in CenterNet)."""
    chunks = list(chunks)
    master_given = num_gpus > 1 and master_batch_size != -1
    if master_given and master_batch_size > batch_size:
        raise ConfigValueError(
            'CENTERNET.MASTER_BATCH_SIZE {} is larger than CENTERNET.BATCH_SIZE {}; lower it or set '
            'it to -1 for an even split over NUM_GPUS.'.format(master_batch_size, batch_size))
    if len(chunks) != num_gpus:
        raise ConfigValueError(
            'CENTERNET.CHUNK_SIZES {} has {} entries for NUM_GPUS {}; give one per GPU.'
            .format(chunks, len(chunks), num_gpus))
    if min(chunks) < 1:
        raise ConfigValueError(
            'CENTERNET.CHUNK_SIZES {} (CENTERNET.BATCH_SIZE {}, CENTERNET.MASTER_BATCH_SIZE {}, '
            'NUM_GPUS {}) gives a GPU no images; use a CENTERNET.BATCH_SIZE of at least NUM_GPUS '
            'and a CENTERNET.MASTER_BATCH_SIZE of -1 or at least 1.'
            .format(chunks, batch_size, master_batch_size, num_gpus))
    if sum(chunks) != batch_size:
        raise ConfigValueError(
            'CENTERNET.CHUNK_SIZES {} sum to {}, not CENTERNET.BATCH_SIZE {}; make them add up.'
            .format(chunks, sum(chunks), batch_size))
    if master_given and chunks[0] != master_batch_size:
        raise ConfigValueError(
            'CENTERNET.CHUNK_SIZES {} start with {} but CENTERNET.MASTER_BATCH_SIZE is {}; make them '
            'agree or set CENTERNET.MASTER_BATCH_SIZE to -1.'
            .format(chunks, chunks[0], master_batch_size))
