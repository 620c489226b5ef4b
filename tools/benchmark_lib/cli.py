r"""Speed of our Faster R-CNN against torchvision's at equal work, in one run on one device.

Our model comes from --cfg (default: KL-Loss's R-50-FPN 2x config: FREEZE_AT 2, frozen affine
norm). The torchvision model it is compared with does the same work: fasterrcnn_resnet50_fpn's
architecture with FrozenBatchNorm2d and 3 trainable backbone layers (conv1 and layer1 frozen, i.e.
what a user with ImageNet weights trains), built with weights=None since nothing is downloaded.
Both get the same synthetic images (--height x --width, no resize), the same boxes per image,
batch, precision and optimizer (Detectron's momentum SGD with its parameter groups), and the RPN /
RoI settings of our cfg. torchvision with BatchNorm in all stages (weights=None's default, the old
benchmark's baseline) is kept as an extra row labelled as the unequal comparison it is. With a Mask
R-CNN --cfg (MODEL.MASK_ON) torchvision's model is maskrcnn_resnet50_fpn (the same mask head), both
train on the filled boxes as masks, and both end inference with one COCO RLE per detection (ours
segm_results; torchvision's pasted masks binarised at 0.5 and encoded as its coco_eval reference does). With a
Keypoint R-CNN --cfg (MODEL.KEYPOINTS_ON) torchvision's model is keypointrcnn_resnet50_fpn (Detectron's v1convX
keypoint head to 56 x 56 heatmaps), both train on the same KRCNN.NUM_KEYPOINTS visible keypoints drawn inside
each box, and both end inference with keypoints for every detection.

Sections (--mode):
  train    images/s of full training steps (forward, losses, backward, SGD step), per --batch;
  test     ms/image at batch 1 with post-processing: im_detect_all(model_type, model, im) for ours,
           torchvision's model([x]); 6-class models whose box classifier is biased so that a
           "realistic" few hundred candidates per class, or a "loaded" 1000 RoIs x 5 classes, reach
           post-processing; ours with STD_NMS False and True (variance voting);
  profile  a torch.profiler trace of a few training steps of ours and torchvision's at the first
           --batch, and with test of a few realistic inferences (ours with STD_NMS False), summarised
           (--profile is the same as adding it to --mode);
  loops    tools/train_net.py and tools/test_net.py run as subprocesses on real datasets, timed
           from their own logs, next to synthetic rows of the same model, batch, size and precision.
  centernet  with a CenterNet --cfg (centernet_rows.py): the training step at the first --centernet-batch,
           for resdcn_18 beside a plain PyTorch port of CenterNet's (centernet_plain.py) on the same
           batch, and inference at batch 1 and at the second --centernet-batch; with loops (--loop-parts
           train) also train_net at that batch and its batches replayed, the ratios to both;
  retinanet  with a RetinaNet --cfg (retinanet_rows.py): training images/s at the first --batch beside
           torchvision's retinanet_resnet50_fpn at equal work (FrozenBN, layer2-4 trainable, P6 on C5, 9
           anchors, our RETINANET settings), and inference ms/image of both with every class score loaded
           above INFERENCE_TH (each level gives PRE_NMS_TOP_N candidates to the NMS); with profile
           also the four rows' profiles;
  voting   Detectron's box_results_with_nms_and_limit on the host, STD_NMS True (variance voting) and
           False, on synthetic head outputs of one image (--voting-case, voting_rows.py);
  startup  for any model type (startup.py): test_net's model loaded -> first detection and train_net's
           first batch -> first iteration, each in a fresh process, and test_net's whole run and
           steady state on COCO val's mix of image sizes against the bare detector on the same images;
  demo     the CPU demos (demo_rows.py): for each of --demo-cfgs (default --cfg) in turn, the user's
           `tools/train_net.py --cfg <config>` (training and test) run once in a fresh OUTPUT_DIR with the
           KEY VALUE overrides; minutes of the whole run, seconds per iteration, the test's seconds, the
           final APs, the threads and the CPU (model, AVX-512 / AMX flags). Not in rounds: one run each.
Rows are timed in interleaved rounds (ours, torchvision, ours, ...): each value is the median over
--rounds with min and max, each ratio the median of the per-round ratios. Prints one JSON line per
row and a Markdown table (BENCHMARKS.md describes every row). Examples:
    python tools/benchmark.py --mode train test --batch 2 16
    python tools/benchmark.py --mode profile
    python tools/benchmark.py --mode loops --catalog catalog.json --train-dataset coco_tiny_train \
        --test-dataset coco_tiny_val
    python tools/benchmark.py --mode startup --cfg configs/centernet/ctdet_coco_resdcn18.yaml
    python tools/benchmark.py --mode centernet loops --loop-parts train --cfg configs/centernet/ctdet_coco_resdcn18.yaml \
        --catalog catalog.json --train-dataset coco_tiny_train coco_tiny_train --centernet-batch 32
    python tools/benchmark.py --mode demo --demo-cfgs configs/getting_started/shapes_demo_R-18-FPN.yaml \
        configs/getting_started/shapes_demo_mask_R-18-FPN.yaml
    python tools/benchmark.py --mode train test --batch 2 --precision bf16 \
        --cfg configs/12_2017_baselines/e2e_keypoint_rcnn_R-50-FPN_1x.yaml    # Keypoint R-CNN vs torchvision
    python tools/benchmark.py --mode retinanet --cfg configs/12_2017_baselines/retinanet_R-50-FPN_1x.yaml
    python tools/benchmark.py --height 256 --width 256 --iters 2 --rounds 2    # CPU smoke run
Learning rate: --lr 0 by default. From random init a frozen-norm R-50 diverges within a few dozen
steps (BENCHMARKS.md) and NaN losses would change what top-k and NMS do; lr 0 keeps all the
arithmetic of a step and the losses finite. train_net (--mode loops) refuses lr 0, so its run uses
LOOP_MIN_LR instead: the same arithmetic, weights that move by nothing measurable.
"""
import argparse
import os
import tempfile

