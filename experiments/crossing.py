r"""ELECTRA vs MLM along the learning curve: at what compute ELECTRA's discriminator leaves its
prior, and where (if anywhere) ELECTRA catches MLM downstream at equal training FLOPs.

  bash run.sh python -m experiments.run --grid=electra_curve --in_process  # the runs, resumable
  bash run.sh python -m experiments.crossing                                # this analysis

Reads the runs of grid `electra_curve` (experiments/grids.py: one run per objective and
pre-training seed at twice grid (a)'s budget, held-out evaluations along it, Brown POS
fine-tuned with 3 seeds from the checkpoints at 1/4, 1/2, 3/4 and the end) and writes to --out:

* curve.csv: every held-out evaluation: the discriminator's loss over its prior (the binary
  entropy of the replaced share, what predicting the base rate costs; experiments.report), and
  the nats below the unigram baseline at [MASK] inputs (MLM's head, ELECTRA's generator);
* downstream.csv: POS test accuracy per objective, pre-training seed, checkpoint and
  fine-tuning seed;
* crossing.md: where each discriminator's ratio first falls to experiments.report's
  RTD_STALL_RATIO (0.95, "left its prior") and each MLM run's gap first reaches STALL_GAP (0.1
  nats), both interpolated in log FLOPs between evaluations; POS per objective at each
  checkpoint with ELECTRA's deficit; a power law fitted to each objective's POS error rate
  against FLOPs and the FLOPs where the two meet, with a 95% interval from a hierarchical
  bootstrap (pre-training seeds, then fine-tuning seeds within each);
* crossing.png: the three curves against FLOPs (log scale), the fitted lines drawn on to
  the crossing, and a random init of the same shape fine-tuned the same way
  (--random_reference: the line below which a checkpoint's pre-training has not yet helped);
* provenance.json: the command, flags, commit and host (experiments.provenance).

The extrapolation rests on the power-law trend of four checkpoints of one schedule each (the
first three taken before the learning rate has decayed) and on 2 pre-training seeds; a crossing
far beyond the measured FLOPs is a trend, not a measurement, and crossing.md says how far.
"""
from __future__ import annotations

import csv
import math
import pathlib
import statistics
import time
from typing import Sequence

from absl import app, flags
import numpy as np

from experiments import grids, provenance, report, runner

OBJECTIVES = ("mlm", "electra")


def define_flags() -> None:
  flags.DEFINE_string("workdir", "experiments/runs/electra_curve", "The grid's runs.")
  flags.DEFINE_string("out", "experiments/results/electra_curve", "Report directory.")
  flags.DEFINE_string("task", "brown_pos", "The fine-tuning task along the curve.")
  flags.DEFINE_integer("resamples", 10000, "Hierarchical bootstrap resamples (seed 0).")
  flags.DEFINE_bool("random_reference", True, "Also fine-tune a random init of the runs' shape "
                    "on --task with the same recipe and seeds (~1 min on 2 cores, kept in "
                    "<workdir>/random_<task>/ and reused): the line ELECTRA must clear before "
                    "its pre-training helps at all.")


# ------------------------------------------------------------------ reading the runs

def eval_curve(point, rows: Sequence[dict]) -> list[dict]:
  """One dict per held-out evaluation: step, flops, disc_vs_prior (RTD runs), gap_at_mask."""
  out = []
  for r in sorted((r for r in rows if r.get("split") == "eval"), key=lambda r: r["step"]):
    row = {"step": r["step"], "flops": r["step"] * point.flops_per_step}
    scores = report.eval_scores(r)
    row |= {k: scores[k] for k in ("disc_vs_prior", "gap_at_mask") if k in scores}
    out.append(row)
  return out


def first_crossing(xs: Sequence[float], ys: Sequence[float], level: float,
                   below: bool) -> float:
  """The first x where y reaches `level` (falls to it if `below`, else rises to it), linearly
  interpolated in log x between the evaluations around it; nan if it never does."""
  for i, (x, y) in enumerate(zip(xs, ys)):
    if (y <= level) if below else (y >= level):
      if i == 0:
        return x
      x0, y0 = xs[i - 1], ys[i - 1]
      t = (level - y0) / (y - y0)
      return 10 ** (math.log10(x0) + t * (math.log10(x) - math.log10(x0)))
  return math.nan


