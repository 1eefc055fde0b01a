"""Metric functions agree with scikit-learn / scipy and with the official SQuAD scoring rules.

The SQuAD cases are worked by hand from the official v1.1 / v2.0 evaluation scripts'
definitions (normalise: lower case, strip punctuation, drop a/an/the, collapse whitespace;
F1 over the bag of normalised tokens; max over gold answers; v2.0 no-answer = "").
"""
import numpy as np
import pytest
import scipy.stats
from sklearn import metrics as skm

from encoder_jax.finetune import metrics as M


@pytest.fixture(scope="module")
def cases():
  rng = np.random.default_rng(0)
  out = []
  for n, k in ((50, 2), (200, 3), (7, 2)):
    y, p = rng.integers(0, k, n), rng.integers(0, k, n)
    p[: n // 2] = y[: n // 2]  # correlated, so MCC and F1 are not ~0
    out.append((y, p))
  return out


def test_classification_metrics_match_sklearn(cases):
  for y, p in cases:
    assert M.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p), abs=1e-12)
    assert M.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, p), abs=1e-12)
    if y.max() <= 1:
      assert M.binary_f1(p, y) == pytest.approx(skm.f1_score(y, p), abs=1e-12)


def test_degenerate_cases_follow_sklearn():
  y = np.array([0, 0, 0, 0])
  p = np.array([0, 0, 0, 0])
  assert M.matthews_corrcoef(p, y) == skm.matthews_corrcoef(y, p) == 0.0
  assert M.binary_f1(p, y) == skm.f1_score(y, p, zero_division=0.0) == 0.0
  assert M.matthews_corrcoef(1 - y, y) == skm.matthews_corrcoef(y, 1 - y)


def test_correlations_match_scipy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=100)
  y = 0.5 * x + rng.normal(size=100)
  y_ties = np.round(y)  # STS-B style ties
  assert M.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-12)
  assert M.spearman(x, y_ties) == pytest.approx(scipy.stats.spearmanr(x, y_ties)[0], abs=1e-12)
  assert M.pearson(x, np.ones(100)) == 0.0  # constant prediction: 0, not NaN
  # Worked by hand: ranks (1, 2, 3, 4) against tied ranks (1.5, 1.5, 3.5, 3.5) -> 2/sqrt(5).
  assert M.spearman([1, 2, 3, 4], [7, 7, 9, 9]) == pytest.approx(2 / np.sqrt(5), abs=1e-12)
  assert M.spearman([1, 2, np.nan], [1, 2, 3]) == 0.0


def test_glue_metric_table():
  assert set(M.GLUE_METRICS) == {"cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte",
                                 "wnli"}
  out = M.classification_metrics(("f1", "accuracy"), [1, 0, 1, 1], [1, 0, 0, 1])
  assert out["accuracy"] == 0.75 and out["f1"] == pytest.approx(0.8)
  assert out["score"] == pytest.approx(0.775)


def test_tagging_accuracy_ignores_minus_100():
  labels = np.array([[-100, 3, -100, 1, -100], [-100, 2, 2, -100, -100]])
  pred = np.array([[9, 3, 9, 0, 9], [9, 2, 5, 9, 9]])
  assert M.tagging_accuracy(pred, labels) == 0.5


def test_squad_normalisation():
  assert M.normalize_answer("The  Denver Broncos!") == "denver broncos"
  assert M.normalize_answer("an apple, a pear") == "apple pear"
  assert M.normalize_answer("theater") == "theater"  # articles only as whole words


def test_squad_scores_by_hand():
  golds = {
      "q1": ["Denver Broncos", "The Denver Broncos"],
      "q2": ["Santa Clara, California"],
      "q3": ["February 7, 2016"],
      "q4": [],  # unanswerable (v2.0)
      "q5": [],
  }
  preds = {"q1": "the denver broncos.", "q2": "Santa Clara", "q3": "7 February", "q4": "",
           "q5": "Levi's Stadium"}
  # q1: exact after normalisation. q2: P=2/2, R=2/3 -> F1=0.8. q3: tokens {7, february} of
  # {february, 7, 2016}: P=1, R=2/3 -> 0.8. q4: "" vs no answer -> 1/1. q5: wrong -> 0/0.
  out = M.squad_scores(golds, preds, "v2.0")
  assert out["exact"] == pytest.approx(100 * 2 / 5)
  assert out["f1"] == pytest.approx(100 * (1 + 0.8 + 0.8 + 1 + 0) / 5)
  assert out["HasAns_exact"] == pytest.approx(100 / 3)
  assert out["HasAns_f1"] == pytest.approx(100 * 2.6 / 3)
  assert out["NoAns_exact"] == out["NoAns_f1"] == 50.0
  assert out["total"] == 5 and out["HasAns_total"] == 3 and out["NoAns_total"] == 2


def test_squad_v1_rules_differ_on_empty_strings():
  # v1.1's F1 has no no-answer rule: an empty prediction scores 0 F1 (EM still compares
  # normalised strings); v2.0 gives 1 when both sides are empty.
  assert M.squad_f1("", "", "v1.1") == 0.0 and M.squad_f1("", "", "v2.0") == 1.0
  assert M.squad_f1("a", "the", "v2.0") == 1.0  # both normalise to "" -> agree
  out = M.squad_scores({"q": ["Broncos of Denver", "x"]}, {"q": "Denver Broncos"}, "v1.1")
  assert out["exact"] == 0.0 and out["f1"] == pytest.approx(100 * 0.8)
  with pytest.raises(ValueError, match="no prediction"):
    M.squad_scores({"q": ["a"]}, {}, "v1.1")


def test_summarize():
  s = M.summarize([0.8, 0.9, 0.7, 1.0])
  assert s == {"median": pytest.approx(0.85), "mean": pytest.approx(0.85),
               "std": pytest.approx(np.std([0.8, 0.9, 0.7, 1.0])), "min": 0.7, "max": 1.0,
               "n": 4}
