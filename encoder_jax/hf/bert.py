"""HF BERT <-> encoder_jax, through safetensors (never pickle).

Import: `load_hf_bert(dir)` reads `config.json` + `model.safetensors` of a HF `BertModel` or
`BertForPreTraining` checkpoint and returns our `BertModel` / `BertForPreTraining` with the
same numbers (tests/convert: max abs diff vs transformers <= 1e-5).
Export: `export_hf_bert(model, dir)` writes a checkpoint that `transformers.BertModel` /
`BertForPreTraining` (`BertForMaskedLM` for a model without NSP) `.from_pretrained(dir)` loads;
import(export(params)) is bit-exact (pure transposes and reshapes).

FAMILY (encoder_jax.hf.families): BERT in the registry of encoder_jax.hf;
roberta.py and electra.py reuse the per-layer maps and the folder writer here.

Layout differences handled here: torch Linear weights are [out, in] (ours [in, out]); BERT's
separate query/key/value become our fused [D, 3, N, H] kernel; scanned stacks hold every
layer's parameter in one [L, ...] array.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any

from etils import epath
import jax
import numpy as np
from absl import logging
from flax import nnx
from safetensors.numpy import load_file, save_file

from encoder_jax.hf.families import Family, Gap, Weights, Written, encoder_gaps
from encoder_jax.model.bert import BertForPreTraining, BertModel
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.pretraining import ObjectiveConfig

_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "relu": "relu", "silu": "silu", "swish": "silu"}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
# Buffers / tied copies that carry no parameter of their own.
_IGNORED_KEYS = ("embeddings.position_ids", "cls.predictions.decoder.weight",
                 "cls.predictions.decoder.bias")


def hf_config_to_model_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  act = hf.get("hidden_act", "gelu")
  if act not in _ACT_FROM_HF:
    raise ValueError(f"HF hidden_act={act!r} is not supported; supported: {sorted(_ACT_FROM_HF)}")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError("Only absolute (learned) position embeddings are supported; the checkpoint "
                     f"uses position_embedding_type={hf['position_embedding_type']!r}.")
  kw = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
      ffn_size=hf["intermediate_size"], max_positions=hf["max_position_embeddings"],
      type_vocab_size=hf.get("type_vocab_size", 2), activation=_ACT_FROM_HF[act],
      hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
      layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
      initializer_range=hf.get("initializer_range", 0.02),
      pad_token_id=hf.get("pad_token_id", 0) or 0,
  )
  if hf.get("embedding_size") and hf["embedding_size"] != hf["hidden_size"]:
    kw["embedding_size"] = hf["embedding_size"]
  kw.update(overrides)
  return ModelConfig(**kw)


def hf_bert_gaps(cfg: ModelConfig) -> list[Gap]:
  """What in `cfg` HF BERT cannot represent (empty: the export computes what we compute)."""
  gaps = encoder_gaps(cfg)
  if cfg.embed_size != cfg.hidden_size:
    gaps.append(Gap(f"model.embedding_size={cfg.embed_size}",
                    f"HF BERT has no embedding projection to hidden_size={cfg.hidden_size}",
                    (("embedding_size", None),)))
  return gaps


def run_gaps(cfg: ModelConfig, obj: ObjectiveConfig) -> list[Gap]:
  """What HF BERT cannot represent of a pre-training run (FAMILY.gaps)."""
  gaps = hf_bert_gaps(cfg)
  if obj.is_electra:
    gaps.append(Gap(f"objective.objective={obj.objective!r}", "HF BERT has no generator or "
                    "replaced-token head", (("objective.objective", "mlm"),)))
  return gaps


def model_config_to_hf_config(cfg: ModelConfig, architectures: list[str]) -> dict[str, Any]:
  """HF BERT's config.json of `cfg`; raises where HF BERT cannot represent it."""
  return hf_config(cfg, architectures, "bert", hf_bert_gaps(cfg))


