#!/usr/bin/env bash
# One entry point for a fresh machine with Python 3.11:
#   bash run.sh demo [flags]   the main job: pre-train the demo recipe, fine-tune, compare
#   bash run.sh test [args]    the test-suite (what CI runs)
#   bash run.sh python ...     anything else inside the project's virtualenv
#   bash run.sh tpu ...        the same with the TPU compiler (libtpu) on the path: compiles
#                              the real step for abstract TPU topologies on this CPU
#   bash run.sh tb [dir] [...] TensorBoard on the runs under dir (default runs/), port 6006
# Creates (or reuses) ./.venv and installs the pinned requirements the first time, and again
# whenever setup.py changes. Set PYTHON to choose the interpreter (default python3.11).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
VENV=${ENCODER_JAX_VENV:-.venv}
what=${1:-}
[ $# -gt 0 ] && shift

ensure_venv() {  # $1: pip extras ("" or "[test]"); a venv with the test extra has it all
  local base="$VENV/.installed-$(sha256sum setup.py | cut -c1-16)"
  local stamp="$base$1"
  if [ ! -f "$stamp" ] && [ ! -f "$base[test]" ]; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    echo "installing encoder_jax$1 into $VENV (first run only, ~2-3 minutes)..." >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$1"
    touch "$stamp"
  fi
}

# libtpu, the TPU compiler of `jax[tpu]` at the pinned jax (0.10.2 takes libtpu 0.0.42.*),
# in its own folder beside the venv: ~0.7 GB that only TPU compiles need. It is put on
# PYTHONPATH for `run.sh tpu` and for the tests that compile for TPU topologies (they find it
# through ENCODER_JAX_LIBTPU and skip, saying so, where it is missing).
LIBTPU_VERSION=0.0.42.1
LIBTPU_DIR="$VENV/libtpu-$LIBTPU_VERSION"
case "$LIBTPU_DIR" in /*) ;; *) LIBTPU_DIR="$PWD/$LIBTPU_DIR" ;; esac
ensure_libtpu() {
  if [ ! -f "$LIBTPU_DIR/.installed" ]; then
    echo "installing libtpu==$LIBTPU_VERSION into $LIBTPU_DIR (first run only)..." >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --target "$LIBTPU_DIR" "libtpu==$LIBTPU_VERSION"
    touch "$LIBTPU_DIR/.installed"
  fi
}

case "$what" in
  demo)
    # Pre-train the demo recipe (~8 min on 2 cores), fine-tune its checkpoint, a random init of
    # its shape and all-MiniLM-L6-v2 on both demo tasks (3 seeds each), print the comparison.
    # Re-running resumes / reuses what runs/demo holds. Extra flags go to encoder_jax.demo,
    # e.g. --config.train.steps=3000 or --seeds=5. It ends by exporting the checkpoint to
    # runs/demo/hf and loading it in transformers (the reload check): the test extra brings
    # transformers and the CPU wheel of torch (~0.9 GB installed, about a minute more on the
    # first run from a warm pip cache).
    ensure_venv "[test]"
    exec "$VENV/bin/python" -m encoder_jax.demo --workdir="${DEMO_WORKDIR:-runs/demo}" "$@" ;;
  test)
    ensure_venv "[test]"
    ensure_libtpu
    ENCODER_JAX_LIBTPU="$LIBTPU_DIR" exec "$VENV/bin/python" -m pytest "$@" ;;
  tpu)
    ensure_venv "[test]"
    ensure_libtpu
    [ "${1:-}" = python ] && shift  # `run.sh tpu python -m ...` reads as `run.sh python`
    PYTHONPATH="$LIBTPU_DIR${PYTHONPATH:+:$PYTHONPATH}" JAX_PLATFORMS=cpu \
      ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
      exec "$VENV/bin/python" "$@" ;;
  python)
    ensure_venv "[test]"
    exec "$VENV/bin/python" "$@" ;;
  tb)
    # Every run writes TensorBoard event files to <workdir>/tensorboard; this serves the curves
    # of every run under the folder (compare runs side by side). Extra flags go to tensorboard.
    ensure_venv ""
    logdir=${1:-runs}
    [ $# -gt 0 ] && shift
    exec "$VENV/bin/tensorboard" --logdir "$logdir" --port "${TB_PORT:-6006}" "$@" ;;
  *)
    sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
