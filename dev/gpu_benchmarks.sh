#!/usr/bin/env bash
# The GPU runs recorded in BENCHMARKS.md (each section names its step), on any CUDA machine. Run from the
# repository root:
#   bash dev/gpu_benchmarks.sh setup <step> [<step> ...]
# Settings: dev/gpu_env.sh. The pass/fail checks are dev/gpu_checks.sh.
# Steps:
#   setup (dev/gpu_env.sh) bench kl_scaling coco_tiny_ap multi_gpu_test noisy_kl nms_speed shapes_multi_gpu_test (2 GPUs)
#   two_stage bench_before_after varvote_gpu centernet_bench dcn_layers centernet_coco_tiny demo_grid startup rcnn_loops rcnn_step_parts ...
#   checkpoint_activations_bench mask_train mask_test tta_test mask_bench mask_targets retinanet_bench retinanet_coco_tiny
#   mask_demo_grid train_loop_parts centernet_loop_parts
# bench_before_after also needs .old (the tree of the commit to compare with: git archive <commit> | tar -x -C .old).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"

bench() {
  python3 tools/benchmark.py --precision bf16 --mode train test --iters 20 --warmup 5 2>&1 | tee "$OUT/bench_bf16.log"
}

mask_bench() {  # Mask R-CNN (KL-Loss config) against torchvision's maskrcnn_resnet50_fpn at equal work: training step and inference with masks as RLEs
  python3 tools/benchmark.py --cfg configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml --precision bf16 --mode train test \
    --batch 2 --iters 20 --warmup 5 2>&1 | tee "$OUT/mask_bench_bf16.log"
}

mask_test() {  # run after mask_train: its KL model through test_net on coco_tiny val with STD_NMS True (masks on the voted boxes), 1 GPU then 2 (--multi-gpu-testing)
  local weights=/tmp/mask_e2e_mask_rcnn_R-50-FPN_2x_log/train/coco_tiny_train/generalized_rcnn/model_final.pth
  for n in 1 2; do
    python3 tools/test_net.py -c configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml --multi-gpu-testing "${KL[@]}" \
      TEST.WEIGHTS $weights STD_NMS True NUM_GPUS $n OUTPUT_DIR /tmp/mask_test_gpus$n > "$OUT/mask_test_gpus$n.log" 2>&1
    echo "mask test_net NUM_GPUS $n exit $?"
    grep -E "copypaste|Total inference time|im_detect:" "$OUT/mask_test_gpus$n.log" | tail -12
  done
}

kl_scaling() {  # KL-Loss R-CNN, bf16, 800x1333, 2 images per GPU, NUM_GPUS 1 then 2 (NCCL)
  for n in 1 2; do
    python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" NUM_GPUS $n SOLVER.MAX_ITER 100 \
      OUTPUT_DIR /tmp/kl_gpus$n > "$OUT/kl_train_gpus$n.log" 2>&1
    echo "NUM_GPUS $n exit $?"; grep json_stats "$OUT/kl_train_gpus$n.log" | tail -2
  done
}

retinanet_bench() {  # RetinaNet R-50-FPN against torchvision's retinanet_resnet50_fpn at equal work, bf16, 800x1333, batch 2: with our CUDA graphs (the defaults), then without (the eager step and detector)
  local cmd=(python3 tools/benchmark.py --mode retinanet --cfg configs/12_2017_baselines/retinanet_R-50-FPN_1x.yaml
             --batch 2 --height 800 --width 1333)
  "${cmd[@]}" 2>&1 | tee "$OUT/retinanet_bench.log"
  "${cmd[@]}" TRAIN.CUDA_GRAPHS False TEST.CUDA_GRAPHS False 2>&1 | tee "$OUT/retinanet_bench_eager.log"
}

retinanet_coco_tiny() {  # RetinaNet R-50-FPN (GN from scratch) 100 iterations on coco_tiny's JPEGs, bf16, 2 images per GPU, then test_net on val: the graphs in train_net's loop over many batch shapes; images/s = 2 / json_stats time
  python3 tools/train_net.py -c configs/12_2017_baselines/retinanet_R-50-FPN_1x.yaml "${KL[@]}" NUM_GPUS 1 \
    SOLVER.MAX_ITER 100 TRAIN.IMS_PER_BATCH 2 OUTPUT_DIR /tmp/retinanet_coco_tiny > "$OUT/retinanet_coco_tiny.log" 2>&1
  echo "retinanet exit $?"; grep json_stats "$OUT/retinanet_coco_tiny.log" | tail -2
  grep -E "copypaste: [0-9]|CUDA graph" "$OUT/retinanet_coco_tiny.log"
}

