"""Task metrics on host numpy arrays: GLUE's (MCC, accuracy, F1, Pearson/Spearman), tagging
accuracy, and SQuAD v1.1 / v2.0 EM and F1 with the official answer normalisation.

Every function takes predictions and references as plain arrays or lists and returns floats
in [0, 1] (SQuAD: in [0, 100], as the official scripts print). They are checked against
scikit-learn / scipy and hand-worked official-SQuAD examples in tests/finetune/test_metrics.py.

Edge cases follow scikit-learn: MCC is 0 when a row or column of the confusion matrix is
empty, F1 is 0 when there is no positive prediction and no positive label; Pearson and
Spearman are 0 (not NaN) for a constant input, so a degenerate epoch ranks below any real one.
"""
from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np
import scipy.stats

from encoder_jax.objectives.masking import IGNORE_LABEL


def accuracy(pred_N, label_N) -> float:
  pred_N, label_N = np.asarray(pred_N), np.asarray(label_N)
  if pred_N.shape != label_N.shape:
    raise ValueError(f"predictions {pred_N.shape} and labels {label_N.shape} differ in shape.")
  return float(np.mean(pred_N == label_N)) if label_N.size else 0.0


def binary_f1(pred_N, label_N, positive: int = 1) -> float:
  """F1 of the positive class (GLUE's MRPC / QQP F1)."""
  p, y = np.asarray(pred_N) == positive, np.asarray(label_N) == positive
  tp, fp, fn = np.sum(p & y), np.sum(p & ~y), np.sum(~p & y)
  denom = 2 * tp + fp + fn
  return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(pred_N, label_N) -> float:
  """Multi-class MCC (Gorodkin's R_K, as scikit-learn); CoLA's metric."""
  pred_N, label_N = np.asarray(pred_N), np.asarray(label_N)
  classes = np.union1d(pred_N, label_N)
  c_KxK = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(c_KxK, (np.searchsorted(classes, label_N), np.searchsorted(classes, pred_N)), 1)
  t_K, p_K = c_KxK.sum(axis=1), c_KxK.sum(axis=0)  # true and predicted counts per class
  n, correct = c_KxK.sum(), np.trace(c_KxK)
  cov_yp = correct * n - t_K @ p_K
  cov_pp, cov_yy = n * n - p_K @ p_K, n * n - t_K @ t_K
  if cov_pp * cov_yy == 0:
    return 0.0
  return float(cov_yp / np.sqrt(cov_pp * cov_yy))


def pearson(x_N, y_N) -> float:
  x_N, y_N = np.asarray(x_N, np.float64), np.asarray(y_N, np.float64)
  x_N, y_N = x_N - x_N.mean(), y_N - y_N.mean()
  denom = np.sqrt((x_N @ x_N) * (y_N @ y_N))
  return float(x_N @ y_N / denom) if denom > 0 else 0.0


def spearman(x_N, y_N) -> float:
  """Pearson of average ranks (ties share their mean rank); 0 where a value is NaN."""
  return pearson(scipy.stats.rankdata(x_N), scipy.stats.rankdata(y_N))


def tagging_accuracy(pred_BxT, label_BxT, ignore: int = IGNORE_LABEL) -> float:
  """Accuracy over labelled positions only (first subtokens; -100 on the rest and on pads)."""
  label_BxT = np.asarray(label_BxT)
  keep = label_BxT != ignore
  return float(np.mean(np.asarray(pred_BxT)[keep] == label_BxT[keep])) if keep.any() else 0.0


# ------------------------------------------------------------------------------------ GLUE
# The nine GLUE tasks' metrics, as the GLUE leaderboard reports them. The first is the one used
# to pick the best epoch; `score` is the task's single number (mean of its metrics, as GLUE).
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"), "stsb": ("pearson", "spearman"), "mnli": ("accuracy",),
    "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",),
}


