"""Executes a grid's points (resumable) or prints one launch command per point.

Layout under the grid's workdir (default experiments/runs/<grid>):
  <point>/pretrain/          encoder_jax.main's workdir (checkpoints, metrics.jsonl, summary.json)
  <point>/ft_<task>/         encoder_jax.finetune.main's workdir (results.json, results.md)
  <point>/*.log              each command's full output
  <point>/point.json         the point's definition (what ran), written before it starts

In process (`run_grid(..., in_process=True)`, `experiments.run --in_process`): the same
points and the same files, but pre-training and fine-tuning are called as functions in this
process (encoder_jax.train.loop.train_and_evaluate, encoder_jax.finetune.run
.finetune_and_evaluate) instead of one `python -m ...` per job. A GPU then pays the imports,
CUDA start-up and XLA's autotuning once per grid run instead of three times per point, and
programs shared between points (evaluation, fine-tuning) come from XLA's persistent cache.
Each job's output still goes to its .log; the resume rules below are the same.

Resume rules (`status`), checked before every command, so re-running the same grid command
after a kill, a crash or a reboot continues where it stopped and never redoes finished work:
  * pre-training is finished when its summary.json says it stopped because of its step count
    or FLOPs budget ("steps" / "flops_budget"), or diverged ("non_finite": a result too; the
    point is then reported as diverged and not fine-tuned). Otherwise it is (re)started, and
    the trainer resumes from its newest checkpoint (bit-exact on CPU, encoder_jax.train.loop).
  * a fine-tuning job is finished when its results.json holds all its seeds; an unfinished
    one starts over (seconds to minutes at demo scale).
  * a point whose definition changed since it ran (point.json differs) is refused with a
    message: move its directory away or pass --rerun_changed to redo it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
from typing import Callable, Sequence

from etils import epath

from encoder_jax import paths
from experiments.grid import FinetuneJob, Grid, Point

FINISHED = ("steps", "flops_budget")
REPO = pathlib.Path(__file__).resolve().parents[1]  # commands name configs/ relative to it
DIVERGED = "non_finite"


def point_dir(workdir: str | os.PathLike, point: Point) -> epath.Path:
  """<workdir>/<point>: a local folder or gs://... (every file goes through etils.epath)."""
  return epath.Path(workdir) / point.name


def point_record(point: Point) -> dict:
  d = dataclasses.asdict(point)
  # at_fraction only where it is not the default, so runs recorded before it existed resume
  d["finetune"] = [{k: v for k, v in dataclasses.asdict(j).items()
                    if k != "at_fraction" or v != 1} for j in point.finetune]
  d["total_flops"] = point.total_flops
  return json.loads(json.dumps(d, default=str))


def pretrain_state(pdir: epath.Path) -> str:
  """'done' | 'diverged' | 'partial' (checkpoints or a summary, not finished) | 'todo'."""
  summary = pdir / "pretrain" / "summary.json"
  if summary.exists():
    try:
      reason = json.loads(summary.read_text()).get("stop_reason")
    except json.JSONDecodeError:
      reason = None
    if reason in FINISHED:
      return "done"
    if reason == DIVERGED:
      return "diverged"
    return "partial"
  return "partial" if (pdir / "pretrain" / "checkpoints").exists() else "todo"


def finetune_done(pdir: epath.Path, job: FinetuneJob) -> bool:
  path = pdir / job.dirname / "results.json"
  if not path.exists():
    return False
  try:
    return len(json.loads(path.read_text()).get("runs", [])) >= job.seeds
  except json.JSONDecodeError:
    return False


def status(workdir, point: Point) -> str:
  """'done' | 'diverged' | 'partial' | 'todo' for the whole point."""
  pdir = point_dir(workdir, point)
  pre = pretrain_state(pdir)
  if pre in ("todo", "partial"):
    return pre
  if pre == "diverged":
    return "diverged"
  return "done" if all(finetune_done(pdir, j) for j in point.finetune) else "partial"


def pretrain_command(point: Point, workdir, python: str = sys.executable) -> list[str]:
  return [python, "-m", "encoder_jax.main", "--mode=pretrain",
          f"--workdir={point_dir(workdir, point) / 'pretrain'}", *point.pretrain_flags()]


