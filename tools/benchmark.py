#!/usr/bin/env python3
"""Speed of our Faster R-CNN against torchvision's fasterrcnn_resnet50_fpn, side by side in one run.

Both models get the same synthetic batch (same image size, images per step, boxes per image and
precision), on the same device, with no data loading in the timed loop:
  train: images/s of full training steps (forward, loss, backward, SGD step);
  test:  seconds per image from a decoded image in host memory to final detections (upload,
         resize/normalise, forward, box decoding, NMS, top-100), batch 1.
Our model is built from --cfg (default: KL-Loss's R-50-FPN 2x config). Example:
    python tools/benchmark.py --precision bf16 --mode train test --iters 20
Prints one JSON line per measurement and a Markdown table with the ratios.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch
import torchvision

from detectron.core import test as test_lib
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer

PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', default='configs/e2e_faster_rcnn_R-50-FPN_2x.yaml')
    parser.add_argument('--mode', nargs='+', default=['train', 'test'], choices=['train', 'test'])
    parser.add_argument('--precision', default='bf16', choices=sorted(PRECISIONS))
    parser.add_argument('--height', type=int, default=800)
    parser.add_argument('--width', type=int, default=1333)
    parser.add_argument('--batch', type=int, default=2, help='images per training step')
    parser.add_argument('--boxes', type=int, default=8, help='ground-truth boxes per image')
    parser.add_argument('--iters', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument('opts', nargs=argparse.REMAINDER, help='config overrides KEY VALUE ...')
    return parser.parse_args(argv)


def synthetic_batch(args, num_classes, seed=0):
    """Random images (uint8 BGR) and boxes (xyxy, original pixels) with labels 1..num_classes-1."""
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, size=(args.batch, args.height, args.width, 3)).astype(np.uint8)
    xy = rng.uniform(0, [args.width * 0.7, args.height * 0.7], size=(args.batch, args.boxes, 2))
    wh = rng.uniform(32, 300, size=(args.batch, args.boxes, 2))
    boxes = np.concatenate([xy, np.minimum(xy + wh, [args.width - 1, args.height - 1])], axis=2)
    labels = rng.randint(1, num_classes, size=(args.batch, args.boxes))
    return images, boxes.astype(np.float32), labels


def ours_train_inputs(images, boxes, labels, device):
    means = np.array(cfg.PIXEL_MEANS, np.float32).reshape(1, 1, 1, 3)
    stride = cfg.FPN.COARSEST_STRIDE
    b, h, w, _ = images.shape
    ph, pw = -(-h // stride) * stride, -(-w // stride) * stride
    blob = np.zeros((b, ph, pw, 3), np.float32)
    blob[:, :h, :w] = images.astype(np.float32) - means
    blob = torch.from_numpy(blob).permute(0, 3, 1, 2).contiguous().to(device)
    im_info = torch.tensor([[h, w, 1.0]] * b, device=device)
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'classes': torch.from_numpy(lb).long().to(device),
                'is_crowd': torch.zeros(len(lb), dtype=torch.bool, device=device)}
               for bx, lb in zip(boxes, labels)]
    return blob, im_info, targets


def torchvision_model(num_classes, args):
    return torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=num_classes,
        min_size=args.height, max_size=max(args.width, args.height))


def torchvision_train_inputs(images, boxes, labels, device):
    ims = [torch.from_numpy(im[:, :, ::-1].copy()).permute(2, 0, 1).float().div(255).to(device) for im in images]
    targets = [{'boxes': torch.from_numpy(bx).to(device), 'labels': torch.from_numpy(lb).long().to(device)}
               for bx, lb in zip(boxes, labels)]
    return ims, targets


def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_loop(step, args, device):
    for _ in range(args.warmup):
        step()
    _sync(device)
    tic = time.perf_counter()
    for _ in range(args.iters):
        step()
    _sync(device)
    return (time.perf_counter() - tic) / args.iters


def bench_train(args, device, dtype, num_classes):
    images, boxes, labels = synthetic_batch(args, num_classes)
    autocast = dict(device_type=device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    ours = model_builder.create(cfg).to(device).train()
    opt = build_optimizer(ours, base_lr=0.001, momentum=0.9, weight_decay=1e-4)
    inputs = ours_train_inputs(images, boxes, labels, device)

    def ours_step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            losses = ours(*inputs)
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
        opt.step()

    tv = torchvision_model(num_classes, args).to(device).train()
    tv_opt = torch.optim.SGD([p for p in tv.parameters() if p.requires_grad], lr=0.001, momentum=0.9)
    tv_inputs = torchvision_train_inputs(images, boxes, labels, device)

    def tv_step():
        tv_opt.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            losses = tv(*tv_inputs)
        sum(losses.values()).backward()
        tv_opt.step()

    return {'ours': args.batch / time_loop(ours_step, args, device),
            'torchvision': args.batch / time_loop(tv_step, args, device)}


def bench_test(args, device, dtype, num_classes):
    images, _, _ = synthetic_batch(args, num_classes)
    im = images[0]
    autocast = dict(device_type=device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
    ours = model_builder.create(cfg).to(device).eval()
    tv = torchvision_model(num_classes, args).to(device).eval()

    def ours_step():
        with torch.autocast(**autocast):
            test_lib.im_detect_all(ours, im)

    def tv_step():
        with torch.no_grad(), torch.autocast(**autocast):
            x = torch.from_numpy(im[:, :, ::-1].copy()).to(device).permute(2, 0, 1).float().div(255)
            out = tv([x])[0]
            out['boxes'].cpu()

    return {'ours': time_loop(ours_step, args, device), 'torchvision': time_loop(tv_step, args, device)}


def main(argv):
    args = parse_args(argv)
    merge_cfg_from_file(args.cfg)
    merge_cfg_from_list(args.opts)
    assert_and_infer_cfg()
    torch.manual_seed(0)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True
    dtype = PRECISIONS[args.precision]
    num_classes = cfg.MODEL.NUM_CLASSES
    gpu = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'
    rows = []
    for mode in args.mode:
        result = (bench_train if mode == 'train' else bench_test)(args, device, dtype, num_classes)
        unit = 'images/s' if mode == 'train' else 's/image'
        ratio = result['ours'] / result['torchvision'] if mode == 'train' else result['torchvision'] / result['ours']
        record = dict(mode=mode, unit=unit, precision=args.precision, size=[args.height, args.width],
                      batch=args.batch if mode == 'train' else 1, device=gpu, torch=torch.__version__,
                      torchvision=torchvision.__version__, ours=round(result['ours'], 4),
                      torchvision_value=round(result['torchvision'], 4), speedup_vs_torchvision=round(ratio, 3))
        print(json.dumps(record), flush=True)
        rows.append(record)
    print('\n| mode | precision | size | batch | ours | torchvision | unit | ours vs torchvision |')
    print('|---|---|---|---|---|---|---|---|')
    for r in rows:
        print('| {mode} | {precision} | {size[0]}x{size[1]} | {batch} | {ours} | {torchvision_value} | {unit} '
              '| {speedup_vs_torchvision}x |'.format(**r))


if __name__ == '__main__':
    main(sys.argv[1:])
