"""Starting a new pre-training run from existing parameters (`config.init_from`).

  --config.init_from=<pre-training workdir | one of its checkpoint step folders>
      every parameter of that run whose path and shape this run's model shares (encoder, MLM
      and NSP heads, ELECTRA's generator): BERT's phase 2 (configs/pretrain.py:...,phase=2),
      or a longer run from a shorter one;
  --config.init_from=<HF folder> | minilm
      the encoder (and BERT's pooler) of a HF folder of any family encoder_jax.hf reads
      (BERT, RoBERTa, ELECTRA, ModernBERT), and an MLM run's heads where the folder has them
      (RobertaForMaskedLM, BertForPreTraining): continued pre-training of RoBERTa with its own
      LM head, or of all-MiniLM-L6-v2 (which ships without an MLM head: that head starts
      fresh, its decoder tied to the loaded token embedding).

The optimizer state and the schedule start fresh (step 0); only parameters are taken. A workdir
that already holds checkpoints resumes from them instead (init_from only seeds a new run).
Refused, naming both sides: a source whose vocabulary differs from data.vocab, a parameter
whose shape differs (another size, vocab size or max_positions), a source none of whose
parameters fits.

The trainer loads the source itself (`load`, when a new run starts: loop.start_state), through
train/pretrained.py, the one loader of an encoder's parameters: HF folders are read by
encoder_jax.hf, below the trainer, and runs by run_dir.py.
"""
from __future__ import annotations

from typing import Any, Callable

from etils import epath
import jax
import numpy as np
from flax import nnx, traverse_util

from encoder_jax import hf
from encoder_jax.train import pretrained
from encoder_jax.train.pretrained import Backbone
from encoder_jax.model import vocab_padding

# The most padding rows a vocabulary leaf can differ by (configs/pretrain.py pads to 128).
MAX_VOCAB_PADDING = 128


def load(spec: str, cache_dir=None) -> Backbone:
  """config.init_from -> its parameters: 'minilm', a HF folder (config.json with a model_type:
  its encoder, pooler and MLM head where it has them), or a pre-training workdir / checkpoint
  step folder (local or gs://: every parameter)."""
  source = spec if spec == "minilm" else f"hf:{spec}" if hf.model_type(spec) else f"ckpt:{spec}"
  return pretrained.load_backbone(source, cache_dir=cache_dir)


# Where the encoder and the pooler sit in each pre-training model's parameters
# (encoder_jax.objectives.pretraining.build_model).
ENCODER_PATHS = {"mlm": (("bert", "encoder"), ("bert", "pooler")),
                 "electra": (("discriminator",), ("pooler",))}


def source_tree(pre: Backbone, is_electra: bool) -> dict:
  """The source's parameters laid out as this run's model names them."""
  if pre.params is not None:  # a run's: every parameter
    return pre.params
  enc_at, pool_at = ENCODER_PATHS["electra" if is_electra else "mlm"]
  tree = traverse_util.unflatten_dict(
      {at: sub for at, sub in ((enc_at, pre.encoder), (pool_at, pre.pooler)) if sub is not None})
  # An ELECTRA run's heads are other modules (generator, RTD): a HF MLM head has no place there.
  return {**tree, **(pre.heads or {})} if not is_electra else tree


def match_layers(source: Any, fresh: Any) -> Any:
  """`source` with each encoder's `blocks` in `fresh`'s layout: scanned (one [L, ...] array
  per parameter) or unrolled (one subtree per layer; model.scan_layers). A run on a CPU
  (unrolled) then starts from a TPU run's checkpoint or a HF folder read scanned, and back."""
  if not isinstance(source, dict) or not isinstance(fresh, dict):
    return source
  by_name = {str(k): v for k, v in fresh.items()}
  out = {}
  for key, sub in source.items():
    like = by_name.get(str(key))
    if str(key) == "blocks" and isinstance(sub, dict) and isinstance(like, dict):
      sub = _blocks_like(sub, like)
    out[key] = match_layers(sub, like)
  return out


def _unrolled(blocks: dict) -> bool:
  return all(str(k).isdigit() for k in blocks)


def _blocks_like(src: dict, like: dict) -> dict:
  if _unrolled(src) and not _unrolled(like):
    layers = [src[k] for k in sorted(src, key=int)]
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layers)
  if not _unrolled(src) and _unrolled(like):
    n = len(jax.tree.leaves(src)[0])
    return {i: jax.tree.map(lambda x, i=i: np.asarray(x)[i], src) for i in range(n)}
  return src


def merge(fresh: dict, source: dict, what: str) -> tuple[dict, list[str], list[str]]:
  """(fresh with every leaf the source has at the same path, paths taken, paths left fresh).

  A leaf at a shared path with another shape is an error naming both shapes."""
  source = match_layers(source, fresh)
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


def check_vocab(run_vocab: str, pre: Backbone) -> None:
  """The source's vocabulary must be the run's, token for token (ids index the embedding)."""
  if pre.vocab is None:
    return  # unknown: the embedding's shape check is all there is
  ours = epath.Path(run_vocab).read_text().split("\n")
  theirs = epath.Path(pre.vocab).read_text().split("\n")
  if [t.strip() for t in ours if t.strip()] != [t.strip() for t in theirs if t.strip()]:
    raise ValueError(f"init_from={pre.source} was trained with the vocab {pre.vocab}, this run "
                     f"tokenizes with {run_vocab} (data.vocab): token ids would index the wrong "
                     "embedding rows. Set data.vocab to the source's vocab.")


def apply(params: Any, pre: Backbone, is_electra: bool, run_vocab: str,
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