def finetune_command(point: Point, job: FinetuneJob, workdir,
                     python: str = sys.executable) -> list[str]:
  pdir = point_dir(workdir, point)
  ckpt, step = pdir / "pretrain" / "checkpoints", job.step_of(point)
  return [python, "-m", "encoder_jax.finetune.main", f"--workdir={pdir / job.dirname}",
          f"--config=configs/finetune.py:task={job.task},"
          f"init=ckpt:{ckpt / str(step) if step else ckpt},"
          f"run={job.run}", f"--config.seeds={job.seeds}",
          *[f"--config.{k}={v}" for k, v in job.overrides.items()]]


def _check_definition(pdir: epath.Path, point: Point, rerun_changed: bool) -> None:
  path = pdir / "point.json"
  record = point_record(point)
  if path.exists():
    old = json.loads(path.read_text())
    if old != record:
      if not rerun_changed:
        changed = sorted(k for k in record if old.get(k) != record[k])
        raise RuntimeError(
            f"{pdir} holds a run of a different definition of point {point.name!r} (changed: "
            f"{changed}). Nothing was touched. Move that directory away to keep it, or pass "
            "--rerun_changed to delete and redo it.")
      pdir.rmtree()
  if not paths.is_uri(pdir):
    pdir.mkdir(parents=True, exist_ok=True)
  paths.write_atomic(path, json.dumps(record, indent=1) + "\n")


class _LogTee:
  """A stdout stand-in: every line goes to the job's log; progress lines are also echoed."""

  def __init__(self, log_file, echo: Callable[[str], None]):
    self.f, self.echo, self.buf = log_file, echo, ""
    self.stdout = sys.stdout  # what `echo` prints to (print would come back here)

  def write(self, text: str) -> int:
    self.f.write(text)
    self.buf += text
    *lines, self.buf = self.buf.split("\n")
    for line in lines:
      if _is_progress(line):
        redirected, sys.stdout = sys.stdout, self.stdout
        try:
          self.echo("    " + line.rstrip())
        finally:
          sys.stdout = redirected
    return len(text)

  def flush(self) -> None:
    self.f.flush()


