"""Keypoint R-CNN on precomputed proposals: Detectron's finalize_keypoint_minibatch (a minibatch is valid when
its keypoint RoIs hold more than KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH visible keypoints) and its loader's
redraw of invalid minibatches, judged by the sampler on hand-made roidb entries."""
import functools
import itertools
import logging

import cv2
import numpy as np
import pytest
import torch

from detectron.roi_data.keypoint_rcnn import (invalid_keypoint_minibatch, keypoint_targets, visible_keypoint_count,
                                              with_keypoint_priority)
from detectron.roi_data.loader import TrainingDataset
from detectron.roi_data.minibatch import collate_minibatch, prepare_training_entry
from detectron.roi_data.samplers import GroupedDistributedBatchSampler
from detectron.utils.errors import ConfigValueError

COUNT_ARGS = dict(seed=3, scales=(40, 60), max_size=100, fg_thresh=0.5, fg_rois_per_image=8, heatmap_size=8)


def _entry(name, gt_box, keypoints, proposals):
    """A merged roidb entry as proposal_files makes it: the gt row, then the proposals (class 0, overlap >= 0)."""
    boxes = np.array([gt_box] + proposals, dtype=np.float32)
    return {'image': name, 'height': 80, 'width': 100, 'flipped': False, 'boxes': boxes,
            'gt_classes': np.array([1] + [0] * len(proposals), dtype=np.int32),
            'is_crowd': np.zeros(len(boxes), dtype=bool), 'max_overlaps': np.ones(len(boxes), dtype=np.float32),
            'gt_keypoints': np.array([keypoints], dtype=np.float32).transpose(0, 2, 1)}


# 'few': two visible keypoints in the gt box (one visible outside it, one unlabelled); its proposal (IoU 0.9)
# holds both, the far one is background: 2 + 2 = 4. 'many': four visible keypoints in the gt box; the proposal
# from (2, 2) (IoU 0.9025) holds them all: 4 + 4 = 8.
FEW = _entry('few.png', [0, 0, 40, 40], [(10, 10, 2), (20, 20, 2), (30, 30, 0), (50, 50, 2)],
             [[0, 0, 40, 36], [60, 60, 90, 79]])
MANY = _entry('many.png', [0, 0, 40, 40], [(5, 5, 2), (15, 15, 2), (25, 25, 2), (35, 35, 2)], [[2, 2, 40, 40]])


def test_visible_keypoints_of_the_keypoint_rois_are_counted():
    assert visible_keypoint_count([(0, FEW)], 0, **COUNT_ARGS) == 4
    assert visible_keypoint_count([(0, MANY)], 5, **COUNT_ARGS) == 8
    assert visible_keypoint_count([(0, FEW), (1, MANY)], 2, **COUNT_ARGS) == 12


def test_a_minibatch_is_valid_with_more_visible_keypoints_than_the_minimum():
    roidb = [FEW, MANY]
    check = functools.partial(invalid_keypoint_minibatch, roidb=roidb, **COUNT_ARGS)
    # Detectron: valid = num_visible_keypoints > MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH.
    assert check([[0]], 0, min_count=3) is None
    assert check([[0]], 0, min_count=4) == ('the keypoint RoIs of few.png hold 4 visible keypoints, not more than '
                                            'KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH 4')
    assert check([[1]], 0, min_count=7) is None
    assert check([[0, 1]], 0, min_count=11) is None  # one GPU's two images together
    assert check([[1], [0]], 0, min_count=4) is not None  # any rank's part invalid: the global batch is


ROIDB = [FEW, MANY, MANY, FEW, MANY, MANY]
VALID = [False, True, True, False, True, True]


def _sampler(world_size=1, rank=0, start_iter=0, check=True, calls=None, **resume):
    """The sampler over ROIDB; with calls (a list) its check records the global batch of every draw it judges."""
    judge = functools.partial(invalid_keypoint_minibatch, roidb=ROIDB, min_count=4, **COUNT_ARGS)

    def counted(rank_batches, iteration):
        calls.append(iteration)
        return judge(rank_batches, iteration)
    return GroupedDistributedBatchSampler(
        [0] * len(ROIDB), 1, seed=5, rank=rank, world_size=world_size, start_iter=start_iter,
        check=(judge if calls is None else counted) if check else None, **resume)


def _expected_positions(count, world_size=1):
    """Independently of the sampler's bookkeeping: where the stream stands when each of the first count valid
    global batches is sought ({'draws': the draws up to the previous valid one, 'skipped': the invalid ones})."""
    unchecked = GroupedDistributedBatchSampler([0] * len(ROIDB), 1, seed=5, rank=0, world_size=world_size)
    valid_draws = [d for d in range(6 * count) if all(VALID[i] for i in unchecked.global_batch(d))]
    starts = [0] + [draw + 1 for draw in valid_draws[:count - 1]]
    return [{'draws': start, 'skipped': start - minibatch} for minibatch, start in enumerate(starts)]


