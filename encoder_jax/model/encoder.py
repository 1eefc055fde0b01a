"""Embeddings, the Transformer block (post-LN BERT | pre-LN) and the encoder stack.

Train vs eval mode is explicit and separate from freezing: `model.train()` turns dropout on
(and then every call needs a `dropout_rng`), `model.eval()` turns it off; freezing parameters
is the optimizer's business (see encoder_jax.train.optim), never a mode of the model.
Models are built in eval mode.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from encoder_jax.model.activation_sharding import batch_split
from encoder_jax.model.attention import (AlibiBias, KeyMask, MultiHeadAttention, init_normal,
                                         make_attention_mask, may_use_pallas)
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import Dropout, fold_rng
from encoder_jax.model.sublayers import activation_fn, dense, ffn, ffn_in, layer_norm

# Re-exported: heads, the decoder and callers import the sublayer builders from here.
__all__ = ["activation_fn", "dense", "layer_norm"]

_REMAT = {
    "full": None,  # save nothing, recompute the whole block in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def sinusoidal_init(std: float):
  """An initializer for a [positions, width] table: Vaswani et al.'s sin/cos features, scaled
  to a root-mean-square of `std` per entry, the scale of BERT's normal init. Position i+k is then
  a fixed rotation of i in
  every frequency pair, so attention to a relative offset is a linear function of the table
  from step 0 instead of something the table has to discover."""
  def init(key, shape, dtype=jnp.float32):
    del key
    n, e = shape
    pos_Nx1 = np.arange(n, dtype=np.float64)[:, None]
    freq = np.exp(-np.log(10_000.0) * np.arange(0, e, 2, dtype=np.float64) / e)[None, :]
    table = np.zeros((n, e), np.float64)
    table[:, 0::2] = np.sin(pos_Nx1 * freq)
    table[:, 1::2] = np.cos(pos_Nx1 * freq)[:, : e // 2]
    return jnp.asarray(table * std * np.sqrt(2.0), dtype)
  return init


def zero_padded_rows(init, rows: int):
  """An initializer for a [padded rows, width] table: `init`'s draw for [rows, width] (the
  values an unpadded table of the same seed gets) followed by zero rows. Zero rows that no
  id looks up and whose logits are masked (heads.MlmHead) get no gradient, so AdamW keeps them
  at zero."""
  def f(key, shape, dtype=jnp.float32):
    real = init(key, (rows,) + tuple(shape[1:]), dtype)
    return jnp.pad(real, ((0, shape[0] - rows),) + ((0, 0),) * (len(shape) - 1))
  return f


class Embeddings(nnx.Module):
  """Token + learned position + segment (token type) embeddings, norm, dropout.

  The position table only with `cfg.learned_positions` (RoPE models have none), the type table
  only with `cfg.type_vocab_size`, the norm only with `cfg.embedding_norm`.
  Output width is `cfg.embed_size`; when it differs from hidden_size (ELECTRA-small) the
  Encoder owns the projection, so that an ELECTRA generator of another width can share this
  whole module (token, position and type tables + norm) with its discriminator.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    e = cfg.embed_size
    emb = lambda n, axes, init=init_normal(cfg): nnx.Embed(
        n, e, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        embedding_init=nnx.with_partitioning(init, axes), rngs=rngs)
    pos_init = (sinusoidal_init(cfg.initializer_range) if cfg.position_init == "sinusoidal"
                else init_normal(cfg))
    self.compute_dtype = cfg.compute_dtype
    with nnx.use_eager_sharding(False):
      self.token = emb(cfg.padded_vocab_size, ("vocab", "embed"),
                       zero_padded_rows(init_normal(cfg), cfg.vocab_size))
      self.position = (emb(cfg.max_positions, (None, "embed"), pos_init)
                       if cfg.learned_positions else None)
      self.token_type = (emb(cfg.type_vocab_size, (None, "embed")) if cfg.type_vocab_size
                         else None)
    self.ln = layer_norm(cfg, e, rngs=rngs) if cfg.embedding_norm else None
    self.dropout = Dropout(cfg.hidden_dropout, deterministic=True)

  def __call__(self, ids_BxT, token_types_BxT, positions_BxT, *, dropout_rng=None):
    x_BxTxE = self.lookup(self.token, ids_BxT)
    if self.position is not None:
      x_BxTxE = x_BxTxE + self.lookup(self.position, positions_BxT)
    if self.token_type is not None:
      x_BxTxE = x_BxTxE + self.lookup(self.token_type, token_types_BxT)
    if self.ln is not None:
      x_BxTxE = self.ln(x_BxTxE)
    return self.dropout(x_BxTxE, rngs=dropout_rng)

  def lookup(self, table: nnx.Embed, ids) -> jax.Array:
    """Rows of `table` in its storage dtype, then cast: the values of nnx.Embed's lookup, which
    casts the whole table to the compute dtype first (a full bf16 copy of BERT's 30k x 768
    table every step, and a bf16 scatter-add for its gradient, where every [CLS] of the batch
    lands on one row). Gathering first casts B x T rows, and the gradient is an fp32
    scatter-add into the table's own dtype."""
    return jnp.take(table.embedding[...], ids, axis=0).astype(self.compute_dtype)


