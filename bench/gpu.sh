#!/usr/bin/env bash
# BERT-base train-step throughput and MFU on one GPU (H100/H200), bf16 compute, cuDNN flash
# attention (falls back to XLA attention with a printed note). Runs in under 5 minutes.
#
#   bash bench/gpu.sh                     # seq 128 (B256) and 512 (B64), 20 timed steps each
#   bash bench/gpu.sh --compare_xla       # also XLA attention per length (~2x the time)
#   bash bench/gpu.sh --dry_run           # CPU, tiny model: checks the script in < 1 min
#   PYTHON=.venv/bin/python bash bench/gpu.sh --dry_run
#
# Needs jax with CUDA, flax, optax, absl-py in $PYTHON (default python3); nothing is fetched.
# Extra arguments go to bench/gpu.py (--help lists them), run as a module from the root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
fi
# Let XLA take most of the GPU's memory up front (its default is 75%); no effect on CPU.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
exec timeout "${BENCH_GPU_TIMEOUT_S:-290}" "$PY" -m bench.gpu "$@"
