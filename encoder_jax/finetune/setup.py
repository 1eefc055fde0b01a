"""ConfigDict -> Settings: the one place where a fine-tuning run reads its config.

  s = setup.build(config)        # checks every key and value, then freezes them
  s.task                         # the TaskSpec (tasks.py)
  s.backbone, s.data, s.train    # where the encoder comes from, what is read and how it is
  s.output                       #   encoded, how each seed trains; what is written besides
  s.seeds, s.seed, s.mesh

finetune_and_evaluate (run.py) calls `build` first and passes only these frozen settings on;
the trainer (trainer.py) reads `TrainSettings`. `check` fails a typo before any work: a key
that configs/finetune.py does not have (`--config.epocs`, `c.pooling_type = ...` in a script;
the close spelling is named), a ModelConfig override that is no ModelConfig field, an unknown
task, init or pooling, numbers out of range, and `export_embeddings` splits the task lacks
(which would otherwise fail after the first seed's training). The ConfigDict itself survives
only as `Settings.config`, the JSON text results.json records.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any

import ml_collections

from encoder_jax.finetune import tasks as tasks_lib
from encoder_jax.model.config import SIZES, ModelConfig


class ConfigError(ValueError):
  """A fine-tuning config value that cannot run; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class BackboneSettings:
  """Where the encoder comes from and how text reaches it."""
  init: str  # minilm | hf:<dir> | ckpt:<dir> | random
  random_like: str  # init=random: a size name, minilm, hf:<dir> or ckpt:<dir> (its shape)
  vocab: str  # "": the source's own vocab (BERT uncased for minilm / random)
  lowercase: bool
  model: tuple[tuple[str, Any], ...]  # ModelConfig overrides: numerics (shapes: random init)
  pooling: str  # classifier input: cls | mean
  cache_dir: str | None

  @property
  def overrides(self) -> dict[str, Any]:
    return dict(self.model)


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """What is read of the task's splits and how it is encoded."""
  max_length: int
  doc_stride: int  # SQuAD
  max_query_length: int  # SQuAD
  max_train_examples: int  # 0: all
  max_eval_examples: int  # 0: all
  data_dir: str | None
  cache_dir: str | None
  download: bool


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """What one seed's training reads (encoder_jax.finetune.trainer)."""
  learning_rate: float
  weight_decay: float
  warmup_frac: float
  clip_grad_norm: float
  layer_decay: float
  freeze_encoder: bool
  dropout: bool
  epochs: int
  batch_size: int
  eval_batch_size: int
  length_bucket: int
  group_by_length: bool
  log_every: int
  max_answer_length: int
  null_threshold: float
  eval_dev: bool = True


@dataclasses.dataclass(frozen=True)
class OutputSettings:
  """What a run writes besides results.json and results.md."""
  save_best: bool
  export_embeddings: tuple[str, ...]  # splits whose pooled embeddings are exported
  export_pooling: str  # cls | mean


