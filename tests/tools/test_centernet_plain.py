"""tools/benchmark_lib/centernet_plain.py, the plain PyTorch port of CenterNet's resdcn_18 training step
that --mode centernet times beside ours: loaded with our weights it computes our losses and
gradients on the same batch (equal work), and its row and the ratio appear in the benchmark's output."""
import json
import os
import sys

import numpy as np
import pytest
import torch

from detectron.modeling.centernet import CenterNet
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.modeling.centernet_builder import collate_samples
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.roi_data import centernet as cn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tools'))  # as when tools/benchmark.py runs

from benchmark_lib import centernet_plain, centernet_rows, cli, timing

NUM_CLASSES = 3
# Parameters whose gradients are compared: the stem, a DCN's offset/mask predictor (through the
# deformable sampling), a transposed conv and the last conv of each head.
GRADIENT_KEYS = ('conv1.weight', 'layer4.1.conv2.weight', 'deconv_layers.0.conv_offset_mask.weight',
                 'deconv_layers.9.weight', 'hm.2.weight', 'wh.2.bias', 'reg.2.weight')


def _batch():
    params = cn.CtdetParams(input_h=128, input_w=128, num_classes=NUM_CLASSES, max_objs=8)
    boxes = np.array([[10, 12, 60, 50], [70, 30, 120, 110], [20, 80, 45, 100]], np.float32)
    samples = [cn.ctdet_train_sample(np.random.RandomState(i).randint(0, 256, (128, 128, 3)).astype(np.uint8),
                                     boxes, np.array([0, 2, 1]), np.random.RandomState(10 + i), params)
               for i in range(2)]
    images, targets = collate_samples(samples)
    return images, targets, centernet_plain.dense_targets(targets, samples)


def _ours():
    torch.manual_seed(0)
    model = CenterNet(build_centernet_backbone('resdcn_18'),
                      CenterNetHeads(64, {'hm': NUM_CLASSES, 'wh': 2, 'reg': 2}, 64, 'resdcn'))
    with torch.no_grad():  # offsets of a pixel or so and uneven masks, so that the DCNs sample between pixels
        for i in (0, 6, 12):
            predictor = model.backbone.deconv_layers[i].conv_offset_mask
            predictor.weight.normal_(std=0.02)
            predictor.bias.uniform_(-1, 1)
        for head in (model.heads.wh, model.heads.reg):  # wh and reg near the targets' scale
            head[2].weight.normal_(std=0.05)
    return model.train()


def _both_steps(device, precision, dtype=torch.float32):
    """Our model and the plain port loaded with its weights on the same batch, in `dtype`: (our losses,
    the plain port's losses, {parameter: |plain grad - our grad| / |our grad|} for GRADIENT_KEYS)."""
    images, targets, dense = _batch()
    ours = _ours().to(device, dtype)
    plain = centernet_plain.PoseResNetDCN18(NUM_CLASSES).to(device, dtype)
    centernet_plain.load_from_ours(plain, ours)
    plain.train()
    assert len(plain.state_dict()) == len(ours.state_dict())
    images = images.to(device, dtype)
    targets, dense = ({k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in t.items()}
                      for t in (targets, dense))
    with timing.autocast(device, precision):
        ours_losses = ours(images, targets)
        plain_losses = centernet_plain.ctdet_loss(plain(images), dense)
    ours_losses['loss'].backward()
    plain_losses['loss'].backward()
    ours_params = dict(ours.named_parameters())
    plain_params = dict(plain.named_parameters())
    errors = {}
    for key in GRADIENT_KEYS:
        ours_grad = ours_params[centernet_plain.centernet_key_to_ours(key)].grad
        assert ours_grad.abs().max() > 0, key
        errors[key] = ((plain_params[key].grad - ours_grad).norm() / ours_grad.norm()).item()
    return ours_losses, plain_losses, errors


