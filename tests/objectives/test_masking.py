"""Properties of the on-device MLM corruption (issue 4, "Masking" must-shows)."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives import masking
from encoder_jax.objectives.masking import IGNORE_LABEL, mask_tokens

V = 1000
PAD, CLS, SEP, MASK, UNK = 0, 1, 2, 3, 4
SPECIALS = (PAD, CLS, SEP, MASK, UNK)


def make_batch(seed, B, T, min_len=3):  # numpy: jax.random eagerly compiles per op
  """[CLS] w w ... [SEP] pad pad: random lengths, ids drawn from the non-special range."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(len(SPECIALS), V, size=(B, T)).astype(np.int32)
  lengths = rng.integers(min_len, T + 1, size=B)
  valid = np.arange(T)[None, :] < lengths[:, None]
  ids[:, 0] = CLS
  ids[np.arange(B), lengths - 1] = SEP
  ids[~valid] = PAD
  maskable = valid & ~np.isin(ids, SPECIALS)
  return jnp.asarray(ids), jnp.asarray(maskable), valid


@functools.partial(jax.jit, static_argnames=("P", "mask_frac", "random_frac", "rate", "wwm"))
def run(key, ids, maskable, word_starts=None, *, P=20, mask_frac=0.8, random_frac=0.1,
        rate=0.15, wwm=False):
  return mask_tokens(key, ids, maskable, vocab_size=V, mask_id=MASK, rate=rate,
                     max_predictions=P, mask_frac=mask_frac, random_frac=random_frac,
                     word_starts_BxT=word_starts if wwm else None, special_ids=SPECIALS)


def python_count(num, rate, P):
  return min(P, max(1, int(round(num * rate)))) if num else 0


def test_count_is_exact_and_rounds_like_python():
  T, P = 64, 8
  # One row per maskable count 0..T-2 (row k: [CLS] + k maskable tokens + pads).
  B = T - 1
  ids = np.full((B, T), 7, np.int32)
  maskable = np.arange(T)[None, :] - 1 < np.arange(B)[:, None]
  maskable[:, 0] = False
  for rate in (0.15, 0.5):  # 0.5 * 5 = 2.5 -> 2 and 0.5 * 7 = 3.5 -> 4: half to even
    mb = run(jax.random.key(0), jnp.asarray(ids), jnp.asarray(maskable), P=P, rate=rate)
    got = np.asarray(mb.weights_BxP.sum(1)).astype(int)
    want = [python_count(int(m), rate, P) for m in maskable.sum(1)]
    np.testing.assert_array_equal(got, want, err_msg=f"rate={rate}")
    np.testing.assert_array_equal((np.asarray(mb.labels_BxT) != IGNORE_LABEL).sum(1), want)
    # Hand-computed rows (maskable count k -> n), independent of python_count: at least 1
    # when anything is maskable, ties to even (0.15 * 30 = 4.5 -> 4, 0.5 * 5 = 2.5 -> 2,
    # 0.5 * 7 = 3.5 -> 4), capped at P = 8.
    by_hand = {0.15: {0: 0, 1: 1, 3: 1, 10: 2, 30: 4, 50: 8, 60: 8},
               0.5: {1: 1, 3: 2, 5: 2, 7: 4, 10: 5, 30: 8}}[rate]
    assert {k: int(got[k]) for k in by_hand} == by_hand, rate


def test_num_tokens_override_counts_specials_like_bert():
  ids, maskable, valid = make_batch(1, 32, 128)
  f = jax.jit(lambda k, i, m, n: mask_tokens(k, i, m, vocab_size=V, mask_id=MASK,
                                             max_predictions=20, num_tokens_B=n))
  mb = f(jax.random.key(3), ids, maskable, jnp.asarray(valid.sum(1)))
  want = [min(python_count(int(n), 0.15, 20), int(m)) for n, m in
          zip(valid.sum(1), np.asarray(maskable).sum(1))]
  np.testing.assert_array_equal(np.asarray(mb.weights_BxP.sum(1)).astype(int), want)


