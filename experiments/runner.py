"""Executes a grid's points (resumable) or prints one launch command per point.

Layout under the grid's workdir (default experiments/runs/<grid>):
  <point>/pretrain/          encoder_jax.main's workdir (checkpoints, metrics.jsonl, summary.json)
  <point>/ft_<task>/         encoder_jax.finetune.main's workdir (results.json, results.md)
  <point>/*.log              each command's full output
  <point>/point.json         the point's definition (what ran), written before it starts

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
  d["finetune"] = [dataclasses.asdict(j) for j in point.finetune]
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
  return [python, "-m", "encoder_jax.finetune.main", f"--workdir={pdir / job.dirname}",
          f"--config=configs/finetune.py:task={job.task},init=ckpt:{pdir / 'pretrain' / 'checkpoints'},"
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
             execute: Callable[[Sequence[str], epath.Path], int] | None = None) -> dict:
  """Runs every unfinished point in order; returns {point name: final status}.

  `execute(cmd, log_path) -> exit code` replaces the subprocess call (tests)."""
  workdir = paths.absolute(workdir)  # a local folder or gs://
  points = list(points or grid.points)
  execute = execute or (lambda cmd, log: _run_logged(cmd, log, echo))
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
        code = execute(pretrain_command(point, workdir, python), pdir / "pretrain.log")
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
          code = execute(finetune_command(point, job, workdir, python), log)
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
  return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


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