def test_loaded_with_our_weights_the_plain_port_computes_our_losses_and_gradients():
    # In float64: in float32 the deep backward's sums, taken in other orders by the CPU's kernels, leave
    # 1e-4 to 5e-3 of the gradient's norm depending on the CPU; in float64 they agree to ~1e-14, while
    # a wrong layer or offset layout leaves O(1).
    ours_losses, plain_losses, errors = _both_steps(torch.device('cpu'), 'fp32', torch.float64)
    for key in ('loss', 'hm_loss', 'wh_loss', 'off_loss'):
        assert plain_losses[key].item() == pytest.approx(ours_losses[key].item(), rel=1e-12), key
        assert ours_losses[key].item() > 0.01, key  # each term really computed
    # The total is CtdetLoss's weighting of the terms, computed here by hand.
    by_hand = plain_losses['hm_loss'] + 0.1 * plain_losses['wh_loss'] + plain_losses['off_loss']
    assert plain_losses['loss'].item() == pytest.approx(by_hand.item(), rel=1e-12)
    assert max(errors.values()) < 1e-10, errors


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_on_cuda_in_bf16_the_plain_port_computes_our_losses():
    """The benchmark's setting: bf16 autocast, our grid_sample DCN against torchvision's deform_conv2d
    (float32 inside), cuDNN's kernels: the losses equal up to bf16 rounding (bf16 against float32 on
    the CPU: 0.6%); the deep gradients of a randomly initialised model differ by their own size in
    bf16, so only their presence is checked."""
    ours_losses, plain_losses, errors = _both_steps(torch.device('cuda'), 'bf16')
    for key in ('loss', 'hm_loss', 'wh_loss', 'off_loss'):
        assert plain_losses[key].item() == pytest.approx(ours_losses[key].item(), rel=2e-2), key
    assert all(np.isfinite(e) for e in errors.values()), errors


def test_focal_loss_without_positives_is_the_negative_term_alone():
    pred = torch.tensor([0.2, 0.5])
    gt = torch.tensor([0.0, 0.5])
    expected = -(np.log(0.8) * 0.04 + np.log(0.5) * 0.25 * 0.5 ** 4)
    assert centernet_plain.focal_loss(pred, gt).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize('values,applies', [
    ({}, True), ({'CENTERNET.HEAD_CONV': 64}, True), ({'CENTERNET.ARCH': 'resdcn_34'}, False),
    ({'CENTERNET.ARCH': 'dla_34'}, False), ({'CENTERNET.HEAD_CONV': 0}, False),
    ({'CENTERNET.REG_OFFSET': False}, False), ({'CENTERNET.CAT_SPEC_WH': True}, False),
    ({'CENTERNET.DECONV_FILTERS': (256, 128, 64)}, False)])
def test_only_resdcn_18_with_the_reference_heads_gets_the_plain_port_row(values, applies):
    with timing.cfg_values(dict({'CENTERNET.ARCH': 'resdcn_18', 'CENTERNET.HEAD_CONV': -1, 'CENTERNET.DECONV_FILTERS': (),
                                 'CENTERNET.REG_OFFSET': True, 'CENTERNET.CAT_SPEC_WH': False}, **values)):
        assert centernet_rows.plain_port_applies(torch.device('cuda'), 'bf16') is applies
        assert centernet_rows.plain_port_applies(torch.device('cpu'), 'fp32') is applies
        # torchvision's deform_conv2d has no bfloat16 CPU kernel.
        assert centernet_rows.plain_port_applies(torch.device('cpu'), 'bf16') is False


def test_centernet_mode_times_the_plain_port_beside_ours_and_gives_the_ratio(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)  # the CPU section, on a GPU machine too
    argv = ['--cfg', 'configs/centernet/ctdet_coco_resdcn18.yaml', '--mode', 'centernet',
            '--centernet-batch', '2', '1', '--boxes', '3', '--iters', '1', '--rounds', '1', '--warmup', '0',
            '--round-warmup', '0', 'CENTERNET.INPUT_RES', '64', 'CENTERNET.NUM_CLASSES', '3', 'TRAIN.WEIGHTS', '']
    report = cli.main(argv)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{')]
    assert records == report.records
    train = {r['row']: r for r in records if r['section'] == 'train'}
    assert list(train) == ['resdcn_18 train', centernet_rows.PLAIN_PORT_ROW]
    ours, plain = train['resdcn_18 train'], train[centernet_rows.PLAIN_PORT_ROW]
    assert plain['batch'] == ours['batch'] == 2 and plain['precision'] == 'fp32'
    ratios = [r for r in records if r['section'] == 'ratio']
    assert [r['row'] for r in ratios] == [centernet_rows.PLAIN_PORT_RATIO]
    assert ratios[0]['rounds'] == pytest.approx([a / b for a, b in zip(ours['rounds'], plain['rounds'])])