two_stage() {  # Detectron's two-stage R-CNN on coco_tiny, bf16, 800x1333, 2 images per GPU, 1 GPU: an RPN-only model (100 iterations) writes rpn_proposals.pkl for val and train, then a Fast R-CNN trains 100 iterations on them and tests; images/s = 2 / json_stats time
  local rpn=/tmp/two_stage_rpn files
  python3 tools/train_net.py -c configs/12_2017_baselines/rpn_R-50-FPN_1x.yaml "${KL[@]}" NUM_GPUS 1 SOLVER.MAX_ITER 100 \
    TRAIN.IMS_PER_BATCH 2 TEST.DATASETS "('coco_tiny_val', 'coco_tiny_train')" OUTPUT_DIR $rpn > "$OUT/two_stage_rpn.log" 2>&1
  echo "rpn exit $?"; grep json_stats "$OUT/two_stage_rpn.log" | tail -1; grep -E "AR@|copypaste: [0-9]" "$OUT/two_stage_rpn.log"
  files=$rpn/test/coco_tiny_%s/generalized_rcnn/rpn_proposals.pkl
  python3 tools/train_net.py -c configs/12_2017_baselines/fast_rcnn_R-50-FPN_1x.yaml "${KL[@]}" NUM_GPUS 1 SOLVER.MAX_ITER 100 \
    TRAIN.IMS_PER_BATCH 2 TRAIN.PROPOSAL_FILES "('$(printf $files train)',)" TEST.PROPOSAL_FILES "('$(printf $files val)',)" \
    OUTPUT_DIR /tmp/two_stage_fast > "$OUT/two_stage_fast.log" 2>&1
  echo "fast_rcnn exit $?"; grep json_stats "$OUT/two_stage_fast.log" | tail -2; grep "copypaste: [0-9]" "$OUT/two_stage_fast.log"
}

test_1_vs_2_gpus() {  # <config> <dataset> <overrides...>: 1-GPU and 2-GPU testing must give equal detections
  local cfg=$1 dataset=$2; shift 2
  python3 tools/test_net.py -c $cfg "$@" NUM_GPUS 1 OUTPUT_DIR /tmp/t1 > "$OUT/test_1gpu.log" 2>&1
  echo "1-GPU test exit $?"
  python3 tools/test_net.py -c $cfg --multi-gpu-testing "$@" NUM_GPUS 2 OUTPUT_DIR /tmp/t2 > "$OUT/test_2gpu.log" 2>&1
  echo "2-GPU test exit $?"
  DATASET=$dataset python3 - <<'PY' | tee "$OUT/test_equal.txt"
import os
import numpy as np
from detectron.utils.io import load_object
path = '/tmp/t{}/test/' + os.environ['DATASET'] + '/generalized_rcnn/detections.pkl'
a, b = (load_object(path.format(n))['all_boxes'] for n in (1, 2))
n = sum(len(d) for c in a for d in c)
same = all(np.shape(x) == np.shape(y) for ca, cb in zip(a, b) for x, y in zip(ca, cb))
diff = max((float(np.abs(np.asarray(x) - np.asarray(y)).max()) if len(x) else 0.0)
           for ca, cb in zip(a, b) for x, y in zip(ca, cb))
print('detections', n, 'same counts', same, 'max abs difference', diff, 'identical', same and diff == 0.0)
PY
}

multi_gpu_test() {  # run after coco_tiny_ap: its model tested on 1 GPU and on 2 GPUs
  test_1_vs_2_gpus configs/getting_started/shapes_demo_R-18-FPN.yaml coco_tiny_val \
    DATASET_CATALOG "$CATALOG" TEST.DATASETS "('coco_tiny_val',)" MODEL.NUM_CLASSES 81 FPN.RPN_ANCHOR_START_SIZE 32 \
    FPN.DIM 256 FAST_RCNN.MLP_HEAD_DIM 1024 TEST.SCALE 512 TEST.MAX_SIZE 853 TEST.RPN_PRE_NMS_TOP_N 1000 \
    TEST.RPN_POST_NMS_TOP_N 1000 TEST.WEIGHTS /tmp/coco_tiny_ap/train/coco_tiny_train/generalized_rcnn/model_final.pth
}

shapes_multi_gpu_test() {  # quick: the KL shapes model trained 300 iterations on 2 GPUs, tested on 1 and 2 GPUs
  local cfg=configs/getting_started/shapes_demo_R-18-FPN_kl.yaml
  python3 tools/train_net.py -c $cfg --skip-test NUM_GPUS 2 SOLVER.MAX_ITER 300 SOLVER.STEPS "[0, 200, 260]" \
    DATA_LOADER.NUM_THREADS 4 OUTPUT_DIR /tmp/shapes2 > "$OUT/shapes_train_2gpu.log" 2>&1
  echo "2-GPU training exit $?"; grep json_stats "$OUT/shapes_train_2gpu.log" | tail -1
  test_1_vs_2_gpus $cfg shapes_val DATA_LOADER.NUM_THREADS 4 \
    TEST.WEIGHTS /tmp/shapes2/train/shapes_noisy_train/generalized_rcnn/model_final.pth
  grep 'copypaste: [0-9]' "$OUT/test_1gpu.log" "$OUT/test_2gpu.log"
}

