"""The contract between one kind of detector and the model-agnostic engines, and the registry of
the kinds MODEL.TYPE names. A subclass registers itself where it is defined
(`@register_model_type('name')`); `model_builder.build_model_type(cfg)` makes the one instance,
bound to cfg, that a tool or worker hands to the engines."""
import importlib
from dataclasses import dataclass
from typing import Callable

from detectron.checkpoint.checkpointer import Retention
from detectron.datasets.json_dataset_evaluator import DETECTRON_RESULTS
from detectron.datasets.test_results import DetectionResults
from detectron.roi_data.loader import to_device
from detectron.utils.errors import ConfigValueError

# The modules whose ModelType subclasses register themselves, imported on the first lookup
# (registered_model_types): a new model type is a new module and one line here.
MODEL_TYPE_MODULES = ('detectron.modeling.rcnn_builder', 'detectron.modeling.centernet_builder',
                      'detectron.modeling.retinanet_builder')

_REGISTRY = {}


def register_model_type(name):
    """Class decorator: the ModelType subclass is what MODEL.TYPE name builds (its `name`)."""
    def register(model_type_class):
        if _REGISTRY.get(name, model_type_class) is not model_type_class:
            raise ValueError("MODEL.TYPE '{}' is registered already, by {}".format(name, _REGISTRY[name].__qualname__))
        model_type_class.name = name
        _REGISTRY[name] = model_type_class
        return model_type_class
    return register


def unregister_model_type(name):
    """Remove what register_model_type(name) added (a test's own model type, after the test)."""
    del _REGISTRY[name]


def registered_model_types():
    """{MODEL.TYPE name: ModelType subclass} of every registered model type."""
    for module in MODEL_TYPE_MODULES:
        importlib.import_module(module)
    return dict(_REGISTRY)