def hf_config(cfg: ModelConfig, architectures: list[str], model_type: str,
              gaps: list[Gap]) -> dict[str, Any]:
  """config.json of `cfg` for HF's `model_type` ("bert" | "electra" | "roberta"); `gaps`:
  what that model cannot represent (hf_bert_gaps | ...), raised when not empty. A model
  without token types (type_vocab_size=0) gets one type whose embedding is zeros
  (_encoder_to_hf): HF's embeddings always add one."""
  if gaps:
    raise ValueError(f"HF {model_type.upper()} cannot represent this encoder, which has "
                     f"{' and '.join(f'{g.switch} ({g.why})' for g in gaps)}: transformers "
                     "would compute something else. Change the settings named here to "
                     "export it.")
  return {
      "architectures": architectures, "model_type": model_type, "vocab_size": cfg.vocab_size,
      **({"embedding_size": cfg.embed_size} if model_type == "electra" else {}),
      "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.ffn_size,
      "max_position_embeddings": cfg.max_positions,
      "type_vocab_size": max(cfg.type_vocab_size, 1), "hidden_act": _ACT_TO_HF[cfg.activation],
      "hidden_dropout_prob": cfg.hidden_dropout,
      "attention_probs_dropout_prob": cfg.attention_dropout,
      "layer_norm_eps": cfg.layer_norm_eps, "initializer_range": cfg.initializer_range,
      "pad_token_id": cfg.pad_token_id, "position_embedding_type": "absolute",
      "tie_word_embeddings": True, "torch_dtype": "float32",
  }


# ----------------------------------------------------------------------------- per-layer maps
def _layer_from_hf(t: dict[str, np.ndarray], p: str, cfg: ModelConfig) -> dict[str, Any]:
  d, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  a = f"{p}attention."
  qkv_w = [t.pop(f"{a}self.{x}.weight").T.reshape(d, n, h) for x in ("query", "key", "value")]
  qkv_b = [t.pop(f"{a}self.{x}.bias").reshape(n, h) for x in ("query", "key", "value")]
  return {
      "attn": {"qkv_kernel": np.stack(qkv_w, axis=1), "qkv_bias": np.stack(qkv_b, axis=0),
               "out_kernel": t.pop(f"{a}output.dense.weight").T.reshape(n, h, d),
               "out_bias": t.pop(f"{a}output.dense.bias")},
      "ln_attn": _ln_from_hf(t, f"{a}output.LayerNorm"),
      "ffn_in": _dense_from_hf(t, f"{p}intermediate.dense"),
      "ffn_out": _dense_from_hf(t, f"{p}output.dense"),
      "ln_ffn": _ln_from_hf(t, f"{p}output.LayerNorm"),
  }


def _layer_to_hf(layer: dict[str, Any], p: str, cfg: ModelConfig) -> dict[str, np.ndarray]:
  d = cfg.hidden_size
  a, out = f"{p}attention.", {}
  for i, x in enumerate(("query", "key", "value")):
    out[f"{a}self.{x}.weight"] = layer["attn"]["qkv_kernel"][:, i].reshape(d, d).T
    out[f"{a}self.{x}.bias"] = layer["attn"]["qkv_bias"][i].reshape(d)
  out[f"{a}output.dense.weight"] = layer["attn"]["out_kernel"].reshape(d, d).T
  out[f"{a}output.dense.bias"] = layer["attn"]["out_bias"]
  out.update(_ln_to_hf(layer["ln_attn"], f"{a}output.LayerNorm"))
  out.update(_dense_to_hf(layer["ffn_in"], f"{p}intermediate.dense"))
  out.update(_dense_to_hf(layer["ffn_out"], f"{p}output.dense"))
  out.update(_ln_to_hf(layer["ln_ffn"], f"{p}output.LayerNorm"))
  return out


