"""`bash run.sh tb <dir>` serves the curves the trainer writes: TensorBoard itself (installed
with the package) reads the event files tensorboardX writes, run by run and tag by tag."""
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.request

from encoder_jax.train.metrics_io import MetricWriter

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_run_sh_tb_serves_a_runs_curves(tmp_path):
  writer = MetricWriter(tmp_path / "runs" / "mini")
  for step in (10, 20, 30):
    writer.write(step, "train", {"loss": 8.0 - step / 10, "mfu": 0.25})
  writer.write(30, "eval", {"loss": 5.5})
  writer.close()
  port = _free_port()
  env = dict(os.environ, TB_PORT=str(port), ENCODER_JAX_VENV=str(ROOT / ".venv"))
  server = subprocess.Popen(["bash", str(ROOT / "run.sh"), "tb", str(tmp_path / "runs")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
  try:
    deadline, tags = time.time() + 120, {}
    while time.time() < deadline and "train/loss" not in tags.get("mini/tensorboard", {}):
      assert server.poll() is None, server.stdout.read()
      try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags") as r:
          tags = json.load(r)
      except OSError:
        time.sleep(0.5)
    assert set(tags["mini/tensorboard"]) == {"train/loss", "train/mfu", "eval/loss"}, tags
    url = (f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=mini/tensorboard"
           "&tag=train/loss")
    with urllib.request.urlopen(url) as r:
      points = json.load(r)
    assert [(step, value) for _, step, value in points] == [(10, 7.0), (20, 6.0), (30, 5.0)]
  finally:
    server.terminate()
    server.wait(timeout=30)
