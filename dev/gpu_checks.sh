#!/usr/bin/env bash
# GPU checks, each with an expected outcome, on any CUDA machine. Run from the repository root:
#   bash dev/gpu_checks.sh <step> [<step> ...]
# Settings: dev/gpu_env.sh. The runs recorded in BENCHMARKS.md are dev/gpu_benchmarks.sh.
# Steps:
#   setup                          build the Cython extensions, write the data catalog, record GPU/torch/commit
#   gpu_tests                      the tests marked cuda (pytest -m cuda: they need a GPU or run their kernels compiled on it)
#   multi_gpu                      the multi-GPU checks on one GPU (DIST_BACKEND gloo), one PASS/FAIL line each:
#                                  mg_train mg_centernet mg_test mg_kill (each also a step; mg_test needs the
#                                  models of mg_train and mg_centernet); docs/MULTI_GPU.md, "Checks on a GPU"
#   out_of_memory                  a batch that cannot fit: exit status 2, one error line, the checkpoint unchanged
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"

gpu_tests() {  # the tests marked cuda in tests/ (pyproject.toml): CUDA-only tests and the Triton kernels compiled on the GPU
  python3 -m pytest -q -rs -m cuda tests > "$OUT/gpu_tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -20
}

out_of_memory() {  # a batch that cannot fit, resumed from a checkpoint: one error line, the checkpoint unchanged
  local cfg=configs/getting_started/shapes_demo_R-18-FPN.yaml dir=/tmp/oom
  rm -rf $dir
  python3 tools/train_net.py -c $cfg --skip-test SOLVER.MAX_ITER 30 TRAIN.SNAPSHOT_ITERS 10 OUTPUT_DIR $dir > "$OUT/oom_first.log" 2>&1
  rm $dir/train/shapes_train/generalized_rcnn/model_final.pth  # as if the run had been stopped after model_iter29.pth
  local before; before=$(md5sum $dir/train/shapes_train/generalized_rcnn/model_iter29.pth)
  python3 tools/train_net.py -c $cfg --skip-test SOLVER.MAX_ITER 60 TRAIN.IMS_PER_BATCH 256 TRAIN.SCALES "(1600,)" \
    TRAIN.MAX_SIZE 1600 OUTPUT_DIR $dir > "$OUT/oom.log" 2>&1
  echo "exit $? (2 expected)"; grep '^error:' "$OUT/oom.log"; grep -c Traceback "$OUT/oom.log"
  [ "$before" = "$(md5sum $dir/train/shapes_train/generalized_rcnn/model_iter29.pth)" ] && echo "model_iter29.pth unchanged"
  tail -1 $dir/log.txt
}

# ----------------------------------------------------------------------------------------------
# multi_gpu: the multi-GPU code paths on one GPU, ranks sharing it through DIST_BACKEND gloo (docs/MULTI_GPU.md,
# "Checks on a GPU"). Every check prints one `PASS <what>: ...` or `FAIL <what>: ...` line (also in
# $OUT/multi_gpu/results.txt); logs are in $OUT/multi_gpu, training outputs in $RUNS/multi_gpu.
MG_TOL=${MG_TOL:-0.25}  # (docs/MULTI_GPU.md) relative update difference allowed between 2 ranks x 1 image and 1 rank x 2 images
MG_ITERS=${MG_ITERS:-50}
MG_KL_DIR=train/coco_tiny_train/generalized_rcnn

