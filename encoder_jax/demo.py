r"""The main job: pre-train the demo recipe, then show what its checkpoint is worth.

  python -m encoder_jax.demo --workdir=runs/demo            # what `bash run.sh demo` runs
  python -m encoder_jax.demo --workdir=runs/demo_electra --config.objective.objective=electra

1. Pre-trains `configs/pretrain.py:runlocal` (the demo recipe; any --config.* override
   applies) into <workdir>/pretrain, resuming or reusing a finished run.
2. Fine-tunes on both demo tasks (Rotten Tomatoes sentiment, Brown POS) from three backbones,
   each over --seeds seeds (configs/finetune.py:run=demo): the checkpoint just trained; a
   random init of exactly its shape and vocab (what pre-training must beat); all-MiniLM-L6-v2
   (a real pre-trained BERT, the upper reference). A finished job with the same config is
   reused; a changed one is run again.
3. Prints and writes <workdir>/results.md (+ results.json): held-out masked-token accuracy
   against the unigram baseline scored on the same positions, the loss's distance below the
   unigram baseline, and per task the median [min, max] test accuracy of each backbone, the
   majority-class rate, and whether the checkpoint's range clears the random init's.
4. Exports the checkpoint as a transformers folder, <workdir>/hf (encoder_jax.convert.export:
   the demo recipe's ModernBERT block as ModernBertForMaskedLM), and where transformers and
   torch are installed (`bash run.sh demo` installs them) loads it with
   AutoModelForMaskedLM and prints the largest difference between its logits and the run's
   ("reload check"); without them it prints the command that runs the check. A run another
   --config makes unexportable (e.g. --config.model.position_bias=alibi) gets export's one-line
   reason instead. A re-run replaces the folder only if it still holds exactly what the last
   export wrote there (recorded in results.json); anything else there is left as it is.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil
import time

from absl import app, flags
from ml_collections import config_flags

from encoder_jax.finetune import jobs
from encoder_jax.finetune.jobs import INIT_LABELS

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The CLI's flags, defined only when this module runs as the main job (importing it for
  its report functions must not clash with other modules' flags of the same name)."""
  config_flags.DEFINE_config_file(
      "config", str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "pretrain.py")
      + ":runlocal", "Pre-training config (default: the demo recipe, configs/pretrain.py:runlocal)"
      "; override any leaf with --config.a.b=value.", lock_config=True)
  flags.DEFINE_string("workdir", "runs/demo", "Where the pre-training run, the fine-tuning runs "
                      "and results.md go; re-running resumes / reuses what is there.")
  flags.DEFINE_integer("seeds", 3, "Fine-tuning seeds per task and backbone.")
  flags.DEFINE_list("tasks", ["rotten_tomatoes", "brown_pos"], "Demo tasks to fine-tune on.")
  flags.DEFINE_string("curve_of", "", "Only plot and tabulate the held-out accuracy curve of an "
                      "existing pre-training workdir (against tokens and minutes) into "
                      "<it>/curve.png and print it; nothing is trained.")
  flags.DEFINE_list("inits", ["pretrained", "random", "minilm"], "Backbones: pretrained (this "
                    "run's checkpoint), random (same shape and vocab), minilm (all-MiniLM-L6-v2).")
  flags.DEFINE_integer("finetune_workers", 0, "Fine-tuning jobs run in this many worker "
                       "processes, one CPU core each (encoder_jax/finetune/pool.py); 0: one per "
                       "usable core; 1: one after another in this process.")


# Longest first, so that the last job to start is a short one: MiniLM (22M parameters) costs
# about as much per job as the two tiny ones together; a random init of the checkpoint's shape
# compiles the same programs as the checkpoint's job, so it follows it and finds them in XLA's
# persistent cache.
_JOB_ORDER = ("minilm", "pretrained", "random")


