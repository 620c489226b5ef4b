"""Whether a loaded weights file fits the model: checked by the engines after any model type's loader.

A file that fills none, or almost none, of the model's tensors holds another kind of model (an R-CNN
checkpoint given to CenterNet, Detectron's R-50.pkl given to CenterNet, a CenterNet file given to
R-CNN): using it would train or test a randomly initialised network. For testing, every tensor must
come from the file: a head that the file does not fill (KL-Loss's bbox_pred_std without PRED_STD
weights, CenterNet's heatmap head of another class count) would detect with its random init.
"""
from detectron.utils.errors import WeightsError

# A file filling fewer of the model's tensors than this holds another model; an ImageNet trunk fills
# more than half of either model (R-18-FPN: 60 of 98 tensors, CenterNet res_18: 100 of 127).
MIN_FILLED_FRACTION = 0.1
_BN_COUNTER = 'num_batches_tracked'  # read by no BatchNorm with a fixed momentum; absent from old files
_NAMES_SHOWN = 3


def weights_kind(file_keys):
    """What a weights file holds, told from the names of its tensors (its keys the model did not use)."""
    keys = [str(k) for k in file_keys]
    if any(k.startswith('heads.hm.') for k in keys):
        return 'a CenterNet model of this port (MODEL.TYPE centernet)'
    if any(k.startswith(('hm.', 'module.hm.')) for k in keys):
        return "a CenterNet model in CenterNet's own format"
    if any(k.startswith(('conv_body.', 'rpn.', 'box_head.', 'box_outs.')) for k in keys):
        return 'an R-CNN model of this port (MODEL.TYPE generalized_rcnn)'
    if any(k in ('cls_score_w', 'bbox_pred_w') for k in keys):
        return 'a Detectron R-CNN model (blobs such as cls_score_w)'
    if any(k.startswith('res2_') for k in keys):
        return "Detectron's ImageNet ResNet blobs (such as R-50.pkl), for MODEL.TYPE generalized_rcnn"
    if any(k.startswith('layer1.') for k in keys):
        return 'torchvision ImageNet ResNet weights'
    if any(k.startswith(('base_layer.', 'level0.')) for k in keys):
        return 'DLA ImageNet weights'
    if not keys:
        return 'no tensor the model lacks'
    return 'tensors such as {}'.format(', '.join(sorted(keys)[:_NAMES_SHOWN]))


def _model_tensors(model):
    return [k for k in model.state_dict() if not k.endswith(_BN_COUNTER)]


def check_weights_fit(model, path, missing, unused, model_name, testing=False):
    """Raise WeightsError when the file at path filled fewer than MIN_FILLED_FRACTION of model's tensors
    or, with testing, did not fill them all. missing / unused: what the loader returned (model keys
    the file did not fill, file keys the model has no place for). model_name: e.g. cfg.MODEL.TYPE."""
    total = len(_model_tensors(model))
    missing = [k for k in missing if not k.endswith(_BN_COUNTER)]
    filled = total - len(missing)
    setting = 'TEST.WEIGHTS' if testing else 'TRAIN.WEIGHTS'
    if filled < MIN_FILLED_FRACTION * total:
        raise WeightsError('{} fills {} of the {} tensors of the {} model: it holds {}; set {} to weights of '
                           'this model (or an ImageNet file of its backbone), or MODEL.TYPE to the model the '
                           'file holds'.format(path, filled, total, model_name, weights_kind(unused), setting))
    if testing and missing:
        raise WeightsError('{} does not fill {} of the {} tensors of the {} model ({}{}): testing would use their '
                           'random initial values; test with weights trained with this config (the heads, '
                           'PRED_STD and the class count as in training)'.format(
                               path, len(missing), total, model_name, ', '.join(missing[:_NAMES_SHOWN]),
                               ', ...' if len(missing) > _NAMES_SHOWN else ''))