import torch

from detectron.core.config import adopt_cfg, cfg
from detectron.core.config_finalize import finalize_cfg
from detectron.modeling import model_builder
from detectron.utils.errors import ConfigValueError

from .centernet_rows import run_centernet
from .demo_rows import check_demo_args, run_demos
from .loops import run_loops
from .profiling import profile_test_rows, profile_train_rows
from .rcnn_rows import build_test_rows, build_train_rows, train_ratios
from .report import Report, run_meta
from .retinanet_rows import run_retinanet
from .startup import run_startup
from .voting_rows import VOTING_CASES, run_voting
from .timing import PRECISIONS, cudnn_autotuning, free_device_memory, per_round_ratios, run_interleaved


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cfg', default='configs/e2e_faster_rcnn_R-50-FPN_2x.yaml')
    parser.add_argument('--mode', nargs='+', default=['train', 'test'],
                        choices=['train', 'test', 'profile', 'loops', 'centernet', 'retinanet', 'startup', 'voting', 'demo'])
    parser.add_argument('--profile', action='store_true', help='add the profile section')
    parser.add_argument('--precision', choices=sorted(PRECISIONS), default=None,
                        help='autocast dtype; default bf16 on CUDA, fp32 on the CPU')
    parser.add_argument('--height', type=int, default=800)
    parser.add_argument('--width', type=int, default=1333)
    parser.add_argument('--batch', type=int, nargs='+', default=[2], help='images per training step (one row set each)')
    parser.add_argument('--boxes', type=int, default=8, help='ground-truth boxes per image')
    parser.add_argument('--iters', type=int, default=20, help='timed steps per row and round')
    parser.add_argument('--warmup', type=int, default=5, help='untimed steps per row before the first round')
    parser.add_argument('--round-warmup', type=int, default=1, help='untimed steps per row at the start of a round')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--lr', type=float, default=0.0, help='learning rate of the training steps (see above)')
    parser.add_argument('--realistic-per-class', type=int, default=300,
                        help='candidates per class of the realistic inference case (at most a third of the RoIs)')
    parser.add_argument('--profile-steps', type=int, default=5)
    parser.add_argument('--centernet-batch', type=int, nargs='+', default=[32, 64],
                        help='--mode centernet (with a CenterNet --cfg): training batch, then the inference batch')
    parser.add_argument('--checkpoint-activations-row', action='store_true',
                        help='--mode centernet: also time the training step with TRAIN.CHECKPOINT_ACTIVATIONS True '
                             '(images/s and peak memory next to the plain step)')
    parser.add_argument('--trace-dir', default=None, help='also write the profiler traces (chrome JSON) here')
    parser.add_argument('--voting-case', choices=sorted(VOTING_CASES), default='loaded',
                        help='--mode voting: the synthetic head outputs (voting_rows.VOTING_CASES)')
    loops = parser.add_argument_group('loops section')
    loops.add_argument('--loop-parts', nargs='+', choices=['train', 'test'], default=['train', 'test'],
                       help='which loops run: train_net (needs --train-dataset) and / or test_net (--test-dataset)')
    loops.add_argument('--train-dataset', nargs='+', default=None,
                       help="train_net's TRAIN.DATASETS (several names: their images together)")
    loops.add_argument('--test-dataset', default=None)
    loops.add_argument('--catalog', default=None, help='dataset catalog file (DATASET_CATALOG)')
    loops.add_argument('--loop-iters', type=int, default=200,
                       help="train_net's iterations (SOLVER.MAX_ITER; CenterNet: whole epochs, stopped after these)")
    loops.add_argument('--loop-warmup', type=int, default=60,
                       help='json_stats lines logged before this iteration are warm-up')
    loops.add_argument('--loop-test-precision', choices=sorted(PRECISIONS), default='fp32',
                       help="precision of the synthetic row compared with test_net (test_net uses no autocast)")
    loops.add_argument('--loop-dir', default=None,
                       help='where the loops and start-up write datasets, logs and outputs (default: a temp dir)')
    startup = parser.add_argument_group('startup section (any model type)')
    startup.add_argument('--startup-images', type=int, default=500,
                         help='images of the COCO-val-sized dataset test_net and train_net run on')
    startup.add_argument('--startup-cfgs', nargs='+', default=None,
                         help='the models measured in turn (default --cfg); the KEY VALUE overrides apply to each')
    startup.add_argument('--startup-weights', default=None,
                         help="test_net's TEST.WEIGHTS (default: the model's random initialisation, R-CNN's box "
                              'classifier loaded)')
    demo = parser.add_argument_group('demo section (the CPU demos)')
    demo.add_argument('--demo-cfgs', nargs='+', default=None,
                      help='the demo configs run in turn, one row each (default --cfg); the KEY VALUE overrides '
                           'apply to each; their directories under --loop-dir if given')
    parser.add_argument('opts', nargs=argparse.REMAINDER,
                        help='config overrides KEY VALUE ... (also passed to the loops); after a list option '
                             '(--mode, --batch) separate them with --')
    args = parser.parse_args(argv)
    if args.opts[:1] == ['--']:
        args.opts = args.opts[1:]
    if args.profile and 'profile' not in args.mode:
        args.mode.append('profile')
    if 'loops' in args.mode:
        if 'centernet' in args.mode and args.loop_parts != ['train']:
            raise ConfigValueError('--mode centernet loops runs the train_net loop only: add --loop-parts train')
        for part, dataset in (('train', args.train_dataset), ('test', args.test_dataset)):
            if part in args.loop_parts and not dataset:
                raise ConfigValueError('--mode loops with --loop-parts {0} needs --{0}-dataset NAME'.format(part))
    if args.demo_cfgs and 'demo' not in args.mode:
        raise ConfigValueError('--demo-cfgs is read by --mode demo only; add demo to --mode')
    if 'demo' in args.mode:
        check_demo_args(args)
    return args


