r"""One command per grid: run it (resumable), plan it, print launch commands, or report it.

  bash run.sh python -m experiments.run --grid=electra_vs_mlm                 # run + report
  bash run.sh python -m experiments.run --grid=electra_vs_mlm --action=report  # tables/plots only
  bash run.sh python -m experiments.run --grid=norm_lr_warmup --action=plan    # points, FLOPs
  bash run.sh python -m experiments.run --grid=nsp_formats --scale=base \
      --action=launch --launcher=tpu_pod --data_source=tfds:wikipedia/20231101.en:text
  bash run.sh python -m experiments.run --grid=all --scale=gpu --in_process  # bench/gpu_grids.sh

Grids (experiments/grids.py): electra_vs_mlm, nsp_formats, norm_lr_warmup, static_vs_dynamic,
generator_size, old_vs_new_block; each at --scale=demo (this repo's CPU reproductions),
--scale=gpu (one H100/H200, ~9 min for the first four) or --scale=base (BERT-base, for a TPU
pod / GPU cluster); electra_curve (demo scale only: MLM vs ELECTRA along one long run each,
analysed by `python -m experiments.crossing`); and large_batches (RoBERTa's Table 3, demo and
base scales: experiments/large_batches.py). --grid takes one name, a comma-separated list, or
`all` (the four main grids; generator_size, old_vs_new_block, electra_curve and large_batches
are named explicitly).
`run` executes unfinished points in order and skips finished ones: kill it at any time and run
the same command again. The report goes to --out (default
experiments/results/<grid>, <grid>_gpu or <grid>_base, where committed results live); `run`
and `report` append what produced it (git commit and dirty files, date, command line, the
grid's configs, host, jax/flax/optax versions) to <out>/provenance.json, one record per
invocation (experiments/provenance.py), and results.md opens with the commit and date. `plan`
writes nothing tracked: its plan.md and record go under the run folder (--workdir).
"""
from __future__ import annotations

import os
import time

from absl import app, flags

from experiments import grids, provenance, report, runner

_GRID = flags.DEFINE_list(
    "grid", None, "The grid(s) to work on: one of " + ", ".join(grids.GRIDS) + ", several "
    "comma-separated, or `all` (" + ", ".join(grids.GPU_GRIDS) + "), run one after the other.")
_SCALE = flags.DEFINE_enum("scale", "demo", list(grids.SCALES),
                           "demo: the CPU reproduction (demo corpus, tiny encoders); gpu: one "
                           "H100/H200 (ELECTRA-Small-sized, bf16, ~9 min for the four main "
                           "grids); base: the BERT-base version for a pod or cluster.")
_ACTION = flags.DEFINE_enum(
    "action", "run", ["run", "report", "plan", "launch", "status"],
    "run: execute unfinished points, then report. report: tables + plots from what is on "
    "disk. plan: points, steps, FLOPs and estimated accelerator time, printed and written to "
    "<workdir>/plan.md (never into the tracked results). launch: print one launch "
    "command per point (--launcher). status: each point's state.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where points run (default "
                               "experiments/runs/<grid>[_gpu|_base]). With several grids: the "
                               "parent of one such folder per grid.")
_OUT = flags.DEFINE_string("out", "", "Report directory (default experiments/results/<grid> "
                           "for demo, experiments/results/<grid>_gpu or _base otherwise). With "
                           "several grids: the parent of one such folder per grid.")
_IN_PROCESS = flags.DEFINE_bool(
    "in_process", False, "run: call pre-training and fine-tuning as functions in this process "
    "instead of one subprocess per job, so imports, device start-up and shared compiled "
    "programs are paid once (what bench/gpu_grids.sh uses); same files, same resume rules.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Shrink every point to a few CPU seconds (1 x 32 encoder, 3 steps, one "
    "fine-tuning seed on 16 rows; experiments.grids.DRY_RUN_*) to check the commands end to "
    "end. Runs and reports get a _dry_run suffix so real results are never overwritten.")
