"""The R-CNN rows: training steps and inference of ours and of torchvision at equal work."""
import copy
import os

import torch

from detectron.core import test as test_lib
from detectron.core.config import cfg
from detectron.datasets.test_results import boxes_and_segms
from detectron.modeling import model_builder
from detectron.modeling.optimizer import build_optimizer

from .classifiers import TEST_NUM_CLASSES, calibrate_realistic, ours_box_layers, set_loaded_classifier
from .inputs import ours_train_inputs, synthetic_batch, synthetic_images, torchvision_train_inputs
from .timing import Row, autocast, capture, cfg_values, flat_tensors, in_turn, model_tensors, timed_pass
from .torchvision_models import (
    torchvision_all_stages_bn,
    torchvision_box_layers,
    torchvision_detect,
    torchvision_equal_work,
    torchvision_settings,
    trainable_parameters,
)


def build_ours(model_type, device, num_classes=None):
    torch.manual_seed(0)
    with cfg_values({'MODEL.NUM_CLASSES': num_classes or cfg.MODEL.NUM_CLASSES}):
        return model_builder.checked_model(model_type).to(device)


def build_ours_for_training(model_type, device, precision):
    """build_ours prepared as train_net prepares it (model_type's prepare_for_training, with
    SOLVER.AMP.ENABLED as the precision says)."""
    with cfg_values({'SOLVER.AMP.ENABLED': precision != 'fp32'}):
        return model_type.prepare_for_training(build_ours(model_type, device))


def train_row(name, model, batches, box_head, batch, device, precision, lr, prime=False, optimizer_name='sgd'):
    """Steps of zero_grad, forward under autocast, sum of the losses, backward, optimizer step, on
    the input tuples of `batches` in turn (prime: one untimed pass over all of them first, as a
    training run meets each batch shape before its timed window). The optimizer is our train_net's
    SOLVER.OPTIMIZER `optimizer_name`: by default Detectron's momentum SGD with its parameter groups, which
    the torchvision rows get too. box_head (None: not counted): the module whose inputs' first
    dimension is the RoIs per step."""
    model.train()
    optimizer = build_optimizer(model, base_lr=lr, momentum=cfg.SOLVER.MOMENTUM, weight_decay=cfg.SOLVER.WEIGHT_DECAY,
                                name=optimizer_name)
    last = {}

    def step_on(inputs):
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            losses = model(*inputs)
        total = sum(v for k, v in losses.items() if k.startswith('loss'))
        total.backward()
        optimizer.step()
        last['loss'] = total.detach()

    if prime:
        timed_pass(step_on, batches, device)
    step = in_turn(step_on, batches)
    info = {'trainable_params': trainable_parameters(model)}
    if box_head is not None:
        info['box_rois_per_image'] = capture(box_head, step, lambda box_inputs: box_inputs[0].shape[0], pre=True) / batch
    return Row('train', name, step, batch,
               resident=lambda: model_tensors(model, optimizer) + flat_tensors(batches),
               graph_owners=lambda: [model], info=info,
               after=lambda: {'loss_finite': bool(torch.isfinite(last['loss']))})


def ours_train_row(args, model_type, batch, height, width, boxes, device, precision):
    images, gt_boxes, labels = synthetic_batch(batch, height, width, boxes, cfg.MODEL.NUM_CLASSES)
    ours = build_ours_for_training(model_type, device, precision)
    name = 'ours ({}, FREEZE_AT {})'.format(os.path.basename(args.cfg), cfg.TRAIN.FREEZE_AT)
    return train_row(name, ours, [ours_train_inputs(images, gt_boxes, labels, device)], ours.box_head,
                     batch, device, precision, args.lr)


def build_train_rows(args, model_type, batch, device, precision):
    """ours, torchvision at equal work, torchvision with BatchNorm everywhere (unequal)."""
    num_classes = cfg.MODEL.NUM_CLASSES
    images, gt_boxes, labels = synthetic_batch(batch, args.height, args.width, args.boxes, num_classes)
    tv_inputs = torchvision_train_inputs(images, gt_boxes, labels, device)
    settings = torchvision_settings(args.height, args.width)
    rows = [ours_train_row(args, model_type, batch, args.height, args.width, args.boxes, device, precision)]
    for name, build in (('torchvision, FrozenBN, 3 trainable layers (equal work)', torchvision_equal_work),
                        ('torchvision, BatchNorm in all stages (UNEQUAL: more work)', torchvision_all_stages_bn)):
        model = build(num_classes, **settings).to(device)
        rows.append(train_row(name, model, [tv_inputs], model.roi_heads.box_head, batch, device, precision, args.lr))
    return rows


