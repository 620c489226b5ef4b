"""Box sets for the soft-NMS tests (ops/variance_voting.py, ops/graph_soft_nms.py): padded sets
clustered like a detector's, with drops, ties and thresholds, and KL-Loss's soft settings."""
import numpy as np

F32 = np.float32


def clustered_sets(seed, width, counts, ties=False):
    """(C, width) padded sets: boxes around 3 objects per set, some with scores just above the
    0.001 drop score (so that rescoring drops them), the padding rows random finite values."""
    rng = np.random.RandomState(seed)
    num_sets = len(counts)
    centres = rng.uniform(30, 200, (num_sets, 3, 2))
    sizes = rng.uniform(10, 60, (num_sets, 3, 2))
    owner = rng.randint(3, size=(num_sets, width))
    take = np.arange(num_sets)[:, None]
    half, centre = sizes[take, owner] / 2, centres[take, owner]
    jitter = rng.randn(num_sets, width, 4) * np.concatenate([half, half], axis=2) * 0.3
    boxes = np.concatenate([centre - half, centre + half], axis=2) + jitter
    scores = np.where(rng.rand(num_sets, width) < 0.3, rng.uniform(0.001, 0.004, (num_sets, width)),
                      rng.uniform(0.05, 1.0, (num_sets, width)))
    if ties:
        # Integer boxes, repeated boxes and a handful of score levels: many exact ties.
        boxes = np.round(boxes)
        repeats = np.arange(1, width, 3)
        boxes[:, repeats] = boxes[:, repeats - 1]
        scores = rng.choice([0.9, 0.5, 0.5, 0.3, 0.0025, 0.0015], size=(num_sets, width))
    sigmas = rng.uniform(0.05, 0.5, (num_sets, width, 4))
    for c, count in enumerate(counts):
        boxes[c, count:] = rng.uniform(0, 300, (width - count, 4))
        scores[c, count:] = rng.uniform(0, 1, width - count)
    return (boxes.astype(F32), scores.astype(F32), sigmas.astype(F32),
            np.array(counts, dtype=np.int64))


def threshold_set():
    """A [0,0,9,9] 0.9; B [0,0,9,19] 0.8 with IoU(A, B) = 100 / 200 = 0.5 exactly; C [10,0,19,9]
    0.0005 touching A and B (IoU 0: never rescored, though below the drop score); D [9,9,18,18]
    0.0010001 with IoU(A, D) = 1 / 199, IoU(B, D) = 10 / 290, IoU(C, D) = 9 / 191."""
    boxes = np.array([[[0, 0, 9, 9], [0, 0, 9, 19], [10, 0, 19, 9], [9, 9, 18, 18]]], F32)
    scores = np.array([[0.9, 0.8, 0.0005, 0.0010001]], F32)
    return boxes, scores, np.ones((1, 4, 4), F32), np.array([4])


def drop_swaps_set():
    """A [0,0,9,9] 0.9 overlaps rows 1 and 2 (IoU 0.9 each); rows 3-6 are far apart from
    everything, all scored 0.3."""
    far = [[100 * k, 100, 100 * k + 9, 109] for k in range(1, 5)]
    boxes = np.array([[[0, 0, 9, 9], [0, 0, 9, 8], [1, 0, 9, 9]] + far], F32)
    scores = np.array([[0.9, 0.8, 0.7, 0.3, 0.3, 0.3, 0.3]], F32)
    return boxes, scores, np.ones((1, 7, 4), F32), np.array([7])


def kl_settings(vote_thresh=0.01, iou_sigma=0.02, vote=True, hard_nms_thresh=None):
    return dict(vote_thresh=vote_thresh, iou_sigma=iou_sigma, vote=vote,
                hard_nms_thresh=hard_nms_thresh)


def small_cases():
    """name -> (inputs, settings); small enough for Triton's interpreter. Widths 16 (a block
    exactly), 17 (just above one), 12, 9 and 5."""
    return {
        'soft_vote': (clustered_sets(0, 16, [16, 11, 0, 1]), kl_settings()),
        'soft_vote_ties': (clustered_sets(1, 17, [17, 17, 9], ties=True), kl_settings()),
        'hard_vote': (clustered_sets(2, 12, [12, 7, 12]), kl_settings(hard_nms_thresh=0.3)),
        'hard_no_vote_ties': (clustered_sets(3, 9, [9, 4], ties=True),
                              kl_settings(vote=False, hard_nms_thresh=0.5)),
        'soft_no_vote': (clustered_sets(4, 5, [5, 5, 2]), kl_settings(vote=False)),
        'high_vote_thresh': (clustered_sets(5, 14, [14, 14]),
                             kl_settings(vote_thresh=0.5, iou_sigma=0.05)),
        'thresholds_soft': (threshold_set(), kl_settings(vote_thresh=0.5)),
        'thresholds_hard': (threshold_set(), kl_settings(vote_thresh=0.5, hard_nms_thresh=0.5)),
        'drop_swaps_then_ties': (drop_swaps_set(), kl_settings(hard_nms_thresh=0.5)),
        'no_sets': (clustered_sets(6, 6, []), kl_settings()),
        'no_boxes': (clustered_sets(7, 0, [0, 0]), kl_settings()),
    }


def large_cases():
    return {
        'soft_vote_150': (clustered_sets(10, 150, [150, 120]), kl_settings(iou_sigma=0.01)),
        'hard_vote_150_ties': (clustered_sets(11, 150, [150, 90], ties=True),
                               kl_settings(hard_nms_thresh=0.5)),
    }
