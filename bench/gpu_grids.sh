#!/usr/bin/env bash
# The four main ablation grids (electra_vs_mlm, nsp_formats, norm_lr_warmup, static_vs_dynamic)
# at --scale=gpu on one H100/H200: ELECTRA-Small-shaped encoders in bf16 on the demo corpus,
# every point pre-trained and fine-tuned on both demo tasks, in one process; estimated ~9 min
# (sizing: experiments/grids.py, GPU_*; bench/README.md). Reports go to
# experiments/results/<grid>_gpu/, runs to experiments/runs/<grid>_gpu/.
#
#   bash bench/gpu_grids.sh                 # on the GPU machine
#   bash bench/gpu_grids.sh --dry_run       # CPU, every point shrunk to 3 steps (51 s; with
#                                           # every cache empty: 80 s)
#   GRIDS=generator_size bash bench/gpu_grids.sh    # another grid (or a comma-separated list)
#   PYTHON=.venv/bin/python bash bench/gpu_grids.sh --dry_run --workdir=/tmp/r --out=/tmp/o
#
# Resumable: a finished point is skipped, a killed one resumes (run the same command again).
# Needs jax with CUDA in $PYTHON (default python3) and the demo corpus, its vocab and the two
# demo tasks in the encoder_jax cache (~/.cache/encoder_jax or $ENCODER_JAX_CACHE; `bash run.sh
# demo` fills it): the GPU machine may have no network. Extra arguments go to experiments.run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
args=()
# Cache every compiled program (default: only those that took > 1 s), so points that share one
# (evaluation per objective, fine-tuning per model shape) compile it once, also across reruns.
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"
if [ "${1:-}" = "--dry_run" ]; then
  shift
  export JAX_PLATFORMS=cpu
  # A smoke test: compile fast rather than well (the trainer already does this for its init;
  # XLA:CPU's older fusion emitters compile a small train step in 1.4 s instead of 3.5 s).
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
  args+=(--dry_run)
elif command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
# Let XLA take most of the GPU's memory up front (its default is 75%); no effect on CPU.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
start=$(date +%s)
"$PY" -m experiments.run --grid="${GRIDS:-all}" --scale=gpu --in_process "${args[@]}" "$@"
echo "bench/gpu_grids.sh: $(( $(date +%s) - start )) s wall-clock"