# One batch shape and one set of static arguments across tests: each compile costs seconds.
BIG = dict(seed=4, B=512, T=128, min_len=128)


def test_specials_and_pads_never_chosen_and_minus_100_elsewhere():
  ids, maskable, _ = make_batch(2, 512, 128)
  for wwm in (False, True):
    starts = np.random.default_rng(9).random(ids.shape) < 0.7
    mb = run(jax.random.key(1), ids, maskable, starts, wwm=wwm)
    chosen = np.asarray(mb.labels_BxT) != IGNORE_LABEL
    assert not (chosen & ~np.asarray(maskable)).any()
    np.testing.assert_array_equal(np.asarray(mb.labels_BxT)[chosen], np.asarray(ids)[chosen])
    assert (np.asarray(mb.labels_BxT)[~chosen] == IGNORE_LABEL).all()
    # Untouched outside the chosen set; specials and pads keep their ids.
    np.testing.assert_array_equal(np.asarray(mb.ids_BxT)[~chosen], np.asarray(ids)[~chosen])
    # Sparse view == dense view: ascending positions, -100 and weight 0 in padded slots.
    pos, lab, w = map(np.asarray, (mb.positions_BxP, mb.labels_BxP, mb.weights_BxP))
    for b in range(ids.shape[0]):
      n = int(w[b].sum())
      np.testing.assert_array_equal(pos[b, :n], np.flatnonzero(chosen[b]))
      np.testing.assert_array_equal(lab[b, :n], np.asarray(ids)[b, pos[b, :n]])
      assert (w[b, :n] == 1).all() and (w[b, n:] == 0).all()
      assert (lab[b, n:] == IGNORE_LABEL).all() and (pos[b, n:] == 0).all()


def test_chosen_rate_is_15_percent():
  ids, maskable, _ = make_batch(**BIG)  # 126 maskable per row: n = 19 < P = 20
  mb = run(jax.random.key(2), ids, maskable)
  rate = float(mb.weights_BxP.sum() / np.asarray(maskable).sum())
  assert abs(rate - 0.15) < 0.005, rate


@pytest.mark.parametrize("mask_frac,random_frac", [(0.8, 0.1), (0.85, 0.0)])
def test_corruption_split_within_tolerance(mask_frac, random_frac):
  ids, maskable, _ = make_batch(**BIG)
  mb = run(jax.random.key(5), ids, maskable, mask_frac=mask_frac, random_frac=random_frac)
  chosen = np.asarray(mb.labels_BxT) != IGNORE_LABEL
  new, old = np.asarray(mb.ids_BxT)[chosen], np.asarray(ids)[chosen]
  n = chosen.sum()  # ~10k chosen tokens: binomial std of a share ~ 0.004
  frac_mask = (new == MASK).mean()
  frac_random = ((new != MASK) & (new != old)).mean()
  frac_kept = (new == old).mean()
  assert n > 9000
  assert abs(frac_mask - mask_frac) < 0.02, frac_mask
  assert abs(frac_random - random_frac) < 0.015, frac_random  # random == original: 1/V, ~0
  assert abs(frac_kept - (1 - mask_frac - random_frac)) < 0.015, frac_kept
  assert not np.isin(new[(new != MASK) & (new != old)], SPECIALS).any()


def test_random_ids_uniform_over_non_special_vocab():
  specials = (0, 3, 9)
  draws = np.asarray(masking.random_non_special_ids(jax.random.key(0), (70_000,), 10, specials))
  counts = np.bincount(draws, minlength=10)
  assert (counts[list(specials)] == 0).all()
  share = counts[[i for i in range(10) if i not in specials]] / draws.size
  np.testing.assert_allclose(share, 1 / 7, atol=0.01)


def word_ids(starts, maskable):
  """Python reference: word index per maskable token (a token after a non-maskable one starts)."""
  out, w = np.full(starts.shape, -1), -1
  for t in range(starts.shape[0]):
    if maskable[t]:
      if starts[t] or t == 0 or not maskable[t - 1]:
        w += 1
      out[t] = w
  return out