def test_invalid_minibatches_are_skipped_and_the_next_drawn(caplog):
    unchecked = list(itertools.islice(_sampler(check=False), 12))
    sixth_valid = [i for i, batch in enumerate(unchecked) if VALID[batch[0]]][5]
    expected = [batch for batch in unchecked[:sixth_valid + 1] if VALID[batch[0]]]
    skipped = [batch for batch in unchecked[:sixth_valid] if not VALID[batch[0]]]
    assert skipped  # the stream meets 'few' images before its sixth valid one
    sampler = _sampler()
    with caplog.at_level(logging.INFO):
        assert list(itertools.islice(sampler, 6)) == expected
    assert sampler.skipped == len(skipped)
    lines = [r.getMessage() for r in caplog.records if 'skipped' in r.getMessage()]
    assert len(lines) == len(skipped)
    assert all('the keypoint RoIs of few.png hold 4 visible keypoints' in line for line in lines)


def test_a_resumed_sampler_draws_what_the_uninterrupted_one_drew():
    whole = list(itertools.islice(_sampler(), 8))
    for start in (1, 3, 5):
        assert list(itertools.islice(_sampler(start_iter=start), 8 - start)) == whole[start:]


def test_the_sampler_reports_where_the_stream_stands_for_each_global_batch():
    sampler = _sampler()
    list(itertools.islice(sampler, 9))
    expected = _expected_positions(10)
    # Draws 3, 5 and 8 are 'few' images: minibatch 4 is sought from draw 5 (3 dropped), minibatch 7 from draw 10.
    assert expected[4] == {'draws': 5, 'skipped': 1} and expected[7] == {'draws': 10, 'skipped': 3}
    assert [sampler.position(m) for m in range(10)] == expected
    with pytest.raises(ValueError, match='position of global batch 10 is not known'):
        sampler.position(10)  # not sought yet


def test_a_sampler_resumed_at_its_stored_position_judges_no_earlier_draw():
    whole = list(itertools.islice(_sampler(), 12))
    positions = _expected_positions(13)
    for start in (1, 4, 6):
        calls = []
        resumed = _sampler(start_iter=start, calls=calls, start_position=positions[start])
        assert list(itertools.islice(resumed, 12 - start)) == whole[start:]
        assert min(calls) == start  # no draw before the stored position is judged again
        assert len(calls) == positions[12]['draws'] - positions[start]['draws']  # each later draw once
        assert resumed.skipped == positions[12]['skipped']


def test_without_a_stored_position_the_earlier_draws_are_judged_again():
    # A checkpoint written before positions were stored.
    whole = list(itertools.islice(_sampler(), 12))
    positions = _expected_positions(13)
    calls = []
    assert list(itertools.islice(_sampler(start_iter=6, calls=calls), 6)) == whole[6:]
    assert len(calls) == positions[12]['draws'] and min(calls) == 0


def test_a_position_of_another_global_batch_is_found_again_with_a_warning(caplog):
    # SOLVER.ITER_SIZE changed between the runs: the stored position is of global batch 6, the resume at 3.
    whole = list(itertools.islice(_sampler(), 8))
    calls = []
    with caplog.at_level(logging.WARNING):
        resumed = _sampler(start_iter=3, calls=calls, start_position=_expected_positions(7)[6])
        assert list(itertools.islice(resumed, 5)) == whole[3:]
    assert 'is not that of global batch 3 (was SOLVER.ITER_SIZE changed?)' in caplog.text
    assert min(calls) == 0


def test_the_skip_log_names_iterations_of_iter_size_global_batches(caplog):
    positions = _expected_positions(13)
    with caplog.at_level(logging.INFO):
        list(itertools.islice(_sampler(start_iter=6, start_position=positions[6], iter_size=2), 6))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == '{} training minibatches skipped before iteration 3'.format(positions[6]['skipped'])
    skipped_at = [int(line.split(' skipped at iteration ')[1].split(':')[0]) for line in lines[1:]]
    # The draws dropped while global batch m (iteration m // 2) was sought, for m = 6 .. 11.
    assert skipped_at == [m // 2 for m in range(6, 12) for _ in range(positions[m + 1]['skipped'] -
                                                                      positions[m]['skipped'])]
    assert lines[-1].endswith('({} skipped so far)'.format(positions[12]['skipped']))


def test_ranks_stand_at_the_same_position():
    samplers = [_sampler(world_size=2, rank=r) for r in (0, 1)]
    whole = [list(itertools.islice(sampler, 5)) for sampler in samplers]
    position = _expected_positions(4, world_size=2)[3]
    assert position == {'draws': 8, 'skipped': 5}
    assert [sampler.position(3) for sampler in samplers] == [position, position]
    for rank in (0, 1):
        resumed = _sampler(world_size=2, rank=rank, start_iter=3, start_position=position)
        assert list(itertools.islice(resumed, 2)) == whole[rank][3:]