def _dense_from_hf(t, name):
  return {"kernel": t.pop(f"{name}.weight").T, "bias": t.pop(f"{name}.bias")}


def _dense_to_hf(p, name):
  return {f"{name}.weight": p["kernel"].T, f"{name}.bias": p["bias"]}


def _ln_from_hf(t, name):
  # Old TF-converted checkpoints call LayerNorm's parameters gamma/beta.
  scale = t.pop(f"{name}.weight") if f"{name}.weight" in t else t.pop(f"{name}.gamma")
  bias = t.pop(f"{name}.bias") if f"{name}.bias" in t else t.pop(f"{name}.beta")
  return {"scale": scale, "bias": bias}


def _ln_to_hf(p, name):
  return {f"{name}.weight": p["scale"], f"{name}.bias": p["bias"]}


@contextlib.contextmanager
def _taking(t: dict[str, np.ndarray], family: str, needed_by: str):
  """Tensors popped from `t` inside the block: a missing one is a ValueError naming it and
  what needed it; those left over afterwards are logged (a fine-tuned task head, ...)."""
  try:
    yield
  except KeyError as e:
    raise ValueError(f"The HF {family} checkpoint has no tensor {e.args[0]!r} needed for "
                     f"{needed_by}.") from None
  if t:
    logging.warning("Unused tensors in the HF %s checkpoint: %s", family, sorted(t))


def _mlm_head_from_hf(t, dense: str, ln: str, bias: str) -> dict[str, Any]:
  """Our MlmHead's parameters (its decoder is tied to the token embedding) from the tensors
  of a BERT-style MLM head: a dense transform, its LayerNorm and the output bias. The names
  differ per family (BERT's cls.predictions.*, RoBERTa's lm_head.*, ELECTRA's generator_*)."""
  return {"transform": _dense_from_hf(t, dense), "ln": _ln_from_hf(t, ln), "bias": t.pop(bias)}


def _mlm_head_to_hf(mlm: dict[str, Any], dense: str, ln: str, bias: str) -> dict[str, Any]:
  return {**_dense_to_hf(mlm["transform"], dense), **_ln_to_hf(mlm["ln"], ln), bias: mlm["bias"]}


