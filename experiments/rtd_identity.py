r"""How much of an ELECTRA run's replaced-token detection the token identity alone solves.

  bash run.sh python -m experiments.rtd_identity \
      --run_dir="experiments/runs/electra_vs_mlm/objective=electra,seed=0/pretrain"

Re-evaluates a finished ELECTRA pre-training run (a copy of it: the run itself is not touched)
on --eval_steps held-out batches, recording every discriminator input token and its label
(replaced / original). From those it scores three detectors, all in nats per token, on the
same tokens as the run's RTD loss:

  prior      predicts the replaced share p everywhere: H(p), the plateau of the grids' reports
  identity   predicts P(replaced | token id), estimated on one half of the batches and scored
             on the other (both ways, averaged; add-`--smoothing` pseudo-counts pulled toward
             p): the best a discriminator can do without reading any context
  trained    the run's discriminator (its held-out RTD loss)

When the generator's samples follow the corpus's unigram distribution, a sampled token is as
frequent among replacements as among originals, identity says nothing (identity ~ prior) and a
discriminator has to learn context from one bit a token before its loss can move; a generator
far from unigram (an untrained one, or sampling at a high temperature) makes rare tokens give
replacements away (identity << prior). The grids' reports call an RTD run "stalled" above 0.95
of its prior (experiments/report.py).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

from absl import app, flags
import numpy as np

from experiments.report import binary_entropy

_RUN_DIR = flags.DEFINE_string("run_dir", None, "A finished ELECTRA pre-training workdir (the "
                               "folder with config.json and checkpoints/); read, never written.")
_EVAL_STEPS = flags.DEFINE_integer("eval_steps", 256, "Held-out batches to score (the grid's "
                                   "final evaluation used 64; more give steadier identity "
                                   "estimates over an 8k vocabulary).")
_SMOOTHING = flags.DEFINE_float("smoothing", 2.0, "Pseudo-counts per token id, at the replaced "
                                "share, added to the identity estimate's counts.")


def identity_loss(ids: np.ndarray, labels: np.ndarray, fold: np.ndarray, vocab_size: int,
                  smoothing: float) -> float:
  """Held-out BCE (nats a token) of P(replaced | id), fitted on fold 0 and scored on fold 1
  and the other way round, weighted by the tokens of each fold."""
  total, count = 0.0, 0
  for fit in (0, 1):
    a, b = fold == fit, fold != fit
    share = labels[a].mean()
    pos = np.bincount(ids[a], weights=labels[a], minlength=vocab_size)
    n = np.bincount(ids[a], minlength=vocab_size)
    p_V = (pos + smoothing * share) / (n + smoothing)
    p = np.clip(p_V[ids[b]], 1e-7, 1 - 1e-7)
    y = labels[b]
    total += float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).sum())
    count += int(b.sum())
  return total / count


def measure(run_dir: pathlib.Path, eval_steps: int, smoothing: float) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from encoder_jax.objectives import electra as electra_obj  # pylint: disable=g-import-not-at-top
  from encoder_jax.train import loop  # pylint: disable=g-import-not-at-top

  config = ml_collections.ConfigDict(json.loads((run_dir / "config.json").read_text()))
  if not config.objective.objective.startswith("electra"):
    raise app.UsageError(f"--run_dir={run_dir}: objective {config.objective.objective!r}; "
                         "this measures ELECTRA's replaced-token detection (electra, "
                         "electra_15).")
  config.train.eval_steps = eval_steps
  batches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
  real = electra_obj.main_targets

  def recording(variant, inputs, valid_BxT):
    labels_BxT, weights_BxT = real(variant, inputs, valid_BxT)
    jax.debug.callback(lambda *a: batches.append(tuple(np.asarray(x) for x in a)),
                       inputs.ids_BxT, labels_BxT, weights_BxT)
    return labels_BxT, weights_BxT

  electra_obj.main_targets = recording
  try:
    with tempfile.TemporaryDirectory() as tmp:
      copy = pathlib.Path(tmp) / "run"
      # Without its summary.json, the finished run is evaluated again (the trainer returns a
      # finished run's recorded summary untouched otherwise).
      shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tensorboard",
                                                                   "summary.json"))
      summary = loop.train_and_evaluate(config, str(copy))
  finally:
    electra_obj.main_targets = real
  if len(batches) != eval_steps:
    raise RuntimeError(f"recorded {len(batches)} batches, expected {eval_steps}: the run's "
                       "final evaluation did not run once per batch.")
  ids, labels, fold = [], [], []
  for i, (ids_BxT, labels_BxT, w_BxT) in enumerate(batches):
    keep = w_BxT > 0
    ids.append(ids_BxT[keep].astype(np.int64))
    labels.append(labels_BxT[keep].astype(np.float64))
    fold.append(np.full(int(keep.sum()), i % 2))
  ids, labels, fold = np.concatenate(ids), np.concatenate(labels), np.concatenate(fold)
  vocab_size = int(max(ids.max() + 1, 1))
  share = float(labels.mean())
  prior = binary_entropy(share)
  ident = identity_loss(ids, labels, fold, vocab_size, smoothing)
  trained = float(summary["final_eval"]["disc_loss"])
  return dict(run_dir=str(run_dir), steps=summary["steps"], tokens=int(ids.size),
              replaced_share=share, prior=prior, identity=ident, trained=trained,
              identity_vs_prior=ident / prior, trained_vs_prior=trained / prior)


def main(argv):
  del argv
  if not _RUN_DIR.value:
    raise app.UsageError("--run_dir is required: a finished ELECTRA pre-training workdir.")
  run_dir = pathlib.Path(_RUN_DIR.value)
  if not (run_dir / "config.json").exists():
    raise app.UsageError(f"--run_dir={run_dir}: no config.json there; give the pre-training "
                         "workdir (e.g. experiments/runs/electra_vs_mlm/<point>/pretrain).")
  r = measure(run_dir, _EVAL_STEPS.value, _SMOOTHING.value)
  print(f"{r['run_dir']}: step {r['steps']}, {r['tokens']:,} held-out tokens, replaced share "
        f"{r['replaced_share']:.4f}")
  print("| detector | held-out BCE (nats/token) | / prior |\n|---|---|---|")
  for name in ("prior", "identity", "trained"):
    print(f"| {name} | {r[name]:.4f} | {r[name] / r['prior']:.3f} |")
  print(json.dumps(r))


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "experiments.rtd_identity")
