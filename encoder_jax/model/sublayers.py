"""The block's switchable sublayers: the norm, the linears, the activation, the FFN.

Each reads its switch from the frozen ModelConfig where it is built (`cfg.norm`,
`cfg.norm_bias`, `cfg.linear_bias`, `cfg.glu`, `cfg.activation`), so the encoder, its heads and
the decoder build the same sublayers from one config, one code path per switch. With the
defaults (LayerNorm with bias, linears with bias, a plain GELU FFN) every module and parameter
is what BERT's block always had.

Parameters carry logical axis names ("embed", "mlp", ...) as metadata; the trainer maps them to
a mesh with one rules table (encoder_jax.train.sharding). Eager sharding (flax >= 0.12) would
need a mesh at construction time, so every constructor here turns it off.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.model.activation_sharding import batch_split
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.matmul import bf16_dots, einsum, linear_dot_general


def init_normal(cfg: ModelConfig):
  # BERT initialises every weight matrix with a truncated normal of std initializer_range.
  return nnx.initializers.truncated_normal(stddev=cfg.initializer_range)


def activation_fn(name: str):
  return {
      "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT, ModernBERT: exact erf GELU
      "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,  # x * sigmoid(x): SwiGLU's "Swish" with beta = 1 (Shazeer 2020)
  }[name]


def layer_norm(cfg: ModelConfig, features: int, *, rngs: nnx.Rngs) -> nnx.Module:
  """The model's norm (`cfg.norm`): LayerNorm with or without its bias (`cfg.norm_bias`), or
  RMSNorm (Zhang & Sennrich 2019: x * rsqrt(mean(x^2) + eps) * scale; no mean, no bias).
  Statistics in fp32 (flax computes them so for half-precision inputs)."""
  scale_init = nnx.with_partitioning(nnx.initializers.ones_init(), ("embed",))
  with nnx.use_eager_sharding(False):
    if cfg.norm == "rmsnorm":
      return nnx.RMSNorm(features, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
                         param_dtype=cfg.storage_dtype, scale_init=scale_init, rngs=rngs)
    return nnx.LayerNorm(
        features, epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype, use_bias=cfg.norm_bias, scale_init=scale_init,
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("embed",)), rngs=rngs)


def dense(cfg: ModelConfig, din: int, dout: int, axes: tuple[str | None, str | None], *,
          rngs: nnx.Rngs, bias: bool | None = None) -> nnx.Linear:
  """A linear layer; `bias` None = `cfg.linear_bias` (the hidden linears), True for the
  layers that output logits, which keep their bias whatever the switch says."""
  # The dot is chosen here, once: bf16 with fp32 accumulation where bf16_dots says so.
  dot = (linear_dot_general if bf16_dots(cfg.dot_dtype, cfg.compute_dtype, cfg.backend)
         else jax.lax.dot_general)
  with nnx.use_eager_sharding(False):
    return nnx.Linear(
        din, dout, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype, dot_general=dot,
        use_bias=cfg.linear_bias if bias is None else bias,
        kernel_init=nnx.with_partitioning(init_normal(cfg), axes),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (axes[1],)), rngs=rngs)


class GatedIn(nnx.Module):
  """A GLU FFN's input side (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5-6):
  act(x W) * (x V), with W and V one [D, 2, F] kernel (one matmul; index 0 is W, the
  activated half, 1 is V, the gate). The F axis alone is sharded ('mlp'), so under tensor
  parallelism each device holds matching columns of W and V and the product needs no
  communication, which one [D, 2F] kernel split in halves would not give.
  HF ModernBertMLP's Wi [2F, D] is this kernel transposed: `input, gate = Wi(x).chunk(2)`.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.ffn_size
    self.kernel = nnx.Param(init_normal(cfg)(rngs.params(), (d, 2, f), cfg.storage_dtype),
                            out_sharding=("embed", None, "mlp"), eager_sharding=False)
    self.bias = (nnx.Param(jnp.zeros((2, f), cfg.storage_dtype), out_sharding=(None, "mlp"),
                           eager_sharding=False) if cfg.linear_bias else None)
    self.act = cfg.activation
    self.dtype = cfg.compute_dtype
    self.bf16 = bf16_dots(cfg.dot_dtype, cfg.compute_dtype, cfg.backend)

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    dt = self.dtype
    h_BxTx2xF = einsum("btd,dcf->btcf", x_BxTxD.astype(dt), self.kernel[...].astype(dt),
                       bf16=self.bf16)
    if self.bias is not None:
      h_BxTx2xF = h_BxTx2xF + self.bias[...].astype(dt)[None, None]
    return activation_fn(self.act)(h_BxTx2xF[:, :, 0]) * h_BxTx2xF[:, :, 1]


def ffn_in(cfg: ModelConfig, *, rngs: nnx.Rngs) -> nnx.Module:
  """The FFN's input projection: a [D, F] linear (its activation applied by `ffn`), or the GLU
  pair (`cfg.glu`), which applies its own."""
  if cfg.glu:
    return GatedIn(cfg, rngs=rngs)
  return dense(cfg, cfg.hidden_size, cfg.ffn_size, ("embed", "mlp"), rngs=rngs)


def ffn(x_BxTxD: jax.Array, ffn_in_: nnx.Module, ffn_out: nnx.Linear, act: str) -> jax.Array:
  """ffn_out(act(ffn_in(x))), or ffn_out(act(x W) * x V) for a GLU input."""
  h_BxTxF = ffn_in_(x_BxTxD)
  if not isinstance(ffn_in_, GatedIn):
    h_BxTxF = activation_fn(act)(h_BxTxF)
  # batch_split: each device computes its own rows under FSDP (activation_sharding.py)
  return ffn_out(batch_split(h_BxTxF))
