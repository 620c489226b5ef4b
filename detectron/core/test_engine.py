"""Test a model on TEST.DATASETS: detections per image, Detectron's detections.pkl, COCO evaluation.

Any model: the model type it is handed (model_builder.build_model_type, built once by the tool or
worker) prepares each image (in the loader workers) and turns the model's outputs into Detectron's
per-class `cls_boxes` (and `cls_segms` for a model with masks); this engine only shards, collects
and evaluates.

Single-process testing runs in this process. `--multi-gpu-testing` starts NUM_GPUS workers through
torch.distributed (or joins a torchrun job); each worker takes one contiguous range of images
(Detectron's np.array_split ranges, no padding, no duplicates), rank 0 merges the per-image results
in image order, writes detections.pkl and evaluates once, so the output equals single-process testing.
`--range S E` tests one slice and writes detection_range_S_E.pkl, like Detectron's child processes.
"""
import collections
import datetime
import logging
import os
import time

import torch

from detectron.checkpoint.download import cache_url
from detectron.checkpoint.weights_fit import check_weights_fit
from detectron.core import launch
from detectron.core.config import cfg, get_output_dir
from detectron.core.config_finalize import receive_cfg
from detectron.datasets import task_evaluation
from detectron.datasets.json_dataset import JsonDataset
from detectron.datasets.proposal_files import load_proposals
from detectron.modeling import model_builder
from detectron.ops import triton_cache
from detectron.roi_data.loader import build_test_loader
from detectron.roi_data.samplers import inference_ranges
from detectron.utils import comm
from detectron.utils.errors import ConfigValueError, DatasetError, raise_if_stopped
from detectron.utils.launcher_env import job_from_environment
from detectron.utils.logging import log_file
from detectron.utils.memory import out_of_memory_error
from detectron.utils.random_streams import preserved_random_streams
from detectron.utils.vis import write_vis_image

logger = logging.getLogger(__name__)

# With TEST.IMS_PER_BATCH > 1 a loader worker sends up to this many images at a time in one shared
# tensor: the main process then pays one receipt per group instead of one per image, most of the gain
# already at 8, while the shared memory in flight stays within workers x 2 x 8 images
# (BENCHMARKS.md, "Real loops").
LOADER_GROUP_MAX = 8


def run_inference(model_type, weights_file, ind_range=None, multi_gpu_testing=False):
    """Test weights_file, a model of model_type, on every TEST.DATASETS entry in turn (the cfg
    finished by finalize_cfg, which model_type is bound to); returns {dataset: {'box': metrics}}
    ({'box': ..., 'mask': ...} for a model with masks)."""
    if ind_range is not None:
        refuse_range_in_parallel(ind_range, multi_gpu_testing)
        if len(cfg.TEST.DATASETS) != 1:
            raise ConfigValueError('--range needs exactly one TEST.DATASETS entry, got {}; set TEST.DATASETS to '
                                   'the one dataset to slice'.format(cfg.TEST.DATASETS))
        name = cfg.TEST.DATASETS[0]
        dataset = JsonDataset(name)  # parsed once, for the check and the testing
        check_range(ind_range, dataset)
        output_dir = get_output_dir((name,), training=False)
        _, value = test_net(model_type, weights_file, name, output_dir, ind_range, dataset=dataset)
        model_type.test_results().save_range(value, output_dir, ind_range, cfg.dump())
        return {}
    results = collections.OrderedDict()
    # Nothing to test (TEST.DATASETS empty, as after a training-only run): no line about how.
    parallel = _parallel_testing(multi_gpu_testing) if cfg.TEST.DATASETS else False
    for name in cfg.TEST.DATASETS:
        output_dir = get_output_dir((name,), training=False)
        started = time.perf_counter()
        if parallel:
            detections = launch.launch(_test_worker, cfg.NUM_GPUS, args=(cfg.clone(), weights_file, name),
                                       backend=cfg.DIST_BACKEND)
        else:
            detections = test_net(model_type, weights_file, name, output_dir)[1]
        if detections is None:  # a non-zero rank of a launcher-started job: rank 0 evaluates
            continue
        # Detectron's test_net_on_dataset line: the whole testing of the dataset (all GPUs, model
        # loading and start-up included), before the evaluation
        logger.info('Total inference time: %.3fs', time.perf_counter() - started)
        results.update(_evaluate(model_type, name, detections, output_dir))
    if results:
        task_evaluation.log_copy_paste_friendly_results(results)
    return results


def refuse_range_in_parallel(ind_range, multi_gpu_testing):
    """--range tests one slice in one process (Detectron's child processes): with --multi-gpu-testing, or in a
    job of several processes that a launcher started, it would be ignored or tested by every rank at once."""
    job = job_from_environment()
    if multi_gpu_testing or (job is not None and job.world_size > 1):
        how = ('--multi-gpu-testing' if multi_gpu_testing else
               'a job of {} processes started by {}'.format(job.world_size, job.source))
        raise ConfigValueError('--range {} {} tests one slice of the images in one process and cannot be combined with '
                               '{}; drop --range to test every image on all processes, or run one process per '
                               'slice'.format(ind_range[0], ind_range[1], how))


