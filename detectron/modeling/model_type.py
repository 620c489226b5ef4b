"""The contract between one kind of detector and the model-agnostic engines (a MODEL.TYPE entry
of model_builder's table). Subclasses read cfg: they are the builders of their model."""
from detectron.checkpoint.checkpointer import Retention
from detectron.datasets.json_dataset_evaluator import DETECTRON_RESULTS
from detectron.roi_data.loader import to_device


class ModelType:
    """The contract between one kind of detector and the model-agnostic engines.

    Training: `build(cfg)` is called with the model in training mode as `model(*batch)` on batches
    made by `collate(cfg)` from `training_dataset(cfg, roidb, device)` samples and moved to the
    training device by `batch_to_device(cfg, device)`, and returns a dict of scalar tensors (keys starting with 'loss' are summed into the objective, others are logged metrics).
    Testing: `test_inputs(cfg)` prepares one BGR image in a loader worker (a picklable callable
    returning a dict that holds the original image under 'image'), and `detector(cfg)(model, sample)`
    returns Detectron's `cls_boxes`: `output_classes(cfg)` float32 (N, 5) arrays (x1, y1, x2, y2,
    score), index 0 (background) empty, index j the dataset's contiguous category j; a model with
    masks returns the pair (cls_boxes, cls_segms), cls_segms[j][k] the COCO RLE of cls_boxes[j][k]
    (the engines evaluate masks whenever they get them).
    """

    name = ''

    def check(self, cfg):
        """ConfigValueError (one line) for settings this model cannot run."""

    def derive_training_cfg(self, cfg, typed):
        """Fill the training keys this model derives from others that the user left untyped (typed:
        {full key: where it was typed}; before the cfg is frozen); returns lines for --print-config
        and the log, one of them saying what was derived (utils/derived_keys.py)."""
        return []

    def checkpoint_retention(self, cfg, lr_change_iters):
        """Which checkpoints training writes and keeps (lr_change_iters: the iterations where the LR
        schedule steps): Detectron's model_iterN.pth every period by default, TRAIN.KEEP_CHECKPOINTS
        of them kept."""
        return Retention(keep=cfg.TRAIN.KEEP_CHECKPOINTS)

    def build(self, cfg):
        raise NotImplementedError

    def output_classes(self, cfg):
        raise NotImplementedError

    def load_weights(self, cfg, model, path):
        """Initialise model from a weights file; returns (missing, unused) name lists."""
        raise NotImplementedError

    def load_training_weights(self, cfg, model, path):
        """load_weights for training: (missing, unused, {parameter name: momentum SGD history} the
        file carries for model, which training from it starts with; none by default)."""
        return (*self.load_weights(cfg, model, path), {})

    def training_roidb(self, cfg):
        raise NotImplementedError

    def training_groups(self, cfg, roidb):
        """A group id per roidb entry; a training batch holds entries of one group."""
        return [0] * len(roidb)

    def training_dataset(self, cfg, roidb, device):
        """The samples of roidb for training on device (a torch.device), made in loader workers."""
        raise NotImplementedError

    def collate(self, cfg, device):
        raise NotImplementedError

    def batch_to_device(self, cfg, device):
        """fn(batch) -> the collated batch on the training device, as model(*batch) takes it (called
        by the engine on every batch); by default its tensors are copied there."""
        return lambda batch: to_device(batch, device)

    def test_inputs(self, cfg):
        raise NotImplementedError

    def validation_dataset(self, cfg, device):
        """Samples of TEST.DATASETS made as training samples (collated by collate(cfg, device)) but
        without augmentation, for the validation loss (TEST.VAL_LOSS_PERIOD)."""
        raise NotImplementedError

    def validation_losses(self, cfg):
        """fn(model, batch on the device) -> the model's dict of losses on a validation batch, without
        gradients; it leaves the model in training mode."""
        raise NotImplementedError

    def best_metric(self, cfg):
        """The evaluation metric model_best.pth is chosen by when TEST.BEST_METRIC is empty, and
        whether lower is better: ('bbox/AP', 'max') by default."""
        return 'bbox/AP', 'max'

    def detector(self, cfg):
        raise NotImplementedError

    def batch_detector(self, cfg):
        """fn(model, samples) -> the detector's result for each of up to TEST.IMS_PER_BATCH samples,
        in order; by default the detector on one sample after the other."""
        detect = self.detector(cfg)
        return lambda model, samples: [detect(model, sample) for sample in samples]

    def prepare_for_training(self, cfg, model):
        """The new model on its training device made ready for training, before its weights are
        loaded and its optimizer is built (e.g. stored in a faster memory layout); returns it.
        Unchanged by default."""
        return model

    def prepare_for_inference(self, cfg, model):
        """The loaded model (on its device, in eval mode) made ready for detector(cfg), e.g. stored
        in a faster memory layout; returns it. Unchanged by default."""
        return model

    def memory_settings(self, cfg, training):
        """The settings that lower this model's device memory in training (training True) or testing,
        with their values, as the out-of-memory error names them. By default: the images per GPU,
        made up for by SOLVER.ITER_SIZE, and TRAIN.CHECKPOINT_ACTIVATIONS; in testing, none."""
        if not training:
            return 'a device with more memory'
        return '; '.join([batch_setting(cfg, 'TRAIN.IMS_PER_BATCH {}'.format(cfg.TRAIN.IMS_PER_BATCH))]
                         + checkpoint_setting(cfg))

    def results_format(self, cfg):
        """How its boxes go into the COCO results json (Detectron's +1 widths by default)."""
        return DETECTRON_RESULTS


def batch_setting(cfg, batch):
    """Fewer images per micro-step, as many per iteration."""
    return 'lower {}, raising SOLVER.ITER_SIZE {} by the same factor (the same images per iteration)'.format(
        batch, cfg.SOLVER.ITER_SIZE)


def checkpoint_setting(cfg):
    """['TRAIN.CHECKPOINT_ACTIVATIONS True ...'] when it is off, else []."""
    if cfg.TRAIN.CHECKPOINT_ACTIVATIONS:
        return []
    return ['TRAIN.CHECKPOINT_ACTIVATIONS True (recompute backbone activations in the backward)']
