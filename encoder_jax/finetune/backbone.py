"""The fine-tuning model (encoder + task head) and where its encoder comes from.

Backbones:
  hf:<dir> | minilm   a HF BERT or ELECTRA checkpoint (config.json + model.safetensors)
                      through encoder_jax.convert; a BERT pooler initialises the [CLS]
                      classifier's pooler (as HF's BertForSequenceClassification does).
  ckpt:<dir>          our pre-training checkpoint: <dir> (local or gs://) is the run's
                      workdir, its checkpoints/ (both: the newest step whose checksums
                      verify), a step folder or its item folder. An Orbax checkpoint of
                      encoder_jax.train.step.TrainState(step, params, opt_state) whose params
                      are the nnx.State of BertForPreTraining (`params['bert']['encoder']`,
                      pooler at `params['bert']['pooler']` when trained with NSP) or
                      ElectraModel (`params['discriminator']`, pooler at `params['pooler']`).
                      Shapes (sizes, layers, scan vs unrolled, pre/post-LN) are read from
                      the parameters; numerics that leave no trace in them
                      (activation, LayerNorm eps, dropout) come from the overrides.
  random              a fresh encoder of a given ModelConfig (the baseline of every comparison).

The head is initialised from the fine-tuning seed, so N seeds from one checkpoint differ in
head init, data order and dropout only.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any

from etils import epath
import jax
import numpy as np
from absl import logging
from flax import nnx

from encoder_jax import paths
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.dropout import fold_rng
from encoder_jax.model.encoder import Encoder
from encoder_jax.model.heads import ClassifierHead, SpanQaHead, TaggerHead


def make_head(cfg: ModelConfig, kind: str, num_labels: int, pooling: str, rngs: nnx.Rngs):
  if kind in ("classify", "regress"):  # regression: one output, read as the score
    return ClassifierHead(cfg, num_labels, pooling, rngs=rngs)
  if kind == "tag":
    return TaggerHead(cfg, num_labels, rngs=rngs)
  if kind == "span":
    return SpanQaHead(cfg, rngs=rngs)
  raise ValueError(f"task kind={kind!r}; use classify, regress, tag or span.")


class FinetuneModel(nnx.Module):
  """Encoder + one task head. `__call__(batch)` returns the head's fp32 outputs by name."""

  def __init__(self, cfg: ModelConfig, kind: str, num_labels: int, *, pooling: str = "cls",
               rngs: nnx.Rngs):
    self.cfg, self.kind = cfg, kind
    self.encoder = Encoder(cfg, rngs=rngs)
    self.head = make_head(cfg, kind, num_labels, pooling, rngs)

  def __call__(self, batch: dict[str, jax.Array], *, dropout_rng=None) -> dict[str, jax.Array]:
    out = self.encoder(batch["input_ids"], batch["mask"], batch.get("token_types"),
                       dropout_rng=fold_rng(dropout_rng, 0))
    h_BxTxD, mask_BxT = out.hidden_BxTxD, out.mask_BxT
    if self.kind in ("classify", "regress"):
      return {"logits": self.head(h_BxTxD, mask_BxT, dropout_rng=fold_rng(dropout_rng, 1))}
    if self.kind == "tag":
      return {"logits": self.head(h_BxTxD, dropout_rng=fold_rng(dropout_rng, 1))}
    start_BxT, end_BxT = self.head(h_BxTxD, mask_BxT)
    return {"start_logits": start_BxT, "end_logits": end_BxT}


@dataclasses.dataclass
class Backbone:
  """A loaded encoder as host numpy arrays (pure dicts), reusable across seeds."""
  cfg: ModelConfig
  encoder: dict[str, Any] | None  # None: random init from the fine-tuning seed
  pooler: dict[str, Any] | None  # BERT's pooler {'dense': {kernel, bias}}, if the source had one
  source: str
  vocab: str | None = None  # the vocab the encoder was trained with, when the source says
  params: dict[str, Any] | None = None  # every parameter of a pre-training run (ckpt: only)


