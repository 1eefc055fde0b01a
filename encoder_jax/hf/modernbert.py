"""HF ModernBERT <-> encoder_jax, through safetensors (never pickle).

ModernBERT (Warner et al. 2024, arXiv 2412.13663) is encoder_jax's block with the switches of
`model.config.MODERNBERT_BLOCK`: pre-norm with the embedding norm in place of layer 0's
attention pre-norm, bias-free LayerNorms and linears, GeGLU, RoPE with a global and a local
theta, a 128-token sliding window in two layers of three, no position or type tables.

  represents(cfg)        None if HF ModernBERT computes what `cfg` computes, else why not
  load(dir)              HF ModernBertModel -> our BertModel (no pooler); ModernBertForMaskedLM
                         -> our BertForPreTraining(nsp=False) (`mlm=True`, the default when
                         the folder has the MLM head); (model, ModelConfig)
  export(model, dir)     BertModel(pooler=False) -> ModernBertModel; BertForPreTraining(nsp=
                         False) -> ModernBertForMaskedLM; ElectraModel -> its discriminator (see
                         `export`); `transformers.ModernBert*.from_pretrained(dir)` loads it
  hf_tensors_to_params / params_to_hf_tensors   the parameter map both ways, pure transposes and
                         reshapes, so import(export(params)) is bit-exact.

Layouts: torch Linear weights are [out, in] (ours [in, out]); HF's Wqkv [3D, D] is our fused
[D, 3, N, H] transposed (its output features are ordered (3, N, H), as `qkv.view(..., 3, -1,
head_dim)` reads them); HF's GeGLU `Wi` [2F, D] is our [D, 2, F] transposed, index 0 the half
HF activates (`input, gate = Wi(x).chunk(2)`); HF ModernBERT's MLM decoder is tied to the token
embedding, as ours. Layer 0 has no `attn_norm` in HF's checkpoints nor in ours (scanned, it is
`first_block`; the stacked `blocks` hold layers 1..L-1).

Dropout has other places in HF's module (its attention dropout also follows Wo, its MLP
dropout precedes Wo, its embedding dropout is its own); eval outputs do not depend on it.
Export writes hidden_dropout as embedding_dropout and mlp_dropout; import takes
embedding_dropout (with a warning if mlp_dropout differs).
"""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx

from encoder_jax.hf.families import Family, Gap, Weights, Written
from encoder_jax.hf.bert import (_assign, _pure_params, _taking, read_hf_folder,
                                 write_hf_folder)
from encoder_jax.model.bert import BertForPreTraining, BertModel
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.electra import ElectraModel
from encoder_jax.objectives.pretraining import ObjectiveConfig

_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}
_GLOBAL, _LOCAL = "full_attention", "sliding_attention"
# What HF ModernBERT always is; `represents` names each of these a config does not set.
_FIXED = (("norm_first", True, "post-LN blocks (model.norm_first=False)"),
          ("first_attn_norm", False, "an attention pre-norm in layer 0 (model.first_attn_norm"
           "=True; HF's layer 0 reads the embedding norm's output)"),
          ("embedding_norm", True, "no norm after the embeddings (model.embedding_norm=False)"),
          ("learned_positions", False, "a learned position table (model.learned_positions"
           "=True; HF ModernBERT has RoPE only)"),
          ("rope", True, "no rotary position embeddings (model.rope=False)"),
          ("glu", True, "a plain FFN (model.glu=False; HF's is gated)"),
          ("norm", "layernorm", "RMSNorm (model.norm='rmsnorm'; HF's is LayerNorm)"),
          ("position_bias", "none", "a position bias (model.position_bias; HF has none)"),
          ("type_vocab_size", 0, "token type embeddings (model.type_vocab_size > 0)"))


def encoder_gaps(cfg: ModelConfig) -> list[Gap]:
  """What in `cfg` HF ModernBERT has no place for (empty: it computes what `cfg` computes)."""
  gaps = [Gap(f"model.{name}={getattr(cfg, name)!r}",
              f"HF ModernBERT cannot hold {why.split(' (')[0]}", ((name, want),))
          for name, want, why in _FIXED if getattr(cfg, name) != want]
  if cfg.embed_size != cfg.hidden_size:
    gaps.append(Gap(f"model.embedding_size={cfg.embed_size}", "HF ModernBERT has no embedding "
                    f"projection to hidden_size={cfg.hidden_size}", (("embedding_size", None),)))
  return gaps


