"""bench/tpu_calibrate.py's optimizer rows and a layer's pieces compile and price (a tiny BERT
on a v5e-4, with libtpu in a subprocess as tests/tpu does): the update branch of an accumulating
step, replicated and split over the data axis (ZeRO-1); the attention core, FFN and projections
of a layer, and the gradients' all-reduce; each a positive estimate."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBTPU = os.environ.get("ENCODER_JAX_LIBTPU", "")

SCRIPT = """
from jax.experimental import topologies
from bench import tpu_calibrate
from encoder_jax.train import flops
devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
peak = flops.peak_flops_per_device(devices[0].device_kind)
print("\\n".join(tpu_calibrate._optimizer("tiny", (("v5e:2x2", "v5e-4"),))))
print("\\n".join(tpu_calibrate._parts(devices, peak, rows=2, seq=128, heads=2, ffn=512,
                                       sizes=("tiny",))))
"""


def test_optimizer_rows_price_both_layouts(tmp_path):
  if not LIBTPU or not pathlib.Path(LIBTPU, "libtpu").is_dir():
    pytest.skip("libtpu is not installed: run the suite with `bash run.sh test`")
  env = dict(os.environ, PYTHONPATH=f"{LIBTPU}:{ROOT}", JAX_PLATFORMS="cpu",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1", XLA_FLAGS="",
             ENCODER_JAX_CACHE=str(tmp_path))  # (the layout cache: compile, do not reuse)
  proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  m = re.search(r"v5e-4: replicated ([\d.]+), ZeRO-1 ([\d.]+)", proc.stdout)
  assert m, proc.stdout
  assert float(m[1]) > 0 and float(m[2]) > 0
  # the layer's pieces and the gradients' all-reduce, each a positive estimate
  parts = re.findall(r"\n  (attention core|FFN|four|BERT-tiny).*?: est ([\d.]+) ms", proc.stdout)
  assert [p for p, _ in parts] == ["attention core", "FFN", "four", "BERT-tiny"], proc.stdout
  assert all(float(e) > 0 for _, e in parts), parts