def run_finetuning(tasks, inits, pretrain_dir: pathlib.Path, workdir: pathlib.Path, seeds: int,
                   workers: int) -> dict[str, dict[str, dict]]:
  """Every (task, init) fine-tuning job, finished ones reused, the rest over `workers`
  processes (encoder_jax.finetune.pool). Returns {task: {init: results}} in the given order."""
  from encoder_jax.finetune import pool  # pylint: disable=g-import-not-at-top
  pairs = [(t, i) for t in tasks for i in inits]
  done: dict[tuple[str, str], dict] = {}
  todo = []
  for task, init in pairs:
    config = jobs.job_config(task, init, pretrain_dir, seeds)
    jdir = workdir / f"finetune_{task}_{init}"
    old = jobs.finished(config, jdir)
    if old is not None:
      print(f"[2/3] reusing {jdir / 'results.json'}", flush=True)
      done[(task, init)] = old
    else:
      todo.append(((task, init), (config, str(jdir))))
  todo.sort(key=lambda job: _JOB_ORDER.index(job[0][1]) if job[0][1] in _JOB_ORDER else 0)
  workers = workers or pool.default_workers()
  if todo:
    print(f"[2/3] fine-tuning {len(todo)} jobs ({seeds} seeds each) in "
          f"{min(workers, len(todo))} worker process(es): "
          + ", ".join(f"{t} from {INIT_LABELS[i]}" for (t, i), _ in todo), flush=True)

  def on_done(n: int, result: dict) -> None:
    task, init = todo[n][0]
    test = result["summary"].get("test/accuracy", {})
    print(f"[2/3] done {task} from {INIT_LABELS[init]} in {result['seconds']:.0f} s: test "
          f"accuracy median {test.get('median', float('nan')):.4f}", flush=True)

  for (key, _), result in zip(todo, pool.run_jobs([job for _, job in todo], workers, on_done)):
    done[key] = result
  return {t: {i: done[(t, i)] for i in inits} for t in tasks}


def _majority_rate(task: str, cache_dir=None) -> float | None:
  """Test accuracy of always predicting the most frequent training label (classification)."""
  if task != "rotten_tomatoes":
    return None
  import numpy as np  # pylint: disable=g-import-not-at-top
  from encoder_jax.data import rotten_tomatoes  # pylint: disable=g-import-not-at-top
  rows = rotten_tomatoes.rows(cache_dir)
  split = rotten_tomatoes.split_movies(sorted({r["movie"] for r in rows}))
  train = np.array([r["label"] for r in rows if split[r["movie"]] == "train"])
  test = np.array([r["label"] for r in rows if split[r["movie"]] == "test"])
  return float(np.mean(test == np.bincount(train).argmax()))


TARGET_ACCURACY = 0.25  # the demo's goal for held-out masked-token accuracy


def learning_curve(pretrain_dir: pathlib.Path) -> list[dict]:
  """The eval rows of a pre-training run with tokens and minutes: tokens = step x batch x
  row length (padding included), minutes = wall-clock since the first step (the first logged
  step's time minus its steps at the logged step time; a resumed run's pause is not counted out).
  """
  config = json.loads((pretrain_dir / "config.json").read_text())
  per_step = config["data"]["batch_size"] * config["data"]["max_length"]
  rows = [json.loads(l) for l in (pretrain_dir / "metrics.jsonl").read_text().splitlines()
          if l.strip()]
  train = [r for r in rows if r["split"] == "train" and "step_time_s" in r]
  if not train:
    return []
  start = train[0]["time"] - train[0]["step"] * train[0]["step_time_s"]
  out, seen = [], set()
  for r in rows:
    acc_key = next((k for k in ("mlm_accuracy", "gen_accuracy") if k in r), None)
    # A finished run that is run again evaluates its last step once more (the same numbers):
    # keep the first row of a step, whose time is the original one.
    if r["split"] != "eval" or acc_key is None or r["step"] in seen:
      continue
    seen.add(r["step"])
    pred = acc_key.split("_")[0]
    out.append(dict(step=r["step"], tokens=r["step"] * per_step,
                    minutes=(r["time"] - start) / 60, accuracy=r[acc_key],
                    unigram_accuracy=r.get("unigram_accuracy", float("nan")),
                    at_mask_accuracy=r.get(f"{pred}_at_mask_accuracy", float("nan")),
                    nats_below_unigram=r.get("unigram_loss", float("nan")) - r[f"{pred}_loss"]))
  return out


def curve_lines(curve: list[dict]) -> list[str]:
  lines = ["| step | tokens | minutes | masked-token accuracy | at [MASK] inputs | unigram "
           "baseline | nats below unigram |", "|---|---|---|---|---|---|---|"]
  for c in curve:
    lines.append(f"| {c['step']} | {c['tokens'] / 1e6:.2f}M | {c['minutes']:.1f} | "
                 f"{c['accuracy']:.1%} | {c['at_mask_accuracy']:.1%} | "
                 f"{c['unigram_accuracy']:.1%} | {c['nats_below_unigram']:.3f} |")
  hit = next((c for c in curve if c["accuracy"] >= TARGET_ACCURACY), None)
  lines += ["", f"{TARGET_ACCURACY:.0%} held-out accuracy: " + (
      f"reached at step {hit['step']} ({hit['tokens'] / 1e6:.2f}M tokens, "
      f"{hit['minutes']:.1f} min)." if hit else "not reached in this run.")]
  return lines