mg_compare() { python3 dev/multi_gpu_compare.py "$@" | tee -a "$OUT/multi_gpu/results.txt"; }
mg_verdict() {  # <0 = pass> <label> <detail>
  local word=FAIL; [ "$1" = 0 ] && word=PASS
  echo "$word $2: $3" | tee -a "$OUT/multi_gpu/results.txt"
}
mg_kl_train() {  # <name> <overrides...>: train_net on coco_tiny, KL R-CNN R-50-FPN (GN, bf16), MG_ITERS iterations
  local name=$1; shift
  # A batch-wide RPN_POST_NMS_TOP_N (Detectron's training rule) would keep 2000 proposals for two images on
  # one rank but 2000 per image on two: raised so that both layouts keep every proposal.
  python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" SOLVER.MAX_ITER $MG_ITERS \
    TRAIN.RPN_POST_NMS_TOP_N 100000 TRAIN.SNAPSHOT_ITERS 100000 OUTPUT_DIR "$RUNS/multi_gpu/$name" "$@" \
    > "$OUT/multi_gpu/$name.log" 2>&1
  echo "train $name exit $?"
}
mg_setup() { mkdir -p "$OUT/multi_gpu" "$RUNS/multi_gpu"; }

mg_train() {  # 2 ranks x 1 image against 1 rank x 2 images (MG_VARIANTS: graphs no_graphs iter_size2), then the control (MG_CONTROL=0 skips it; it compares with kl_graphs_1x2)
  mg_setup
  local variant overrides
  for variant in ${MG_VARIANTS:-graphs no_graphs iter_size2}; do
    case $variant in
      graphs) overrides=(TRAIN.CUDA_GRAPHS True) ;;
      no_graphs) overrides=(TRAIN.CUDA_GRAPHS False) ;;
      iter_size2) overrides=(SOLVER.ITER_SIZE 2) ;;
    esac
    rm -rf "$RUNS/multi_gpu/kl_${variant}_2x1" "$RUNS/multi_gpu/kl_${variant}_1x2"
    mg_kl_train kl_${variant}_2x1 NUM_GPUS 2 DIST_BACKEND gloo TRAIN.IMS_PER_BATCH 1 "${overrides[@]}"
    mg_kl_train kl_${variant}_1x2 NUM_GPUS 1 TRAIN.IMS_PER_BATCH 2 "${overrides[@]}"
    mg_compare log "$OUT/multi_gpu/kl_${variant}_2x1.log" 'Check mode \(DIST_BACKEND gloo on CUDA\): 2 ranks' \
      "kl $variant: 2 ranks share the GPU in check mode"
    mg_compare log "$OUT/multi_gpu/kl_${variant}_2x1.log" "Parameters after iteration $((MG_ITERS - 1)) are bitwise equal on all 2 ranks" \
      "kl $variant: weights bitwise equal on both ranks"
    mg_compare weights "$RUNS/multi_gpu/kl_${variant}_2x1/$MG_KL_DIR/model_final.pth" \
      "$RUNS/multi_gpu/kl_${variant}_1x2/$MG_KL_DIR/model_final.pth" $MG_TOL "kl $variant: 2x1 equals 1x2 within $MG_TOL"
  done
  # The control: the same comparison must fail for a run that trained differently (a doubled learning rate).
  [ "${MG_CONTROL:-1}" = 1 ] || return 0
  rm -rf "$RUNS/multi_gpu/kl_lr2_2x1"
  mg_kl_train kl_lr2_2x1 NUM_GPUS 2 DIST_BACKEND gloo TRAIN.IMS_PER_BATCH 1 SOLVER.BASE_LR 0.004
  mg_compare weights-apart "$RUNS/multi_gpu/kl_lr2_2x1/$MG_KL_DIR/model_final.pth" \
    "$RUNS/multi_gpu/kl_graphs_1x2/$MG_KL_DIR/model_final.pth" $MG_TOL "kl control: a doubled LR is beyond $MG_TOL"
}

