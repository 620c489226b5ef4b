"""--mode startup: how soon the loops users run give their first result, and test_net on COCO val's
mix of image sizes, for the model of --cfg or of each --startup-cfgs (any MODEL.TYPE).

A dataset of --startup-images JPEGs is written with the sizes of COCO val (coco_val_sizes.py,
sampled by image_sizes.sample_sizes) and --boxes random boxes per image. Each round runs, as
subprocesses (a fresh process each: nothing compiled, captured or autotuned by an earlier row
helps, except what the tools themselves cache on disk):
  test_net.py on the dataset, read from its log and stopped before its evaluation: model loaded ->
      first detection (its first im_detect line), the whole run (`Total inference time`, model
      loading included) per image, and the steady ms/image after image LOOP_TEST_WARMUP_IMAGES;
  train_net.py on the dataset from random init, read from its log up to its first json_stats line
      and then stopped: first batch -> first training iteration done;
then one round of the bare detector in this process: the model as test_net loads it, on the same
images prepared in advance and replayed from memory, after one pass over them (timed apart as its
first_pass_ms_per_image: what meeting each size costs without the loader). The ratios pair each
round's test_net with that round's bare detector.
"""
import json
import os

import cv2
import numpy as np

from detectron.core.config import cfg
from detectron.core.test_engine import load_test_model
from detectron.datasets import dataset_catalog

from . import coco_val_sizes
from .image_sizes import sample_sizes
from .logs import (
    LOOP_TEST_WARMUP_IMAGES,
    json_stats,
    run_logged,
    test_log_first_image_s,
    test_log_inference_timed,
    test_log_ms_per_image,
    test_log_total_inference_s,
    train_log_first_iteration_s,
)
from .loops import dataset_arg, replayed_test_row, test_net_samples, write_test_weights
from .timing import Row, per_round_ratios, run_interleaved

DATASET = 'benchmark_coco_val_sizes'
JPEG_QUALITY = 90