def represents(cfg: ModelConfig) -> str | None:
  """None if HF ModernBERT computes what `cfg` computes; else the reasons, one phrase each."""
  gaps = [why for name, want, why in _FIXED if getattr(cfg, name) != want]
  if cfg.embed_size != cfg.hidden_size:
    gaps.append(f"an embedding projection (model.embedding_size={cfg.embed_size} != "
                f"hidden_size={cfg.hidden_size})")
  return "; ".join(gaps) or None


def run_gaps(cfg: ModelConfig, obj: ObjectiveConfig) -> list[Gap]:
  """FAMILY.gaps: a run whose (discriminator's) encoder is ModernBERT's block, MLM or any
  ELECTRA objective (its discriminator is written), without a sentence task (HF ModernBERT has
  no pooler or NSP head)."""
  gaps = encoder_gaps(cfg)
  if obj.sentence_task != "none":
    gaps.append(Gap(f"objective.sentence_task={obj.sentence_task!r}", "HF ModernBERT has no "
                    "pooler or sentence-pair head", (("objective.sentence_task", "none"),)))
  return gaps


# ----------------------------------------------------------------------------- configs
def _layer_kinds(hf: dict[str, Any]) -> tuple[int, int]:
  """(local_window, global_every) of a HF config's layer pattern; raises if it has none."""
  n = hf["num_hidden_layers"]
  types = hf.get("layer_types") or [
      _LOCAL if i % hf.get("global_attn_every_n_layers", 3) else _GLOBAL for i in range(n)]
  if _LOCAL not in types:
    return 0, 1
  every = types[1:].index(_GLOBAL) + 1 if _GLOBAL in types[1:] else n
  if types != [_GLOBAL if i % every == 0 else _LOCAL for i in range(n)]:
    raise ValueError(f"HF layer_types={types} is not 'every k-th layer global from layer 0', "
                     "the one layer pattern encoder_jax's ModelConfig.global_every describes.")
  return hf.get("local_attention", 128), every


def _rope_thetas(hf: dict[str, Any]) -> tuple[float, float]:
  """(global, local) theta from `rope_parameters` or the older global/local_rope_theta keys."""
  rope = hf.get("rope_parameters") or {}
  for kind in (_GLOBAL, _LOCAL):
    if (rope.get(kind) or {}).get("rope_type", "default") != "default":
      raise ValueError(f"HF rope_parameters[{kind!r}] uses rope_type="
                       f"{rope[kind]['rope_type']!r}; only the default RoPE converts.")
  return (float((rope.get(_GLOBAL) or {}).get("rope_theta", hf.get("global_rope_theta", 160_000))),
          float((rope.get(_LOCAL) or {}).get("rope_theta", hf.get("local_rope_theta", 10_000))))


def hf_config_to_model_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  """Our ModelConfig of a HF ModernBertConfig (config.json as a dict)."""
  act = hf.get("hidden_activation", "gelu")
  if act not in _ACT_FROM_HF:
    raise ValueError(f"HF hidden_activation={act!r} is not supported; supported: "
                     f"{sorted(_ACT_FROM_HF)}.")
  biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
  if len(set(biases.values())) > 1:
    raise ValueError(f"HF {biases} differ; encoder_jax has one switch for them "
                     "(ModelConfig.linear_bias), so only equal settings convert.")
  if hf.get("classifier_activation", act) != act:
    raise ValueError(f"HF classifier_activation={hf['classifier_activation']!r} differs from "
                     f"hidden_activation={act!r}; encoder_jax's MLM head uses the block's.")
  if hf.get("embedding_dropout", 0.0) != hf.get("mlp_dropout", 0.0):
    logging.warning("HF embedding_dropout=%s and mlp_dropout=%s differ; hidden_dropout takes "
                    "embedding_dropout.", hf.get("embedding_dropout"), hf.get("mlp_dropout"))
  window, every = _layer_kinds(hf)
  theta, theta_local = _rope_thetas(hf)
  kw = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      ffn_size=hf["intermediate_size"], max_positions=hf.get("max_position_embeddings", 8192),
      type_vocab_size=0, activation=_ACT_FROM_HF[act], norm_first=True, first_attn_norm=False,
      learned_positions=False, rope=True, rope_theta=theta, rope_theta_local=theta_local,
      glu=True, norm_bias=hf.get("norm_bias", False), linear_bias=biases["attention_bias"],
      local_window=window, global_every=every, layer_norm_eps=hf.get("norm_eps", 1e-5),
      hidden_dropout=hf.get("embedding_dropout", 0.0),
      attention_dropout=hf.get("attention_dropout", 0.0),
      initializer_range=hf.get("initializer_range", 0.02),
      pad_token_id=hf.get("pad_token_id") or 0)
  kw.update(overrides)
  return ModelConfig(**kw)