mg_centernet() {  # CenterNet resdcn_18, bf16, 2 ranks with CenterNet's unequal chunks [4, 8]
  mg_setup
  rm -rf "$RUNS/multi_gpu/cn_2"
  python3 tools/train_net.py -c configs/centernet/ctdet_coco_resdcn18.yaml --skip-test DATASET_CATALOG "$CATALOG" \
    TRAIN.WEIGHTS "''" TRAIN.DATASETS "('coco_tiny_train',)" TEST.DATASETS "('coco_tiny_val',)" NUM_GPUS 2 \
    DIST_BACKEND gloo CENTERNET.BATCH_SIZE 12 CENTERNET.MASTER_BATCH_SIZE 4 CENTERNET.NUM_EPOCHS 6 \
    CENTERNET.LR_STEP "(5,)" SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16 DATA_LOADER.NUM_THREADS 6 \
    OUTPUT_DIR "$RUNS/multi_gpu/cn_2" > "$OUT/multi_gpu/cn_2.log" 2>&1
  echo "train cn_2 exit $?"
  mg_compare log "$OUT/multi_gpu/cn_2.log" 'TRAIN.RANK_IMS_PER_BATCH \(4, 8\)' "centernet: chunks [4, 8]"
  mg_compare log "$OUT/multi_gpu/cn_2.log" 'Parameters after iteration [0-9]+ are bitwise equal on all 2 ranks' \
    "centernet: weights bitwise equal on both ranks"
  # The loss weighting of unequal chunks (each rank's loss on its own chunk, gradients averaged) against the
  # step computed by hand, here with both ranks on the GPU.
  python3 -m pytest -q tests/core/test_centernet_engine.py -k 'unequal_chunks and cuda' > "$OUT/multi_gpu/cn_chunks.txt" 2>&1
  grep -q '^1 passed' "$OUT/multi_gpu/cn_chunks.txt"
  mg_verdict $? "centernet: chunks [1, 2] on the GPU give CenterNet's mean of per-GPU losses" \
    "$(tail -1 "$OUT/multi_gpu/cn_chunks.txt")"
}

mg_test_pair() {  # <name> <config> <overrides...>: test_net on 1 rank and on 2 ranks; detections identical
  local name=$1 config=$2 n; shift 2
  for n in 1 2; do
    local multi=(); [ $n = 2 ] && multi=(--multi-gpu-testing DIST_BACKEND gloo)
    rm -rf "$RUNS/multi_gpu/test_${name}_$n"
    python3 tools/test_net.py -c $config "${multi[@]}" DATASET_CATALOG "$CATALOG" TEST.DATASETS "('coco_tiny_val',)" \
      NUM_GPUS $n OUTPUT_DIR "$RUNS/multi_gpu/test_${name}_$n" "$@" > "$OUT/multi_gpu/test_${name}_$n.log" 2>&1
    echo "test $name on $n rank(s) exit $?"
  done
  mg_compare detections "$(find "$RUNS/multi_gpu/test_${name}_2" -name detections.pkl | head -1)" \
    "$(find "$RUNS/multi_gpu/test_${name}_1" -name detections.pkl | head -1)" "$name: 2-rank detections identical to 1 rank"
}

mg_test() {  # --multi-gpu-testing on 2 ranks against 1 rank (the models of mg_train and mg_centernet)
  mg_setup
  mg_test_pair kl_std_nms $KL_CFG "${KL[@]}" STD_NMS True TEST.SCORE_THRESH 0.0 \
    TEST.WEIGHTS "$RUNS/multi_gpu/kl_graphs_2x1/$MG_KL_DIR/model_final.pth"
  mg_test_pair centernet_flip configs/centernet/ctdet_coco_resdcn18.yaml CENTERNET.FLIP_TEST True \
    TEST.WEIGHTS "$(find "$RUNS/multi_gpu/cn_2" -name model_final.pth | head -1)"
}

mg_rank1_pid() {  # <launcher pid>: the second worker that launch.launch spawned (rank 1)
  ps --ppid "$1" -o pid=,args= --sort=start_time | grep spawn_main | sed -n 2p | awk '{print $1}'
}

