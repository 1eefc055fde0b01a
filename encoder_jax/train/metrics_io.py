"""Where a run's numbers go: TensorBoard event files, metrics.jsonl and a progress line.

  writer = MetricWriter(workdir, resume_step=0)
  writer.write(step, "train", {"loss": 7.1, "tokens_per_s": 1.3e3})
  print(progress_line(step, total, scalars, eta_s=...))
  with Stage("compiling the train step"): ...          # start-up stages, with a heartbeat

metrics.jsonl has one JSON object per line: {"step": s, "split": "train"|"eval", ...scalars},
floats written with Python's repr (round-trips float32 values exactly, so per-step losses of
two runs can be compared bit for bit). On resume, lines of steps after the restored checkpoint
(work the killed process did and the resumed one repeats) are dropped, and TensorBoard is
told to purge its events from that step on, so each step appears once in both.
Only process 0 writes. Both go through encoder_jax.paths, so a gs:// workdir works: there
metrics.jsonl is rewritten whole at every row (objects cannot be appended to), and the event
file is uploaded whole at every flush (paths.Appender's rule, through etils.epath).
"""
from __future__ import annotations

import io
import json
import math
import os
import sys
import threading
import time
import uuid
from typing import Mapping

from etils import epath
import jax

from encoder_jax import paths

METRICS_FILE = "metrics.jsonl"


def read_jsonl(path: str | os.PathLike) -> list[dict]:
  return [json.loads(line) for line in epath.Path(path).read_text().splitlines() if line.strip()]


class _EventFileOnAnyPath:
  """tensorboardX's event-file writer for URIs, through etils.epath: keeps the bytes and
  uploads them whole at each flush (tensorboardX's own gs:// writer would be a second GCS
  client with its own credentials and endpoint settings)."""

  def __init__(self, path: str):
    self.path = epath.Path(path)
    self.buffer = io.BytesIO()
    self.closed = False

  def write(self, data: bytes) -> None:
    self.buffer.write(data)

  def flush(self) -> None:
    self.path.write_bytes(self.buffer.getvalue())

  def close(self) -> None:
    if not self.closed:
      self.flush()
      self.closed = True


class _EventFilesOnAnyPath:
  def open(self, path: str) -> _EventFileOnAnyPath:
    return _EventFileOnAnyPath(path)

  def directory_check(self, path: str) -> None:
    del path  # an object store needs no folders


_EVENT_FILE_SCHEMES = ("gs",)


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch.

  tensorboardX imports torch whenever it is installed (only to accept torch tensors, which we
  never pass), and a torch import costs seconds of every run's start-up; torch is in the test
  extras for the parity tests. It is hidden for this one import only, so a later
  `import torch` in the same process still works.
  """
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # makes `import torch` raise ImportError
    try:
      import tensorboardX  # noqa: F401  (imported here, with torch hidden, for its side effect)
    finally:
      del sys.modules["torch"]
  from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  for scheme in _EVENT_FILE_SCHEMES:
    record_writer.register_writer_factory(scheme, _EventFilesOnAnyPath())
  return SummaryWriter


class MetricWriter:
  """TensorBoard (tensorboardX) + metrics.jsonl for one workdir."""

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.path = epath.Path(workdir) / METRICS_FILE
    self._tb = self._file = None
    if not self.enabled:
      return
    if resume_step and self.path.exists():
      kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
      paths.write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
    # A unique suffix per writer: event files are named by the second they were opened in, and
    # on a bucket a resumed run opening one in the same second would replace the first's.
    self._tb = _summary_writer_class()(os.fspath(epath.Path(workdir) / "tensorboard"),
                                       purge_step=resume_step + 1 if resume_step else None,
                                       filename_suffix=f".{uuid.uuid4().hex[:8]}")
    self._file = paths.Appender(self.path)

  def write(self, step: int, split: str, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step), "split": split, "time": time.time()}
    row |= {k: float(v) for k, v in scalars.items()}
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    for k, v in scalars.items():
      self._tb.add_scalar(f"{split}/{k}", float(v), global_step=int(step))
    self._tb.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._tb.close()
      self._file = self._tb = None


class Stage:
  """`with Stage("compiling the train step"):` prints what starts, a line every `every_s`
  seconds while it lasts and its duration at the end (process 0 only), so a long start-up
  (corpus build, restore, XLA compile) never looks like a hang."""

  def __init__(self, what: str, every_s: float = 10.0):
    self.what, self.every_s = what, every_s
    self.enabled = jax.process_index() == 0
    self._done = threading.Event()
    self._thread = None

  def _heartbeat(self):
    while not self._done.wait(self.every_s):
      print(f"  ... still {self.what} ({format_duration(time.perf_counter() - self.t0)})",
            flush=True)

  def __enter__(self):
    self.t0 = time.perf_counter()
    if self.enabled:
      print(f"{self.what} ...", flush=True)
      self._thread = threading.Thread(target=self._heartbeat, daemon=True)
      self._thread.start()
    return self

  def __exit__(self, exc_type, *_):
    self.seconds = time.perf_counter() - self.t0
    self._done.set()
    if self.enabled and exc_type is None:
      print(f"{self.what}: done in {self.seconds:.1f} s", flush=True)


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  m, s = divmod(rest, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def si(x: float) -> str:
  for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.2f}{unit}"
  return f"{x:.1f}"


# Metrics worth a place on the progress line, in this order, when present.
_PROGRESS_KEYS = ("loss", "mlm_loss", "mlm_accuracy", "gen_loss", "gen_accuracy", "disc_loss",
                  "disc_accuracy", "main_loss", "nsp_accuracy", "sop_accuracy")


def progress_line(step: int, total: int, scalars: Mapping[str, float], *, eta_s: float) -> str:
  """'step 200/600 | loss 7.104 mlm_accuracy 0.061 | 1.31k tok/s 8.52G FLOP/s MFU 25.4% |
  FLOPs 1.2e13 | ETA 3m10s'."""
  width = len(str(total))
  parts = [f"step {step:>{width}d}/{total}"]
  parts.append(" ".join(f"{k} {scalars[k]:.4g}" for k in _PROGRESS_KEYS if k in scalars))
  if "tokens_per_s" in scalars:
    per_device = scalars.get("flops_per_s_per_device")
    parts.append(f"{si(scalars['tokens_per_s'])} tok/s {si(scalars['flops_per_s'])}FLOP/s"
                 + ("" if per_device is None or per_device == scalars["flops_per_s"] else
                    f" ({si(per_device)}FLOP/s/device)")
                 + f" MFU {100 * scalars['mfu']:.1f}%"
                 + (" (above the stated peak: see summary.json's mfu_note)"
                    if scalars["mfu"] > 1.0 else ""))
  parts.append(f"FLOPs {scalars.get('cumulative_flops', 0.0):.3g}")
  parts.append(f"ETA {format_duration(eta_s)}")
  return " | ".join(parts)