def load_backbone(init: str, *, model_overrides: dict[str, Any] | None = None,
                  random_config: ModelConfig | None = None, cache_dir=None,
                  random_vocab: str | None = None) -> Backbone:
  """init: 'minilm' | 'hf:<dir>' | 'ckpt:<dir>' | 'random' (needs random_config; its vocab is
  `random_vocab` when the shape came from a run that names one)."""
  overrides = dict(model_overrides or {})
  if init == "random":
    if random_config is None:
      raise ValueError("init='random' needs a model config (config.model, or model_like).")
    return Backbone(random_config.replace(**overrides), None, None, "random", random_vocab)
  if init == "minilm" or init.startswith("hf:"):
    from encoder_jax.convert import load_hf_bert, load_hf_electra
    from encoder_jax.data.fetch import minilm_dir
    path = minilm_dir(cache_dir) if init == "minilm" else pathlib.Path(init[3:])
    # An ELECTRA discriminator (or generator) folder: its encoder; ELECTRA has no pooler,
    # so a [CLS] classifier's pooler starts from the fine-tuning seed.
    load = load_hf_electra if hf_model_type(path) == "electra" else load_hf_bert
    model = load(path, **overrides)
    host = lambda m: None if m is None else jax.tree.map(
        np.asarray, nnx.to_pure_dict(nnx.state(m, nnx.Param)))
    return Backbone(model.cfg, host(model.encoder), host(getattr(model, "pooler", None)),
                    f"hf:{path}")
  if init.startswith("ckpt:"):
    return load_pretraining_checkpoint(init[5:], **overrides)
  raise ValueError(f"init={init!r}; use 'minilm', 'hf:<dir>', 'ckpt:<dir>' or 'random'.")


def hf_model_type(path) -> str | None:
  """config.json's model_type of a HF checkpoint folder ('bert', 'electra', ...)."""
  cfg_file = pathlib.Path(path) / "config.json"
  return json.loads(cfg_file.read_text()).get("model_type") if cfg_file.is_file() else None


def hf_model_config(path, **overrides) -> ModelConfig:
  """The ModelConfig of a HF checkpoint folder (for a random encoder of the same shape)."""
  from encoder_jax.convert.hf_bert import hf_config_to_model_config
  return hf_config_to_model_config(
      json.loads((pathlib.Path(path) / "config.json").read_text()), **overrides)


# ----------------------------------------------------------------------- our checkpoints
def _good_step(steps: list[epath.Path]) -> epath.Path:
  """The newest step folder whose checksums verify (encoder_jax.train.checkpoint); damaged
  ones are skipped with a warning (left in place: they belong to the pre-training run, which
  sets them aside when it resumes). A folder of unsealed steps only (written before checkpoints
  carried checksums) gives its newest, unverified."""
  from encoder_jax.train import checkpoint  # pylint: disable=g-import-not-at-top
  steps = sorted(steps, key=lambda p: int(p.name), reverse=True)
  sealed = [p for p in steps if (p / checkpoint.CHECKSUMS).exists()]
  if not sealed:
    logging.warning("%s: no checksums.json (an older encoder_jax wrote it); not verified",
                    steps[0])
    return steps[0]
  for p in sealed:
    problem = checkpoint.verify(p)
    if problem is None:
      return p
    logging.warning("skipping damaged checkpoint %s: %s", p, problem)
  raise checkpoint.CheckpointError(f"every checkpoint in {steps[0].parent} is damaged (e.g. "
                                   f"{sealed[0].name}: {checkpoint.verify(sealed[0])}).")


