"""The variance-voting rows (--mode voting): Detectron's box_results_with_nms_and_limit on synthetic
box-head outputs of --cfg's model (numpy, so on the host as test_net's CPU runs), STD_NMS True
(KL-Loss's variance voting and soft-NMS) against STD_NMS False (greedy NMS)."""
import numpy as np
import torch

from detectron.core import test as test_lib
from detectron.core.config import cfg

from .timing import Row, cfg_values, per_round_ratios, run_interleaved

# name -> the head outputs of one image: `rois` RoIs around `objects` objects of sides 30-250 px
# (`side` x `side` image), each class's box a jitter of its object's; classes 1..`loaded` score
# `score` +- 0.02 on every RoI, the others 1e-4; the sigmas log-normal around 0.2.
VOTING_CASES = {
    # The case of issue 51: ~5000 candidates, 100 detections kept.
    'loaded': dict(rois=1000, objects=25, loaded=5, score=0.2, side=800),
    # Few large overlapping objects: every selected box overlaps most of its class.
    'dense': dict(rois=1000, objects=4, loaded=5, score=0.2, side=600),
    # 15 classes at ~0.06: ~12000 candidates over many classes.
    'many_classes': dict(rois=1000, objects=25, loaded=15, score=0.06, side=800),
}


def voting_head_outputs(case, num_classes, seed=0):
    """(scores (R, K), boxes (R, 4K), sigmas (R, 4K)) float32 of VOTING_CASES[case]."""
    c = VOTING_CASES[case]
    rng = np.random.RandomState(seed)
    centres = rng.uniform(60, c['side'] - 60, size=(c['objects'], 2))
    sizes = rng.uniform(30, 250, size=(c['objects'], 2))
    owner = rng.randint(c['objects'], size=c['rois'])
    half = sizes[owner] / 2
    objects = np.hstack([centres[owner] - half, centres[owner] + half])
    jitter = rng.randn(c['rois'], num_classes, 4) * np.tile(sizes[owner] * 0.1, 2)[:, None]
    boxes = np.clip(objects[:, None] + jitter, 0, c['side'] - 1).reshape(c['rois'], -1)
    scores = np.full((c['rois'], num_classes), 1e-4)
    scores[:, 1:c['loaded'] + 1] = c['score'] + rng.uniform(-0.02, 0.02, size=(c['rois'], c['loaded']))
    scores[:, 0] = 1 - scores[:, 1:].sum(1)
    sigmas = np.exp(rng.randn(c['rois'], 4 * num_classes) * 0.5) * 0.2
    return scores.astype(np.float32), boxes.astype(np.float32), sigmas.astype(np.float32)


def run_voting(args, model_type, report, timing):
    """Rows of box_results_with_nms_and_limit on --voting-case with STD_NMS False and True in
    interleaved rounds, and their per-round ratio (the cost of variance voting)."""
    scores, boxes, sigmas = voting_head_outputs(args.voting_case, cfg.MODEL.NUM_CLASSES)
    rows = []
    for std_nms in (False, True):
        def step(std_nms=std_nms):
            return test_lib.box_results_with_nms_and_limit(model_type, scores, boxes, sigmas if std_nms else None)
        with cfg_values({'STD_NMS': std_nms}):
            detections = len(step()[0])
        info = {'rois': len(scores), 'candidates': int((scores[:, 1:] > cfg.TEST.SCORE_THRESH).sum()),
                'detections': detections}
        rows.append(Row('test', 'box_results_with_nms_and_limit, {}, STD_NMS {}'.format(args.voting_case, std_nms),
                        step, 1, cfg={'STD_NMS': std_nms}, info=info))
    run_interleaved(rows, **dict(timing, device=torch.device('cpu')))
    for row in rows:
        report.add_row(row, batch=1, precision='fp32')
    plain, voting = rows
    report.add_ratio('STD_NMS True / False, {} (variance voting / plain NMS)'.format(args.voting_case),
                     per_round_ratios(voting.values, plain.values))
    report.add_ratio('STD_NMS True / False, {}, best round of each'.format(args.voting_case),
                     [min(voting.values) / min(plain.values)])