def _parallel_testing(multi_gpu_testing):
    """Test on all ranks when asked, or whenever a launcher (torchrun/SLURM) started several processes."""
    job = job_from_environment()
    if job is not None and job.world_size > 1:
        if not multi_gpu_testing:
            logger.info('%d processes were started by %s: testing on all of them', job.world_size, job.source)
        return True
    if not multi_gpu_testing and cfg.NUM_GPUS > 1:
        logger.info('Testing in one process although NUM_GPUS is %d: pass --multi-gpu-testing to split '
                    'the images over the GPUs', cfg.NUM_GPUS)
    return multi_gpu_testing and cfg.NUM_GPUS > 1


def _test_worker(cfg_snapshot, weights_file, name):
    """One rank's contiguous range; returns the merged results on rank 0 and None elsewhere."""
    receive_cfg(cfg_snapshot)
    model_type = model_builder.build_model_type(cfg)
    output_dir = get_output_dir((name,), training=False)
    with log_file(cfg.OUTPUT_DIR, comm.get_rank()):  # as in train_worker
        return test_on_all_ranks(model_type, name, output_dir, weights_file=weights_file)


def test_on_all_ranks(model_type, name, output_dir, weights_file=None, model=None):
    """Every rank of the job tests its contiguous range of `name` (with weights_file loaded, or with
    model, already prepared for inference); returns the merged results (model_type.test_results()'s value)
    on rank 0 and None elsewhere (a collective)."""
    num_images = len(JsonDataset(name).get_image_ids())
    start, end = inference_ranges(num_images, comm.get_world_size())[comm.get_rank()]
    _, value = test_net(model_type, weights_file, name, output_dir, (start, end), model=model)
    gathered = comm.all_gather_object(value)
    if not comm.is_main_process():
        return None
    return model_type.test_results().merge(gathered)


def evaluate_during_training(model_type, model, iteration, output_dir):
    """TEST.EVAL_PERIOD's evaluation after `iteration` of the training model (unwrapped, on every rank):
    a test model built as test_net builds one, holding model's weights, tests each TEST.DATASETS entry
    on every rank; rank 0 evaluates into output_dir/iter<N>/<dataset>/. Returns {dataset: results} on
    every rank (a collective); the random streams of training are left as they were."""
    with preserved_random_streams():
        test_model = model_type.build()
        test_model.load_state_dict(model.state_dict())
        test_model = model_type.prepare_for_inference(test_model.to(comm.get_device()).eval())
        results = collections.OrderedDict()
        for name in cfg.TEST.DATASETS:
            dataset_dir = os.path.join(output_dir, 'iter{}'.format(iteration), name)
            os.makedirs(dataset_dir, exist_ok=True)
            detections = test_on_all_ranks(model_type, name, dataset_dir, model=test_model)
            if detections is not None:
                results.update(_evaluate(model_type, name, detections, dataset_dir))
    return comm.broadcast_object(results)


def _evaluate(model_type, name, results, output_dir):
    """Write the results' file and evaluate them (rank 0): {name: {task: metrics}}."""
    return model_type.test_results().evaluate(JsonDataset(name), results, output_dir, cfg.dump())


def load_test_model(model_type, weights_file, device):
    """The model of model_type with weights_file loaded, on device, in eval mode, prepared for
    inference by model_type."""
    torch.backends.cudnn.benchmark = cfg.CUDNN_BENCHMARK
    model = model_builder.checked_model(model_type)
    path = cache_url(weights_file, cfg.DOWNLOAD_CACHE)
    missing, unused = model_type.load_weights(model, path)
    check_weights_fit(model, path, missing, unused, model_type.name, testing=True)
    return model_type.prepare_for_inference(model.to(device).eval())