class InProcess:
  """Runs a point's jobs as function calls in this process (see the module docstring).

  Returns exit codes as the subprocesses would: 0 done, 1 failed (the traceback is in the
  log). A divergence writes its summary (stop_reason "non_finite") before raising, so the
  runner records it as diverged exactly as with subprocesses."""

  def __init__(self, echo: Callable[[str], None] = print):
    self.echo = echo

  def _call(self, what: str, fn: Callable[[], object], log: epath.Path) -> int:
    import contextlib
    import gc
    import traceback
    with paths.Appender(log, min_interval_s=10.0) as f:  # a local file or an object on gs://
      f.write(f"\n# in process: {what}\n")
      f.flush()
      try:
        with contextlib.redirect_stdout(_LogTee(f, self.echo)):
          fn()
        return 0
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc(file=f)
        if not isinstance(e, FloatingPointError):  # divergence: reported by its summary
          self.echo(f"    Error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
      finally:
        # Drop the job's device buffers before the next job allocates its own: memory on an
        # accelerator waits for Python to free the arrays held in reference cycles. Not on
        # the CPU, where a full collection took ~0.3 s a job (9 s of the GPU grids' 28-job
        # dry run) and Python's own collections free host memory as usual.
        import jax
        if jax.default_backend() != "cpu":
          gc.collect()

  def pretrain(self, point: Point, workdir) -> int:
    """Pre-trains the point; SIGTERM (the trainer saves a checkpoint and returns) stops the
    whole grid run with exit 0, as it would stop the subprocess, instead of starting the
    next point."""
    from encoder_jax.train.loop import train_and_evaluate
    pdir = point_dir(workdir, point)
    code = self._call(shlex.join(pretrain_command(point, workdir, "python")),
                      lambda: train_and_evaluate(point.config(), str(pdir / "pretrain")),
                      pdir / "pretrain.log")
    summary = pdir / "pretrain" / "summary.json"
    if code == 0 and json.loads(summary.read_text()).get("stop_reason") == "preempted":
      self.echo(f"{point.name}: SIGTERM, its checkpoint saved; run the same command again to "
                "resume")
      raise SystemExit(0)
    return code

  def finetune(self, point: Point, job: FinetuneJob, workdir) -> int:
    from encoder_jax.finetune.run import finetune_and_evaluate
    pdir = point_dir(workdir, point)

    def run():
      config = finetune_config(point, job, workdir)
      finetune_and_evaluate(config, str(pdir / job.dirname))
      res = json.loads((pdir / job.dirname / "results.json").read_text())
      scores = [r.get("test", {}).get("accuracy") for r in res.get("runs", [])]
      print(f"| {job.task}: test accuracy per seed {scores}")  # echoed like the tables
    return self._call(shlex.join(finetune_command(point, job, workdir, "python")), run,
                      pdir / f"{job.dirname}.log")


def finetune_config(point: Point, job: FinetuneJob, workdir):
  """The ConfigDict finetune_command's flags build (configs/finetune.py + its overrides)."""
  from configs import finetune as finetune_lib
  cmd = finetune_command(point, job, workdir, "python")
  arg = next(a for a in cmd if a.startswith("--config=")).partition(":")[2]
  config = finetune_lib.get_config(arg)
  config.seeds = job.seeds
  for key, value in job.overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise ValueError(f"fine-tuning override {key}={value!r}: no such field in "
                       "configs/finetune.py.")
    node[leaf] = value
  return config


def _run_logged(cmd: Sequence[str], log: epath.Path, echo: Callable[[str], None]) -> int:
  """Runs cmd, appending its output to `log` and echoing its progress lines (a log on a
  bucket is uploaded whole at most every 10 s, see paths.Appender)."""
  with paths.Appender(log, min_interval_s=10.0) as f:
    f.write(f"\n$ {shlex.join(cmd)}\n")
    f.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, cwd=REPO)
    for line in proc.stdout:
      f.write(line)
      f.flush()
      if _is_progress(line):
        echo("    " + line.rstrip())
    return proc.wait()


def _is_progress(line: str) -> bool:
  # The trainer's progress / eval / done lines and fine-tuning's per-seed results; not the
  # absl INFO noise.
  s = line.strip()
  return (s.startswith(("step ", "eval ", "done:", "resumed", "Non-finite", "|"))
          or "seed " in s and " done:" in s or "Error" in s)


def run_grid(grid: Grid, workdir, *, points: Sequence[Point] | None = None,
             rerun_changed: bool = False, keep_going: bool = False,
             python: str = sys.executable, echo: Callable[[str], None] = print,
             execute: Callable[[Sequence[str], epath.Path], int] | None = None,
             in_process: bool = False) -> dict:
  """Runs every unfinished point in order; returns {point name: final status}.

  `execute(cmd, log_path) -> exit code` replaces the subprocess call (tests); `in_process`
  calls the trainer and fine-tuning as functions instead (see InProcess)."""
  workdir = paths.absolute(workdir)  # a local folder or gs://
  points = list(points or grid.points)
  if in_process and execute is not None:
    raise ValueError("run_grid: give `execute` or in_process=True, not both.")
  execute = execute or (lambda cmd, log: _run_logged(cmd, log, echo))
  inproc = InProcess(echo) if in_process else None

  def pretrain(point: Point, pdir: pathlib.Path) -> int:
    if inproc:
      return inproc.pretrain(point, workdir)
    return execute(pretrain_command(point, workdir, python), pdir / "pretrain.log")

  def finetune(point: Point, job: FinetuneJob, pdir: pathlib.Path) -> int:
    if inproc:
      return inproc.finetune(point, job, workdir)
    return execute(finetune_command(point, job, workdir, python), pdir / f"{job.dirname}.log")

  final, t0 = {}, time.time()
  for i, point in enumerate(points, 1):
    pdir = point_dir(workdir, point)
    before = status(workdir, point)
    head = f"[{i}/{len(points)}] {point.name}"
    if before in ("done", "diverged"):
      echo(f"{head}: {before}, skipped")
      final[point.name] = before
      continue
    _check_definition(pdir, point, rerun_changed)
    echo(f"{head}: {point.steps} steps, {point.total_flops:.3g} FLOPs"
         + (" (resuming)" if before == "partial" else "") + f"  [{_elapsed(t0)} elapsed]")
    try:
      if pretrain_state(pdir) in ("todo", "partial"):
        code = pretrain(point, pdir)
        state = pretrain_state(pdir)
        if state == "diverged":
          echo(f"{head}: diverged (non-finite loss); recorded, not fine-tuned")
        elif code != 0 or state != "done":
          raise RuntimeError(f"pre-training of {point.name} failed (exit {code}); see "
                             f"{pdir / 'pretrain.log'}. Re-run the same command to resume.")
      if pretrain_state(pdir) == "done":
        for job in point.finetune:
          if finetune_done(pdir, job):
            continue
          echo(f"{head}: fine-tuning {job.task} ({job.seeds} seeds)")
          log = pdir / f"{job.dirname}.log"
          code = finetune(point, job, pdir)
          if code != 0 or not finetune_done(pdir, job):
            raise RuntimeError(f"fine-tuning {point.name} on {job.task} failed (exit {code}); "
                               f"see {log}. Re-run the same command to resume.")
    except RuntimeError as e:
      if not keep_going:
        raise
      echo(f"{head}: FAILED: {e}")
    final[point.name] = status(workdir, point)
    echo(f"{head}: {final[point.name]}  [{_elapsed(t0)} elapsed]")
  return final


