"""train_and_evaluate(config, workdir): the pre-training loop around the jitted step.

  python -m encoder_jax.main --mode=pretrain --config=configs/pretrain.py:runlocal \
      --workdir=/tmp/demo_run

What a run leaves in `workdir`:
  config.json      the config of the newest checkpoints (the seed in it regenerates every RNG
                   key); config.before_step_<N>.json: the one a resume at step N replaced
  checkpoints/     Orbax, async, sealed with checksums (train/checkpoint.py): the newest
                   `train.keep` plus one rollback checkpoint; TrainState + data iterator + meta
  checkpoints_set_aside/  damaged checkpoints, the state that diverged, rolled-back branches
  metrics.jsonl    train rows every `train.log_every` steps, eval rows every `train.eval_every`
  tensorboard/     the same scalars as event files (tensorboardX)
  summary.json     steps, stop reason, wall time, tokens/s, MFU, final train/eval loss
The workdir may be a local folder or a bucket (--workdir=gs://bucket/runs/x): every file goes
through encoder_jax.paths (etils.epath). Process 0 alone writes config.json, metrics,
TensorBoard and the summary; checkpoints are written by all processes together (Orbax).

Steps are numbered by completed updates: "step s" is the state after s calls of the step, and
the metrics logged at s are those of the call that produced it. One call is one micro-batch;
with optim.accumulation_steps = k the optimizer applies an update every k calls. Intervals
(log_every, eval_every, checkpoint_every) of 0 mean "never periodically"; the end of a run
always logs, saves, and evaluates unless eval_steps = 0.

The loop is built from the pieces in encoder_jax.train.loop_parts (throughput meter, pending
metrics, rollback choice, schedule of periodic actions) and recovery.restore_or_init.

Behaviour a user relies on:
  * Resume: a workdir holding checkpoints continues from the newest good one (damaged ones are
    set aside): parameters, optimizer state, step, data iterator and the metrics of the open
    log window are restored, and masks/dropout/generator samples derive from
    fold_in(seed, step), so the continued run is the uninterrupted one, bit for bit (CPU),
    metrics.jsonl row for row, whatever the intervals.
  * Metrics stay on device and are fetched at log/eval/checkpoint steps; the host runs at most
    one step ahead of the device, so a signal is acted on within one step.
  * A non-finite loss or gradient norm stops the run with FloatingPointError naming the step.
    Every loss up to a step is checked before the state of that step is saved. The state that
    produced the bad step (the checkpoint just before it, if any) is set aside, and the
    *rollback* checkpoint, the newest one saved before the last evaluation with a finite loss
    (the last log row when evaluation is off), is kept whatever `keep` says: its next step
    was finite whatever the learning rate, as the loss of step c + 1 depends only on state c
    and its batch. The message gives the command to train on from it with
    train.resume_step, a lower optim.learning_rate and/or train.skip_batches (PaLM restarted
    ~100 steps before a loss spike and skipped 200-500 batches; Chowdhery et al. 2022, 5.1).
  * train.resume_step = S restarts from checkpoint S, setting newer ones aside, and skips the
    next train.skip_batches batches; checkpoints of that new branch record it, so re-running
    the same command after a preemption continues the branch instead of rolling back again.
  * SIGTERM (preemption) saves a checkpoint at the current step and returns normally, so the
    process exits 0 and the next start resumes. With several processes, a signal to any of
    them stops all of them after the same step (JAX's preemption sync), which they save.
  * train.flops_budget ends the run at the first step whose cumulative FLOPs reach it
    (analytic FLOPs, encoder_jax.train.flops), so ablations compare at equal compute.
"""
from __future__ import annotations

import dataclasses
import json
import math
import signal
import threading
import time
from typing import Any

from absl import logging
from etils import epath
import jax
import ml_collections
import numpy as np