def test_ranks_skip_the_same_global_batches():
    # Two ranks of one image each: a global batch of two is dropped when either image's part is invalid.
    ranks = [list(itertools.islice(_sampler(world_size=2, rank=r), 3)) for r in (0, 1)]
    draws = GroupedDistributedBatchSampler([0] * len(ROIDB), 1, seed=5, rank=0, world_size=2)
    expected = [b.tolist() for b in map(draws.global_batch, range(12)) if all(VALID[i] for i in b)][:3]
    assert [r0 + r1 for r0, r1 in zip(*ranks)] == expected


def test_an_epoch_without_a_valid_minibatch_is_an_error():
    sampler = GroupedDistributedBatchSampler(
        [0, 0], 1, seed=0, rank=0, world_size=1,
        check=functools.partial(invalid_keypoint_minibatch, roidb=[FEW, FEW], min_count=4, **COUNT_ARGS))
    with pytest.raises(ConfigValueError, match='no training minibatch of a whole epoch'):
        next(iter(sampler))


def test_the_judged_count_is_the_count_the_model_trains_on(tmp_path):
    """With one keypoint RoI per image and two candidates (the gt row: 2 visible keypoints; the proposal: 1) the
    count depends on the draw: the sampler's judgement replays the loader sample's draws."""
    entry = _entry(str(tmp_path / 'im.png'), [0, 0, 40, 40], [(10, 10, 2), (30, 30, 2), (35, 5, 0)],
                   [[0, 0, 40, 20]])
    entry['boxes'][1] = [0, 0, 40, 25]  # IoU 0.625, holding the first keypoint only
    cv2.imwrite(entry['image'], np.full((80, 100, 3), 128, np.uint8))
    args = dict(COUNT_ARGS, fg_rois_per_image=1)
    prepare = functools.partial(prepare_training_entry, scales=args['scales'], max_size=args['max_size'],
                                pixel_means=np.zeros((1, 1, 3)))
    dataset = TrainingDataset([entry], functools.partial(with_keypoint_priority, prepare=prepare), seed=args['seed'])
    counts = []
    for iteration in range(16):
        _, im_info, targets = collate_minibatch([dataset[(iteration, 0)]], stride=32)
        scale = im_info[:, 2]
        rois = torch.cat((torch.zeros(len(targets[0]['proposals']), 1), targets[0]['proposals'] * scale[0]), dim=1)
        trained = keypoint_targets(rois, scale, targets, args['fg_thresh'], 1, args['heatmap_size'])
        counts.append(int(trained.weights.sum()))
        assert visible_keypoint_count([(0, entry)], iteration, **args) == counts[-1]
    assert set(counts) == {1, 2}


def test_the_gt_rows_bound_never_exceeds_the_count():
    """invalid_keypoint_minibatch skips counting a part whose gt rows alone hold more than the minimum: that bound
    (per image the gt rows' visible keypoints inside their boxes, at most fg_rois_per_image) is at most the count."""
    rng = np.random.RandomState(1)
    for trial in range(40):
        num_gt, num_proposals = rng.randint(1, 4), rng.randint(0, 30)
        gt = np.sort(rng.uniform(0, 70, (num_gt, 2, 2)), axis=1).transpose(0, 2, 1).reshape(num_gt, 4)
        proposals = gt[rng.randint(num_gt, size=num_proposals)] + rng.uniform(-8, 8, (num_proposals, 4))
        keypoints = np.stack([rng.uniform(0, 80, (num_gt, 6)), rng.uniform(0, 80, (num_gt, 6)),
                              rng.choice([0, 2], (num_gt, 6))], axis=1).transpose(0, 2, 1)
        entry = _entry('random.png', gt[0].tolist(), keypoints[0].tolist(), proposals.tolist())
        entry['boxes'] = np.vstack([gt, proposals]).astype(np.float32)
        entry['gt_keypoints'] = keypoints.transpose(0, 2, 1).astype(np.float32)
        entry['gt_classes'] = np.array([1] * num_gt + [0] * num_proposals)
        entry['is_crowd'] = np.zeros(num_gt + num_proposals, bool)
        entry['max_overlaps'] = np.ones(num_gt + num_proposals, np.float32)
        args = dict(COUNT_ARGS, fg_rois_per_image=rng.randint(1, 6))
        count = visible_keypoint_count([(0, entry)], trial, **args)
        inside = sum(int(((k[:, 0] >= b[0]) & (k[:, 0] <= b[2]) & (k[:, 1] >= b[1]) & (k[:, 1] <= b[3])
                          & (k[:, 2] > 0)).sum()) for k, b in zip(keypoints, gt))
        bound = min(inside, args['fg_rois_per_image'])
        assert bound <= count
        check = functools.partial(invalid_keypoint_minibatch, roidb=[entry], **args)
        for min_count in range(max(0, count - 2), count + 2):
            assert (check([[0]], trial, min_count=min_count) is None) == (count > min_count)
