#!/usr/bin/env bash
# Pre-train on this machine (CPU, or the local GPUs/TPU jax finds), in the repo's venv.
#   bash launch/local.sh [config-arg] [extra flags...]
#   bash launch/local.sh size=mini,objective=electra --config.train.steps=2000
# Writes to ./runs/<timestamp> unless --workdir is given among the extra flags.
set -euo pipefail
cd "$(dirname "$0")/.."
arg=${1:-size=tiny}
[ $# -gt 0 ] && shift
workdir="runs/$(date +%Y%m%d-%H%M%S)"
for a in "$@"; do case "$a" in --workdir=*) workdir="${a#--workdir=}";; esac; done
exec bash run.sh python -m encoder_jax.main --mode=pretrain \
  --config="configs/pretrain.py:${arg}" --workdir="$workdir" "$@"