from encoder_jax import paths
from encoder_jax.data import builders, examples, pipeline, shards, unigram
from encoder_jax.data.builders import resolve_vocab
from encoder_jax.data.tokenizer import WordPieceTokenizer
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives import pretraining
from encoder_jax.train import flops as flops_lib
from encoder_jax.train import init_from
from encoder_jax.train import loop_parts as parts
from encoder_jax.train import recovery
from encoder_jax.train import sharding
from encoder_jax.train import step as step_lib
from encoder_jax.train.checkpoint import Checkpointer
from encoder_jax.train.metrics_io import (MetricWriter, Stage, format_duration,
                                          progress_line)
from encoder_jax.train.optim import OptimConfig, build_optimizer

SUMMARY_FILE = "summary.json"
CONFIG_FILE = recovery.CONFIG_FILE


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
  if t.eval_every > 0 and t.eval_steps == 0:
    raise ConfigError(f"train.eval_every={t.eval_every} with train.eval_steps=0 asks for "
                      "evaluations of no batch: set eval_steps > 0, or eval_every=0.")
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
  a CPU must restore the same parameter structure); a new run takes its platform's."""
  m = config.model
  record = epath.Path(workdir) / CONFIG_FILE if workdir is not None else None
  if _is_auto(m.scan_layers) and record is not None and record.exists():
    try:
      recorded = json.loads(record.read_text())["model"]["scan_layers"]
    except (ValueError, KeyError, TypeError):
      recorded = "auto"  # no readable record: the platform decides, as for a new run
    if not _is_auto(recorded):
      m.scan_layers = str(recorded)
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
                 backend: str | None = None) -> ModelConfig:
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
  cfg = ModelConfig.from_dict(d)
  if config.data.max_length > cfg.max_positions:
    raise ValueError(f"data.max_length={config.data.max_length} exceeds model.max_positions="
                     f"{cfg.max_positions}; shorten the rows or raise max_positions.")
  return cfg


def objective_config(config: ml_collections.ConfigDict,
                     tok: WordPieceTokenizer) -> pretraining.ObjectiveConfig:
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


def corpus_builder(config: ml_collections.ConfigDict):
  """The tokenized corpus of `config.data` (built once, then read from the cache)."""
  d = config.data
  return builders.prepare_corpus(d.source, d.vocab, data_dir=d.data_dir or None,
                                 cache_dir=d.cache_dir or None,
                                 source_data_dir=d.get("source_data_dir", "") or None)


def _shard_args(config: ml_collections.ConfigDict) -> dict:
  d = config.data
  return dict(sharded=d.get("sharded", False), build_workers=d.get("build_workers", 2),
              shard_docs=d.get("shard_docs", shards.DEFAULT_DOCS_PER_SHARD),
              source_data_dir=d.get("source_data_dir", "") or None)


def _example_ids(config: ml_collections.ConfigDict) -> bool:
  """Batches carry example_id / epoch: static masking keys its masks on them."""
  return config.objective.get("masking", "dynamic") == "static"


def make_loader(config: ml_collections.ConfigDict, split: str) -> pipeline.Loader:
  d = config.data
  return pipeline.pretrain_loader(
      source=d.source, vocab=d.vocab, split=split, example=example_config(config),
      global_batch_size=d.batch_size, seed=config.seed, data_dir=d.data_dir or None,
      cache_dir=d.cache_dir or None, worker_count=d.worker_count,
      example_ids=_example_ids(config), **_shard_args(config))


