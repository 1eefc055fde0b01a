"""Fine-tuning jobs in parallel worker processes, one CPU core each (`run_jobs`).

Why: small encoders fine-tune on a CPU at a rate set by XLA's per-op overheads, not by the
matmul peak. One process with two intra-op threads ran the demo's tiny fine-tuning step only
1.57x as fast as the same process pinned to one core (on a 2-core AMD EPYC VM), and
compilation (one train and one predict program per length bucket) runs on one thread anyway.
Two single-core workers, each running whole jobs, keep both cores busy: jobs' compilations
overlap other jobs' steps, and a core's own thread never waits for the other's at every op.

Each worker is a fresh `spawn` process that pins itself to one core before it imports JAX
(XLA sizes its thread pool from the process's CPU affinity), so its programs and results do
not depend on how many workers ran. Environment variables (XLA's persistent compilation cache,
ENCODER_JAX_CACHE) are inherited. Results come back as the dicts finetune_and_evaluate writes
to each job's results.json; a job that raises fails the whole call with its error, after the
other running jobs finish (their results.json are kept, so a re-run reuses them).
"""
from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Callable, Sequence

Job = tuple[Any, str]  # (configs/finetune.py ConfigDict, workdir)


def usable_cores() -> list[int]:
  """The CPU cores this process may run on (its affinity mask), in order."""
  return sorted(os.sched_getaffinity(0))


def default_workers() -> int:
  """One worker per usable core: 2 on the 2-core machines the demo is sized for."""
  return max(1, len(usable_cores()))


def _init_worker(cores, counter) -> None:
  with counter.get_lock():
    i = counter.value
    counter.value += 1
  os.sched_setaffinity(0, {cores[i % len(cores)]})


def _run_one(config, workdir: str) -> dict[str, Any]:
  from encoder_jax.finetune.run import finetune_and_evaluate  # pylint: disable=g-import-not-at-top
  return finetune_and_evaluate(config, workdir)


def run_jobs(jobs: Sequence[Job], workers: int,
             on_done: Callable[[int, dict[str, Any]], None] | None = None,
             fn: Callable[..., dict[str, Any]] = _run_one) -> list[dict[str, Any]]:
  """Runs finetune_and_evaluate(config, workdir) for every job; returns results in job order.
  (`fn`: what runs a job instead, a module-level function of (config, workdir); for tests.)

  workers <= 1 runs the jobs one after another in this process (its threads, its JAX).
  Otherwise `workers` spawned processes, pinned to distinct cores of this process's affinity
  mask, take jobs in the given order (put the longest first). `on_done(index, result,
  seconds)` is called in this process as each job finishes.
  """
  if workers <= 1 or len(jobs) <= 1:
    out = []
    for i, (config, workdir) in enumerate(jobs):
      out.append(fn(config, workdir))
      if on_done:
        on_done(i, out[-1])
    return out
  cores = usable_cores()
  ctx = multiprocessing.get_context("spawn")  # no forked copy of a parent's JAX runtime
  counter = ctx.Value("i", 0)
  results: list[dict[str, Any] | None] = [None] * len(jobs)
  with ctx.Pool(min(workers, len(jobs)), initializer=_init_worker,
                initargs=(cores, counter), maxtasksperchild=None) as pool:
    pending = {i: pool.apply_async(fn, job) for i, job in enumerate(jobs)}
    error = None
    while pending:
      for i in [i for i, r in pending.items() if r.ready()]:
        res = pending.pop(i)
        try:
          results[i] = res.get()
        except Exception as e:  # pylint: disable=broad-except
          error = error or e
          continue
        if on_done:
          on_done(i, results[i])
      time.sleep(0.2)
    if error is not None:
      raise error
  return results  # type: ignore[return-value]