coco_tiny_ap() {  # a small GN body trained from scratch on coco_tiny train, tested on the same images
  python3 tools/train_net.py -c configs/getting_started/shapes_demo_R-18-FPN.yaml --multi-gpu-testing \
    DATASET_CATALOG $CATALOG NUM_GPUS 2 TRAIN.DATASETS "('coco_tiny_train',)" TEST.DATASETS "('coco_tiny_train',)" \
    MODEL.NUM_CLASSES 81 FPN.RPN_ANCHOR_START_SIZE 32 FPN.DIM 256 FAST_RCNN.MLP_HEAD_DIM 1024 \
    TRAIN.SCALES "(512,)" TRAIN.MAX_SIZE 853 TEST.SCALE 512 TEST.MAX_SIZE 853 TRAIN.IMS_PER_BATCH 4 \
    SOLVER.MAX_ITER 1500 SOLVER.STEPS "[0, 1000, 1300]" SOLVER.BASE_LR 0.02 \
    TRAIN.RPN_PRE_NMS_TOP_N 2000 TRAIN.RPN_POST_NMS_TOP_N 1000 TEST.RPN_PRE_NMS_TOP_N 1000 TEST.RPN_POST_NMS_TOP_N 1000 \
    SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16 DATA_LOADER.NUM_THREADS 6 TRAIN.SNAPSHOT_ITERS 100000 \
    OUTPUT_DIR /tmp/coco_tiny_ap > "$OUT/coco_tiny_ap.log" 2>&1
  echo "coco_tiny exit $?"; grep -E "json_stats" "$OUT/coco_tiny_ap.log" | tail -1; grep copypaste "$OUT/coco_tiny_ap.log"
}

nms_speed() {  # matrix batched NMS vs torchvision's batched_nms on RPN-like boxes (equality + time)
  python3 - <<'PY' 2>&1 | tee "$OUT/nms_speed.txt"
import time, torch, torchvision
from detectron.ops import nms as nms_ops
torch.manual_seed(0)
dev = 'cuda'
# RPN-like: 2 images x 5 levels, 2000 proposals each, clustered around objects
n = 20000
centers = torch.rand(40, 2, device=dev) * 1000
xy = centers[torch.randint(0, 40, (n,), device=dev)] + torch.randn(n, 2, device=dev) * 30
boxes = torch.cat([xy, xy + 20 + torch.rand(n, 2, device=dev) * 150], 1)
scores = torch.randperm(n, device=dev).float() / n
idxs = torch.randint(0, 10, (n,), device=dev)
ref = torchvision.ops.batched_nms(nms_ops._plus_one_corners_t(boxes), scores, idxs, 0.7)
got = nms_ops.matrix_batched_nms_t(boxes, scores, idxs, 0.7)
print('equal on CUDA:', torch.equal(ref, got), ref.numel())
# The production path: Detectron's IoU >= 0.7 rule through torchvision's threshold
ref_ge = torchvision.ops.batched_nms(nms_ops._plus_one_corners_t(boxes), scores, idxs, nms_ops.torchvision_nms_thresh(0.7))
print('batched_nms_t equal on CUDA:', torch.equal(ref_ge, nms_ops.batched_nms_t(boxes, scores, idxs, 0.7)), ref_ge.numel())
for name, fn in [('torchvision', lambda: torchvision.ops.batched_nms(nms_ops._plus_one_corners_t(boxes), scores, idxs, 0.7)),
                 ('matrix', lambda: nms_ops.matrix_batched_nms_t(boxes, scores, idxs, 0.7))]:
    for _ in range(3): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): fn()
    torch.cuda.synchronize(); print(name, 'ms', round((time.perf_counter() - t) / 20 * 1000, 2))
PY
}

noisy_kl_run() {  # one training on shapes_noisy_train (method base|xyxy|kl, seed), tested on clean shapes_val
  local method=$1 seed=$2 cfg=configs/getting_started/shapes_demo_R-18-FPN_noisy_baseline.yaml extra=()
  [ "$method" = kl ] && cfg=configs/getting_started/shapes_demo_R-18-FPN_kl.yaml
  [ "$method" = xyxy ] && extra=(XYXY True)  # smooth-L1 with the KL model's edge coding
  local dir=/tmp/noisy_${method}_$seed log=$OUT/noisy/${method}_$seed.log
  OMP_NUM_THREADS=1 python3 tools/train_net.py -c $cfg RNG_SEED $seed DATA_LOADER.NUM_THREADS 1 \
    OUTPUT_DIR $dir "${extra[@]}" $NOISY_OPTS > $log 2>&1
  echo "$method $seed $(grep 'copypaste: [0-9]' $log | tail -1 | awk '{print $NF}')" >> $OUT/noisy/results.txt
  if [ "$method" = kl ]; then  # the same KL model without variance voting
    OMP_NUM_THREADS=1 python3 tools/test_net.py -c $cfg STD_NMS False DATA_LOADER.NUM_THREADS 1 \
      TEST.WEIGHTS $dir/train/shapes_noisy_train/generalized_rcnn/model_final.pth OUTPUT_DIR ${dir}_novote \
      > $OUT/noisy/kl_novote_$seed.log 2>&1
    echo "kl_novote $seed $(grep 'copypaste: [0-9]' $OUT/noisy/kl_novote_$seed.log | tail -1 | awk '{print $NF}')" \
      >> $OUT/noisy/results.txt
  fi
}