def test_whole_word_masking_takes_whole_words_greedily():
  ids, maskable, _ = make_batch(5, 64, 64, min_len=10)
  starts = np.random.default_rng(4).random(ids.shape) < 0.4  # words of ~2.5 tokens
  mb = run(jax.random.key(6), ids, maskable, starts, P=12, wwm=True)
  chosen = np.asarray(mb.labels_BxT) != IGNORE_LABEL
  m, s = np.asarray(maskable), np.asarray(starts)
  for b in range(ids.shape[0]):
    wid = word_ids(s[b], m[b])
    n = python_count(int(m[b].sum()), 0.15, 12)
    count = int(chosen[b].sum())
    assert count <= n
    lengths = np.bincount(wid[wid >= 0])
    picked = np.zeros(lengths.size, bool)
    for w in range(lengths.size):
      members = chosen[b][wid == w]
      assert members.all() or not members.any(), f"row {b}: word {w} split"
      picked[w] = members.all()
    # BERT's loop stops only when no remaining word fits the budget.
    assert (lengths[~picked] > n - count).all(), f"row {b}: a word still fit"


def test_deterministic_per_key_and_traced_once():
  ids, maskable, _ = make_batch(6, 8, 32)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step_mask(key):
    return mask_tokens(key, ids, maskable, vocab_size=V, mask_id=MASK, max_predictions=5)

  a = step_mask(jax.random.fold_in(jax.random.key(0), 1))
  b = step_mask(jax.random.fold_in(jax.random.key(0), 1))
  c = step_mask(jax.random.fold_in(jax.random.key(0), 2))
  chex.assert_trees_all_equal(a, b)
  assert not np.array_equal(a.positions_BxP, c.positions_BxP)


def test_static_masks_depend_on_example_and_copy_only():
  ids, maskable, _ = make_batch(7, 4, 64, min_len=64)
  seed = jax.random.key(42)
  static_keys = jax.jit(masking.static_mask_keys, static_argnames="dupe_factor")
  f = jax.jit(lambda keys, i, m: mask_tokens(keys, i, m, vocab_size=V, mask_id=MASK,
                                             max_predictions=10))
  keys = static_keys(seed, jnp.arange(4), jnp.zeros(4, jnp.int32), dupe_factor=3)
  base = f(keys, ids, maskable)
  # Same examples in reversed rows, epoch 3 (== copy 0): the same mask per example.
  perm = jnp.arange(4)[::-1]
  keys_r = static_keys(seed, perm, jnp.full(4, 3), dupe_factor=3)
  again = f(keys_r, ids[perm], maskable[perm])
  np.testing.assert_array_equal(np.asarray(again.positions_BxP),
                                np.asarray(base.positions_BxP)[::-1])
  np.testing.assert_array_equal(np.asarray(again.ids_BxT), np.asarray(base.ids_BxT)[::-1])
  # The next epoch (copy 1) is a different mask.
  keys_1 = static_keys(seed, jnp.arange(4), jnp.ones(4, jnp.int32), dupe_factor=3)
  assert not np.array_equal(f(keys_1, ids, maskable).positions_BxP, base.positions_BxP)


def test_bad_arguments_name_the_fix():
  ids, maskable, _ = make_batch(8, 2, 16)
  kw = dict(vocab_size=V, mask_id=MASK, max_predictions=4)
  with pytest.raises(ValueError, match="max_predictions=17"):
    mask_tokens(jax.random.key(0), ids, maskable, **{**kw, "max_predictions": 17})
  with pytest.raises(ValueError, match="mask_frac=0.9"):
    mask_tokens(jax.random.key(0), ids, maskable, mask_frac=0.9, random_frac=0.2, **kw)
  with pytest.raises(ValueError, match="row keys"):
    mask_tokens(jax.random.split(jax.random.key(0), 3), ids, maskable, **kw)
  with pytest.raises(ValueError, match="dupe_factor"):
    masking.static_mask_keys(jax.random.key(0), jnp.arange(2), jnp.arange(2), dupe_factor=0)
