"""Bidirectional multi-head self-attention with key-padding and packed-segment masks.

Which computation runs (the fused `jax.nn.dot_product_attention`, XLA or cuDNN, or the explicit
einsum path that attention-probability dropout needs) is `attention_path`'s decision.

Per layer the attention may also rotate queries and keys (RoPE, `ModelConfig.rope`) and, in
a local layer (`ModelConfig.local_window`, `global_layers`), see only keys within the window:
the window joins the padding / packed-segment mask on every dense path (explicit, XLA, cuDNN),
so a packed example never sees another through it either. The Pallas TPU kernel takes no window:
there local layers run XLA ("auto", logged once) and an explicit "pallas" refuses them. RoPE
acts on q and k before any path, so every path takes it.

Shapes in names: B batch, T query length, S key length, D hidden, N heads, H head dim.
Masks are boolean, True = may attend.
"""
from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx
from jax.sharding import PartitionSpec as P

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import Dropout
from encoder_jax.model.matmul import bf16_dots, einsum
from encoder_jax.model.rotary import apply_rope, rope_angles, select, window_band
from encoder_jax.model.sublayers import init_normal

__all__ = ["init_normal"]  # re-exported: the decoder builds its cross-attention with it


def param(value: jax.Array, axes: tuple[str | None, ...]) -> nnx.Param:
  # Logical axis names are metadata only; the trainer maps them to a mesh (no eager sharding).
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


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


@flax.struct.dataclass
class KeyMask:
  """The encoder's self-attention mask kept factored: key padding [and packed segment ids].

  `full()` is `make_attention_mask`'s [B, 1, T, T] boolean; `segments()` the [B, T] int32 ids
  a flash-attention kernel takes (0 at padding, the packed example's id or 1 elsewhere: a
  query sees exactly the keys of its own id, so valid queries see what the full mask lets
  them see). The encoder passes this form to its layers only where the attention may run
  the Pallas kernel (`Encoder`), so the other paths build the full mask once, as before.
  """
  mask_BxT: jax.Array
  segment_ids_BxT: jax.Array | None = None

  def full(self) -> jax.Array:
    return make_attention_mask(self.mask_BxT, self.segment_ids_BxT)

  def segments(self) -> jax.Array:
    ids = (jnp.ones(self.mask_BxT.shape, jnp.int32) if self.segment_ids_BxT is None
           else self.segment_ids_BxT.astype(jnp.int32))
    return jnp.where(self.mask_BxT.astype(bool), ids, 0)


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


_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Which implementation "auto" picks off GPU. bench/demo_step.py timed the demo recipe's
# CPU step with "xla" and "explicit" (README "Performance"): no clear difference, so jax's call.
_AUTO_OFF_GPU = "xla"
_warned: set[str] = set()