def downstream(point, pdir: pathlib.Path, task: str) -> list[tuple[float, int, list[float]]]:
  """(fraction, step, per-seed test scores) of each `task` job of the point, in run order."""
  out = []
  # the run's last step (a FLOPs budget may end it a step before point.steps)
  last = (report.read_json(pdir / "pretrain" / "summary.json") or {}).get(
      "steps", point.steps)
  for job in point.finetune:
    if job.task != task:
      continue
    step = job.step_of(point) or last
    res = report.read_json(pdir / job.dirname / "results.json") or {}
    out.append((job.at_fraction, step, report.seed_scores(res)[1]))
  return sorted(out)


def random_reference(workdir: pathlib.Path, task: str) -> list[float]:
  """`task`'s per-seed test scores of a random init of the grid's shape, fine-tuned as the
  grid's jobs are (the main job's recipe, configs/finetune.py run=demo, 3 seeds); the run is
  kept and reused while its config is unchanged."""
  from encoder_jax.finetune import jobs  # pylint: disable=g-import-not-at-top
  from encoder_jax.finetune.run import finetune_and_evaluate  # pylint: disable=g-import-not-at-top
  grid = grids.get_grid("electra_curve")
  point = grid.points[0]
  job = next(j for j in point.finetune if j.task == task and j.at_fraction == 1)
  pdir = pathlib.Path(runner.point_dir(workdir, point)) / "pretrain"
  config = jobs.job_config(task, "random", pdir, seeds=job.seeds)
  out = workdir / f"random_{task}"
  res = jobs.finished(config, out)
  if res is None:
    finetune_and_evaluate(config, str(out))
    res = report.read_json(out / "results.json") or {}
  return report.seed_scores(res)[1]


# ------------------------------------------------------------------ the crossing
#
# Each objective's error rate (1 - accuracy) is fitted as a power law in training FLOPs, a line
# in log10(error) against log10(FLOPs): the form scaling laws take, and one that never passes
# accuracy 1 (a line in accuracy itself meets MLM's only above 1 on these curves).

def log_error(acc):
  """log10(1 - accuracy): the fitted quantity."""
  return np.log10(1.0 - np.asarray(acc, dtype=float))