def write_sized_dataset(directory, sizes, num_classes, boxes, seed=0):
    """JPEGs of the given (height, width) sizes (smooth random content, which compresses and decodes
    like a photograph rather than like noise) and a COCO annotation file with `boxes` random boxes
    per image over categories 1..num_classes; returns (image directory, annotation file)."""
    rng = np.random.RandomState(seed)
    image_dir = os.path.join(directory, 'images')
    os.makedirs(image_dir, exist_ok=True)
    images, annotations = [], []
    for image_id, (h, w) in enumerate(sizes, 1):
        coarse = rng.randint(0, 256, size=(h // 32 + 2, w // 32 + 2, 3)).astype(np.uint8)
        image = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
        file_name = '{:06d}.jpg'.format(image_id)
        cv2.imwrite(os.path.join(image_dir, file_name), image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        images.append({'id': image_id, 'file_name': file_name, 'height': h, 'width': w})
        for _ in range(boxes):
            bw, bh = rng.uniform(16, [w / 2, h / 2])
            x, y = rng.uniform(0, [w - bw, h - bh])
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id, 'iscrowd': 0,
                                'category_id': int(rng.randint(1, num_classes + 1)), 'area': float(bw * bh),
                                'bbox': [float(x), float(y), float(bw), float(bh)],
                                'segmentation': [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]})
    categories = [{'id': k, 'name': 'class{}'.format(k)} for k in range(1, num_classes + 1)]
    ann_file = os.path.join(directory, 'annotations.json')
    with open(ann_file, 'w') as f:
        json.dump({'images': images, 'annotations': annotations, 'categories': categories}, f)
    return image_dir, ann_file


def write_catalog(directory, image_dir, ann_file):
    """A catalog file naming the dataset for the subprocesses; registered here too."""
    path = os.path.join(directory, 'catalog.json')
    with open(path, 'w') as f:
        json.dump({DATASET: {'image_directory': image_dir, 'annotation_file': ann_file}}, f)
    dataset_catalog.register_catalog_file(path)
    return path


def tool_opts(args, catalog, output_dir):
    """The overrides both tools get: the user's, one process, the dataset's catalog, a fresh OUTPUT_DIR."""
    return list(args.opts) + ['NUM_GPUS', '1', 'DATASET_CATALOG', catalog, 'OUTPUT_DIR', output_dir]


def test_net_run(args, cfg_file, catalog, weights, work):
    """test_net on the dataset, stopped once its inference is timed: (model loaded -> first detection s,
    Total inference time s, steady ms/image). Its evaluation is not timed, and the benchmark's model
    keeps 100 boxes on every image, so pycocotools' evaluation would take minutes of every run."""
    output_dir = os.path.join(work, 'test')
    log = run_logged('test_net.py', ['-c', os.path.abspath(cfg_file)] + tool_opts(args, catalog, output_dir) + [
        'TEST.DATASETS', dataset_arg(DATASET), 'TEST.WEIGHTS', weights], os.path.join(work, 'test_net.log'),
        stop_when=test_log_inference_timed)
    return test_log_first_image_s(log), test_log_total_inference_s(log), test_log_ms_per_image(log)[0]


def first_iteration_logged(log_text):
    return any(int(s['iter']) == 0 for s in json_stats(log_text))


def train_net_run(args, cfg_file, catalog, work):
    """train_net on the dataset from random init, stopped after its first json_stats line: first
    batch -> first iteration done, s. The config's own learning rate: its first loss comes before any
    update, and a typed SOLVER.BASE_LR would contradict a CenterNet config's CENTERNET.LR."""
    output_dir = os.path.join(work, 'train')
    log = run_logged('train_net.py', ['-c', os.path.abspath(cfg_file), '--skip-test']
                     + tool_opts(args, catalog, output_dir) + [
                         'TRAIN.DATASETS', dataset_arg(DATASET), 'TRAIN.WEIGHTS', "''"],
                     os.path.join(work, 'train_net.log'), stop_when=first_iteration_logged)
    return train_log_first_iteration_s(json_stats(log))


def startup_rows(model, test_runs, train_firsts, bares, num_images):
    """The rows and (name, per-round ratios) of one model (a label) from the rounds' (first detection
    s, total s, steady ms/image) of test_net, train_net's first iterations and the bare detector's rows
    (one image per call; then, with TEST.IMS_PER_BATCH > 1, test_net's batch per call)."""
    firsts, totals, steadies = (list(v) for v in zip(*test_runs))
    whole = [1000.0 * total / num_images for total in totals]
    mixed = '{}: test_net on {} images of COCO val sizes'.format(model, num_images)
    for bare in bares:
        bare.name = '{}: {}'.format(model, bare.name)
    rows = [
        Row('startup', '{}: test_net, model loaded -> first detection'.format(model), None, 1, values=firsts),
        Row('startup', '{}: train_net, first batch -> first iteration done'.format(model), None, 1,
            values=train_firsts),
        Row('test', mixed + ', whole run (Total inference time, model loading included) / images', None, 1,
            values=whole, info={'total_s': float(np.median(totals))}),
        Row('test', mixed + ', steady (after image {})'.format(LOOP_TEST_WARMUP_IMAGES), None, 1, values=steadies),
        *bares]
    ratios = []
    for bare in bares:
        calls = bare.info.get('images_per_call', 1)
        per_call = 'the bare detector' + (' at {} images per call'.format(calls) if calls > 1 else '')
        ratios += [('{}: test_net whole run / (images x {} ms/image) (target <= 1.3)'.format(model, per_call),
                    per_round_ratios(whole, bare.values)),
                   ('{}: test_net steady / {}, ms per image (target <= 1.3)'.format(model, per_call),
                    per_round_ratios(steadies, bare.values))]
    return rows, ratios


def bare_detector_rows(model_type, weights, device):
    """The bare detector (the model as test_net loads it) on the dataset's images, one per call; with
    TEST.IMS_PER_BATCH > 1 also that many per call, as test_net gives them."""
    model = load_test_model(model_type, weights, device)
    samples = test_net_samples(model_type, DATASET)
    label = 'the bare detector (as test_net loads it)'
    rows = [replayed_test_row(label, model_type, samples, model, device, 'fp32')]
    if cfg.TEST.IMS_PER_BATCH > 1:
        rows.append(replayed_test_row('{}, TEST.IMS_PER_BATCH {} per call'.format(label, cfg.TEST.IMS_PER_BATCH),
                                      model_type, samples, model, device, 'fp32', batch=cfg.TEST.IMS_PER_BATCH))
    return rows


def run_startup(args, model_type, cfg_file, device, report, work):
    """Start-up and mixed-size rows of cfg_file's model (the global cfg finished from it, model_type
    bound to it), --rounds rounds, into report; datasets, weights, logs and outputs in the fresh
    directory work."""
    sizes = sample_sizes(coco_val_sizes.SIZES, args.startup_images)
    num_classes = model_type.output_classes() - 1
    catalog = write_catalog(work, *write_sized_dataset(work, sizes, num_classes, args.boxes))
    weights = args.startup_weights or os.path.join(work, 'weights.pth')
    if not args.startup_weights:
        write_test_weights(model_type, weights)
    test_runs, train_firsts, bares = [], [], []
    for k in range(args.rounds):
        round_dir = os.path.join(work, 'round{}'.format(k + 1))
        os.makedirs(round_dir)
        test_runs.append(test_net_run(args, cfg_file, catalog, weights, round_dir))
        train_firsts.append(train_net_run(args, cfg_file, catalog, round_dir))
        if not bares:  # after the first round's tools, whose start-up then meets nothing cached by it
            bares = bare_detector_rows(model_type, weights, device)
        run_interleaved(bares, rounds=1, iters=None, warmup=0, round_warmup=args.round_warmup, device=device)
    rows, ratios = startup_rows(os.path.basename(cfg_file), test_runs, train_firsts, bares, len(sizes))
    context = dict(precision="the tools' own", cfg=cfg_file, images=len(sizes), sizes_from=coco_val_sizes.SOURCE)
    for row in rows:
        report.add_row(row, **context)
    for name, values in ratios:
        report.add_ratio(name, values)
