#!/usr/bin/env bash
# One entry point for a fresh machine with Python 3.11:
#   bash run.sh demo [flags]   the main job: pre-train the demo recipe, fine-tune, compare
#   bash run.sh test [args]    the test-suite (what CI runs)
#   bash run.sh python ...     anything else inside the project's virtualenv
# Creates (or reuses) ./.venv and installs the pinned requirements the first time, and again
# whenever setup.py changes. Set PYTHON to choose the interpreter (default python3.11).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
VENV=${ENCODER_JAX_VENV:-.venv}
what=${1:-}
[ $# -gt 0 ] && shift

ensure_venv() {  # $1: pip extras ("" or "[test]")
  local stamp="$VENV/.installed-$(sha256sum setup.py | cut -c1-16)$1"
  if [ ! -f "$stamp" ]; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    echo "installing encoder_jax$1 into $VENV (first run only, ~2-3 minutes)..." >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$1"
    touch "$stamp"
  fi
}

case "$what" in
  demo)
    # Pre-train the demo recipe (~8 min on 2 cores), fine-tune its checkpoint, a random init of
    # its shape and all-MiniLM-L6-v2 on both demo tasks (3 seeds each), print the comparison.
    # Re-running resumes / reuses what runs/demo holds. Extra flags go to encoder_jax.demo,
    # e.g. --config.train.steps=3000 or --seeds=5.
    ensure_venv ""
    exec "$VENV/bin/python" -m encoder_jax.demo --workdir="${DEMO_WORKDIR:-runs/demo}" "$@" ;;
  test)
    ensure_venv "[test]"
    exec "$VENV/bin/python" -m pytest "$@" ;;
  python)
    ensure_venv "[test]"
    exec "$VENV/bin/python" "$@" ;;
  *)
    sed -n '2,8p' "$0" >&2; exit 2 ;;
esac