# KL-Loss + variance voting vs smooth-L1 (Detectron's coding, and XYXY as the KL model) on shapes_noisy_train:
# the same schedule per seed, NOISY_PARALLEL trainings at once (each small enough to share the GPU);
# NOISY_SEEDS and NOISY_METHODS pick the runs; NOISY_OPTS adds config overrides to every training (e.g. "SOLVER.MAX_ITER 2400 SOLVER.STEPS [0,1600,2100]").
noisy_kl() {
  mkdir -p $OUT/noisy; : > $OUT/noisy/results.txt
  python3 -c "from detectron.datasets.shapes import ensure_shapes_dataset as e; e()"
  export -f noisy_kl_run; export OUT NOISY_OPTS=${NOISY_OPTS:-}
  for seed in ${NOISY_SEEDS:-1 2 3 4 5 6}; do for method in ${NOISY_METHODS:-kl base xyxy}; do echo $method $seed; done; done |
    xargs -P ${NOISY_PARALLEL:-9} -L 1 bash -c 'noisy_kl_run "$@"' _
  python3 - $OUT/noisy/results.txt <<'PY' | tee $OUT/noisy_summary.txt
import sys, collections
import numpy as np
names = 'AP AP50 AP75 APs APm APl AP60 AP70 AP80 AP85 AP90 AP95'.split()
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    method, seed, values = (line.split() + [''])[:3]
    runs[method][int(seed)] = [float(v) for v in values.split(',')] if values else None
shown = ['AP', 'AP50', 'AP75', 'AP85', 'AP90']
print('method      seeds ' + ' '.join('{:>7}'.format(n) for n in shown) + '   (means)')
for method in ('base', 'xyxy', 'kl', 'kl_novote'):
    got = {s: v for s, v in runs[method].items() if v}
    if not got:
        continue
    mean = np.mean(list(got.values()), axis=0)
    print('{:<11} {:>5} '.format(method, len(got)) + ' '.join('{:7.4f}'.format(mean[names.index(n)]) for n in shown))
for other in ('base', 'xyxy', 'kl_novote'):
    seeds = sorted(s for s in runs['kl'] if runs['kl'][s] and runs[other].get(s))
    d = [runs['kl'][s][2] - runs[other][s][2] for s in seeds]
    if d:
        print('AP75 kl - {}: per seed {} mean {:+.4f}, kl ahead in {} of {}'.format(
            other, ' '.join('{:+.4f}'.format(x) for x in d), np.mean(d), sum(x > 0 for x in d), len(d)))
for method in sorted(runs):
    for seed, values in sorted(runs[method].items()):
        print(method, seed, ' '.join('{}={:.4f}'.format(n, v) for n, v in zip(names, values or [])))
PY
  tar czf $OUT/noisy_logs.tar.gz -C $OUT noisy && rm -r $OUT/noisy  # $OUT returns only a few files
}

bench_before_after() {  # the same benchmark command on .old's package and on this tree's, one after the other
  (cd .old && python3 setup.py -q build_ext --inplace > /dev/null 2>&1)
  for tree in new old; do
    local path=$ROOT; [ $tree = old ] && path=$ROOT/.old
    PYTHONPATH=$path:$PYTHONPATH python3 tools/benchmark.py ${BENCH_ARGS:---mode train test --batch 2 --rounds 3 --iters 15} \
      2>&1 | grep -v '^{' | tee "$OUT/bench_$tree.md"
  done
}

rcnn_batches() {  # R-CNN training at larger per-GPU batches, then inference with its profile
  python3 tools/benchmark.py --mode train --batch ${RCNN_BATCHES:-16 32} --rounds 3 --iters 8 2>&1 | grep -v '^{' \
    | tee "$OUT/rcnn_batches.md"
  python3 tools/benchmark.py --mode test profile --rounds 3 --iters 15 2>&1 | grep -v '^{' | tee "$OUT/rcnn_test_profile.md"
}

