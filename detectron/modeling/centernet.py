"""CenterNet ctdet ("Objects as Points"): the model and its one-image detector, plain arguments.

`CenterNet(backbone, heads)`: in training `model(images, targets)` returns CenterNet's ctdet loss
({'loss', 'hm_loss', 'wh_loss', 'off_loss'}); in eval `model(images)` returns the heads' raw
outputs. `detect(model, sample, params)` is CenterNet's test path for one image (forward per test
scale, flip averaging, peak decoding and top-K on the model's device, inverse affine, multi-scale
merge) and returns Detectron's `cls_boxes`; `prepare_test_image` makes `sample` in a loader worker.
"""
from dataclasses import dataclass

import torch
from torch import nn

from detectron.modeling.centernet_heads import (ctdet_decode, ctdet_loss, ctdet_scale_detections,
                                                ctdet_test_maps, merge_outputs, to_cls_boxes)
from detectron.roi_data.centernet import CtdetParams, ctdet_test_inputs


@dataclass(frozen=True)
class LossWeights:
    hm: float = 1.0
    wh: float = 0.1
    off: float = 1.0
    reg_offset: bool = True
    cat_spec_wh: bool = False


class CenterNet(nn.Module):
    def __init__(self, backbone, heads, loss_weights=LossWeights()):
        super().__init__()
        self.backbone = backbone
        self.heads = heads
        self.loss_weights = loss_weights

    def forward(self, images, targets=None):
        outputs = self.heads(self.backbone(images))
        if not self.training:
            return outputs
        w = self.loss_weights
        # The focal loss takes logs of probabilities near 1e-4: always in float32, also under autocast.
        outputs = {k: v.float() for k, v in outputs.items()}
        return ctdet_loss(outputs, targets, hm_weight=w.hm, wh_weight=w.wh, off_weight=w.off,
                          reg_offset=w.reg_offset, cat_spec_wh=w.cat_spec_wh)


@dataclass(frozen=True)
class TestParams:
    """CenterNet's test options (--test_scales, --flip_test, --keep_res, --K) and its input shape."""
    input: CtdetParams = CtdetParams()
    scales: tuple = (1.0,)
    flip: bool = False
    keep_res: bool = False
    pad: int = 31
    K: int = 100
    max_per_image: int = 100


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
    device = next(model.parameters()).device
    num_classes = params.input.num_classes
    per_scale = []
    for scale, images, meta in zip(params.scales, sample['inputs'], sample['metas']):
        with torch.no_grad():
            outputs = model(torch.as_tensor(images).to(device, non_blocking=True))
            hm, wh, reg = ctdet_test_maps({k: v.float() for k, v in outputs.items()}, flip_test=params.flip,
                                          reg_offset=params.input.reg_offset)
            dets = ctdet_decode(hm, wh, reg=reg, cat_spec_wh=params.input.cat_spec_wh, K=params.K)
        per_scale.append(ctdet_scale_detections(dets.cpu().numpy(), meta, scale, num_classes))
    merged = merge_outputs(per_scale, num_classes, max_per_image=params.max_per_image,
                           use_soft_nms=len(params.scales) > 1)
    return to_cls_boxes(merged, num_classes)
