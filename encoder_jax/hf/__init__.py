"""HF transformers families: their folders (config.json, safetensors, tokenizer files) to our
parameter trees and back, and which runs each family can hold.

  hf.model_type(folder)        config.json's model_type ('bert', 'roberta', ...), or None
  hf.read(folder)              a folder of any family in FAMILIES -> Weights (ModelConfig,
                               encoder, pooler, MLM/NSP heads in our layout; host arrays)
  hf.model_config(folder)      its ModelConfig alone (a random encoder of the same shape)
  hf.vocab(folder)             the vocab its model was trained with (vocab.txt or vocab.json)
  hf.exporting_family(cfg, obj)  which family represents a pre-training run, and every
                               family's gaps

One module per family (bert.py, roberta.py, electra.py, modernbert.py) defines its FAMILY
(families.py says what a family provides). FAMILIES is the registry, in the order export tries
them. RoBERTa comes before BERT: it only claims runs of RoBERTa's shape (MLM alone, one token
type), which BERT could hold too; everything else with BERT's shape is BERT's. ELECTRA takes
the ELECTRA runs and the MLM runs with an embedding projection (as ElectraForMaskedLM).
ModernBERT takes the runs of its block (pre-LN, RoPE, GeGLU, bias-free, local windows; the
BERT-block families refuse every one of those), MLM or ELECTRA (the discriminator). A new
family is a module with its FAMILY, added here.

Layering: this package reads and writes HF folders and knows nothing of runs, so it sits below
the trainer (encoder_jax.train), which reads `init_from` HF folders through it
(train/pretrained.py); exporting a run (encoder_jax.convert.export) sits above both.
"""
from __future__ import annotations

import json
import pathlib

from encoder_jax import paths
from encoder_jax.hf import bert, electra, modernbert, roberta
from encoder_jax.hf.families import Family, Gap, Weights
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.pretraining import ObjectiveConfig

FAMILIES: tuple[Family, ...] = (roberta.FAMILY, bert.FAMILY, electra.FAMILY, modernbert.FAMILY)


def family_of(model_type: str | None, where) -> Family:
  """The converter of config.json's `model_type`."""
  for family in FAMILIES:
    if model_type in family.model_types:
      return family
  known = sorted(t for f in FAMILIES for t in f.model_types)
  raise ValueError(f"{where}: model_type={model_type!r} has no converter here (known: "
                   f"{known}); encoder_jax reads {', '.join(f.name for f in FAMILIES)} folders.")


def model_type(path) -> str | None:
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


def read(path, **overrides) -> Weights:
  """A HF folder of any registered family, read by its converter."""
  return family_of(model_type(path), path).read(path, **overrides)


def model_config(path, **overrides) -> ModelConfig:
  """The ModelConfig of a HF folder (for a random encoder of the same shape)."""
  hf = json.loads((pathlib.Path(path) / "config.json").read_text())
  return family_of(hf.get("model_type"), path).model_config(hf, **overrides)


def vocab(folder) -> str | None:
  """The vocab a HF folder's model was trained with, as data.vocab names it: its vocab.txt
  (WordPiece), its vocab.json with merges.txt beside it (byte-level BPE), or None."""
  folder = pathlib.Path(folder)
  if (folder / "vocab.txt").is_file():
    return str(folder / "vocab.txt")
  if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
    return str(folder / "vocab.json")
  return None


def exporting_family(cfg: ModelConfig, obj: ObjectiveConfig
                     ) -> tuple[Family | None, list[tuple[Family, list[Gap]]]]:
  """(the first family that represents the run or None, every family's gaps in order)."""
  found = [(family, family.gaps(cfg, obj)) for family in FAMILIES]
  return next((f for f, gaps in found if not gaps), None), found