def _item_dir(path: epath.Path) -> epath.Path:
  """Pre-training workdir or CheckpointManager root -> newest good step; step folder -> its
  single pytree item."""
  if not path.exists():
    raise FileNotFoundError(f"checkpoint {path} does not exist; give init=ckpt:<pre-training "
                            "workdir>, its checkpoints/ folder or one step folder in it.")
  if (path / "checkpoints").is_dir():  # a pre-training workdir
    path = path / "checkpoints"
  steps = [p for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
  if steps:
    path = _good_step(steps)
  if (path / "_METADATA").exists() or (path / "manifest.ocdbt").exists():
    return path
  items = [p for p in path.iterdir() if p.is_dir() and (p / "_METADATA").exists()]
  for name in ("state", "train_state", "default"):
    if any(p.name == name for p in items):
      return path / name
  if len(items) == 1:
    return items[0]
  raise ValueError(f"{path} holds no single Orbax pytree item (found {[p.name for p in items]});"
                   " pass the folder of the TrainState item, e.g. <workdir>/checkpoints/<step>/"
                   "state.")


def _strip_values(tree):
  """nnx.State saved by Orbax restores as {..., 'kernel': {'value': array}}: drop 'value'."""
  if isinstance(tree, dict):
    if set(tree) == {"value"} and not isinstance(tree["value"], dict):
      return np.asarray(tree["value"])
    return {k: _strip_values(v) for k, v in tree.items()}
  return np.asarray(tree)


def load_pretraining_checkpoint(path, **overrides) -> Backbone:
  import orbax.checkpoint as ocp
  item = _item_dir(paths.absolute(path))  # a local folder or gs://
  raw = ocp.StandardCheckpointer().restore(item)
  if isinstance(raw, dict) and "params" in raw:
    params = raw["params"]
  elif isinstance(raw, (list, tuple)) and len(raw) == 3:  # TrainState restored as a sequence
    params = raw[1]
  else:
    keys = list(raw) if isinstance(raw, dict) else type(raw).__name__
    raise ValueError(f"{item}: expected a TrainState(step, params, opt_state); found {keys}.")
  params = _strip_values(params)
  if "bert" in params and "encoder" in params["bert"]:
    enc, pooler = params["bert"]["encoder"], params["bert"].get("pooler")
  elif "discriminator" in params:
    enc, pooler = params["discriminator"], params.get("pooler")
  else:
    raise ValueError(f"{item}: params have keys {sorted(params)}; expected 'bert' "
                     "(BertForPreTraining) or 'discriminator' (ElectraModel). Was this written "
                     "by encoder_jax.train?")
  run = _pretraining_run_config(item)
  numerics = {k: v for k, v in run.get("model", {}).items() if k in _NUMERICS}
  cfg = infer_model_config(enc, **{**numerics, **overrides})
  vocab = run.get("data", {}).get("vocab") or None
  return Backbone(cfg, enc, pooler or None, f"ckpt:{item}", vocab, params)


# ModelConfig fields that leave no trace in parameter shapes; read from the pre-training run's
# config.json (encoder_jax.train.loop writes it to its workdir, above checkpoints/).
_NUMERICS = ("activation", "layer_norm_eps", "initializer_range", "pad_token_id",
             "hidden_dropout", "attention_dropout", "position_bias")


def _pretraining_run_config(item: epath.Path) -> dict[str, Any]:
  for parent in list(item.parents)[:4]:
    path = parent / "config.json"
    if path.is_file():
      try:
        run = json.loads(path.read_text())
      except json.JSONDecodeError:
        continue
      if isinstance(run, dict) and "model" in run:
        logging.info("numerics and vocab of %s from %s", item, path)
        return run
  logging.warning("no pre-training config.json above %s: activation, LayerNorm eps and "
                  "dropout are BERT's defaults unless overridden", item)
  return {}


def infer_model_config(enc: dict[str, Any], **overrides) -> ModelConfig:
  """Sizes from an Encoder's parameters; numerics (activation, eps, dropout) from overrides."""
  try:
    emb = enc["embeddings"]
    vocab, e = emb["token"]["embedding"].shape
    positions = emb["position"]["embedding"].shape[0]
    types = emb["token_type"]["embedding"].shape[0] if emb.get("token_type") else 0
    blocks = enc["blocks"]
    if "attn" in blocks:  # scanned: every leaf has a leading [L] axis
      layers, d, _, heads, _ = blocks["attn"]["qkv_kernel"].shape
      ffn, scan = blocks["ffn_in"]["kernel"].shape[-1], True
    else:
      first = blocks[min(blocks, key=int)]
      d, _, heads, _ = first["attn"]["qkv_kernel"].shape
      layers, ffn, scan = len(blocks), first["ffn_in"]["kernel"].shape[-1], False
  except (KeyError, ValueError, TypeError, AttributeError) as err:
    raise ValueError(f"the checkpoint's encoder parameters do not have encoder_jax's Encoder "
                     f"layout ({type(err).__name__}: {err}); top-level keys: {sorted(enc)}."
                     ) from None
  shape = dict(vocab_size=int(vocab), hidden_size=int(d), num_layers=int(layers),
               num_heads=int(heads), ffn_size=int(ffn), max_positions=int(positions),
               type_vocab_size=int(types), embedding_size=None if e == d else int(e),
               norm_first=bool(enc.get("final_ln")), scan_layers=scan)
  clash = {k: (v, shape[k]) for k, v in overrides.items()
           if k in shape and k != "scan_layers" and v != shape[k]}
  if clash:
    raise ValueError(f"model overrides {clash} (given, in checkpoint) change shapes; only "
                     "numerics (activation, layer_norm_eps, dropout, dtype) can be overridden.")
  return ModelConfig(**{**shape, **overrides})


# ------------------------------------------------------------------------------ building
def build_model(backbone: Backbone, kind: str, num_labels: int, *, pooling: str,
                seed: int) -> FinetuneModel:
  """The task model in eval mode: head (and a random encoder) from `seed`, the rest loaded.

  A loaded encoder is never randomly initialised first: the model is built abstractly
  (nnx.eval_shape) and filled, and only the head is initialised, by a jitted function cached
  per shape so N seeds compile it once. (On 2 CPU cores each truncated-normal initialiser
  costs ~0.5-2 s of XLA compilation when run eagerly.)
  """
  key = jax.random.key(seed)
  if backbone.encoder is None:
    model = _initializer(backbone.cfg, kind, num_labels, pooling, "model")(key)
  else:
    model = nnx.eval_shape(lambda: FinetuneModel(backbone.cfg, kind, num_labels,
                                                 pooling=pooling, rngs=nnx.Rngs(0)))
    model.head = _initializer(backbone.cfg, kind, num_labels, pooling, "head")(key)
    _load_into(model.encoder, backbone.encoder, "encoder")
  if (backbone.pooler is not None and kind in ("classify", "regress")
      and getattr(model.head, "pooler", None) is not None):
    _load_into(model.head.pooler, backbone.pooler, "pooler")
  model.eval()
  return model


@functools.lru_cache(maxsize=16)
def _initializer(cfg: ModelConfig, kind: str, num_labels: int, pooling: str, what: str):
  """jit(key -> a freshly initialised FinetuneModel, or just its head)."""
  if what == "model":
    return nnx.jit(lambda key: FinetuneModel(cfg, kind, num_labels, pooling=pooling,
                                             rngs=nnx.Rngs(key)))
  return nnx.jit(lambda key: make_head(cfg, kind, num_labels, pooling, nnx.Rngs(key)))


def _load_into(module: nnx.Module, pure: dict[str, Any], what: str) -> None:
  state = nnx.state(module, nnx.Param)
  target = nnx.to_pure_dict(state)

  def fill(t, s, path):
    if isinstance(t, dict):
      if not isinstance(s, dict):
        raise ValueError(f"{what}/{path}: checkpoint has a leaf where the model has a subtree")
      s_by_name = {str(k): v for k, v in s.items()}
      missing = sorted(str(k) for k in t if str(k) not in s_by_name)
      if missing:
        raise ValueError(f"{what}/{path}: the checkpoint lacks {missing}")
      return {k: fill(v, s_by_name[str(k)], f"{path}/{k}") for k, v in t.items()}
    if tuple(t.shape) != tuple(np.shape(s)):
      raise ValueError(f"{what}/{path}: checkpoint shape {np.shape(s)} != model shape "
                       f"{tuple(t.shape)}")
    # A fresh copy: on CPU a device array may alias the numpy buffer it came from, and the
    # train step donates (overwrites) it, which would corrupt the backbone for the next seed.
    return jax.numpy.array(np.array(s, copy=True), dtype=t.dtype)

  nnx.replace_by_pure_dict(state, fill(target, pure, ""))
  nnx.update(module, state)