def _elapsed(t0: float) -> str:
  s = int(time.time() - t0)
  if s >= 3600:
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"
  return f"{s // 60}m{s % 60:02d}s"


LAUNCHERS = ("local", "tpu_pod", "slurm")


def launch_commands(grid: Grid, workdir: str, launcher: str,
                    points: Sequence[Point] | None = None) -> list[str]:
  """Shell lines, one pre-training launch per point, then its fine-tuning jobs.

  tpu_pod: launch/tpu_pod.sh train (every worker runs it; workdir under $BUCKET/runs/);
  slurm:   sbatch launch/slurm_gpu.sbatch, fine-tuning as a dependent job;
  local:   the plain commands the runner executes."""
  if launcher not in LAUNCHERS:
    raise ValueError(f"--launcher={launcher!r}; choose one of {LAUNCHERS}.")
  lines = [f"# grid {grid.name}: {len(points or grid.points)} points ({launcher})"]
  for point in points or grid.points:
    flags = point.pretrain_flags()[1:]  # the overrides; the config arg goes first
    lines.append(f"# {point.name}: {point.steps} steps, {point.total_flops:.3g} FLOPs")
    if launcher == "tpu_pod":
      lines.append(f"NAME={shlex.quote(grid.name + '.' + point.name)} bash launch/tpu_pod.sh train "
                   f"{shlex.quote(point.pretrain_arg)} " + " ".join(map(shlex.quote, flags)))
      ckpt_wd = f"$BUCKET/runs/{grid.name}.{point.name}"
      ft = [finetune_command(point, j, workdir, "python") for j in point.finetune]
      for cmd in ft:
        lines.append("  " + shlex.join(cmd).replace(
            str(point_dir(workdir, point) / "pretrain"), ckpt_wd))
    elif launcher == "slurm":
      wd = point_dir(workdir, point) / "pretrain"
      lines.append(f"jid=$(WORKDIR={shlex.quote(str(wd))} sbatch --parsable "
                   f"--job-name={shlex.quote(grid.name + ':' + point.name)} "
                   f"launch/slurm_gpu.sbatch {shlex.quote(point.pretrain_arg)} "
                   + " ".join(map(shlex.quote, flags)) + ")")
      for j in point.finetune:
        cmd = finetune_command(point, j, workdir, ".venv/bin/python")
        lines.append(f"sbatch --dependency=afterok:$jid --nodes=1 --gpus-per-node=1 "
                     f"--wrap={shlex.quote(shlex.join(cmd))}")
    else:
      lines.append(shlex.join(pretrain_command(point, workdir, "python")))
      lines += [shlex.join(finetune_command(point, j, workdir, "python"))
                for j in point.finetune]
  return lines
