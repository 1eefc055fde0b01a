"""What a converter of one HF transformers family (BERT, RoBERTa, ELECTRA, ...) provides.

Each family is one module (bert.py, roberta.py, electra.py, modernbert.py) that defines
`FAMILY = Family(...)`; encoder_jax.hf.FAMILIES lists them in the order export tries
them. A family maps the parameter tree both ways and says, for a pre-training run, whether it
can represent it, and if not, why (a list of `Gap`s, empty when HF computes what we compute):

  name         "RoBERTa": for messages
  model_types  the config.json `model_type` values it reads ("roberta",)
  gaps         (ModelConfig, ObjectiveConfig) -> [Gap]: what in that run the family has no
               place for; [] = it exports exactly
  model_config HF config.json (a dict) + overrides -> our ModelConfig
  read         (HF folder, **ModelConfig overrides) -> Weights: the encoder and whatever heads
               the folder holds, in our layout
  export       (our pre-training model, out, *, vocab, pad_id) -> [Written]: the folders
               written, each with the transformers class that loads it and our model's
               output its `.logits` must equal

A new family (ModernBERT, ...) is a new module with its FAMILY, added to hf.FAMILIES; export,
fine-tuning (hf:<dir>) and init_from pick it up from there.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

import numpy as np

from encoder_jax.model.config import ModelConfig, bert_block_departures
from encoder_jax.objectives.pretraining import ObjectiveConfig


@dataclasses.dataclass(frozen=True)
class Gap:
  """One setting of a run that a family cannot represent."""
  switch: str  # the setting as it is set: "model.position_bias='alibi'"
  why: str  # what the family has instead, no ';': "HF has learned absolute positions only"
  # The values that close the gap: ModelConfig fields, or "objective.<field>" for the
  # objective's (the nearest configuration that exports is the run's with these).
  fix: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class Weights:
  """A HF folder's parameters in our layout (host numpy arrays, nested dicts)."""
  cfg: ModelConfig
  encoder: dict[str, Any]  # an Encoder's parameters
  pooler: dict[str, Any] | None = None  # BERT's pooler {'dense': ...}, when the folder has one
  # The folder's other parameters where an MLM run (BertForPreTraining) keeps them:
  # {'mlm': ..., 'nsp': ...}; None when it has no MLM head.
  heads: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Written:
  """One exported folder."""
  folder: pathlib.Path
  hf_class: str  # "RobertaForMaskedLM"
  auto_class: str  # the transformers Auto class that loads it: "AutoModelForMaskedLM"
  # (input_ids [B, T], mask [B, T]) -> what our model computes where HF's output `output`
  # is (its .logits, or .last_hidden_state for a model without a head)
  ours: Callable[[np.ndarray, np.ndarray], np.ndarray]
  dropped: tuple[str, ...] = ()  # heads of our model HF's class has no place for
  output: str = "logits"


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  model_types: tuple[str, ...]
  gaps: Callable[[ModelConfig, ObjectiveConfig], list[Gap]]
  model_config: Callable[..., ModelConfig]
  read: Callable[..., Weights]
  export: Callable[..., list[Written]]


def encoder_gaps(cfg: ModelConfig) -> list[Gap]:
  """What the BERT-block families (BERT, RoBERTa, ELECTRA) have no place for: they are post-LN
  encoders with learned absolute positions and BERT's block (LayerNorm with bias, biased
  linears, a plain FFN, no rotary embeddings or windows; model.config.bert_block_departures).
  ModernBERT's family has its own list (modernbert.gaps)."""
  gaps = [Gap(f"model.{name}={getattr(cfg, name)!r}",
              f"HF's BERT block has no place for {why.split(' (')[0]}", ((name, bert),))
          for name, bert, why in bert_block_departures(cfg)]
  if cfg.norm_first:
    gaps.append(Gap("model.norm_first=True", "HF's blocks are post-LN",
                    (("norm_first", False),)))
  if cfg.position_bias != "none":
    gaps.append(Gap(f"model.position_bias={cfg.position_bias!r}",
                    "HF has learned absolute positions only", (("position_bias", "none"),)))
  return gaps


def mlm_head_gaps(cfg: ModelConfig, family: str) -> list[Gap]:
  """RoBERTa's and ELECTRA's MLM heads apply exact GELU whatever hidden_act says; ours applies
  model.activation."""
  if cfg.activation == "gelu":
    return []
  return [Gap(f"model.activation={cfg.activation!r}",
              f"HF {family}'s MLM head always applies exact GELU", (("activation", "gelu"),))]


def apply_fix(cfg: ModelConfig, obj: ObjectiveConfig, gaps: list[Gap]
              ) -> tuple[ModelConfig, ObjectiveConfig]:
  """(cfg, obj) with every gap's fix applied."""
  model, objective = {}, {}
  for gap in gaps:
    for key, value in gap.fix:
      if key.startswith("objective."):
        objective[key.removeprefix("objective.")] = value
      else:
        model[key] = value
  return cfg.replace(**model), dataclasses.replace(obj, **objective)


def fix_flags(gaps: list[Gap]) -> str:
  """The command-line overrides that close `gaps`: --config.model.norm_first=False ..."""
  flags = {}
  for gap in gaps:
    for key, value in gap.fix:
      # (a ConfigDict leaf is never None: configs/pretrain.py's 0 means "unset" there)
      flags[key if key.startswith("objective.") else f"model.{key}"] = (
          0 if value is None else value)
  return " ".join(f"--config.{k}={v}" for k, v in flags.items())
