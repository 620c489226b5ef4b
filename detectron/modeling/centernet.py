"""CenterNet ctdet ("Objects as Points"): the model and its one-image detector, plain arguments.

`CenterNet(backbone, heads)`: in training `model(images, targets)` returns CenterNet's ctdet loss
({'loss', 'hm_loss', 'wh_loss', 'off_loss'}); in eval `model(images)` returns the heads' raw
outputs. `detect(model, sample, params)` is CenterNet's test path for one image (forward per test
scale, flip averaging, peak decoding and top-K on the model's device, inverse affine, multi-scale
merge) and returns Detectron's `cls_boxes`; `detect_batch(model, samples, params)` does the same
for several images with one forward and one decode per scale, `detect_runs` for any list of them
(test_net's TEST.IMS_PER_BATCH); `prepare_test_image` makes `sample` in a loader worker.
"""
import functools
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from detectron.modeling.centernet_decode import ctdet_decode, ctdet_test_maps, image_detections, merge_image_detections
from detectron.modeling.centernet_losses import ctdet_loss
from detectron.ops import jitter_normalize
from detectron.roi_data.centernet import CONTRAST, SATURATION, UNIT_VALUES, CtdetParams, ctdet_test_inputs
from detectron.utils.cuda_graphs import graphed_method, graphed_training_method
from detectron.utils.errors import ConfigValueError


@dataclass(frozen=True)
class LossWeights:
    hm: float = 1.0
    wh: float = 0.1
    off: float = 1.0
    reg_offset: bool = True
    cat_spec_wh: bool = False


class CenterNet(nn.Module):
    """train_max_graphs: on a GPU, training replays backbone_and_heads' forward and backward from CUDA
    graphs for that many batch shapes (TRAIN.CUDA_GRAPHS_MAX_SHAPES; 0: never). A CenterNet batch has
    one shape for the whole run, and its step launches about 800 kernels one by one otherwise, on a
    host whose cores the loader's workers share (train_net ran at 0.81x its batches replayed in the
    bare step: BENCHMARKS.md, "CenterNet speed")."""

    def __init__(self, backbone, heads, loss_weights=LossWeights(), train_max_graphs=0):
        super().__init__()
        self.backbone = backbone
        self.heads = heads
        self.loss_weights = loss_weights
        self.train_max_graphs = train_max_graphs

    def use_channels_last(self):
        """Store the backbone's layers that allow it and the heads channels_last. cuDNN runs
        bfloat16 convolutions in NHWC and converts NCHW tensors around each one, a sizeable part
        of forward + decode; stored NHWC they need no conversion, and each image's heat map is the
        same bit for bit (BENCHMARKS.md, "CenterNet speed"; bfloat16 only). On the CPU the kernels
        round differently in NHWC, so the model type applies it on CUDA only. A backbone without
        such layers (DLA) leaves the heads as they are too."""
        trunk = self.backbone.channels_last_modules()
        for module in trunk + ([self.heads] if trunk else []):
            module.to(memory_format=torch.channels_last)

    def forward(self, images, targets=None):
        net = self.backbone_and_heads
        if targets is not None and self.training and self.train_max_graphs:
            net = graphed_training_method(self, 'backbone_and_heads', CenterNet.backbone_and_heads,
                                          max_graphs=self.train_max_graphs)
        outputs = dict(zip(self.heads.heads, net(images)))
        if targets is None:  # detection; with targets the losses, also in eval mode (validation)
            return outputs
        w = self.loss_weights
        # The losses are computed in float32, also under autocast: the focal loss takes logs of
        # probabilities near 1e-4 (heatmap_focal_loss reads the logits in their dtype).
        outputs = {k: v if k == 'hm' else v.float() for k, v in outputs.items()}
        targets = with_dense_heatmap(targets, outputs['hm'])
        losses = ctdet_loss(outputs, targets, hm_weight=w.hm, wh_weight=w.wh, off_weight=w.off,
                            reg_offset=w.reg_offset, cat_spec_wh=w.cat_spec_wh)
        # A head that no loss term reads (WH_WEIGHT or OFF_WEIGHT 0, as ctdet_loss skips them) joins
        # the objective with weight 0: DDP expects a gradient for every parameter at every step
        # (the reference's DataParallel did not), and the loss keeps its value.
        unread = [outputs[k] for k, weight in (('wh', w.wh), ('reg', w.off)) if k in outputs and weight <= 0]
        if unread:
            losses['loss'] = losses['loss'] + sum(0 * v.sum() for v in unread)
        return losses

    def backbone_and_heads(self, images):
        """The heads' outputs, in the order of self.heads.heads, as one tuple."""
        return tuple(self.heads(self.backbone(images)).values())


