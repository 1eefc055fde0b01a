"""Bidirectional multi-head self-attention with key-padding and packed-segment masks.

Shapes in names: B batch, T query length, S key length, D hidden, N heads, H head dim.
Masks are boolean, True = may attend.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import Dropout


def init_normal(cfg: ModelConfig):
  # BERT initialises every weight matrix with a truncated normal of std initializer_range.
  return nnx.initializers.truncated_normal(stddev=cfg.initializer_range)


def make_attention_mask(mask_BxT: jax.Array,
                        segment_ids_BxT: jax.Array | None = None) -> jax.Array:
  """Boolean [B, 1, T, T] mask: key j is visible to query i.

  Keys that are padding (mask False) are never visible. With packed rows, `segment_ids_BxT`
  (1..k for the k examples packed in a row, 0 for padding) also restricts every query to keys
  of its own example, so packed examples cannot see each other. There is no causal part: the
  encoder is bidirectional.
  """
  mask_BxT = mask_BxT.astype(bool)
  keys_Bx1x1xS = mask_BxT[:, None, None, :]
  if segment_ids_BxT is None:
    return jnp.broadcast_to(keys_Bx1x1xS, (mask_BxT.shape[0], 1, mask_BxT.shape[1],
                                          mask_BxT.shape[1]))
  same_Bx1xTxS = segment_ids_BxT[:, None, :, None] == segment_ids_BxT[:, None, None, :]
  return same_Bx1xTxS & keys_Bx1x1xS


def alibi_slopes(num_heads: int) -> jax.Array:
  """ALiBi's per-head slopes (Press et al. 2022): 2^(-8k/n) for k = 1..n, n = num_heads
  rounded up to a power of two, the odd heads interleaved as in the paper's code."""
  def pow2(n):
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
  p = 1 << (num_heads - 1).bit_length()
  slopes = pow2(p) if p == num_heads else pow2(p // 2) + pow2(p)[0::2][:num_heads - p // 2]
  return jnp.asarray(slopes[:num_heads], jnp.float32)


def alibi_bias(positions_BxT: jax.Array, num_heads: int) -> jax.Array:
  """[B, N, T, T] float32: -slope_n * |pos_i - pos_j| (symmetric: the encoder is bidirectional).

  Distances come from position ids, so packed examples (positions restarting at 0) get their
  own distances; attention across packed examples is masked anyway.
  """
  pos_BxT = positions_BxT.astype(jnp.float32)
  dist_Bx1xTxS = jnp.abs(pos_BxT[:, None, :, None] - pos_BxT[:, None, None, :])
  return -alibi_slopes(num_heads)[None, :, None, None] * dist_Bx1xTxS


class MultiHeadAttention(nnx.Module):
  """Fused-QKV self-attention; softmax in fp32; fully masked query rows output zeros.

  The QKV projection is one [D, 3, N, H] kernel (one matmul instead of three) sharded on the
  'heads' axis for tensor parallelism; the HF converter splits/stacks BERT's query/key/value.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    init = init_normal(cfg)
    pdt = cfg.storage_dtype
    # Logical axis names are metadata only; the trainer maps them to a mesh (no eager sharding).
    self.qkv_kernel = nnx.Param(init(rngs.params(), (d, 3, n, h), pdt),
                                out_sharding=("embed", None, "heads", "kv"),
                                eager_sharding=False)
    self.qkv_bias = nnx.Param(jnp.zeros((3, n, h), pdt), out_sharding=(None, "heads", "kv"),
                             eager_sharding=False)
    self.out_kernel = nnx.Param(init(rngs.params(), (n, h, d), pdt),
                                out_sharding=("heads", "kv", "embed"),
                                eager_sharding=False)
    self.out_bias = nnx.Param(jnp.zeros((d,), pdt), out_sharding=("embed",), eager_sharding=False)
    self.dropout = Dropout(cfg.attention_dropout, deterministic=True)
    self.dtype = cfg.compute_dtype
    self.attention_impl = cfg.attention_impl

  def __call__(self, x_BxTxD: jax.Array, mask_Bx1xTxS: jax.Array, *,
               dropout_rng: jax.Array | None = None,
               bias_BxNxTxS: jax.Array | None = None) -> jax.Array:
    dt = self.dtype
    x_BxTxD = x_BxTxD.astype(dt)
    qkv_BxTx3xNxH = (jnp.einsum("btd,dcnh->btcnh", x_BxTxD, self.qkv_kernel[...].astype(dt))
                     + self.qkv_bias[...].astype(dt)[None, None])
    q_BxTxNxH, k_BxSxNxH, v_BxSxNxH = (qkv_BxTx3xNxH[:, :, i] for i in range(3))
    if self.dropout.deterministic or self.dropout.rate == 0.0:
      # jax.nn.dot_product_attention: XLA's attention (softmax in fp32) unless cuDNN flash
      # attention is asked for (cfg.attention_impl); jax's own default is always XLA.
      out_BxTxNxH = self._fused_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS,
                                          bias_BxNxTxS)
    else:
      # Attention-probability dropout (BERT's attention_probs_dropout_prob) needs the
      # probabilities, which the fused kernel does not expose: explicit path, same maths.
      out_BxTxNxH = self._explicit_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS,
                                             dropout_rng, bias_BxNxTxS)
    # A query that may see no key at all (a row of pure padding) gets zeros, not an average of
    # padding values: defined, finite, and independent of what the padding holds.
    any_Bx1xTx1 = jnp.any(mask_Bx1xTxS, axis=-1, keepdims=True)
    out_BxTxNxH = jnp.where(jnp.transpose(any_Bx1xTx1, (0, 2, 1, 3)), out_BxTxNxH, 0)
    return (jnp.einsum("btnh,nhd->btd", out_BxTxNxH, self.out_kernel[...].astype(dt))
            + self.out_bias[...].astype(dt)[None, None])

  def _fused_attention(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, bias_BxNxTxS=None):
    impl = self.attention_impl
    if impl == "auto":
      impl = ("cudnn" if jax.default_backend() == "gpu"
              and self.dtype in (jnp.bfloat16, jnp.float16) else "xla")
    if impl == "cudnn":
      # cuDNN takes the boolean mask as an additive bias ([B, 1, T, S]); any mask form works
      # (key padding, packed segments). Shapes it rejects raise at trace time: "auto" then
      # falls back to XLA, an explicit "cudnn" raises.
      try:
        return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias_BxNxTxS,
                                            mask=mask_Bx1xTxS, implementation="cudnn")
      except (NotImplementedError, RuntimeError, ValueError):
        if self.attention_impl == "cudnn":
          raise
    return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias_BxNxTxS,
                                        mask=mask_Bx1xTxS)

  def _explicit_attention(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng,
                          bias_BxNxTxS=None):
    if dropout_rng is None:
      raise ValueError("MultiHeadAttention is in train mode with attention_dropout > 0 but no "
                       "dropout_rng was given; pass dropout_rng or call model.eval().")
    scale = 1.0 / jnp.sqrt(jnp.float32(q_BxTxNxH.shape[-1]))
    logits_BxNxTxS = jnp.einsum("btnh,bsnh->bnts", q_BxTxNxH, k_BxSxNxH).astype(jnp.float32)
    logits_BxNxTxS = logits_BxNxTxS * scale
    if bias_BxNxTxS is not None:
      logits_BxNxTxS = logits_BxNxTxS + bias_BxNxTxS.astype(jnp.float32)
    logits_BxNxTxS = jnp.where(mask_Bx1xTxS, logits_BxNxTxS,
                               jnp.finfo(jnp.float32).min)
    probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1).astype(self.dtype)
    probs_BxNxTxS = self.dropout(probs_BxNxTxS, rngs=dropout_rng)
    return jnp.einsum("bnts,bsnh->btnh", probs_BxNxTxS, v_BxSxNxH)
