"""Starting a new pre-training run from existing parameters (`config.init_from`).

  --config.init_from=<pre-training workdir | one of its checkpoint step folders>
      every parameter of that run whose path and shape this run's model shares (encoder, MLM
      and NSP heads, ELECTRA's generator): BERT's phase 2 (configs/pretrain.py:...,phase=2),
      or a longer run from a shorter one;
  --config.init_from=<HF folder> | minilm
      the encoder (and BERT's pooler) of a HF BERT or ELECTRA checkpoint, e.g. continued
      pre-training of all-MiniLM-L6-v2 (which ships without an MLM head: that head starts
      fresh, its decoder tied to the loaded token embedding).

The optimizer state and the schedule start fresh (step 0); only parameters are taken. A workdir
that already holds checkpoints resumes from them instead (init_from only seeds a new run).
Refused, naming both sides: a source whose vocabulary differs from data.vocab, a parameter
whose shape differs (another size, vocab size or max_positions), a source none of whose
parameters fits.

Layering: reading HF folders is encoder_jax.convert's job (above train/), so the entry point
(encoder_jax.pretrain.pretrain) loads the source into a `Pretrained` and passes it in.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from etils import epath
import jax
import numpy as np
from flax import nnx, traverse_util

from encoder_jax.model import vocab_padding

# The most padding rows a vocabulary leaf can differ by (configs/pretrain.py pads to 128).
MAX_VOCAB_PADDING = 128


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """Parameters to start from, as host arrays in pure (nested dict) form."""
  source: str  # what the user named, for messages
  encoder: dict | None = None  # an Encoder's parameters (HF sources)
  pooler: dict | None = None  # BERT's pooler {'dense': ...}, when the source has one
  full: dict | None = None  # every parameter of an encoder_jax pre-training run
  vocab: str | None = None  # the vocab.txt the parameters were trained with, when known


# Where the encoder and the pooler sit in each pre-training model's parameters
# (encoder_jax.objectives.pretraining.build_model).
ENCODER_PATHS = {"mlm": (("bert", "encoder"), ("bert", "pooler")),
                 "electra": (("discriminator",), ("pooler",))}


def source_tree(pre: Pretrained, is_electra: bool) -> dict:
  """The source's parameters laid out as this run's model names them."""
  if pre.full is not None:
    return pre.full
  enc_at, pool_at = ENCODER_PATHS["electra" if is_electra else "mlm"]
  return traverse_util.unflatten_dict(
      {at: sub for at, sub in ((enc_at, pre.encoder), (pool_at, pre.pooler)) if sub is not None})


def merge(fresh: dict, source: dict, what: str) -> tuple[dict, list[str], list[str]]:
  """(fresh with every leaf the source has at the same path, paths taken, paths left fresh).

  A leaf at a shared path with another shape is an error naming both shapes."""
  # Keys as strings: Orbax restores list indices (unrolled blocks) as '0', nnx gives 0.
  src = {tuple(map(str, k)): v for k, v in traverse_util.flatten_dict(source).items()}
  taken, kept, clash = [], [], []

  def pick(path, leaf):
    key = tuple(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)
    name = "/".join(key)
    if key not in src:
      kept.append(name)
      return leaf
    value = _fit_vocab_padding(key, np.asarray(src[key]), leaf.shape)
    if value.shape != leaf.shape:
      clash.append(f"{name}: {value.shape} in {what}, {tuple(leaf.shape)} in this run")
      return leaf
    taken.append(name)
    return value.astype(leaf.dtype)

  merged = jax.tree_util.tree_map_with_path(pick, fresh)
  if clash:
    raise ValueError(f"init_from={what}: {len(clash)} parameter(s) differ in shape from this "
                     f"run's model: {'; '.join(clash[:4])}{' ...' if len(clash) > 4 else ''}. "
                     "Give the run the source's size, vocab (data.vocab) and max_positions, or "
                     "start from another checkpoint.")
  if not taken:
    raise ValueError(f"init_from={what}: none of its parameters ({len(src)}, e.g. "
                     f"{'/'.join(next(iter(src), ('?',)))}) is a parameter of this run's model "
                     "(e.g. an ELECTRA run's parameters for an MLM model?).")
  return merged, taken, kept


def _fit_vocab_padding(names: tuple[str, ...], value: np.ndarray, shape) -> np.ndarray:
  """A vocabulary leaf (token table, MLM bias) of a source written with another vocabulary
  padding (model.vocab_pad_multiple; e.g. a HF checkpoint's 30,522 rows into a run's 30,592)
  gets zero rows appended, or its all-zero padding rows cut; anything else is left to the
  shape check."""
  if not vocab_padding.is_vocab_leaf(names) or value.shape[1:] != tuple(shape[1:]):
    return value
  rows = shape[0]
  if value.shape[0] < rows and rows - value.shape[0] < MAX_VOCAB_PADDING:
    return np.pad(value, ((0, rows - value.shape[0]),) + ((0, 0),) * (value.ndim - 1))
  if value.shape[0] > rows and not np.any(value[rows:]):
    return value[:rows]
  return value


def check_vocab(run_vocab: str, pre: Pretrained) -> None:
  """The source's vocabulary must be the run's, token for token (ids index the embedding)."""
  if pre.vocab is None:
    return  # unknown: the embedding's shape check is all there is
  ours = epath.Path(run_vocab).read_text().split("\n")
  theirs = epath.Path(pre.vocab).read_text().split("\n")
  if [t.strip() for t in ours if t.strip()] != [t.strip() for t in theirs if t.strip()]:
    raise ValueError(f"init_from={pre.source} was trained with the vocab {pre.vocab}, this run "
                     f"tokenizes with {run_vocab} (data.vocab): token ids would index the wrong "
                     "embedding rows. Set data.vocab to the source's vocab.")


def apply(params: Any, pre: Pretrained, is_electra: bool, run_vocab: str,
          say: Callable[[str], None]) -> Any:
  """`params` (the fresh nnx.State, possibly sharded) with the source's values placed into the
  same shardings."""
  check_vocab(run_vocab, pre)
  fresh = nnx.to_pure_dict(params)
  merged, taken, kept = merge(fresh, source_tree(pre, is_electra), pre.source)
  flat_fresh = jax.tree.leaves(fresh)
  placed = jax.tree.unflatten(jax.tree.structure(fresh), [
      jax.device_put(m, f.sharding) if isinstance(m, np.ndarray) else f
      for m, f in zip(jax.tree.leaves(merged), flat_fresh)])
  out = jax.tree.map(lambda x: x, params)  # a new State; the fresh one stays as it was
  nnx.replace_by_pure_dict(out, placed)
  fresh_parts = sorted({k.split("/")[0] for k in kept})
  say(f"init_from {pre.source}: {len(taken)} parameter arrays taken, {len(kept)} left fresh"
      f"{' (' + ', '.join(fresh_parts) + ')' if kept else ''}; the optimizer and the schedule "
      "start at step 0")
  return out