def sparse_heatmap_targets(heatmaps, nonzeros):
    """Equal-shape float32 heatmaps (numpy) and the flat positions of their nonzero entries (each
    np.flatnonzero of its heatmap, as the samples give them) -> {'hm_index': int32 or int64 positions
    of those entries in the stacked (B, ...) batch, flattened; 'hm_value': the entries}: exact, and
    a few hundred KB where the dense batch takes MBs per image."""
    size = heatmaps[0].size
    index_dtype = heatmap_index_dtype(size * len(heatmaps))
    indices = [(nonzero + i * size).astype(index_dtype) for i, nonzero in enumerate(nonzeros)]
    values = [hm.reshape(-1)[nonzero] for hm, nonzero in zip(heatmaps, nonzeros)]
    return {'hm_index': torch.from_numpy(np.concatenate(indices)), 'hm_value': torch.from_numpy(np.concatenate(values))}


def heatmap_index_dtype(num_elements):
    """int32 positions (half the bytes) while a batch's heatmap elements fit, else int64."""
    return np.int32 if num_elements - 1 <= np.iinfo(np.int32).max else np.int64


def with_dense_heatmap(targets, like):
    """targets with 'hm' scattered from 'hm_index' / 'hm_value' (sparse_heatmap_targets) into a
    tensor of like's shape, device and memory order (the focal loss reads both in one order);
    targets that carry a dense 'hm' are returned as they are."""
    if 'hm' in targets:
        return targets
    targets = dict(targets)
    values = targets.pop('hm_value')
    hm = torch.zeros_like(like, dtype=values.dtype)
    hm[_unravel(targets.pop('hm_index').long(), like.shape)] = values
    targets['hm'] = hm
    return targets


def _unravel(index, shape):
    """The coordinates of flat row-major positions `index` in `shape`, one tensor per dimension, with
    scalar arithmetic: torch.unravel_index copies two host lists to the device (a sync each)."""
    coordinates = []
    for size in reversed(shape[1:]):
        coordinates.append(index % size)
        index = index // size
    return (index, *reversed(coordinates))


@dataclass(frozen=True)
class TestParams:
    """CenterNet's test options (--test_scales, --flip_test, --keep_res, --K) and its input shape."""
    input: CtdetParams = CtdetParams()
    scales: tuple = (1.0,)
    flip: bool = False
    keep_res: bool = False
    nms: bool = False  # --nms: soft-NMS in the merge also at one scale (always with several)
    pad: int = 31
    K: int = 100
    max_per_image: int = 100
    cuda_graphs: bool = True  # replay forward + decode from CUDA graphs (fixed input sizes)


def prepare_test_image(im, params):
    """The network inputs of one BGR image at every test scale (CenterNet's pre_process)."""
    inputs, metas = [], []
    for scale in params.scales:
        images, meta = ctdet_test_inputs(im, scale, params.input, keep_res=params.keep_res, flip=params.flip,
                                         pad=params.pad)
        inputs.append(images)
        metas.append(meta)
    return {'image': im, 'inputs': inputs, 'metas': metas}


def detect(model, sample, params):
    """cls_boxes of one prepared image (see prepare_test_image)."""
    return detect_batch(model, [sample], params)[0]