def fit_line(log_flops: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
  """(slope, intercept) of the least-squares line y = slope * log10(FLOPs) + intercept."""
  slope, intercept = np.polyfit(log_flops, ys, 1)
  return float(slope), float(intercept)


def reach(slope, intercept, level, x_last):
  """log10 FLOPs where the falling line y = slope * x + intercept gets down to `level`: x_last
  if it is there already at the largest measured x_last; inf if it never gets there (flat or
  rising). Works on arrays (one line per bootstrap resample)."""
  slope, intercept = np.asarray(slope, dtype=float), np.asarray(intercept, dtype=float)
  with np.errstate(divide="ignore", invalid="ignore"):
    ahead = np.where(slope < 0, (level - intercept) / slope, np.inf)
  return np.where(slope * x_last + intercept <= level, x_last, ahead)


def crossing(mlm: tuple[float, float], electra: tuple[float, float], x_last: float) -> float:
  """log10 FLOPs where ELECTRA's error line meets MLM's (their difference reaches 0): x_last
  if ELECTRA is level or ahead already, inf if its line does not fall faster than MLM's."""
  (bm, am), (be, ae) = mlm, electra
  return float(reach(be - bm, ae - am, 0.0, x_last))


def bootstrap(scores: dict[str, np.ndarray], log_flops: np.ndarray, resamples: int,
              seed: int = 0) -> dict[str, np.ndarray]:
  """scores[objective]: accuracies [pre-training seed, checkpoint, fine-tuning seed]. Each
  resample draws pre-training seeds with replacement (a seed's whole curve goes together), then
  fine-tuning seeds with replacement within each drawn seed and checkpoint; returns per
  resample ELECTRA's deficit at each checkpoint (MLM - ELECTRA, accuracy), the crossing (log10
  FLOPs, as `crossing`) and ELECTRA's error line."""
  rng = np.random.default_rng(seed)
  means = {}
  for obj, s in scores.items():
    n_pre, n_ck, n_ft = s.shape
    pre = rng.integers(0, n_pre, size=(resamples, n_pre))
    ft = rng.integers(0, n_ft, size=(resamples, n_pre, n_ck, n_ft))
    picked = s[pre[:, :, None, None], np.arange(n_ck)[None, None, :, None], ft]
    means[obj] = picked.mean(axis=(1, 3))  # [resample, checkpoint]
  x = log_flops - log_flops.mean()
  lines = {}
  for o, m in means.items():
    y = log_error(m)
    slope = (y * x).sum(1) / (x * x).sum()
    lines[o] = (slope, y.mean(1) - slope * log_flops.mean())
  (bm, am), (be, ae) = lines["mlm"], lines["electra"]
  return {"deficit": means["mlm"] - means["electra"],
          "crossing": reach(be - bm, ae - am, 0.0, log_flops[-1]),
          "electra_slope": be, "electra_intercept": ae}


def _pct(a: np.ndarray) -> tuple[float, float]:
  """The 2.5th and 97.5th percentiles, taken as sample values (an inf, "never", stays inf:
  interpolating between infs gives nan)."""
  lo, hi = np.percentile(a, [2.5, 97.5], method="inverted_cdf")
  return float(lo), float(hi)


def _flops_text(x: float) -> str:
  if math.isinf(x):
    return "never"
  return "> 1e300" if x > 300 else f"{10 ** x:.2g}"


# ------------------------------------------------------------------ the report

def analyse(workdir: pathlib.Path, out: pathlib.Path, task: str = "brown_pos",
            resamples: int = 10000, random_scores: Sequence[float] = ()) -> str:
  """Writes curve.csv, downstream.csv, crossing.md and crossing.png; returns crossing.md.
  `random_scores`: a random init's fine-tuning scores on `task` (random_reference), if any."""
  grid = grids.get_grid("electra_curve")
  out.mkdir(parents=True, exist_ok=True)
  curves, ds, status = {}, {}, {}
  for p in grid.points:
    key = (p.labels["objective"], int(p.labels["seed"]))
    pdir = runner.point_dir(workdir, p)
    curves[key] = eval_curve(p, report.read_curves(pathlib.Path(pdir)))
    ds[key] = downstream(p, pathlib.Path(pdir), task)
    status[key] = runner.status(workdir, p)
  with open(out / "curve.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["objective", "seed", "step", "flops", "disc_vs_prior", "gap_at_mask"])
    for (obj, seed), rows in curves.items():
      for r in rows:
        w.writerow([obj, seed, r["step"], f"{r['flops']:.6g}",
                    f"{r.get('disc_vs_prior', math.nan):.6g}",
                    f"{r.get('gap_at_mask', math.nan):.6g}"])
  with open(out / "downstream.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["objective", "seed", "fraction", "step", "flops", "ft_seed", task])
    for (obj, seed), rows in ds.items():
      fps = next(p.flops_per_step for p in grid.points
                 if p.labels["objective"] == obj and int(p.labels["seed"]) == seed)
      for frac, step, vals in rows:
        for i, v in enumerate(vals):
          w.writerow([obj, seed, frac, step, f"{step * fps:.6g}", i, f"{v:.6g}"])

  lines = ["### ELECTRA vs MLM along the learning curve", "",
           f"Grid `electra_curve`: {len(grid.points)} runs, each "
           f"{grid.points[0].total_flops:.3g} training FLOPs (generator and discriminator "
           "counted; twice grid (a)'s budget), held-out evaluation every "
           f"{grid.points[0].overrides['train.eval_every']:,} MLM / "
           f"{grid.points[1].overrides['train.eval_every']:,} ELECTRA steps. Status: "
           + ", ".join(f"{o} seed {s} {st}" for (o, s), st in status.items()) + ".", "",
           "#### When each run leaves its plateau", "",
           f"ELECTRA: the first FLOPs where the discriminator's held-out loss falls to "
           f"{report.RTD_STALL_RATIO} of its prior's entropy. MLM: where its held-out loss at "
           f"[MASK] first gets {report.STALL_GAP} nats below the unigram baseline (both "
           "interpolated in log FLOPs between evaluations; the first evaluation already past "
           "the level gives its own FLOPs, an upper bound).", "",
           "| objective | seed | leaves its plateau at (FLOPs) | tokens | at the end: disc / prior "
           "| at the end: nats below unigram at [MASK] |", "|---|---|---|---|---|---|"]
  tokens_per_flop = {}
  for p in grid.points:
    cfg = p.config()
    tokens_per_flop[p.labels["objective"]] = (cfg.data.batch_size * cfg.data.max_length
                                              / p.flops_per_step)
  exits = {}
  for (obj, seed), rows in curves.items():
    xs = [r["flops"] for r in rows]
    if obj == "electra":
      x = first_crossing(xs, [r.get("disc_vs_prior", math.nan) for r in rows],
                         report.RTD_STALL_RATIO, below=True)
    else:
      x = first_crossing(xs, [r.get("gap_at_mask", math.nan) for r in rows],
                         report.STALL_GAP, below=False)
    exits[(obj, seed)] = x
    last = rows[-1] if rows else {}
    lines.append(f"| {obj} | {seed} | {x:.3g} | {x * tokens_per_flop[obj]:.3g} | "
                 f"{last.get('disc_vs_prior', math.nan):.4f} | "
                 f"{last.get('gap_at_mask', math.nan):.3f} |".replace("nan", "–"))

  # POS at the checkpoints: complete when every run has every checkpoint's seeds
  fracs = sorted({f for rows in ds.values() for f, _, _ in rows})
  complete = all(len(ds.get((o, s), [])) == len(fracs) and all(v for _, _, v in ds[(o, s)])
                 for o in OBJECTIVES for s in (0, 1))
  lines += ["", f"#### {task} test accuracy from each checkpoint (3 fine-tuning seeds each)", "",
            "| fraction of the run | FLOPs | MLM (median [min, max] over 2 x 3 seeds) | "
            "ELECTRA | MLM - ELECTRA, pooled means (95% interval) |", "|---|---|---|---|---|"]
  fit_text, boot, fits, x_cross, x_last = [], None, {}, math.nan, math.nan
  if complete:
    n_ft = min(len(v) for rows in ds.values() for _, _, v in rows)
    scores = {o: np.array([[v[:n_ft] for _, _, v in ds[(o, s)]] for s in (0, 1)])
              for o in OBJECTIVES}
    fps = {p.labels["objective"]: p.flops_per_step for p in grid.points}
    # the same fraction of a same-FLOPs run is the same FLOPs for both objectives (to 0.03%)
    flops = np.array([step * fps["mlm"] for _, step, _ in ds[("mlm", 0)]])
    log_flops = np.log10(flops)
    boot = bootstrap(scores, log_flops, resamples)
    for i, frac in enumerate(fracs):
      cells = []
      for o in OBJECTIVES:
        vals = scores[o][:, i, :].ravel()
        cells.append(f"{statistics.median(vals):.4f} [{vals.min():.4f}, {vals.max():.4f}]")
      d = scores["mlm"][:, i].mean() - scores["electra"][:, i].mean()
      lo, hi = _pct(boot["deficit"][:, i])
      lines.append(f"| {frac:g} | {flops[i]:.3g} | {cells[0]} | {cells[1]} | "
                   f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}] |")
    fits = {o: fit_line(np.repeat(log_flops, scores[o].shape[0] * scores[o].shape[2]),
                        log_error(scores[o].transpose(1, 0, 2).ravel())) for o in OBJECTIVES}
    x_last = float(log_flops[-1])
    x_cross = crossing(fits["mlm"], fits["electra"], x_last)
    cross = boot["crossing"]
    fit_text = ["", "#### The extrapolated crossing", "",
                f"Power laws in the error rate (lines of log10(1 - accuracy) against log10 FLOPs) "
                f"through all {scores['mlm'].size} scores per objective: " + "; ".join(
                    f"{o}'s error x{10 ** fits[o][0]:.3f} per 10x FLOPs" for o in OBJECTIVES)
                + "."]
    if x_cross == x_last:
      fit_text.append("ELECTRA is level with MLM or ahead at the largest measured budget.")
    elif x_cross < 300:
      acc = 1 - 10 ** (fits["mlm"][0] * x_cross + fits["mlm"][1])
      fit_text.append(
          f"They meet at **{10 ** x_cross:.2g} FLOPs**, {10 ** (x_cross - x_last):.3g}x the "
          f"largest measured ({flops[-1]:.3g}), at {task} {acc:.3f}.")
    elif math.isfinite(x_cross):
      fit_text.append("They meet only beyond 1e300 FLOPs: ELECTRA's error falls barely faster.")
    else:
      fit_text.append("They do not meet: ELECTRA's error does not fall faster than MLM's.")
    lo, hi = _pct(cross)
    meets = np.isfinite(cross).mean()
    fit_text.append(
        f"Hierarchical bootstrap ({resamples:,} resamples): the lines meet in {meets:.1%} of "
        f"them; 95% interval of the crossing [{_flops_text(lo)}, {_flops_text(hi)}] FLOPs.")
    # The same data under another law, to show how much the answer hangs on the law: the error
    # falling by a fixed amount (not a fixed factor) per 10x FLOPs.
    lin = {o: fit_line(np.repeat(log_flops, scores[o].shape[0] * scores[o].shape[2]),
                       1 - scores[o].transpose(1, 0, 2).ravel()) for o in OBJECTIVES}
    x_lin = crossing(lin["mlm"], lin["electra"], x_last)
    if x_last < x_lin < 300:
      acc_lin = 1 - (lin["mlm"][0] * x_lin + lin["mlm"][1])
      fit_text.append(
          "Under another law, straight lines in accuracy (" + "; ".join(
              f"{o} {-lin[o][0] * 100:+.1f} points per 10x" for o in OBJECTIVES)
          + f"), they would meet at {10 ** x_lin:.2g} FLOPs, at {task} {acc_lin:.3f}"
          + (" (above 1: impossible, so that law cannot hold that far)" if acc_lin > 1 else "")
          + ": the data cannot choose between the laws, and the crossing hangs on the choice.")
    fit_text.append(
        "This rests on a power law through four checkpoints of one schedule per run (the first "
        "three before the learning rate decayed) and on 2 pre-training seeds, which resample "
        "to only three distinct pairs. Neither law can be trusted far out: MLM's error is "
        "flattening towards a floor (which brings the crossing earlier), and ELECTRA's present "
        "fall is its discriminator leaving the prior (which slows too, and pushes it later).")
  else:
    for frac in fracs:
      cells = []
      for o in OBJECTIVES:
        vals = [v for s in (0, 1) for f, _, vs in ds.get((o, s), []) if f == frac for v in vs]
        cells.append(f"{statistics.median(vals):.4f} [{min(vals):.4f}, {max(vals):.4f}], "
                     f"n={len(vals)}" if vals else "–")
      lines.append(f"| {frac:g} | | {cells[0]} | {cells[1]} | (incomplete) |")
  if random_scores:
    level = statistics.mean(random_scores)
    lines += ["", f"A random init of the same shape, fine-tuned the same way: {task} "
              f"{level:.4f} (mean; [{min(random_scores):.4f}, {max(random_scores):.4f}] over "
              f"{len(random_scores)} seeds)."]
    if fits:
      x_rand = float(reach(*fits["electra"], float(log_error(level)), x_last))
      lo, hi = _pct(reach(boot["electra_slope"], boot["electra_intercept"],
                          float(log_error(level)), x_last))
      where = ("already at the largest measured budget" if x_rand == x_last else
               f"at **{_flops_text(x_rand)} FLOPs**" + (
                   f" ({10 ** (x_rand - x_last):.3g}x the largest measured)"
                   if x_rand < 300 else ""))
      lines.append(f"ELECTRA's power law reaches the random init's mean {where} (95% interval "
                   f"[{_flops_text(lo)}, {_flops_text(hi)}], the random init's level held "
                   "fixed): before that its pre-training has not helped this task at all.")
  lines += fit_text
  plot(curves, ds, out / "crossing.png", task, exits, fits, x_cross, random_scores)
  lines += ["", "![curves](crossing.png)"]
  text = "\n".join(lines) + "\n"
  (out / "crossing.md").write_text(text)
  return text


def plot(curves, ds, path: pathlib.Path, task: str, exits, fits, x_cross: float,
         random_scores: Sequence[float] = ()) -> None:
  """Three panels against FLOPs: the discriminator / prior, the nats below unigram at [MASK],
  and POS from each checkpoint with the fitted lines drawn on to their crossing (when it is
  within 1000x of the measured FLOPs)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker  # pylint: disable=unused-import
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
  colors = {"mlm": "tab:blue", "electra": "tab:red"}
  styles = {0: "-", 1: "--"}
  for (obj, seed), rows in curves.items():
    xs = [r["flops"] for r in rows]
    if obj == "electra":
      axes[0].plot(xs, [r.get("disc_vs_prior", math.nan) for r in rows], styles[seed],
                   color=colors[obj], label=f"ELECTRA seed {seed}")
      if math.isfinite(exits[(obj, seed)]):
        axes[0].axvline(exits[(obj, seed)], color=colors[obj], ls=":", lw=1)
    axes[1].plot(xs, [r.get("gap_at_mask", math.nan) for r in rows], styles[seed],
                 color=colors[obj],
                 label=f"{'MLM' if obj == 'mlm' else 'ELECTRA generator'} seed {seed}")
  axes[0].axhline(report.RTD_STALL_RATIO, color="grey", ls=":", lw=1)
  axes[0].set(title="discriminator loss / prior entropy (held out)", ylabel="ratio")
  axes[1].axhline(report.STALL_GAP, color="grey", ls=":", lw=1)
  axes[1].set(title="nats below unigram at [MASK] (held out)", ylabel="nats")
  for (obj, seed), rows in ds.items():
    fps = curves[(obj, seed)][-1]["flops"] / curves[(obj, seed)][-1]["step"] if curves[
        (obj, seed)] else math.nan
    pts = [(step * fps, statistics.median(v)) for _, step, v in rows if v]
    if pts:
      axes[2].plot(*zip(*pts), styles[seed], marker="o", color=colors[obj],
                   label=f"{obj} seed {seed} (median of 3)")
  if fits:
    measured = [r["flops"] for rows in curves.values() for r in rows]
    lo, hi = math.log10(min(measured)), math.log10(max(measured))
    end = x_cross if math.isfinite(x_cross) and x_cross - hi < 3 else hi
    xs = np.linspace(lo, max(hi, end), 50)
    for o, (slope, intercept) in fits.items():
      axes[2].plot(10 ** xs, 1 - 10 ** (slope * xs + intercept), ":", color=colors[o], lw=1.2,
                   label=f"{o}: power law in the error")
    if end > hi:
      axes[2].plot(10 ** x_cross, 1 - 10 ** (fits["mlm"][0] * x_cross + fits["mlm"][1]), "kx",
                   ms=9, label=f"crossing {10 ** x_cross:.2g} FLOPs (extrapolated)")
  if random_scores:
    axes[2].axhline(statistics.mean(random_scores), color="grey", ls="--", lw=1,
                    label="random init (mean of 3 seeds)")
  axes[2].set(title=f"{task} test accuracy from each checkpoint", ylabel="accuracy")
  for ax in axes:
    ax.set_xscale("log")
    # ticks at 1, 2 and 5 per decade, labelled 2e+13: the default minor labels overlap
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.0e}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training FLOPs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
  fig.suptitle("ELECTRA vs MLM at equal training FLOPs (grid electra_curve)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  f = flags.FLAGS
  t0 = time.time()
  provenance.pin_git_state()
  out, workdir = pathlib.Path(f.out), pathlib.Path(f.workdir)
  scores = random_reference(workdir, f.task) if f.random_reference else []
  print(analyse(workdir, out, f.task, f.resamples, scores))
  provenance.record_tool(out, "experiments.crossing",
                         {k: f[k].value for k in ("workdir", "out", "task", "resamples",
                                                  "random_reference")},
                         (time.time() - t0) / 60)


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  define_flags()
  cli.run(main, "experiments.crossing")
