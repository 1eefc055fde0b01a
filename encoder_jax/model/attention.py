"""Bidirectional multi-head self-attention with key-padding and packed-segment masks.

Which computation runs (the fused `jax.nn.dot_product_attention`, XLA or cuDNN, or the explicit
einsum path that attention-probability dropout needs) is `attention_path`'s decision.

Shapes in names: B batch, T query length, S key length, D hidden, N heads, H head dim.
Masks are boolean, True = may attend.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import Dropout
from encoder_jax.model.matmul import bf16_dots, einsum


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


@flax.struct.dataclass
class AlibiBias:
  """ALiBi's [B, N, T, S] bias, -slope_n * |pos_i - pos_j|, kept factored (per-head slopes and
  [B, 1, T, S] distances) until an attention layer adds it to its logits (`full()` there).

  Passed whole through the scanned layers, XLA materialises the [B, N, T, S] tensor once per
  step and every layer reads it back, forward and backward (at the demo recipe's 8 heads, ~5%
  of its CPU step); built inside the layer, the multiply fuses into the logits' sum.
  """
  neg_slopes_1xNx1x1: jax.Array
  dist_Bx1xTxS: jax.Array

  @classmethod
  def from_positions(cls, positions_BxT: jax.Array, num_heads: int) -> "AlibiBias":
    pos_BxT = positions_BxT.astype(jnp.float32)
    return cls(-alibi_slopes(num_heads)[None, :, None, None],
               jnp.abs(pos_BxT[:, None, :, None] - pos_BxT[:, None, None, :]))

  def full(self) -> jax.Array:
    return self.neg_slopes_1xNx1x1 * self.dist_Bx1xTxS


def alibi_bias(positions_BxT: jax.Array, num_heads: int) -> jax.Array:
  """[B, N, T, T] float32: -slope_n * |pos_i - pos_j| (symmetric: the encoder is bidirectional).

  Distances come from position ids, so packed examples (positions restarting at 0) get their
  own distances; attention across packed examples is masked anyway.
  """
  return AlibiBias.from_positions(positions_BxT, num_heads).full()


_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Which implementation "auto" picks off GPU. bench/demo_step.py timed the demo recipe's
# CPU step with "xla" and "explicit" (README "Performance"): no clear difference, so jax's call.
_AUTO_OFF_GPU = "xla"
_warned: set[str] = set()


def attention_path(impl: str, dtype, *, dropout_active: bool, backend: str | None = None,
                   dot_dtype: str = "") -> str:
  """The attention computation a layer runs: "explicit" | "xla" | "cudnn".

  `impl` is ModelConfig.attention_impl, `dtype` the compute dtype, `dropout_active` whether
  attention-probability dropout is on (train mode and attention_dropout > 0), `backend` jax's
  default backend unless given. Dropout on the probabilities needs them, and the fused call
  does not expose them: "explicit" then, whatever `impl` says. "auto" is cuDNN on GPU in
  bf16/fp16 (cuDNN flash attention has no fp32 kernel) and XLA elsewhere; a "cudnn" chosen by
  "auto" still falls back to XLA at trace time where jax rejects the shapes (with a warning).
  Where the model's dots take the bf16 fp32-accumulating path on CPU (matmul.bf16_dots),
  "auto" is "explicit", whose two einsums take that path (the fused call's would not).
  """
  if dropout_active:
    return "explicit"
  if impl != "auto":
    return impl
  backend = backend or jax.default_backend()
  if backend == "cpu" and bf16_dots(dot_dtype, dtype, backend):
    return "explicit"
  if backend == "gpu":
    return "cudnn" if jnp.dtype(dtype) in _HALF else "xla"
  return _AUTO_OFF_GPU


def describe_attention(cfg: ModelConfig, backend: str | None = None) -> str:
  """One line for the start-up log: the attention path of the training and evaluation steps,
  and why."""
  backend = backend or cfg.backend
  names = {"explicit": "explicit einsum + fp32 softmax",
           "xla": "jax.nn.dot_product_attention (XLA)",
           "cudnn": "jax.nn.dot_product_attention (cuDNN flash attention)"}
  dtype = jnp.dtype(cfg.dtype).name
  why = f"attention_impl={cfg.attention_impl} on {backend} in {dtype}"
  drop = cfg.attention_dropout > 0
  train = attention_path(cfg.attention_impl, cfg.dtype, dropout_active=drop, backend=backend,
                         dot_dtype=cfg.dot_dtype)
  evaluate = attention_path(cfg.attention_impl, cfg.dtype, dropout_active=False,
                            backend=backend, dot_dtype=cfg.dot_dtype)
  if drop:
    train_why = (f"model.attention_dropout={cfg.attention_dropout} drops attention "
                 "probabilities, which the fused call does not expose; attention_dropout=0 "
                 "(configs/pretrain.py dropout=no_attention|none) lets training use "
                 "jax.nn.dot_product_attention")
  else:
    train_why = f"model.attention_dropout={cfg.attention_dropout}, {why}"
  line = f"attention: training step uses {names[train]} ({train_why})"
  if evaluate != train:
    line += f"; evaluation uses {names[evaluate]} ({why})"
  if "cudnn" in (train, evaluate) and cfg.attention_impl == "auto":
    line += "; XLA where jax rejects the shapes for cuDNN (a warning says so)"
  return line


class MultiHeadAttention(nnx.Module):
  """Fused-QKV self-attention; softmax in fp32; fully masked query rows output zeros.

  The QKV projection is one [D, 3, N, H] kernel (one matmul instead of three) sharded on the
  'heads' axis for tensor parallelism; the HF converter splits/stacks BERT's query/key/value.
  The attention itself is `jax.nn.dot_product_attention` (XLA, or cuDNN flash attention on a
  GPU in bf16/fp16) with the ALiBi bias as its `bias` and the padding/segment mask as its
  `mask`, except while attention-probability dropout is on (train mode, attention_dropout > 0):
  that runs the explicit einsum path, the same maths with the probabilities in hand. See
  `attention_path`; tests/model/test_attention_impl.py checks both paths agree.
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
    self.dot_dtype = cfg.dot_dtype
    self.backend = cfg.backend  # the platform "auto" decides for (ModelConfig.platform)
    self.bf16 = bf16_dots(cfg.dot_dtype, cfg.compute_dtype, self.backend)

  def __call__(self, x_BxTxD: jax.Array, mask_Bx1xTxS: jax.Array, *,
               dropout_rng: jax.Array | None = None,
               bias_BxNxTxS: jax.Array | AlibiBias | None = None) -> jax.Array:
    if isinstance(bias_BxNxTxS, AlibiBias):
      bias_BxNxTxS = bias_BxNxTxS.full()  # here, inside the layer (see AlibiBias)
    dt = self.dtype
    x_BxTxD = x_BxTxD.astype(dt)
    qkv_BxTx3xNxH = (einsum("btd,dcnh->btcnh", x_BxTxD, self.qkv_kernel[...].astype(dt),
                            bf16=self.bf16)
                     + self.qkv_bias[...].astype(dt)[None, None])
    q_BxTxNxH, k_BxSxNxH, v_BxSxNxH = (qkv_BxTx3xNxH[:, :, i] for i in range(3))
    out_BxTxNxH = self._attend(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng,
                               bias_BxNxTxS)
    # A query that may see no key at all (a row of pure padding) gets zeros, not an average of
    # padding values: defined, finite, and independent of what the padding holds.
    any_Bx1xTx1 = jnp.any(mask_Bx1xTxS, axis=-1, keepdims=True)
    out_BxTxNxH = jnp.where(jnp.transpose(any_Bx1xTx1, (0, 2, 1, 3)), out_BxTxNxH, 0)
    return (einsum("btnh,nhd->btd", out_BxTxNxH, self.out_kernel[...].astype(dt),
                   bf16=self.bf16)
            + self.out_bias[...].astype(dt)[None, None])

  def _attend(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng=None,
              bias_BxNxTxS=None):
    """softmax(q k^T / sqrt(H) + bias, masked) v on the path `attention_path` picks; each path
    runs under a named scope "attention_<path>" (visible in the jaxpr and the HLO metadata, so
    tests can see which path a jitted step traced)."""
    dropout_active = not self.dropout.deterministic and self.dropout.rate > 0.0
    path = attention_path(self.attention_impl, self.dtype, dropout_active=dropout_active,
                          backend=self.backend, dot_dtype=self.dot_dtype)
    if path == "explicit":
      with jax.named_scope("attention_explicit"):
        return self._explicit_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS,
                                        dropout_rng, bias_BxNxTxS)
    if path == "cudnn":
      # cuDNN adds the boolean mask to the bias (key padding and packed segments both work);
      # ALiBi's fp32 bias is cast to the compute dtype, as cuDNN's kernels take one dtype.
      # Shapes it rejects raise at trace time: "auto" then falls back to XLA, an explicit
      # "cudnn" raises.
      bias_cudnn = None if bias_BxNxTxS is None else bias_BxNxTxS.astype(q_BxTxNxH.dtype)
      try:
        with jax.named_scope("attention_cudnn"):
          return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH,
                                              bias=bias_cudnn, mask=mask_Bx1xTxS,
                                              implementation="cudnn")
      except (NotImplementedError, RuntimeError, ValueError) as err:
        if self.attention_impl == "cudnn":
          raise
        msg = f"attention_impl=auto: cuDNN rejected this attention ({err}); using XLA."
        if msg not in _warned:
          _warned.add(msg)
          logging.warning(msg)
    with jax.named_scope("attention_xla"):
      return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias_BxNxTxS,
                                          mask=mask_Bx1xTxS, implementation="xla")

  def _explicit_attention(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng,
                          bias_BxNxTxS=None):
    dropout_active = not self.dropout.deterministic and self.dropout.rate > 0.0
    if dropout_active and dropout_rng is None:
      raise ValueError("MultiHeadAttention is in train mode with attention_dropout > 0 but no "
                       "dropout_rng was given; pass dropout_rng or call model.eval().")
    scale = 1.0 / jnp.sqrt(jnp.float32(q_BxTxNxH.shape[-1]))
    logits_BxNxTxS = einsum("btnh,bsnh->bnts", q_BxTxNxH, k_BxSxNxH, out_dtype=jnp.float32,
                            bf16=self.bf16)
    logits_BxNxTxS = logits_BxNxTxS * scale
    if bias_BxNxTxS is not None:
      logits_BxNxTxS = logits_BxNxTxS + bias_BxNxTxS.astype(jnp.float32)
    # The mask as an additive [B, 1, T, S] bias: a hidden key's exp() underflows to exactly 0 as
    # with where(mask, logits, finfo.min), but the [B, N, T, S] broadcast of the constant, which
    # XLA hoists out of the scanned layers and materialises, is gone (~4% of the demo step).
    # -1e9 stays finite under any ALiBi bias; rows with no visible key are zeroed by the caller.
    logits_BxNxTxS = logits_BxNxTxS + jnp.where(mask_Bx1xTxS, 0.0, -1e9)
    probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1).astype(self.dtype)
    if dropout_active:
      probs_BxNxTxS = self.dropout(probs_BxNxTxS, rngs=dropout_rng)
    return einsum("bnts,bsnh->btnh", probs_BxNxTxS, v_BxSxNxH, bf16=self.bf16)