def detect_batch(model, samples, params):
    """cls_boxes of each prepared image (prepare_test_image): per test scale one forward of all
    the images and one decode, queued on the device one after the other, then one copy of every
    scale's (B, K, 6) detections to the host. The images must share their input size at each
    scale (always so without keep_res).

    Given the same head outputs, each image gets detect's cls_boxes bit for bit (a batched forward
    itself may round differently, as any batched convolution), with two caveats from torch's
    kernels: on the CPU, sigmoid rounds the scalar tail of its vector loop differently, and a batch
    moves that tail when an image's heat map is not a multiple of 32 values or the maps are split
    over threads; on CUDA, topk over the C*K candidates runs another kernel for B = 1 than for
    B >= 64 (whether both order exactly equal scores alike is not checked).
    """
    if not samples:
        return []
    device = next(model.parameters()).device
    # Each scale's detections go straight to (pinned) host memory, queued before the next scale's
    # replay rewrites the graph's output buffer; one wait for all of them.
    dets = torch.empty((len(params.scales), len(samples), params.K, 6), dtype=torch.float32,
                       pin_memory=device.type == 'cuda')
    with torch.no_grad():
        for i in range(len(params.scales)):
            images = _inputs_on_device([sample['inputs'][i] for sample in samples], device)
            dets[i].copy_(forward_decode(model, images, params), non_blocking=True)
    if device.type == 'cuda':
        torch.cuda.current_stream(device).synchronize()
    dets = dets.numpy()
    return [merge_image_detections([image_detections(dets[i, b], sample['metas'][i], scale)
                                    for i, scale in enumerate(params.scales)],
                                   params.input.num_classes, max_per_image=params.max_per_image,
                                   use_soft_nms=len(params.scales) > 1 or params.nms)
            for b, sample in enumerate(samples)]


def detect_runs(model, samples, params):
    """cls_boxes of each prepared image, in order: detect_batch over each run of consecutive images
    that share their input sizes (all of them, unless keep_res)."""
    detections = []
    for _, run in itertools.groupby(samples, key=lambda sample: [x.shape for x in sample['inputs']]):
        detections += detect_batch(model, list(run), params)
    return detections


def normalize_test_images(images, mean, std):
    """CenterNet's test-time normalisation of uint8 images (B, 3, H, W) on their device, bit for bit
    BaseDetector.pre_process's numpy arithmetic: float64 (x / 255 - mean) / std with mean and std as
    float32 values, then float32. A uint8 channel has 256 values, so the reference's own numpy
    formula is evaluated once per (channel, value) into a table and the images index it: one
    gather instead of ten float64 passes over every pixel, which took a visible share of the GPU
    time of forward and decode (BENCHMARKS.md, "CenterNet speed")."""
    table, channel_offsets = _normalisation_table(tuple(map(float, mean)), tuple(map(float, std)), images.device)
    return table[images.to(torch.int32) + channel_offsets]


@functools.lru_cache(maxsize=None)
def _normalisation_table(mean, std, device):
    """(float32 (3 * 256,), int32 (1, 3, 1, 1) [0, 256, 512]) on device: entry 256 c + v of the table
    is CenterNet's normalised value of uint8 v in channel c. Made on a device's first (eager) call,
    so a CUDA graph capture never copies them."""
    values = np.arange(256, dtype=np.uint8).reshape(1, 256).repeat(3, axis=0)
    table = ((values / 255. - np.float32(mean).reshape(3, 1)) / np.float32(std).reshape(3, 1)).astype(np.float32)
    channel_offsets = torch.arange(0, 3 * 256, 256, dtype=torch.int32).view(1, 3, 1, 1)
    return torch.from_numpy(table.reshape(-1)).to(device), channel_offsets.to(device)


def normalize_training_images(images, jitter, mean, std):
    """CenterNet's training input of warped uint8 BGR images (B, H, W, 3) on their device, each with
    its colour jitter (roi_data.centernet.jitter_arrays, stacked: 'jitter_order' (B, 3) int64,
    'jitter_alphas' and 'jitter_lighting' (B, 3) float64): x / 255 in float32; the grey image and its
    mean; brightness x a, contrast x a + mean (1 - a), saturation x a + grey (1 - a) in each image's
    order; the lighting added in float64; (x - mean) / std. Float32 (B, 3, H, W), contiguous.

    The same float32 steps as the loader workers' normalised_input (CenterNet's numpy), so equal to it
    to float rounding: the grey image's mean is summed in another order (with the contrast's alpha 1,
    bit for bit). On CUDA by ops.jitter_normalize's kernels, elsewhere by PyTorch ops."""
    if jitter_normalize.available(images):
        _, mean, std = _training_constants(tuple(map(float, mean)), tuple(map(float, std)), images.device)
        return jitter_normalize.jitter_normalize(images, jitter['jitter_order'], jitter['jitter_alphas'],
                                                 jitter['jitter_lighting'], mean.view(3), std.view(3),
                                                 contrast=CONTRAST, saturation=SATURATION)
    return jitter_normalize_by_torch_ops(images, jitter, mean, std)


