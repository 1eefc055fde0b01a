r"""A linear probe of frozen sentence embeddings: does the demo checkpoint carry sentiment that a
random encoder of its shape does not, without fine-tuning noise?

  bash run.sh python -m experiments.sentiment_probe --pretrain_dir=runs/demo/pretrain

The main job fine-tunes each backbone with 3 seeds, and on sentiment the checkpoint's gain over
a random init (~1 point) is the size of the seeds' spread, so the two overlap on some hosts.
This probe removes the seeds: each backbone's encoder stays frozen (`freeze_encoder`), its
masked-mean embeddings of the task's train, validation and test snippets are exported (the
fine-tuning command's `export_embeddings`), and a ridge classifier (closed form, +-1 targets,
features standardised on train, the penalty chosen on validation) is fitted on train and
scored on test. The comparison is paired: the same test snippets for every backbone, with a
bootstrap over them (--resamples, seed 0) for the 95% interval of each accuracy and of the
checkpoint's gain over random init.

Ridge is written here in numpy (a few lines of linear algebra, deterministic) rather than
taken from scikit-learn, which is not a dependency of this project.

A second score pools train, validation and test and cross-validates the same probe over all of
them (--cv_folds, at the penalty validation chose), so the interval is set by ~13,000 snippets
rather than the test split's ~1,350. Exported embeddings are reused from --workdir when its run
recorded exactly the same config.

Writes --out: results.md, results.json and provenance.json (commit, command, flags, host).
"""
from __future__ import annotations

import json
import pathlib
import time

from absl import app, flags
import numpy as np

from experiments import provenance

INITS = ("pretrained", "random", "minilm")
LAMBDAS = tuple(10.0 ** k for k in np.arange(-2.0, 4.01, 0.5))


def define_flags() -> None:
  flags.DEFINE_string("pretrain_dir", None, "A demo pre-training workdir (with checkpoints/), "
                      "e.g. runs/demo/pretrain.")
  flags.DEFINE_string("task", "rotten_tomatoes", "The demo task to probe (a classification).")
  flags.DEFINE_list("inits", list(INITS), "Backbones: pretrained (the checkpoint), random (a "
                    "random init of its shape), minilm (all-MiniLM-L6-v2).")
  flags.DEFINE_integer("max_train_examples", 0, "Train snippets for the probe (0: the task's "
                       "whole train split; the main job fine-tunes on 4,000).")
  flags.DEFINE_integer("resamples", 10000, "Bootstrap resamples of the test snippets.")
  flags.DEFINE_integer("cv_folds", 10, "Folds of the second probe: cross-validated over train, "
                       "validation and test pooled, at each backbone's penalty (0: off).")
  flags.DEFINE_string("workdir", "runs/sentiment_probe", "Where the embeddings are exported.")
  flags.DEFINE_string("out", "experiments/results/sentiment_probe", "Report directory.")


def ridge_probe(train, val, test, lambdas=LAMBDAS) -> dict:
  """(X, y) triples -> the test predictions of the ridge classifier whose penalty scored best on
  validation. Features standardised with train's mean and std; the bias is not penalised."""
  (xtr, ytr), (xva, yva), (xte, yte) = train, val, test
  mu, sd = xtr.mean(0), xtr.std(0) + 1e-6
  prep = lambda x: np.concatenate([(x - mu) / sd, np.ones((len(x), 1))], 1).astype(np.float64)
  a, b, c = prep(xtr), prep(xva), prep(xte)
  t = np.where(ytr > 0, 1.0, -1.0)
  gram, rhs = a.T @ a, a.T @ t
  best = None
  for lam in lambdas:
    reg = lam * np.eye(a.shape[1])
    reg[-1, -1] = 0.0
    w = np.linalg.solve(gram + reg, rhs)
    acc = float(np.mean((b @ w > 0) == (yva > 0)))
    if best is None or acc > best[0]:
      best = (acc, lam, w)
  acc_val, lam, w = best
  pred = (c @ w > 0).astype(np.int64)
  return {"lambda": lam, "val_accuracy": acc_val, "test_correct": pred == (yte > 0),
          "test_accuracy": float(np.mean(pred == (yte > 0)))}