_ONLY = flags.DEFINE_string("only", "", "Regular expression: work only on matching points "
                            "(names look like 'lr=0.001,warmup=0,norm=post').")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", list(runner.LAUNCHERS),
                              "--action=launch: local commands, launch/tpu_pod.sh, or SLURM.")
_DATA = flags.DEFINE_string("data_source", "", "--scale=base: the pre-training corpus "
                            "(configs/pretrain.py data.source, e.g. files:gs://b/wiki/*.txt "
                            "or tfds:<name>:<text_field>); empty keeps the config's default.")
_OVERRIDE = flags.DEFINE_multi_string(
    "override", [], "KEY=VALUE config override applied to every point (repeatable), e.g. "
    "--override=data.batch_size=32 --override=train.steps=600; needs --tag.")
_TAG = flags.DEFINE_string("tag", "", "Names a grid variant made with --override: runs go to "
                           "experiments/runs/<grid>_<tag>, the report to results/<grid>_<tag>.")
_KEEP_GOING = flags.DEFINE_bool("keep_going", False, "run: a failed point is reported and "
                                "the next one starts (default: stop at the first failure).")
_RERUN = flags.DEFINE_bool("rerun_changed", False, "run: redo points whose definition changed "
                           "since they ran (their old directory is deleted).")
_DEVICE = flags.DEFINE_string("plan_device", "", "--action=plan: the device to estimate time "
                              "on: v4-N (N/2 chips at encoder_jax.train.flops' TPU v4 peak, 275 "
                              "TFLOP/s bf16) or h200 (one H100/H200, with experiments.grids' "
                              "per-point start-up costs). Default: h200 for --scale=gpu, else "
                              "v4-32.")
_MFU = flags.DEFINE_float("plan_mfu", 0.0, "--action=plan: assumed model FLOPs utilisation; 0 "
                          "= the device's default: 0.45 on v4 (MaxText reports 46-71% on TPU; "
                          "BERT-base at seq 128 sits lower), experiments.grids.GPU_MFU on h200.")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan_lines(grid, device: str, mfu: float) -> list[str]:
  if device == "h200":
    return report.gpu_plan_lines(grid, mfu or grids.GPU_MFU)
  mfu = mfu or 0.45
  if not device.startswith("v4-"):
    raise app.UsageError(f"--plan_device={device!r}: choose v4-N (a TPU slice) or h200.")
  chips = int(device.split("-")[1]) // 2  # v4-N counts TensorCores, two per chip
  from encoder_jax.train import flops  # not at the top: JAX after cli.enable_compilation_cache
  peak = chips * flops.peak_flops_per_device("TPU v4")  # per chip (megacore: one device)
  lines = [f"| point | steps | FLOPs/step | total FLOPs | est. time on {device} "
           f"({chips} chips, MFU {mfu:.0%}) | fine-tuning |", "|---|---|---|---|---|---|"]
  total = 0.0
  for p in grid.points:
    seconds = p.total_flops / (peak * mfu)
    total += p.total_flops
    ft = ", ".join(f"{j.key}×{j.seeds}" for j in p.finetune) or "–"
    lines.append(f"| {p.name} | {p.steps:,} | {p.flops_per_step:.3g} | {p.total_flops:.3g} | "
                 f"{report.duration(seconds)} | {ft} |")
  lines.append(f"| **all** | | | {total:.3g} | {report.duration(total / (peak * mfu))} | |")
  return lines