def model_config_to_hf_config(cfg: ModelConfig, architectures: list[str]) -> dict[str, Any]:
  """HF ModernBERT's config.json of `cfg`; raises where HF ModernBERT cannot represent it."""
  if why := represents(cfg):
    raise ValueError(f"HF ModernBERT cannot represent this encoder, which has {why}: "
                     "transformers would compute something else. Change the settings named "
                     "here to export it.")
  kinds = [_GLOBAL if g else _LOCAL for g in cfg.global_layers]
  return {
      "architectures": architectures, "model_type": "modernbert",
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.ffn_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "hidden_activation": _ACT_TO_HF[cfg.activation],
      "classifier_activation": _ACT_TO_HF[cfg.activation],
      "max_position_embeddings": cfg.max_positions, "norm_eps": cfg.layer_norm_eps,
      "norm_bias": cfg.norm_bias, "attention_bias": cfg.linear_bias,
      "mlp_bias": cfg.linear_bias, "classifier_bias": cfg.linear_bias, "decoder_bias": True,
      # HF's window attribute is the total width; a 0 (all global) still needs a value there.
      "local_attention": cfg.local_window or 128, "layer_types": kinds,
      "rope_parameters": {_GLOBAL: {"rope_type": "default", "rope_theta": cfg.rope_theta},
                          _LOCAL: {"rope_type": "default", "rope_theta": cfg.rope_theta_local}},
      "embedding_dropout": cfg.hidden_dropout, "mlp_dropout": cfg.hidden_dropout,
      "attention_dropout": cfg.attention_dropout, "initializer_range": cfg.initializer_range,
      "pad_token_id": cfg.pad_token_id, "bos_token_id": None, "eos_token_id": None,
      "cls_token_id": None, "sep_token_id": None, "tie_word_embeddings": True,
      "torch_dtype": "float32",
  }


# ----------------------------------------------------------------------------- tensors
def _linear_from_hf(t, name, shape):
  """A torch Linear [out, in] (+ bias [out]) -> our kernel [in, *shape] (+ bias [*shape])."""
  w = t.pop(f"{name}.weight")
  out = {"kernel": w.T.reshape(w.shape[1], *shape)}
  if f"{name}.bias" in t:
    out["bias"] = t.pop(f"{name}.bias").reshape(shape)
  return out


def _linear_to_hf(p, name):
  kernel = p["kernel"]
  out = {f"{name}.weight": kernel.reshape(kernel.shape[0], -1).T}
  if "bias" in p:
    out[f"{name}.bias"] = p["bias"].reshape(-1)
  return out


def _norm_from_hf(t, name):
  out = {"scale": t.pop(f"{name}.weight")}
  if f"{name}.bias" in t:
    out["bias"] = t.pop(f"{name}.bias")
  return out


def _norm_to_hf(p, name):
  return {f"{name}.{'weight' if k == 'scale' else k}": v for k, v in p.items()}