def cv_probe(x: np.ndarray, y: np.ndarray, lam: float, folds: int, seed: int = 0) -> np.ndarray:
  """Out-of-fold correctness of every snippet under a `folds`-fold cross-validated ridge at
  penalty `lam` (standardised on each fold's training part): a score over all labelled snippets,
  not only the test split's, for a tighter interval."""
  order = np.random.default_rng(seed).permutation(len(y))
  correct = np.zeros(len(y), bool)
  for k in range(folds):
    held = order[k::folds]
    fit = np.setdiff1d(order, held)
    r = ridge_probe((x[fit], y[fit]), (x[held], y[held]), (x[held], y[held]), lambdas=(lam,))
    correct[held] = r["test_correct"]
  return correct


def bootstrap(correct: dict[str, np.ndarray], resamples: int, seed: int = 0) -> dict:
  """95% intervals of each backbone's test accuracy and of pretrained - random, resampling the
  same test snippets for all (paired)."""
  rng = np.random.default_rng(seed)
  n = len(next(iter(correct.values())))
  idx = rng.integers(0, n, size=(resamples, n))
  accs = {k: v[idx].mean(1) for k, v in correct.items()}
  out = {k: [float(np.percentile(a, 2.5)), float(np.percentile(a, 97.5))]
         for k, a in accs.items()}
  if "pretrained" in accs and "random" in accs:
    d = accs["pretrained"] - accs["random"]
    out["pretrained_minus_random"] = [float(np.percentile(d, 2.5)),
                                      float(np.percentile(d, 97.5))]
    out["p_gain_le_0"] = float(np.mean(d <= 0))
  return out