varvote_gpu() {  # Triton variance voting equals the compiled CPU kernel on the GPU; its time against plain NMS
  python3 - <<'PY' 2>&1 | tee "$OUT/varvote_gpu.txt"
import statistics, time, numpy as np, torch
from detectron.ops import nms as nms_ops, variance_voting as vv
def case(per_class, num_fg=5, seed=0, width=1333, height=800):
    rng = np.random.RandomState(seed)
    centres = rng.uniform([0, 0], [width, height], size=(10, 2)); sides = rng.uniform(20, 300, size=(10, 2))
    owner = rng.randint(10, size=per_class); half = np.tile(sides[owner] / 2, 2)
    boxes = np.hstack([centres[owner], centres[owner]]) + half * [-1, -1, 1, 1]
    boxes = boxes[None] + rng.randn(num_fg, per_class, 4) * half * 0.3
    boxes[..., 0::2] = boxes[..., 0::2].clip(0, width - 1); boxes[..., 1::2] = boxes[..., 1::2].clip(0, height - 1)
    scores = 0.18 + rng.randn(num_fg, per_class) * 0.005; sigmas = rng.uniform(0.05, 0.5, size=(num_fg, per_class, 4))
    t = [torch.from_numpy(a.astype(np.float32)).cuda() for a in (boxes, scores, sigmas)]
    return t + [torch.full((num_fg,), per_class, device='cuda')]
def ms(fn, n=20):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)
for per_class in (1000, 300):
    boxes, scores, sigmas, counts = case(per_class)
    args = (boxes, scores, sigmas, counts, 0.01, 0.01)
    gpu = vv.soft_nms_with_variance_voting_triton(*args); cpu = vv.soft_nms_with_variance_voting_cpu(*args)
    kept = cpu[1]
    same_order = all(torch.equal(g[c, :k].cpu(), h[c, :k].cpu()) for g, h in [(gpu[0], cpu[0])] for c, k in enumerate(kept.tolist()))
    print('per class', per_class, 'kept equal', torch.equal(gpu[1].cpu(), kept.cpu()), 'order equal', same_order,
          'max |box diff|', float(max((gpu[2][c, :k] - cpu[2][c, :k].to(gpu[2].device)).abs().max() for c, k in enumerate(kept.tolist()))),
          'max |score diff|', float((gpu[3] - cpu[3].to(gpu[3].device)).abs().max()))
    flat = boxes.reshape(-1, 4); classes = torch.arange(5, device='cuda').repeat_interleave(per_class)
    print('  plain NMS ms', round(ms(lambda: nms_ops.batched_nms_t(flat, scores.reshape(-1), classes, 0.5)), 3),
          'triton variance voting ms', round(ms(lambda: vv.soft_nms_with_variance_voting(*args)), 3),
          'cpu kernel ms', round(ms(lambda: vv.soft_nms_with_variance_voting_cpu(*args), 5), 3))
PY
}

centernet_bench() {  # synthetic CenterNet rows (training step, detect at batch 1, net + decode at batch 64) and a profile
  for cfg in ${CN_BENCH_CFGS:-configs/centernet/ctdet_coco_resdcn18.yaml configs/centernet/ctdet_coco_dla_1x.yaml}; do
    python3 tools/benchmark.py --cfg $cfg --mode centernet profile --centernet-batch 32 64 --rounds 3 --iters 10 \
      -- NUM_GPUS 1 2>&1 | grep -v '^{' | tee -a "$OUT/centernet_bench.md"
  done
}

dcn_layers() {  # resdcn_18's three DCN layers, forward + backward at batch 32: the Triton kernels against grid_sample's path
  python3 dev/dcn_layers_bench.py 2>&1 | tee "$OUT/dcn_layers.txt"
}

checkpoint_activations_bench() {  # resdcn_18 training step at batch 32, with and without TRAIN.CHECKPOINT_ACTIVATIONS: images/s and peak MiB
  python3 tools/benchmark.py --cfg configs/centernet/ctdet_coco_resdcn18.yaml --mode centernet --centernet-batch 32 64 \
    --checkpoint-activations-row --rounds 5 --iters 10 -- NUM_GPUS 1 2>&1 | grep -v '^{' | tee "$OUT/checkpoint_activations.md"
}

centernet_coco_tiny() {  # train_net and test_net on the real JPEGs of coco_tiny, bf16, 512x512; GPU utilisation sampled
  for arch in ${CN_ARCHS:-resdcn18 dla_1x}; do
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/util_$arch.txt" &
    local smi=$!
    # Trained from random init (no ImageNet trunk is downloaded).
    python3 tools/train_net.py -c configs/centernet/ctdet_coco_$arch.yaml DATASET_CATALOG "$CATALOG" NUM_GPUS 1 TRAIN.WEIGHTS "''" \
      TRAIN.DATASETS "${CN_TRAIN_DATASETS:-('coco_tiny_train',)}" TEST.DATASETS "('coco_tiny_val',)" CENTERNET.BATCH_SIZE 32 \
      CENTERNET.MASTER_BATCH_SIZE -1 CENTERNET.NUM_EPOCHS ${CN_EPOCHS:-60} CENTERNET.LR_STEP "(50,)" SOLVER.AMP.ENABLED True \
      SOLVER.AMP.DTYPE bfloat16 DATA_LOADER.NUM_THREADS 14 OUTPUT_DIR /tmp/cn_$arch > "$OUT/cn_$arch.log" 2>&1
    echo "$arch exit $?"; kill $smi
    grep json_stats "$OUT/cn_$arch.log" | tail -2; grep -E "im_detect.*80/80|copypaste: [0-9]" "$OUT/cn_$arch.log"
    python3 -c "import sys, numpy as np; u = np.loadtxt(sys.argv[1]); print('GPU utilisation while running: mean', u.mean().round(1), 'median', np.median(u))" "$OUT/util_$arch.txt"
  done
}