def test_net(model_type, weights_file, name, output_dir, ind_range=None, dataset=None, model=None):
    """Detect with model_type's model on the images of `name` (or its [start, end) slice); returns
    (roidb slice, results: model_type.test_results()'s value, e.g. (all_boxes, all_segms)). dataset: its
    JsonDataset when the caller has one already; model: the model to test, already prepared for inference,
    instead of loading weights_file. For a model that detects on precomputed proposals (a Fast R-CNN) each
    image's proposals from the file model_type.test_proposal_files() names go with it to the detector
    (sample 'proposals').

    Images are read and prepared by DATA_LOADER.NUM_THREADS loader workers while the model runs,
    and go to the model type's batch detector TEST.IMS_PER_BATCH at a time; with cfg.VIS the
    detections scoring at least VIS_TH are drawn into <output_dir>/vis. Every 10 images the log
    shows Detectron's `im_detect: ... i/n <det>s + <misc>s (eta: ...)`: mean seconds per image in
    the model's detector (network and post-processing: one call per batch here) and in the rest of
    the loop (waiting for the loader, storing, drawing); they add up to the wall time per image.
    """
    dataset = dataset or JsonDataset(name)
    dataset.check_model_classes(model_type.output_classes())
    # masks: ground truth checked before detection
    proposals = _test_proposals(model_type, name)
    roidb = dataset.get_roidb(segms=cfg.MODEL.MASK_ON, **proposals)
    total = len(roidb)
    if not total:  # COCO's evaluation would report AP -1 everywhere
        raise DatasetError('dataset {} ({}) lists no images: there is nothing to test; check TEST.DATASETS and '
                           'the annotation file'.format(name, dataset.annotation_file))
    start, end = ind_range if ind_range is not None else (0, total)
    # The loader's workers start reading images while the model loads.
    images = iter(build_test_loader(roidb, range(start, end), cfg.DATA_LOADER.NUM_THREADS,
                                    model_type.test_inputs(), group=min(cfg.TEST.IMS_PER_BATCH, LOADER_GROUP_MAX),
                                    timeout=cfg.DATA_LOADER.TIMEOUT_S, proposals=bool(proposals)))
    device = comm.get_device()
    triton_cache.start_key_hashing(device)
    model = model or load_test_model(model_type, weights_file, device)
    detect = model_type.batch_detector()
    stored = model_type.test_results().store(dataset.num_classes, roidb[start:end])
    detect_s = misc_s = 0.0
    last = time.perf_counter()
    done = 0
    for batch in _batches(images, cfg.TEST.IMS_PER_BATCH):
        before_detect = time.perf_counter()
        try:
            detections = detect(model, [sample for sample, _ in batch])
        except torch.OutOfMemoryError:
            raise out_of_memory_error(_images_named(batch, roidb, total), comm.get_rank(),
                                      comm.get_device(),
                                      model_type.memory_settings(training=False)) from None
        after_detect = time.perf_counter()
        for i, ((sample, index), result) in enumerate(zip(batch, detections), done):
            drawn = stored.add(i, result)
            if cfg.VIS and drawn is not None:
                _write_vis(output_dir, roidb[index]['image'], sample['image'], *drawn, dataset)
        now, detect_time = time.perf_counter(), after_detect - before_detect
        detect_s += detect_time
        misc_s += now - last - detect_time
        last = now
        previous, done = done, done + len(batch)
        raise_if_stopped()
        # Detectron's line after images 1, 11, 21, ... (the batch that holds one) and after the last.
        if previous == 0 or (done - 1) // 10 > (previous - 1) // 10 or done == end - start:
            eta = datetime.timedelta(seconds=int((detect_s + misc_s) / done * (end - start - done)))
            logger.info('im_detect: range [%d, %d] of %d: %d/%d %.3fs + %.3fs (eta: %s)',
                        start + 1, end, total, done, end - start, detect_s / done, misc_s / done, eta)
    return roidb[start:end], stored.value


def _test_proposals(model_type, name):
    """get_roidb's proposal arguments for dataset `name`: the proposal file model_type names for it (a Fast
    R-CNN's TEST.PROPOSAL_FILES entry, as Detectron's get_inference_dataset) with TEST.PROPOSAL_LIMIT."""
    files = model_type.test_proposal_files()
    if not files:
        return {}
    return {'proposals': load_proposals(files[name], cfg.DOWNLOAD_CACHE), 'proposal_limit': cfg.TEST.PROPOSAL_LIMIT}


def _batches(samples, size):
    """Lists of up to `size` consecutive (sample, index) pairs of the loader."""
    batch = []
    for item in samples:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _images_named(batch, roidb, total):
    """'image 3 of 500 (path)' or, for several, 'images 33-64 of 500 (TEST.IMS_PER_BATCH 32)'."""
    first, last = batch[0][1], batch[-1][1]
    if len(batch) == 1:
        return 'image {} of {} ({})'.format(first + 1, total, roidb[first]['image'])
    return 'images {}-{} of {} (TEST.IMS_PER_BATCH {})'.format(first + 1, last + 1, total, len(batch))


def check_range(ind_range, dataset):
    """--range START END must lie inside the JsonDataset (else test_net would index past its images)."""
    start, end = ind_range
    name, total = dataset.name, len(dataset.get_image_ids())
    if not 0 <= start < end <= total:
        raise ConfigValueError('--range {} {} does not fit dataset {} of {} images; use 0 <= START < END <= {}'
                               .format(start, end, name, total, total))


def _write_vis(output_dir, image_path, im, cls_boxes, cls_segms, cls_keyps, dataset):
    vis_dir = os.path.join(output_dir, 'vis')
    os.makedirs(vis_dir, exist_ok=True)
    write_vis_image(vis_dir, image_path, im, cls_boxes, dataset.classes, cfg.VIS_TH, cls_segms=cls_segms,
                    cls_keyps=cls_keyps, keypoint_names=dataset.keypoints)
