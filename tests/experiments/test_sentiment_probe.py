"""experiments/sentiment_probe.py: the ridge probe and the paired bootstrap (synthetic data)."""
import numpy as np

from experiments import sentiment_probe as sp


def _split(rng, n, w, noise):
  x = rng.normal(size=(n, w.size))
  return x, (x @ w + noise * rng.normal(size=n) > 0).astype(np.int64)


def test_ridge_probe_learns_a_linear_rule_and_not_noise():
  rng = np.random.default_rng(0)
  w = rng.normal(size=16)
  r = sp.ridge_probe(_split(rng, 800, w, 0.1), _split(rng, 300, w, 0.1), _split(rng, 500, w, 0.1))
  assert r["test_accuracy"] > 0.95 and r["lambda"] in sp.LAMBDAS
  assert r["test_correct"].shape == (500,) and r["test_correct"].mean() == r["test_accuracy"]
  # labels independent of the features: chance
  x = rng.normal(size=(1600, 16))
  y = rng.integers(0, 2, size=1600)
  r = sp.ridge_probe((x[:800], y[:800]), (x[800:1100], y[800:1100]), (x[1100:], y[1100:]))
  assert 0.4 < r["test_accuracy"] < 0.6


def test_ridge_probe_standardises_with_train_statistics_only():
  """A feature scaled by 1e6 (and shifted) on every split must not change the predictions."""
  rng = np.random.default_rng(1)
  w = rng.normal(size=8)
  tr, va, te = (_split(rng, n, w, 0.5) for n in (400, 200, 300))
  base = sp.ridge_probe(tr, va, te)
  scale = lambda s: (s[0] * np.r_[1e6, np.ones(7)] + 5.0, s[1])
  moved = sp.ridge_probe(scale(tr), scale(va), scale(te))
  assert moved["test_accuracy"] == base["test_accuracy"] and moved["lambda"] == base["lambda"]


def test_bootstrap_is_paired_over_the_same_test_items():
  rng = np.random.default_rng(2)
  a = rng.random(1000) < 0.75
  same = sp.bootstrap({"pretrained": a, "random": a.copy()}, 2000)
  assert same["pretrained_minus_random"] == [0.0, 0.0] and same["p_gain_le_0"] == 1.0
  # one item in twenty flipped from wrong to right: a gain of ~the flipped share, never negative
  b = a.copy()
  flip = np.flatnonzero(~a)[::5]
  b[flip] = True
  ci = sp.bootstrap({"pretrained": b, "random": a}, 2000)
  lo, hi = ci["pretrained_minus_random"]
  assert 0 < lo <= len(flip) / 1000 <= hi and ci["p_gain_le_0"] == 0.0
  assert ci["pretrained"][0] < b.mean() < ci["pretrained"][1]


def test_cv_probe_scores_every_item_once_out_of_fold():
  rng = np.random.default_rng(3)
  w = rng.normal(size=8)
  x, y = _split(rng, 1000, w, 0.3)
  correct = sp.cv_probe(x, y, 1.0, folds=5)
  assert correct.shape == (1000,) and 0.85 < correct.mean() < 1.0
  # a rule that only memorises cannot score: labels shuffled against the features give chance
  assert 0.4 < sp.cv_probe(x, rng.permutation(y), 1.0, folds=5).mean() < 0.6