mask_targets() {  # Mask R-CNN targets on the GPU: equal to Detectron's pycocotools rasterisation (the CUDA tests), then their time against it on 256 fg RoIs of coco_tiny objects
  python3 -m pytest -q -rs tests/utils/test_segms_device.py tests/roi_data/test_mask_targets.py > "$OUT/mask_targets.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/mask_targets.txt" | tail -5
  python3 dev/mask_targets_bench.py --device cuda --coco-tiny "$COCO_TINY" 2>&1 | tee -a "$OUT/mask_targets.txt"
}

rcnn_loops() {  # train_net on coco_tiny's JPEGs, test_net on coco_tiny val listed 10 times: against their own inputs replayed from memory and the synthetic rows (LOOP_OPTS: more overrides, e.g. "TRAIN.CUDA_GRAPHS_MAX_SHAPES 16"; LOOP_TAG: a log name suffix)
  val_x10
  python3 tools/benchmark.py --mode loops --catalog "$CATALOG" --train-dataset coco_tiny_train \
    --test-dataset coco_tiny_val_x10 --batch 2 --loop-iters ${LOOP_ITERS:-400} --loop-warmup ${LOOP_WARMUP:-200} \
    --iters ${LOOP_ROW_ITERS:-40} --rounds 3 --loop-dir /tmp/bench_loops \
    -- DATA_LOADER.NUM_THREADS 6 ${LOOP_OPTS:-} 2>&1 | grep -v '^{' | tee "$OUT/rcnn_loops${LOOP_TAG:-}.md"
}

train_loop_parts() {  # Mask R-CNN's training loop on coco_tiny's JPEGs fed by the loader, by host batches, by device batches, without hooks; the bare step; the hooks' host time
  python3 dev/train_loop_parts.py --cfg configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml --dataset coco_tiny_train --catalog "$CATALOG" \
    SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16 DATA_LOADER.NUM_THREADS 6 2>&1 | grep "ms per iteration\|mean" | tee "$OUT/train_loop_parts.txt"
}

centernet_loop_parts() {  # the same for CenterNet resdcn_18 at batch 32 on coco_tiny train listed 16 times, with 14 and with 10 loader workers
  local workers
  for workers in 14 10; do
    python3 dev/train_loop_parts.py --cfg configs/centernet/ctdet_coco_resdcn18.yaml --dataset $(printf 'coco_tiny_train %.0s' $(seq 16)) \
      --catalog "$CATALOG" --batch 32 --iters 120 --warmup 20 --rounds 2 DATA_LOADER.NUM_THREADS $workers 2>&1 \
      | grep "ms per iteration\|mean" | tee "$OUT/centernet_loop_parts_w$workers.txt"
  done
}

rcnn_step_parts() {  # host ms per part of the R-CNN training step at batch 2 and 16: as trained, with the compact RoIs, and with torchvision's roi_align too
  for batch in 2 16; do
    for variant in "" "--compact-rois" "--compact-rois --eager-roi-align"; do
      echo "== batch $batch ${variant:-(as trained)}"
      python3 dev/rcnn_step_parts.py --batch $batch $variant 2>&1 | grep -v Warning
    done
  done | tee "$OUT/rcnn_step_parts.txt"
}

startup() {  # the start-up rows (model loaded -> first detection, first batch -> first iteration) and test_net on COCO val's 5000 image sizes against the bare detector, KL R-CNN and CenterNet resdcn_18 (about 15 minutes for two rounds)
  python3 tools/benchmark.py --mode startup --startup-cfgs $KL_CFG configs/centernet/ctdet_coco_resdcn18.yaml \
    --rounds ${STARTUP_ROUNDS:-2} --startup-images ${STARTUP_IMAGES:-5000} --loop-dir /tmp/bench_startup \
    -- DATA_LOADER.NUM_THREADS 12 CENTERNET.BATCH_SIZE 32 CENTERNET.MASTER_BATCH_SIZE -1 SOLVER.AMP.ENABLED True \
    SOLVER.AMP.DTYPE bfloat16 > "$OUT/startup.log" 2>&1
  echo "startup exit $?"; grep '^|' "$OUT/startup.log" | tee "$OUT/startup.md"
}

val_x10() {  # coco_tiny_val listed 10 times (800 images: one-time graph captures amortised), added to the catalog
  python3 - "$COCO_TINY/annotations/instances_val2017.json" /tmp/val_x10.json <<'PY'
import json, sys
coco = json.load(open(sys.argv[1]))
images, anns = [], []
for k in range(10):
    images += [dict(im, id=im['id'] + k * 10 ** 7) for im in coco['images']]
    anns += [dict(a, id=a['id'] + k * 10 ** 8, image_id=a['image_id'] + k * 10 ** 7) for a in coco['annotations']]
json.dump(dict(coco, images=images, annotations=anns), open(sys.argv[2], 'w'))
PY
  python3 - "$CATALOG" "$COCO_TINY/val2017" <<'PY'
import json, sys
catalog = json.load(open(sys.argv[1]))
catalog['coco_tiny_val_x10'] = {'image_directory': sys.argv[2], 'annotation_file': '/tmp/val_x10.json'}
json.dump(catalog, open(sys.argv[1], 'w'))
PY
}