def _layer_from_hf(t: dict[str, np.ndarray], p: str, cfg: ModelConfig) -> dict[str, Any]:
  n, h, d, f = cfg.num_heads, cfg.head_dim, cfg.hidden_size, cfg.ffn_size
  qkv = _linear_from_hf(t, f"{p}attn.Wqkv", (3, n, h))
  out = _linear_from_hf(t, f"{p}attn.Wo", (d,))
  attn = {"qkv_kernel": qkv["kernel"], "out_kernel": out["kernel"].reshape(n, h, d)}
  if "bias" in qkv:
    attn.update(qkv_bias=qkv["bias"], out_bias=out["bias"])
  layer = {"attn": attn, "ffn_in": _linear_from_hf(t, f"{p}mlp.Wi", (2, f)),
           "ffn_out": _linear_from_hf(t, f"{p}mlp.Wo", (d,)),
           "ln_ffn": _norm_from_hf(t, f"{p}mlp_norm")}
  if f"{p}attn_norm.weight" in t:
    layer["ln_attn"] = _norm_from_hf(t, f"{p}attn_norm")
  return layer


def _layer_to_hf(layer: dict[str, Any], p: str) -> dict[str, np.ndarray]:
  a = layer["attn"]
  qkv = {"kernel": a["qkv_kernel"], **({"bias": a["qkv_bias"]} if "qkv_bias" in a else {})}
  d = a["out_kernel"].shape[-1]  # [N, H, D]: the input features are (N, H)
  wo = {"kernel": a["out_kernel"].reshape(-1, d),
        **({"bias": a["out_bias"]} if "out_bias" in a else {})}
  out = {**_linear_to_hf(qkv, f"{p}attn.Wqkv"), **_linear_to_hf(wo, f"{p}attn.Wo"),
         **_linear_to_hf(layer["ffn_in"], f"{p}mlp.Wi"),
         **_linear_to_hf(layer["ffn_out"], f"{p}mlp.Wo"),
         **_norm_to_hf(layer["ln_ffn"], f"{p}mlp_norm")}
  if "ln_attn" in layer:
    out.update(_norm_to_hf(layer["ln_attn"], f"{p}attn_norm"))
  return out


