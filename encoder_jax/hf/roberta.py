"""HF RoBERTa <-> encoder_jax, through safetensors (never pickle).

RoBERTa (Liu et al. 2019) is BERT's post-LN encoder trained by MLM alone; in transformers it
differs from BERT in three places, all handled here:

  * positions: HF numbers the real tokens of a row padding_idx + 1, padding_idx + 2, ... and
    gives padding the position padding_idx (= pad_token_id, 1 in RoBERTa's vocabulary), so its
    table has max_position_embeddings = max_positions + padding_idx + 1 rows (514 for 512
    positions). Ours numbers positions 0..T-1. For right-padded rows (what every encoder_jax
    batch is) our row i is HF's row padding_idx + 1 + i: import drops HF's first
    padding_idx + 1 rows (read only at padding, whose outputs are masked), export writes them
    as zeros (HF initialises the padding row to zeros too). Left padding would shift HF's
    positions; encoder_jax never left-pads.
  * one token type (type_vocab_size=1); a model without any (type_vocab_size=0) exports as
    one type of zeros.
  * the LM head (RobertaLMHead): dense + exact GELU + LayerNorm + decoder tied to the token
    embedding, with a bias: our MlmHead when model.activation is "gelu" (HF applies exact GELU
    there whatever hidden_act says).
The encoder layers are BERT's (same tensor names): bert.py's per-layer maps.

Import: `load_hf_roberta(dir)`: RobertaForMaskedLM -> our BertForPreTraining(nsp=False);
RobertaModel -> our BertModel (with its pooler when the folder has one).
Export: `export_hf_roberta(model, dir)`: BertForPreTraining without NSP -> RobertaForMaskedLM,
BertModel -> RobertaModel. import(export(params)) is bit-exact.

Tokenizer: a run tokenized with encoder_jax's WordPiece vocab exports it as vocab.txt with a
tokenizer_config.json naming BertTokenizer (AutoTokenizer reads tokenizer_class) and
model_input_names without token_type_ids (RoBERTa has one type).
"""
from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
from flax import nnx

from encoder_jax.hf.bert import (_assign, _dense_from_hf, _dense_to_hf, _encoder_from_hf,
                                 _encoder_to_hf, _mlm_head_from_hf, _mlm_head_to_hf,
                                 _pure_params, _taking, hf_config, hf_config_to_model_config,
                                 read_hf_folder, write_hf_folder)
from encoder_jax.hf.families import Family, Gap, Weights, Written, encoder_gaps, mlm_head_gaps
from encoder_jax.model.bert import BertForPreTraining, BertModel
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.pretraining import ObjectiveConfig

_POS = "embeddings.position_embeddings.weight"
# Buffers and tied copies that carry no parameter of their own.
_IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids",
                 "lm_head.decoder.weight", "lm_head.decoder.bias")


def position_offset(pad_id: int) -> int:
  """HF RoBERTa's table row of our position 0 (padding_idx + 1)."""
  return pad_id + 1


# ----------------------------------------------------------------------------- configs
def model_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  """FAMILY.model_config: our ModelConfig of a RoBERTa config.json (HF's RobertaConfig
  defaults where it is silent: pad 1, one token type)."""
  pad = hf.get("pad_token_id", 1)
  rows = hf["max_position_embeddings"] - position_offset(pad)
  if rows <= 0:
    raise ValueError(f"RoBERTa config: max_position_embeddings="
                     f"{hf['max_position_embeddings']} leaves no position after the "
                     f"{position_offset(pad)} rows HF reserves below pad_token_id + 1.")
  return hf_config_to_model_config({"type_vocab_size": 1, **hf, "pad_token_id": pad,
                                    "max_position_embeddings": rows}, **overrides)


