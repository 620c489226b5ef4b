"""The CenterNet rows (--mode centernet with a CenterNet --cfg): training step, inference at batch 1 and B."""
import copy

import numpy as np
import torch

from detectron.core.config import cfg
from detectron.modeling import model_builder

from .inputs import synthetic_images
from .profiling import profile_row, trace_path
from .rcnn_rows import build_ours_for_training
from .timing import Row, autocast, cfg_values, flat_tensors, model_tensors, run_interleaved


def centernet_rows(args, device, precision):
    """Training images/s at the first --centernet-batch (Adam, ctdet targets of random boxes on
    random images, built once); inference ms/image with the whole detector (forward, flip as
    configured, decode on the device, inverse affine, merge to cls_boxes) at batch 1 (detect) and at
    the second batch (detect_batch), on a prepared 640x480 image; and at the second batch the
    network and decode alone (forward_decode of inputs already on the device). With
    --checkpoint-activations-row, the training step again with TRAIN.CHECKPOINT_ACTIVATIONS True (its
    own model, the same batch), interleaved with the plain one: images/s and peak
    memory of both."""
    from detectron.modeling import centernet, centernet_builder
    from detectron.roi_data.centernet import ctdet_train_sample
    train_batch, test_batch = (args.centernet_batch + args.centernet_batch[-1:])[:2]
    res = cfg.CENTERNET.INPUT_RES
    model = build_ours_for_training(device, precision)
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
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    train_step = training_step(model, optimizer, inputs, targets, device, precision)

    test = centernet_builder.test_params(cfg)
    sample = centernet.prepare_test_image(synthetic_images(1, 480, 640, 1)[0], test)
    # The detect rows' own copy, switched to eval and prepared once as test_net's: model.eval() walks
    # every module (about 0.3-0.7 ms on these hosts), which a per-call switch would add to each image.
    test_model = model_builder.get_model_type(cfg).prepare_for_inference(cfg, copy.deepcopy(model).eval())

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
    held = dict(resident=resident, graph_owners=lambda: [model, test_model])
    extra = []
    if args.checkpoint_activations_row:
        with cfg_values({'TRAIN.CHECKPOINT_ACTIVATIONS': True}):
            checkpointed_model = build_ours_for_training(device, precision)
        checkpointed_optimizer = torch.optim.Adam(checkpointed_model.parameters(), lr=args.lr)
        # Held as the plain row's: its own model and optimizer, the detect rows' model and the inputs.
        extra.append(Row('train', '{} train, TRAIN.CHECKPOINT_ACTIVATIONS True'.format(arch),
                         training_step(checkpointed_model, checkpointed_optimizer, inputs, targets, device, precision),
                         train_batch, resident=lambda: (model_tensors(checkpointed_model, checkpointed_optimizer)
                                                        + model_tensors(test_model)
                                                        + flat_tensors([inputs, targets, device_inputs]))))
    return [Row('train', '{} train'.format(arch), train_step, train_batch, **held), *extra,
            Row('test', '{} detect (decode, post-process)'.format(arch), detect_one, 1, **held),
            Row('test', '{} detect_batch (decode, post-process)'.format(arch), detect_many, test_batch,
                info={'inference_batch': test_batch}, **held),
            Row('test', '{} forward + decode only, inputs on the device'.format(arch), forward_decode, test_batch,
                info={'inference_batch': test_batch}, **held)]


def training_step(model, optimizer, inputs, targets, device, precision):
    """fn() running one Adam step of model on the batch."""
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = model(inputs, targets)['loss']
        loss.backward()
        optimizer.step()
    return step


def run_centernet(args, precision, report, timing):
    device = timing['device']
    rows = centernet_rows(args, device, precision)
    run_interleaved(rows, **timing)
    res = cfg.CENTERNET.INPUT_RES
    for row in rows:
        report.add_row(row, batch=row.images_per_step, precision=precision, size=[res, res])
    if 'profile' in args.mode:
        trace = trace_path(args, 'train_centernet')
        report.add_profile(rows[0].name, profile_row(rows[0], args.profile_steps, args.warmup, device, trace),
                           batch=rows[0].images_per_step, precision=precision)
