"""Starting tests/train/multihost_worker.py as several local processes (jax.distributed over
127.0.0.1), shared by tests/train/test_multihost.py and tests/gcs/test_gcs_multihost.py."""
import os
import pathlib
import re
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "train" / "multihost_worker.py"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def spawn(pid, nproc, port, out, *extra, env=None) -> subprocess.Popen:
  """Worker `pid` of `nproc`, coordinator on 127.0.0.1:`port`, results to `out`; its XLA_FLAGS
  the suite's with its share of the 8 fake devices (`xla_flags`)."""
  env = dict(env if env is not None else os.environ, XLA_FLAGS=xla_flags(8 // nproc))
  return subprocess.Popen([sys.executable, str(WORKER), str(pid), str(nproc), str(port), str(out),
                           *map(str, extra)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def wait(procs, timeout=420) -> None:
  """Waits for every worker; kills them all if one hangs; a failure shows its output's end."""
  for p in procs:
    try:
      out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, out[-4000:]


def xla_flags(devices: int) -> str:
  """The suite's XLA_FLAGS (tests/conftest.py: optimisation level 0 and XLA:CPU's older fusion
  emitters, which compile a step in less than half the time) with `devices` fake CPU devices:
  for the trainer processes a test starts with a device count of their own."""
  return (re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                 os.environ.get("XLA_FLAGS", "")).strip()
          + f" --xla_force_host_platform_device_count={devices}").strip()


def child_env(**extra) -> dict:
  """This environment plus `extra`, with the repository on PYTHONPATH."""
  return dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(
      filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