def export(init: str, pretrain_dir: pathlib.Path, workdir: pathlib.Path, task: str,
           max_train: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """The backbone's frozen masked-mean embeddings of train / validation / test."""
  from encoder_jax.finetune import jobs
  from encoder_jax.finetune.run import finetune_and_evaluate
  config = jobs.job_config(task, init, pretrain_dir, seeds=1)
  with config.unlocked():
    config.update(dict(freeze_encoder=True, epochs=1, export_embeddings="train,validation,test",
                       export_pooling="mean", max_train_examples=max_train,
                       max_eval_examples=0))
  jdir = workdir / f"{task}_{init}"
  stems = [jdir / "embeddings" / f"{task}_{split}_mean" for split in ("train", "validation",
                                                                    "test")]
  # Exported before with exactly this config (the run's results.json records it): reuse.
  if not (jobs.finished(config, jdir) and all(pathlib.Path(f"{s}.npy").exists() for s in stems)):
    finetune_and_evaluate(config, str(jdir))
  out = {}
  for split in ("train", "validation", "test"):
    stem = jdir / "embeddings" / f"{task}_{split}_mean"
    out[split] = (np.load(f"{stem}.npy"), np.load(f"{stem}_labels.npy"))
  return out


def main(argv):
  del argv
  provenance.pin_git_state()  # the code this process runs is the tree's now
  f = flags.FLAGS
  if not f.pretrain_dir or not (pathlib.Path(f.pretrain_dir) / "checkpoints").is_dir():
    raise app.UsageError(f"--pretrain_dir={f.pretrain_dir}: give a demo pre-training workdir "
                         "with checkpoints/ (e.g. runs/demo/pretrain after `bash run.sh demo`).")
  for init in f.inits:
    if init not in INITS:
      raise app.UsageError(f"--inits: {init!r}; choose from {INITS}.")
  out, workdir = pathlib.Path(f.out), pathlib.Path(f.workdir)
  out.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  probes, correct, cv_correct = {}, {}, {}
  for init in f.inits:
    emb = export(init, pathlib.Path(f.pretrain_dir), workdir, f.task, f.max_train_examples)
    r = ridge_probe(emb["train"], emb["validation"], emb["test"])
    correct[init] = r.pop("test_correct")
    if f.cv_folds:
      x = np.concatenate([emb[s][0] for s in ("train", "validation", "test")])
      y = np.concatenate([emb[s][1] for s in ("train", "validation", "test")])
      cv_correct[init] = cv_probe(x, y, r["lambda"], f.cv_folds)
      r["cv_accuracy"] = float(cv_correct[init].mean())
    probes[init] = dict(r, train=len(emb["train"][1]), test=len(emb["test"][1]),
                        dim=int(emb["train"][0].shape[1]))
    print(f"{init}: test accuracy {r['test_accuracy']:.4f} (validation {r['val_accuracy']:.4f}, "
          f"ridge lambda {r['lambda']:g})  [{(time.time() - t0) / 60:.1f} min]", flush=True)
  ci = bootstrap(correct, f.resamples)
  cv_ci = bootstrap(cv_correct, f.resamples) if cv_correct else {}
  n_test = len(next(iter(correct.values())))
  lines = [f"### Linear probe of frozen masked-mean embeddings: {f.task}", "",
           f"Ridge classifier on {probes[f.inits[0]]['train']:,} train snippets, penalty chosen "
           f"on validation, scored on all {n_test:,} test snippets; 95% intervals from "
           f"{f.resamples:,} paired bootstrap resamples of the test snippets.", "",
           "| backbone | test accuracy | 95% interval | validation accuracy | ridge lambda |",
           "|---|---|---|---|---|"]
  for init in f.inits:
    p = probes[init]
    lines.append(f"| {init} | {p['test_accuracy']:.4f} | [{ci[init][0]:.4f}, {ci[init][1]:.4f}] "
                 f"| {p['val_accuracy']:.4f} | {p['lambda']:g} |")
  if "pretrained_minus_random" in ci:
    lo, hi = ci["pretrained_minus_random"]
    gain = probes["pretrained"]["test_accuracy"] - probes["random"]["test_accuracy"]
    lines += ["", f"Checkpoint minus random init: {gain:+.4f}, 95% interval [{lo:+.4f}, "
              f"{hi:+.4f}] (share of resamples with no gain: {ci['p_gain_le_0']:.4f})."]
  if cv_correct:
    n_all = len(next(iter(cv_correct.values())))
    lines += ["", f"The same probe {f.cv_folds}-fold cross-validated over all {n_all:,} labelled "
              "snippets (train, validation and test pooled; each backbone's penalty as above; "
              "paired bootstrap over the snippets):", "",
              "| backbone | cross-validated accuracy | 95% interval |", "|---|---|---|"]
    for init in f.inits:
      lines.append(f"| {init} | {probes[init]['cv_accuracy']:.4f} | [{cv_ci[init][0]:.4f}, "
                   f"{cv_ci[init][1]:.4f}] |")
    if "pretrained_minus_random" in cv_ci:
      lo, hi = cv_ci["pretrained_minus_random"]
      gain = probes["pretrained"]["cv_accuracy"] - probes["random"]["cv_accuracy"]
      lines += ["", f"Checkpoint minus random init, cross-validated: {gain:+.4f}, 95% interval "
                f"[{lo:+.4f}, {hi:+.4f}] (share of resamples with no gain: "
                f"{cv_ci['p_gain_le_0']:.4f})."]
  (out / "results.json").write_text(json.dumps({"probes": probes, "bootstrap": ci,
                                                "cv_bootstrap": cv_ci}, indent=1))
  provenance.record_tool(out, "experiments.sentiment_probe",
                         {k: f[k].value for k in ("pretrain_dir", "task", "inits",
                                                  "max_train_examples", "resamples", "cv_folds")},
                         (time.time() - t0) / 60)
  lines = [provenance.produced_by(provenance.read(out)), ""] + lines  # its commit first
  (out / "results.md").write_text("\n".join(lines) + "\n")
  print((out / "results.md").read_text())


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  define_flags()
  cli.run(main, "experiments.sentiment_probe")