mg_kill() {  # SIGKILL to rank 1 mid-training, the same command resumes, 2 ranks <-> 1 rank
  mg_setup
  local dir=$RUNS/multi_gpu/kill t0 pid status found seconds
  rm -rf "$dir" "$RUNS/multi_gpu/kill_to1" "$RUNS/multi_gpu/kill_to2"
  local two=(NUM_GPUS 2 DIST_BACKEND gloo TRAIN.IMS_PER_BATCH 1)
  python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" "${two[@]}" SOLVER.MAX_ITER 60 TRAIN.SNAPSHOT_ITERS 20 \
    OUTPUT_DIR "$dir" > "$OUT/multi_gpu/kill_1.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -f "$dir/$MG_KL_DIR/model_iter19.pth" ] && break; sleep 0.5; done
  kill -9 "$(mg_rank1_pid $pid)"; t0=$(date +%s)
  wait $pid; status=$?; seconds=$(( $(date +%s) - t0 ))
  grep -q '^error: worker rank 1 of 2 was killed by SIGKILL' "$OUT/multi_gpu/kill_1.log"; found=$?
  mg_verdict $(( found || status == 0 || seconds > 60 )) "kill: SIGKILL to rank 1 ends the job within 60 s" \
    "exit $status after $seconds s: $(grep '^error:' "$OUT/multi_gpu/kill_1.log" | tail -1)"
  python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" "${two[@]}" SOLVER.MAX_ITER 60 TRAIN.SNAPSHOT_ITERS 20 \
    OUTPUT_DIR "$dir" > "$OUT/multi_gpu/kill_2.log" 2>&1
  status=$?
  grep -q 'Resuming from checkpoint' "$OUT/multi_gpu/kill_2.log"
  mg_verdict $(( $? || status )) "kill: the same command resumes and finishes" \
    "exit $status, $(grep -o 'Resuming from checkpoint .*' "$OUT/multi_gpu/kill_2.log")"
  # A 2-rank checkpoint resumed on 1 rank (2 images, the same global batch), and that run's checkpoint on 2 ranks.
  mkdir -p "$RUNS/multi_gpu/kill_to1/$MG_KL_DIR" "$RUNS/multi_gpu/kill_to2/$MG_KL_DIR"
  cp "$dir/$MG_KL_DIR/model_iter19.pth" "$RUNS/multi_gpu/kill_to1/$MG_KL_DIR/"
  python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" NUM_GPUS 1 TRAIN.IMS_PER_BATCH 2 SOLVER.MAX_ITER 35 \
    TRAIN.SNAPSHOT_ITERS 10 OUTPUT_DIR "$RUNS/multi_gpu/kill_to1" > "$OUT/multi_gpu/kill_to1.log" 2>&1
  status=$?
  grep -q "Resuming from checkpoint .*model_iter19.pth" "$OUT/multi_gpu/kill_to1.log"
  mg_verdict $(( $? || status )) "kill: a 2-rank checkpoint resumes on 1 rank" "exit $status"
  cp "$RUNS/multi_gpu/kill_to1/$MG_KL_DIR/model_iter29.pth" "$RUNS/multi_gpu/kill_to2/$MG_KL_DIR/"
  python3 tools/train_net.py -c $KL_CFG --skip-test "${KL[@]}" "${two[@]}" SOLVER.MAX_ITER 35 \
    OUTPUT_DIR "$RUNS/multi_gpu/kill_to2" > "$OUT/multi_gpu/kill_to2.log" 2>&1
  status=$?
  grep -q "Resuming from checkpoint .*model_iter29.pth" "$OUT/multi_gpu/kill_to2.log" &&
    grep -q 'bitwise equal on all 2 ranks' "$OUT/multi_gpu/kill_to2.log"
  mg_verdict $(( $? || status )) "kill: a 1-rank checkpoint resumes on 2 ranks" "exit $status"
}

multi_gpu() { mg_train; mg_centernet; mg_test; mg_kill; }

run_steps "$@"