def _encoder_from_hf(t: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
  enc: dict[str, Any] = {"embeddings": {
      "token": {"embedding": t.pop("embeddings.tok_embeddings.weight")},
      "ln": _norm_from_hf(t, "embeddings.norm")}}
  layers = [_layer_from_hf(t, f"layers.{i}.", cfg) for i in range(cfg.num_layers)]
  if not cfg.scan_layers:
    enc["blocks"] = dict(enumerate(layers))
  else:
    enc["first_block"], rest = layers[0], layers[1:]
    if rest:
      enc["blocks"] = jax.tree.map(lambda *xs: np.stack(xs), *rest)
  enc["final_ln"] = _norm_from_hf(t, "final_norm")
  return enc


def _encoder_to_hf(enc: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
  out = {"embeddings.tok_embeddings.weight": enc["embeddings"]["token"]["embedding"],
         **_norm_to_hf(enc["embeddings"]["ln"], "embeddings.norm"),
         **_norm_to_hf(enc["final_ln"], "final_norm")}
  if not cfg.scan_layers:
    layers = [enc["blocks"][i] for i in range(cfg.num_layers)]
  else:
    rest = enc.get("blocks")
    layers = [enc["first_block"]] + [jax.tree.map(lambda x, i=i: x[i], rest)
                                     for i in range(cfg.num_layers - 1)]
  for i, layer in enumerate(layers):
    out.update(_layer_to_hf(layer, f"layers.{i}."))
  return out


def hf_tensors_to_params(t: dict[str, np.ndarray], cfg: ModelConfig, *, mlm: bool
                         ) -> dict[str, Any]:
  """HF tensors (ModernBertModel's, or ModernBertForMaskedLM's with `mlm`) -> our pure params
  of BertModel(pooler=False) | BertForPreTraining(nsp=False). Logs leftovers (a fine-tuned
  task head has no counterpart here)."""
  t = {k.removeprefix("model."): v for k, v in t.items()}
  tied = t.pop("decoder.weight", None)
  with _taking(t, "ModernBERT", f"this model (mlm={mlm}, layers={cfg.num_layers})"):
    params: dict[str, Any] = {"encoder": _encoder_from_hf(t, cfg)}
    if mlm:
      head = {"transform": _linear_from_hf(t, "head.dense", (cfg.hidden_size,)),
              "ln": _norm_from_hf(t, "head.norm"),
              # decoder_bias=False: a zero bias computes the same logits.
              "bias": t.pop("decoder.bias", np.zeros(cfg.vocab_size, np.float32))}
      params = {"bert": params, "mlm": head}
  token = (params["bert"] if mlm else params)["encoder"]["embeddings"]["token"]["embedding"]
  if mlm and tied is not None and not np.array_equal(tied, token):
    raise ValueError("The HF checkpoint's decoder.weight differs from its token embedding; "
                     "encoder_jax ties the MLM decoder to the embedding, so only tied "
                     "checkpoints (tie_word_embeddings=True) convert.")
  return params


def params_to_hf_tensors(params: dict[str, Any], cfg: ModelConfig, *, mlm: bool
                         ) -> dict[str, np.ndarray]:
  """Our pure params (BertModel without pooler | BertForPreTraining without NSP) -> HF names
  (ModernBertModel's bare, ModernBertForMaskedLM's under `model.` + head + decoder bias)."""
  enc = params["bert"]["encoder"] if mlm else params["encoder"]
  out = _encoder_to_hf(enc, cfg)
  if mlm:
    head = params["mlm"]
    out = {"model." + k: v for k, v in out.items()}
    out.update(_linear_to_hf(head["transform"], "head.dense"))
    out.update(_norm_to_hf(head["ln"], "head.norm"))
    out["decoder.bias"] = head["bias"]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- import / export
def load(path: str | os.PathLike, *, mlm: bool | None = None, **config_overrides: Any
         ) -> tuple[BertModel | BertForPreTraining, ModelConfig]:
  """A HF ModernBERT folder (config.json + model.safetensors) as (our model, its ModelConfig),
  in eval mode: BertForPreTraining(nsp=False) with the MLM head (`mlm`; default: whether the
  folder is a ModernBertForMaskedLM), else BertModel(pooler=False), which also takes the
  encoder of a fine-tuned ModernBERT (its task head is logged as unused).
  `config_overrides` change numerics, not shapes (scan_layers=False, dtype="bfloat16",
  attention_impl=..., ...)."""
  hf_cfg, tensors = read_hf_folder(path)
  if hf_cfg.get("model_type") != "modernbert":
    raise ValueError(f"{path}/config.json has model_type={hf_cfg.get('model_type')!r}, not "
                     "'modernbert'; load BERT and ELECTRA folders with load_hf_bert / "
                     "load_hf_electra.")
  cfg = hf_config_to_model_config(hf_cfg, **config_overrides)
  if mlm is None:  # a fine-tuned classifier also has head.*: the decoder says MLM
    mlm = ("decoder.bias" in tensors or "decoder.weight" in tensors
           or "ModernBertForMaskedLM" in (hf_cfg.get("architectures") or []))
  params = hf_tensors_to_params(tensors, cfg, mlm=mlm)
  model = nnx.eval_shape(lambda: BertForPreTraining(cfg, nsp=False, rngs=nnx.Rngs(0)) if mlm
                         else BertModel(cfg, pooler=False, rngs=nnx.Rngs(0)))
  _assign(model, params)
  model.eval()
  return model, cfg


load_hf_modernbert = load


def export(model: BertModel | BertForPreTraining | ElectraModel, out_dir: str | os.PathLike,
           *, vocab: str | os.PathLike | None = None) -> None:
  """Writes config.json + model.safetensors [+ vocab.txt] that transformers' ModernBertModel /
  ModernBertForMaskedLM `.from_pretrained(out_dir)` loads with nothing missing.

  BertModel without pooler -> ModernBertModel; BertForPreTraining without NSP ->
  ModernBertForMaskedLM. ElectraModel: HF has no ModernBERT ELECTRA, so its discriminator is
  written: as ModernBertForMaskedLM where it has an MLM head (main_head "mlm" / "copy_mlm"),
  else as ModernBertModel; the RTD head (dense + act + dense, which no ModernBERT head class
  computes: HF's have a norm between), a copy head, NSP heads and the generator are left out
  with a warning. Refused in one line, before anything is written: a config HF ModernBERT
  cannot represent (`represents`), a pooler or NSP head (HF ModernBERT has neither).
  """
  if isinstance(model, ElectraModel):
    dropped = [n for n in ("rtd", "pooler", "nsp") if getattr(model, n) is not None]
    logging.warning("HF has no ModernBERT ELECTRA: exporting the discriminator only, without "
                    "%s and without the generator.", dropped)
    cfg, mlm = model.disc_cfg, model.disc_mlm is not None
    enc = _pure_params(model.discriminator)
    params = ({"bert": {"encoder": enc}, "mlm": _pure_params(model.disc_mlm)} if mlm
              else {"encoder": enc})
  elif isinstance(model, (BertModel, BertForPreTraining)):
    mlm = isinstance(model, BertForPreTraining)
    extra = model.nsp if mlm else model.pooler
    if extra is not None:
      raise ValueError(f"HF ModernBERT has no {'NSP head' if mlm else 'pooler'}; build the "
                       f"model with {'nsp' if mlm else 'pooler'}=False to export it.")
    cfg, params = model.cfg, _pure_params(model)
  else:
    raise TypeError(f"export takes a BertModel, BertForPreTraining or ElectraModel, not "
                    f"{type(model).__name__}.")
  arch = ["ModernBertForMaskedLM" if mlm else "ModernBertModel"]
  hf_cfg = model_config_to_hf_config(cfg, arch)
  write_hf_folder(out_dir, hf_cfg, params_to_hf_tensors(params, cfg, mlm=mlm), vocab=vocab)


export_hf_modernbert = export


def read(path: str | os.PathLike, **config_overrides: Any) -> Weights:
  """FAMILY.read: a ModernBertModel / ModernBertForMaskedLM folder (a fine-tuned ModernBERT's
  task head has no counterpart here and is logged as unused)."""
  hf_cfg, tensors = read_hf_folder(path)
  cfg = hf_config_to_model_config(hf_cfg, **config_overrides)
  mlm = ("decoder.bias" in tensors or "decoder.weight" in tensors
         or "ModernBertForMaskedLM" in (hf_cfg.get("architectures") or []))
  params = hf_tensors_to_params(tensors, cfg, mlm=mlm)
  if mlm:
    return Weights(cfg, params["bert"]["encoder"], None, {"mlm": params["mlm"]})
  return Weights(cfg, params["encoder"])


def _export_run_model(model: BertForPreTraining | ElectraModel, out_dir, *, vocab=None,
                      pad_id: int | None = None) -> list[Written]:
  """FAMILY.export of a pre-training run's model (run_gaps found nothing). HF ModernBERT has
  no position table, so `pad_id` is not needed. An ELECTRA run: its discriminator (`export`)."""
  del pad_id
  import pathlib  # pylint: disable=g-import-not-at-top
  export(model, out_dir, vocab=vocab)
  if isinstance(model, ElectraModel):
    if model.disc_mlm is not None:
      ours = lambda ids, mask: np.asarray(model.disc_mlm(
          model.discriminator(ids, mask).hidden_BxTxD, model.token_embed))
      return [Written(pathlib.Path(out_dir), "ModernBertForMaskedLM", "AutoModelForMaskedLM",
                      ours, ("the generator",))]
    dropped = tuple(n for n in ("rtd", "pooler", "nsp") if getattr(model, n) is not None)
    return [Written(pathlib.Path(out_dir), "ModernBertModel", "AutoModel",
                    lambda ids, mask: np.asarray(model.discriminator(ids, mask).hidden_BxTxD),
                    dropped + ("the generator",), "last_hidden_state")]
  return [Written(pathlib.Path(out_dir), "ModernBertForMaskedLM", "AutoModelForMaskedLM",
                  lambda ids, mask: np.asarray(model(ids, mask)[0]))]


FAMILY = Family(name="ModernBERT", model_types=("modernbert",), gaps=run_gaps,
                model_config=hf_config_to_model_config, read=read, export=_export_run_model)
