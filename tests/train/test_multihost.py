"""Two processes x 4 CPU devices through jax.distributed == one process x 8 devices (losses,
gradient norms, parameters).

Each process reads only its rows; a checkpoint written by 2 processes restores in 1.
Runs the worker in subprocesses (loopback only, bounded by timeouts).
"""
import numpy as np
import pytest

from multihost_helpers import free_port, spawn, wait

pytestmark = pytest.mark.slow


def test_two_processes_equal_one(tmp_path):
  one, two, back = tmp_path / "one", tmp_path / "two", tmp_path / "back"
  for d in (one, two, back):
    d.mkdir()
  port = free_port()
  wait([spawn(0, 2, port, two), spawn(1, 2, port, two), spawn(0, 1, free_port(), one)])
  ref = np.load(one / "process0.npz")
  p0, p1 = np.load(two / "process0.npz"), np.load(two / "process1.npz")
  # Each process read only its half of every global batch, and together exactly the global batch.
  assert p0["read"].shape == p1["read"].shape == (3, 4)
  for s in range(3):
    np.testing.assert_array_equal(np.concatenate([p0["read"][s], p1["read"][s]]), ref["read"][s])
    assert not set(p0["read"][s]) & set(p1["read"][s])
  rel = np.abs(p0["losses"] - ref["losses"]) / np.abs(ref["losses"])
  print(f"2x4 vs 1x8 devices: losses {ref['losses']}, max rel diff {rel.max():.1e}")
  assert rel.max() <= 1e-5
  np.testing.assert_array_equal(p0["losses"], p1["losses"])
  # The gradient itself, not only what clipped AdamW makes of it: a gradient summed over
  # processes instead of averaged moves the parameters exactly as the right one would.
  np.testing.assert_allclose(p0["grad_norms"], ref["grad_norms"], rtol=1e-5)
  np.testing.assert_array_equal(p0["grad_norms"], p1["grad_norms"])
  params = [k for k in ref.files if k.startswith("[")]
  assert params
  for k in params:
    np.testing.assert_allclose(p0[k], ref[k], atol=1e-5, err_msg=k)
  # The checkpoint written collectively by 2 processes restores in 1 process (8 devices).
  wait([spawn(0, 1, free_port(), back, two)])
  restored = np.load(back / "restored.npz")
  assert int(restored["step"]) == 3 and int(restored["data_step"]) == 3
  for k in params:
    np.testing.assert_array_equal(restored[k], p0[k], err_msg=k)
