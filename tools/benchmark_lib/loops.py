"""--mode loops: train_net and test_net on real datasets next to their own inputs replayed from memory and synthetic rows."""
import copy
import itertools
import json
import os

import numpy as np
import torch

from detectron.core import train_engine
from detectron.core.config import cfg
from detectron.datasets import dataset_catalog
from detectron.datasets.json_dataset import JsonDataset
from detectron.roi_data.loader import build_test_loader
from detectron.utils import blob as blob_utils

from .classifiers import ours_box_layers, set_loaded_classifier
from .inputs import synthetic_images
from .logs import json_stats, run_logged, test_log_ms_per_image, train_log_data_fraction, train_log_images_per_s
from .rcnn_rows import build_ours, build_ours_for_training, ours_test_row, ours_train_row, train_row
from .timing import Row, autocast, cfg_values, in_turn, model_tensors, run_interleaved, spread, timed_pass


def dataset_shape(names, scale, max_size):
    """Median original and resized (h, w) and mean non-crowd boxes per image of COCO-format datasets
    (a list of names, taken together)."""
    images, annotations = [], []
    for name in names:
        with open(dataset_catalog.get_ann_fn(name)) as f:
            coco = json.load(f)
        images += coco['images']
        annotations += coco['annotations']
    heights = np.array([im['height'] for im in images])
    widths = np.array([im['width'] for im in images])
    scales = np.array([blob_utils.resize_scale(h, w, scale, max_size) for h, w in zip(heights, widths)])
    boxes = sum(1 for a in annotations if not a.get('iscrowd', 0))
    return {'images': len(heights), 'height': int(np.median(heights)), 'width': int(np.median(widths)),
            'resized_height': int(np.median(np.round(heights * scales))),
            'resized_width': int(np.median(np.round(widths * scales))),
            'boxes_per_image': boxes / len(heights)}


def dataset_arg(*names):
    """The value of a DATASETS key naming these datasets."""
    return str(tuple(names))


LOOP_MIN_LR = 1e-12


def run_train_net(args, model_type, work, batch, precision):
    """train_net.py from random init (TRAIN.WEIGHTS '') on --train-dataset at `batch` images per step for
    --loop-iters iterations at lr --lr (LOOP_MIN_LR for --lr 0, which train_net rejects). A model type whose
    keys give whole epochs (CenterNet) is stopped at its first json_stats line past them."""
    run_opts = model_type.training_run_opts(args.train_dataset, batch, args.loop_iters, args.lr or LOOP_MIN_LR)

    def past_the_loop(log_text):
        return any(int(s['iter']) >= args.loop_iters - 1 for s in json_stats(log_text))
    return run_logged('train_net.py', ['-c', os.path.abspath(args.cfg), '--skip-test'] + _loop_opts(args) + run_opts + [
        'TRAIN.WEIGHTS', "''",
        'TRAIN.SNAPSHOT_ITERS', '100000000', 'SOLVER.AMP.ENABLED', str(precision != 'fp32'),
        'SOLVER.AMP.DTYPE', 'bfloat16', 'OUTPUT_DIR', os.path.join(work, 'train')],
        os.path.join(work, 'train_net.log'), stop_when=past_the_loop)


def run_test_net(args, work, weights):
    return run_logged('test_net.py', ['-c', os.path.abspath(args.cfg)] + _loop_opts(args) + [
        'TEST.WEIGHTS', weights, 'OUTPUT_DIR', os.path.join(work, 'test')], os.path.join(work, 'test_net.log'))


def _loop_opts(args):
    opts = list(args.opts) + ['NUM_GPUS', '1']
    if args.test_dataset:
        opts += ['TEST.DATASETS', dataset_arg(args.test_dataset)]
    if args.catalog:
        opts += ['DATASET_CATALOG', os.path.abspath(args.catalog)]
    return opts


def train_net_batches(args, model_type, batch, device):
    """The batches train_net's loader gives in the timed window (iterations --loop-warmup to
    --loop-iters - 1): the same dataset, config, sampler seed and order, collated and pinned, then
    on the device as train_net's engine puts them there (model_type.batch_to_device)."""
    with cfg_values({'TRAIN.DATASETS': tuple(args.train_dataset), 'TRAIN.IMS_PER_BATCH': batch,
                     'TRAIN.RANK_IMS_PER_BATCH': ()}):
        batches, _ = train_engine.training_batches(model_type, 0, device)
        on_device = model_type.batch_to_device(device)
        return [on_device(b) for b in itertools.islice(batches, args.loop_warmup, args.loop_iters)]


