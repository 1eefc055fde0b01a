"""A Transformer decoder on the encoder's memory: seq2seq on top of `EncoderOutput`.

It lives with its test (test_decoder.py, and test_block_switches.py's RoPE / window decoder):
nothing in encoder_jax trains a decoder, so it is the proof that an encoder's output serves as
a decoder's memory (all T vectors and the padding mask), built from the package's own layers
(encoder_jax.model: attention, sublayers, embeddings, tied logits).

  model = Seq2Seq(enc_cfg, dec_cfg, rngs=nnx.Rngs(0))
  logits_BxTxV = model(src_ids_BxS, tgt_in_BxT)                       # teacher forcing
  out_BxL = greedy_decode(model, src_ids_BxS, bos_id=1, eos_id=2, max_len=12)

The encoder hands over all S vectors and its padding mask (`EncoderOutput`); every decoder
block attends causally to the target so far, then to that memory with the memory's mask as the
key mask (padded memory slots are never attended, whatever they hold), then applies its FFN.

Shapes in names: B batch, T target length, S memory (source) length, D decoder width,
M memory width, N heads, H head dim, V vocabulary. Masks are boolean, True = may attend.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.model.attention import MultiHeadAttention, init_normal, param
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import fold_rng
from encoder_jax.model.encoder import (Block, Embeddings, Encoder, EncoderOutput, layer_norm,
                                       residual, validate_inputs)
from encoder_jax.model.sublayers import ffn
from encoder_jax.model.heads import tied_logits


def make_causal_mask(mask_BxT: jax.Array) -> jax.Array:
  """Boolean [B, 1, T, T]: query i sees key j iff j <= i and key j is a real token."""
  t = mask_BxT.shape[1]
  causal_1x1xTxT = jnp.tril(jnp.ones((t, t), bool))[None, None]
  return causal_1x1xTxT & mask_BxT.astype(bool)[:, None, None, :]


def make_memory_mask(memory_mask_BxS: jax.Array, t: int) -> jax.Array:
  """Boolean [B, 1, T, S]: every target position sees exactly the real memory slots."""
  b, s = memory_mask_BxS.shape
  return jnp.broadcast_to(memory_mask_BxS.astype(bool)[:, None, None, :], (b, 1, t, s))


class CrossAttention(MultiHeadAttention):
  """Multi-head attention from decoder queries to the encoder's memory.

  Keys and values come from one fused [M, 2, N, H] kernel (one matmul over the memory, as the
  self-attention fuses Q, K and V), queries from a [D, N, H] kernel; both sharded on 'heads'.
  The attention itself is MultiHeadAttention's (`attention_path`): `jax.nn.dot_product_attention`
  unless attention-probability dropout is on (explicit fp32 softmax), and a
  query that may see no memory slot (a row of pure padding) outputs zeros. No RoPE and no
  window here: decoder and memory positions are not one axis, so every query sees all of the
  memory (ModelConfig.rope / local_window act on the decoder's self-attention).
  """

  def __init__(self, cfg: ModelConfig, *, memory_size: int | None = None, rngs: nnx.Rngs):
    # MultiHeadAttention.__init__ is not called: its fused QKV kernel reads one input only.
    d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    m = memory_size or d
    init, pdt = init_normal(cfg), cfg.storage_dtype
    self.q_kernel = param(init(rngs.params(), (d, n, h), pdt), ("embed", "heads", "kv"))
    self.q_bias = param(jnp.zeros((n, h), pdt), ("heads", "kv")) if cfg.linear_bias else None
    self.kv_kernel = param(init(rngs.params(), (m, 2, n, h), pdt),
                           ("embed", None, "heads", "kv"))
    self.kv_bias = (param(jnp.zeros((2, n, h), pdt), (None, "heads", "kv")) if cfg.linear_bias
                    else None)
    self._init_output(cfg, rngs)

  def __call__(self, x_BxTxD: jax.Array, memory: EncoderOutput, *,
               dropout_rng: jax.Array | None = None) -> jax.Array:
    q_BxTxNxH = self._project("btd,dnh->btnh", x_BxTxD, self.q_kernel, self.q_bias)
    kv_BxSx2xNxH = self._project("bsm,mcnh->bscnh", memory.hidden_BxTxD, self.kv_kernel,
                                 self.kv_bias)
    k_BxSxNxH, v_BxSxNxH = kv_BxSx2xNxH[:, :, 0], kv_BxSx2xNxH[:, :, 1]
    mask_Bx1xTxS = make_memory_mask(memory.mask_BxT, x_BxTxD.shape[1])
    out_BxTxNxH, _ = self._attend(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_Bx1xTxS, dropout_rng)
    # No real memory slot (an empty source): zeros, never an average of padding.
    any_Bx1x1x1 = jnp.any(memory.mask_BxT, axis=-1)[:, None, None, None]
    out_BxTxNxH = jnp.where(any_Bx1x1x1, out_BxTxNxH, 0)
    return self._project("btnh,nhd->btd", out_BxTxNxH, self.out_kernel, self.out_bias)


class DecoderBlock(Block):
  """One Transformer decoder layer: the encoder's Block (its self-attention, made causal by the
  mask it is given, and its FFN, with every switch of the config: norm, biases, GLU, RoPE and
  a local window) with a cross-attention to the memory between the two.

  post-LN (`norm_first=False`): x = LN(x + Drop(SelfAttn(x)));  x = LN(x + Drop(Cross(x, mem)))
                                x = LN(x + Drop(FFN(x)))
  pre-LN (`norm_first=True`):   x = x + Drop(SelfAttn(LN(x)));  x = x + Drop(Cross(LN(x), mem))
                                x = x + Drop(FFN(LN(x)))
  Equal to torch.nn.TransformerDecoderLayer(norm_first=False|True, activation="gelu") in eval
  mode (tests/model/test_decoder.py). `self_norm` False: no self-attention pre-norm
  (first_attn_norm).
  """

  def __init__(self, cfg: ModelConfig, *, memory_size: int | None = None, rngs: nnx.Rngs,
               self_norm: bool = True):
    super().__init__(cfg, rngs=rngs, attn_norm=self_norm)
    self.cross_attn = CrossAttention(cfg, memory_size=memory_size, rngs=rngs)
    self.ln_cross = layer_norm(cfg, cfg.hidden_size, rngs=rngs)

  def __call__(self, x_BxTxD, self_mask_Bx1xTxT, memory: EncoderOutput, dropout_rng=None,
               positions_BxT=None, is_global: bool = True):
    drop = lambda i: lambda y: self.dropout(y, rngs=fold_rng(dropout_rng, i))
    self_attn = lambda y: self.attn(y, self_mask_Bx1xTxT, dropout_rng=fold_rng(dropout_rng, 3),
                                    positions_BxT=positions_BxT, is_global=is_global)
    cross = lambda y: self.cross_attn(y, memory, dropout_rng=fold_rng(dropout_rng, 4))
    ffn_ = lambda y: ffn(y, self.ffn_in, self.ffn_out, self.act)
    x_BxTxD = residual(x_BxTxD, self_attn, self.ln_attn, drop(0), self.norm_first)
    x_BxTxD = residual(x_BxTxD, cross, self.ln_cross, drop(1), self.norm_first)
    return residual(x_BxTxD, ffn_, self.ln_ffn, drop(2), self.norm_first)


class Decoder(nnx.Module):
  """Embeddings (token + learned position, LayerNorm) -> L decoder blocks -> final LN (pre-LN).

  The blocks are unrolled (decoders here are small; the encoder is where scanning pays).
  `memory_size`: the encoder's width, when it differs from this decoder's hidden_size.
  """

  def __init__(self, cfg: ModelConfig, *, memory_size: int | None = None, rngs: nnx.Rngs):
    if cfg.embed_size != cfg.hidden_size:
      raise ValueError(f"Decoder: embedding_size={cfg.embed_size} != hidden_size="
                       f"{cfg.hidden_size}; the decoder has no embedding projection, leave "
                       "embedding_size unset.")
    self.cfg = cfg
    self.embeddings = Embeddings(cfg, rngs=rngs)
    self.blocks = nnx.List([DecoderBlock(cfg, memory_size=memory_size, rngs=rngs,
                                         self_norm=cfg.first_attn_norm or i > 0)
                            for i in range(cfg.num_layers)])
    self.final_ln = layer_norm(cfg, cfg.hidden_size, rngs=rngs) if cfg.norm_first else None

  def __call__(self, ids_BxT, memory: EncoderOutput, mask_BxT=None, *,
               dropout_rng=None) -> jax.Array:
    """Hidden states [B, T, D] of the target `ids_BxT` (mask default: ids != pad)."""
    ids_BxT, mask_BxT, types_BxT, _, positions_BxT = validate_inputs(self.cfg, ids_BxT, mask_BxT)
    x_BxTxD = self.embeddings(ids_BxT, types_BxT, positions_BxT,
                              dropout_rng=fold_rng(dropout_rng, 0))
    self_mask_Bx1xTxT = make_causal_mask(mask_BxT)
    rope_positions_BxT = positions_BxT if self.cfg.rope else None
    for i, block in enumerate(self.blocks):
      x_BxTxD = block(x_BxTxD, self_mask_Bx1xTxT, memory, fold_rng(dropout_rng, i + 1),
                      rope_positions_BxT, self.cfg.global_layers[i])
    return x_BxTxD if self.final_ln is None else self.final_ln(x_BxTxD)


class Seq2Seq(nnx.Module):
  """Encoder + Decoder cross-attending to its memory + LM head tied to the target embedding."""

  def __init__(self, enc_cfg: ModelConfig, dec_cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.encoder = Encoder(enc_cfg, rngs=rngs)
    self.decoder = Decoder(dec_cfg, memory_size=enc_cfg.hidden_size, rngs=rngs)
    self.lm_bias = nnx.Param(jnp.zeros((dec_cfg.vocab_size,), dec_cfg.storage_dtype),
                             out_sharding=("vocab",), eager_sharding=False)

  def encode(self, src_ids_BxS, src_mask_BxS=None, *, dropout_rng=None) -> EncoderOutput:
    return self.encoder(src_ids_BxS, src_mask_BxS, dropout_rng=dropout_rng)

  def decode(self, tgt_ids_BxT, memory: EncoderOutput, tgt_mask_BxT=None, *,
             dropout_rng=None) -> jax.Array:
    """fp32 next-token logits [B, T, V] at every target position."""
    h_BxTxD = self.decoder(tgt_ids_BxT, memory, tgt_mask_BxT, dropout_rng=dropout_rng)
    logits_BxTxV = tied_logits(h_BxTxD, self.decoder.embeddings.token, self.decoder.cfg)
    return logits_BxTxV + self.lm_bias[...].astype(jnp.float32)[None, None]

  def __call__(self, src_ids_BxS, tgt_ids_BxT, src_mask_BxS=None, tgt_mask_BxT=None, *,
               dropout_rng=None) -> jax.Array:
    memory = self.encode(src_ids_BxS, src_mask_BxS, dropout_rng=fold_rng(dropout_rng, 0))
    return self.decode(tgt_ids_BxT, memory, tgt_mask_BxT, dropout_rng=fold_rng(dropout_rng, 1))


@nnx.jit(static_argnames=("bos_id", "eos_id", "max_len"))
def greedy_decode(model: Seq2Seq, src_ids_BxS, src_mask_BxS=None, *, bos_id: int, eos_id: int,
                  max_len: int) -> jax.Array:
  """Greedy decoding: [B, max_len] ids starting with `bos_id`; after `eos_id`, pads.

  The memory is encoded once; each step re-runs the decoder over the fixed-size buffer (the
  causal mask keeps later, not yet written slots invisible), which is cheap at toy lengths
  and needs no key/value cache.
  """
  memory = model.encode(src_ids_BxS, src_mask_BxS)
  b, pad = src_ids_BxS.shape[0], model.decoder.cfg.pad_token_id
  ids_BxL = jnp.full((b, max_len), pad, jnp.int32).at[:, 0].set(bos_id)
  done_B = jnp.zeros((b,), bool)

  def step(t, carry):
    ids_BxL, done_B = carry
    logits_BxV = model.decode(ids_BxL, memory, jnp.ones_like(ids_BxL, bool))[:, t]
    next_B = jnp.where(done_B, pad, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32))
    return ids_BxL.at[:, t + 1].set(next_B), done_B | (next_B == eos_id)

  ids_BxL, _ = jax.lax.fori_loop(0, max_len - 1, step, (ids_BxL, done_B))
  return ids_BxL
