"""ELECTRA = a small MLM generator + a discriminator, with tied embeddings.

The generator shares the discriminator's whole `Embeddings` module (token, position and
token-type tables and their LayerNorm: the paper's "tied embeddings"; NNX stores the shared
module once, so it is one parameter with gradient from both losses). When widths differ each
network has its own projection from the embedding width. The generator's MLM decoder is tied to
the shared token table. Objectives live in encoder_jax.objectives.electra.
"""
from __future__ import annotations

import jax
from flax import nnx

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.encoder import Encoder, EncoderOutput
from encoder_jax.model.heads import MlmHead, NspHead, Pooler, RtdHead


def generator_config(disc: ModelConfig, hidden_frac: float = 0.25,
                     layers_frac: float = 1.0) -> ModelConfig:
  """google-research/electra's `get_generator_config`: hidden, FFN (4x) and heads scale by
  `hidden_frac`; depth by `layers_frac`; the embedding width stays the discriminator's so the
  tables can be shared. Heads keep the discriminator's head width (at least 1 head): the
  repo's `hidden / 64` for its 64-wide heads, and for narrower heads (a demo model of 8 heads
  of 16) still several heads, which an ALiBi model needs for its steeper slopes."""
  if not 0 < hidden_frac <= 1 or not 0 < layers_frac <= 1:
    raise ValueError(f"generator hidden_frac={hidden_frac} and layers_frac={layers_frac} must "
                     "lie in (0, 1]; ELECTRA uses 0.25-0.5 and 1.0.")
  d = max(1, int(round(disc.hidden_size * hidden_frac)))
  heads = max(1, d // disc.head_dim)
  while d % heads:  # a width that is not a multiple of the head width
    heads -= 1
  return disc.replace(hidden_size=d, ffn_size=4 * d if d != disc.hidden_size else disc.ffn_size,
                      num_heads=heads, num_layers=max(1, int(round(disc.num_layers * layers_frac))),
                      embedding_size=disc.embed_size)


class ElectraModel(nnx.Module):
  """Generator (encoder + tied MLM head) and discriminator (encoder + RTD head).

  main_head: "rtd" (ELECTRA), "mlm" (Replace-MLM: the discriminator predicts originals at the
  masked positions) or "copy_mlm" (All-Tokens MLM: an MLM head plus a per-token copy logit,
  which reuses the RTD head's shape). `nsp` adds a pooler + NSP head to the discriminator.
  """

  def __init__(self, disc_cfg: ModelConfig, gen_cfg: ModelConfig, *, main_head: str = "rtd",
               nsp: bool = False, rngs: nnx.Rngs):
    if main_head not in ("rtd", "mlm", "copy_mlm"):
      raise ValueError(f"main_head={main_head!r}; use 'rtd', 'mlm' or 'copy_mlm'.")
    if gen_cfg.embed_size != disc_cfg.embed_size or gen_cfg.vocab_size != disc_cfg.vocab_size:
      raise ValueError("The generator must have the discriminator's vocab_size and embedding "
                       "width to tie embeddings; build it with generator_config(disc_cfg).")
    self.disc_cfg, self.gen_cfg, self.main_head = disc_cfg, gen_cfg, main_head
    self.discriminator = Encoder(disc_cfg, rngs=rngs)
    self.generator = Encoder(gen_cfg, rngs=rngs, embeddings=self.discriminator.embeddings)
    self.gen_mlm = MlmHead(gen_cfg, rngs=rngs)
    self.rtd = RtdHead(disc_cfg, rngs=rngs) if main_head in ("rtd", "copy_mlm") else None
    self.disc_mlm = MlmHead(disc_cfg, rngs=rngs) if main_head in ("mlm", "copy_mlm") else None
    self.pooler = Pooler(disc_cfg, rngs=rngs) if nsp else None
    self.nsp = NspHead(disc_cfg, rngs=rngs) if nsp else None

  @property
  def token_embed(self) -> nnx.Embed:
    return self.discriminator.embeddings.token


class ElectraDiscriminator(nnx.Module):
  """Encoder + optional RTD head (= HF ElectraForPreTraining; without the head, ElectraModel).

  `__call__` returns (RTD logits [B, T] or None, EncoderOutput).
  """

  def __init__(self, cfg: ModelConfig, *, rtd: bool = True, rngs: nnx.Rngs):
    self.cfg = cfg
    self.encoder = Encoder(cfg, rngs=rngs)
    self.rtd = RtdHead(cfg, rngs=rngs) if rtd else None

  def __call__(self, input_ids_BxT, mask_BxT=None, token_types_BxT=None, segment_ids_BxT=None,
               positions_BxT=None, *, dropout_rng=None
               ) -> tuple[jax.Array | None, EncoderOutput]:
    out = self.encoder(input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT,
                       positions_BxT, dropout_rng=dropout_rng)
    return (None if self.rtd is None else self.rtd(out.hidden_BxTxD)), out


class ElectraGenerator(nnx.Module):
  """Encoder + MLM head tied to its own token table (= HF ElectraForMaskedLM).

  `__call__` returns (MLM logits [B, P, V] at `mlm_positions_BxP`, or [B, T, V], EncoderOutput).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.encoder = Encoder(cfg, rngs=rngs)
    self.mlm = MlmHead(cfg, rngs=rngs)

  def __call__(self, input_ids_BxT, mask_BxT=None, token_types_BxT=None, segment_ids_BxT=None,
               positions_BxT=None, *, mlm_positions_BxP=None, dropout_rng=None
               ) -> tuple[jax.Array, EncoderOutput]:
    out = self.encoder(input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT,
                       positions_BxT, dropout_rng=dropout_rng)
    return self.mlm(out.hidden_BxTxD, self.encoder.embeddings.token, mlm_positions_BxP), out