test_loop_before_after() {  # short train_net, then test_net on coco_tiny_val_x10 against its images replayed: this tree, then .old's
  val_x10
  BENCH_ARGS="--mode loops --catalog $CATALOG --train-dataset coco_tiny_train --test-dataset coco_tiny_val_x10 --batch 2 \
    --loop-iters 40 --loop-warmup 20 --iters 40 --rounds 3 --loop-dir /tmp/bench_loops -- DATA_LOADER.NUM_THREADS 6" \
    bench_before_after
}

rcnn_test_repeated() {  # test_net on coco_tiny_val_x10, graphs on / off (TEST_GRAPHS)
  val_x10
  for graphs in ${TEST_GRAPHS:-True False}; do
    python3 tools/benchmark.py --mode loops --catalog "$CATALOG" --train-dataset coco_tiny_train \
      --test-dataset coco_tiny_val_x10 --batch 2 --loop-iters 40 --loop-warmup 20 --loop-dir /tmp/bench_loops \
      -- DATA_LOADER.NUM_THREADS 6 TEST.CUDA_GRAPHS $graphs 2>&1 | grep -v '^{' | tee "$OUT/rcnn_test_x10_graphs_$graphs.md"
  done
}

tta_test() {  # run after mask_train: its KL Mask R-CNN through test_net on coco_tiny val, 1 GPU, without and with
  # Detectron's test-time augmentation (configs/test_time_aug: flip, 8 scales and their flips for boxes and masks,
  # box voting at 0.9); the im_detect lines give seconds per image
  local weights=/tmp/mask_e2e_mask_rcnn_R-50-FPN_2x_log/train/coco_tiny_train/generalized_rcnn/model_final.pth
  local aug scales="(400, 500, 600, 700, 900, 1000, 1100, 1200)"
  for aug in False True; do
    python3 tools/test_net.py -c configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml "${KL[@]}" TEST.WEIGHTS $weights \
      NUM_GPUS 1 TEST.BBOX_VOTE.ENABLED $aug TEST.BBOX_VOTE.VOTE_TH 0.9 \
      TEST.BBOX_AUG.ENABLED $aug TEST.BBOX_AUG.H_FLIP True TEST.BBOX_AUG.SCALES "$scales" TEST.BBOX_AUG.MAX_SIZE 2000 \
      TEST.BBOX_AUG.SCALE_H_FLIP True TEST.MASK_AUG.ENABLED $aug TEST.MASK_AUG.H_FLIP True \
      TEST.MASK_AUG.SCALES "$scales" TEST.MASK_AUG.MAX_SIZE 2000 TEST.MASK_AUG.SCALE_H_FLIP True \
      OUTPUT_DIR /tmp/tta_test_$aug > "$OUT/tta_test_$aug.log" 2>&1
    echo "test-time augmentation $aug: test_net exit $?"
    grep -E "copypaste|Total inference time|im_detect:" "$OUT/tta_test_$aug.log" | tail -8
  done
}

mask_train() {  # Mask R-CNN (KL head, then the GN baseline) trained 100 iterations on coco_tiny's JPEGs, bf16, 800x1333, 2 images per GPU
  for cfg in configs/e2e_mask_rcnn_R-50-FPN_2x_log.yaml configs/04_2018_gn_baselines/e2e_mask_rcnn_R-50-FPN_2x_gn.yaml; do
    local name; name=$(basename $cfg .yaml)
    python3 tools/train_net.py -c $cfg --skip-test "${KL[@]}" NUM_GPUS 1 SOLVER.MAX_ITER 100 \
      OUTPUT_DIR /tmp/mask_$name > "$OUT/mask_train_$name.log" 2>&1
    echo "$name exit $?"; grep json_stats "$OUT/mask_train_$name.log" | tail -2
  done
}

demo_run() {  # <name> <config> <overrides...>: a CPU demo config trained and tested (on the GPU, only its AP matters)
  local name=$1 config=$2; shift 2
  python3 tools/train_net.py -c configs/getting_started/$config DATA_LOADER.NUM_THREADS 2 \
    OUTPUT_DIR /tmp/demo_$name "$@" > $OUT/demo/$name.log 2>&1
  echo "$name $* -> $(grep 'copypaste: [0-9]' $OUT/demo/$name.log | tail -1 | awk '{print $NF}')" >> $OUT/demo/results.txt
}

# Settings of the CPU demos (shapes), compared by AP: the CPU's cost is their images x pixels.
demo_grid() {
  mkdir -p $OUT/demo; : > $OUT/demo/results.txt
  python3 -c "from detectron.datasets.shapes import ensure_shapes_dataset as e; e()"
  export -f demo_run; export OUT
  printf '%s\n' "${DEMO_RUNS[@]}" | xargs -P ${DEMO_PARALLEL:-7} -L 1 bash -c 'demo_run "$@"' _
  sort $OUT/demo/results.txt | tee $OUT/demo_results.txt
  tar czf $OUT/demo_logs.tar.gz -C $OUT demo && rm -r $OUT/demo
}