def grid_names(values: list[str]) -> list[str]:
  """--grid's names: `all` is grids.GPU_GRIDS; unknown names are refused with the choices."""
  names = []
  for v in values:
    for name in (grids.GPU_GRIDS if v == "all" else [v]):
      if name not in grids.GRIDS:
        raise app.UsageError(f"--grid={v!r}: no such grid; choose from "
                             f"{', '.join(grids.GRIDS)} or all.")
      if name not in names:
        names.append(name)
  return names


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _GRID.value:
    raise app.UsageError("--grid is required; one of " + ", ".join(grids.GRIDS) + " or all")
  if _OVERRIDE.value and not _TAG.value:
    raise app.UsageError("--override changes every point: name the variant with --tag.")
  names = grid_names(_GRID.value)
  # Every record of this invocation names the tree as it was now, when its code was loaded
  # (with --in_process all of it; a commit made while the grids run is not theirs).
  provenance.pin_git_state()
  suffix = "" if _SCALE.value == "demo" else f"_{_SCALE.value}"
  suffix += "_dry_run" if _DRY_RUN.value else ""
  several = len(names) > 1
  t0, estimate = time.time(), 0.0
  for name in names:
    grid = grids.get_grid(name, _SCALE.value, _DATA.value)
    if _OVERRIDE.value:
      from experiments.grid import parse_override, with_overrides
      grid = with_overrides(grid, dict(map(parse_override, _OVERRIDE.value)),
                            name=f"{grid.name}_{_TAG.value}")
    if _DRY_RUN.value:
      grid = grids.dry_run(grid)
    if _SCALE.value == "gpu" and not _DRY_RUN.value:
      estimate += grids.gpu_seconds(grid)
      print(f"{grid.name}: {len(grid.points)} points, estimated "
            f"{report.duration(grids.gpu_seconds(grid))}"
            f" on one H200 (experiments.grids GPU_*; cumulative {report.duration(estimate)} + "
            f"{grids.GPU_STARTUP_S:g} s start-up)", flush=True)
    dirname = grid.name + suffix
    if several:
      workdir = os.path.join(_WORKDIR.value or os.path.join(_REPO, "experiments", "runs"), dirname)
      out = os.path.join(_OUT.value or os.path.join(_REPO, "experiments", "results"), dirname)
    else:
      workdir = _WORKDIR.value or os.path.join(_REPO, "experiments", "runs", dirname)
      out = _OUT.value or os.path.join(_REPO, "experiments", "results", dirname)
    run_one(grid, name, workdir, out)
  if several:
    print(f"{len(names)} grids in {report.duration(time.time() - t0)}: {', '.join(names)}")


def run_one(grid, name: str, workdir: str, out: str) -> None:
  points = grid.select(_ONLY.value) if _ONLY.value else grid.points
  action = _ACTION.value
  # What produced the folder's files, appended. A plan is written under the run folder
  # (experiments/runs/, not tracked): planning changes no committed result.
  if action in ("run", "report", "plan"):
    rec = provenance.record(workdir if action == "plan" else out, grid, action=action,
                            scale=_SCALE.value, points=points,
                            workdir=None if action == "plan" else workdir)
  if action == "plan":
    device = _DEVICE.value or ("h200" if _SCALE.value == "gpu" else "v4-32")
    text = "\n".join([f"### {grid.title} ({_SCALE.value} scale)", "",
                      provenance.planned_line(rec), "",
                      *plan_lines(grid, device, _MFU.value), "",
                      "Launch: `python -m experiments.run --grid=" + name + " --scale="
                      + _SCALE.value + " --action=launch --launcher=tpu_pod|slurm`"])
    print(text)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "plan.md"), "w") as f:
      f.write(text + "\n")
    print(f"wrote {os.path.join(workdir, 'plan.md')}")
  elif action == "launch":
    print("\n".join(runner.launch_commands(grid, workdir, _LAUNCHER.value, points)))
  elif action == "status":
    for p in points:
      print(f"{runner.status(workdir, p):9s} {p.name}")
  else:
    if action == "run":
      runner.run_grid(grid, workdir, points=points, rerun_changed=_RERUN.value,
                      keep_going=_KEEP_GOING.value, in_process=_IN_PROCESS.value)
    files = report.write_report(grid, workdir, out, points if _ONLY.value else None)
    print((files["md"]).read_text())
    print("wrote " + ", ".join(str(f) for f in files.values()))


if __name__ == "__main__":
  from encoder_jax import cli  # before JAX is imported: in-process jobs share XLA's cache
  cli.run(main, "experiments.run")
