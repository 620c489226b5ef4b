"""The CenterNet rows (--mode centernet with a CenterNet --cfg): training step, inference at batch 1 and B;
with --mode loops, train_net and its batches replayed."""
import contextlib
import copy

import numpy as np
import torch

from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.modeling.optimizer import build_optimizer

from . import centernet_plain
from .inputs import synthetic_images
from .loops import TrainNetPart
from .profiling import profile_row, trace_path
from .rcnn_rows import build_ours_for_training
from .timing import (
    Row,
    autocast,
    cfg_values,
    cudnn_autotuning,
    flat_tensors,
    model_tensors,
    per_round_ratios,
    run_interleaved,
)

PLAIN_PORT_ROW = 'plain port of CenterNet (equal work)'
PLAIN_PORT_RATIO = 'ours / plain port (training, images/s)'


def centernet_rows(args, model_type, device, precision):
    """Training images/s at the first --centernet-batch (train_net's Adam, ctdet targets of random boxes on
    random images, built once); inference ms/image with the whole detector (forward, flip as
    configured, decode on the device, inverse affine, merge to cls_boxes) at batch 1 (detect) and at
    the second batch (detect_batch), on a prepared 640x480 image; and at the second batch the
    network and decode alone (forward_decode of inputs already on the device). With
    --checkpoint-activations-row, the training step again with TRAIN.CHECKPOINT_ACTIVATIONS True (its
    own model, the same batch), interleaved with the plain one: images/s and peak
    memory of both. For resdcn_18 (CenterNet's default heads: REG_OFFSET on, CAT_SPEC_WH off), the
    plain port's training step (centernet_plain) interleaved with ours: our weights, the same images
    and samples with the reference's dense heatmaps, Adam, the same precision; other archs have no
    plain port row (nor do heads without their 3x3 conv, HEAD_CONV 0, nor bf16 on the CPU)."""
    from detectron.modeling import centernet, centernet_builder
    from detectron.roi_data.centernet import ctdet_train_sample
    train_batch, test_batch = (args.centernet_batch + args.centernet_batch[-1:])[:2]
    res = cfg.CENTERNET.INPUT_RES
    model = build_ours_for_training(model_type, device, precision)
    params = centernet_builder.ctdet_params(cfg)
    rng = np.random.RandomState(0)
    images = synthetic_images(train_batch, res, res, 0)
    samples = []
    for im in images:
        xy = rng.uniform(0, res * 0.7, size=(args.boxes, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(16, res * 0.3, size=(args.boxes, 2))], 1).astype(np.float32)
        samples.append(ctdet_train_sample(im, boxes, rng.randint(0, params.num_classes, args.boxes), rng, params))
    inputs, targets = centernet_builder.collate_samples(samples)
    inputs, targets = inputs.to(device), {k: v.to(device) for k, v in targets.items()}
    optimizer = centernet_adam(model, args.lr)

    train_step = training_step(model, optimizer, lambda: model(inputs, targets)['loss'], device, precision)

    test = centernet_builder.test_params(cfg)
    sample = centernet.prepare_test_image(synthetic_images(1, 480, 640, 1)[0], test)
    # The detect rows' own copy, switched to eval and prepared once as test_net's: model.eval() walks
    # every module, a cost that a per-call switch would add to each image's timing.
    test_model = model_type.prepare_for_inference(copy.deepcopy(model).eval())

    def detect_one():
        with autocast(device, precision):
            centernet.detect(test_model, sample, test)

    batch_samples = [sample] * test_batch

    def detect_many():
        with autocast(device, precision):
            centernet.detect_batch(test_model, batch_samples, test)

    # The network and the decode alone, of inputs already on the device (no upload, no host
    # post-processing): what detect_batch adds to them is the difference of the rows.
    device_inputs = torch.as_tensor(np.concatenate([sample['inputs'][0]] * test_batch)).to(device)

    def forward_decode():
        with torch.no_grad(), autocast(device, precision):
            centernet.forward_decode(test_model, device_inputs, test)

    resident = lambda: (model_tensors(model, optimizer) + model_tensors(test_model)
                        + flat_tensors([inputs, targets, device_inputs]))
    arch = cfg.CENTERNET.ARCH
    held = {'resident': resident, 'graph_owners': lambda: [model, test_model]}
    extra = []
    if plain_port_applies(device, precision):
        extra.append(plain_port_row(model, samples, inputs, targets, device, precision, args.lr))
    if args.checkpoint_activations_row:
        with cfg_values({'TRAIN.CHECKPOINT_ACTIVATIONS': True}):
            checkpointed_model = build_ours_for_training(model_type, device, precision)
        checkpointed_optimizer = centernet_adam(checkpointed_model, args.lr)
        # Held as the plain row's: its own model and optimizer, the detect rows' model and the inputs.
        extra.append(Row('train', f'{arch} train, TRAIN.CHECKPOINT_ACTIVATIONS True',
                         training_step(checkpointed_model, checkpointed_optimizer,
                                       lambda: checkpointed_model(inputs, targets)['loss'], device, precision),
                         train_batch, resident=lambda: (model_tensors(checkpointed_model, checkpointed_optimizer)
                                                        + model_tensors(test_model)
                                                        + flat_tensors([inputs, targets, device_inputs]))))
    return [Row('train', f'{arch} train', train_step, train_batch, **held), *extra,
            Row('test', f'{arch} detect (decode, post-process)', detect_one, 1, **held),
            Row('test', f'{arch} detect_batch (decode, post-process)', detect_many, test_batch,
                info={'inference_batch': test_batch}, **held),
            Row('test', f'{arch} forward + decode only, inputs on the device', forward_decode, test_batch,
                info={'inference_batch': test_batch}, **held)]