# The Mask R-CNN demo's cheaper settings (BENCHMARKS.md "Demo speed settings") against the config, three seeds each:
# one seed's mask AP spreads by several hundredths at these budgets.
mask_demo_grid() {
  local seed cheap="FPN.DIM 64 FAST_RCNN.ROI_XFORM_SAMPLING_RATIO 1 TRAIN.RPN_PRE_NMS_TOP_N 500"
  DEMO_RUNS=()
  for seed in 3 7 11; do
    DEMO_RUNS+=("mask_config_s$seed shapes_demo_mask_R-18-FPN.yaml RNG_SEED $seed"
      "mask_cheap640_s$seed shapes_demo_mask_R-18-FPN.yaml $cheap SOLVER.MAX_ITER 640 SOLVER.STEPS [0,427,565] SOLVER.WARM_UP_ITERS 53 RNG_SEED $seed"
      "mask_cheap_msr1_s$seed shapes_demo_mask_R-18-FPN.yaml $cheap MRCNN.ROI_XFORM_SAMPLING_RATIO 1 RNG_SEED $seed")
  done
  DEMO_PARALLEL=${DEMO_PARALLEL:-9} demo_grid
}

# Run 8: the CenterNet demo at about the CPU time of 20 epochs of batch 16 (2-core CPU, s/iteration measured
# there: fp32 b16 1.0, b8 0.57, b4 0.41; bf16 autocast + channels_last b16 0.52, b8 0.32, b4 0.25): smaller
# batches give more Adam updates for the same compute (run 7: 20 epochs of b16 reach AP50 0.29, 60 epochs 0.79).
# Run 9 (optimizers, LRs, warm-up) needed a temporary code change: see BENCHMARKS.md. The config was float32
# then; since it trains in bfloat16 (dde9ef0) the float32 rows say SOLVER.AMP.ENABLED False.
DEMO_RUNS=(
  "cn8_fp32_b8_lr1e-4_e16 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 16 CENTERNET.LR_STEP (14,) SOLVER.AMP.ENABLED False"
  "cn8_fp32_b8_lr2e-4_e16 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 2e-4 CENTERNET.NUM_EPOCHS 16 CENTERNET.LR_STEP (14,) SOLVER.AMP.ENABLED False"
  "cn8_fp32_b4_lr1e-4_e12 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 4 CENTERNET.LR_BATCH_SIZE 4 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 12 CENTERNET.LR_STEP (10,) SOLVER.AMP.ENABLED False"
  "cn8_fp32_b4_lr5e-5_e12 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 4 CENTERNET.LR_BATCH_SIZE 4 CENTERNET.LR 5e-5 CENTERNET.NUM_EPOCHS 12 CENTERNET.LR_STEP (10,) SOLVER.AMP.ENABLED False"
  "cn8_fp32_b8_lr1e-4_e28 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 28 CENTERNET.LR_STEP (25,) SOLVER.AMP.ENABLED False"
  "cn8_bf16_b16_lr1e-4_e36 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 16 CENTERNET.LR_BATCH_SIZE 16 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 36 CENTERNET.LR_STEP (32,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b16_lr1e-4_e60 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 16 CENTERNET.LR_BATCH_SIZE 16 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 60 CENTERNET.LR_STEP (45,54) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b8_lr1e-4_e28 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 28 CENTERNET.LR_STEP (25,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b8_lr2e-4_e28 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 2e-4 CENTERNET.NUM_EPOCHS 28 CENTERNET.LR_STEP (25,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b8_lr5e-5_e28 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 5e-5 CENTERNET.NUM_EPOCHS 28 CENTERNET.LR_STEP (25,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b8_lr1e-4_e28_noflip shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 8 CENTERNET.LR_BATCH_SIZE 8 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 28 CENTERNET.LR_STEP (25,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16 CENTERNET.FLIP 0.0"
  "cn8_bf16_b4_lr1e-4_e18 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 4 CENTERNET.LR_BATCH_SIZE 4 CENTERNET.LR 1e-4 CENTERNET.NUM_EPOCHS 18 CENTERNET.LR_STEP (16,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b4_lr5e-5_e18 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 4 CENTERNET.LR_BATCH_SIZE 4 CENTERNET.LR 5e-5 CENTERNET.NUM_EPOCHS 18 CENTERNET.LR_STEP (16,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
  "cn8_bf16_b4_lr2e-4_e18 shapes_demo_centernet_res18.yaml CENTERNET.BATCH_SIZE 4 CENTERNET.LR_BATCH_SIZE 4 CENTERNET.LR 2e-4 CENTERNET.NUM_EPOCHS 18 CENTERNET.LR_STEP (16,) SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16"
)

run_steps "$@"
