"""torchvision's Faster (or, with MODEL.MASK_ON, Mask; with MODEL.KEYPOINTS_ON, Keypoint) R-CNN set up for the same
work as ours: settings from our cfg, its models, its inference."""
import numpy as np
import pycocotools.mask as mask_util
import torch
from torchvision.models.detection import (
    FasterRCNN,
    KeypointRCNN,
    MaskRCNN,
    fasterrcnn_resnet50_fpn,
    keypointrcnn_resnet50_fpn,
    maskrcnn_resnet50_fpn,
)
from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.ops.misc import FrozenBatchNorm2d

from detectron.core.config import cfg

from .timing import autocast


def torchvision_settings(height, width):
    """FasterRCNN keyword arguments from our cfg (with the KL config they are torchvision's
    defaults), so that overriding our RPN / RoI settings keeps the work equal; no resize of
    height x width images."""
    return dict(
        min_size=min(height, width), max_size=max(height, width),
        rpn_pre_nms_top_n_train=cfg.TRAIN.RPN_PRE_NMS_TOP_N, rpn_post_nms_top_n_train=cfg.TRAIN.RPN_POST_NMS_TOP_N,
        rpn_pre_nms_top_n_test=cfg.TEST.RPN_PRE_NMS_TOP_N, rpn_post_nms_top_n_test=cfg.TEST.RPN_POST_NMS_TOP_N,
        rpn_nms_thresh=cfg.TRAIN.RPN_NMS_THRESH, rpn_fg_iou_thresh=cfg.TRAIN.RPN_POSITIVE_OVERLAP,
        rpn_bg_iou_thresh=cfg.TRAIN.RPN_NEGATIVE_OVERLAP, rpn_batch_size_per_image=cfg.TRAIN.RPN_BATCH_SIZE_PER_IM,
        rpn_positive_fraction=cfg.TRAIN.RPN_FG_FRACTION, box_score_thresh=cfg.TEST.SCORE_THRESH,
        box_nms_thresh=cfg.TEST.NMS, box_detections_per_img=cfg.TEST.DETECTIONS_PER_IM,
        box_fg_iou_thresh=cfg.TRAIN.FG_THRESH, box_bg_iou_thresh=cfg.TRAIN.BG_THRESH_HI,
        box_batch_size_per_image=cfg.TRAIN.BATCH_SIZE_PER_IM, box_positive_fraction=cfg.TRAIN.FG_FRACTION,
        bbox_reg_weights=tuple(cfg.MODEL.BBOX_REG_WEIGHTS))


def torchvision_equal_work(num_classes, **settings):
    """fasterrcnn_resnet50_fpn (maskrcnn_resnet50_fpn with MODEL.MASK_ON: its mask head is Detectron's
    4 conv + deconv on RoIAlign 14 / sampling 2; keypointrcnn_resnet50_fpn with MODEL.KEYPOINTS_ON: its
    keypoint head is Detectron's v1convX, 8 conv 512 + deconv + bilinear x2 to 56 on RoIAlign 14 /
    sampling 2) as built with ImageNet weights: FrozenBatchNorm2d, layer2-4 trainable (conv1 and layer1
    frozen, our FREEZE_AT 2), but random weights."""
    torch.manual_seed(0)
    backbone = resnet_fpn_backbone(backbone_name='resnet50', weights=None, norm_layer=FrozenBatchNorm2d,
                                   trainable_layers=3)
    if cfg.MODEL.KEYPOINTS_ON:
        return KeypointRCNN(backbone, num_classes=num_classes, num_keypoints=cfg.KRCNN.NUM_KEYPOINTS, **settings)
    return (MaskRCNN if cfg.MODEL.MASK_ON else FasterRCNN)(backbone, num_classes=num_classes, **settings)


def torchvision_all_stages_bn(num_classes, **settings):
    """weights=None's fasterrcnn_resnet50_fpn: BatchNorm2d with batch statistics, every stage
    trainable; more work than our FREEZE_AT 2 model (the unequal comparison)."""
    torch.manual_seed(0)
    if cfg.MODEL.KEYPOINTS_ON:
        return keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=num_classes,
                                         num_keypoints=cfg.KRCNN.NUM_KEYPOINTS, **settings)
    build = maskrcnn_resnet50_fpn if cfg.MODEL.MASK_ON else fasterrcnn_resnet50_fpn
    return build(weights=None, weights_backbone=None, num_classes=num_classes, **settings)


def trainable_parameters(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def torchvision_detect(model, image, device, precision):
    """torchvision's whole inference: upload, RGB float, its transform, forward, post-processing. A
    Mask R-CNN's pasted masks end as COCO RLEs, as ours: binarised at 0.5 on the device, then
    encoded one by one as torchvision's references/detection/coco_eval.py does."""
    with torch.no_grad(), autocast(device, precision):
        x = torch.from_numpy(image[:, :, ::-1].copy()).to(device).permute(2, 0, 1).float().div(255)
        out = model([x])[0]
    if 'masks' in out:
        binary = (out.pop('masks')[:, 0] > 0.5).to(torch.uint8).cpu().numpy()
        out = {k: v.cpu() for k, v in out.items()}
        out['segms'] = [mask_util.encode(np.array(m[:, :, np.newaxis], order='F'))[0] for m in binary]
        return out
    return {k: v.cpu() for k, v in out.items()}


def torchvision_box_layers(model):
    predictor = model.roi_heads.box_predictor
    return predictor.cls_score, [predictor.bbox_pred]
