"""The fine-tuning model: an encoder + one task head, built from a loaded backbone.

  bb = encoder_jax.train.pretrained.load_backbone("ckpt:runs/x")   # or minilm, hf:<dir>
  model = build_model(bb, "classify", num_labels=2, pooling="cls", seed=0)

Where the encoder's parameters come from (a HF folder of any registered family, a pre-training
run) is encoder_jax.train.pretrained's business; a random encoder is a Backbone without
parameters (`Backbone(cfg, None, None, "random")`). A BERT pooler, when the source has one,
initialises the [CLS] classifier's pooler (as HF's BertForSequenceClassification does).

The head is initialised from the fine-tuning seed, so N seeds from one checkpoint differ in
head init, data order and dropout only.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from flax import nnx

from encoder_jax.train.pretrained import Backbone
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import fold_rng
from encoder_jax.model.encoder import Encoder
from encoder_jax.model.heads import ClassifierHead, SpanQaHead, TaggerHead


def make_head(cfg: ModelConfig, kind: str, num_labels: int, pooling: str, rngs: nnx.Rngs):
  if kind in ("classify", "regress"):  # regression: one output, read as the score
    return ClassifierHead(cfg, num_labels, pooling, rngs=rngs)
  if kind == "tag":
    return TaggerHead(cfg, num_labels, rngs=rngs)
  if kind == "span":
    return SpanQaHead(cfg, rngs=rngs)
  raise ValueError(f"task kind={kind!r}; use classify, regress, tag or span.")


class FinetuneModel(nnx.Module):
  """Encoder + one task head. `__call__(batch)` returns the head's fp32 outputs by name."""

  def __init__(self, cfg: ModelConfig, kind: str, num_labels: int, *, pooling: str = "cls",
               rngs: nnx.Rngs):
    self.cfg, self.kind = cfg, kind
    self.encoder = Encoder(cfg, rngs=rngs)
    self.head = make_head(cfg, kind, num_labels, pooling, rngs)

  def __call__(self, batch: dict[str, jax.Array], *, dropout_rng=None) -> dict[str, jax.Array]:
    out = self.encoder(batch["input_ids"], batch["mask"], batch.get("token_types"),
                       dropout_rng=fold_rng(dropout_rng, 0))
    h_BxTxD, mask_BxT = out.hidden_BxTxD, out.mask_BxT
    if self.kind in ("classify", "regress"):
      return {"logits": self.head(h_BxTxD, mask_BxT, dropout_rng=fold_rng(dropout_rng, 1))}
    if self.kind == "tag":
      return {"logits": self.head(h_BxTxD, dropout_rng=fold_rng(dropout_rng, 1))}
    start_BxT, end_BxT = self.head(h_BxTxD, mask_BxT)
    return {"start_logits": start_BxT, "end_logits": end_BxT}


# ------------------------------------------------------------------------------ building
def build_model(backbone: Backbone, kind: str, num_labels: int, *, pooling: str,
                seed: int) -> FinetuneModel:
  """The task model in eval mode: head (and a random encoder) from `seed`, the rest loaded.

  A loaded encoder is never randomly initialised first: the model is built abstractly
  (nnx.eval_shape) and filled, and only the head is initialised, by a jitted function cached
  per shape so N seeds compile it once. (On 2 CPU cores each truncated-normal initialiser
  costs ~0.5-2 s of XLA compilation when run eagerly.)
  """
  key = jax.random.key(seed)
  if backbone.encoder is None:
    model = _initializer(backbone.cfg, kind, num_labels, pooling, "model")(key)
  else:
    model = nnx.eval_shape(lambda: FinetuneModel(backbone.cfg, kind, num_labels,
                                                 pooling=pooling, rngs=nnx.Rngs(0)))
    model.head = _initializer(backbone.cfg, kind, num_labels, pooling, "head")(key)
    _load_into(model.encoder, backbone.encoder, "encoder")
  if (backbone.pooler is not None and kind in ("classify", "regress")
      and getattr(model.head, "pooler", None) is not None):
    _load_into(model.head.pooler, backbone.pooler, "pooler")
  model.eval()
  return model


@functools.lru_cache(maxsize=16)
def _initializer(cfg: ModelConfig, kind: str, num_labels: int, pooling: str, what: str):
  """jit(key -> a freshly initialised FinetuneModel, or just its head)."""
  if what == "model":
    return nnx.jit(lambda key: FinetuneModel(cfg, kind, num_labels, pooling=pooling,
                                             rngs=nnx.Rngs(key)))
  return nnx.jit(lambda key: make_head(cfg, kind, num_labels, pooling, nnx.Rngs(key)))


def _load_into(module: nnx.Module, pure: dict[str, Any], what: str) -> None:
  state = nnx.state(module, nnx.Param)
  target = nnx.to_pure_dict(state)

  def fill(t, s, path):
    if isinstance(t, dict):
      if not isinstance(s, dict):
        raise ValueError(f"{what}/{path}: checkpoint has a leaf where the model has a subtree")
      s_by_name = {str(k): v for k, v in s.items()}
      missing = sorted(str(k) for k in t if str(k) not in s_by_name)
      if missing:
        raise ValueError(f"{what}/{path}: the checkpoint lacks {missing}")
      return {k: fill(v, s_by_name[str(k)], f"{path}/{k}") for k, v in t.items()}
    if tuple(t.shape) != tuple(np.shape(s)):
      raise ValueError(f"{what}/{path}: checkpoint shape {np.shape(s)} != model shape "
                       f"{tuple(t.shape)}")
    # A fresh copy: on CPU a device array may alias the numpy buffer it came from, and the
    # train step donates (overwrites) it, which would corrupt the backbone for the next seed.
    return jax.numpy.array(np.array(s, copy=True), dtype=t.dtype)

  nnx.replace_by_pure_dict(state, fill(target, pure, ""))
  nnx.update(module, state)