def hf_roberta_gaps(cfg: ModelConfig, *, lm_head: bool) -> list[Gap]:
  """What in `cfg` HF RoBERTa cannot represent (with its LM head when `lm_head`)."""
  gaps = encoder_gaps(cfg)
  if cfg.embed_size != cfg.hidden_size:
    gaps.append(Gap(f"model.embedding_size={cfg.embed_size}",
                    f"HF RoBERTa has no embedding projection to hidden_size="
                    f"{cfg.hidden_size}", (("embedding_size", None),)))
  return gaps + (mlm_head_gaps(cfg, "RoBERTa") if lm_head else [])


def run_gaps(cfg: ModelConfig, obj: ObjectiveConfig) -> list[Gap]:
  """FAMILY.gaps: a RoBERTa-shaped run: MLM alone, one token type (or none), no projection.
  Two token types HF RoBERTa could hold, but a run with them is BERT-shaped, and BERT (next
  in hf.FAMILIES) exports it."""
  gaps = hf_roberta_gaps(cfg, lm_head=True)
  if cfg.type_vocab_size > 1:
    gaps.append(Gap(f"model.type_vocab_size={cfg.type_vocab_size}", "RoBERTa has one token "
                    "type", (("type_vocab_size", 1),)))
  if obj.is_electra:
    gaps.append(Gap(f"objective.objective={obj.objective!r}", "RoBERTa is an MLM model",
                    (("objective.objective", "mlm"),)))
  if obj.sentence_task != "none":
    gaps.append(Gap(f"objective.sentence_task={obj.sentence_task!r}", "RoBERTa has no "
                    "sentence-pair head", (("objective.sentence_task", "none"),)))
  return gaps


def roberta_hf_config(cfg: ModelConfig, architectures: list[str], *, lm_head: bool,
                      pad_id: int | None = None) -> dict[str, Any]:
  """config.json of `cfg` for HF RoBERTa; raises where it cannot represent it. `pad_id`: the
  tokenizer's pad id (default cfg.pad_token_id), which HF's positions are counted from."""
  pad = cfg.pad_token_id if pad_id is None else pad_id
  hf = hf_config(cfg, architectures, "roberta", hf_roberta_gaps(cfg, lm_head=lm_head))
  hf.update(max_position_embeddings=cfg.max_positions + position_offset(pad),
            pad_token_id=pad)
  return hf


# ----------------------------------------------------------------------------- tensors
def hf_roberta_tensors_to_params(t: dict[str, np.ndarray], cfg: ModelConfig
                                 ) -> tuple[dict[str, Any], dict[str, Any] | None]:
  """HF tensors -> ({"encoder", "pooler"?} of our BertModel, our {"mlm"} head or None)."""
  t = {k.removeprefix("roberta."): v for k, v in t.items() if not k.endswith(_IGNORED_KEYS)}
  offset = position_offset(cfg.pad_token_id)
  if _POS in t:
    t[_POS] = t[_POS][offset:]
  with _taking(t, "RoBERTa", f"this config (layers={cfg.num_layers}, hidden_size="
               f"{cfg.hidden_size})"):
    bert: dict[str, Any] = {"encoder": _encoder_from_hf(t, cfg)}
    if "pooler.dense.weight" in t:
      bert["pooler"] = {"dense": _dense_from_hf(t, "pooler.dense")}
    heads = None
    if "lm_head.bias" in t:
      heads = {"mlm": _mlm_head_from_hf(t, "lm_head.dense", "lm_head.layer_norm",
                                        "lm_head.bias")}
  return bert, heads


def params_to_hf_roberta_tensors(bert: dict[str, Any], cfg: ModelConfig, *,
                                 mlm: dict[str, Any] | None = None,
                                 pad_id: int | None = None) -> dict[str, np.ndarray]:
  """Our BertModel parameters (+ MLM head) -> HF RobertaModel (RobertaForMaskedLM) tensors."""
  offset = position_offset(cfg.pad_token_id if pad_id is None else pad_id)
  enc = _encoder_to_hf(bert["encoder"], cfg)
  table = enc[_POS]
  enc[_POS] = np.concatenate([np.zeros((offset, table.shape[1]), table.dtype), table])
  if bert.get("pooler"):
    enc.update(_dense_to_hf(bert["pooler"]["dense"], "pooler.dense"))
  if mlm is None:
    return enc
  out = {f"roberta.{k}": v for k, v in enc.items()}
  out.update(_mlm_head_to_hf(mlm, "lm_head.dense", "lm_head.layer_norm", "lm_head.bias"))
  return out