def main(argv):
    args = parse_args(argv)
    defaults = cfg.clone()
    finalize_cfg(args.cfg, args.opts)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if device.type == 'cuda':
        torch.backends.cudnn.benchmark = True  # both sides of the comparisons with torchvision
    precision = args.precision or ('bf16' if device.type == 'cuda' else 'fp32')
    report = Report(run_meta(argv, device))
    timing = dict(rounds=args.rounds, iters=args.iters, warmup=args.warmup, round_warmup=args.round_warmup,
                  device=device)
    if 'demo' in args.mode:
        run_demos(args, report, lambda: work_dir(args, 'demo'))
    if 'startup' in args.mode:
        run_startup_section(args, device, report, defaults)
    model_type = model_builder.build_model_type(cfg)  # --cfg's, finished (anew after the startup section)
    if 'voting' in args.mode:
        run_voting(args, model_type, report, timing)
    if 'centernet' in args.mode:
        run_centernet(args, model_type, precision, report, timing, lambda: work_dir(args, 'loops'))
    elif 'retinanet' in args.mode:
        run_retinanet(args, model_type, precision, report, timing)
    elif set(args.mode) & {'train', 'test', 'profile', 'loops'}:
        run_rcnn_sections(args, model_type, precision, report, timing)
    print('\n' + report.markdown(), flush=True)
    return report


