"""cfg -> CenterNet (MODEL.TYPE centernet). Placeholder until the CenterNet modules land."""
from detectron.modeling.model_type import ModelType
from detectron.utils.errors import ConfigValueError


class CenterNetType(ModelType):
    name = 'centernet'

    def check(self, cfg):
        raise ConfigValueError("MODEL.TYPE 'centernet' is not built yet; use 'generalized_rcnn'")