def abstract_batch(config: ml_collections.ConfigDict, batch_sharding
                   ) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batches make_loader's loaders yield, as shapes and dtypes placed by
  `batch_sharding` (pipeline.batch_spec; no corpus is read): what an ahead-of-time compile of
  the train or eval step takes."""
  spec = pipeline.batch_spec(example_config(config), config.data.batch_size,
                             example_ids=_example_ids(config))
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
          for k, (shape, dtype) in spec.items()}


def train_unigram_counts(config: ml_collections.ConfigDict, vocab_size: int) -> np.ndarray:
  """Token counts of the training split: of the TFDS corpus's documents, or with data.sharded
  of the built rows (evenly spaced ones, so a mixture counts by its weights)."""
  d = config.data
  if not d.get("sharded", False):
    return unigram.unigram_counts(corpus_builder(config), "train", vocab_size)
  a = _shard_args(config)
  parts = shards.prepare_shards(d.source, d.vocab, example_config(config), d.data_dir or None,
                                d.cache_dir or None, workers=a["build_workers"],
                                docs_per_shard=a["shard_docs"],
                                source_data_dir=a["source_data_dir"])
  return unigram.row_counts(shards.ShardedRows(parts, "train"), vocab_size)


@dataclasses.dataclass
class Setup:
  """Everything static about a run, derived once from the ConfigDict."""
  model_cfg: ModelConfig
  obj: pretraining.ObjectiveConfig
  optim_cfg: OptimConfig
  trainer: step_lib.Trainer
  init_fn: Any
  flops_per_step: float
  tokens_per_step: int  # padded positions per step (what the hardware computes)
  end_step: int  # the run stops here ...
  planned_stop: str  # ... because of "steps" or "flops_budget"


def build(config: ml_collections.ConfigDict, backend: str | None = None) -> Setup:
  """The run's static pieces; `backend` (default JAX's) is the platform the step is compiled
  for, whose choices every unsettled "auto" in config.model takes (`model_config`)."""
  check_train_config(config)
  # The same (cached) tokenizer the loaders use: WordPieceTokenizer.load builds it once.
  tok = WordPieceTokenizer.load(resolve_vocab(config.data.vocab, config.data.cache_dir or None))
  model_cfg = model_config(config, tok.vocab_size, backend)
  obj = objective_config(config, tok)
  gen_cfg = obj.generator_config(model_cfg)
  B, T = config.data.batch_size, config.data.max_length
  fps = flops_lib.train_flops_per_step(
      model_cfg, batch_size=B, seq_len=T, objective=obj.objective,
      max_predictions=obj.max_predictions, sparse_mlm=True, nsp=obj.sentence_task != "none",
      generator=gen_cfg)

  t = config.train
  budget_steps = math.ceil(t.flops_budget / fps) if t.flops_budget > 0 else None
  steps = t.steps or budget_steps
  end_step, planned = steps, "steps"
  if budget_steps is not None and budget_steps <= steps:
    end_step, planned = budget_steps, "flops_budget"

  od = config.optim.to_dict()
  if not od["total_steps"]:
    od["total_steps"] = max(1, steps // od["accumulation_steps"])
  optim_cfg = OptimConfig.from_dict(od)
  tx, schedule = build_optimizer(optim_cfg, num_layers=model_cfg.num_layers)
  trainer, init_fn = step_lib.create(model_cfg, obj, tx, schedule, config.seed)
  return Setup(model_cfg, obj, optim_cfg, trainer, init_fn, fps, B * T, end_step, planned)

# ------------------------------------------------------------------------------ the run


def initial_state(init_fn, state_shardings=None):
  """init_fn under jit, placed by `state_shardings` (no host copy of the full state).

  On CPU the initialisers (a truncated normal per leaf) take XLA ~12 s of CPU to compile at
  the default optimisation level and ~2 s at level 0, for a program that runs once. Level 0
  rounds the erfinv of the truncated normal differently: values can differ from
  `jax.jit(init_fn)()` by 1 ulp (~7e-9). Every trainer run initialises this way, so runs
  remain reproducible from the seed.
  """
  jitted = jax.jit(init_fn, out_shardings=state_shardings)
  if jax.default_backend() == "cpu":
    return jitted.lower().compile(compiler_options={"xla_backend_optimization_level": 0})()
  return jitted()


def _say(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


class _Preemption:
  """Turns SIGTERM into a stop the loop polls with `due()` at the top of every step.

  One process: a Python signal handler sets a flag (signal handlers only exist in the main
  thread). Several processes must stop after the same step: one that stopped alone would
  enter the checkpoint save's collectives while the others run the next step's (a hang; with
  gloo, an abort). There JAX's preemption sync manager, started by jax.distributed.initialize,
  owns SIGTERM (a C++ handler): once any process got the signal, it agrees with every process
  on a step past where each one is, and `due()` turns True there on all of them. No Python
  handler is installed then, which would take the signal from it."""

  def __init__(self):
    self.flag = threading.Event()
    self.at = None  # perf_counter() when the signal came (one process) or was acted on
    self._old = None
    self._sync = jax.process_count() > 1 and self._sync_point(0) is not None
    self._calls = 0  # due() calls: the same count on every process (they start together)

  @staticmethod
  def _sync_point(n: int) -> bool | None:
    """Whether call `n` is the agreed stop; None without JAX's preemption service."""
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    try:
      return multihost_utils.reached_preemption_sync_point(n)
    except RuntimeError:  # (jax_enable_preemption_service=False)
      return None

  @property
  def what(self) -> str:
    return "every process agreed to stop" if self._sync else "the signal"

  def _handler(self, *_):
    self.at = self.at or time.perf_counter()
    self.flag.set()

  def due(self) -> bool:
    if self._sync:
      self._calls += 1
      if self._sync_point(self._calls):
        self.at = self.at or time.perf_counter()
        self.flag.set()
    return self.flag.is_set()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread() and not self._sync:
      self._old = signal.signal(signal.SIGTERM, self._handler)
    return self

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def sharded_abstract_state(init_fn, mesh) -> tuple[Any, Any]:
  """(the state's shapes with their shardings, the shardings): parameters and optimizer state
  follow their logical axis names on `mesh` (encoder_jax.train.sharding)."""
  abstract = jax.eval_shape(init_fn)
  shardings = sharding.state_shardings(abstract, mesh)
  return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                      abstract, shardings), shardings


