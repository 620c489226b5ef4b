"""cfg -> model: the one table of model types, keyed by MODEL.TYPE.

Each entry is a `ModelType` (modeling/model_type.py): it builds the model and brings what only
that model knows (how its training batches are made, how a test image is prepared, how raw outputs
become per-image detections, how weight files map onto it). The engines, checkpoints, launcher, evaluator and tools
go through this table and never ask which model they run (docs/DESIGN.md, "The model contract").
"""
from detectron.modeling import centernet_builder, rcnn_builder
from detectron.utils.errors import ConfigValueError

MODEL_TYPES = {
    'generalized_rcnn': rcnn_builder.GeneralizedRCNNType(),
    'centernet': centernet_builder.CenterNetType(),
}


def get_model_type(cfg):
    model_type = MODEL_TYPES.get(cfg.MODEL.TYPE)
    if model_type is None:
        raise ConfigValueError("MODEL.TYPE '{}' is not supported; use one of {}".format(
            cfg.MODEL.TYPE, ', '.join(repr(name) for name in sorted(MODEL_TYPES))))
    return model_type


def create(cfg):
    """Build the model named by MODEL.TYPE from cfg."""
    model_type = get_model_type(cfg)
    model_type.check(cfg)
    return model_type.build(cfg)
