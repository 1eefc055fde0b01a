"""bench/learning_vs_hf.py compares like with like: a 3-step dry run of both processes.

The bench's claim is that our trainer and HF's BertForMaskedLM see the same rows, the same
masks and the same initial weights, and take the same optimiser steps; only then does a gap
between their learning curves say something about our trainer. Without dropout every one of
those is checkable to float precision: the first batch's corrupted ids and labels (hashed in
each process from what it actually fed its model), the eval loss at step 0, the first train
loss (our jitted step vs HF's forward) and the eval loss after the first updates.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from multihost_helpers import xla_flags  # the suite's flags, for the processes tests start

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.parity

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_dry_run_both_systems_see_the_same_inputs(tmp_path):
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))  # one CPU device, as a user has
  out = subprocess.run([sys.executable, "-m", "bench.learning_vs_hf", "--dry_run",
                        f"--out_dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  print(out.stdout[-3000:])
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  (result,) = tmp_path.glob("learning_vs_hf_*.json")
  data = json.loads(result.read_text())
  ours, hf = data["curves"][0], data["curves"][1]
  assert (ours["name"], hf["name"]) == ("ours", "HF")
  assert ours["first_digest"] == hf["first_digest"]
  assert abs(ours["points"][0]["loss"] - hf["points"][0]["loss"]) <= 1e-4
  assert abs(ours["first_loss"] - hf["first_loss"]) <= 1e-4
  # The same optimiser: after 3 steps (warm-up 1, then lr 1e-3 and 5e-4) still equal.
  assert [p["step"] for p in ours["points"]] == [p["step"] for p in hf["points"]] == [0, 1, 2, 3]
  for o, h in zip(ours["points"], hf["points"]):
    assert abs(o["loss"] - h["loss"]) <= 1e-3, (o, h)
  assert all(c["ok"] for c in data["checks"]), data["checks"]
  assert (tmp_path / result.name.replace(".json", ".png")).stat().st_size > 0
