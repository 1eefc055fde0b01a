"""Whole models: `BertModel` (encoder + pooler, = HF BertModel) and `BertForPreTraining`
(+ MLM head and optional NSP head, = HF BertForPreTraining when nsp=True)."""
from __future__ import annotations

import jax
from flax import nnx

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.encoder import Encoder, EncoderOutput
from encoder_jax.model.heads import MlmHead, NspHead, Pooler


class BertModel(nnx.Module):
  """Encoder + optional [CLS] pooler. `__call__` returns (EncoderOutput, pooled or None)."""

  def __init__(self, cfg: ModelConfig, *, pooler: bool = True, rngs: nnx.Rngs):
    self.cfg = cfg
    self.encoder = Encoder(cfg, rngs=rngs)
    self.pooler = Pooler(cfg, rngs=rngs) if pooler else None

  def __call__(self, input_ids_BxT, mask_BxT=None, token_types_BxT=None, segment_ids_BxT=None,
               positions_BxT=None, *, dropout_rng=None
               ) -> tuple[EncoderOutput, jax.Array | None]:
    out = self.encoder(input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT,
                       positions_BxT, dropout_rng=dropout_rng)
    pooled_BxD = None if self.pooler is None else self.pooler(out.hidden_BxTxD)
    return out, pooled_BxD


class BertForPreTraining(nnx.Module):
  """BERT with its pre-training heads. With `nsp=False` there is no pooler, no NSP parameter
  and no NSP output at all (RoBERTa's FULL-/DOC-SENTENCES formats)."""

  def __init__(self, cfg: ModelConfig, *, nsp: bool = True, rngs: nnx.Rngs):
    self.cfg = cfg
    self.bert = BertModel(cfg, pooler=nsp, rngs=rngs)
    self.mlm = MlmHead(cfg, rngs=rngs)
    self.nsp = NspHead(cfg, rngs=rngs) if nsp else None

  def __call__(self, input_ids_BxT, mask_BxT=None, token_types_BxT=None, segment_ids_BxT=None,
               positions_BxT=None, *, mlm_positions_BxP=None, dropout_rng=None):
    """Returns (mlm_logits [B,P,V] or [B,T,V], nsp_logits [B,2] or None, EncoderOutput)."""
    out, pooled_BxD = self.bert(input_ids_BxT, mask_BxT, token_types_BxT, segment_ids_BxT,
                                positions_BxT, dropout_rng=dropout_rng)
    mlm_logits = self.mlm(out.hidden_BxTxD, self.bert.encoder.embeddings.token,
                          mlm_positions_BxP)
    nsp_logits_Bx2 = None if self.nsp is None else self.nsp(pooled_BxD)
    return mlm_logits, nsp_logits_Bx2, out
