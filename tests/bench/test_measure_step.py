"""bench/measure_step.py, dry on this CPU (no TPU or GPU here): it times the trainer's own
compiled step on the real loader's batches and writes the measured columns, with the estimate
columns empty where XLA has no cost model (a TPU fills them); the command line appends rows."""
import csv
import os
import pathlib
import subprocess
import sys

import loop_helpers as H

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_measures_the_real_step_and_leaves_the_estimate_to_a_tpu(tmp_path):
  from bench import measure_step

  env = H.make_env(tmp_path)
  config = H.tiny_config(env)
  lines = []
  row = measure_step.measure(config, steps=3, warmup=1, say=lines.append)
  assert row["platform"] == "cpu" and row["devices"] == 1  # mesh=auto on a CPU: one device
  assert row["step_ms"] > 0 and row["steps_s"] > 0 and row["tok_s_chip"] > 0
  assert abs(row["steps_s"] * row["step_ms"] - 1e3) < 1.0
  assert row["tok_s_chip"] == round(4 * 32 / (row["step_ms"] / 1e3))  # 4 rows of 32 a step
  assert 0 < row["mfu"] < 1 and row["batch"] == 4 and row["accumulation"] == 1
  assert "est_step_ms" not in row and row["peak_hbm_gib"] is None  # no cost model, no HBM
  assert "unrolled layers" in row["program"] and row["hbm_gib"] > 0  # (XLA:CPU's buffers)

  out = tmp_path / "measured.csv"
  cfg = tmp_path / "cfg.py"
  cfg.write_text(
      "from configs import pretrain\n"
      "def get_config():\n"
      f"  c = pretrain.get_config('size=tiny,precision=fp32')\n"
      "  c.model.update(dict(num_layers=1, hidden_size=32, num_heads=2, ffn_size=64, "
      "max_positions=32))\n"
      f"  c.data.update(dict(source={env['source']!r}, data_dir={env['data_dir']!r}, "
      "max_length=32, batch_size=4))\n"
      "  c.train.peak_flops = 1e11\n"
      "  return c\n")
  for _ in range(2):
    subprocess.run([sys.executable, "bench/measure_step.py", f"--config={cfg}", "--steps=2",
                    "--warmup=1", f"--out={out}"], cwd=ROOT, check=True, timeout=600,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
  with out.open() as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 2 and tuple(rows[0]) == measure_step.FIELDS
  assert all(float(r["step_ms"]) > 0 and r["est_step_ms"] == "" for r in rows)
