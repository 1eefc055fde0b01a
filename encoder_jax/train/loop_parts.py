"""The pieces of the pre-training loop, each small enough for a unit test to drive alone.

  meter = ThroughputMeter(flops_per_step, tokens_per_step, n_peak, peak)
  pending = PendingMetrics(window)          # metrics on device until a log/eval/save step
  rollback = Rollback(ckpt, meta.get("rollback"))
  due = Schedule(log_every, eval_every, checkpoint_every, end_step, evaluating).at(step)
  profiler = StepProfiler(first, count, workdir / "profile")  # train.profile_steps
  heartbeat = Heartbeat(end_step, tokens_per_step, log_every)  # a line every 30 s at least
  step = Precompiled.of(jitted, *abstract_args, name="train step")  # compiles meanwhile

encoder_jax.train.loop composes them (train_and_evaluate); its docstring states the behaviour
they add up to. None of them touches the model: they take numbers, steps and a Checkpointer.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import tempfile
import time
from collections import Counter
from typing import Callable

from absl import logging
from etils import epath

import jax
import numpy as np

from encoder_jax import paths
from encoder_jax.train import flops as flops_lib
from encoder_jax.train.checkpoint import Checkpointer
from encoder_jax.train.metrics_io import format_duration, si
from encoder_jax.train.recovery import Window


class Precompiled:
  """A jitted function whose XLA compilation for one set of argument types has started in a
  background thread, so that it overlaps the rest of start-up (reading data, initialising or
  restoring the state, which compiles its own program, and the other step's compilation). XLA
  compiles with the GIL released, so the compile runs beside that work; on a 2-core CPU it
  shortened the GPU grids' dry run with an empty compilation cache (figures: bench/README.md).
  On an accelerator host it should hide the evaluation and init compiles behind the train
  step's (not measured: no accelerator was available).

  Tracing and lowering (`lowered`, done by the caller, on its own thread) see the caller's JAX
  configuration; only `Lowered.compile` runs in the thread. The first call waits for the
  compilation. A first call whose arguments the compiled program does not take (their types,
  shapes or shardings differ from those lowered) falls back to `jitted`, which compiles as
  usual, and a warning says so; `fell_back` records it (tests check it stays False)."""

  _pool = concurrent.futures.ThreadPoolExecutor(max_workers=2,
                                                thread_name_prefix="encoder_jax_compile")

  def __init__(self, lowered, jitted: Callable, name: str):
    self.jitted, self.name, self.fell_back = jitted, name, False
    self._compiled = None
    self._future = self._pool.submit(lowered.compile)

  @classmethod
  def of(cls, jitted: Callable, *abstract_args, name: str) -> Callable:
    """`jitted` lowered for `abstract_args` and compiling; a function that cannot be lowered
    (not a jax.jit, e.g. a test's wrapper around one) is returned unchanged."""
    if not hasattr(jitted, "lower"):
      return jitted
    return cls(jitted.lower(*abstract_args), jitted, name)

  def __call__(self, *args):
    if self._future is None:
      return (self.jitted if self._compiled is None else self._compiled)(*args)
    future, self._future = self._future, None
    try:
      self._compiled = future.result()
      return self._compiled(*args)
    except (TypeError, ValueError) as e:  # arguments unlike those lowered (checked before running)
      logging.warning("%s: the ahead-of-time compiled program does not take these arguments "
                      "(%s); compiling for them instead", self.name, str(e).splitlines()[0])
      self._compiled, self.fell_back = None, True
      return self.jitted(*args)


class NonFiniteError(FloatingPointError):
  """args: (step, metric name, value)."""


class ThroughputMeter:
  """Steady-state speed between log rows, without the time spent outside training steps.

  The first step of a process (compilation) is not counted: `start(step)` marks the clock after
  it. Each `lap(step)` measures the steps since the last mark, minus the seconds reported with
  `exclude` (evaluations, checkpoint saves), and returns step time, tokens/s, FLOP/s and MFU
  (encoder_jax.train.flops.throughput); `mark(step)` restarts the clock once the row is
  written, so writing it is not counted either. Where a step's work varies (fine-tuning), pass
  tokens_per_step 0 and `count(examples=n, tokens=t)` each step; flops None leaves FLOP/s out.
  """

  def __init__(self, flops_per_step: float | None, tokens_per_step: int,
               n_devices: int = 1, peak_per_device: float = 0.0,
               clock: Callable[[], float] = time.perf_counter):
    self.flops_per_step, self.tokens_per_step = flops_per_step, tokens_per_step
    self.n_devices, self.peak = n_devices, peak_per_device
    self.clock = clock
    self.mark_t, self.mark_step, self.excluded_s, self.counts = None, 0, 0.0, Counter()
    self.steady_s, self.steady_steps, self.steady_counts = 0.0, 0, Counter()

  def mark(self, step: int) -> None:
    self.mark_t, self.mark_step, self.excluded_s, self.counts = self.clock(), step, 0.0, Counter()

  start = mark  # (after the compiling step)

  def exclude(self, seconds: float) -> None:
    self.excluded_s += seconds

  def count(self, **amounts: float) -> None:
    self.counts.update(amounts)

  def lap(self, step: int) -> dict[str, float]:
    n = step - self.mark_step
    if self.mark_t is None or n <= 0:
      return {}
    dt = max(self.clock() - self.mark_t - self.excluded_s, 1e-9)
    self.counts["tokens"] += n * self.tokens_per_step
    self.steady_s += dt
    self.steady_steps += n
    self.steady_counts.update(self.counts)
    row = dict(step_time_s=dt / n, **{f"{k}_per_s": v / dt for k, v in self.counts.items()})
    if self.flops_per_step is not None:
      row |= flops_lib.throughput(self.flops_per_step, dt / n, self.n_devices, self.peak)
    return row

  def eta_s(self, steps_left: int) -> float:
    if not self.steady_steps:
      return math.nan
    return steps_left * self.steady_s / self.steady_steps

  def summary(self) -> dict[str, float | None]:
    """Mean tokens/s (and other counts per second), FLOP/s and MFU over every counted step; None
    when none was (a finished run started again only evaluates) or when unknown."""
    out = dict(tokens_per_s=None, flops_per_s=None, mfu=None)
    if self.steady_steps:
      out |= {f"{k}_per_s": v / self.steady_s for k, v in self.steady_counts.items()}
    if self.steady_steps and self.flops_per_step is not None:
      flops_per_s = self.steady_steps / self.steady_s * self.flops_per_step
      out |= dict(flops_per_s=flops_per_s, mfu=flops_per_s / (self.n_devices * self.peak))
    return out


PROGRESS_EVERY_S = 30.0  # the longest a training run goes without a progress line


class Heartbeat:
  """A progress line at least every PROGRESS_EVERY_S seconds of training, whatever
  train.log_every is: where the run is, steps/s and tokens/s over the steps since the first
  timed one (compilation excluded), and the ETA at that rate. It needs no metric from the
  device, so it costs nothing; the metric rows stay on their log_every schedule. `printed()`
  after any progress line restarts the interval."""

  def __init__(self, end_step: int, tokens_per_step: int, log_every: int = 0,
               every_s: float | None = None, clock: Callable[[], float] = time.perf_counter):
    self.end_step, self.tokens_per_step, self.log_every = end_step, tokens_per_step, log_every
    self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
    self.clock = clock
    self.t0 = self.last = None
    self.step0 = 0

  def start(self, step: int) -> None:
    self.t0 = self.last = self.clock()
    self.step0 = step

  def printed(self) -> None:
    self.last = self.clock()

  def line(self, step: int) -> str | None:
    """The line to print now, or None (not yet due, or the clock has not started)."""
    if self.t0 is None:
      return None
    now = self.clock()
    if now - self.last < self.every_s or step <= self.step0 or step >= self.end_step:
      return None
    self.last = now
    rate = (step - self.step0) / max(now - self.t0, 1e-9)
    next_row = min((step // self.log_every + 1) * self.log_every, self.end_step) \
        if self.log_every else self.end_step
    nxt = f" | metrics at step {next_row}"
    return (f"step {step:>{len(str(self.end_step))}d}/{self.end_step} | {rate:.3g} steps/s, "
            f"{si(rate * self.tokens_per_step)} tok/s so far | "
            f"ETA {format_duration((self.end_step - step) / rate)}{nxt}")


class PendingMetrics:
  """Step metrics stay on device until a log, eval or save step needs them; `fetch` brings them
  over in one transfer, checks loss and gradient norm (NonFiniteError names the first bad step)
  and adds them to the log window in step order."""

  CHECKED = ("loss", "grad_norm")

  def __init__(self, window: Window):
    self.window = window
    self.items: list[tuple[int, dict]] = []

  def push(self, step: int, metrics: dict) -> None:
    for x in jax.tree.leaves(metrics):
      x.copy_to_host_async()  # start the transfer now; fetched at the next log step
    self.items.append((step, metrics))

  def fetch(self) -> None:
    if not self.items:
      return
    values = jax.device_get([m for _, m in self.items])
    for (step, _), m in zip(self.items, values):
      for key in self.CHECKED:
        if not np.isfinite(m[key]):
          self.items.clear()
          raise NonFiniteError(step, key, float(m[key]))
      self.window.add(m)
    self.items.clear()


class Rollback:
  """The checkpoint a diverged run goes back to: the newest one saved before the latest health
  check (a finite evaluation, or a log row when evaluation is off) that passed. Its next step
  was finite whatever the learning rate, so it is protected from `keep`'s pruning. Its state
  ({"step", "at"}) travels in every checkpoint's meta."""

  def __init__(self, ckpt: Checkpointer, saved_state: dict | None = None):
    self.ckpt = ckpt
    self.saved = ckpt.all_steps()  # steps with a checkpoint, to choose from
    state = dict(saved_state or {"step": None, "at": None})
    if state["step"] not in self.saved:  # (set aside or deleted since)
      state = {"step": None, "at": None}
    self.step, self.at = state["step"], state["at"]
    ckpt.protect(self.step)

  def saved_at(self, step: int) -> None:
    self.saved.append(step)

  def healthy_at(self, step: int) -> None:
    older = [c for c in self.saved if c < step]
    if older and (self.step is None or max(older) > self.step):
      self.step, self.at = max(older), step
      self.ckpt.protect(self.step)

  def state(self) -> dict:
    return {"step": self.step, "at": self.at}


@dataclasses.dataclass(frozen=True)
class Due:
  log: bool
  eval: bool
  save: bool

  @property
  def any(self) -> bool:
    return self.log or self.eval or self.save


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which periodic actions fall on a step. An interval of 0 means never periodically; the end
  step always logs and saves; evaluation needs `evaluating` (train.eval_steps > 0)."""
  log_every: int
  eval_every: int
  checkpoint_every: int
  end_step: int
  evaluating: bool

  def at(self, step: int) -> Due:
    return Due(
        log=(self.log_every > 0 and step % self.log_every == 0) or step == self.end_step,
        eval=self.evaluating and self.eval_every > 0 and step % self.eval_every == 0,
        save=(self.checkpoint_every > 0 and step % self.checkpoint_every == 0)
        or step == self.end_step)

  @property
  def log_is_health_check(self) -> bool:
    """Without periodic evaluations the log row is what promotes the rollback checkpoint."""
    return not (self.evaluating and self.eval_every > 0)

  def needs_final_eval(self, step: int, start: int) -> bool:
    """The final numbers always include a held-out score: evaluate at the stop unless this
    process has just done so at `step`."""
    return self.evaluating and not (self.eval_every > 0 and step % self.eval_every == 0
                                    and step > start)


class StepProfiler:
  """A jax.profiler trace of the steps first+1 .. first+count (the state after `first` goes in),
  written under `logdir` in TensorBoard's layout (plugins/profile/<run>/*.xplane.pb: open the
  workdir in TensorBoard, Profile tab; or Perfetto). first=0 profiles nothing; a run resumed
  past `first` does not either. Call `before(step)` before running the step that makes
  `step + 1` and `after(step, outputs)` once `step` is done. A bucket `logdir` gets the trace
  copied up when it stops (the profiler itself writes a local folder)."""

  def __init__(self, first: int, count: int, logdir, *, start=None, stop=None):
    self.first, self.count, self.logdir = first, max(1, count), epath.Path(logdir)
    self._start = start or jax.profiler.start_trace
    self._stop = stop or jax.profiler.stop_trace
    self.local = None  # the folder the trace goes to while it runs
    self.done = first <= 0

  def before(self, step: int) -> float:
    """Starts the trace before the step from `first`; returns the seconds that took."""
    if self.done or self.local is not None or step != self.first:
      return 0.0
    t0 = time.perf_counter()
    local = (epath.Path(tempfile.mkdtemp(prefix="profile_")) if paths.is_uri(self.logdir)
             else self.logdir)
    self._start(str(local))
    self.local = local
    return time.perf_counter() - t0

  def after(self, step: int, outputs) -> float:
    """Stops the trace once `first + count` is done; returns the seconds stopping took."""
    if self.local is None or step < self.first + self.count:
      return 0.0
    jax.block_until_ready(outputs)  # the traced steps' device work is in the trace ...
    t0 = time.perf_counter()  # ... and counted as training; stopping and writing are not
    self._stop()
    if self.local != self.logdir:
      paths.copy_tree(self.local, self.logdir)
    self.local, self.done = None, True
    return time.perf_counter() - t0

  def close(self) -> None:
    """Stops a trace still running when the loop ends early (preemption, end step)."""
    if self.local is not None:
      self._stop()
      self.local, self.done = None, True


def heldout_line(step: int, ev: dict[str, float], unigram_entropy: float | None,
                 split: str = "validation") -> str | None:
  """The closing line on the held-out masked-LM scores against the unigram baseline, or None
  when the evaluation has no MLM scores (or no baseline)."""
  acc_key = next((k for k in ("mlm_accuracy", "gen_accuracy") if k in ev), None)
  loss_key = next((k for k in ("mlm_loss", "gen_loss") if k in ev), None)
  if "unigram_loss" not in ev or not acc_key or not loss_key:
    return None
  at = loss_key.replace("_loss", "_at_mask")
  # Only the validation split's rows are held out (whole documents training never saw).
  what = ("held-out MLM" if split == "validation" else
          f"MLM on the {split} split (data.eval_split={split!r}: not held out)")
  return (f"{what} at step {step}: accuracy {ev[acc_key]:.1%} (unigram baseline "
          f"{ev['unigram_accuracy']:.1%}), loss {ev[loss_key]:.3f} nats = "
          f"{ev['unigram_loss'] - ev[loss_key]:.3f} below the unigram baseline's "
          f"{ev['unigram_loss']:.3f} (corpus unigram entropy {unigram_entropy:.3f}); at [MASK] "
          f"inputs only: accuracy {ev[at + '_accuracy']:.1%} (unigram "
          f"{ev['unigram_at_mask_accuracy']:.1%}), loss "
          f"{ev['unigram_at_mask_loss'] - ev[at + '_loss']:.3f} below the unigram baseline")