def run_startup_section(args, device, report, defaults):
    """--mode startup for each of --startup-cfgs (default --cfg) in turn, the cfg finished anew from
    the defaults for each; then --cfg's again for the other sections."""
    cfg_files = args.startup_cfgs or [args.cfg]
    for cfg_file in cfg_files:
        finalize_anew(defaults, cfg_file, args.opts)
        model_type = model_builder.build_model_type(cfg)
        # Its in-process bare detector autotunes cuDNN as test_net does: as the config says.
        with cudnn_autotuning(cfg.CUDNN_BENCHMARK):
            run_startup(args, model_type, cfg_file, device, report, work_dir(args, 'startup'))
        free_device_memory(device)
    if cfg_files != [args.cfg]:
        finalize_anew(defaults, args.cfg, args.opts)


def finalize_anew(defaults, cfg_file, opts):
    """The global cfg finished from cfg_file and opts over the defaults, as a fresh tool would."""
    adopt_cfg(defaults)
    cfg.defrost()
    finalize_cfg(cfg_file, opts)


def run_rcnn_sections(args, model_type, precision, report, timing):
    """--mode train / test / profile / loops with an R-CNN --cfg."""
    device = timing['device']
    if 'train' in args.mode or 'profile' in args.mode:
        for i, batch in enumerate(args.batch):
            rows = build_train_rows(args, model_type, batch, device, precision)
            context = dict(batch=batch, precision=precision, size=[args.height, args.width], boxes=args.boxes)
            if 'train' in args.mode:
                run_interleaved(rows, **timing)
                for row in rows:
                    report.add_row(row, **context)
                for name, numerator, denominator in train_ratios(rows):
                    report.add_ratio('{}, batch {}'.format(name, batch),
                                     per_round_ratios(numerator.values, denominator.values))
            if 'profile' in args.mode and i == 0:
                profile_train_rows(rows[:2], args, device, report, context)
            del rows
            free_device_memory(device)
    if 'test' in args.mode:
        rows, ratios = build_test_rows(args, model_type, device, precision)
        run_interleaved(rows, **timing)
        for row in rows:
            report.add_row(row, batch=1, precision=precision, size=[args.height, args.width])
        for name, numerator, denominator in ratios:
            report.add_ratio(name, per_round_ratios(numerator.values, denominator.values))
        if 'profile' in args.mode:
            profile_test_rows(rows, args, device, report)
        del rows, ratios
        free_device_memory(device)
    if 'loops' in args.mode:
        # The loops' in-process rows autotune cuDNN as train_net / test_net do: as the config says.
        with cudnn_autotuning(cfg.CUDNN_BENCHMARK):
            run_loops(args, model_type, device, precision, report, work_dir(args, 'loops'))


def work_dir(args, section):
    """A fresh directory for a section's datasets, logs and outputs (under --loop-dir if given): train_net
    would resume from a checkpoint left in its OUTPUT_DIR."""
    if args.loop_dir:
        os.makedirs(args.loop_dir, exist_ok=True)
    return tempfile.mkdtemp(prefix='benchmark_{}_'.format(section), dir=args.loop_dir)
