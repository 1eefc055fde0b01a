"""Aggregates a grid's runs into results.csv, results.md and PNG plots.

  rows = collect(grid, workdir)            # one dict per point, from files only
  write_report(grid, workdir, out_dir)     # results.csv, results.md, loss_vs_flops.png,
                                           # downstream_vs_flops.png (grids with fine-tuning),
                                           # heldout_vs_flops.png (grids with perplexity)

results.md opens with the commit and date of the runs behind it and every recorded invocation
(from <out_dir>/provenance.json, which experiments.run appends to: experiments.provenance).

Reads only what runs leave on disk (pretrain/summary.json, pretrain/metrics.jsonl,
ft_<task>/results.json), so a report can be regenerated at any time, also from a partial
grid (unfinished points show as such) or from runs copied back from a pod.

Downstream scores: each task's "test/score" (accuracy for the demo tasks; the task's main
metric otherwise), median over fine-tuning seeds with min-max spread, as ELECTRA reports
medians over many seeds.
"""
from __future__ import annotations

import csv
import json
import math
import pathlib
import statistics
from typing import Any, Sequence

import numpy as np

from experiments import grids, provenance, runner
from experiments.grid import Grid, Point

# The first present per task: accuracy where the task has it (the demo tasks; sentiment's
# "score" is the mean of accuracy and F1), else the task's main score (CoLA's MCC, STS-B's
# Pearson/Spearman mean, SQuAD's F1/EM mean), on test, else on dev (GLUE's test has no labels).
# A point whose held-out loss at [MASK] inputs ends less than this many nats below the unigram
# baseline on the same positions never learned context: "stalled" (encoder_jax.train.step).
STALL_GAP = 0.1
# A replaced-token detector's plateau is its prior: predicting the replaced share p everywhere
# costs the binary entropy H(p) a token. One that ends above this fraction of H(p) on held-out
# rows learned (almost) nothing from context: "stalled". 5% of H(p) at p ~0.16 is ~0.022 nats a
# token, about as much information per row (x 64 tokens) as STALL_GAP over MLM's ~13 targets.
RTD_STALL_RATIO = 0.95
# A held-out replaced share of 0 or 1 (e.g. a generator that never samples the original, judged
# on the chosen positions only, as ELECTRA-15%) has no prior to beat: the ratio is undefined and
# the point counts as stalled, since nothing shows that it learned.

SCORE_KEYS = ("test/accuracy", "test/score", "validation/accuracy", "validation/score",
              "validation_matched/accuracy", "validation_matched/score")


def read_json(path: pathlib.Path) -> dict | None:
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def read_curves(pdir: pathlib.Path) -> list[dict]:
  path = pdir / "pretrain" / "metrics.jsonl"
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:  # a line cut by a kill
      continue
  return rows


def curve(grid: Grid, point: Point, rows: list[dict], split: str = "train"):
  """(key, [(flops, value)]) of the first of grid.curve_keys this point logged."""
  rows = [r for r in rows if r.get("split") == split]
  for key in grid.curve_keys:
    pts = [(r["step"] * point.flops_per_step, r[key]) for r in rows if key in r]
    if pts:
      return key, pts
  return None, []


def seed_scores(results: dict) -> tuple[str, list[float]]:
  """The per-seed scores of a fine-tuning results.json (first SCORE_KEYS key present)."""
  for key in SCORE_KEYS:
    split, metric = key.split("/")
    vals = []
    for run in results.get("runs", []):
      m = run.get("test") if split == "test" else run.get("dev", {}).get(split)
      if m and metric in m:
        vals.append(float(m[metric]))
    if vals:
      return key, vals
  return "", []