class ModelType:
    """The contract between one kind of detector and the model-agnostic engines.

    An instance is bound to one cfg (`ModelType(cfg)`, made by model_builder.build_model_type): its
    methods read that cfg when called and take no cfg argument.

    Training: `build()` is called with the model in training mode as `model(*batch)` on batches
    made by `collate(device)` from `training_dataset(roidb, device)` samples and moved to the
    training device by `batch_to_device(device)`, and returns a dict of scalar tensors (keys
    starting with 'loss' are summed into the objective, others are logged metrics).
    Testing: `test_inputs()` prepares one BGR image in a loader worker (a picklable callable
    returning a dict that holds the original image under 'image'), and `detector()(model, sample)`
    returns Detectron's `cls_boxes`: `output_classes()` float32 (N, 5) arrays (x1, y1, x2, y2,
    score), index 0 (background) empty, index j the dataset's contiguous category j; a model with
    masks returns the pair (cls_boxes, cls_segms), cls_segms[j][k] the COCO RLE of cls_boxes[j][k]; a
    model with keypoints the triple (cls_boxes, cls_segms or None, cls_keyps), cls_keyps[j][k] the (4, K)
    keypoints of cls_boxes[j][k] (the engines evaluate masks and keypoints whenever they get them).
    """

    name = ''  # set by register_model_type
    deprecated = False  # an old name kept for configs that use it, not offered in errors

    def __init__(self, cfg):
        self.cfg = cfg

    def check(self):
        """ConfigValueError (one line) for settings this model cannot run."""

    def derive_training_cfg(self, typed):
        """Fill the training keys this model derives from others that the user left untyped (typed:
        {full key: where it was typed}; before the cfg is frozen); returns lines for --print-config
        and the log, one of them saying what was derived (utils/derived_keys.py)."""
        return []

    def checkpoint_retention(self, lr_change_iters):
        """Which checkpoints training writes and keeps (lr_change_iters: the iterations where the LR
        schedule steps): Detectron's model_iterN.pth every period by default, TRAIN.KEEP_CHECKPOINTS
        of them kept."""
        return Retention(keep=self.cfg.TRAIN.KEEP_CHECKPOINTS)

    def build(self):
        raise NotImplementedError

    def output_classes(self):
        raise NotImplementedError

    def load_weights(self, model, path):
        """Initialise model from a weights file; returns (missing, unused) name lists."""
        raise NotImplementedError

    def load_training_weights(self, model, path):
        """load_weights for training: (missing, unused, {parameter name: momentum SGD history} the
        file carries for model, which training from it starts with; none by default)."""
        return (*self.load_weights(model, path), {})

    def training_run_opts(self, datasets, batch, iterations, base_lr):
        """KEY VALUE overrides (strings) for a one-process train_net run (NUM_GPUS 1) on the datasets
        (names) of at least `iterations` iterations of `batch` images, SOLVER.BASE_LR base_lr: for tools
        that time train_net. By default Detectron's keys, exactly `iterations`."""
        return ['TRAIN.DATASETS', str(tuple(datasets)), 'TRAIN.IMS_PER_BATCH', str(batch),
                'SOLVER.MAX_ITER', str(iterations), 'SOLVER.BASE_LR', str(base_lr)]

    def training_roidb(self):
        raise NotImplementedError

    def training_groups(self, roidb):
        """A group id per roidb entry; a training batch holds entries of one group."""
        return [0] * len(roidb)

    def training_batch_check(self, roidb):
        """None, or the check by which the sampler drops invalid training batches (samplers.
        GroupedDistributedBatchSampler's check, over indices of roidb); by default every batch trains."""
        return None

    def training_dataset(self, roidb, device):
        """The samples of roidb for training on device (a torch.device), made in loader workers."""
        raise NotImplementedError

    def collate(self, device):
        raise NotImplementedError

    def batch_to_device(self, device):
        """fn(batch) -> the collated batch on the training device, as model(*batch) takes it (called
        by the engine on every batch); by default its tensors are copied there."""
        return lambda batch: to_device(batch, device)

    def test_inputs(self):
        raise NotImplementedError

    def validation_dataset(self, device):
        """Samples of TEST.DATASETS made as training samples (collated by collate(device)) but without
        augmentation, for the validation loss (TEST.VAL_LOSS_PERIOD)."""
        raise NotImplementedError

    def validation_losses(self):
        """fn(model, batch on the device) -> the model's dict of losses on a validation batch, without
        gradients; it leaves the model in training mode."""
        raise NotImplementedError

    def best_metric(self):
        """The evaluation metric model_best.pth is chosen by when TEST.BEST_METRIC is empty, and
        whether lower is better: ('bbox/AP', 'max') by default."""
        return 'bbox/AP', 'max'

    def detector(self):
        raise NotImplementedError

    def batch_detector(self):
        """fn(model, samples) -> the detector's result for each of up to TEST.IMS_PER_BATCH samples,
        in order; by default the detector on one sample after the other."""
        detect = self.detector()
        return lambda model, samples: [detect(model, sample) for sample in samples]

    def prepare_for_training(self, model):
        """The new model on its training device made ready for training, before its weights are
        loaded and its optimizer is built (e.g. stored in a faster memory layout); returns it.
        Unchanged by default."""
        return model

    def prepare_for_inference(self, model):
        """The loaded model (on its device, in eval mode) made ready for detector(), e.g. stored
        in a faster memory layout; returns it. Unchanged by default."""
        return model

    def memory_settings(self, training):
        """The settings that lower this model's device memory in training (training True) or testing,
        with their values, as the out-of-memory error names them. By default: the images per GPU,
        made up for by SOLVER.ITER_SIZE, and TRAIN.CHECKPOINT_ACTIVATIONS; in testing, none."""
        cfg = self.cfg
        if not training:
            return 'a device with more memory'
        return '; '.join([batch_setting(cfg, 'TRAIN.IMS_PER_BATCH {}'.format(cfg.TRAIN.IMS_PER_BATCH))]
                         + checkpoint_setting(cfg))

    def exporter(self, model):
        """How `model` (built, loaded, in eval mode on the CPU) leaves the framework: an Exporter
        (core/export.py exports its graph and verifies it against detector())."""
        raise ConfigValueError('MODEL.TYPE {} has no export'.format(self.name))

    def results_format(self):
        """How its boxes go into the COCO results json (Detectron's +1 widths by default)."""
        return DETECTRON_RESULTS

    def test_proposal_files(self):
        """{TEST.DATASETS entry: its proposal file (path or URL)} for a model that detects on precomputed
        proposals: test_net reads each dataset's file into its roidb and puts every image's proposals in
        its test sample ('proposals'). None by default."""
        return {}

    def test_results(self):
        """What test_net keeps of the detector's results, how the slices of several processes merge, the
        files they are written to and their evaluation (datasets/test_results.py): by default Detectron's
        detections (all_boxes, all_segms), detections.pkl and the COCO evaluation in results_format()."""
        return DetectionResults(self.results_format(), competition_mode=self.cfg.TEST.COMPETITION_MODE)


def batch_setting(cfg, batch):
    """Fewer images per micro-step, as many per iteration."""
    return 'lower {}, raising SOLVER.ITER_SIZE {} by the same factor (the same images per iteration)'.format(
        batch, cfg.SOLVER.ITER_SIZE)


def train_cuda_graphs(cfg):
    """Whether training replays the model's fixed-shape part from CUDA graphs: TRAIN.CUDA_GRAPHS, off with
    TRAIN.CHECKPOINT_ACTIVATIONS (checkpointed layers recompute their forward inside the backward: left to run
    eagerly)."""
    return cfg.TRAIN.CUDA_GRAPHS and not cfg.TRAIN.CHECKPOINT_ACTIVATIONS


def checkpoint_setting(cfg):
    """['TRAIN.CHECKPOINT_ACTIVATIONS True ...'] when it is off, else []."""
    if cfg.TRAIN.CHECKPOINT_ACTIVATIONS:
        return []
    return ['TRAIN.CHECKPOINT_ACTIVATIONS True (recompute backbone activations in the backward)']


@dataclass(frozen=True)
class Exporter:
    """A model's inference as one graph: `graph` (an nn.Module wrapping the model's own modules),
    `inputs(sample)` its input tensors for a test_inputs() sample, and `detections(outputs, sample)`
    the host-side end that turns the graph's outputs (numpy, in output_names' order) into what
    detector() returns for that sample. `contested(model, sample, tol)`, where a decision of the
    graph compares scores that are not its output (CenterNet's peak test): the detections (cls_boxes)
    of the PyTorch model that such a decision keeps or drops by less than tol."""
    graph: object
    inputs: Callable
    detections: Callable
    input_names: tuple
    output_names: tuple
    dynamic_axes: dict
    contested: Callable = None
