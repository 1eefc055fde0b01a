r"""One command per grid: run it (resumable), plan it, print launch commands, or report it.

  bash run.sh python -m experiments.run --grid=electra_vs_mlm                 # run + report
  bash run.sh python -m experiments.run --grid=electra_vs_mlm --action=report  # tables/plots only
  bash run.sh python -m experiments.run --grid=norm_lr_warmup --action=plan    # points, FLOPs
  bash run.sh python -m experiments.run --grid=nsp_formats --scale=base \
      --action=launch --launcher=tpu_pod --data_source=tfds:wikipedia/20231101.en:text

Grids (experiments/grids.py): electra_vs_mlm, nsp_formats, norm_lr_warmup, static_vs_dynamic;
each at --scale=demo (this repo's CPU reproductions) or --scale=base (BERT-base, for a TPU pod / GPU cluster).
`run` executes unfinished points in order and skips finished ones: kill it at any time and run
the same command again. The report goes to --out (default experiments/results/<grid>, where the
committed demo results live).
"""
from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import grids, report, runner  # noqa: E402

_GRID = flags.DEFINE_enum("grid", None, sorted(grids.GRIDS), "The grid to work on.")
_SCALE = flags.DEFINE_enum("scale", "demo", list(grids.SCALES),
                           "demo: the CPU reproduction (demo corpus, tiny encoders); base: "
                           "the BERT-base version for a pod or cluster.")
_ACTION = flags.DEFINE_enum(
    "action", "run", ["run", "report", "plan", "launch", "status"],
    "run: execute unfinished points, then report. report: tables + plots from what is on "
    "disk. plan: points, steps, FLOPs and estimated accelerator time. launch: print one launch "
    "command per point (--launcher). status: each point's state.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Where points run (default "
                               "experiments/runs/<grid>[_base]).")
_OUT = flags.DEFINE_string("out", "", "Report directory (default experiments/results/<grid> "
                           "for demo, experiments/results/<grid>_base for base).")
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
_DEVICE = flags.DEFINE_string("plan_device", "v4-32", "--action=plan: the slice to estimate "
                              "time on (v4-N: N/2 chips of 275 TFLOP/s bf16).")
_MFU = flags.DEFINE_float("plan_mfu", 0.45, "--action=plan: assumed model FLOPs utilisation "
                          "(MaxText reports 46-71% on TPU; BERT-base at seq 128 sits lower).")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _duration(seconds: float) -> str:
  if seconds >= 86400:
    return f"{seconds / 86400:.1f} days"
  if seconds >= 3600:
    return f"{seconds / 3600:.1f} h"
  return f"{seconds:.2g} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def plan_lines(grid, device: str, mfu: float) -> list[str]:
  if not device.startswith("v4-"):
    raise app.UsageError(f"--plan_device={device!r}: only v4-N slices are tabulated.")
  chips = int(device.split("-")[1]) // 2  # v4-N counts TensorCores, two per chip
  peak = chips * 275e12
  lines = [f"| point | steps | FLOPs/step | total FLOPs | est. time on {device} "
           f"({chips} chips, MFU {mfu:.0%}) | fine-tuning |", "|---|---|---|---|---|---|"]
  total = 0.0
  for p in grid.points:
    seconds = p.total_flops / (peak * mfu)
    total += p.total_flops
    ft = ", ".join(f"{j.task}×{j.seeds}" for j in p.finetune) or "–"
    lines.append(f"| {p.name} | {p.steps:,} | {p.flops_per_step:.3g} | {p.total_flops:.3g} | "
                 f"{_duration(seconds)} | {ft} |")
  lines.append(f"| **all** | | | {total:.3g} | {_duration(total / (peak * mfu))} | |")
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _GRID.value:
    raise app.UsageError("--grid is required; one of " + ", ".join(sorted(grids.GRIDS)))
  grid = grids.get_grid(_GRID.value, _SCALE.value, _DATA.value)
  if _OVERRIDE.value:
    if not _TAG.value:
      raise app.UsageError("--override changes every point: name the variant with --tag.")
    from experiments.grid import parse_override, with_overrides
    grid = with_overrides(grid, dict(map(parse_override, _OVERRIDE.value)),
                          name=f"{grid.name}_{_TAG.value}")
  suffix = "" if _SCALE.value == "demo" else f"_{_SCALE.value}"
  workdir = _WORKDIR.value or os.path.join(_REPO, "experiments", "runs", grid.name + suffix)
  out = _OUT.value or os.path.join(_REPO, "experiments", "results", grid.name + suffix)
  points = grid.select(_ONLY.value)
  action = _ACTION.value
  if action == "plan":
    text = "\n".join([f"### {grid.title} ({_SCALE.value} scale)", "",
                      *plan_lines(grid, _DEVICE.value, _MFU.value), "",
                      "Launch: `python -m experiments.run --grid=" + _GRID.value + " --scale="
                      + _SCALE.value + " --action=launch --launcher=tpu_pod|slurm`"])
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "plan.md"), "w") as f:
      f.write(text + "\n")
  elif action == "launch":
    print("\n".join(runner.launch_commands(grid, workdir, _LAUNCHER.value, points)))
  elif action == "status":
    for p in points:
      print(f"{runner.status(workdir, p):9s} {p.name}")
  else:
    if action == "run":
      runner.run_grid(grid, workdir, points=points, rerun_changed=_RERUN.value,
                      keep_going=_KEEP_GOING.value)
    files = report.write_report(grid, workdir, out, points if _ONLY.value else None)
    print((files["md"]).read_text())
    print("wrote " + ", ".join(str(f) for f in files.values()))


if __name__ == "__main__":
  app.run(main)
