"""Task heads on top of `EncoderOutput`, and masked pooling.

Every head takes the encoder's hidden states (and its mask where pads matter) and returns
logits in fp32, so losses and softmaxes never run in bf16. Hidden transforms (the MLM head's,
the pooler, the RTD head's first dense) follow ModelConfig.linear_bias and the MLM head's norm
ModelConfig.norm / norm_bias; the layers that output logits always keep their bias.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.model.activation_sharding import batch_split
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import Dropout
from encoder_jax.model.encoder import activation_fn, dense, layer_norm
from encoder_jax.model.matmul import bf16_dots, einsum

# Large negative for logits at excluded positions; finite so that an all-excluded row still has
# a defined softmax and no NaN gradients.
NEG_INF = -1e9


def masked_mean(hidden_BxTxD: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  """Mean over real tokens only: valid (2,0),(0,4) + a pad -> (1,2). Empty rows -> zeros."""
  m_BxTx1 = mask_BxT.astype(jnp.float32)[..., None]
  total_BxD = jnp.sum(hidden_BxTxD.astype(jnp.float32) * m_BxTx1, axis=1)
  return total_BxD / jnp.maximum(jnp.sum(m_BxTx1, axis=1), 1.0)


def pool(hidden_BxTxD, mask_BxT, kind: str = "cls", normalize: bool = False) -> jax.Array:
  """Sentence embedding: the [CLS] vector or the masked mean; optionally L2-normalised."""
  if kind == "cls":
    out_BxD = hidden_BxTxD[:, 0].astype(jnp.float32)
  elif kind == "mean":
    out_BxD = masked_mean(hidden_BxTxD, mask_BxT)
  else:
    raise ValueError(f"pool kind={kind!r}; use 'cls' or 'mean'.")
  if normalize:
    out_BxD = out_BxD / jnp.maximum(jnp.linalg.norm(out_BxD, axis=-1, keepdims=True), 1e-12)
  return out_BxD


def tied_logits(h_BxTxE: jax.Array, token_embed: nnx.Embed, cfg: ModelConfig) -> jax.Array:
  """fp32 logits over the vocabulary from a decoder tied to the token embedding
  (`token_embed.attend`), through the bf16 fp32-accumulating dot where the model's dots take
  it (encoder_jax.model.matmul.bf16_dots)."""
  if not bf16_dots(cfg.dot_dtype, cfg.compute_dtype, cfg.backend):
    return token_embed.attend(h_BxTxE).astype(jnp.float32)
  rows = "abcdfg"[:h_BxTxE.ndim - 1]
  return einsum(f"{rows}e,ve->{rows}v", h_BxTxE, token_embed.embedding[...], bf16=True,
                out_dtype=jnp.float32)


def gather_positions(x_BxTxD: jax.Array, positions_BxP: jax.Array) -> jax.Array:
  """x[b, positions[b, p]] -> [B, P, D] (sparse prediction: only the masked slots)."""
  return jnp.take_along_axis(x_BxTxD, positions_BxP[..., None], axis=1)


class MlmHead(nnx.Module):
  """BERT's MLM head: dense + GELU + LayerNorm, then a decoder tied to the token embedding.

  Pass `positions_BxP` to project only the gathered (masked) positions: the vocab projection
  is the most expensive matmul of a small model, and only ~15% of positions carry a label.
  The transform maps hidden_size -> embedding width (ELECTRA's generator head does the same).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.transform = dense(cfg, cfg.hidden_size, cfg.embed_size, ("embed_out", "embed"),
                           rngs=rngs)
    self.ln = layer_norm(cfg, cfg.embed_size, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((cfg.padded_vocab_size,), cfg.storage_dtype),
                          out_sharding=("vocab",), eager_sharding=False)
    self.act = cfg.activation
    self.cfg = cfg

  def __call__(self, hidden_BxTxD, token_embed: nnx.Embed, positions_BxP=None) -> jax.Array:
    if positions_BxP is not None:
      hidden_BxTxD = batch_split(gather_positions(hidden_BxTxD, positions_BxP))
    h = self.ln(activation_fn(self.act)(self.transform(hidden_BxTxD)))
    logits = batch_split(tied_logits(h, token_embed, self.cfg))
    logits = logits + self.bias[...].astype(jnp.float32).reshape((1,) * (logits.ndim - 1) + (-1,))
    return mask_padded_vocab(logits, self.cfg.vocab_size)


