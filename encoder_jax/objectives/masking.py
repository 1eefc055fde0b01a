"""MLM corruption, run inside the jitted train step.

Why on device: drawing the mask inside `jax.jit` costs a few elementwise ops and a `top_k` per
batch, gives RoBERTa's dynamic masking for free (a new mask every time a row is seen), and is
exactly reproducible on resume because every draw is a pure function of a PRNG key. The trainer
passes `key = jax.random.fold_in(mask_seed_key, step)`; one key per batch is split into one key
per row, so a row's mask depends only on its key and its ids.

What `mask_tokens` does, per row (BERT's `create_masked_lm_predictions`, vectorised):
  * Count. n = min(max_predictions, num_maskable, max(1, round(rate * num_tokens))), where
    num_tokens defaults to num_maskable. Rounding is Python's `round` (half to even), the same as
    BERT's `int(round(len(tokens) * masked_lm_prob))` and ELECTRA's `tf.round`; the count is read
    from a table built on the host in float64, so it equals the Python formula bit for bit.
    BERT and ELECTRA apply the rate to *all* non-pad tokens including [CLS]/[SEP]
    (`len(tokens)`, `sum(input_mask)`); pass `num_tokens_B=attention_mask.sum(-1)` to reproduce
    that (it changes n by at most 1 at rate 0.15). A row with nothing maskable gets n = 0.
  * Choice. Exactly n distinct positions, uniformly among the maskable ones (top-k of uniform
    scores; ELECTRA samples with replacement, so it can choose fewer distinct positions). The
    caller's `maskable_BxT` is `attention_mask & ~is_special`, so [CLS]/[SEP]/pad are never chosen.
  * Whole-word masking (`word_starts_BxT` given): words are shuffled and taken whole while they
    fit the budget n, skipping a word that would overflow it and trying the next (BERT's loop),
    so a row may end with fewer than n predictions. A maskable token after a non-maskable one
    always starts a word, so a word never spans [SEP].
  * Corruption of each chosen token independently: [MASK] with probability `mask_frac`, a
    random token with probability `random_frac` (uniform over the vocabulary minus
    `special_ids`; it may equal the original, as in BERT), else unchanged.
    BERT: 0.8/0.1 (the default). ELECTRA: `mask_frac=0.85, random_frac=0.0`.

Static masking (BERT's offline `dupe_factor`): BERT wrote every example `dupe_factor` times
with different masks and trained ~40 epochs over them, so each mask is seen ~epochs/dupe_factor
times. To reproduce that on device, derive the row keys from the example's identity instead of
the step: `keys_B = static_mask_keys(mask_seed_key, example_ids_B, epochs_B,
dupe_factor=10)` and pass `keys_B` as `key` (a batch of keys is used row by row). A row's mask
is then a function of (example, epoch % dupe_factor) only, whatever the batch, row or step.
The trainer needs the data pipeline to deliver a stable example index and the epoch per row
(with a stream that cycles a dataset of N examples: example = i % N, epoch = i // N).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

IGNORE_LABEL = -100  # label at positions that carry no loss (PyTorch/HF convention)


class MaskedBatch(NamedTuple):
  """The corrupted batch and its targets; a pytree, so it can leave a jitted function."""

  ids_BxT: jax.Array  # corrupted input ids (same dtype as the input ids)
  positions_BxP: jax.Array  # int32 chosen positions, ascending; 0 in padded slots
  labels_BxP: jax.Array  # int32 original ids at the chosen positions; -100 in padded slots
  weights_BxP: jax.Array  # float32 1.0 at chosen slots, 0.0 in padded slots
  labels_BxT: jax.Array  # int32 original id where chosen, -100 elsewhere


@functools.lru_cache(maxsize=64)
def num_to_predict_table(seq_len: int, rate: float, max_predictions: int) -> np.ndarray:
  """table[k] = min(max_predictions, max(1, round(rate * k))) for k in 0..seq_len (host, float64).

  Built with Python's `round` so the device count equals the reference implementations' exactly;
  a float32 product on device could land on the other side of a .5 boundary.
  """
  return np.array([min(max_predictions, max(1, int(round(k * rate)))) for k in range(seq_len + 1)],
                  dtype=np.int32)


def random_non_special_ids(key: jax.Array, shape: tuple[int, ...], vocab_size: int,
                           special_ids: Sequence[int] = ()) -> jax.Array:
  """Uniform int32 ids over [0, vocab_size) minus `special_ids`."""
  return _non_special_ids_from_bits(jax.random.bits(key, shape, jnp.uint32), vocab_size,
                                    special_ids)


def _non_special_ids_from_bits(bits: jax.Array, vocab_size: int,
                               special_ids: Sequence[int]) -> jax.Array:
  """Maps uint32 random bits to non-special ids.

  Takes bits modulo (vocab_size - #specials) (bias < V / 2^32, ~1e-5 for BERT's vocab) and
  shifts past each special in ascending order: O(#specials) elementwise ops instead of a
  vocab-wide categorical.
  """
  specials = sorted({int(s) for s in special_ids if 0 <= int(s) < vocab_size})
  if len(specials) >= vocab_size:
    raise ValueError(f"special_ids cover the whole vocabulary (vocab_size={vocab_size}); "
                     "leave at least one id for random replacement.")
  ids = (bits % jnp.uint32(vocab_size - len(specials))).astype(jnp.int32)
  for s in specials:
    ids = ids + (ids >= s).astype(jnp.int32)
  return ids


def _uniform_from_bits(bits: jax.Array) -> jax.Array:
  """float32 in [0, 1) from uint32 bits (the mantissa trick jax.random.uniform uses)."""
  one_to_two = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32)
  return one_to_two - 1.0


def static_mask_keys(key: jax.Array, example_ids_B: jax.Array, epochs_B: jax.Array, *,
                     dupe_factor: int) -> jax.Array:
  """One key per row from (example id, epoch % dupe_factor): BERT's static masks, on device.

  Folding the example id first keeps different examples uncorrelated (folding only
  `example_index % dupe_factor` would hand every tenth example the same key).
  """
  if dupe_factor < 1:
    raise ValueError(f"dupe_factor={dupe_factor} must be >= 1 (BERT used 10).")
  copy_B = jnp.asarray(epochs_B, jnp.int32) % dupe_factor
  fold = lambda e, c: jax.random.fold_in(jax.random.fold_in(key, e), c)
  return jax.vmap(fold)(jnp.asarray(example_ids_B, jnp.int32), copy_B)


def _row_keys(key: jax.Array, batch: int) -> jax.Array:
  """A single key -> `batch` row keys; a batch of keys passes through (shape checked)."""
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  single = key.ndim == (0 if typed else 1)
  if single:
    return jax.random.split(key, batch)
  if key.shape[0] != batch:
    raise ValueError(f"key holds {key.shape[0]} row keys but the batch has {batch} rows; pass "
                     "one key (split per row) or exactly one key per row.")
  return key


def _whole_word_choice(u_BxT: jax.Array, maskable_BxT: jax.Array, word_starts_BxT: jax.Array,
                       n_B: jax.Array) -> jax.Array:
  """Chosen tokens (bool BxT): shuffled whole words, each taken if it still fits the budget."""
  B, T = maskable_BxT.shape
  prev_maskable_BxT = jnp.pad(maskable_BxT[:, :-1], ((0, 0), (1, 0)))
  start_BxT = maskable_BxT & (word_starts_BxT | ~prev_maskable_BxT)
  # Word index of every maskable token; non-maskable tokens go to the dump slot T.
  word_BxT = jnp.where(maskable_BxT, jnp.cumsum(start_BxT, axis=1, dtype=jnp.int32) - 1, T)
  seg_sum = functools.partial(jax.ops.segment_sum, num_segments=T + 1)
  word_len_BxW = jax.vmap(seg_sum)(maskable_BxT.astype(jnp.int32), word_BxT)[:, :T]
  num_words_B = start_BxT.sum(axis=1, dtype=jnp.int32)
  is_word_BxW = jnp.arange(T, dtype=jnp.int32)[None, :] < num_words_B[:, None]
  order_BxW = jnp.argsort(jnp.where(is_word_BxW, -u_BxT, 1.0), axis=1)  # real words first, shuffled
  len_sorted_BxW = jnp.take_along_axis(word_len_BxW, order_BxW, axis=1)

  def take_word(count_B, len_B):
    take_B = (len_B > 0) & (count_B + len_B <= n_B)
    return count_B + jnp.where(take_B, len_B, 0), take_B

  _, take_WxB = jax.lax.scan(take_word, jnp.zeros((B,), jnp.int32), len_sorted_BxW.T)
  rows_Bx1 = jnp.arange(B)[:, None]
  chosen_word_BxW = jnp.zeros((B, T + 1), bool).at[rows_Bx1, order_BxW].set(take_WxB.T)
  return maskable_BxT & jnp.take_along_axis(chosen_word_BxW, word_BxT, axis=1)


def mask_tokens(key: jax.Array, ids_BxT: jax.Array, maskable_BxT: jax.Array, *,
                vocab_size: int, mask_id: int, rate: float = 0.15, max_predictions: int = 20,
                mask_frac: float = 0.8, random_frac: float = 0.1,
                word_starts_BxT: jax.Array | None = None, special_ids: Sequence[int] = (),
                num_tokens_B: jax.Array | None = None) -> MaskedBatch:
  """Chooses and corrupts MLM positions (see the module docstring for the exact rules).

  Args:
    key: one PRNG key (split into one key per row) or a batch of B row keys (static masking).
    ids_BxT: integer token ids.
    maskable_BxT: bool, True where a token may be chosen (attention mask & not special).
    vocab_size, mask_id: vocabulary size and the [MASK] id.
    rate, max_predictions: fraction to predict and the cap P (the static width of the outputs).
    mask_frac, random_frac: shares of chosen tokens replaced by [MASK] / by a random token.
    word_starts_BxT: bool, True at the first sub-token of each word -> whole-word masking.
    special_ids: ids never drawn as random replacements ([PAD], [CLS], [SEP], [MASK], [UNK]).
    num_tokens_B: the count the rate applies to (default: the maskable count per row).

  Returns:
    A MaskedBatch; every shape is static (P = max_predictions).
  """
  if ids_BxT.ndim != 2 or maskable_BxT.shape != ids_BxT.shape:
    raise ValueError(f"ids_BxT {ids_BxT.shape} and maskable_BxT {maskable_BxT.shape} must be the "
                     "same [batch, seq] shape.")
  if not jnp.issubdtype(ids_BxT.dtype, jnp.integer):
    raise ValueError(f"ids_BxT has dtype {ids_BxT.dtype}; pass integer token ids.")
  B, T = ids_BxT.shape
  if not 1 <= max_predictions <= T:
    raise ValueError(f"max_predictions={max_predictions} must be in [1, seq_len={T}]; the "
                     "trainer's default is pretraining.default_max_predictions (20 at 128).")
  if not 0.0 < rate <= 1.0:
    raise ValueError(f"rate={rate} must be in (0, 1]; BERT and ELECTRA use 0.15.")
  if mask_frac < 0 or random_frac < 0 or mask_frac + random_frac > 1.0 + 1e-9:
    raise ValueError(f"mask_frac={mask_frac}, random_frac={random_frac} must be >= 0 and sum to "
                     "<= 1 (BERT 0.8/0.1, ELECTRA 0.85/0.0).")
  if not 0 <= mask_id < vocab_size:
    raise ValueError(f"mask_id={mask_id} is outside the vocabulary [0, {vocab_size}).")
  if word_starts_BxT is not None and word_starts_BxT.shape != ids_BxT.shape:
    raise ValueError(f"word_starts_BxT {word_starts_BxT.shape} must match ids_BxT {ids_BxT.shape}.")

  maskable_BxT = maskable_BxT.astype(bool)
  num_maskable_B = maskable_BxT.sum(axis=1, dtype=jnp.int32)
  base_B = num_maskable_B if num_tokens_B is None else jnp.asarray(num_tokens_B, jnp.int32)
  table = jnp.asarray(num_to_predict_table(T, float(rate), int(max_predictions)))
  n_B = jnp.minimum(table[jnp.clip(base_B, 0, T)], num_maskable_B)

  # One bits draw per row (three uses) keeps the threefry code, and the compile time, small.
  bits_Bx3xT = jax.vmap(lambda k: jax.random.bits(k, (3, T), jnp.uint32))(_row_keys(key, B))
  u_BxT, kind_BxT = _uniform_from_bits(bits_Bx3xT[:, 0]), _uniform_from_bits(bits_Bx3xT[:, 1])
  random_ids_BxT = _non_special_ids_from_bits(bits_Bx3xT[:, 2], vocab_size, special_ids)
  rows_Bx1 = jnp.arange(B)[:, None]

  if word_starts_BxT is None:
    _, top_BxP = jax.lax.top_k(jnp.where(maskable_BxT, u_BxT, -1.0), max_predictions)
    take_BxP = jnp.arange(max_predictions)[None, :] < n_B[:, None]
    chosen_BxT = jnp.zeros((B, T), bool).at[rows_Bx1, top_BxP].set(take_BxP)  # distinct indices
  else:
    chosen_BxT = _whole_word_choice(u_BxT, maskable_BxT, word_starts_BxT.astype(bool), n_B)

  # Chosen positions first in ascending order, then the others; at most P are chosen.
  t_1xT = jnp.arange(T, dtype=jnp.int32)[None, :]
  _, order_BxP = jax.lax.top_k(-jnp.where(chosen_BxT, t_1xT, T + t_1xT), max_predictions)
  valid_BxP = jnp.take_along_axis(chosen_BxT, order_BxP, axis=1)
  positions_BxP = jnp.where(valid_BxP, order_BxP, 0).astype(jnp.int32)

  is_mask_BxT = chosen_BxT & (kind_BxT < mask_frac)
  is_random_BxT = chosen_BxT & (kind_BxT >= mask_frac) & (kind_BxT < mask_frac + random_frac)
  corrupted_BxT = jnp.where(is_mask_BxT, mask_id,
                            jnp.where(is_random_BxT, random_ids_BxT, ids_BxT)).astype(ids_BxT.dtype)
  ids32_BxT = ids_BxT.astype(jnp.int32)
  labels_BxP = jnp.where(valid_BxP, jnp.take_along_axis(ids32_BxT, positions_BxP, axis=1),
                         IGNORE_LABEL)
  return MaskedBatch(
      ids_BxT=corrupted_BxT,
      positions_BxP=positions_BxP,
      labels_BxP=labels_BxP,
      weights_BxP=valid_BxP.astype(jnp.float32),
      labels_BxT=jnp.where(chosen_BxT, ids32_BxT, IGNORE_LABEL),
  )
