"""A second, deliberately tiny model type for the model-contract tests: it is registered (register())
by the tests alone, and trains and tests through the unchanged engines.

The 'model' learns one box (the mean ground-truth box in input pixels) and one score per class;
its detector reports that box for every class of every image. Nonsense as a detector, but every
part of the contract is exercised: its own batches (a resized image and the boxes), its own test
inputs, its own detector and the shared checkpoint/weights path.

Run as a script it joins a torchrun-style job and tests a model: see test_model_contract.py.
"""
import functools
import sys

import cv2
import numpy as np
import torch
from torch import nn

from detectron.checkpoint.c2_weights import load_weights
from detectron.datasets.roidb import combined_roidb_for_training
from detectron.modeling import model_builder
from detectron.modeling.model_type import ModelType, register_model_type, unregister_model_type
from detectron.roi_data.loader import TrainingDataset
from detectron.roi_data.minibatch import read_image

INPUT_SIZE = 32


class TinyDetector(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.box = nn.Parameter(torch.tensor([0.0, 0.0, 8.0, 8.0]))
        self.logits = nn.Parameter(torch.zeros(num_classes))
        self.brightness = nn.Conv2d(3, 1, 1)

    def forward(self, images, gt_boxes=None):
        seen = self.brightness(images).mean()
        if self.training:
            target = torch.cat(gt_boxes).mean(0)
            return {'loss_box': ((self.box - target) ** 2).mean() * 1e-2, 'loss_seen': seen ** 2 * 1e-4,
                    'box_error': (self.box - target).abs().mean()}
        return {'box': self.box + 0 * seen, 'scores': torch.sigmoid(self.logits)}


def prepare_training(entry, rng, size):
    im = read_image(entry['image'])
    scale = size / max(im.shape[:2])
    resized = cv2.resize(im, (size, size)).astype(np.float32).transpose(2, 0, 1) / 255.0
    keep = np.asarray(entry['gt_classes']) > 0
    return resized, np.asarray(entry['boxes'], np.float32)[keep] * scale


def collate(items):
    images, boxes = zip(*items)
    return torch.from_numpy(np.stack(images)), [torch.from_numpy(b) for b in boxes]


def prepare_test(im, size):
    return {'image': im, 'input': cv2.resize(im, (size, size)).astype(np.float32).transpose(2, 0, 1) / 255.0}


def detect(model, sample, num_classes):
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(torch.from_numpy(sample['input'])[None].to(device))
    scale = max(sample['image'].shape[:2]) / INPUT_SIZE
    det = np.concatenate([out['box'].cpu().numpy() * scale, [0.0]]).astype(np.float32)
    cls_boxes = [np.zeros((0, 5), np.float32)]
    for score in out['scores'].cpu().numpy()[1:]:
        det[4] = score
        cls_boxes.append(det[None].copy())
    return cls_boxes


class TinyModelType(ModelType):
    def build(self):
        return TinyDetector(self.cfg.MODEL.NUM_CLASSES)

    def output_classes(self):
        return self.cfg.MODEL.NUM_CLASSES

    def load_weights(self, model, path):
        return load_weights(model, path)

    def training_roidb(self):
        return combined_roidb_for_training(self.cfg.TRAIN.DATASETS, use_flipped=False)

    def training_dataset(self, roidb, device):
        return TrainingDataset(roidb, functools.partial(prepare_training, size=INPUT_SIZE), seed=self.cfg.RNG_SEED,
                               keys=('image', 'boxes', 'gt_classes'))

    def collate(self, device):
        return collate

    def test_inputs(self):
        return functools.partial(prepare_test, size=INPUT_SIZE)

    def detector(self):
        return functools.partial(detect, num_classes=self.cfg.MODEL.NUM_CLASSES)


def register():
    """MODEL.TYPE 'tiny' is TinyModelType, through the registry the real model types use (a test
    undoes it with unregister)."""
    register_model_type('tiny')(TinyModelType)


def unregister():
    unregister_model_type('tiny')


if __name__ == '__main__':
    # argv: a YAML config, then the weights to test; under torchrun every rank runs this.
    from detectron.core import test_engine
    from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file
    register()
    torch.set_num_threads(1)
    merge_cfg_from_file(sys.argv[1])
    assert_and_infer_cfg()
    test_engine.run_inference(model_builder.build_model_type(cfg), sys.argv[2], multi_gpu_testing=True)