def unigram_baseline(config: ml_collections.ConfigDict, obj: pretraining.ObjectiveConfig
                     ) -> tuple[jax.Array, float]:
  """(log-probabilities over the vocab, entropy) of the training split's unigram distribution:
  the context-free baseline every evaluation is compared with."""
  with Stage("counting the corpus's unigram frequencies"):
    counts = train_unigram_counts(config, obj.vocab_size)
  return (jax.numpy.asarray(unigram.unigram_log_probs(counts, obj.special_ids)),
          unigram.unigram_entropy(counts, obj.special_ids))


def start_state(config: ml_collections.ConfigDict, s: Setup, state_shardings=None,
                pretrained: init_from.Pretrained | None = None) -> step_lib.TrainState:
  """A new run's state: initialised from the seed, with config.init_from's parameters put in."""
  state = initial_state(s.init_fn, state_shardings)
  if not config.get("init_from"):
    return state
  if pretrained is None:
    raise ConfigError(f"config.init_from={config.init_from!r} is loaded by the entry point: run "
                      "python -m encoder_jax.main --mode=pretrain (or call "
                      "encoder_jax.pretrain.pretrain instead of train_and_evaluate).")
  vocab = resolve_vocab(config.data.vocab, config.data.cache_dir or None)
  return state._replace(params=init_from.apply(state.params, pretrained, s.obj.is_electra,
                                               vocab, _say))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       pretrained: init_from.Pretrained | None = None) -> dict:
  """Trains (resuming from `workdir` if it holds checkpoints), evaluates; returns the summary.

  A new run starts from `pretrained`'s parameters when config.init_from names a source
  (encoder_jax.pretrain.pretrain loads it; encoder_jax.train.init_from)."""
  t_start = time.perf_counter()
  workdir = paths.absolute(workdir)  # a gs:// workdir stays one (encoder_jax.paths)
  if not paths.is_uri(workdir):  # (a bucket needs no folders)
    workdir.mkdir(parents=True, exist_ok=True)
  settle_layers(config, workdir)
  s, t = build(config), config.train
  # The mesh (data, fsdp, tensor) comes from config.mesh; nothing below depends on it:
  # batches are split over data x fsdp, checkpoints restore into the state's shardings.
  mesh = sharding.mesh_from_config(config.get("mesh", "auto"))
  abstract, state_shardings = sharded_abstract_state(s.init_fn, mesh)
  steps = _Steps(s, config, mesh, abstract, state_shardings)
  with Stage(f"preparing the corpus ({config.data.source})"):
    train_it = iter(make_loader(config, "train"))
    eval_loader = make_loader(config, config.data.eval_split) if t.eval_steps > 0 else None
  baseline = unigram_baseline(config, s.obj) if eval_loader is not None else (None, None)
  if eval_loader is not None:
    steps.start_eval(baseline[0])
  ckpt = Checkpointer(workdir / "checkpoints", keep=t.keep)
  run = None
  try:
    begin = recovery.restore_or_init(
        ckpt, t, abstract, lambda: start_state(config, s, state_shardings, pretrained),
        train_it, _say)
    n_peak, peak, kind = flops_lib.peak_of_mesh(mesh, t.peak_flops)
    num_params = sum(x.size for x in jax.tree.leaves(begin.state.params))
    _say(f"{s.obj.objective} ({s.obj.sentence_task}) | {num_params:,} params | "
         f"batch {config.data.batch_size} x {config.data.max_length} | "
         f"{s.flops_per_step:.3g} FLOPs/step | peak {n_peak} x {peak / 1e9:.1f} GFLOP/s "
         f"({kind}{', measured per host' if mesh.devices.flat[0].platform == 'cpu' else ''}) | "
         f"steps {begin.step} -> {s.end_step} ({s.planned_stop})")
    run = _Run(s, config, workdir, begin, ckpt, train_it, eval_loader, baseline[0], mesh,
               steps, parts.ThroughputMeter(s.flops_per_step, s.tokens_per_step,
                                                      n_peak, peak),
               prior_wall_s=float(begin.meta.get("wall_s", 0.0)), t_start=t_start)
    try:
      stop_reason = run.train()
    except parts.NonFiniteError as e:
      run.diverged(e)
  finally:
    if run is not None:
      run.writer.close()
    ckpt.close()  # waits for saves in flight, whatever stopped the loop

  wall_s = time.perf_counter() - t_start
  summary = dict(
      steps=run.step, stop_reason=stop_reason, resumed_from=begin.step or None,
      wall_s=wall_s, total_wall_s=run.prior_wall_s + wall_s, compile_s=run.compile_s,
      **run.meter.summary(), flops_per_step=s.flops_per_step,
      cumulative_flops=run.step * s.flops_per_step, peak_flops=peak, peak_devices=n_peak,
      num_params=num_params, final_train_loss=run.last_train.get("loss"),
      final_eval_loss=run.last_eval.get("loss"), final_train=run.last_train,
      final_eval=run.last_eval, unigram_entropy=baseline[1],
      checkpoints=run.checkpoints, rollback_checkpoint=run.rollback.step)
  _write_summary(workdir, summary)
  _say(f"done: {run.step} steps ({stop_reason}) in {format_duration(wall_s)}; summary "
       + json.dumps({k: summary[k] for k in ("steps", "wall_s", "tokens_per_s", "mfu",
                                             "cumulative_flops", "final_train_loss",
                                             "final_eval_loss")}))
  line = parts.heldout_line(run.step, run.last_eval, baseline[1])
  if line:
    _say(line)
  return summary


