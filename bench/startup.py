r"""Start-up and shutdown latency of the pre-training CLI, as a user sees them.

  bash run.sh python -m bench.startup                 # demo recipe, cached demo corpus, 3 runs
  bash run.sh python -m bench.startup --repeats=1 --config_arg=size=tiny

Launches `python -m encoder_jax.main --mode=pretrain` (a fresh workdir each time, the corpus and
the XLA cache already built by a warm-up run that is not counted) and reads its output as it
comes. Reports, as medians over --repeats:
  first line     seconds from launch to the first line of output
  first step     seconds from launch to the first training-progress line (step 1, log_every=1)
  SIGTERM exit   seconds from a SIGTERM sent right after that line to the process's exit, and
                 the exit code (0 expected: the step in flight is saved first)
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed launches (after one untimed warm-up).")
_CONFIG = flags.DEFINE_string("config_arg", "runlocal", "configs/pretrain.py argument.")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def launch(workdir: str) -> dict:
  cmd = [sys.executable, "-m", "encoder_jax.main", "--mode=pretrain", f"--workdir={workdir}",
         f"--config=configs/pretrain.py:{_CONFIG.value}", "--config.train.steps=100000",
         "--config.train.log_every=1", "--config.train.eval_every=0",
         "--config.train.checkpoint_every=0"]
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
  out = {"first_line_s": None, "first_step_s": None}
  lines = []
  for line in proc.stdout:
    lines.append(line)
    now = time.perf_counter() - t0
    if out["first_line_s"] is None:
      out["first_line_s"] = now
    if line.startswith("step "):
      out["first_step_s"] = now
      t_term = time.perf_counter()
      proc.send_signal(signal.SIGTERM)
      break
  if out["first_step_s"] is None:
    proc.wait()
    raise RuntimeError("no progress line; the run printed:\n" + "".join(lines[-30:]))
  for line in proc.stdout:  # drain until exit
    lines.append(line)
  out["rc"] = proc.wait()
  out["sigterm_exit_s"] = time.perf_counter() - t_term
  return out


def main(argv):
  del argv
  base = pathlib.Path(tempfile.mkdtemp(prefix="startup_bench_"))
  try:
    launch(str(base / "warmup"))  # builds the corpus / vocab / XLA cache once
    runs = [launch(str(base / f"run{i}")) for i in range(_REPEATS.value)]
  finally:
    shutil.rmtree(base, ignore_errors=True)
  med = lambda k: statistics.median(r[k] for r in runs)
  print(f"startup ({_CONFIG.value}, {os.cpu_count()} cores, {len(runs)} runs, medians): "
        f"first line {med('first_line_s'):.2f} s | first step {med('first_step_s'):.1f} s | "
        f"SIGTERM -> exit {med('sigterm_exit_s'):.2f} s, exit codes "
        f"{sorted({r['rc'] for r in runs})}")


if __name__ == "__main__":
  app.run(main)