def residual(x, sublayer, ln, drop, norm_first: bool):
  """pre-LN `x + drop(sublayer(ln(x)))`, post-LN `ln(x + drop(sublayer(x)))`; `ln` None (a
  pre-LN layer 0 reading the embedding norm's output, ModelConfig.first_attn_norm) is none."""
  if norm_first:
    return x + drop(sublayer(x if ln is None else ln(x)))
  return ln(x + drop(sublayer(x)))


class Block(nnx.Module):
  """One Transformer encoder layer.

  post-LN (BERT, `norm_first=False`):  x = LN(x + Drop(Attn(x)));  x = LN(x + Drop(FFN(x)))
  pre-LN (`norm_first=True`):          x = x + Drop(Attn(LN(x)));  x = x + Drop(FFN(LN(x)))
  Equal to torch.nn.TransformerEncoderLayer(norm_first=False|True, activation="gelu") in eval
  mode (tests/model/test_torch_parity.py). The sublayers follow the config's switches (norm,
  biases, GLU FFN: model/sublayers.py; RoPE and the local window: the attention); `attn_norm`
  False builds a pre-LN layer without its attention pre-norm (ModelConfig.first_attn_norm).
  With ModernBERT's switches this is ModernBertEncoderLayer (tests/convert/test_hf_modernbert).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, attn_norm: bool = True):
    d, f = cfg.hidden_size, cfg.ffn_size
    self.attn = MultiHeadAttention(cfg, rngs=rngs)
    self.ln_attn = layer_norm(cfg, d, rngs=rngs) if attn_norm else None
    self.ffn_in = ffn_in(cfg, rngs=rngs)
    self.ffn_out = dense(cfg, f, d, ("mlp", "embed"), rngs=rngs)
    self.ln_ffn = layer_norm(cfg, d, rngs=rngs)
    self.dropout = Dropout(cfg.hidden_dropout, deterministic=True)
    self.norm_first = cfg.norm_first
    self.act = cfg.activation

  def __call__(self, x_BxTxD, mask_Bx1xTxT, dropout_rng=None, bias_BxNxTxT=None,
               positions_BxT=None, is_global=True):
    """`positions_BxT`: what RoPE rotates by (None without RoPE); `is_global`: the layer's
    kind (a Python bool, or traced inside a scan), see MultiHeadAttention."""
    drop = lambda i: lambda y: self.dropout(y, rngs=fold_rng(dropout_rng, i))
    x_BxTxD = batch_split(x_BxTxD)
    attn = lambda y: self.attn(y, mask_Bx1xTxT, dropout_rng=fold_rng(dropout_rng, 2),
                               bias_BxNxTxS=bias_BxNxTxT, positions_BxT=positions_BxT,
                               is_global=is_global)
    x_BxTxD = batch_split(residual(x_BxTxD, attn, self.ln_attn, drop(0), self.norm_first))
    ffn_ = lambda y: ffn(y, self.ffn_in, self.ffn_out, self.act)
    return batch_split(residual(x_BxTxD, ffn_, self.ln_ffn, drop(1), self.norm_first))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EncoderOutput:
  """What the encoder hands to heads, and to a seq2seq decoder as cross-attention memory.

  hidden_BxTxD: all T vectors (padding positions included; ignore them through `mask_BxT`).
  mask_BxT: True at real tokens. A decoder's cross-attention uses it as its key mask so padded
  memory slots are never attended (see tests/model/test_invariants.py::test_memory_*).
  """
  hidden_BxTxD: jax.Array
  mask_BxT: jax.Array


class Encoder(nnx.Module):
  """Embeddings [-> projection] -> L blocks (scanned or unrolled) -> final norm (pre-LN only).

  `embeddings`: an existing `Embeddings` module to share (ELECTRA ties the generator's
  embeddings to the discriminator's; NNX keeps one parameter for both references). Its width
  must equal `cfg.embed_size`.

  Layer kinds (global / local window, `ModelConfig.global_layers`) and RoPE's per-kind theta
  keep the stack one scan: the kinds are a scanned input beside the stacked parameters. A
  layer 0 without attention pre-norm (`first_attn_norm=False`) has other parameters than the
  rest, so scanned it is `first_block`, outside the stack of layers 1..L-1; unrolled it is
  `blocks[0]` as usual.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, embeddings: Embeddings | None = None):
    self.cfg = cfg
    if embeddings is not None and embeddings.token.features != cfg.embed_size:
      raise ValueError(f"Shared embeddings have width {embeddings.token.features} but this "
                       f"encoder's embed_size is {cfg.embed_size}; set embedding_size to match.")
    with nnx.use_eager_sharding(False):  # logical axis names are metadata; the trainer shards.
      self.embeddings = embeddings if embeddings is not None else Embeddings(cfg, rngs=rngs)
      self.embed_proj = (dense(cfg, cfg.embed_size, cfg.hidden_size, ("embed", "embed_out"),
                               rngs=rngs) if cfg.embed_size != cfg.hidden_size else None)
      self.first_block = (Block(cfg, rngs=rngs, attn_norm=False)
                          if cfg.scan_layers and not cfg.first_attn_norm else None)
      if cfg.scan_layers:
        stacked = cfg.num_layers - (self.first_block is not None)

        @nnx.split_rngs(splits=stacked)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_blocks(rngs):
          return Block(cfg, rngs=rngs)
        self.blocks = make_blocks(rngs) if stacked else None
      else:
        self.blocks = nnx.List([Block(cfg, rngs=rngs, attn_norm=cfg.first_attn_norm or i > 0)
                                for i in range(cfg.num_layers)])
      self.final_ln = layer_norm(cfg, cfg.hidden_size, rngs=rngs) if cfg.norm_first else None

  def __call__(self, input_ids_BxT, mask_BxT=None, token_types_BxT=None,
               segment_ids_BxT=None, positions_BxT=None, *, dropout_rng=None) -> EncoderOutput:
    """Encodes a batch.

    Args:
      input_ids_BxT: int token ids in [0, vocab_size).
      mask_BxT: True/1 at real tokens, False/0 at padding. Default: `input_ids != pad_token_id`.
      token_types_BxT: segment A/B ids in [0, type_vocab_size). Default: zeros.
      segment_ids_BxT: packed rows: 1..k for the k examples in a row, 0 at padding; attention
        then stays inside each example. Default: no packing.
      positions_BxT: position ids (the learned table's, ALiBi's and RoPE's). Default: 0..T-1,
        restarting at every packed example.
      dropout_rng: a PRNG key; required in train mode when dropout > 0.
    Validation (ids range, lengths, shapes) runs here on concrete inputs, outside jit; under
    jit only the static shape checks run.
    """
    cfg = self.cfg
    input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT, positions_BxT = validate_inputs(
        cfg, input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT, positions_BxT)
    if _dropout_active(self) and dropout_rng is None:
      raise ValueError("The model is in train mode (dropout on) but dropout_rng is None; pass "
                       "dropout_rng=jax.random.fold_in(key, step) or call model.eval().")
    x_BxTxD = self.embeddings(input_ids_BxT, token_types_BxT, positions_BxT,
                              dropout_rng=fold_rng(dropout_rng, 0))
    if self.embed_proj is not None:
      x_BxTxD = self.embed_proj(x_BxTxD)
    x_BxTxD = batch_split(x_BxTxD)
    if may_use_pallas(cfg.attention_impl, cfg.backend):
      mask_Bx1xTxT = KeyMask(mask_BxT, segment_ids_BxT)  # the kernel takes segment ids
    else:
      mask_Bx1xTxT = make_attention_mask(mask_BxT, segment_ids_BxT)
    bias_BxNxTxT = (AlibiBias.from_positions(positions_BxT, cfg.num_heads)
                    if cfg.position_bias == "alibi" else None)
    ctx = (mask_Bx1xTxT, bias_BxNxTxT, positions_BxT if cfg.rope else None)
    layer_rng = fold_rng(dropout_rng, 1)
    if cfg.scan_layers:
      x_BxTxD = self._scan_blocks(x_BxTxD, layer_rng, *ctx)
    else:
      for i, block in enumerate(self.blocks):
        x_BxTxD = self._call_block(block, x_BxTxD, fold_rng(layer_rng, i), *ctx,
                                   is_global=cfg.global_layers[i])
    if self.final_ln is not None:
      x_BxTxD = batch_split(self.final_ln(x_BxTxD))
    return EncoderOutput(hidden_BxTxD=x_BxTxD, mask_BxT=mask_BxT)

  def _remat(self, fn):
    if self.cfg.remat_policy == "none":
      return fn
    return nnx.remat(fn, policy=_REMAT[self.cfg.remat_policy])

  def _call_block(self, block, x_BxTxD, rng, mask, bias, positions, *, is_global: bool):
    """One unscanned block; its kind is static (bound here, never traced by remat)."""
    call = lambda blk, *args: type(blk).__call__(blk, *args, is_global=is_global)
    return self._remat(call)(block, x_BxTxD, mask, rng, bias, positions)

  def _scan_blocks(self, x_BxTxD, layer_rng, mask_Bx1xTxT, bias_BxNxTxT, positions_BxT):
    """[first_block, then] the stacked blocks in one nnx.scan. Where the stack has local and
    global layers their kinds are scanned beside the parameters; else nothing is."""
    cfg, first = self.cfg, 0
    rngs = None if layer_rng is None else jax.random.split(layer_rng, cfg.num_layers)
    if self.first_block is not None:
      x_BxTxD = self._call_block(self.first_block, x_BxTxD, None if rngs is None else rngs[0],
                                 mask_Bx1xTxT, bias_BxNxTxT, positions_BxT,
                                 is_global=cfg.global_layers[0])
      first = 1
    if self.blocks is None:
      return x_BxTxD
    kinds = cfg.global_layers[first:]
    mixed = len(set(kinds)) > 1
    kinds_L = jnp.asarray(kinds) if mixed else None
    if rngs is not None and first:
      rngs = rngs[first:]
    if mixed:  # the kind is traced: a scanned input
      call = self._remat(type(self.blocks).__call__)
    else:  # one kind: bound statically, as in an unscanned block
      call = self._remat(lambda blk, *args: type(blk).__call__(blk, *args[:5],
                                                                is_global=kinds[0]))
    body = nnx.scan(
        lambda x, block, mask, rng, bias, pos, kind: call(block, x, mask, rng, bias, pos, kind),
        in_axes=(nnx.Carry, 0, None, None if rngs is None else 0, None, None,
                 0 if mixed else None),
        out_axes=nnx.Carry, transform_metadata={nnx.PARTITION_NAME: "layers"})
    return body(x_BxTxD, self.blocks, mask_Bx1xTxT, rngs, bias_BxNxTxT, positions_BxT, kinds_L)


