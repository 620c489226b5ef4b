"""CenterNet's test path (modeling/centernet.py detect and detect_batch) against the reference's
per-image pipeline: per scale a forward, the flip-averaged maps and the decode, then the plain
per-point / per-mask transcriptions of ctdet_post_process and merge_outputs in
tests/support/centernet_reference.py. Bit for bit, on random head maps with ties, several scales, flip,
keep_res and cat_spec_wh.
"""
import zlib

import numpy as np
import pytest
import torch

from detectron.modeling import centernet
from detectron.modeling import centernet_decode
from detectron.roi_data.centernet import COCO_MEAN, COCO_STD, CtdetParams
from detectron.utils import cuda_graphs
from detectron.utils.errors import ConfigValueError
from support.centernet_reference import (assert_same_arrays, reference_cls_boxes, reference_merge,
                                         reference_scale_detections)


class _RandomHeads(torch.nn.Module):
    """Random raw head outputs that depend only on each input image (seeded by a checksum of its
    pixels), so a batch gives every image the maps it gets alone. With ties the logits lie on a
    0.5 grid: many scores tie exactly."""

    def __init__(self, num_classes, wh_channels, ties=True):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        self.num_classes, self.wh_channels, self.ties = num_classes, wh_channels, ties

    def forward(self, images):
        outputs = {'hm': [], 'wh': [], 'reg': []}
        for image in images.cpu():
            gen = torch.Generator().manual_seed(zlib.crc32(image.numpy().tobytes()))
            shape = (image.shape[1] // 4, image.shape[2] // 4)
            logits = torch.randn(self.num_classes, *shape, generator=gen) * 3
            outputs['hm'].append(torch.round(logits * 2) / 2 if self.ties else logits)
            outputs['wh'].append(torch.rand(self.wh_channels, *shape, generator=gen) * 12)
            outputs['reg'].append(torch.rand(2, *shape, generator=gen))
        return {k: torch.stack(v).to(images.device) + self.anchor for k, v in outputs.items()}


def _model(params):
    classes = params.input.num_classes
    return _RandomHeads(classes, 2 * classes if params.input.cat_spec_wh else 2)


def _normalised(images, inputs):
    """base_detector's normalisation of uint8 (B, 3, H, W) inputs: float64, then float32."""
    mean = np.array(inputs.mean, np.float32).reshape(1, 3, 1, 1)
    std = np.array(inputs.std, np.float32).reshape(1, 3, 1, 1)
    return ((images / 255. - mean) / std).astype(np.float32)


def _reference_detect(model, sample, params):
    """CenterNet's CtdetDetector.run on one image, with the port's (unchanged) maps and decode."""
    per_scale = []
    for scale, images, meta in zip(params.scales, sample['inputs'], sample['metas']):
        with torch.no_grad():
            hm, wh, reg = centernet_decode.ctdet_test_maps(model(torch.as_tensor(_normalised(images, params.input))),
                                                           flip_test=params.flip,
                                                           reg_offset=params.input.reg_offset)
            dets = centernet_decode.ctdet_decode(hm, wh, reg=reg, cat_spec_wh=params.input.cat_spec_wh, K=params.K)
        per_scale.append(reference_scale_detections(dets.numpy(), meta, scale, params.input.num_classes))
    # ctdet.py merge_outputs: soft-NMS with several scales or --nms
    merged = reference_merge(per_scale, params.input.num_classes, params.max_per_image,
                              len(params.scales) > 1 or params.nms)
    return reference_cls_boxes(merged, params.input.num_classes)


# Input sizes are multiples of 32, so each image's heat map holds a multiple of 64 values: torch's
# CPU sigmoid, which rounds a vector loop's scalar tail differently, then treats every value of a
# batch as it does alone (and these maps are too small to be split over threads).
CASES = {
    'one scale, K = max_per_image': dict(K=100),
    'one scale, flip, cap with ties': dict(flip=True, K=40, max_per_image=10),
    'one scale, flip, --nms (soft-NMS)': dict(flip=True, nms=True, K=40, max_per_image=30),
    'scales, flip (soft-NMS)': dict(scales=(0.5, 1.0, 1.25), flip=True, K=30, max_per_image=50),
    'keep_res, cat_spec_wh': dict(keep_res=True, cat_spec_wh=True, K=50, max_per_image=20),
    'keep_res, scales, no reg offset': dict(keep_res=True, scales=(0.75, 1.0), reg_offset=False, K=20),
}


def _params(case):
    case = dict(case)
    inputs = CtdetParams(input_h=64, input_w=96, num_classes=5, cat_spec_wh=case.pop('cat_spec_wh', False),
                         reg_offset=case.pop('reg_offset', True))
    # The stub heads go through the host (images.cpu()): not capturable in a CUDA graph.
    return centernet.TestParams(input=inputs, cuda_graphs=False, **case)


def _samples(params, count, seed):
    rng = np.random.RandomState(seed)
    height, width = (50, 70) if params.keep_res else (80, 60)
    return [centernet.prepare_test_image(rng.randint(0, 256, (height, width, 3)).astype(np.uint8), params)
            for _ in range(count)]


@pytest.mark.parametrize('name', sorted(CASES))
def test_detect_and_detect_batch_match_the_reference_pipeline(name):
    params = _params(CASES[name])
    model = _model(params)
    samples = _samples(params, 3, seed=len(name))
    batch = centernet.detect_batch(model, samples, params)
    assert len(batch) == 3
    for sample, batched in zip(samples, batch):
        expected = _reference_detect(model, sample, params)
        assert len(expected) == params.input.num_classes + 1
        assert_same_arrays(centernet.detect(model, sample, params), expected)
        assert_same_arrays(batched, expected)
    if params.max_per_image < params.K * len(params.scales):
        assert sum(len(b) for b in batch[0]) >= params.max_per_image


def test_detect_batch_of_one_image_and_of_none():
    params = _params(CASES['one scale, K = max_per_image'])
    sample = _samples(params, 1, seed=0)[0]
    model = _model(params)
    assert_same_arrays(centernet.detect_batch(model, [sample], params)[0], _reference_detect(model, sample, params))
    assert centernet.detect_batch(model, [], params) == []


def test_detect_batch_refuses_images_of_different_input_sizes():
    params = _params(CASES['keep_res, cat_spec_wh'])
    small = centernet.prepare_test_image(np.zeros((50, 70, 3), np.uint8), params)
    large = centernet.prepare_test_image(np.zeros((90, 70, 3), np.uint8), params)
    with pytest.raises(ConfigValueError, match='different input sizes'):
        centernet.detect_batch(_model(params), [small, large], params)



@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_detect_batch_matches_detect_on_cuda():
    # Continuous logits (no exact ties) through torch's CUDA topk, which runs another kernel for
    # one image than for a batch of 64 (the benchmark's).
    params = _params(CASES['scales, flip (soft-NMS)'])
    model = _RandomHeads(params.input.num_classes, 2, ties=False).cuda()
    samples = _samples(params, 64, seed=5)
    batch = centernet.detect_batch(model, samples, params)
    for sample, batched in zip(samples, batch):
        assert_same_arrays(batched, centernet.detect(model, sample, params))


def test_graphed_callable_runs_cpu_tensors_directly():
    from detectron.utils.cuda_graphs import GraphedCallable
    calls = []
    graphed = GraphedCallable(lambda x: calls.append(x) or x * 2)
    assert torch.equal(graphed(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('arch, flip, batch, channels_last', [
    ('res_18', False, 1, False), ('res_18', True, 1, False), ('res_18', False, 3, False),
    ('resdcn_18', False, 1, False), ('resdcn_18', True, 3, False), ('resdcn_18', True, 3, True)])
def test_cuda_graph_replay_gives_the_eager_detections(arch, flip, batch, channels_last):
    model = _centernet(arch).cuda().eval()
    if channels_last:
        model.use_channels_last()
    rng = np.random.RandomState(0)
    samples = [centernet.prepare_test_image(rng.randint(0, 255, (120, 160, 3)).astype(np.uint8),
                                            centernet.TestParams(input=CtdetParams(input_h=128, input_w=128),
                                                                 flip=flip))
               for _ in range(batch)]
    eager = centernet.TestParams(input=CtdetParams(input_h=128, input_w=128), flip=flip, cuda_graphs=False)
    graphed = centernet.TestParams(input=CtdetParams(input_h=128, input_w=128), flip=flip, cuda_graphs=True)
    expected = centernet.detect_batch(model, samples, eager)
    for _ in range(3):  # capture, then replays
        for got, want in zip(centernet.detect_batch(model, samples, graphed), expected):
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
    captured = cuda_graphs._PER_OWNER[model][graphed]._graphs
    assert len(captured) == 1
    # replayed, not the eager fallback (DCN too: torchvision's deform_conv2d, used before, replayed
    # wrong values and was refused here)
    assert all(captured.values())


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_test_images_are_normalised_as_centernet_in_float64_then_float32(device):
    """base_detector's ((x / 255. - mean) / std).astype(float32) with float32 mean / std arrays: every
    uint8 value of each channel, bit for bit (a float32 pipeline differs in the last bit for many)."""
    values = np.arange(256, dtype=np.uint8)
    bgr = np.stack([values, values[::-1], np.roll(values, 7)], axis=-1).reshape(16, 16, 3)
    expected = ((bgr / 255. - np.float32(COCO_MEAN)) / np.float32(COCO_STD)).astype(np.float32)
    images = torch.as_tensor(bgr.transpose(2, 0, 1)[None].copy()).to(device)
    got = centernet.normalize_test_images(images, COCO_MEAN, COCO_STD).cpu()
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got[0].numpy().transpose(1, 2, 0), expected)
    in_float32 = ((bgr.astype(np.float32) / np.float32(255) - np.float32(COCO_MEAN)) / np.float32(COCO_STD))
    assert (in_float32 != expected).any()  # the test can tell the two apart


def _centernet(arch):
    from detectron.modeling.centernet_backbones import build_centernet_backbone
    from detectron.modeling.centernet_heads import CenterNetHeads
    torch.manual_seed(0)
    backbone = build_centernet_backbone(arch)
    heads = CenterNetHeads(backbone.out_channels, {'hm': 80, 'wh': 2, 'reg': 2}, 64, 'resdcn')
    return centernet.CenterNet(backbone, heads)


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
@pytest.mark.parametrize('arch', ['resdcn_18', 'res_18'])
def test_channels_last_stores_the_resnet_and_heads_nhwc_and_computes_the_same_maps(arch, device):
    """use_channels_last: the ResNet trunk and the heads NHWC, the up-sampling path NCHW (its
    deformable convs view NCHW memory); the outputs equal the NCHW model's up to the kernels'
    rounding (the CPU's NHWC kernels add in another order; on CUDA TF32 may differ likewise)."""
    model = _centernet(arch).to(device).eval()
    images = torch.randn(2, 3, 128, 96, generator=torch.Generator().manual_seed(3)).to(device)
    with torch.no_grad():
        expected = model(images)
        model.use_channels_last()
        got = model(images)
    is_nhwc = lambda p: p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)  # noqa: E731
    assert is_nhwc(model.backbone.conv1.weight) and is_nhwc(model.backbone.layer4[1].conv2.weight)
    assert is_nhwc(model.heads.hm[0].weight)
    up = [p for p in model.backbone.deconv_layers.parameters() if p.dim() == 4]
    assert up and not any(is_nhwc(p) for p in up)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-3 * expected[name].abs().max().item())


@pytest.mark.cuda
def test_the_test_engine_prepares_centernet_nhwc_on_cuda_only():
    from detectron.modeling.centernet_builder import CenterNetType
    from detectron.modeling.centernet_dla import CenterNetDLA
    model = _centernet('resdcn_18').eval()
    assert CenterNetType(None).prepare_for_inference(model) is model
    assert model.backbone.conv1.weight.is_contiguous()  # CPU: left as built
    assert CenterNetDLA().channels_last_modules() == []
    if torch.cuda.is_available():
        model = CenterNetType(None).prepare_for_inference(model.cuda())
        assert model.backbone.conv1.weight.is_contiguous(memory_format=torch.channels_last)