def replayed_train_row(args, model_type, batch, device, precision):
    """Our training step on train_net's own batches, held on the device: the same work as train_net
    (its optimizer, SOLVER.OPTIMIZER) without its loader, logging and checkpoints (one pass over them
    before timing, as train_net met each batch shape before its window)."""
    batches = train_net_batches(args, model_type, batch, device)
    ours = build_ours_for_training(model_type, device, precision)
    name = "ours, train_net's batches of iterations {}-{} replayed from memory".format(
        args.loop_warmup, args.loop_iters - 1)
    row = train_row(name, ours, batches, getattr(ours, 'box_head', None), batch, device, precision, args.lr,
                    prime=True, optimizer_name=cfg.SOLVER.OPTIMIZER)
    row.steps_per_round = len(batches)
    return row


def test_net_samples(model_type, dataset):
    """The dataset's images as test_net's loader workers prepare them, in test_net's order."""
    roidb = JsonDataset(dataset).get_roidb()
    loader = build_test_loader(roidb, range(len(roidb)), cfg.DATA_LOADER.NUM_THREADS,
                               model_type.test_inputs())
    return [sample for sample, _ in loader]


def replayed_test_row(label, model_type, samples, model, device, precision, batch=1):
    """test_net's detection (model: as test_net holds it) on its own samples of a dataset
    (test_net_samples), taken in turn (one pass over all of them before timing, as test_net meets
    each size before most of its images; that pass's ms/image in info), `batch` consecutive images
    per call of the model type's batch detector as test_net's TEST.IMS_PER_BATCH gives them: the bare
    detector. ms per image."""
    detect = model_type.batch_detector()
    batches = [samples[i:i + batch] for i in range(0, len(samples), batch)]

    def detect_on(batch_samples):
        with autocast(device, precision):
            return detect(model, batch_samples)

    # The pass before the rounds, timed apart: what meeting each size costs in this process.
    first_pass_ms = 1000.0 * timed_pass(detect_on, batches, device) / len(samples)
    return Row('test', "{}, test_net's {} images replayed from memory".format(label, len(samples)),
               in_turn(detect_on, batches), len(samples) / len(batches),
               resident=lambda: model_tensors(model), graph_owners=lambda: [model], steps_per_round=len(batches),
               info={'images_per_call': batch, 'first_pass_ms_per_image': round(first_pass_ms, 3)})


def write_test_weights(model_type, path):
    """The model of model_type (its cfg's classes, seed 0) saved for test_net; returns it. A model with a box
    classifier (R-CNN) gets the loaded one, passing every RoI on 5 classes: its post-processing work
    then does not depend on the images."""
    model = build_ours(model_type, torch.device('cpu')).eval()
    if hasattr(model, 'box_outs'):
        set_loaded_classifier(*ours_box_layers(model), cfg.MODEL.NUM_CLASSES)
    torch.save({'model': model.state_dict()}, path)
    return model


def run_loops(args, model_type, device, precision, report, work):
    """train_net and test_net (--loop-parts) on real datasets vs their own inputs replayed from memory
    and synthetic rows of the same model, batch and size; their logs and outputs in the fresh
    directory work. The loops run first, each in its subprocess, then the other rows interleaved."""
    if args.catalog:
        dataset_catalog.register_catalog_file(args.catalog)
    parts = [{'train': RCNNTrainNetPart, 'test': TestNetPart}[name](args, model_type, precision, work)
             for name in args.loop_parts]
    timed = [row for part in parts for row in part.timed_rows(device)]
    run_interleaved(timed, args.rounds, args.iters, args.warmup, args.round_warmup, device)
    for part in parts:
        part.report(report)