def attention_path(impl: str, dtype, *, dropout_active: bool, backend: str | None = None,
                   dot_dtype: str = "") -> str:
  """The attention computation a layer runs: "explicit" | "xla" | "cudnn" | "pallas".

  `impl` is ModelConfig.attention_impl, `dtype` the compute dtype, `dropout_active` whether
  attention-probability dropout is on (train mode and attention_dropout > 0), `backend` jax's
  default backend unless given. Dropout on the probabilities needs them, and the fused call
  does not expose them: "explicit" then, whatever `impl` says. "auto" is cuDNN on GPU in
  bf16/fp16 (cuDNN flash attention has no fp32 kernel), the Pallas TPU flash attention kernel
  on TPU, and XLA elsewhere; a "cudnn" or "pallas" chosen by "auto" still falls back to XLA at
  trace time where the kernel cannot take the shapes or mask (with a warning).
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
  if backend == "tpu":
    return "pallas"
  return _AUTO_OFF_GPU


def may_use_pallas(impl: str, backend: str) -> bool:
  """Whether a layer with this attention_impl on `backend` may run the Pallas kernel, which
  needs the factored mask (KeyMask)."""
  return impl == "pallas" or (impl == "auto" and backend == "tpu")


def describe_attention(cfg: ModelConfig, backend: str | None = None) -> str:
  """One line for the start-up log: the attention path of the training and evaluation steps,
  and why."""
  backend = backend or cfg.backend
  names = {"explicit": "explicit einsum + fp32 softmax",
           "xla": "jax.nn.dot_product_attention (XLA)",
           "cudnn": "jax.nn.dot_product_attention (cuDNN flash attention)",
           "pallas": "Pallas TPU flash attention (jax.experimental.pallas.ops.tpu)"}
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
  if "pallas" in (train, evaluate) and cfg.attention_impl == "auto":
    line += "; XLA where the rows are not a multiple of 128 tokens (a warning says so)"
    if not all(cfg.global_layers):
      line += (f"; XLA in the local layers (local_window={cfg.local_window}), which the "
               "kernel cannot window")
  if not all(cfg.global_layers):
    line += (f"; layers {', '.join(str(i) for i, g in enumerate(cfg.global_layers) if g)} "
             f"global, the others within |i - j| <= {cfg.local_window // 2}")
  return line


def _warn_once(msg: str) -> None:
  if msg not in _warned:
    _warned.add(msg)
    logging.warning(msg)


# The kernel's tiles: its key blocks must be multiples of 128 lanes, and its default blocks
# are 128 x 128, so rows are taken in multiples of 128 tokens.
_PALLAS_BLOCK = 128


def pallas_unsupported(q_shape, k_shape, mask) -> str | None:
  """Why the Pallas TPU kernel cannot take this attention, or None."""
  if not isinstance(mask, KeyMask):
    return "it needs the encoder's factored key mask, not a dense one (decoder masks)"
  if q_shape[1] % _PALLAS_BLOCK or k_shape[1] % _PALLAS_BLOCK:
    return (f"rows of {q_shape[1]} queries / {k_shape[1]} keys are not a multiple of "
            f"{_PALLAS_BLOCK} tokens")
  return None


def pallas_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, segments_BxT, bias_BxNxTxS=None):
  """softmax(q k^T / sqrt(H) + bias) v over keys of the query's own segment, by the Pallas
  TPU flash attention kernel (jax.experimental.pallas.ops.tpu.flash_attention): the [T, S]
  probabilities are never written to HBM, forward or backward.

  A pallas_call is a custom call the SPMD partitioner cannot split, so under a mesh (the train
  step traces under one, model/activation_sharding.py) it runs in `jax.shard_map`: each
  device its own rows (batch axes) and, where the head count divides, its own heads
  ('tensor'); nothing crosses devices inside attention. Without a mesh it runs as is.
  """
  from jax.experimental.pallas.ops.tpu import flash_attention as fa

  from encoder_jax.model.activation_sharding import BATCH_AXES

  to_bnth = lambda a: jnp.transpose(a, (0, 2, 1, 3))
  # The kernel scales (q k^T + bias) by sm_scale; scaling q instead leaves the bias unscaled.
  scale = 1.0 / float(q_BxTxNxH.shape[-1]) ** 0.5
  q = to_bnth(q_BxTxNxH * jnp.asarray(scale, q_BxTxNxH.dtype))
  k, v = to_bnth(k_BxSxNxH), to_bnth(v_BxSxNxH)
  ab = None if bias_BxNxTxS is None else jnp.broadcast_to(
      bias_BxNxTxS, (q.shape[0], q.shape[1], q.shape[2], k.shape[2])).astype(jnp.float32)

  def kernel(q, k, v, seg, ab):
    return fa.flash_attention(q, k, v, ab=ab, segment_ids=fa.SegmentIds(seg, seg))

  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and set(BATCH_AXES) <= set(mesh.axis_names):
    rows = math.prod(mesh.shape[axis] for axis in BATCH_AXES)
    batch = BATCH_AXES if q.shape[0] % rows == 0 else None
    heads = ("tensor" if "tensor" in mesh.axis_names and q.shape[1] % mesh.shape["tensor"] == 0
             else None)
    spec4, spec2 = P(batch, heads, None, None), P(batch, None)
    kernel = jax.shard_map(kernel, mesh=mesh, check_vma=False,
                           in_specs=(spec4, spec4, spec4, spec2, None if ab is None else spec4),
                           out_specs=spec4)
  out = kernel(q, k, v, segments_BxT, ab)
  return to_bnth(out)


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
    self.qkv_kernel = param(init_normal(cfg)(rngs.params(), (d, 3, n, h), cfg.storage_dtype),
                            ("embed", None, "heads", "kv"))
    self.qkv_bias = (param(jnp.zeros((3, n, h), cfg.storage_dtype), (None, "heads", "kv"))
                     if cfg.linear_bias else None)
    self._init_output(cfg, rngs)
    # (global, local) RoPE thetas, or None; the window's half width (0: none).
    self.rope_thetas = (cfg.rope_theta, cfg.rope_theta_local) if cfg.rope else None
    self.window = cfg.local_window // 2 if cfg.local_window else 0

  def _init_output(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    """The output projection, the probability dropout and the numerics (CrossAttention's too)."""
    n, h, d = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    self.out_kernel = param(init_normal(cfg)(rngs.params(), (n, h, d), cfg.storage_dtype),
                            ("heads", "kv", "embed"))
    self.out_bias = (param(jnp.zeros((d,), cfg.storage_dtype), ("embed",)) if cfg.linear_bias
                     else None)
    self.rope_thetas, self.window = None, 0  # self-attention sets its own (cross: none)
    self.dropout = Dropout(cfg.attention_dropout, deterministic=True)
    self.dtype = cfg.compute_dtype
    self.attention_impl = cfg.attention_impl
    self.dot_dtype = cfg.dot_dtype
    self.backend = cfg.backend  # the platform "auto" decides for (ModelConfig.platform)
    self.bf16 = bf16_dots(cfg.dot_dtype, cfg.compute_dtype, self.backend)

  def __call__(self, x_BxTxD: jax.Array, mask_Bx1xTxS: jax.Array | KeyMask, *,
               dropout_rng: jax.Array | None = None,
               bias_BxNxTxS: jax.Array | AlibiBias | None = None,
               positions_BxT: jax.Array | None = None, is_global=True) -> jax.Array:
    """`mask_Bx1xTxS`: the boolean [B, 1, T, S] mask, or the encoder's factored KeyMask.
    `positions_BxT`: the position ids RoPE rotates by (needed with `ModelConfig.rope`).
    `is_global`: this layer's kind, a Python bool or a traced scalar (a scanned stack): a
    local layer (False) attends within the window and rotates with the local theta."""
    if isinstance(bias_BxNxTxS, AlibiBias):
      bias_BxNxTxS = bias_BxNxTxS.full()  # here, inside the layer (see AlibiBias)
    qkv_BxTx3xNxH = self._project("btd,dcnh->btcnh", x_BxTxD, self.qkv_kernel, self.qkv_bias)
    q_BxTxNxH, k_BxSxNxH, v_BxSxNxH = (qkv_BxTx3xNxH[:, :, i] for i in range(3))
    if self.rope_thetas is not None:
      if positions_BxT is None:
        raise ValueError("MultiHeadAttention with ModelConfig.rope=True needs positions_BxT.")
      cos, sin = rope_angles(positions_BxT, q_BxTxNxH.shape[-1], self.rope_thetas, is_global)
      q_BxTxNxH, k_BxSxNxH = apply_rope(q_BxTxNxH, cos, sin), apply_rope(k_BxSxNxH, cos, sin)
    out_BxTxNxH, mask_Bx1xTxS = self._attend(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS,
                                             dropout_rng, bias_BxNxTxS,
                                             is_global=True if not self.window else is_global)
    # A query that may see no key at all (a row of pure padding) gets zeros, not an average of
    # padding values: defined, finite, and independent of what the padding holds. (Where the
    # kernel ran, every padding query is zeroed: under it a padding query sees padding.)
    if isinstance(mask_Bx1xTxS, KeyMask):
      seen_BxTx1x1 = (mask_Bx1xTxS.segments() > 0)[:, :, None, None]
    else:
      seen_BxTx1x1 = jnp.transpose(jnp.any(mask_Bx1xTxS, axis=-1, keepdims=True), (0, 2, 1, 3))
    out_BxTxNxH = jnp.where(seen_BxTx1x1, out_BxTxNxH, 0)
    return self._project("btnh,nhd->btd", out_BxTxNxH, self.out_kernel, self.out_bias)

  def _project(self, spec: str, x, kernel: nnx.Param, bias: nnx.Param) -> jax.Array:
    """einsum(spec, x, kernel) + bias in the compute dtype (on the bf16 path where it applies)."""
    dt = self.dtype
    out = einsum(spec, x.astype(dt), kernel[...].astype(dt), bf16=self.bf16)
    return out if bias is None else out + bias[...].astype(dt)[None, None]

  def _attend(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng=None,
              bias_BxNxTxS=None, *, is_global=True):
    """(softmax(q k^T / sqrt(H) + bias, masked) v, the mask it used) on the path
    `attention_path` picks; each path runs under a named scope "attention_<path>" (visible in
    the jaxpr and the HLO metadata, so tests can see which path a jitted step traced). The
    mask comes back factored (KeyMask) only where the Pallas kernel ran. A local layer
    (`is_global` not True, with a window) sees keys within `self.window` of each query only."""
    dropout_active = not self.dropout.deterministic and self.dropout.rate > 0.0
    path = attention_path(self.attention_impl, self.dtype, dropout_active=dropout_active,
                          backend=self.backend, dot_dtype=self.dot_dtype)
    if path == "pallas":
      why = pallas_unsupported(q_BxTxNxH.shape, k_BxSxNxH.shape, mask_Bx1xTxS)
      if why is None and is_global is not True:
        why = (f"a local layer's window (local_window={2 * self.window}) is not a mask the "
               "kernel takes")
        if self.attention_impl == "auto" and not isinstance(is_global, bool):
          return self._pallas_or_windowed(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS,
                                          bias_BxNxTxS, is_global, why)
      if why is None:
        with jax.named_scope("attention_pallas"):
          return pallas_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS.segments(),
                                  bias_BxNxTxS), mask_Bx1xTxS
      if self.attention_impl == "pallas":
        raise ValueError(f"attention_impl='pallas' cannot run here: {why}; use 'auto' or 'xla'.")
      _warn_once(f"attention_impl=auto: the Pallas TPU kernel cannot run here ({why}); "
                 "using XLA.")
      path = "xla"
    if isinstance(mask_Bx1xTxS, KeyMask):
      mask_Bx1xTxS = mask_Bx1xTxS.full()
    mask_Bx1xTxS = self._windowed(mask_Bx1xTxS, is_global)
    return self._attend_dense(path, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng,
                              bias_BxNxTxS), mask_Bx1xTxS

  def _windowed(self, mask_Bx1xTxS: jax.Array, is_global) -> jax.Array:
    """The mask, restricted to the local window unless the layer is global."""
    if is_global is True:
      return mask_Bx1xTxS
    band_1x1xTxS = window_band(mask_Bx1xTxS.shape[-2], mask_Bx1xTxS.shape[-1], self.window)
    return mask_Bx1xTxS & select(is_global, True, band_1x1xTxS)

  def _pallas_or_windowed(self, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, key_mask: KeyMask,
                          bias_BxNxTxS, is_global, why: str):
    """In a scanned stack whose kind is traced: the kernel in global layers, XLA with the
    window in local ones (`lax.cond`, one branch runs). Padding queries are zeroed in both,
    as under the kernel (the KeyMask comes back)."""
    _warn_once(f"attention_impl=auto: the Pallas TPU kernel cannot run local layers ({why}); "
               "they use XLA, global layers the kernel.")
    def kernel(q, k, v, bias):
      with jax.named_scope("attention_pallas"):
        return pallas_attention(q, k, v, key_mask.segments(), bias)
    def windowed(q, k, v, bias):
      with jax.named_scope("attention_xla"):
        return jax.nn.dot_product_attention(q, k, v, bias=bias, implementation="xla",
                                            mask=self._windowed(key_mask.full(), False))
    out = jax.lax.cond(is_global, kernel, windowed, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH,
                       bias_BxNxTxS)
    return out, key_mask

  def _attend_dense(self, path, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng,
                    bias_BxNxTxS):
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
        _warn_once(f"attention_impl=auto: cuDNN rejected this attention ({err}); using XLA.")
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
