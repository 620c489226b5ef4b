"""tools/benchmark.py --mode retinanet: the equal-work torchvision RetinaNet, and a CPU smoke run of the rows."""
import json
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tools'))  # as when tools/benchmark.py runs

from benchmark_lib import cli, retinanet_rows  # noqa: E402

from detectron.core.config_finalize import finalize_cfg  # noqa: E402
from detectron.modeling import model_builder  # noqa: E402
from detectron.core.config import cfg  # noqa: E402

RETINANET_R50 = os.path.join(REPO, 'configs', '12_2017_baselines', 'retinanet_R-50-FPN_1x.yaml')


def test_equal_work_torchvision_retinanet_has_our_head_and_p6_on_c5():
    finalize_cfg(RETINANET_R50, [])
    tv = retinanet_rows.torchvision_retinanet(81, 800, 1333)
    norms = [m for m in tv.modules() if isinstance(m, (FrozenBatchNorm2d, nn.BatchNorm2d))]
    assert len(norms) == 53 and all(isinstance(m, FrozenBatchNorm2d) for m in norms)
    assert tv.backbone.fpn.extra_blocks.p6.in_channels == 2048  # Detectron's fpn_6 on C5
    assert tv.anchor_generator.num_anchors_per_location() == [9] * 5
    ours = model_builder.create(cfg)
    # The heads hold the same parameters: 2 x 4 convs 256 -> 256, 9 x 80 class logits, 9 x 4 box deltas.
    tv_head = sum(p.numel() for p in tv.head.parameters())
    assert tv_head == sum(p.numel() for p in ours.head.parameters()) == 8 * (256 * 256 * 9 + 256) + (
        256 * 720 * 9 + 720) + (256 * 36 * 9 + 36)
    frozen = {n for n, p in tv.named_parameters() if not p.requires_grad}
    assert all(n.startswith(('backbone.body.conv1.', 'backbone.body.layer1.')) for n in frozen) and len(frozen) == 11
    assert (tv.score_thresh, tv.topk_candidates, tv.detections_per_img) == (0.05, 1000, 100)


def test_retinanet_rows_on_the_cpu_at_toy_size(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    argv = ['--cfg', os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_retinanet_R-18-FPN.yaml'),
            '--mode', 'retinanet', '--height', '64', '--width', '64', '--batch', '1', '--iters', '1', '--rounds', '2',
            '--warmup', '0', '--round-warmup', '0', '--profile', '--profile-steps', '1', 'FPN.DIM', '32',
            'RETINANET.NUM_CONVS', '1', 'RETINANET.PRE_NMS_TOP_N', '20', 'TEST.DETECTIONS_PER_IM', '30']
    report = cli.main(argv)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{')]
    assert records == report.records
    by_section = {}
    for r in records:
        by_section.setdefault(r['section'], []).append(r)
    train, test, ratios = by_section['train'], by_section['test'], by_section['ratio']
    assert [r['row'] for r in test] == ['ours, loaded', 'torchvision (equal work), loaded']
    assert all(r['loss_finite'] and len(r['rounds']) == 2 for r in train)
    # Every class score loaded: each level hands PRE_NMS_TOP_N candidates to the NMS, and both keep at most
    # DETECTIONS_PER_IM (how many survive the class-wise NMS on a 64 px image depends on the random boxes).
    assert 0 < test[0]['detections'] <= 30 and 0 < test[1]['detections'] <= 30
    speedup = ratios[0]
    assert speedup['row'].startswith(retinanet_rows.TRAIN_RATIO)
    assert speedup['rounds'] == pytest.approx([a / b for a, b in zip(train[0]['rounds'], train[1]['rounds'])])
    assert ratios[1]['rounds'] == pytest.approx(list(np.array(test[0]['rounds']) / np.array(test[1]['rounds'])))
    # --profile adds the four rows' profiles; on the CPU there is no GPU work and no host synchronisation.
    profiles = by_section['profile']
    assert [r['row'] for r in profiles] == [r['row'] for r in train + test]
    assert all(r['wall_ms_per_step'] > 0 and r['gpu_ops_per_step'] == 0 and r['host_syncs_per_step'] == 0
               for r in profiles)
