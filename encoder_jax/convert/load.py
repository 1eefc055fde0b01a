"""An encoder's parameters from wherever they are, in one place; the registry of HF families.

  b = load_backbone("minilm")             # all-MiniLM-L6-v2 (fetched, sha256-checked)
  b = load_backbone("hf:runs/x/hf")       # a HF folder of any family in FAMILIES
  b = load_backbone("ckpt:runs/x")        # a pre-training run (train/run_dir.py reads it)
  b.cfg, b.encoder, b.pooler, b.vocab     # ModelConfig, host arrays, the vocab it used

Fine-tuning (encoder_jax.finetune) and init_from (encoder_jax.pretrain) load through here;
export (encoder_jax.convert.export) picks its family here (`exporting_family`).

FAMILIES is the registry: one converter module per HF family (families.py says what each
provides), in the order export tries them. RoBERTa comes before BERT: it only claims runs of
RoBERTa's shape (MLM alone, one token type), which BERT could hold too; everything else with
BERT's shape is BERT's. ELECTRA takes the ELECTRA runs and the MLM runs with an embedding
projection (as ElectraForMaskedLM). ModernBERT takes the runs of its block (pre-LN, RoPE,
GeGLU, bias-free, local windows; the BERT-block families refuse every one of those), MLM or
ELECTRA (the discriminator). A new family is a module with its FAMILY, added here.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import numpy as np
from flax import nnx

from encoder_jax import paths
from encoder_jax.convert import hf_bert, hf_electra, hf_modernbert, hf_roberta
from encoder_jax.convert.families import Family, Gap, Weights
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.pretraining import ObjectiveConfig
from encoder_jax.train.run_dir import RunDir

FAMILIES: tuple[Family, ...] = (hf_roberta.FAMILY, hf_bert.FAMILY, hf_electra.FAMILY,
                                hf_modernbert.FAMILY)

# ModelConfig fields that set a parameter's shape or the parameter tree's layout: a
# fine-tuning override may not change them (the checkpoint's parameters would not fit).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_size",
                "max_positions", "type_vocab_size", "embedding_size", "norm_first",
                "scan_layers")


@dataclasses.dataclass
class Backbone:
  """A loaded encoder as host numpy arrays (pure dicts), reusable across seeds."""
  cfg: ModelConfig
  encoder: dict[str, Any] | None  # None: random init from the fine-tuning seed
  pooler: dict[str, Any] | None  # BERT's pooler {'dense': {kernel, bias}}, if the source had one
  source: str
  vocab: str | None = None  # the vocab the encoder was trained with (data.vocab), when known
  params: dict[str, Any] | None = None  # every parameter of a pre-training run (ckpt: only)
  heads: dict[str, Any] | None = None  # a HF folder's MLM (+ NSP) head, in an MLM run's layout


# ------------------------------------------------------------------------------ families
def family_of(model_type: str | None, where) -> Family:
  """The converter of config.json's `model_type`."""
  for family in FAMILIES:
    if model_type in family.model_types:
      return family
  known = sorted(t for f in FAMILIES for t in f.model_types)
  raise ValueError(f"{where}: model_type={model_type!r} has no converter here (known: "
                   f"{known}); encoder_jax reads {', '.join(f.name for f in FAMILIES)} folders.")


def hf_model_type(path) -> str | None:
  """config.json's model_type of a local HF folder ('bert', 'roberta', ...); None if there is
  no config.json with one (e.g. a pre-training workdir, whose config.json has none)."""
  if paths.is_uri(path):
    return None
  cfg_file = pathlib.Path(path) / "config.json"
  if not cfg_file.is_file():
    return None
  try:
    return json.loads(cfg_file.read_text()).get("model_type")
  except (ValueError, AttributeError):
    return None


def hf_weights(path, **overrides) -> Weights:
  """A HF folder of any registered family, read by its converter."""
  return family_of(hf_model_type(path), path).read(path, **overrides)


def hf_model_config(path, **overrides) -> ModelConfig:
  """The ModelConfig of a HF folder (for a random encoder of the same shape)."""
  hf = json.loads((pathlib.Path(path) / "config.json").read_text())
  return family_of(hf.get("model_type"), path).model_config(hf, **overrides)