def centernet_adam(model, lr):
    """train_net's optimizer for a CenterNet config (Adam, fused on CUDA)."""
    return build_optimizer(model, base_lr=lr, weight_decay=cfg.SOLVER.WEIGHT_DECAY, name='adam')


def plain_port_applies(device, precision):
    """Whether cfg's CenterNet is the one centernet_plain ports (resdcn_18 with its own upsampling widths
    and heads of a 3x3 conv, HEAD_CONV not 0, offsets regressed and wh shared by the classes) and the plain port runs at this
    precision on this device (torchvision's deform_conv2d has no bfloat16 CPU kernel)."""
    c = cfg.CENTERNET
    runs = device.type == 'cuda' or precision == 'fp32'
    return (runs and c.ARCH == 'resdcn_18' and not c.DECONV_FILTERS and c.HEAD_CONV != 0 and c.REG_OFFSET
            and not c.CAT_SPEC_WH)


def plain_port_row(model, samples, inputs, targets, device, precision, lr):
    """The plain port's training row on the batch of ours: its model loaded with our weights, the
    targets of the same samples with the dense heatmaps CenterNet's dataset gives."""
    head_conv = model.heads.hm[0].out_channels
    plain = centernet_plain.PoseResNetDCN18(cfg.CENTERNET.NUM_CLASSES, head_conv).to(device)
    centernet_plain.load_from_ours(plain, model)
    optimizer = torch.optim.Adam(plain.parameters(), lr=lr)
    dense = centernet_plain.dense_targets(targets, samples)
    c = cfg.CENTERNET

    def loss():
        return centernet_plain.ctdet_loss(plain(inputs), dense, hm_weight=c.HM_WEIGHT, wh_weight=c.WH_WEIGHT,
                                          off_weight=c.OFF_WEIGHT)['loss']
    step = training_step(plain, optimizer, loss, device, precision)
    return Row('train', PLAIN_PORT_ROW, step, len(samples),
               resident=lambda: model_tensors(plain, optimizer) + flat_tensors([inputs, dense]))


def training_step(model, optimizer, loss, device, precision):
    """fn() running one step of optimizer on model's loss(), computed under the precision's autocast."""
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            value = loss()
        value.backward()
        optimizer.step()
    return step


def run_centernet(args, model_type, precision, report, timing, work):
    """The rows of centernet_rows interleaved; with --mode loops also train_net on --train-dataset at the
    training batch, in a subprocess first (work: a fresh directory for it), and its batches replayed
    (every row then autotunes cuDNN as train_net does, as CUDNN_BENCHMARK says)."""
    device = timing['device']
    train_net = None
    if 'loops' in args.mode:
        if args.catalog:
            dataset_catalog.register_catalog_file(args.catalog)
        train_net = TrainNetPart(args, model_type, precision, work(), args.centernet_batch[0])
    with cudnn_autotuning(cfg.CUDNN_BENCHMARK) if train_net else contextlib.nullcontext():
        rows = centernet_rows(args, model_type, device, precision)
        run_interleaved(rows + (train_net.timed_rows(device) if train_net else []), **timing)
    res = cfg.CENTERNET.INPUT_RES
    for row in rows:
        report.add_row(row, batch=row.images_per_step, precision=precision, size=[res, res])
    plain = next((row for row in rows if row.name == PLAIN_PORT_ROW), None)
    if plain is not None:
        report.add_ratio(PLAIN_PORT_RATIO, per_round_ratios(rows[0].values, plain.values))
    if train_net:
        train_net.report(report, [('train_net / {} (synthetic batch), images/s'.format(rows[0].name), rows[0])])
    if 'profile' in args.mode:
        trace = trace_path(args, 'train_centernet')
        report.add_profile(rows[0].name, profile_row(rows[0], args.profile_steps, args.warmup, device, trace),
                           batch=rows[0].images_per_step, precision=precision)
