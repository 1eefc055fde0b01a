"""A GCS API on 127.0.0.1 for the gs:// tests: the `gcs` fixture starts the emulator
(tests/gcs/emulator.py, in memory, one bucket) on a free port, points every GCS client of this
process and of its children at it, and stops it at the end. Nothing leaves the machine."""
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
import emulator  # noqa: E402  (pytest puts a conftest's folder on the path)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="session")
def gcs():
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  proc = subprocess.Popen([sys.executable, str(HERE / "emulator.py"), str(port), emulator.BUCKET],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 60
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
      break
    except OSError:
      if proc.poll() is not None or time.time() > deadline:
        proc.kill()
        raise RuntimeError(f"the GCS emulator did not start:\n{proc.communicate()[0]}")
      time.sleep(0.1)
  env = emulator.client_env(url)
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)  # children inherit it; this process's clients read it on first use
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"  # (fsspec read FSSPEC_* at import)
  try:
    yield {"url": url, "bucket": emulator.BUCKET, "root": f"gs://{emulator.BUCKET}"}
  finally:
    fsspec.config.conf["gcs"].pop("token", None)
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    proc.terminate()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