def train_ratios(rows):
    ours, equal, unequal = rows
    return [('ours / torchvision equal work (speed-up)', ours, equal),
            ('ours / torchvision all-stages BN (UNEQUAL comparison)', ours, unequal)]


def ours_detect(model_type, model, image, device, precision):
    with autocast(device, precision):
        return test_lib.im_detect_all(model_type, model, image)


def ours_test_facts(model_type, model, image, device, precision):
    with autocast(device, precision):
        scores = test_lib.im_detect_bbox(model_type, model, image, cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)[0]
    detections = sum(len(b) for b in boxes_and_segms(ours_detect(model_type, model, image, device, precision))[0][1:])
    return {'rois': int(scores.shape[0]), 'candidates': int((scores[:, 1:] > cfg.TEST.SCORE_THRESH).sum()),
            'detections': int(detections)}


def torchvision_test_facts(model, image, device, precision):
    out = {}
    logits = capture(model.roi_heads.box_predictor,
                     lambda: out.update(torchvision_detect(model, image, device, precision)), lambda o: o[0])
    probs = torch.softmax(logits.float(), dim=1)
    return {'rois': int(probs.shape[0]),
            'candidates': int((probs[:, 1:] > model.roi_heads.score_thresh).sum()),
            'detections': int(out['boxes'].shape[0])}


def ours_test_row(name, model_type, model, image, device, precision, cfg_overrides):
    with cfg_values(cfg_overrides):
        facts = ours_test_facts(model_type, model, image, device, precision)
    return Row('test', name, lambda: ours_detect(model_type, model, image, device, precision), 1,
               resident=lambda: model_tensors(model), graph_owners=lambda: [model], cfg=cfg_overrides, info=facts)


def torchvision_test_row(name, model, image, device, precision):
    return Row('test', name, lambda: torchvision_detect(model, image, device, precision), 1,
               resident=lambda: model_tensors(model), info=torchvision_test_facts(model, image, device, precision))


def ours_test_name(case, std_nms):
    return 'ours, {}, STD_NMS {}'.format(case, std_nms)


def torchvision_test_name(case):
    return 'torchvision (equal work), {}'.format(case)


def build_test_rows(args, model_type, device, precision):
    """Realistic and loaded cases on 6-class models; ours with STD_NMS False and True."""
    h, w = args.height, args.width
    image = synthetic_images(1, h, w, seed=1)[0]
    # No resize of the h x w image, as torchvision's min_size / max_size below.
    base = {'TEST.SCALE': min(h, w), 'TEST.MAX_SIZE': max(h, w), 'MODEL.NUM_CLASSES': TEST_NUM_CLASSES}
    std_options = [False, True] if cfg.PRED_STD else [False]
    ours = build_ours(model_type, device, TEST_NUM_CLASSES).eval()
    tv = torchvision_equal_work(TEST_NUM_CLASSES, **torchvision_settings(h, w)).to(device).eval()
    rows, ratios = [], []
    for case in ('realistic', 'loaded'):
        ours_case, tv_case = copy.deepcopy(ours), copy.deepcopy(tv)
        if case == 'realistic':
            with cfg_values(dict(base, STD_NMS=False)):
                calibrate_realistic(ours_box_layers(ours_case), ours_case.box_head,
                                    lambda model=ours_case: ours_detect(model_type, model, image, device, precision),
                                    args.realistic_per_class, cfg.TEST.SCORE_THRESH)
            calibrate_realistic(torchvision_box_layers(tv_case), tv_case.roi_heads.box_head,
                                lambda model=tv_case: torchvision_detect(model, image, device, precision),
                                args.realistic_per_class, tv_case.roi_heads.score_thresh)
        else:
            set_loaded_classifier(*ours_box_layers(ours_case), TEST_NUM_CLASSES)
            set_loaded_classifier(*torchvision_box_layers(tv_case), TEST_NUM_CLASSES)
        ours_rows = [ours_test_row(ours_test_name(case, std), model_type, ours_case, image, device, precision,
                                   dict(base, STD_NMS=std)) for std in std_options]
        tv_row = torchvision_test_row(torchvision_test_name(case), tv_case, image, device, precision)
        rows += ours_rows + [tv_row]
        ratios.append(('torchvision ms / ours ms (STD_NMS False), {}: our speed-up'.format(case), tv_row, ours_rows[0]))
        if len(ours_rows) > 1:
            ratios.append(('ours STD_NMS True / False, {} (cost of variance voting)'.format(case),
                           ours_rows[1], ours_rows[0]))
    return rows, ratios