def mask_padded_vocab(logits_xV: jax.Array, vocab_size: int) -> jax.Array:
  """NEG_INF at the columns of padded ids (>= vocab_size; ModelConfig.vocab_pad_multiple), so
  they are never predicted or sampled: exp(NEG_INF - max) is exactly 0 in fp32, which leaves
  softmax, loss and accuracy over the real ids unchanged, and the columns pass no gradient."""
  if logits_xV.shape[-1] == vocab_size:
    return logits_xV
  real = jnp.arange(logits_xV.shape[-1]) < vocab_size
  return jnp.where(real, logits_xV, NEG_INF)


class Pooler(nnx.Module):
  """BERT's pooler: tanh(dense([CLS])). Feeds NSP/SOP and [CLS] classification."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dense = dense(cfg, cfg.hidden_size, cfg.hidden_size, ("embed", "embed_out"),
                       rngs=rngs)

  def __call__(self, hidden_BxTxD) -> jax.Array:
    return jnp.tanh(self.dense(hidden_BxTxD[:, 0]))


class NspHead(nnx.Module):
  """Next-sentence (or sentence-order) prediction: 2 classes from the pooled [CLS]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.out = dense(cfg, cfg.hidden_size, 2, ("embed", None), rngs=rngs, bias=True)

  def __call__(self, pooled_BxD) -> jax.Array:
    return self.out(pooled_BxD).astype(jnp.float32)


class RtdHead(nnx.Module):
  """ELECTRA's discriminator head: dense + GELU + dense -> one logit per token (replaced?)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.dense = dense(cfg, cfg.hidden_size, cfg.hidden_size, ("embed", "embed_out"),
                       rngs=rngs)
    self.out = dense(cfg, cfg.hidden_size, 1, ("embed_out", None), rngs=rngs, bias=True)
    self.act = cfg.activation

  def __call__(self, hidden_BxTxD) -> jax.Array:
    h = activation_fn(self.act)(self.dense(hidden_BxTxD))
    return self.out(h)[..., 0].astype(jnp.float32)


class ClassifierHead(nnx.Module):
  """Sequence classification from [CLS] (through the pooler) or the masked mean."""

  def __init__(self, cfg: ModelConfig, num_classes: int, pooling: str = "cls", *,
               rngs: nnx.Rngs):
    if pooling not in ("cls", "mean"):
      raise ValueError(f"ClassifierHead pooling={pooling!r}; use 'cls' or 'mean'.")
    self.pooling = pooling
    self.pooler = Pooler(cfg, rngs=rngs) if pooling == "cls" else None
    self.out = dense(cfg, cfg.hidden_size, num_classes, ("embed", None), rngs=rngs, bias=True)
    self.dropout = Dropout(cfg.hidden_dropout, deterministic=True)

  def __call__(self, hidden_BxTxD, mask_BxT, *, dropout_rng=None) -> jax.Array:
    pooled_BxD = (self.pooler(hidden_BxTxD) if self.pooling == "cls"
                  else masked_mean(hidden_BxTxD, mask_BxT))
    return self.out(self.dropout(pooled_BxD, rngs=dropout_rng)).astype(jnp.float32)


class TaggerHead(nnx.Module):
  """Token tagging: one distribution per token. Labels use -100 on pads and non-first
  subtokens, so the loss (encoder_jax.objectives) never reads those logits."""

  def __init__(self, cfg: ModelConfig, num_tags: int, *, rngs: nnx.Rngs):
    self.out = dense(cfg, cfg.hidden_size, num_tags, ("embed", None), rngs=rngs, bias=True)
    self.dropout = Dropout(cfg.hidden_dropout, deterministic=True)

  def __call__(self, hidden_BxTxD, *, dropout_rng=None) -> jax.Array:
    return self.out(self.dropout(hidden_BxTxD, rngs=dropout_rng)).astype(jnp.float32)


class SpanQaHead(nnx.Module):
  """Extractive QA: start and end logits per token; padding can never be an answer."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.out = dense(cfg, cfg.hidden_size, 2, ("embed", None), rngs=rngs, bias=True)

  def __call__(self, hidden_BxTxD, mask_BxT) -> tuple[jax.Array, jax.Array]:
    logits_BxTx2 = self.out(hidden_BxTxD).astype(jnp.float32)
    logits_BxTx2 = jnp.where(mask_BxT.astype(bool)[..., None], logits_BxTx2, NEG_INF)
    return logits_BxTx2[..., 0], logits_BxTx2[..., 1]
