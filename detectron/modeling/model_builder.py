"""cfg -> model type -> model: `build_model_type(cfg)` looks MODEL.TYPE up among the registered
model types and returns the one instance, bound to cfg, that tools and workers hand to the engines.

Each model type is a `ModelType` subclass (modeling/model_type.py) registered where it is defined
(`@register_model_type`): it builds the model and brings what only that model knows (how its
training batches are made, how a test image is prepared, how raw outputs become per-image
detections, how weight files map onto it). The engines, checkpoints, launcher, evaluator and tools
are handed it and never ask which model they run (docs/DESIGN.md, "The model contract").
"""
from detectron.modeling.model_type import registered_model_types
from detectron.utils.errors import ConfigValueError


def build_model_type(cfg):
    """The model type cfg.MODEL.TYPE names, bound to cfg."""
    model_types = registered_model_types()
    model_type_class = model_types.get(cfg.MODEL.TYPE)
    if model_type_class is None:
        raise ConfigValueError("MODEL.TYPE '{}' is not supported; use one of {}".format(
            cfg.MODEL.TYPE, ', '.join(repr(name) for name in sorted(model_types) if not model_types[name].deprecated)))
    return model_type_class(cfg)


def checked_model(model_type):
    """The model of model_type (a ModelType bound to its cfg), its settings checked first."""
    model_type.check()
    return model_type.build()


def create(cfg):
    """The checked model cfg.MODEL.TYPE names, for scripts and tests that hold no model type."""
    return checked_model(build_model_type(cfg))
