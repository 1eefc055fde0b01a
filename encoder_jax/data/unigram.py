"""The unigram baseline of a tokenized corpus: what an MLM that ignores context can reach.

Early MLM training predicts every masked token from its frequency alone (Chang & Bergen, TACL
2022): the "unigram plateau". A run has learned language only once its eval loss is below the
cross-entropy of the unigram distribution on the same masked positions, and its accuracy above
the unigram argmax's. The trainer scores both baselines on exactly the positions it evaluates
(`encoder_jax.objectives.mlm.unigram_baseline`), so the comparison needs no assumption about
how positions were chosen.

  counts = row_counts(shards.ShardedRows(...), V)    # int64 [V] over the rows' real tokens
  logp_V = unigram_log_probs(counts, special_ids)    # float32 [V], add-one smoothed
  unigram_entropy(counts, special_ids)               # nats, of the train distribution itself
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def counts_of(ids_iter: Iterable[np.ndarray], vocab_size: int,
              max_tokens: int | None = None) -> np.ndarray:
  """Token counts over the id arrays of `ids_iter`, stopping once `max_tokens` are counted."""
  counts = np.zeros(vocab_size, np.int64)
  seen = 0
  for ids in ids_iter:
    ids = np.asarray(ids, np.int64)
    if max_tokens is not None:
      ids = ids[:max(0, max_tokens - seen)]
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
      raise ValueError(f"token ids in [{ids.min()}, {ids.max()}] fall outside the vocabulary "
                       f"[0, {vocab_size}); the corpus was tokenized with another vocab.")
    counts += np.bincount(ids, minlength=vocab_size)
    seen += ids.size
    if max_tokens is not None and seen >= max_tokens:
      break
  return counts


# (rows' content_key, vocab size, max_tokens) -> counts, for the rows of built shards.
_COUNTED: dict[tuple, np.ndarray] = {}


def row_counts(rows, vocab_size: int, max_tokens: int | None = 50_000_000) -> np.ndarray:
  """Counts over the real tokens of the rows of built shards (shards.ShardedRows), specials
  included; past `max_tokens`, over evenly spaced rows.

  Counted once per process for each `rows.content_key` (built shards never change once their
  index is written, and their folder's name hashes what they hold): the points of a grid run
  in one process (experiments.run --in_process) share their corpus's count instead of reading
  it again (1.4 s a point on the demo corpus, up to 50M tokens' reading on a large one)."""
  key = (rows.content_key, vocab_size, max_tokens)
  if key not in _COUNTED:
    n = len(rows)
    n_read = n if max_tokens is None else min(n, -(-max_tokens // rows.max_length))
    order = np.linspace(0, n - 1, n_read).round().astype(np.int64)
    _COUNTED[key] = counts_of((rows.real_ids(order[i:i + 4096])
                               for i in range(0, len(order), 4096)), vocab_size, max_tokens)
  return _COUNTED[key].copy()


def _kept(counts: np.ndarray, special_ids: Sequence[int]) -> np.ndarray:
  keep = np.ones(len(counts), bool)
  keep[[s for s in special_ids if 0 <= s < len(counts)]] = False
  return keep


def unigram_log_probs(counts: np.ndarray, special_ids: Sequence[int] = ()) -> np.ndarray:
  """log p(token) with add-one smoothing over the non-special ids; specials get -inf-like
  mass (they are never MLM targets). float32 [V]."""
  keep = _kept(counts, special_ids)
  c = np.where(keep, counts.astype(np.float64) + 1.0, 0.0)
  with np.errstate(divide="ignore"):
    logp = np.log(c / c.sum())
  return np.where(keep, logp, -1e9).astype(np.float32)


def unigram_entropy(counts: np.ndarray, special_ids: Sequence[int] = ()) -> float:
  """Entropy (nats) of the empirical unigram distribution over non-special tokens."""
  c = np.where(_kept(counts, special_ids), counts, 0).astype(np.float64)
  p = c[c > 0] / c.sum()
  return float(-(p * np.log(p)).sum())
