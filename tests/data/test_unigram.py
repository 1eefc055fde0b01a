"""The unigram baseline: counts, smoothed log-probabilities, entropy, and the trainer-side
score on masked targets (what a context-free MLM reaches)."""
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.data import unigram
from encoder_jax.objectives.mlm import unigram_baseline


def test_counts_stop_at_max_tokens_and_check_the_vocab():
  docs = [np.array([5, 5, 6]), np.array([7, 5]), np.array([6])]
  np.testing.assert_array_equal(unigram.counts_of(docs, 8), [0, 0, 0, 0, 0, 3, 2, 1])
  np.testing.assert_array_equal(unigram.counts_of(docs, 8, max_tokens=4), [0] * 5 + [2, 1, 1])
  with pytest.raises(ValueError, match="another vocab"):
    unigram.counts_of([np.array([9])], 8)


def test_log_probs_and_entropy_ignore_specials():
  counts = np.array([100, 50, 0, 3, 1], np.int64)  # ids 0, 1 are specials
  logp = unigram.unigram_log_probs(counts, special_ids=(0, 1))
  p = np.exp(logp[2:].astype(np.float64))
  np.testing.assert_allclose(p, np.array([1, 4, 2]) / 7, rtol=1e-6)  # add-one smoothed
  assert (logp[:2] < -1e8).all()
  q = np.array([3, 1]) / 4
  assert unigram.unigram_entropy(counts, (0, 1)) == pytest.approx(-(q * np.log(q)).sum())


def test_baseline_scores_exactly_the_weighted_targets():
  logp = jnp.log(jnp.array([0.0, 0.5, 0.3, 0.2]) + 1e-30)
  labels = jnp.array([[1, 2, -100], [3, 1, 2]])
  weights = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])  # (1, 1) is a padded slot
  got = unigram_baseline(logp, labels, weights)
  nll = -np.log([0.5, 0.3, 0.2, 0.3])
  assert float(got["unigram_loss"]) == pytest.approx(nll.mean(), rel=1e-6)
  assert float(got["unigram_accuracy"]) == pytest.approx(1 / 4)  # argmax is id 1