def classification_metrics(names: Sequence[str], pred_N, label_N) -> dict[str, float]:
  fns = {"accuracy": accuracy, "f1": binary_f1, "mcc": matthews_corrcoef,
         "pearson": pearson, "spearman": spearman}
  unknown = sorted(set(names) - set(fns))
  if unknown:
    raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(fns)}")
  out = {n: fns[n](pred_N, label_N) for n in names}
  out["score"] = float(np.mean([out[n] for n in names]))
  return out


# ----------------------------------------------------------------------------------- SQuAD
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """The official SQuAD normalisation: lower case, drop punctuation, drop the articles
  a/an/the, collapse whitespace (in that order)."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", s).split())


def squad_exact(gold: str, pred: str) -> float:
  return float(normalize_answer(gold) == normalize_answer(pred))


def squad_f1(gold: str, pred: str, version: str = "v2.0") -> float:
  """Bag-of-tokens F1 after normalisation.

  v2.0: if either side has no token, 1 when both are empty, else 0 (the no-answer case).
  v1.1: no such rule; no overlap is 0 (so an empty prediction scores 0 even against an
  empty gold answer, as the v1.1 script does).
  """
  gold_toks, pred_toks = normalize_answer(gold).split(), normalize_answer(pred).split()
  if version == "v2.0" and (not gold_toks or not pred_toks):
    return float(gold_toks == pred_toks)
  same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_toks), same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def squad_scores(golds: Mapping[str, Sequence[str]], preds: Mapping[str, str],
                 version: str = "v2.0") -> dict[str, float]:
  """EM and F1 (0-100) over questions, max over each question's gold answers.

  golds: question id -> gold answer texts ([] for an unanswerable v2.0 question).
  preds: question id -> predicted text ("" = no answer). A missing prediction is an error
  here (the official script only prints a warning and drops the question, which inflates
  scores).
  v2.0 also reports HasAns_* and NoAns_* over answerable and unanswerable questions; v1.1
  scores every gold answer as given (the v2.0 script first drops golds that normalise to "").
  """
  if version not in ("v1.1", "v2.0"):
    raise ValueError(f"SQuAD version={version!r}; use 'v1.1' or 'v2.0'.")
  missing = sorted(set(golds) - set(preds))
  if missing:
    raise ValueError(f"{len(missing)} question(s) have no prediction, e.g. {missing[:3]}; "
                     "predict '' for no answer.")
  exact, f1, has_ans = {}, {}, {}
  for qid, answers in golds.items():
    answers = list(answers)
    if version == "v2.0":
      answers = [a for a in answers if normalize_answer(a)] or [""]
    elif not answers:  # not in real v1.1 data; scored as an empty gold answer
      answers = [""]
    has_ans[qid] = answers != [""]
    exact[qid] = max(squad_exact(a, preds[qid]) for a in answers)
    f1[qid] = max(squad_f1(a, preds[qid], version) for a in answers)

  def mean(scores, ids):
    return 100.0 * float(np.mean([scores[q] for q in ids])) if ids else 0.0

  ids = list(golds)
  out = {"exact": mean(exact, ids), "f1": mean(f1, ids), "total": float(len(ids))}
  if version == "v2.0":
    for name, subset in (("HasAns", [q for q in ids if has_ans[q]]),
                         ("NoAns", [q for q in ids if not has_ans[q]])):
      if subset:
        out |= {f"{name}_exact": mean(exact, subset), f"{name}_f1": mean(f1, subset),
                f"{name}_total": float(len(subset))}
  return out


def summarize(values: Sequence[float]) -> dict[str, float]:
  """Median, mean, (population) std, min and max over seeds, with the count."""
  v = np.asarray(values, np.float64)
  if v.size == 0:
    nan = float("nan")
    return {"median": nan, "mean": nan, "std": nan, "min": nan, "max": nan, "n": 0}
  return {"median": float(np.median(v)), "mean": float(v.mean()), "std": float(v.std()),
          "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}