def _dropout_active(module: nnx.Module) -> bool:
  return any(not m.deterministic and m.rate > 0
             for _, m in nnx.iter_modules(module) if isinstance(m, nnx.Dropout))


def _concrete(x: Any) -> bool:
  return not isinstance(x, jax.core.Tracer)


def validate_inputs(cfg: ModelConfig, input_ids, mask=None, token_types=None, segment_ids=None,
                    positions=None):
  """Checks shapes (always) and value ranges (when concrete) and fills defaults.

  Raises ValueError naming the argument and the limit, instead of XLA's silent clamping of
  out-of-range gathers (an id >= vocab_size would otherwise read the last embedding row).
  """
  input_ids = jnp.asarray(input_ids)
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be [batch, length]; got shape {input_ids.shape}. "
                     "Add a batch axis for a single sequence (ids[None]).")
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be integers; got dtype {input_ids.dtype}.")
  b, t = input_ids.shape
  if t > cfg.max_positions:
    raise ValueError(f"input_ids has length {t} > max_positions={cfg.max_positions}; truncate "
                     f"the sequences or build the model with a larger max_positions.")
  named = {"mask": mask, "token_types": token_types, "segment_ids": segment_ids,
           "positions": positions}
  for name, arr in named.items():
    if arr is not None and jnp.shape(arr) != (b, t):
      raise ValueError(f"{name} has shape {jnp.shape(arr)} but input_ids has shape {(b, t)}; "
                       f"they must match.")
  mask = (input_ids != cfg.pad_token_id) if mask is None else jnp.asarray(mask).astype(bool)
  token_types = (jnp.zeros_like(input_ids) if token_types is None
                 else jnp.asarray(token_types).astype(jnp.int32))
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if segment_ids is not None:
      positions = packed_positions(jnp.asarray(segment_ids))
  positions = jnp.asarray(positions).astype(jnp.int32)
  if _concrete(input_ids):
    _check_range("input_ids", input_ids, cfg.vocab_size, "vocab_size")
  if _concrete(token_types):
    _check_range("token_types", token_types, max(cfg.type_vocab_size, 1), "type_vocab_size")
  if _concrete(positions):
    _check_range("positions", positions, cfg.max_positions, "max_positions")
  return input_ids, mask, token_types, segment_ids, positions


def _check_range(name, arr, limit, limit_name):
  arr = np.asarray(arr)  # concrete here; numpy keeps the check out of any enclosing trace
  if arr.size == 0:
    return
  lo, hi = int(arr.min()), int(arr.max())
  if lo < 0 or hi >= limit:
    raise ValueError(f"{name} has values in [{lo}, {hi}] but must lie in [0, {limit}) "
                     f"({limit_name}={limit}).")


def packed_positions(segment_ids_BxT: jax.Array) -> jax.Array:
  """Position ids that restart at 0 at the first token of every packed example."""
  t = segment_ids_BxT.shape[1]
  idx_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids_BxT.shape)
  starts_BxT = jnp.concatenate(
      [jnp.ones_like(segment_ids_BxT[:, :1], dtype=bool),
       segment_ids_BxT[:, 1:] != segment_ids_BxT[:, :-1]], axis=1)
  start_idx_BxT = jax.lax.cummax(jnp.where(starts_BxT, idx_BxT, 0), axis=1)
  return idx_BxT - start_idx_BxT
