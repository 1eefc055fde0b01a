"""ConfigDict -> Setup: the one place where a pre-training run reads its config.

  s = setup.build(config)          # checks the config, resolves every "auto", freezes it
  s.model_cfg, s.obj, s.optim_cfg  # the layers', objective's and optimizer's frozen configs
  s.data, s.train                  # DataSettings, TrainSettings: what the loop reads
  loader = setup.make_loader(s.data, "train")

The loop (train/loop.py) and recovery (train/recovery.py) take a Setup and never see the
ConfigDict: a value they use is a typed field here, checked once (`check_train_config`), so a
typo in a key fails at start-up, not hours into a run. The ConfigDict itself survives only as
`Setup.config_json`, the text a run records in its workdir (config.json).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from absl import logging
from etils import epath
import jax
import ml_collections

from encoder_jax.data import examples, pipeline, tokenizer
from encoder_jax.data.vocab import resolve_vocab
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives import pretraining
from encoder_jax.train import flops as flops_lib
from encoder_jax.train import sharding
from encoder_jax.train import step as step_lib
from encoder_jax.train.optim import OptimConfig, build_optimizer, learning_rate_schedule

CONFIG_FILE = "config.json"


class ConfigError(ValueError):
  """A config value the trainer cannot run with; the message names the key and the fix."""


def check_train_config(config: ml_collections.ConfigDict) -> None:
  """Refuses values that would silently do something else than asked (e.g. steps=-5 ran 0)."""
  t = config.train
  if t.steps < 0:
    raise ConfigError(f"train.steps={t.steps}: give a positive number of steps, or 0 to derive "
                      "them from train.flops_budget.")
  if t.flops_budget < 0:
    raise ConfigError(f"train.flops_budget={t.flops_budget:g}: give a positive budget, or 0 "
                      "for none.")
  if not t.steps and not t.flops_budget:
    raise ConfigError("train.steps=0 means 'derive from train.flops_budget', but the budget is "
                      "0 too; set one of them (e.g. --config.train.steps=1000).")
  for key in ("log_every", "eval_every", "checkpoint_every", "eval_steps", "resume_step",
              "skip_batches"):
    if t.get(key, 0) < 0:
      raise ConfigError(f"train.{key}={t[key]}: must be >= 0 (0 means never / none).")
  if config.get("phase", 1) == 2 and not config.get("init_from"):
    raise ConfigError("phase=2 continues a phase-1 run: give --config.init_from=<phase-1 "
                      "workdir> (BERT's seq-512 phase starts from phase 1's parameters).")
  if t.keep < 1:
    raise ConfigError(f"train.keep={t.keep}: keep at least one checkpoint, or resume is "
                      "impossible.")
  if t.get("skip_batches", 0) and not t.get("resume_step", 0):
    raise ConfigError(f"train.skip_batches={t.skip_batches} needs train.resume_step: the "
                      "checkpoint after which the batches are skipped.")


# ------------------------------------------------------------------ config -> static pieces


def _is_auto(value) -> bool:
  return isinstance(value, str) and value.strip().lower() == "auto"


def resolve_layers(scan_layers: bool | str, remat_policy: str,
                   backend: str | None = None) -> tuple[bool, str]:
  """`model.scan_layers` and `model.remat_policy` as ModelConfig takes them, for `backend`
  (default: JAX's). "auto" (configs/pretrain.py, where the measurements are): scanned layers
  on TPU/GPU, unrolled on CPU; remat "dots" for scanned layers, "none" for unrolled ones.
  scan_layers may also be a bool or the strings a command line gives ("True", "false", "1")."""
  if _is_auto(scan_layers):
    scan_layers = (backend or jax.default_backend()) != "cpu"
  elif isinstance(scan_layers, str):
    choices = {"true": True, "1": True, "false": False, "0": False}
    if scan_layers.strip().lower() not in choices:
      raise ConfigError(f"model.scan_layers={scan_layers!r}; use auto, True or False.")
    scan_layers = choices[scan_layers.strip().lower()]
  if _is_auto(remat_policy):
    remat_policy = "dots" if scan_layers else "none"
  return bool(scan_layers), remat_policy


def settle_layers(config: ml_collections.ConfigDict, workdir=None,
                  backend: str | None = None) -> None:
  """Writes what "auto" resolves to (`resolve_layers`) into config.model.scan_layers and
  remat_policy, so the run's config.json records the layout its checkpoints have. A run that
  resumes in `workdir` keeps the layout recorded there (a run started on a TPU and resumed on
  a CPU must restore the same parameter structure); a new run takes its platform's. Likewise
  the token table's padding: a run recorded before model.vocab_pad_multiple existed resumes
  with its unpadded table (1)."""
  m = config.model
  record = epath.Path(workdir) / CONFIG_FILE if workdir is not None else None
  recorded_model = {}
  if record is not None and record.exists():
    try:
      recorded_model = dict(json.loads(record.read_text())["model"])
    except (ValueError, KeyError, TypeError):
      recorded_model = {}  # no readable record: decided as for a new run
  recorded = recorded_model.get("scan_layers", "auto")
  if _is_auto(m.scan_layers) and not _is_auto(recorded):
    m.scan_layers = str(recorded)
  if recorded_model and "vocab_pad_multiple" in m:
    m.vocab_pad_multiple = int(recorded_model.get("vocab_pad_multiple", 1))
  scan, remat = resolve_layers(m.scan_layers, m.remat_policy, backend)
  m.scan_layers = str(scan) if isinstance(m.scan_layers, str) else scan
  m.remat_policy = remat


def resolve_numerics(dtype: str, backend: str | None = None) -> str:
  """`model.dtype` as ModelConfig takes it, for `backend` (default: JAX's). "auto"
  (configs/pretrain.py precision=auto): bfloat16 activations and matmuls on TPU/GPU, where
  the MXU / tensor cores take bf16 operands and bf16 activations halve the HBM traffic;
  float32 on CPU, where model.dot_dtype="auto" then rounds only the matmul operands to bf16
  on a CPU with AVX-512 BF16 / AMX (encoder_jax.model.matmul: XLA:CPU's bf16-result dots are
  slower than fp32). Parameters, gradients and optimizer state stay model.param_dtype."""
  if _is_auto(dtype):
    return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"
  return dtype


def model_config(config: ml_collections.ConfigDict, vocab_size: int,
                 backend: str | None = None, pad_id: int | None = None) -> ModelConfig:
  """The frozen ModelConfig of `config.model`, with the tokenizer's vocabulary size and every
  "auto" resolved for `backend` (default: JAX's): the layer layout (`resolve_layers`), the
  compute dtype (`resolve_numerics`), and -- through ModelConfig.platform -- the attention path
  and dot dtype the layers pick while tracing. So a step lowered on a CPU host for a TPU
  topology (compile_check, bench/tpu_aot.py) is the TPU's program."""
  backend = backend or jax.default_backend()
  d = config.model.to_dict()
  d["scan_layers"], d["remat_policy"] = resolve_layers(d["scan_layers"], d["remat_policy"],
                                                       backend)
  d["dtype"] = resolve_numerics(d["dtype"], backend)
  d["platform"] = backend
  d["embedding_size"] = d.get("embedding_size") or None  # 0 in the ConfigDict means "= d"
  if d.get("vocab_size", vocab_size) != vocab_size:
    logging.info("model.vocab_size=%s replaced by the tokenizer's %d", d["vocab_size"],
                 vocab_size)
  d["vocab_size"] = vocab_size
  if pad_id is not None:  # the tokenizer's: 0 for BERT's WordPiece, 1 for RoBERTa's BPE
    d["pad_token_id"] = pad_id
  cfg = ModelConfig.from_dict(d)
  if config.data.max_length > cfg.max_positions:
    raise ValueError(f"data.max_length={config.data.max_length} exceeds model.max_positions="
                     f"{cfg.max_positions}; shorten the rows or raise max_positions.")
  return cfg


def objective_config(config: ml_collections.ConfigDict,
                     tok: tokenizer.SubwordTokenizer) -> pretraining.ObjectiveConfig:
  o = config.objective
  max_pred = o.max_predictions or pretraining.default_max_predictions(
      o.objective, o.mask_rate, config.data.max_length)
  specials = tuple(sorted({tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id}))
  return pretraining.ObjectiveConfig(
      objective=o.objective, sentence_task=o.sentence_task, vocab_size=tok.vocab_size,
      mask_id=tok.mask_id, special_ids=specials, mask_rate=o.mask_rate,
      max_predictions=max_pred, mask_frac=o.mask_frac, random_frac=o.random_frac,
      whole_word=o.whole_word, gen_hidden_frac=o.gen_hidden_frac,
      gen_layers_frac=o.gen_layers_frac, temperature=o.temperature, disc_weight=o.disc_weight,
      masking=o.get("masking", "dynamic"), dupe_factor=o.get("dupe_factor", 10))


def example_config(config: ml_collections.ConfigDict) -> examples.ExampleConfig:
  task = config.objective.sentence_task
  ex = examples.ExampleConfig(format=config.data.format, max_length=config.data.max_length,
                              nsp=task == "nsp", sop=task == "sop", pack=config.data.pack,
                              short_seq_prob=config.data.short_seq_prob, seed=config.seed)
  ex.validate()
  return ex


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """config.data (and the seed), as the loaders read it."""
  source: str
  vocab: str
  batch_size: int  # global
  eval_split: str
  data_dir: str | None
  cache_dir: str | None
  source_data_dir: str | None
  worker_count: int
  build_workers: int
  shard_docs: int
  blank_line_docs: bool  # files: one document per blank-line-separated block
  example: examples.ExampleConfig  # the row format, length and plan seed
  example_ids: bool  # batches carry example_id / epoch (static masking keys on them)
  seed: int  # the loader's shuffle

  @classmethod
  def of(cls, config: ml_collections.ConfigDict) -> DataSettings:
    d = config.data
    return cls(source=d.source, vocab=d.vocab, batch_size=d.batch_size,
               eval_split=d.eval_split, data_dir=d.data_dir or None,
               cache_dir=d.cache_dir or None,
               source_data_dir=d.get("source_data_dir", "") or None,
               worker_count=d.worker_count, build_workers=d.get("build_workers", 2),
               shard_docs=d.get("shard_docs", examples.DOCS_PER_SHARD),
               blank_line_docs=bool(d.get("blank_line_docs", False)),
               example=example_config(config),
               example_ids=config.objective.get("masking", "dynamic") == "static",
               seed=config.seed)


def make_loader(d: DataSettings, split: str) -> pipeline.Loader:
  """This host's loader over `split` of the run's row shards (built once; data/shards.py)."""
  return pipeline.pretrain_loader(
      source=d.source, vocab=d.vocab, split=split, example=d.example,
      global_batch_size=d.batch_size, seed=d.seed, data_dir=d.data_dir, cache_dir=d.cache_dir,
      worker_count=d.worker_count, example_ids=d.example_ids, build_workers=d.build_workers,
      shard_docs=d.shard_docs, source_data_dir=d.source_data_dir,
      blank_line_docs=d.blank_line_docs)


def abstract_batch(d: DataSettings, batch_sharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batches make_loader's loaders yield, as shapes and dtypes placed by
  `batch_sharding` (pipeline.batch_spec; no corpus is read): what an ahead-of-time compile of
  the train or eval step takes."""
  spec = pipeline.batch_spec(d.example, d.batch_size, example_ids=d.example_ids)
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
          for k, (shape, dtype) in spec.items()}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """config.train, as the loop and recovery read it (checked by check_train_config)."""
  steps: int
  flops_budget: float
  log_every: int
  eval_every: int
  checkpoint_every: int
  eval_steps: int
  keep: int
  resume_step: int
  skip_batches: int
  peak_flops: float
  profile_steps: int
  profile_num_steps: int

  @classmethod
  def of(cls, config: ml_collections.ConfigDict) -> TrainSettings:
    t = config.train
    return cls(steps=t.steps, flops_budget=t.flops_budget, log_every=t.log_every,
               eval_every=t.eval_every, checkpoint_every=t.checkpoint_every,
               eval_steps=t.eval_steps, keep=t.keep, resume_step=t.get("resume_step", 0),
               skip_batches=t.get("skip_batches", 0), peak_flops=t.get("peak_flops", 0.0),
               profile_steps=t.get("profile_steps", 0),
               profile_num_steps=t.get("profile_num_steps", 3))


WARMUP_SHARE_OF_SHORT_RUNS = 0.1


def optim_config(optim: dict, steps: int) -> tuple[OptimConfig, tuple[str, ...]]:
  """config.optim (as a dict) for a run of `steps` step calls -> (OptimConfig, notes to print).

  optim.total_steps = 0 (the default) is the run's own length in updates, steps /
  accumulation_steps. A warm-up at least that long (the configs' BERT default of 10,000 steps
  in a 100-step run) would never reach the peak: it is scaled to WARMUP_SHARE_OF_SHORT_RUNS of
  the run (10%, rounded up), and a note says so and names the override. BERT warmed up over 1%
  of its 1M steps and RoBERTa over 4.8% (24k of 500k); 10% is the usual share for short runs.
  A total_steps given explicitly with a longer warm-up is a contradiction and is refused."""
  od = dict(optim)
  notes = []
  if not od["total_steps"]:
    od["total_steps"] = max(1, steps // od["accumulation_steps"])
    if od["warmup_steps"] >= od["total_steps"] > 1:
      scaled = math.ceil(WARMUP_SHARE_OF_SHORT_RUNS * od["total_steps"])
      notes.append(f"optim.warmup_steps={od['warmup_steps']} is not shorter than this run's "
                   f"{od['total_steps']} updates: warming up over {scaled} instead (10% of the "
                   f"run); give --config.optim.warmup_steps=<N> to choose")
      od["warmup_steps"] = scaled
  return OptimConfig.from_dict(od), tuple(notes)


def learning_rate_at(optim_cfg: OptimConfig, step: int) -> float:
  """The learning rate of step call `step` (updates are step // accumulation_steps)."""
  return float(learning_rate_schedule(optim_cfg)(step // optim_cfg.accumulation_steps))


def schedule_change_note(old_config_json: str, s: "Setup", step: int) -> str | None:
  """What a resume at `step` does to the learning-rate schedule when the recorded config's
  (`old_config_json`, the run's config.json) differs from this one's; None when it does not."""
  try:
    old = ml_collections.ConfigDict(json.loads(old_config_json))
    old_steps = old.train.steps or s.end_step
    old_cfg, _ = optim_config(old.optim.to_dict(), old_steps)
  except (ValueError, KeyError, AttributeError, TypeError):
    return None
  if old_cfg == s.optim_cfg:
    return None
  before, after = learning_rate_at(old_cfg, step), learning_rate_at(s.optim_cfg, step)
  ended = " (the old schedule had ended)" if step >= old_cfg.total_steps * \
      old_cfg.accumulation_steps else ""
  return (f"resuming at step {step} with another learning-rate schedule: decay horizon "
          f"{old_cfg.total_steps} -> {s.optim_cfg.total_steps} updates, warm-up "
          f"{old_cfg.warmup_steps} -> {s.optim_cfg.warmup_steps}, peak {old_cfg.learning_rate:g} "
          f"-> {s.optim_cfg.learning_rate:g}; the learning rate at step {step} goes from "
          f"{before:.3g} to {after:.3g}{ended} and the schedule continues from there (to keep "
          f"the old one, give --config.optim.total_steps={old_cfg.total_steps} and "
          f"--config.optim.warmup_steps={old_cfg.warmup_steps})")


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything static about a run, derived once from the ConfigDict (`build`)."""
  model_cfg: ModelConfig
  obj: pretraining.ObjectiveConfig
  optim_cfg: OptimConfig
  trainer: step_lib.Trainer
  init_fn: Any
  flops_per_step: float
  tokens_per_step: int  # padded positions per step (what the hardware computes)
  end_step: int  # the run stops here ...
  planned_stop: str  # ... because of "steps" or "flops_budget"
  data: DataSettings
  train: TrainSettings
  mesh: Any  # config.mesh: "auto" or (data, fsdp, tensor) sizes (train/sharding.py)
  optim_sharding: str  # config.optim_sharding: "replicated" | "zero1" (train/sharding.py)
  init_from: str  # "" or where a new run's parameters come from (train/init_from.py)
  config_json: str  # the whole config, as the run records it in config.json


def build(config: ml_collections.ConfigDict, backend: str | None = None) -> Setup:
  """The run's static pieces; `backend` (default JAX's) is the platform the step is compiled
  for, whose choices every unsettled "auto" in config.model takes (`model_config`)."""
  check_train_config(config)
  # The same (cached) tokenizer the loaders use: tokenizer.load builds it once.
  tok = tokenizer.load(resolve_vocab(config.data.vocab, config.data.cache_dir or None))
  model_cfg = model_config(config, tok.vocab_size, backend, tok.pad_id)
  obj = objective_config(config, tok)
  gen_cfg = obj.generator_config(model_cfg)
  B, T = config.data.batch_size, config.data.max_length
  fps = flops_lib.train_flops_per_step(
      model_cfg, batch_size=B, seq_len=T, objective=obj.objective,
      max_predictions=obj.max_predictions, sparse_mlm=True, nsp=obj.sentence_task != "none",
      generator=gen_cfg)

  t = TrainSettings.of(config)
  budget_steps = math.ceil(t.flops_budget / fps) if t.flops_budget > 0 else None
  steps = t.steps or budget_steps
  end_step, planned = steps, "steps"
  if budget_steps is not None and budget_steps <= steps:
    end_step, planned = budget_steps, "flops_budget"

  optim_cfg, notes = optim_config(config.optim.to_dict(), steps)
  for note in notes:
    logging.info("%s", note)
  tx, schedule = build_optimizer(optim_cfg, num_layers=model_cfg.num_layers)
  trainer, init_fn = step_lib.create(model_cfg, obj, tx, schedule, config.seed,
                                     optim_cfg.accumulation_steps)
  mesh = config.get("mesh", "auto")
  return Setup(model_cfg, obj, optim_cfg, trainer, init_fn, fps, B * T, end_step, planned,
               data=DataSettings.of(config), train=t,
               mesh=tuple(mesh) if isinstance(mesh, (list, tuple)) else mesh,
               optim_sharding=sharding.check_optim_sharding(
                   config.get("optim_sharding", "replicated")),
               init_from=config.get("init_from", "") or "",
               config_json=config.to_json_best_effort(indent=2, sort_keys=True))