# ----------------------------------------------------------------------------- import / export
def read(path: str | os.PathLike, **config_overrides: Any) -> Weights:
  """FAMILY.read: a RobertaModel / RobertaForMaskedLM folder (a fine-tuned RoBERTa's task
  head has no counterpart here and is logged as unused)."""
  hf_cfg, tensors = read_hf_folder(path)
  cfg = model_config(hf_cfg, **config_overrides)
  bert, heads = hf_roberta_tensors_to_params(tensors, cfg)
  return Weights(cfg, bert["encoder"], bert.get("pooler"), heads)


def load_hf_roberta(path: str | os.PathLike, **config_overrides: Any
                    ) -> BertForPreTraining | BertModel:
  """A HF RoBERTa folder as our BertForPreTraining(nsp=False) (with an LM head) or BertModel,
  in eval mode. `config_overrides` change numerics, not shapes."""
  w = read(path, **config_overrides)
  if w.heads is not None:
    model = nnx.eval_shape(lambda: BertForPreTraining(w.cfg, nsp=False, rngs=nnx.Rngs(0)))
    params = {"bert": {"encoder": w.encoder}, **w.heads}
  else:
    model = nnx.eval_shape(lambda: BertModel(w.cfg, pooler=w.pooler is not None,
                                             rngs=nnx.Rngs(0)))
    params = {"encoder": w.encoder, **({"pooler": w.pooler} if w.pooler else {})}
  _assign(model, params)
  model.eval()
  return model


def export_hf_roberta(model: BertForPreTraining | BertModel, out_dir: str | os.PathLike, *,
                      vocab: str | os.PathLike | None = None, pad_id: int | None = None) -> str:
  """Writes what transformers' RobertaForMaskedLM (our BertForPreTraining without NSP) or
  RobertaModel (our BertModel) loads with nothing missing; returns the class. `pad_id`: the
  tokenizer's pad id (default model.cfg.pad_token_id)."""
  cfg = model.cfg
  if isinstance(model, BertForPreTraining):
    if model.nsp is not None:
      raise ValueError("HF RoBERTa has no NSP head: export a model with NSP as BERT "
                       "(export_hf_bert).")
    arch, bert, mlm = "RobertaForMaskedLM", model.bert, _pure_params(model.mlm)
  else:
    arch, bert, mlm = "RobertaModel", model, None
  hf_cfg = roberta_hf_config(cfg, [arch], lm_head=mlm is not None, pad_id=pad_id)
  tensors = params_to_hf_roberta_tensors(_pure_params(bert), cfg, mlm=mlm, pad_id=pad_id)
  write_hf_folder(out_dir, hf_cfg, tensors, vocab=vocab,
                  tokenizer={"model_input_names": ["input_ids", "attention_mask"]})
  return arch


def _export_run_model(model: BertForPreTraining, out_dir: pathlib.Path, *, vocab=None,
                      pad_id: int | None = None) -> list[Written]:
  """FAMILY.export: a RoBERTa-shaped run's BertForPreTraining (run_gaps found nothing)."""
  arch = export_hf_roberta(model, out_dir, vocab=vocab, pad_id=pad_id)
  return [Written(pathlib.Path(out_dir), arch, "AutoModelForMaskedLM",
                  lambda ids, mask: np.asarray(model(ids, mask)[0]))]


FAMILY = Family(name="RoBERTa", model_types=("roberta",), gaps=run_gaps,
                model_config=model_config, read=read, export=_export_run_model)
