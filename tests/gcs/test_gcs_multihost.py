"""2 processes x 4 CPU devices (jax.distributed, gloo on 127.0.0.1) write one checkpoint to
gs:// (the GCS API on 127.0.0.1, tests/gcs/conftest.py); 1 process x 8 devices restores it
bit for bit. The worker is tests/train/multihost_worker.py with CHECKPOINT_ROOT on the bucket.
"""
import pathlib

from etils import epath
import numpy as np
import pytest

from encoder_jax.train import checkpoint
from multihost_helpers import child_env, free_port, spawn, wait

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
pytestmark = pytest.mark.slow


def _spawn(pid, nproc, port, out, ckpt_root, *extra):
  return spawn(pid, nproc, port, out, *extra,  # (the GCS client settings: inherited)
               env=child_env(CHECKPOINT_ROOT=ckpt_root))


def test_two_processes_write_one_gcs_checkpoint_that_one_process_restores(gcs, tmp_path):
  two, back = tmp_path / "two", tmp_path / "back"
  two.mkdir()
  back.mkdir()
  ckpt_root = f"{gcs['root']}/multihost/ckpt"
  port = free_port()
  wait([_spawn(0, 2, port, two, ckpt_root), _spawn(1, 2, port, two, ckpt_root)])
  step_dir = epath.Path(ckpt_root) / "3"
  assert checkpoint.verify(step_dir) is None  # sealed by process 0, every file intact
  assert not (two / "ckpt").exists()  # nothing went to a local folder
  p0, p1 = np.load(two / "process0.npz"), np.load(two / "process1.npz")

  wait([_spawn(0, 1, free_port(), back, ckpt_root, two)])
  restored = np.load(back / "restored.npz")
  assert int(restored["step"]) == 3 and int(restored["data_step"]) == 3
  params = [k for k in p0.files if k.startswith("[")]
  assert params
  for k in params:
    np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
    np.testing.assert_array_equal(restored[k], p0[k], err_msg=k)