def plot_curve(curve: list[dict], path: pathlib.Path, title: str) -> None:
  """Held-out accuracy against tokens and against minutes, the unigram baseline and the 25%
  goal drawn in."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for ax, key, label in ((axes[0], "tokens", "training tokens (millions)"),
                         (axes[1], "minutes", "wall-clock minutes")):
    x = [c[key] / (1e6 if key == "tokens" else 1) for c in curve]
    ax.plot(x, [c["accuracy"] for c in curve], "o-", label="masked-token accuracy")
    ax.plot(x, [c["at_mask_accuracy"] for c in curve], "s--", label="at [MASK] inputs only")
    ax.plot(x, [c["unigram_accuracy"] for c in curve], ":", label="unigram baseline")
    ax.axhline(TARGET_ACCURACY, color="grey", lw=0.8, label=f"{TARGET_ACCURACY:.0%} goal")
    ax.set_xlabel(label)
    ax.set_ylabel("held-out accuracy")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _range(summary: dict, key: str) -> tuple[float, float, float] | None:
  s = summary.get(key)
  return None if s is None else (s["median"], s["min"], s["max"])


def report(pretrain_summary: dict, finetuned: dict[str, dict[str, dict]], seeds: int,
           curve: list[dict] | None = None) -> str:
  ev = pretrain_summary.get("final_eval") or {}
  lines = ["# Demo: pre-training, then fine-tuning", ""]
  minutes = (pretrain_summary.get("total_wall_s") or 0) / 60
  tokens = pretrain_summary.get("steps", 0) * pretrain_summary.get("tokens_per_step", 0)
  if "mlm_accuracy" in ev and "unigram_accuracy" in ev:
    lines += [
        f"Pre-training: {pretrain_summary['steps']} steps, {tokens / 1e6:.1f}M tokens, "
        f"{minutes:.1f} min. Held-out masked-token accuracy **{ev['mlm_accuracy']:.1%}** "
        f"(unigram baseline on the same positions {ev['unigram_accuracy']:.1%}); loss "
        f"{ev['mlm_loss']:.3f} nats, {ev['unigram_loss'] - ev['mlm_loss']:.3f} below the "
        f"unigram baseline's {ev['unigram_loss']:.3f} (corpus unigram entropy "
        f"{pretrain_summary.get('unigram_entropy') or float('nan'):.3f}).", ""]
  if curve:
    lines += ["Held-out evaluation during pre-training (curve.png plots it):", "",
              *curve_lines(curve), ""]
  for task, by_init in finetuned.items():
    metric = "test/accuracy"
    majority = _majority_rate(task)
    lines += [f"## {task}: test accuracy over {seeds} fine-tuning seeds", "",
              "| backbone | median | [min, max] |", "|---|---|---|"]
    for init, res in by_init.items():
      r = _range(res["summary"], metric)
      cell = "n/a" if r is None else f"{r[0]:.4f} | [{r[1]:.4f}, {r[2]:.4f}]"
      lines.append(f"| {INIT_LABELS.get(init, init)} | {cell} |")
    if majority is not None:
      lines.append(f"| majority class | {majority:.4f} | |")
    p = _range(by_init.get("pretrained", {}).get("summary", {}), metric)
    r = _range(by_init.get("random", {}).get("summary", {}), metric)
    if p and r:
      verdict = ("above: its worst seed beats random init's best" if p[1] > r[2] else
                 "overlapping: not separated from random init at this scale" if p[2] >= r[1]
                 else "below random init")
      lines += ["", f"Checkpoint vs random init: {verdict}."]
    lines.append("")
  return "\n".join(lines)


def _files(folder: pathlib.Path) -> list[str]:
  return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def export_lines(record: dict) -> list[str]:
  """results.md's section on the transformers export (export_checkpoint's record)."""
  lines = ["## The checkpoint in transformers", ""]
  if not record.get("exported"):
    return lines + [f"Not exported: {record.get('why', 'unknown')}", ""]
  if "error" in record:
    return lines + [f"`{record['folder']}` does not reproduce the run: {record['error']}", ""]
  classes = ", ".join(f"{h} (transformers.{a}.from_pretrained)"
                      for h, a in zip(record["hf_class"], record["auto_class"]))
  lines.append(f"`{record['folder']}`: {classes}.")
  checks = [l.removeprefix("export: ") for l in record.get("reload_check", [])]
  lines += ["", "; ".join(checks) + "." if checks else
            "Reload check not run (transformers and torch not installed)."]
  return lines + [""]


def export_checkpoint(pretrain_dir: pathlib.Path, workdir: pathlib.Path,
                      previous: dict | None) -> dict:
  """Step 3: the run's newest good checkpoint into <workdir>/hf through
  encoder_jax.convert.export.export_run, with its reload check where transformers and torch
  import. `previous` is the last run's record (results.json "export"): a folder holding exactly
  the files it lists is that export and is replaced; any other non-empty folder is kept.
  Returns this export's record (folder, files, class, reload check) for results.json."""
  from encoder_jax.convert import export  # pylint: disable=g-import-not-at-top
  out = workdir / "hf"
  say = lambda line: print(f"[3/3] {line}", flush=True)
  if out.exists() and any(out.iterdir()):
    if not previous or previous.get("files") != _files(out):
      say(f"left {out} as it is: it holds files the demo's last export did not write. Export "
          f"this run elsewhere: python -m encoder_jax.convert.export --workdir={pretrain_dir} "
          f"--out=<a new folder>")
      return {"exported": False, "why": f"{out} holds other files"}
    shutil.rmtree(out)
  checked = all(importlib.util.find_spec(m) for m in ("transformers", "torch"))
  lines: list[str] = []
  try:
    written = export.export_run(pretrain_dir, out, check=checked,
                                report=lambda line: (lines.append(line), say(line)))
  except export.NotRepresentable as e:
    say(f"no transformers export: {e}")
    return {"exported": False, "why": str(e)}
  except ValueError as e:  # the reload check: transformers computes something else
    say(f"reload check failed: {e}")
    return {"exported": True, "folder": str(out), "files": _files(out), "error": str(e)}
  record = {"exported": True, "folder": str(out), "files": _files(out),
            "hf_class": [w.hf_class for w in written],
            "auto_class": [w.auto_class for w in written],
            "reload_check": [l for l in lines if "reload check:" in l]}
  if not checked:
    say("reload check not run: transformers and torch are not installed here. Run it with "
        f"`bash run.sh python -m encoder_jax.convert.export --workdir={pretrain_dir} "
        f"--out={workdir / 'hf_checked'}` (run.sh installs both)")
  return record


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.curve_of:
    run = pathlib.Path(FLAGS.curve_of)
    if not (run / "metrics.jsonl").exists():
      raise app.UsageError(f"--curve_of={run}: no metrics.jsonl there; give a pre-training "
                           "workdir (e.g. runs/demo/pretrain).")
    curve = learning_curve(run)
    plot_curve(curve, run / "curve.png", str(run))
    print("\n".join(curve_lines(curve)) + f"\n{run / 'curve.png'}")
    return
  from encoder_jax.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  workdir = pathlib.Path(FLAGS.workdir).resolve()
  pretrain_dir = workdir / "pretrain"
  unknown = sorted(set(FLAGS.inits) - set(INIT_LABELS))
  if unknown:
    raise app.UsageError(f"--inits: unknown {unknown}; choose from {sorted(INIT_LABELS)}.")
  print(f"[1/3] pre-training into {pretrain_dir}", flush=True)
  summary = train_and_evaluate(FLAGS.config, str(pretrain_dir))
  summary["tokens_per_step"] = FLAGS.config.data.batch_size * FLAGS.config.data.max_length
  t_pretrained = time.time()
  finetuned = run_finetuning(FLAGS.tasks, FLAGS.inits, pretrain_dir, workdir, FLAGS.seeds,
                             FLAGS.finetune_workers)
  t_finetuned = time.time()
  curve = learning_curve(pretrain_dir)
  plot_curve(curve, workdir / "curve.png", f"demo recipe ({pretrain_dir})")
  text = report(summary, finetuned, FLAGS.seeds, curve)
  print("\n" + text + "\n", flush=True)
  previous = (json.loads((workdir / "results.json").read_text()).get("export")
              if (workdir / "results.json").exists() else None)
  exported = export_checkpoint(pretrain_dir, workdir, previous)
  text += "\n" + "\n".join(export_lines(exported))
  (workdir / "results.md").write_text(text + "\n")
  (workdir / "results.json").write_text(json.dumps(
      {"pretrain": summary, "finetune": {t: {i: r["summary"] for i, r in d.items()}
                                         for t, d in finetuned.items()},
       "export": exported}, indent=1, default=float) + "\n")
  if "error" in exported:
    raise ValueError(f"the export in {workdir / 'hf'} failed its reload check: "
                     f"{exported['error']}")
  print(f"demo finished in {(time.time() - t0) / 60:.1f} min (pre-training "
        f"{(t_pretrained - t0) / 60:.1f}, fine-tuning {(t_finetuned - t_pretrained) / 60:.1f}, "
        f"export {(time.time() - t_finetuned) / 60:.1f}); {workdir / 'results.md'}")


if __name__ == "__main__":
  # encoder_jax.cli.run: one-line errors, --help exits 0, library logs to a file, and XLA's
  # persistent compilation cache (the random-init fine-tuning jobs compile the same programs
  # as the checkpoint's, and a re-run compiles nothing), set before JAX is imported.
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  _define_flags()
  cli.run(main, "encoder_jax.demo")
