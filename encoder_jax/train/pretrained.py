"""An encoder's parameters from wherever they are, in one place: what a new pre-training run
(`config.init_from`, train/init_from.py) and fine-tuning (`init=`, encoder_jax.finetune) start
from.

  b = load_backbone("minilm")             # all-MiniLM-L6-v2 (fetched, sha256-checked)
  b = load_backbone("hf:runs/x/hf")       # a HF folder of any family encoder_jax.hf reads
  b = load_backbone("ckpt:runs/x")        # a pre-training run (run_dir.py reads it)
  b.cfg, b.encoder, b.pooler, b.vocab     # ModelConfig, host arrays, the vocab it used
  b.heads, b.params                       # a HF folder's MLM head; every parameter of a run
  cfg, vocab = backbone_config("hf:runs/x/hf", overrides)   # the same, no weights read

Layering: a HF folder is read by encoder_jax.hf (the families, which know nothing of runs) and
a run by run_dir.py, both at or below this package; so the trainer loads config.init_from
itself (loop.train_and_evaluate), and fine-tuning, a layer up, loads through the same
functions. Exporting a run (encoder_jax.convert.export) is the only HF code above the trainer.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
import numpy as np
from flax import nnx

from encoder_jax import hf
from encoder_jax.model.config import ModelConfig
from encoder_jax.train.run_dir import RunDir

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


def load_backbone(init: str, *, model_overrides: dict[str, Any] | None = None,
                  cache_dir=None) -> Backbone:
  """init: 'minilm' | 'hf:<dir>' | 'ckpt:<dir>' (a pre-training workdir or one of its
  checkpoint folders, local or gs://). `model_overrides` change numerics (dropout, dtype),
  never shapes."""
  overrides = dict(model_overrides or {})
  if (folder := _hf_folder(init, cache_dir)) is not None:
    w = hf.read(folder, **overrides)
    return Backbone(w.cfg, w.encoder, w.pooler, f"hf:{folder}", hf.vocab(folder),
                    heads=w.heads)
  return load_run(_run_path(init), overrides)


def backbone_config(init: str, overrides: dict[str, Any], cache_dir=None
                    ) -> tuple[ModelConfig, str | None]:
  """(ModelConfig, vocab) of what load_backbone(init) would load, without reading weights."""
  if (folder := _hf_folder(init, cache_dir)) is not None:
    return hf.model_config(folder, **overrides), hf.vocab(folder)
  run = RunDir.find(_run_path(init))
  return _run_config(run, overrides), run.vocab


def _hf_folder(init: str, cache_dir) -> pathlib.Path | None:
  """The HF folder `init` names (minilm's: fetched), None for a run."""
  if init == "minilm":
    from encoder_jax.data.fetch import minilm_dir  # pylint: disable=g-import-not-at-top
    return minilm_dir(cache_dir)
  return pathlib.Path(init[3:]) if init.startswith("hf:") else None


def _run_path(init: str) -> str:
  if not init.startswith("ckpt:"):
    raise ValueError(f"init={init!r}; use 'minilm', 'hf:<dir>' or 'ckpt:<dir>'.")
  return init[5:]


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