def exporting_family(cfg: ModelConfig, obj: ObjectiveConfig
                     ) -> tuple[Family | None, list[tuple[Family, list[Gap]]]]:
  """(the first family that represents the run or None, every family's gaps in order)."""
  found = [(family, family.gaps(cfg, obj)) for family in FAMILIES]
  return next((f for f, gaps in found if not gaps), None), found


# ------------------------------------------------------------------------------ sources
def load_backbone(init: str, *, model_overrides: dict[str, Any] | None = None,
                  cache_dir=None) -> Backbone:
  """init: 'minilm' | 'hf:<dir>' | 'ckpt:<dir>' (a pre-training workdir or one of its
  checkpoint folders, local or gs://). `model_overrides` change numerics (dropout, dtype),
  never shapes."""
  overrides = dict(model_overrides or {})
  if init == "minilm" or init.startswith("hf:"):
    from encoder_jax.data.fetch import minilm_dir  # pylint: disable=g-import-not-at-top
    path = minilm_dir(cache_dir) if init == "minilm" else pathlib.Path(init[3:])
    w = hf_weights(path, **overrides)
    return Backbone(w.cfg, w.encoder, w.pooler, f"hf:{path}", hf_vocab(path), heads=w.heads)
  if init.startswith("ckpt:"):
    return load_run(init[5:], overrides)
  raise ValueError(f"init={init!r}; use 'minilm', 'hf:<dir>' or 'ckpt:<dir>'.")


def hf_vocab(folder: pathlib.Path) -> str | None:
  """The vocab a HF folder's model was trained with, as data.vocab names it: its vocab.txt
  (WordPiece), its vocab.json with merges.txt beside it (byte-level BPE), or None."""
  if (folder / "vocab.txt").is_file():
    return str(folder / "vocab.txt")
  if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
    return str(folder / "vocab.json")
  return None


def backbone_config(init: str, overrides: dict[str, Any], cache_dir=None
                    ) -> tuple[ModelConfig, str | None]:
  """(ModelConfig, vocab) of what load_backbone(init) would load, without reading weights."""
  if init == "minilm" or init.startswith("hf:"):
    from encoder_jax.data.fetch import minilm_dir  # pylint: disable=g-import-not-at-top
    path = minilm_dir(cache_dir) if init == "minilm" else pathlib.Path(init[3:])
    return hf_model_config(path, **overrides), hf_vocab(path)
  if init.startswith("ckpt:"):
    run = RunDir.find(init[5:])
    return _run_config(run, overrides), run.vocab
  raise ValueError(f"init={init!r}; use 'minilm', 'hf:<dir>' or 'ckpt:<dir>'.")


def _run_config(run: RunDir, overrides: dict[str, Any]) -> ModelConfig:
  cfg = run.model_cfg
  clash = {k: (v, getattr(cfg, k)) for k, v in overrides.items()
           if k in SHAPE_FIELDS and v != getattr(cfg, k)}
  if clash:
    raise ValueError(f"model overrides {clash} (given, in {run.config_file}) change shapes; "
                     "only numerics (dropout, dtype, ...) can be overridden.")
  return cfg.replace(**overrides)


def load_run(path, overrides: dict[str, Any] | None = None, *, report=print) -> Backbone:
  """A pre-training run's encoder (ELECTRA: the discriminator), its pooler when trained with
  NSP/SOP, and every parameter of the run, from its newest checkpoint whose checksums verify
  (or the checkpoint folder named). The ModelConfig is the run's own, every field of it."""
  run = RunDir.find(path)
  cfg = _run_config(run, dict(overrides or {}))
  step = run.good_step(report=report)
  model = run.model(step)
  host = lambda m: None if m is None else jax.tree.map(
      np.asarray, nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  if run.setup.obj.is_electra:
    encoder, pooler = model.discriminator, model.pooler
  else:
    encoder, pooler = model.bert.encoder, model.bert.pooler
  return Backbone(cfg, host(encoder), host(pooler),
                  f"ckpt:{run.checkpoints / str(step)}", run.vocab, host(model))
