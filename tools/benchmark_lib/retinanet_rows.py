"""The RetinaNet rows (--mode retinanet with a RetinaNet --cfg): training images/s and inference ms/image of ours
beside torchvision's retinanet_resnet50_fpn at equal work."""
import math

import torch
from torchvision.models.detection import RetinaNet
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops.feature_pyramid_network import LastLevelP6P7
from torchvision.ops.misc import FrozenBatchNorm2d

from detectron.core.config import cfg
from detectron.modeling.optimizer import build_optimizer

from .centernet_rows import training_step
from .inputs import ours_train_inputs, synthetic_batch, synthetic_images, torchvision_train_inputs
from .profiling import profile_row, trace_path
from .rcnn_rows import build_ours, build_ours_for_training
from .timing import Row, autocast, cfg_values, flat_tensors, model_tensors, per_round_ratios, run_interleaved
from .torchvision_models import torchvision_detect, trainable_parameters

TRAIN_RATIO = 'ours / torchvision retinanet equal work (training speed-up)'
TEST_RATIO = 'ours ms / torchvision ms (inference, loaded)'
# Every anchor's class score of both models starts here in the inference rows, above RETINANET.INFERENCE_TH: each
# level hands PRE_NMS_TOP_N candidates to the NMS in both (random heads leave almost none, except ours on P7).
_LOADED_PROB = 0.5


def torchvision_retinanet(num_classes, height, width):
    """retinanet_resnet50_fpn's architecture as built with ImageNet weights (FrozenBatchNorm2d, layer2-4
    trainable: our FREEZE_AT 2) but random weights, with Detectron's P6 on C5 (LastLevelP6P7(2048, 256)),
    RetinaNet's settings from our cfg, and no resize of height x width images. num_classes: ours with
    background (torchvision's head has no background logit)."""
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name='resnet50', weights=None, norm_layer=FrozenBatchNorm2d,
                                   trainable_layers=3, returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(2048, 256))
    r = cfg.RETINANET
    return RetinaNet(backbone, num_classes - 1, min_size=min(height, width), max_size=max(height, width),
                     score_thresh=r.INFERENCE_TH, nms_thresh=cfg.TEST.NMS, detections_per_img=cfg.TEST.DETECTIONS_PER_IM,
                     fg_iou_thresh=r.POSITIVE_OVERLAP, bg_iou_thresh=r.NEGATIVE_OVERLAP, topk_candidates=r.PRE_NMS_TOP_N)


def retinanet_rows(args, model_type, batch, device, precision):
    """[ours train, torchvision train, ours detect, torchvision detect]: Detectron's momentum SGD on the same
    synthetic batch; detection of one image (upload, forward, decode, NMS, results) with every class
    score set to _LOADED_PROB."""
    num_classes = cfg.MODEL.NUM_CLASSES
    h, w = args.height, args.width
    images, boxes, labels = synthetic_batch(batch, h, w, args.boxes, num_classes)
    ours = build_ours_for_training(model_type, device, precision)
    tv = torchvision_retinanet(num_classes, h, w).to(device)
    ours_inputs = ours_train_inputs(images, boxes, labels, device)
    tv_inputs = torchvision_train_inputs(images, boxes, labels - 1, device)  # its logits have no background
    rows = [_train_row('ours ({})'.format(args.cfg), ours, lambda: ours(*ours_inputs), ours_inputs, batch, device,
                       precision, args.lr),
            _train_row('torchvision retinanet_resnet50_fpn (equal work)', tv, lambda: tv(*tv_inputs), tv_inputs,
                       batch, device, precision, args.lr)]
    image = synthetic_images(1, h, w, seed=1)[0]
    with cfg_values({'TEST.SCALE': min(h, w), 'TEST.MAX_SIZE': max(h, w)}):
        detect = model_type.detector()
    ours_test = model_type.prepare_for_inference(build_ours(model_type, device).eval())
    tv_test = torchvision_retinanet(num_classes, h, w).to(device).eval()
    _load_scores(ours_test.head.cls_pred, tv_test.head.classification_head.cls_logits)

    def ours_detect():
        with autocast(device, precision):
            return detect(ours_test, {'image': image})

    rows += [Row('test', 'ours, loaded', ours_detect, 1, resident=lambda: model_tensors(ours_test),
                 info={'detections': sum(len(b) for b in ours_detect()[1:])}),
             Row('test', 'torchvision (equal work), loaded', lambda: torchvision_detect(tv_test, image, device, precision),
                 1, resident=lambda: model_tensors(tv_test),
                 info={'detections': len(torchvision_detect(tv_test, image, device, precision)['boxes'])})]
    return rows


def _train_row(name, model, forward, inputs, batch, device, precision, lr):
    optimizer = build_optimizer(model, base_lr=lr, momentum=cfg.SOLVER.MOMENTUM, weight_decay=cfg.SOLVER.WEIGHT_DECAY)
    last = {}

    def loss():
        total = sum(v for k, v in forward().items() if k.startswith(('loss', 'classification', 'bbox_regression')))
        last['loss'] = total.detach()
        return total
    return Row('train', name, training_step(model, optimizer, loss, device, precision), batch,
               resident=lambda: model_tensors(model, optimizer) + flat_tensors(inputs),
               info={'trainable_params': trainable_parameters(model)},
               after=lambda: {'loss_finite': bool(torch.isfinite(last['loss']))})


def _load_scores(*cls_preds):
    """Both class predictors give every anchor and class the probability _LOADED_PROB."""
    with torch.no_grad():
        for conv in cls_preds:
            conv.weight.zero_()
            conv.bias.fill_(math.log(_LOADED_PROB / (1 - _LOADED_PROB)))


def run_retinanet(args, model_type, precision, report, timing):
    rows = retinanet_rows(args, model_type, args.batch[0], timing['device'], precision)
    run_interleaved(rows, **timing)
    for row in rows:
        report.add_row(row, batch=row.images_per_step, precision=precision, size=[args.height, args.width])
    report.add_ratio('{}, batch {}'.format(TRAIN_RATIO, args.batch[0]), per_round_ratios(rows[0].values, rows[1].values))
    report.add_ratio(TEST_RATIO, per_round_ratios(rows[2].values, rows[3].values))
    if 'profile' in args.mode:
        for row, trace in zip(rows, ('train_ours', 'train_torchvision', 'test_ours', 'test_torchvision')):
            report.add_profile(row.name, profile_row(row, args.profile_steps, args.warmup, timing['device'],
                                                     trace_path(args, trace)),
                               batch=row.images_per_step, size=[args.height, args.width])