@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything a fine-tuning run reads, derived once from the ConfigDict (`build`)."""
  task: tasks_lib.TaskSpec
  backbone: BackboneSettings
  data: DataSettings
  train: TrainSettings
  output: OutputSettings
  seeds: int
  seed: int
  mesh: Any  # "auto" or (data, fsdp, tensor) sizes (encoder_jax.train.sharding)
  config: str  # the whole ConfigDict as JSON, as results.json records it


_OPTIONAL = {"eval_dev": True, "mesh": "auto"}  # keys older configs may lack, and their default
_PARTS = {"backbone": BackboneSettings, "data": DataSettings, "train": TrainSettings,
          "output": OutputSettings}
# The config's keys are the settings' fields: those of each part and Settings' own.
KEYS = frozenset(f.name for cls in (*_PARTS.values(), Settings) for f in dataclasses.fields(cls)
                 if f.name not in _PARTS and f.name != "config")
_SOURCES = "'minilm', 'hf:<dir>' or 'ckpt:<dir>'"
_POOLINGS = ("cls", "mean")


def _unknown(keys, known, where: str) -> str | None:
  """A line naming the first key not in `known` and the closest known spelling, or None."""
  for key in sorted(set(keys) - set(known)):
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"did you mean '{where}{close[0]}'?" if close else f"known: {sorted(known)}"
    return f"unknown fine-tuning config key '{where}{key}': {hint}"
  return None


def _check_keys(config: ml_collections.ConfigDict) -> None:
  missing = sorted(KEYS - set(config.keys()) - set(_OPTIONAL))
  if missing:
    raise ConfigError(f"the fine-tuning config lacks {missing}: build it from configs/finetune.py "
                      "(get_config) and override what differs.")
  line = (_unknown(config.keys(), KEYS, "") or
          _unknown(config.model.keys(), {f.name for f in dataclasses.fields(ModelConfig)},
                   "model."))
  if line:
    raise ConfigError(line + " (configs/finetune.py lists every key)")


def _check_sources(c: ml_collections.ConfigDict) -> None:
  is_source = lambda s: s == "minilm" or s.startswith(("hf:", "ckpt:"))
  if c.init != "random" and not is_source(c.init):
    raise ConfigError(f"init={c.init!r}; use {_SOURCES} or 'random'.")
  if c.init == "random" and c.random_like not in SIZES and not is_source(c.random_like):
    raise ConfigError(f"random_like={c.random_like!r}; use {_SOURCES} or a size "
                      f"{sorted(SIZES)}.")
  for key in ("pooling", "export_pooling"):
    if c[key] not in _POOLINGS:
      raise ConfigError(f"{key}={c[key]!r}; use {' or '.join(_POOLINGS)}.")


def _check_numbers(c: ml_collections.ConfigDict) -> None:
  at_least = {"seeds": 1, "epochs": 0, "batch_size": 1, "eval_batch_size": 1, "max_length": 2,
              "length_bucket": 0, "doc_stride": 1, "max_query_length": 1,
              "max_answer_length": 1, "max_train_examples": 0, "max_eval_examples": 0,
              "log_every": 1}
  for key, least in at_least.items():
    if c[key] < least:
      raise ConfigError(f"{key}={c[key]}: must be >= {least}.")
  if not c.learning_rate > 0:
    raise ConfigError(f"learning_rate={c.learning_rate}: must be > 0.")
  for key in ("layer_decay", "warmup_frac"):
    if not 0 <= c[key] <= 1:
      raise ConfigError(f"{key}={c[key]}: must be in [0, 1].")


def check(config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line naming the key and the fix, what would fail or silently do something
  else later: unknown keys (a typo), unknown task, init, random_like or pooling, numbers out
  of range, export_embeddings splits the task does not have."""
  _check_keys(config)
  spec = tasks_lib.get_task(config.task)
  _check_sources(config)
  _check_numbers(config)
  for split in _splits(config.export_embeddings):
    if split not in spec.splits:
      raise ConfigError(f"export_embeddings: {spec.name} has no split {split!r}; choose from "
                        f"{list(spec.splits)}.")


def _splits(text: str) -> tuple[str, ...]:
  return tuple(s for s in text.split(",") if s)


def build(config: ml_collections.ConfigDict) -> Settings:
  """The run's frozen settings; `check` first. Nothing below reads the ConfigDict again."""
  check(config)
  c = {k: config.get(k, _OPTIONAL.get(k)) for k in KEYS}
  c.update(task=tasks_lib.get_task(c["task"]), model=tuple(sorted(config.model.to_dict().items())),
           cache_dir=c["cache_dir"] or None, data_dir=c["data_dir"] or None,
           export_embeddings=_splits(c["export_embeddings"]),
           mesh=tuple(c["mesh"]) if isinstance(c["mesh"], (list, tuple)) else c["mesh"])
  make = lambda cls: cls(**{f.name: c[f.name] for f in dataclasses.fields(cls)})
  return Settings(**{name: make(cls) for name, cls in _PARTS.items()},
                  **{k: c[k] for k in ("task", "seeds", "seed", "mesh")},
                  config=json.dumps(config.to_dict(), sort_keys=True, default=str))
