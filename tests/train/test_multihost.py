"""Two processes x 4 CPU devices through jax.distributed == one process x 8 devices (losses,
gradient norms, parameters).

Each process reads only its rows; a checkpoint written by 2 processes restores in 1.
Runs the worker in subprocesses (loopback only, bounded by timeouts).
"""
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _spawn(pid, nproc, port, out, *extra):
  return subprocess.Popen([sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(out),
                           *map(str, extra)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _wait(procs, timeout=420):
  for p in procs:
    try:
      out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, out[-4000:]


def test_two_processes_equal_one(tmp_path):
  one, two, back = tmp_path / "one", tmp_path / "two", tmp_path / "back"
  for d in (one, two, back):
    d.mkdir()
  port = _free_port()
  _wait([_spawn(0, 2, port, two), _spawn(1, 2, port, two), _spawn(0, 1, _free_port(), one)])
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
  _wait([_spawn(0, 1, _free_port(), back, two)])
  restored = np.load(back / "restored.npz")
  assert int(restored["step"]) == 3 and int(restored["data_step"]) == 3
  for k in params:
    np.testing.assert_array_equal(restored[k], p0[k], err_msg=k)