def jitter_normalize_by_torch_ops(images, jitter, mean, std):
    """normalize_training_images as PyTorch ops, on any device."""
    count = images.shape[0]
    unit_values, mean, std = _training_constants(tuple(map(float, mean)), tuple(map(float, std)), images.device)
    x = unit_values[images.permute(0, 3, 1, 2).long()]
    grey = _cv2_grey(x)
    grey_mean = grey.mean(dim=(1, 2, 3), keepdim=True)
    alphas = jitter['jitter_alphas'].float().view(count, 3, 1, 1, 1)
    others = (1 - jitter['jitter_alphas']).float().view(count, 3, 1, 1, 1)   # 1 - alpha in float64, as numpy
    order = jitter['jitter_order'].view(count, 3, 1, 1, 1)
    zero = grey.new_zeros(())
    for step in range(3):
        op = order[:, step]
        other = torch.where(op == SATURATION, grey, torch.where(op == CONTRAST, grey_mean, zero))
        x = x * alphas[:, step] + other * others[:, step]   # brightness: + 0 * (1 - a), which adds nothing
    x = (x.double() + jitter['jitter_lighting'].view(count, 3, 1, 1)).float()
    return ((x - mean) / std).contiguous()


@functools.lru_cache(maxsize=None)
def _training_constants(mean, std, device):
    """On device, made once: the workers' float32 v / 255 of every uint8 v (a table, as CUDA divides a
    tensor by a number through its reciprocal, which rounds differently), and mean and std (1, 3, 1, 1).
    Kept, since a tensor made from host values on each call would wait for the upload stream."""
    return (torch.from_numpy(UNIT_VALUES).to(device), torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1).to(device),
            torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1).to(device))


def _cv2_grey(x):
    """cv2.cvtColor(BGR2GRAY) of float32 (B, 3, H, W) BGR as cv2 computes it: green x 0.587 in float32,
    then blue and red each added by a fused multiply-add (here its float32 operands' exact product
    and the sum in float64, rounded to float32). (B, 1, H, W) float32."""
    grey = x[:, 1:2] * jitter_normalize.GREY_WEIGHTS[1]
    for channel in (0, 2):
        grey = (x[:, channel:channel + 1].double() * jitter_normalize.GREY_WEIGHTS[channel] + grey.double()).float()
    return grey


def forward_decode(model, images, params):
    """(B, K, 6) decoded detections (ctdet_decode, output-grid pixels) of uint8 network inputs
    (B, 3, H, W) on the model's device, left there: the network and the decode of detect_batch,
    replayed from CUDA graphs with params.cuda_graphs on a GPU. Call it under torch.no_grad(); on a
    GPU the result is a graph's output buffer, which the next call rewrites."""
    if params.cuda_graphs and images.device.type == 'cuda':
        return _graphed_forward_decode(model, params)(images)
    return _forward_decode(model, params, images)


def _forward_decode(model, params, images):
    """(B, K, 6) decoded detections of a batch of uint8 network inputs, on the model's device."""
    hm, wh, reg = test_maps(model, params, images)
    return ctdet_decode(hm, wh, reg=reg, cat_spec_wh=params.input.cat_spec_wh, K=params.K)


def test_maps(model, params, images):
    """(hm, wh, reg) that ctdet_decode reads (ctdet_test_maps, float32) of uint8 network inputs."""
    outputs = model(normalize_test_images(images, params.input.mean, params.input.std))
    return ctdet_test_maps({k: v.float() for k, v in outputs.items()}, flip_test=params.flip,
                           reg_offset=params.input.reg_offset)


def _graphed_forward_decode(model, params):
    return graphed_method(model, params, lambda owner, images: _forward_decode(owner, params, images))


def _inputs_on_device(inputs, device):
    """One device tensor of the images' inputs at one scale. Each image is copied into its slice
    of the batch: stacking them on the host first would write every byte once more there."""
    shapes = {tuple(x.shape[1:]) for x in inputs}
    if len(shapes) > 1:
        raise ConfigValueError('detect_batch got images of different input sizes {}; batch only images of one '
                               'size (keep_res gives each image size its own input), or call detect on each'
                               .format(sorted(shapes)))
    if len(inputs) == 1:
        return torch.as_tensor(inputs[0]).to(device)
    inputs = [torch.as_tensor(x) for x in inputs]
    batch = torch.empty((sum(len(x) for x in inputs),) + inputs[0].shape[1:], dtype=inputs[0].dtype, device=device)
    start = 0
    for x in inputs:
        batch[start:start + len(x)].copy_(x)
        start += len(x)
    return batch
