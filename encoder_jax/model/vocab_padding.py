"""The vocabulary axis of a parameter tree with and without its padding rows.

ModelConfig.vocab_pad_multiple rounds the token table (and the MLM heads' output bias) up to
a multiple of 128 rows; the rows past vocab_size belong to no token. `unpad_vocab` strips them
(what an export to another library writes: HF's BERT has exactly vocab_size rows);
`pad_vocab` adds zero rows (a source written without padding, e.g. a HF checkpoint or an older
run, loaded into a padded model). Both take a nested dict or an nnx.State and return the same
kind; leaves off the vocabulary axis come back as they are.

The vocabulary leaves are found by path: `.../embeddings/token/embedding` (rows) and the
`bias` directly under an MLM head (`mlm`, `gen_mlm`, `disc_mlm`; BERT's `cls/predictions/
bias`). A head's transform bias (`mlm/transform/bias`) is not one of them.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MLM_HEADS = ("mlm", "gen_mlm", "disc_mlm")


def _names(path) -> tuple[str, ...]:
  out = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        out.append(str(getattr(k, attr)))
        break
  if out and out[-1] == "value":  # nnx.State leaves sit under `.value`
    out.pop()
  return tuple(out)


def is_vocab_leaf(names: tuple[str, ...]) -> bool:
  """True for the token table and the MLM heads' output bias (axis 0 is the vocabulary)."""
  return (names[-3:] == ("embeddings", "token", "embedding")
          or (len(names) >= 2 and names[-1] == "bias" and names[-2] in MLM_HEADS))


def _map_vocab(params: Any, fn) -> Any:
  def leaf(path, x):
    return fn(x) if hasattr(x, "shape") and is_vocab_leaf(_names(path)) else x
  return jax.tree_util.tree_map_with_path(leaf, params)


def unpad_vocab(params: Any, vocab_size: int) -> Any:
  """`params` with the vocabulary leaves cut to their first `vocab_size` rows."""
  def cut(x):
    if x.shape[0] < vocab_size:
      raise ValueError(f"a vocabulary leaf has {x.shape[0]} rows, fewer than vocab_size="
                       f"{vocab_size}; pass the tokenizer's vocabulary size.")
    return x[:vocab_size]
  return _map_vocab(params, cut)


def pad_vocab(params: Any, padded_rows: int) -> Any:
  """`params` with zero rows appended to the vocabulary leaves up to `padded_rows`."""
  def pad(x):
    if x.shape[0] > padded_rows:
      raise ValueError(f"a vocabulary leaf has {x.shape[0]} rows, more than the "
                       f"{padded_rows} to pad to.")
    xp = np if isinstance(x, np.ndarray) else jnp  # an export's numpy arrays stay numpy
    return xp.pad(x, ((0, padded_rows - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))
  return _map_vocab(params, pad)
