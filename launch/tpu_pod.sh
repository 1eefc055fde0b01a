#!/usr/bin/env bash
# Pre-train on a Cloud TPU pod slice (every worker runs the same command; jax.distributed
# discovers the slice by itself on TPU VMs).
#
#   PROJECT=my-proj ZONE=us-central2-b TPU=bert-v4-32 ACCEL=v4-32 \
#   BUCKET=gs://my-bucket REPO=https://github.com/you/encoder_jax.git \
#   bash launch/tpu_pod.sh create        # queued resource (waits until ACTIVE)
#   bash launch/tpu_pod.sh install       # clone + pip install on all workers
#   bash launch/tpu_pod.sh plan "size=base,nsp=nsp" [flags]   # on this machine, no TPU
#   bash launch/tpu_pod.sh train "size=base,objective=mlm,nsp=nsp,format=segment_pair" [flags]
#   bash launch/tpu_pod.sh delete
#
# The mesh is the config's default, mesh=auto: the trainer compiles candidate layouts for the
# slice at start-up (mesh axes, ZeRO-1, rows a chip with accumulation to the recipe's global
# batch, remat, layer layout), runs the fastest that fits HBM by XLA's estimate and prints
# it (encoder_jax/train/layout.py). `plan` runs the same search here, with libtpu compiling
# for $ACCEL's topology (TOPOLOGY=v5e:4x4 for a slice not listed below), before you rent it.
#
# Data: pre-tokenized TFDS datasets are read from $BUCKET/tfds (build them once with
# `python -m encoder_jax.data.build --data_dir=$BUCKET/tfds ...`); checkpoints, TensorBoard
# and metrics go to $BUCKET/runs/<name>. Each host reads only its shard of every batch.
# DRY_RUN=1 prints every gcloud command (one line, shell-quoted) instead of running it: what
# the README's commands do, checkable on a machine without gcloud (tests/test_readmes.py runs
# the printed training command on a CPU).
set -euo pipefail
: "${PROJECT:?set PROJECT}" "${ZONE:?set ZONE}" "${TPU:?set TPU (node name)}"
ACCEL=${ACCEL:-v4-32}                      # v4-32 = 16 chips / 4 hosts; v5e: v5litepod-32
RUNTIME=${RUNTIME:-tpu-ubuntu2204-base}    # v5e: v2-alpha-tpuv5-lite
BUCKET=${BUCKET:-}
REPO=${REPO:-}
JAX_VERSION=${JAX_VERSION:-0.10.2}
# The project needs Python >= 3.11; TPU VM base images ship 3.10. uv (pinned, installed with
# the image's pip) fetches a standalone CPython 3.11 and builds the venv with it.
UV_VERSION=${UV_VERSION:-0.13.8}
gcloud_() {  # gcloud, or with DRY_RUN=1 the command it would run
  if [ -n "${DRY_RUN:-}" ]; then printf 'gcloud'; printf ' %q' "$@"; printf '\n'
  else gcloud "$@"; fi
}
ssh_all() {
  gcloud_ compute tpus tpu-vm ssh "$TPU" --project="$PROJECT" --zone="$ZONE" --worker=all \
    --command="$1"
}
topology_of() {  # Cloud TPU accelerator type -> libtpu's topology name
  case "$1" in
    v4-8) echo v4:2x2x1 ;; v4-16) echo v4:2x2x2 ;; v4-32) echo v4:2x2x4 ;; v4-64) echo v4:2x4x4 ;;
    v5litepod-4) echo v5e:2x2 ;; v5litepod-8) echo v5e:2x4 ;; v5litepod-16) echo v5e:4x4 ;;
    v5litepod-32) echo v5e:4x8 ;; v5litepod-64) echo v5e:8x8 ;;
    v5p-8) echo v5p:2x2x1 ;; v5p-16) echo v5p:2x2x2 ;; v5p-32) echo v5p:2x2x4 ;;
    *) echo "unknown ACCEL=$1: give TOPOLOGY=<libtpu topology, e.g. v5e:4x4>" >&2; return 1 ;;
  esac
}
case "${1:-}" in
  plan)
    arg=${2:?config argument, e.g. size=base,nsp=nsp}
    shift 2
    topo=${TOPOLOGY:-$(topology_of "$ACCEL")}
    cmd=(bash run.sh tpu python -m encoder_jax.train.layout "--tpu_topology=$topo"
         "--config=configs/pretrain.py:$arg" "$@")
    if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${cmd[@]}"; printf '\n'; else "${cmd[@]}"; fi ;;
  create)
    gcloud_ compute tpus queued-resources create "$TPU-qr" --project="$PROJECT" --zone="$ZONE" \
      --node-id="$TPU" --accelerator-type="$ACCEL" --runtime-version="$RUNTIME"
    [ -n "${DRY_RUN:-}" ] && exit 0
    until gcloud compute tpus queued-resources describe "$TPU-qr" --project="$PROJECT" \
        --zone="$ZONE" --format='value(state.state)' | grep -q ACTIVE; do
      echo "waiting for $TPU-qr to become ACTIVE..."; sleep 30
    done ;;
  install)
    : "${REPO:?set REPO (git URL of this repository)}"
    ssh_all "set -e; [ -d encoder_jax ] || git clone $REPO encoder_jax; cd encoder_jax && git pull \
      && python3 -m pip install -q --user uv==$UV_VERSION \
      && ~/.local/bin/uv venv --python 3.11 .venv \
      && ~/.local/bin/uv pip install -q --python .venv/bin/python -e . 'jax[tpu]==$JAX_VERSION' \
      && .venv/bin/python -c 'import sys; assert sys.version_info >= (3, 11), sys.version'" ;;
  train)
    : "${BUCKET:?set BUCKET (gs://...)}"
    arg=${2:?config argument, e.g. size=base,objective=mlm}
    shift 2
    name=${NAME:-$(date +%Y%m%d-%H%M%S)}
    # --distributed=auto: jax.distributed.initialize() discovers the slice's hosts (TPU VM
    # metadata); without it every host would train alone on its own 4 chips.
    ssh_all "cd encoder_jax && .venv/bin/python -m encoder_jax.main --mode=pretrain \
      --distributed=auto --config=configs/pretrain.py:$arg --workdir=$BUCKET/runs/$name \
      --config.data.data_dir=$BUCKET/tfds $* 2>&1 | tee -a train-$name.log" ;;
  delete)
    gcloud_ compute tpus queued-resources delete "$TPU-qr" --project="$PROJECT" --zone="$ZONE" \
      --force --quiet ;;
  *) sed -n 2,24p "$0"; exit 2 ;;
esac
