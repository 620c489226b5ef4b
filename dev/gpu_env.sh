# Shared by dev/gpu_checks.sh and dev/gpu_benchmarks.sh (sourced; run from the repository root).
# Settings (environment):
#   COCO_TINY   the coco_tiny data set (train2017/, val2017/, annotations/); default ../shared/data/coco_tiny
#   WHEELS_DIR  optional: a folder of wheels that `setup` installs without an index into $SITE (for a
#               machine without yacs, pycocotools or Cython); unset: the environment already has them
#   OUT         logs and results (default ./gpu_checks_out); RUNS: training outputs (default /tmp/gpu_checks_runs)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./gpu_checks_out}; mkdir -p "$OUT"
RUNS=${RUNS:-${TMPDIR:-/tmp}/gpu_checks_runs}
ROOT=$(pwd)
COCO_TINY=$(realpath -m "${COCO_TINY:-$ROOT/../shared/data/coco_tiny}")
CATALOG=$OUT/catalog.json
SITE=${SITE:-${TMPDIR:-/tmp}/gpu_checks_site}  # where setup installs the wheels of WHEELS_DIR
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
KL_CFG=configs/e2e_faster_rcnn_R-50-FPN_2x.yaml
KL=(DATASET_CATALOG "$CATALOG" TRAIN.WEIGHTS "''"
    TRAIN.DATASETS "('coco_tiny_train',)" TEST.DATASETS "('coco_tiny_val',)" SOLVER.BASE_LR 0.002
    SOLVER.AMP.ENABLED True SOLVER.AMP.DTYPE bfloat16 DATA_LOADER.NUM_THREADS 6
    # These runs download nothing, so they train from random init: a frozen-affine R-50 from random init
    # diverges (NaN by iteration 12), so they use Detectron's GN-from-scratch body variant.
    RESNETS.STEM_FUNC basic_gn_stem RESNETS.TRANS_FUNC bottleneck_gn_transformation
    RESNETS.SHORTCUT_FUNC basic_gn_shortcut FPN.USE_GN True TRAIN.FREEZE_AT 0)

setup() {
  if [ -n "${WHEELS_DIR:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS_DIR"/*.whl || exit 1
  fi
  python3 setup.py -q build_ext --inplace > "$OUT/build_ext.log" 2>&1 || { tail -5 "$OUT/build_ext.log"; exit 1; }
  [ -d "$COCO_TINY/train2017" ] || { echo "error: no coco_tiny at $COCO_TINY; set COCO_TINY"; exit 1; }
  cat > "$CATALOG" <<JSON
{"coco_tiny_train": {"image_directory": "$COCO_TINY/train2017",
  "annotation_file": "$COCO_TINY/annotations/instances_train2017.json"},
 "coco_tiny_val": {"image_directory": "$COCO_TINY/val2017",
  "annotation_file": "$COCO_TINY/annotations/instances_val2017.json"}}
JSON
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpus.txt"
  python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)" | tee -a "$OUT/gpus.txt"
  git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpus.txt"
}

run_steps() {  # <step> [<step> ...]: each a function of the script that sourced this file
  local step
  for step in "$@"; do "$step"; done
}