class _Steps:
  """The jitted train and eval steps, their XLA compilation started ahead of the first call
  (loop_parts.Precompiled) for the argument types the loop will pass: the state's abstract
  shapes and shardings, and global batches of pipeline.batch_spec's shapes."""

  def __init__(self, s: Setup, config, mesh, abstract, state_shardings):
    self.abstract = abstract
    batch_sh = sharding.batch_sharding(mesh)
    self.batch = abstract_batch(config, batch_sh)
    jitted = step_lib.make_train_step(s.trainer, state_shardings, batch_sh)
    self.train = parts.Precompiled.of(jitted, abstract, self.batch, name="train step")
    self.eval = step_lib.make_eval_step(s.trainer)

  def start_eval(self, unigram_logp_V) -> None:
    self.eval = parts.Precompiled.of(self.eval, self.abstract.params, self.batch, 0,
                                     unigram_logp_V, name="eval step")


class _Run:
  """One process's training from `begin` to the end step: the step loop and its periodic
  actions (log, evaluate, save), built from encoder_jax.train.loop_parts."""

  def __init__(self, s: Setup, config, workdir, begin: recovery.Begin, ckpt: Checkpointer,
               train_it, eval_loader, unigram_logp_V, mesh, steps: "_Steps",
               meter: parts.ThroughputMeter, *, prior_wall_s: float, t_start: float):
    t = config.train
    self.s, self.t, self.config, self.workdir = s, t, config, workdir
    self.state, self.step, self.start, self.branch = begin.state, begin.step, begin.step, \
        begin.branch
    self.ckpt, self.train_it, self.eval_loader = ckpt, train_it, eval_loader
    self.unigram_logp_V, self.mesh, self.meter = unigram_logp_V, mesh, meter
    self.prior_wall_s, self.t_start = prior_wall_s, t_start
    self.window = recovery.Window(begin.meta.get("window"))
    self.pending = parts.PendingMetrics(self.window)
    self.rollback = parts.Rollback(ckpt, begin.meta.get("rollback"))
    self.record = recovery.ConfigRecord(config, workdir, begin.step, _say)
    self.schedule = parts.Schedule(t.log_every, t.eval_every, t.checkpoint_every, s.end_step,
                                   evaluating=eval_loader is not None)
    self.train_step, self.eval_step = steps.train, steps.eval
    self.writer = MetricWriter(workdir, resume_step=begin.step)
    self.profiler = parts.StepProfiler(t.get("profile_steps", 0), t.get("profile_num_steps", 3),
                                       workdir / "profile")
    self.compile_s, self.last_train, self.last_eval = None, {}, {}

  def train(self) -> str:
    """Steps to the end (or a SIGTERM); returns the stop reason."""
    stop_reason, ahead = self.s.planned_stop, None
    with _Preemption() as preemption:
      t_loop = time.perf_counter()
      while self.step < self.s.end_step:
        if preemption.due():
          stop_reason = "preempted"
          break
        batch = sharding.shard_batch(next(self.train_it), self.mesh)
        self.meter.exclude(self.profiler.before(self.step))  # (writing a trace is not training)
        if self.compile_s is None:  # this process's first step: time compilation apart
          with Stage("compiling the train step (first step)"):
            self.state, metrics = self.train_step(self.state, batch)
            jax.block_until_ready(metrics)
          self.compile_s = time.perf_counter() - t_loop
          self.meter.start(self.step + 1)
        else:
          self.state, metrics = self.train_step(self.state, batch)
        self.step += 1
        self.meter.exclude(self.profiler.after(self.step, metrics))
        self.pending.push(self.step, metrics)
        # Without this wait the host would queue many steps ahead of an asynchronous
        # device, and a preemption would first have to run them all before saving.
        if ahead is not None:
          jax.block_until_ready(ahead)
        ahead = metrics
        self.ckpt.poll()  # a failed save stops the run now, not one checkpoint later
        self.periodic(self.schedule.at(self.step))
      self.profiler.close()
      if stop_reason == "preempted":
        if self.step > 0:  # (before any step there is nothing to save)
          self.save()  # the open log window travels in the checkpoint; no partial row
        self.ckpt.wait()
        _say(f"SIGTERM: saved step {self.step} {time.perf_counter() - preemption.at:.1f} s "
             f"after {preemption.what}; exiting cleanly (a restart resumes from it)")
      elif self.schedule.needs_final_eval(self.step, self.start):
        self.evaluate()
    self.ckpt.wait()
    self.checkpoints = self.ckpt.all_steps()
    if self.ckpt.sealed:
      self.record.commit()
    return stop_reason

  def periodic(self, due: parts.Due) -> None:
    if due.any:
      self.pending.fetch()
    if due.log:
      self.log()
      if self.schedule.log_is_health_check:
        self.rollback.healthy_at(self.step)
    if due.eval and self.evaluate():  # before the save, so the rollback can be older
      self.rollback.healthy_at(self.step)
    if due.save:
      self.save()

  def log(self) -> None:
    scalars = self.window.take_means()
    if scalars is None:
      return
    scalars |= self.meter.lap(self.step)
    scalars["cumulative_flops"] = self.step * self.s.flops_per_step
    self.writer.write(self.step, "train", scalars)
    _say(progress_line(self.step, self.s.end_step, scalars,
                       eta_s=self.meter.eta_s(self.s.end_step - self.step)))
    self.last_train = scalars
    self.meter.mark(self.step)

  def evaluate(self) -> bool:
    """Scores the held-out batches; True when the loss is finite."""
    t0 = time.perf_counter()
    it = iter(self.eval_loader)
    outs = [self.eval_step(self.state.params, sharding.shard_batch(next(it), self.mesh), i,
                           self.unigram_logp_V) for i in range(self.t.eval_steps)]
    rows = jax.device_get(outs)
    scalars = {k: float(np.mean([r[k] for r in rows], dtype=np.float64)) for k in rows[0]}
    self.writer.write(self.step, "eval", scalars)
    _say(f"eval  step {self.step}: " + " ".join(
        f"{k} {v:.4g}" for k, v in sorted(scalars.items()) if not k.endswith("_count")))
    self.last_eval = scalars
    self.meter.exclude(time.perf_counter() - t0)
    return bool(np.isfinite(scalars["loss"]))

  def save(self) -> None:
    t0 = time.perf_counter()
    self.pending.fetch()  # every loss up to this step is finite before its state is written
    if any(c < self.step for c in self.ckpt.sealed):  # one of ours is sealed, its next step fine
      self.record.commit()
    self.ckpt.save(self.step, self.state, data_state=self.train_it.get_state(),
                   meta={"wall_s": self.prior_wall_s + time.perf_counter() - self.t_start,
                         "cumulative_flops": self.step * self.s.flops_per_step,
                         "window": self.window.state(), "rollback": self.rollback.state(),
                         "branch": self.branch})
    self.rollback.saved_at(self.step)
    self.meter.exclude(time.perf_counter() - t0)

  def diverged(self, e: parts.NonFiniteError):
    """Sets aside the state that produced the bad step, writes the summary and raises
    FloatingPointError with the way to roll back and train on."""
    self.ckpt.wait()  # saves in flight hold good states (checked before they started): finish
    bad_step = e.args[0]
    aside = None
    if bad_step - 1 in self.ckpt.all_steps():
      aside = self.ckpt.set_aside(bad_step - 1, f"checkpoint {bad_step - 1}: its next step, "
                                  f"{bad_step}, gave a non-finite {e.args[1]}")
    if set(self.ckpt.sealed) & set(self.ckpt.all_steps()):  # this config made kept states
      self.record.commit()
    msg = recovery.divergence_message(e, self.ckpt, aside, self.rollback.state(),
                                      self.config.optim.learning_rate)
    _write_summary(self.workdir, dict(steps=bad_step, stop_reason="non_finite", error=msg,
                                      last_good_checkpoint=self.ckpt.latest_step(),
                                      rollback_checkpoint=self.rollback.step))
    raise FloatingPointError(msg) from None


def _write_summary(workdir: epath.Path, summary: dict) -> None:
  if jax.process_index() == 0:
    paths.write_atomic(workdir / SUMMARY_FILE, json.dumps(summary, indent=2, default=float))