# ----------------------------------------------------------------------------- whole models
def _encoder_from_hf(t: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
  e = "embeddings."
  emb = {"token": {"embedding": t.pop(f"{e}word_embeddings.weight")},
         "position": {"embedding": t.pop(f"{e}position_embeddings.weight")},
         "ln": _ln_from_hf(t, f"{e}LayerNorm")}
  if cfg.type_vocab_size:
    emb["token_type"] = {"embedding": t.pop(f"{e}token_type_embeddings.weight")}
  layers = [_layer_from_hf(t, f"encoder.layer.{i}.", cfg) for i in range(cfg.num_layers)]
  if cfg.scan_layers:
    blocks = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  else:
    blocks = dict(enumerate(layers))
  enc = {"embeddings": emb, "blocks": blocks}
  if cfg.embed_size != cfg.hidden_size:  # ELECTRA's embeddings_project (BERT has none)
    enc["embed_proj"] = _dense_from_hf(t, "embeddings_project")
  return enc


def _encoder_to_hf(enc: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
  e = "embeddings."
  out = {f"{e}word_embeddings.weight": enc["embeddings"]["token"]["embedding"],
         f"{e}position_embeddings.weight": enc["embeddings"]["position"]["embedding"],
         **_ln_to_hf(enc["embeddings"]["ln"], f"{e}LayerNorm")}
  if cfg.type_vocab_size:
    out[f"{e}token_type_embeddings.weight"] = enc["embeddings"]["token_type"]["embedding"]
  else:  # HF adds a type embedding whatever: one of zeros adds nothing
    out[f"{e}token_type_embeddings.weight"] = np.zeros((1, cfg.embed_size), np.float32)
  if cfg.embed_size != cfg.hidden_size:
    out.update(_dense_to_hf(enc["embed_proj"], "embeddings_project"))
  for i in range(cfg.num_layers):
    layer = (jax.tree.map(lambda x, i=i: x[i], enc["blocks"]) if cfg.scan_layers
             else enc["blocks"][i])
    out.update(_layer_to_hf(layer, f"encoder.layer.{i}.", cfg))
  return out


def hf_tensors_to_params(t: dict[str, np.ndarray], cfg: ModelConfig, *, pretraining: bool,
                         nsp: bool = True, pooler: bool = True) -> dict[str, Any]:
  """HF tensor dict -> our pure parameter dict (BertForPreTraining or BertModel layout).

  Raises if a tensor our model needs is missing; returns the leftovers untouched in `t`.
  """
  t = {k.removeprefix("bert."): v for k, v in t.items() if not k.endswith(_IGNORED_KEYS)}
  with _taking(t, "BERT", f"this model (pretraining={pretraining}, nsp={nsp}, pooler={pooler})"
               ". A bare BertModel checkpoint has no MLM/NSP heads: load it with "
               "pretraining=False"):
    bert: dict[str, Any] = {"encoder": _encoder_from_hf(t, cfg)}
    if (nsp if pretraining else pooler):
      bert["pooler"] = {"dense": _dense_from_hf(t, "pooler.dense")}
    if not pretraining:
      params = bert
    else:
      c = "cls.predictions."
      params = {"bert": bert, "mlm": _mlm_head_from_hf(t, f"{c}transform.dense",
                                                      f"{c}transform.LayerNorm", f"{c}bias")}
      if nsp:
        params["nsp"] = {"out": _dense_from_hf(t, "cls.seq_relationship")}
  return params


def params_to_hf_tensors(params: dict[str, Any], cfg: ModelConfig, *,
                         pretraining: bool) -> dict[str, np.ndarray]:
  bert = params["bert"] if pretraining else params
  prefix = "bert." if pretraining else ""
  out = {prefix + k: v for k, v in _encoder_to_hf(bert["encoder"], cfg).items()}
  if bert.get("pooler"):
    out.update({prefix + k: v for k, v in
                _dense_to_hf(bert["pooler"]["dense"], "pooler.dense").items()})
  if pretraining:
    c = "cls.predictions."
    out.update(_mlm_head_to_hf(params["mlm"], f"{c}transform.dense", f"{c}transform.LayerNorm",
                               f"{c}bias"))
    if params.get("nsp"):
      out.update(_dense_to_hf(params["nsp"]["out"], "cls.seq_relationship"))
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _pure_params(model: nnx.Module) -> dict[str, Any]:
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return jax.tree.map(np.asarray, pure)


def read_hf_folder(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json as a dict, the tensors of model.safetensors) of a HF checkpoint folder."""
  path = pathlib.Path(path)
  cfg_file, st_file = path / "config.json", path / "model.safetensors"
  for f in (cfg_file, st_file):
    if not f.exists():
      raise FileNotFoundError(f"{f} not found: a HF checkpoint directory needs config.json and "
                              "model.safetensors (convert .bin checkpoints with transformers' "
                              "save_pretrained(safe_serialization=True) first).")
  return json.loads(cfg_file.read_text()), load_file(str(st_file))


def load_hf_bert(path: str | os.PathLike, *, pretraining: bool = False, nsp: bool = True,
                 pooler: bool = True, **config_overrides: Any):
  """Loads a HF BERT checkpoint directory as our BertModel (or BertForPreTraining).

  `config_overrides` change numerics, not shapes (e.g. scan_layers=False, dtype="bfloat16",
  hidden_dropout=0.0). The model is returned in eval mode.
  """
  hf_cfg, tensors = read_hf_folder(path)
  if (model_type := hf_cfg.get("model_type", "bert")) != "bert":
    loader = {"electra": "electra.load_hf_electra",
              "roberta": "roberta.load_hf_roberta"}.get(model_type)
    raise ValueError(f"{path} is not a BERT checkpoint (model_type={model_type!r}); load it "
                     f"with {f'encoder_jax.hf.{loader} or ' if loader else ''}"
                     "encoder_jax.hf.read(<dir>), which picks the family's converter.")
  cfg = hf_config_to_model_config(hf_cfg, **config_overrides)
  params = hf_tensors_to_params(tensors, cfg, pretraining=pretraining, nsp=nsp, pooler=pooler)
  # Build the module abstractly (no random init of ~100M numbers we would overwrite at once),
  # then fill every parameter from the checkpoint.
  model = nnx.eval_shape(lambda: BertForPreTraining(cfg, nsp=nsp, rngs=nnx.Rngs(0))
                         if pretraining else BertModel(cfg, pooler=pooler, rngs=nnx.Rngs(0)))
  _assign(model, params)
  model.eval()
  return model


def _assign(model: nnx.Module, params: dict[str, Any]) -> None:
  state = nnx.state(model, nnx.Param)
  want = nnx.to_pure_dict(state)
  if jax.tree.structure(params) != jax.tree.structure(want):
    raise ValueError(f"Converted parameter tree does not match the model:\n"
                     f"{jax.tree.map(np.shape, params)}\nvs\n"
                     f"{jax.tree.map(lambda w: w.shape, want)}")
  def cast(x, w):
    if x.shape != w.shape:
      raise ValueError(f"HF tensor of shape {x.shape} does not fit parameter shape {w.shape}.")
    return jax.numpy.asarray(x, dtype=w.dtype)
  nnx.replace_by_pure_dict(state, jax.tree.map(cast, params, want))
  nnx.update(model, state)


def export_hf_bert(model: BertModel | BertForPreTraining, out_dir: str | os.PathLike, *,
                   vocab: str | os.PathLike | None = None) -> str:
  """Writes config.json + model.safetensors loadable by transformers (atomically); returns the
  HF class written.

  BertForPreTraining with NSP exports as HF `BertForPreTraining`; without NSP (no pooler, no
  NSP head) as `BertForMaskedLM`, which has exactly those tensors, so transformers loads it
  with nothing missing or randomly initialised. `vocab`: a vocab.txt to copy beside the
  weights (with a tokenizer_config.json), so AutoTokenizer loads the folder.
  """
  pretraining = isinstance(model, BertForPreTraining)
  cfg = model.cfg
  if not pretraining:
    arch = "BertModel"
  else:
    arch = "BertForPreTraining" if model.nsp is not None else "BertForMaskedLM"
  hf_cfg = model_config_to_hf_config(cfg, [arch])
  tensors = params_to_hf_tensors(_pure_params(model), cfg, pretraining=pretraining)
  write_hf_folder(out_dir, hf_cfg, tensors, vocab=vocab)
  return arch


def read(path: str | os.PathLike, **config_overrides: Any) -> Weights:
  """A HF BERT folder (BertModel, BertForMaskedLM, BertForPreTraining, or a fine-tuned BERT
  whose task head has no counterpart here) as Weights: the heads are those it holds."""
  hf_cfg, tensors = read_hf_folder(path)
  cfg = hf_config_to_model_config(hf_cfg, **config_overrides)
  names = {k.removeprefix("bert.") for k in tensors}
  mlm, nsp = "cls.predictions.bias" in names, "cls.seq_relationship.weight" in names
  pooler = "pooler.dense.weight" in names
  params = hf_tensors_to_params(tensors, cfg, pretraining=mlm, nsp=nsp, pooler=pooler)
  if not mlm:
    return Weights(cfg, params["encoder"], params.get("pooler"))
  heads = {k: v for k, v in params.items() if k != "bert"}
  return Weights(cfg, params["bert"]["encoder"], params["bert"].get("pooler"), heads)


def _export_run_model(model: nnx.Module, out_dir: pathlib.Path, *, vocab=None,
                      pad_id: int | None = None) -> list[Written]:
  """FAMILY.export: a pre-training run's BertForPreTraining (run_gaps found nothing). HF
  BERT's computation does not depend on the pad id (positions are 0..T-1), so `pad_id` is
  not needed."""
  del pad_id
  arch = export_hf_bert(model, out_dir, vocab=vocab)
  auto = "AutoModelForPreTraining" if arch == "BertForPreTraining" else "AutoModelForMaskedLM"
  return [Written(pathlib.Path(out_dir), arch, auto,
                  lambda ids, mask: np.asarray(model(ids, mask)[0]))]


FAMILY = Family(name="BERT", model_types=("bert",), gaps=run_gaps,
                model_config=hf_config_to_model_config, read=read, export=_export_run_model)


def write_hf_folder(out_dir: str | os.PathLike, hf_cfg: dict[str, Any],
                    tensors: dict[str, np.ndarray], *,
                    vocab: str | os.PathLike | None = None,
                    tokenizer: dict[str, Any] | None = None) -> None:
  """config.json + model.safetensors (fp32) [+ the tokenizer's files: `tokenizer_files`], each file
  written to a temporary in `out_dir` and renamed: a crash never leaves a half file. Files get
  the mode a newly created file gets (0644 under the usual umask 022), where safetensors alone
  leaves model.safetensors readable by its owner only. `tokenizer`: entries to add to
  tokenizer_config.json."""
  tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
  files = {"config.json": json.dumps(hf_cfg, indent=2) + "\n"}
  if vocab is not None:
    files |= tokenizer_files(vocab, hf_cfg["max_position_embeddings"], tokenizer or {})
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mode = 0o666 & ~_umask()
  with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for name, text in files.items():
      pathlib.Path(tmp, name).write_text(text, encoding="utf-8")
    for name in ("model.safetensors", *files):
      os.chmod(os.path.join(tmp, name), mode)
      os.replace(os.path.join(tmp, name), out_dir / name)


def tokenizer_files(vocab: str | os.PathLike, max_length: int,
                    extra: dict[str, Any]) -> dict[str, str]:
  """The run's tokenizer as a HF folder holds it, name -> text. A WordPiece vocab.txt: BERT's
  uncased pipeline (BertTokenizer, lowercase + strip accents). A byte-level BPE vocab.json
  (merges.txt beside it): RoBERTa's (RobertaTokenizer, no prefix space, <s> </s> <pad> <unk>
  <mask>), which AutoTokenizer builds with the ids encoder_jax gives. `extra`: entries added to
  tokenizer_config.json. Read through epath: local or gs://."""
  vocab = epath.Path(vocab)
  if vocab.name == "vocab.json":
    return {"vocab.json": vocab.read_text(encoding="utf-8"),
            "merges.txt": (vocab.parent / "merges.txt").read_text(encoding="utf-8"),
            "tokenizer_config.json": json.dumps({
                "tokenizer_class": "RobertaTokenizer", "add_prefix_space": False,
                "model_max_length": max_length, "bos_token": "<s>", "eos_token": "</s>",
                "cls_token": "<s>", "sep_token": "</s>", "unk_token": "<unk>",
                "pad_token": "<pad>", "mask_token": "<mask>", **extra}, indent=2) + "\n"}
  return {"vocab.txt": vocab.read_text(encoding="utf-8"),
          "tokenizer_config.json": json.dumps({
              "tokenizer_class": "BertTokenizer", "do_lower_case": True,
              "model_max_length": max_length, "unk_token": "[UNK]", "sep_token": "[SEP]",
              "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]", **extra},
              indent=2) + "\n"}


def _umask() -> int:
  # The only way to read the umask is to set it; set it straight back.
  mask = os.umask(0o022)
  os.umask(mask)
  return mask