class TrainNetPart:
    """train_net.py's run (made here) at `batch` images per step, then its batches replayed from memory;
    the ratio of train_net's images/s to theirs (target >= 0.9) and to the other rows given to report
    (bare steps of the same model)."""

    def __init__(self, args, model_type, precision, work, batch):
        self.args, self.model_type, self.precision, self.batch = args, model_type, precision, batch
        stats = json_stats(run_train_net(args, model_type, work, batch, precision))
        self.loop = Row('train', 'train_net.py on {} (json_stats time)'.format(' + '.join(args.train_dataset)), None,
                        batch, values=train_log_images_per_s(stats, batch, args.loop_warmup),
                        # json_stats 'mem': max_memory_allocated in MiB (0 off CUDA), the peak column
                        peaks_mib=[max(float(s.get('mem', 0)) for s in stats)],
                        info={'iters': args.loop_iters,
                              'data_time_fraction': train_log_data_fraction(stats, args.loop_warmup),
                              'log': os.path.join(work, 'train_net.log')})

    def timed_rows(self, device):
        self.replayed = replayed_train_row(self.args, self.model_type, self.batch, device, self.precision)
        return [self.replayed]

    def report(self, report, others=(), **loop_context):
        """The two rows and the ratios; others: (ratio name, row) pairs, train_net's images/s over the row's."""
        context = {'batch': self.batch, 'precision': self.precision}
        report.add_row(self.loop, size=None, **loop_context, **context)
        report.add_row(self.replayed, size=None, **context)
        # Not interleaved (a subprocess cannot be): ratios of the medians. Against the loop's own inputs
        # replayed from memory, the loop's cost (loading, augmentation, logging) is all that differs.
        loop = spread(self.loop.values)['median']
        for name, row in [('train_net / its batches replayed from memory, images/s (target >= 0.90)', self.replayed),
                          *others]:
            report.add_ratio(name, [loop / spread(row.values)['median']])


class RCNNTrainNetPart(TrainNetPart):
    """TrainNetPart at the first --batch, with a synthetic batch of the dataset's median size as a third row."""

    def __init__(self, args, model_type, precision, work):
        self.shape = dataset_shape(args.train_dataset, cfg.TRAIN.SCALES[0], cfg.TRAIN.MAX_SIZE)
        self.size = [self.shape['resized_height'], self.shape['resized_width']]
        super().__init__(args, model_type, precision, work, args.batch[0])

    def timed_rows(self, device):
        self.synthetic = ours_train_row(self.args, self.model_type, self.batch, *self.size,
                                        max(1, round(self.shape['boxes_per_image'])), device, self.precision)
        self.synthetic.name += ', synthetic {}x{}'.format(*self.size)
        return super().timed_rows(device) + [self.synthetic]

    def report(self, report):
        # Against one synthetic size, the dataset's mix of sizes counts too.
        super().report(report, [('train_net / synthetic at the median size, images/s (size mix included)',
                                 self.synthetic)],
                       train_dataset=dict(self.shape, name=' + '.join(self.args.train_dataset)))
        report.add_row(self.synthetic, size=self.size, batch=self.batch, precision=self.precision)


class TestNetPart:
    """test_net.py's run on weights written here (made here), then its images replayed from memory and
    a synthetic image of the dataset's median size; the ratios of test_net's ms per image to theirs."""

    def __init__(self, args, model_type, precision, work):
        self.args, self.model_type = args, model_type
        self.shape = dataset_shape(args.test_dataset, cfg.TEST.SCALE, cfg.TEST.MAX_SIZE)
        self.size = [self.shape['height'], self.shape['width']]
        weights = os.path.join(work, 'loaded_weights.pth')
        self.loaded = write_test_weights(model_type, weights)
        self.ms, running_mean_ms, detector_ms, rest_ms = test_log_ms_per_image(run_test_net(args, work, weights))
        self.loop = Row('test', 'test_net.py on {} (im_detect lines), loaded weights'.format(args.test_dataset), None,
                        1, values=[self.ms], info={'running_mean_ms_incl_first_images': running_mean_ms,
                                                   'detector_ms': detector_ms, 'rest_of_loop_ms': rest_ms,
                                                   'log': os.path.join(work, 'test_net.log')})

    def timed_rows(self, device):
        args, precision = self.args, self.args.loop_test_precision
        self.replayed = replayed_test_row('ours, loaded weights', self.model_type,
                                          test_net_samples(self.model_type, args.test_dataset),
                                          copy.deepcopy(self.loaded).to(device), device, precision)
        self.synthetic = ours_test_row('ours, loaded weights, synthetic {}x{} image resized as in test_net'.format(
            *self.size), self.model_type, self.loaded.to(device), synthetic_images(1, *self.size, seed=1)[0], device,
            precision, {})
        return [self.replayed, self.synthetic]

    def report(self, report):
        precision = self.args.loop_test_precision
        report.add_row(self.loop, batch=1, precision="test_net's own", size=None,
                       test_dataset=dict(self.shape, name=self.args.test_dataset))
        report.add_row(self.replayed, batch=1, precision=precision, size=None)
        report.add_row(self.synthetic, batch=1, precision=precision, size=self.size)
        report.add_ratio('test_net / its images replayed from memory, ms per image (target <= 1.15)',
                         [self.ms / spread(self.replayed.values)['median']])
        report.add_ratio('test_net / synthetic at the median size, ms per image (size mix and content included)',
                         [self.ms / spread(self.synthetic.values)['median']])