def collect(grid: Grid, workdir, points: Sequence[Point] | None = None) -> list[dict[str, Any]]:
  """One row per point: labels, status, steps, FLOPs, final losses, downstream medians."""
  out = []
  for point in points or grid.points:
    pdir = runner.point_dir(workdir, point)
    summary = read_json(pdir / "pretrain" / "summary.json") or {}
    rows = read_curves(pdir)
    row: dict[str, Any] = dict(point.labels)
    row["point"] = point.name
    row["status"] = runner.status(workdir, point)
    row["steps"] = summary.get("steps", max((r["step"] for r in rows), default=0))
    row["planned_steps"] = point.steps
    row["flops"] = row["steps"] * point.flops_per_step
    key, pts = curve(grid, point, rows, "train")
    row["curve_key"] = key or ""
    row["final_train_curve"] = pts[-1][1] if pts else math.nan
    ekey, epts = curve(grid, point, rows, "eval")
    row["final_eval_curve"] = epts[-1][1] if epts else math.nan
    if grid.perplexity:
      row["eval_perplexity"] = math.exp(row["final_eval_curve"])  # NaN stays NaN
    final_eval = summary.get("final_eval") or {}
    for k in ("mlm_accuracy", "main_accuracy", "gen_accuracy", "disc_accuracy",
              "disc_precision", "disc_recall", "nsp_accuracy"):
      if k in final_eval:
        row[f"eval_{k}"] = final_eval[k]
    row |= eval_scores(final_eval)
    rtd = "disc_vs_prior" in row
    if row["status"] == "done" and (
        (grid.stall_loss is not None and not row["final_eval_curve"] < grid.stall_loss)
        or (not row["disc_vs_prior"] <= RTD_STALL_RATIO if rtd  # NaN (no prior): stalled
            else row.get("gap_at_mask", math.inf) < STALL_GAP)):
      row["status"] = "stalled"
    row["wall_s"] = summary.get("total_wall_s", math.nan)
    jobs = {j.key: j for j in point.finetune}
    for name in job_keys(grid):  # a job the point does not have: no scores
      res = read_json(pdir / jobs[name].dirname / "results.json") if name in jobs else None
      skey, vals = seed_scores(res or {})
      row[f"{name}_median"] = statistics.median(vals) if vals else math.nan
      row[f"{name}_min"] = min(vals) if vals else math.nan
      row[f"{name}_max"] = max(vals) if vals else math.nan
      row[f"{name}_seeds"] = len(vals)
      row[f"{name}_metric"] = skey
      row[f"_{name}_scores"] = vals  # for the table over pre-training seeds (not in the CSV)
    out.append(row)
  return out


def eval_scores(ev: dict) -> dict[str, float]:
  """What a held-out evaluation (a metrics row or summary's final_eval) says about leaving the
  plateau: at [MASK] inputs the predictor's (MLM head or ELECTRA's generator) accuracy, the
  unigram's, and the nats below the unigram (gap_at_mask); for an RTD run the discriminator's
  loss over its prior's entropy (disc_vs_prior)."""
  out = {}
  pred = next((k for k in ("mlm", "gen") if f"{k}_at_mask_loss" in ev), None)
  if pred and "unigram_at_mask_loss" in ev:
    out["eval_at_mask_accuracy"] = ev.get(f"{pred}_at_mask_accuracy", math.nan)
    out["unigram_at_mask_accuracy"] = ev.get("unigram_at_mask_accuracy", math.nan)
    out["gap_at_mask"] = ev["unigram_at_mask_loss"] - ev[f"{pred}_at_mask_loss"]
  if "disc_loss" in ev and "disc_replaced_frac" in ev:  # ELECTRA, ELECTRA-15%
    out["disc_vs_prior"] = ev["disc_loss"] / binary_entropy(ev["disc_replaced_frac"])
  return out


def binary_entropy(p: float) -> float:
  """H(p) in nats: the loss of a detector that predicts the base rate p everywhere."""
  if not 0 < p < 1:
    return math.nan
  return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
  keys: list[str] = []
  for r in rows:
    keys += [k for k in r if k not in keys and not k.startswith("_")]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys)
    w.writeheader()
    for r in rows:
      w.writerow({k: r.get(k, "") for k in keys})


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    if math.isnan(v):
      return "–"
    if abs(v) >= 1e5:
      return f"{v:.3g}"
    return f"{v:.4f}"
  return str(v)


def job_keys(grid: Grid, final_only: bool = False) -> list[str]:
  """The fine-tuning jobs' report names over all points, in first-seen order (a dry run's
  points fine-tune different tasks)."""
  keys = [j.key for p in grid.points for j in p.finetune
          if not final_only or j.at_fraction == 1]
  return list(dict.fromkeys(keys))


