"""Training batch sampler (grouping, sharding, reshuffling, resume) and inference ranges."""
import itertools

import numpy as np
import pytest

from detectron.roi_data.samplers import GroupedDistributedBatchSampler, inference_ranges
from detectron.utils.errors import ConfigValueError

# 23 entries: 13 landscape (True), 10 portrait (False), interleaved.
GROUPS = [True, False] * 10 + [True] * 3
LANDSCAPE = {i for i, g in enumerate(GROUPS) if g}


def _take(sampler, count):
    return list(itertools.islice(iter(sampler), count))


def _global_stream(world_sizes_and_batches, count, start_iter=0, seed=7):
    """Per iteration, the concatenation of every rank's batch (rank order)."""
    world_size = len(world_sizes_and_batches)
    per_rank = [_take(GroupedDistributedBatchSampler(GROUPS, None, seed, rank, world_size,
                                                     rank_batch_sizes=world_sizes_and_batches,
                                                     start_iter=start_iter), count)
                for rank in range(world_size)]
    return [sum((batches[i] for batches in per_rank), []) for i in range(count)]


def _detectron_epoch(groups, batch, seed, epoch):
    """Detectron's _shuffle_roidb_inds, step by step, with the global batch and a (seed, epoch) generator."""
    rng = np.random.default_rng([seed, epoch])
    kept = []
    for group in sorted(set(groups)):
        members = [i for i, g in enumerate(groups) if g == group]
        shuffled = [members[j] for j in rng.permutation(len(members))]
        kept += shuffled[:len(shuffled) // batch * batch]
    rows = [kept[i:i + batch] for i in range(0, len(kept), batch)]
    return [rows[j] for j in rng.permutation(len(rows))]


def test_stream_is_detectrons_grouped_shuffle_per_epoch():
    # G = 4: 13 landscape -> 3 batches (1 left out), 10 portrait -> 2 batches (2 left out).
    sampler = GroupedDistributedBatchSampler(GROUPS, 4, seed=7, rank=0, world_size=1)
    assert sampler.batches_per_epoch == 5
    expected = _detectron_epoch(GROUPS, 4, 7, 0) + _detectron_epoch(GROUPS, 4, 7, 1)
    assert _take(sampler, 10) == expected


def test_ranks_split_each_epoch_without_duplicates_and_groups_are_respected():
    ims_per_batch, world_size = 2, 2
    per_rank = [_take(GroupedDistributedBatchSampler(GROUPS, ims_per_batch, 7, rank, world_size), 15)
                for rank in range(world_size)]
    for epoch in range(3):
        used = [i for batches in per_rank for batch in batches[5 * epoch:5 * epoch + 5] for i in batch]
        assert len(used) == len(set(used)) == 20  # 23 minus the truncated 1 + 2
        assert len(LANDSCAPE & set(used)) == 12 and len(set(used) - LANDSCAPE) == 8
    for batches in per_rank:
        assert all(len(b) == ims_per_batch for b in batches)
    for r0, r1 in zip(*per_rank):  # one global batch: both ranks' images have one orientation
        assert len({GROUPS[i] for i in r0 + r1}) == 1


def test_reshuffle_per_epoch_is_seed_deterministic():
    def epochs(seed):
        return _take(GroupedDistributedBatchSampler(GROUPS, 4, seed, 0, 1), 10)
    first = epochs(7)
    assert first == epochs(7)
    # another order and other batch compositions in the second epoch
    assert {frozenset(b) for b in first[:5]} != {frozenset(b) for b in first[5:]}
    assert first != epochs(8)


def test_unequal_rank_batch_sizes_slice_one_global_batch():
    sizes = [3, 1]
    rank0 = _take(GroupedDistributedBatchSampler(GROUPS, None, 7, 0, 2, rank_batch_sizes=sizes), 10)
    rank1 = _take(GroupedDistributedBatchSampler(GROUPS, None, 7, 1, 2, rank_batch_sizes=sizes), 10)
    assert [len(b) for b in rank0] == [3] * 10 and [len(b) for b in rank1] == [1] * 10
    single = _take(GroupedDistributedBatchSampler(GROUPS, 4, 7, 0, 1), 10)
    assert [a + b for a, b in zip(rank0, rank1)] == single


@pytest.mark.parametrize('rank_sizes', [[4], [2, 2], [1, 1, 1, 1], [3, 1]])
def test_resume_at_k_continues_the_uninterrupted_stream_for_any_split_of_the_global_batch(rank_sizes):
    uninterrupted = _global_stream([2, 2], 16)
    for k in (0, 3, 5, 7):  # 5 and 7 start in the second epoch
        assert _global_stream(rank_sizes, 16 - k, start_iter=k) == uninterrupted[k:]


def test_no_shuffle_keeps_dataset_order_group_by_group():
    sampler = GroupedDistributedBatchSampler([0, 1, 0, 1, 0, 0, 1], 2, seed=0, rank=0, world_size=1,
                                             shuffle=False)
    assert _take(sampler, 4) == [[0, 2], [4, 5], [1, 3], [0, 2]]


def test_bad_batch_settings_are_config_errors():
    with pytest.raises(ConfigValueError, match=r'no image group fills one global batch of 16 images '
                                               r'\(group sizes \[10, 13\]\)'):
        GroupedDistributedBatchSampler(GROUPS, 8, 0, 0, 2)
    with pytest.raises(ConfigValueError, match='1 per-rank batch sizes given for 2 processes'):
        GroupedDistributedBatchSampler(GROUPS, None, 0, 0, 2, rank_batch_sizes=[2])


@pytest.mark.parametrize('num_items,num_parts', [(10, 3), (5000, 8), (7, 7), (2, 3), (0, 2), (9, 1)])
def test_inference_ranges_are_np_array_split(num_items, num_parts):
    chunks = np.array_split(np.arange(num_items), num_parts)
    expected, start = [], 0
    for chunk in chunks:
        expected.append((start, start + len(chunk)))
        start += len(chunk)
    assert inference_ranges(num_items, num_parts) == expected
    assert [list(range(*r)) for r in inference_ranges(num_items, num_parts)] == [chunk.tolist() for chunk in chunks]


def test_inference_ranges_hand_values():
    assert inference_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert len(range(*inference_ranges(10, 3)[2])) == 3
