"""The validation loss of a training model: its losses on TEST.DATASETS without gradients, each loss the
mean over the validation images (batches weighted by their images, as CenterNet's AverageMeter),
over all ranks of the job."""
import torch

from detectron.core.train_loop import AMP_DTYPES
from detectron.roi_data.loader import build_train_loader
from detectron.roi_data.samplers import inference_ranges
from detectron.utils import comm
from detectron.utils.random_streams import preserved_random_streams


def validation_loss(model_type, model, device):
    """{'val/loss': ..., 'val/loss_<part>': ...} of model (unwrapped, on device) over this rank's share of
    TEST.DATASETS, reduced over ranks: the same floats on every rank (a collective). Batch size, loader
    threads and autocast come from the cfg model_type is bound to (model_type.cfg). Training's random
    streams are left as they were (the loader draws a seed, R-CNN's losses sample RoIs)."""
    with preserved_random_streams():
        return _validation_loss(model_type, model, device)


def _validation_loss(model_type, model, device):
    cfg = model_type.cfg
    dataset = model_type.validation_dataset(device)
    start, end = inference_ranges(len(dataset), comm.get_world_size())[comm.get_rank()]
    batch_size = cfg.TRAIN.IMS_PER_BATCH
    batches = [list(range(i, min(i + batch_size, end))) for i in range(start, end, batch_size)]
    loader = build_train_loader(dataset, batches, model_type.collate(device),
                                num_workers=min(cfg.DATA_LOADER.NUM_THREADS, len(batches)),
                                timeout=cfg.DATA_LOADER.TIMEOUT_S)
    to_device = model_type.batch_to_device(device)
    losses = model_type.validation_losses()
    sums = {}
    for indices, batch in zip(batches, loader):
        with torch.autocast(device.type, dtype=AMP_DTYPES[cfg.SOLVER.AMP.DTYPE], enabled=cfg.SOLVER.AMP.ENABLED):
            outputs = losses(model, to_device(batch))
        # 'loss' is the objective as the training loop sums it; the other outputs are its parts.
        outputs = dict(outputs, loss=sum(v for k, v in outputs.items() if k.startswith('loss')))
        for name, value in outputs.items():
            sums[name] = sums.get(name, 0.0) + value.detach().float() * len(indices)
    return _mean_over_ranks(sums, end - start, device)


def _mean_over_ranks(sums, count, device):
    # A rank without images adds zeros; the names come from the ranks that have some.
    names = sorted(set().union(*comm.all_gather_object(sorted(sums))))
    totals = {name: torch.as_tensor(sums.get(name, 0.0), device=device, dtype=torch.float32) for name in names}
    totals['count'] = torch.tensor(float(count), device=device)
    totals = comm.reduce_dict(totals, average=False)
    count = float(totals.pop('count'))
    return {'val/' + name: float(value) / max(count, 1.0) for name, value in sorted(totals.items())}