def markdown(grid: Grid, rows: list[dict]) -> str:
  axes = list(grid.points[0].labels) if grid.points else []
  tasks = job_keys(grid)
  head = axes + ["status", "steps", "train FLOPs", "final train loss", "final eval loss"]
  extra = [k for k in ("eval_perplexity", "eval_mlm_accuracy", "eval_gen_accuracy",
                       "eval_main_accuracy", "eval_disc_accuracy", "eval_disc_precision",
                       "eval_disc_recall", "eval_nsp_accuracy", "eval_at_mask_accuracy",
                       "unigram_at_mask_accuracy", "gap_at_mask", "disc_vs_prior")
           if any(k in r for r in rows)]
  head += [_COLUMN.get(k, k.replace("eval_", "eval ").replace("_", " ")) for k in extra]
  for t in tasks:
    metric = next((r[f"{t}_metric"] for r in rows if r.get(f"{t}_metric")), "score")
    head.append(f"{t} {metric} (median [min, max], n)")
  lines = [f"### {grid.title}", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
  for r in rows:
    cells = [r[a] for a in axes] + [r["status"], str(r["steps"]), f"{r['flops']:.3g}",
                                    _fmt(r["final_train_curve"]), _fmt(r["final_eval_curve"])]
    cells += [_fmt(r.get(k, math.nan)) for k in extra]
    for t in tasks:
      n = r.get(f"{t}_seeds", 0)
      cells.append(f"{r[f'{t}_median']:.4f} [{r[f'{t}_min']:.4f}, {r[f'{t}_max']:.4f}], {n}"
                   if n else "–")
    lines.append("| " + " | ".join(map(str, cells)) + " |")
  keys = sorted({r["curve_key"] for r in rows if r["curve_key"]})
  if "seed" in axes:
    lines += ["", *seed_table(grid, rows, tasks), *difference_table(grid, rows, tasks)]
  lines += ["", f"At [MASK]: held-out scores at the targets whose input was [MASK] (the MLM "
            "head, or ELECTRA's generator), against the unigram baseline on the same positions; "
            f"a point less than {STALL_GAP} nats below it never left the plateau (\"stalled\"). "
            "ELECTRA and ELECTRA-15% are judged by their discriminator instead: its held-out "
            "loss over the binary entropy of its replaced share (the loss of predicting the "
            f"base rate); above {RTD_STALL_RATIO} it stalled."]
  lines += ["", f"Loss columns: {', '.join(keys) or '–'} (the curve each point logs: mlm_loss "
            "for MLM, the discriminator's main_loss for Replace-MLM, the generator's gen_loss "
            "for ELECTRA; RTD losses are not on the MLM scale). Downstream: median over "
            "fine-tuning seeds, [min, max] over seeds, n seeds."]
  if grid.perplexity:
    lines += ["", "eval perplexity: exp of the final held-out loss (the MLM loss over every "
              "prediction target: masked, random and kept inputs alike), on the same held-out "
              "batches for every point: the perplexity of RoBERTa's Table 3, per token of this "
              "vocabulary and corpus (so its value does not compare with the paper's)."]
  return "\n".join(lines)


_COLUMN = {"eval_perplexity": "eval perplexity",
           "eval_at_mask_accuracy": "eval acc at [MASK]",
           "unigram_at_mask_accuracy": "unigram acc at [MASK]",
           "gap_at_mask": "nats below unigram at [MASK]",
           "disc_vs_prior": "disc loss / prior entropy"}


def _spread(vals: list[float]) -> str:
  vals = [v for v in vals if not math.isnan(v)]
  if not vals:
    return "–"
  return f"{statistics.median(vals):.4f} [{min(vals):.4f}, {max(vals):.4f}]"


def seed_table(grid: Grid, rows: list[dict], tasks: list[str]) -> list[str]:
  """One line per arm over its pre-training seeds: median [min, max] of the held-out scores
  across seeds, and per task the fine-tuning scores of all its seeds pooled (median [min, max],
  n = pre-training seeds x fine-tuning seeds): the spread a finding must clear."""
  axes = [a for a in grid.points[0].labels if a != "seed"]
  arms: dict[tuple, list[dict]] = {}
  for r in rows:
    arms.setdefault(tuple(r[a] for a in axes), []).append(r)
  rtd = any("disc_vs_prior" in r for r in rows)
  head = axes + ["pre-training seeds"]
  head += ["eval loss", "eval perplexity"] if grid.perplexity else []
  head += ["eval acc at [MASK]", "nats below unigram at [MASK]"]
  head += ["disc loss / prior entropy"] if rtd else []
  head += [f"{t} (all seeds pooled: median [min, max], n)" for t in tasks]
  lines = ["#### Over pre-training seeds", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
  for key, group in arms.items():
    cells = list(key) + [f"{len(group)} ({', '.join(str(r['status']) for r in group)})"]
    if grid.perplexity:
      cells += [_spread([r["final_eval_curve"] for r in group]),
                _spread([r.get("eval_perplexity", math.nan) for r in group])]
    cells += [
        _spread([r.get("eval_at_mask_accuracy", math.nan) for r in group]),
        _spread([r.get("gap_at_mask", math.nan) for r in group])]
    if rtd:
      cells.append(_spread([r.get("disc_vs_prior", math.nan) for r in group]))
    for t in tasks:
      pooled = [v for r in group for v in r.get(f"_{t}_scores", [])]
      cells.append(f"{_spread(pooled)}, {len(pooled)}" if pooled else "–")
    lines.append("| " + " | ".join(map(str, cells)) + " |")
  return lines


def hierarchical_means(scores: Sequence[Sequence[float]], resamples: int,
                       rng: np.random.Generator) -> np.ndarray:
  """Bootstrap distribution of an arm's pooled mean: scores[pre-training seed] holds that
  seed's fine-tuning scores (one value for a pre-training measure). Each resample draws the
  pre-training seeds with replacement, then fine-tuning seeds with replacement within each
  drawn seed (both sources of noise, the between-seed one kept whole)."""
  arr = _arm_array(scores)
  pre = rng.integers(0, arr.shape[0], size=(resamples, arr.shape[0]))
  ft = rng.integers(0, arr.shape[1], size=(resamples, arr.shape[0], arr.shape[1]))
  return arr[pre[:, :, None], ft].mean(axis=(1, 2))


def _arm_array(scores: Sequence[Sequence[float]]) -> np.ndarray:
  """[pre-training seed, fine-tuning seed], each seed's scores cut to the fewest any has (so
  that the estimate and its bootstrap weigh the same scores)."""
  n_ft = min(len(v) for v in scores)
  return np.array([list(v)[:n_ft] for v in scores], dtype=float)


def difference_table(grid: Grid, rows: list[dict], tasks: list[str], resamples: int = 10000,
                     seed: int = 0) -> list[str]:
  """Each arm minus the first (the grid's reference arm): the difference of pooled means of the
  held-out nats below unigram at [MASK] and of each task, with a 95% interval from
  `hierarchical_means` (arms resampled independently), where both arms have >= 2 finished
  pre-training seeds. An interval that excludes 0 is marked *. With 2 pre-training seeds an
  arm's seeds resample to three distinct pairs, which narrows the interval: a marked
  difference is a lead, an unmarked one is "not separable here"."""
  axes = [a for a in grid.points[0].labels if a != "seed"]
  arms: dict[tuple, list[dict]] = {}
  for r in rows:
    if r["status"] in ("done", "stalled"):
      arms.setdefault(tuple(r[a] for a in axes), []).append(r)
  measures = [("gap_at_mask", "nats below unigram at [MASK]")] + [(t, t) for t in tasks]
  if grid.perplexity:  # the held-out loss itself (a difference of log-perplexities)
    measures.insert(0, ("final_eval_curve", "eval loss"))

  def scores(group, m):
    if m in ("gap_at_mask", "final_eval_curve"):  # one value per pre-training seed
      return [[r[m]] for r in group if m in r and not math.isnan(r[m])]
    return [r[f"_{m}_scores"] for r in group if r.get(f"_{m}_scores")]
  ref_key = tuple(grid.points[0].labels[a] for a in axes)  # the grid's first arm
  others = [k for k in arms if k != ref_key]
  if ref_key not in arms or not others:
    return []
  rng = np.random.default_rng(seed)
  ref_name = ",".join(f"{a}={v}" for a, v in zip(axes, ref_key))
  head = axes + [f"{label}: difference [95% interval]" for _, label in measures]
  lines = ["", f"#### Differences from {ref_name}", "",
           f"Pooled mean of each arm minus {ref_name}'s, with a 95% interval from {resamples:,} "
           "hierarchical bootstrap resamples (pre-training seeds, then fine-tuning seeds within "
           "each; * where it excludes 0).", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
  for key in others:
    cells = list(key)
    for m, _ in measures:
      a, b = scores(arms[key], m), scores(arms[ref_key], m)
      if len(a) < 2 or len(b) < 2:  # one seed: no between-seed spread to resample
        cells.append(f"– ({min(len(a), len(b))} seed)" if a and b else "–")
        continue
      diff = float(_arm_array(a).mean() - _arm_array(b).mean())
      boot = hierarchical_means(a, resamples, rng) - hierarchical_means(b, resamples, rng)
      lo, hi = np.percentile(boot, [2.5, 97.5])
      mark = "*" if lo > 0 or hi < 0 else ""
      cells.append(f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}]{mark}")
    lines.append("| " + " | ".join(map(str, cells)) + " |")
  return lines


def plot_loss(grid: Grid, workdir, path: pathlib.Path, points=None, split: str = "train"
              ) -> None:
  """The curve of each point against training FLOPs: its train loss, or (split "eval") its
  held-out evaluations, as perplexity where the grid reports it."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  points = list(points or grid.points)
  facets: dict[tuple, list[Point]] = {}
  for p in points:
    facets.setdefault(tuple(p.labels[a] for a in grid.facet), []).append(p)
  n = len(facets)
  cols = 2 if n == 4 else min(n, 3)
  rows_n = math.ceil(n / cols)
  fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.6 * rows_n), squeeze=False,
                           sharex=True, sharey=True)
  for ax, (fkey, fpoints) in zip(axes.flat, facets.items()):
    for p in fpoints:
      rows = read_curves(runner.point_dir(workdir, p))
      key, pts = curve(grid, p, rows, split)
      if not pts:
        continue
      label = ",".join(f"{k}={v}" for k, v in p.labels.items() if k not in grid.facet)
      label += f" ({key})" if len(grid.curve_keys) > 1 else ""
      xs, ys = zip(*pts)
      if split == "eval" and grid.perplexity:
        ys = [math.exp(y) for y in ys]
      line, = ax.plot(xs, ys, "o-" if split == "eval" else "-", label=label or p.name, lw=1.3,
                      ms=3)
      st = runner.status(workdir, p)
      if st == "diverged":
        ax.plot(xs[-1], ys[-1], "x", color=line.get_color(), ms=10, mew=2)
        ax.annotate("diverged", (xs[-1], ys[-1]), fontsize=8, color=line.get_color())
    if grid.stall_loss is not None:
      ax.axhline(grid.stall_loss, color="grey", ls=":", lw=1)
    if grid.facet:
      ax.set_title(", ".join(f"{a}={v}" for a, v in zip(grid.facet, fkey)), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  for i, ax in enumerate(axes.flat):
    if i >= n - cols:  # the lowest panel of each column
      ax.set_xlabel("training FLOPs")
      ax.xaxis.set_tick_params(labelbottom=True)
  what = ("train loss" if split == "train" else
          "held-out perplexity" if grid.perplexity else "held-out loss")
  for ax in axes[:, 0]:
    ax.set_ylabel(what)
  for ax in list(axes.flat)[n:]:
    ax.set_visible(False)
  fig.suptitle(f"{grid.title}: {what} vs FLOPs" if split == "eval"
               else f"{grid.title}: pre-training loss vs FLOPs",
               fontsize=11 if split == "eval" else None)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_downstream(grid: Grid, rows: list[dict], path: pathlib.Path) -> bool:
  """Downstream median (seed min-max as error bars) vs pre-training FLOPs, one panel per task
  (final checkpoints only: a grid's learning curves are experiments.crossing's plots)."""
  tasks = job_keys(grid, final_only=True)
  if not tasks:
    return False
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
  axes_names = list(grid.points[0].labels)
  flops = [r["flops"] for r in rows if r["flops"] > 0]
  # An equal-compute grid puts every point at one FLOPs value: plot by point instead.
  equal = bool(flops) and max(flops) <= 1.02 * min(flops)
  for ax, t in zip(axes[0], tasks):
    for i, r in enumerate(rows):
      if not r.get(f"{t}_seeds"):
        continue
      med = r[f"{t}_median"]
      err = [[med - r[f"{t}_min"]], [r[f"{t}_max"] - med]]
      label = ",".join(f"{a}={r[a]}" for a in axes_names)
      ax.errorbar([i if equal else r["flops"]], [med], yerr=err, fmt="o", capsize=4,
                  label=label)
    metric = next((r[f"{t}_metric"] for r in rows if r.get(f"{t}_metric")), "score")
    ax.set_title(f"{t}: {metric} (median, min-max over seeds)", fontsize=10)
    if equal:
      ax.set_xticks(range(len(rows)), [",".join(str(r[a]) for a in axes_names) for r in rows],
                    fontsize=8, rotation=15)
      ax.set_xlabel(f"every point at {statistics.median(flops):.3g} pre-training FLOPs")
    else:
      ax.set_xlabel("pre-training FLOPs")
    ax.grid(alpha=0.3)
    if not equal:  # (by point, the tick labels name each point; a legend would cover them)
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def write_report(grid: Grid, workdir, out_dir, points=None) -> dict[str, pathlib.Path]:
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  rows = collect(grid, workdir, points)
  files = {"csv": out / "results.csv", "md": out / "results.md",
           "loss_png": out / "loss_vs_flops.png"}
  write_csv(rows, files["csv"])
  # What produced the runs (experiments.provenance, recorded by experiments.run) comes first.
  md = "\n".join(provenance.summary_lines(provenance.read(out))) + "\n\n" + markdown(grid, rows)
  if grid.anchor:
    md += f"\n\nPublished finding: {grid.anchor}\n"
  files["md"].write_text(md + "\n")
  plot_loss(grid, workdir, files["loss_png"], points)
  if grid.perplexity:
    files["heldout_png"] = out / "heldout_vs_flops.png"
    plot_loss(grid, workdir, files["heldout_png"], points, split="eval")
  if plot_downstream(grid, rows, out / "downstream_vs_flops.png"):
    files["downstream_png"] = out / "downstream_vs_flops.png"
  return files


# ------------------------------------------------------------------ plans


def duration(seconds: float) -> str:
  """Seconds as a short human figure (s, min, h, days)."""
  if seconds >= 86400:
    return f"{seconds / 86400:.1f} days"
  if seconds >= 3600:
    return f"{seconds / 3600:.1f} h"
  return f"{seconds:.2g} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def gpu_plan_lines(grid, mfu: float) -> list[str]:
  """One H100/H200 in one process: training FLOPs at `mfu` plus the per-point and
  per-fine-tuning-job costs of experiments.grids (GPU_POINT_S, GPU_FINETUNE_S)."""
  rate = grids.gpu_peak_flops() * mfu
  lines = [f"| point | steps | FLOPs/step | total FLOPs | est. time on one H200 (MFU {mfu:.0%} "
           f"+ {grids.GPU_POINT_S:g} s a point + {grids.GPU_FINETUNE_S:g} s a fine-tuning "
           "job) | fine-tuning |", "|---|---|---|---|---|---|"]
  total_s = total_flops = 0.0
  for p in grid.points:
    seconds = (p.total_flops / rate + grids.GPU_POINT_S
               + grids.GPU_FINETUNE_S * len(p.finetune))
    total_s, total_flops = total_s + seconds, total_flops + p.total_flops
    ft = ", ".join(f"{j.key}×{j.seeds}" for j in p.finetune) or "–"
    lines.append(f"| {p.name} | {p.steps:,} | {p.flops_per_step:.3g} | {p.total_flops:.3g} | "
                 f"{duration(seconds)} | {ft} |")
  lines.append(f"| **all** | | | {total_flops:.3g} | {duration(total_s)} | |")
  return lines
