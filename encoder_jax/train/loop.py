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
    process exits 0 and the next start resumes.
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
from encoder_jax.data import builders, examples, pipeline, unigram
from encoder_jax.data.builders import resolve_vocab
from encoder_jax.data.tokenizer import WordPieceTokenizer
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives import pretraining
from encoder_jax.train import flops as flops_lib
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
  if t.keep < 1:
    raise ConfigError(f"train.keep={t.keep}: keep at least one checkpoint, or resume is "
                      "impossible.")
  if t.get("skip_batches", 0) and not t.get("resume_step", 0):
    raise ConfigError(f"train.skip_batches={t.skip_batches} needs train.resume_step: the "
                      "checkpoint after which the batches are skipped.")


# ------------------------------------------------------------------ config -> static pieces


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
  """The frozen ModelConfig of `config.model`, with the tokenizer's vocabulary size."""
  d = config.model.to_dict()
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
                                 cache_dir=d.cache_dir or None)


def make_loader(config: ml_collections.ConfigDict, split: str) -> pipeline.Loader:
  d = config.data
  return pipeline.pretrain_loader(
      source=d.source, vocab=d.vocab, split=split, example=example_config(config),
      global_batch_size=d.batch_size, seed=config.seed, data_dir=d.data_dir or None,
      cache_dir=d.cache_dir or None, worker_count=d.worker_count,
      example_ids=config.objective.get("masking", "dynamic") == "static")


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


def build(config: ml_collections.ConfigDict) -> Setup:
  check_train_config(config)
  tok = WordPieceTokenizer.from_vocab(resolve_vocab(config.data.vocab,
                                                    config.data.cache_dir or None))
  model_cfg = model_config(config, tok.vocab_size)
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


class NonFiniteError(FloatingPointError):
  pass


def _check_finite(step: int, m: dict[str, np.ndarray]) -> None:
  for key in ("loss", "grad_norm"):
    if not np.isfinite(m[key]):
      raise NonFiniteError(step, key, float(m[key]))


def _mean_rows(rows: list[dict[str, np.ndarray]]) -> dict[str, float]:
  return {k: float(np.mean([r[k] for r in rows], dtype=np.float64)) for k in rows[0]}


def _say(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


class _Preemption:
  """Turns SIGTERM into a flag the loop polls (signal handlers only exist in the main thread)."""

  def __init__(self):
    self.flag = threading.Event()
    self.at = None  # perf_counter() when the signal came
    self._old = None

  def _handler(self, *_):
    self.at = self.at or time.perf_counter()
    self.flag.set()

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, self._handler)
    return self

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming from `workdir` if it holds checkpoints), evaluates; returns the summary."""
  t_start = time.perf_counter()
  workdir = paths.absolute(workdir)  # a gs:// workdir stays one (encoder_jax.paths)
  if not paths.is_uri(workdir):  # (a bucket needs no folders)
    workdir.mkdir(parents=True, exist_ok=True)
  s = build(config)
  t = config.train
  log_every, ckpt_every, eval_every = t.log_every, t.checkpoint_every, t.eval_every
  evaluating = t.eval_steps > 0

  # The mesh (data, fsdp, tensor) comes from config.mesh; nothing below depends on it:
  # parameters and optimizer state follow their logical axis names, batches are split over
  # data x fsdp, checkpoints restore into the shardings.
  mesh = sharding.mesh_from_config(config.get("mesh", "auto"))
  abstract = jax.eval_shape(s.init_fn)
  state_shardings = sharding.state_shardings(abstract, mesh)
  abstract = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          abstract, state_shardings)
  to_device = lambda batch: sharding.shard_batch(batch, mesh)

  with Stage(f"preparing the corpus ({config.data.source})"):
    train_loader = make_loader(config, "train")
    eval_loader = make_loader(config, config.data.eval_split) if evaluating else None
  unigram_logp_V, unigram_h = None, None
  if eval_loader is not None:  # the context-free baseline every eval line is compared with
    with Stage("counting the corpus's unigram frequencies"):
      counts = unigram.unigram_counts(corpus_builder(config), "train", s.obj.vocab_size)
    unigram_logp_V = jax.numpy.asarray(unigram.unigram_log_probs(counts, s.obj.special_ids))
    unigram_h = unigram.unigram_entropy(counts, s.obj.special_ids)
  train_it = iter(train_loader)
  ckpt = Checkpointer(workdir / "checkpoints", keep=t.keep)
  writer = None
  try:
    start, branch = recovery.choose_start(ckpt, t, _say)
    meta = {}
    if start:
      with Stage(f"restoring checkpoint {start} from {ckpt.directory}"):
        state, data_state, meta = ckpt.restore(start, abstract)
      if int(state.step) != start:
        raise ValueError(f"checkpoint {start} in {ckpt.directory} holds step "
                         f"{int(state.step)}; the directory is corrupt or was written by "
                         "another tool.")
      if branch is not None and meta.get("branch") != branch:  # a new rollback starts here
        data_state = dict(data_state, step=int(data_state["step"]) + branch["skip"])
        if branch["skip"]:
          _say(f"skipping {branch['skip']} batches after step {start} (train.skip_batches)")
      train_it.set_state(data_state)
    else:
      with Stage("initialising the parameters"):
        state = initial_state(s.init_fn, state_shardings)
    branch = branch or meta.get("branch")
    prior_wall_s = float(meta.get("wall_s", 0.0))
    window = recovery.Window(meta.get("window"))
    rollback = dict(meta.get("rollback") or {"step": None, "at": None})
    if rollback["step"] not in ckpt.all_steps():
      rollback = {"step": None, "at": None}
    ckpt.protect(rollback["step"])
    saved = ckpt.all_steps()  # steps with a checkpoint, for choosing the rollback
    record = recovery.ConfigRecord(config, workdir, start, _say)

    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    # MFU over every device the step runs on, at the peak of their kind (flops.peak_of_mesh).
    n_peak, peak, kind = flops_lib.peak_of_mesh(mesh, t.peak_flops)
    _say(f"{s.obj.objective} ({s.obj.sentence_task}) | {num_params:,} params | "
         f"batch {config.data.batch_size} x {config.data.max_length} | "
         f"{s.flops_per_step:.3g} FLOPs/step | peak {n_peak} x {peak / 1e9:.1f} GFLOP/s "
         f"({kind}{', measured per host' if mesh.devices.flat[0].platform == 'cpu' else ''}) | "
         f"steps {start} -> {s.end_step} ({s.planned_stop})")

    train_step = step_lib.make_train_step(s.trainer, state_shardings,
                                          sharding.batch_sharding(mesh))
    eval_step = step_lib.make_eval_step(s.trainer)
    writer = MetricWriter(workdir, resume_step=start)

    pending: list[tuple[int, dict]] = []  # metrics still on device, by step
    perf = dict(mark_t=None, mark_step=start, excluded_s=0.0, steady_s=0.0, steady_steps=0)
    last = dict(train={}, eval={}, compile_s=None)

    def fetch():
      """Brings pending metrics to the host and checks them; a must before saving a state."""
      if pending:
        values = jax.device_get([m for _, m in pending])
        for (step_, _), m in zip(pending, values):
          _check_finite(step_, m)
          window.add(m)
        pending.clear()

    def promote_rollback(healthy_at: int):
      """A check at `healthy_at` passed: the newest checkpoint before it becomes the rollback."""
      older = [c for c in saved if c < healthy_at]
      if older and (rollback["step"] is None or max(older) > rollback["step"]):
        rollback.update(step=max(older), at=healthy_at)
        ckpt.protect(rollback["step"])

    def log(step: int):
      scalars = window.take_means()
      if scalars is None:
        return
      now = time.perf_counter()
      n = step - perf["mark_step"]
      if perf["mark_t"] is not None and n > 0:
        dt = max(now - perf["mark_t"] - perf["excluded_s"], 1e-9)
        perf["steady_s"] += dt
        perf["steady_steps"] += n
        scalars |= dict(step_time_s=dt / n, tokens_per_s=n * s.tokens_per_step / dt,
                        **flops_lib.throughput(s.flops_per_step, dt / n, n_peak, peak))
      scalars["cumulative_flops"] = step * s.flops_per_step
      step_time = perf["steady_s"] / perf["steady_steps"] if perf["steady_steps"] else math.nan
      writer.write(step, "train", scalars)
      _say(progress_line(step, s.end_step, scalars, eta_s=(s.end_step - step) * step_time))
      last["train"] = scalars
      perf.update(mark_t=time.perf_counter(), mark_step=step, excluded_s=0.0)

    def evaluate(step: int) -> bool:
      """Scores the held-out batches; True when the loss is finite."""
      t0 = time.perf_counter()
      it = iter(eval_loader)
      outs = [eval_step(state.params, to_device(next(it)), i, unigram_logp_V)
              for i in range(t.eval_steps)]
      scalars = _mean_rows(jax.device_get(outs))
      writer.write(step, "eval", scalars)
      _say(f"eval  step {step}: " + " ".join(f"{k} {v:.4g}" for k, v in sorted(scalars.items())
                                             if not k.endswith("_count")))
      last["eval"] = scalars
      perf["excluded_s"] += time.perf_counter() - t0
      return bool(np.isfinite(scalars["loss"]))

    def save(step: int):
      t0 = time.perf_counter()
      fetch()  # every loss up to `step` is finite before its state is written
      if any(c < step for c in ckpt.sealed):  # one of ours is sealed and its next step finite
        record.commit()
      ckpt.save(step, state, data_state=train_it.get_state(),
                meta={"wall_s": prior_wall_s + time.perf_counter() - t_start,
                      "cumulative_flops": step * s.flops_per_step, "window": window.state(),
                      "rollback": rollback, "branch": branch})
      saved.append(step)
      perf["excluded_s"] += time.perf_counter() - t0

    step, stop_reason = start, s.planned_stop
    with _Preemption() as preemption:
      try:
        t_loop = time.perf_counter()
        ahead = None  # metrics of the previous step: the host waits for it, staying <= 1 ahead
        while step < s.end_step:
          if preemption.flag.is_set():
            stop_reason = "preempted"
            break
          batch = to_device(next(train_it))
          if last["compile_s"] is None:  # this process's first step: time compilation apart
            with Stage("compiling the train step (first step)"):
              state, metrics = train_step(state, batch)
              jax.block_until_ready(metrics)
            last["compile_s"] = time.perf_counter() - t_loop
            perf.update(mark_t=time.perf_counter(), mark_step=step + 1)
          else:
            state, metrics = train_step(state, batch)
          step += 1
          for x in jax.tree.leaves(metrics):
            x.copy_to_host_async()  # start the transfer now; fetched at the next log step
          pending.append((step, metrics))
          # Without this wait the host would queue many steps ahead of an asynchronous
          # device, and a preemption would first have to run them all before saving.
          if ahead is not None:
            jax.block_until_ready(ahead)
          ahead = metrics
          ckpt.poll()  # a failed save stops the run now, not one checkpoint later
          is_log = (log_every > 0 and step % log_every == 0) or step == s.end_step
          is_eval = evaluating and eval_every > 0 and step % eval_every == 0
          is_ckpt = (ckpt_every > 0 and step % ckpt_every == 0) or step == s.end_step
          if is_log or is_eval or is_ckpt:
            fetch()
          if is_log:
            log(step)
            if not (evaluating and eval_every > 0):  # no evaluations: the log row is the check
              promote_rollback(step)
          if is_eval and evaluate(step):  # before the save, so the rollback can be older
            promote_rollback(step)
          if is_ckpt:
            save(step)
        if stop_reason == "preempted":
          if step > 0:  # (before any step there is nothing to save)
            save(step)  # the open log window travels in the checkpoint; no partial row
          ckpt.wait()
          _say(f"SIGTERM: saved step {step} {time.perf_counter() - preemption.at:.1f} s after "
               "the signal; exiting cleanly (a restart resumes from it)")
        elif evaluating and not (eval_every > 0 and step % eval_every == 0 and step > start):
          evaluate(step)  # the final numbers always include a held-out score
        ckpt.wait()
        checkpoints = ckpt.all_steps()
        if ckpt.sealed:
          record.commit()
      except NonFiniteError as e:
        ckpt.wait()  # saves in flight hold good states (checked before they started): finish
        bad_step = e.args[0]
        aside = None
        if bad_step - 1 in ckpt.all_steps():
          aside = ckpt.set_aside(bad_step - 1, f"checkpoint {bad_step - 1}: its next step, "
                                 f"{bad_step}, gave a non-finite {e.args[1]}")
        if set(ckpt.sealed) & set(ckpt.all_steps()):  # this run's config made kept states
          record.commit()
        msg = recovery.divergence_message(e, ckpt, aside, rollback,
                                          config.optim.learning_rate)
        _write_summary(workdir, dict(steps=bad_step, stop_reason="non_finite", error=msg,
                                     last_good_checkpoint=ckpt.latest_step(),
                                     rollback_checkpoint=rollback["step"]))
        raise FloatingPointError(msg) from None
  finally:
    if writer is not None:
      writer.close()
    ckpt.close()  # waits for saves in flight, whatever stopped the loop

  wall_s = time.perf_counter() - t_start
  # No throughput figures when this process ran no step after the compiling one (e.g. a
  # finished run started again: it only evaluates).
  steady = perf["steady_steps"] > 0
  steps_per_s = perf["steady_steps"] / perf["steady_s"] if steady else None
  summary = dict(
      steps=step, stop_reason=stop_reason, resumed_from=start or None,
      wall_s=wall_s, total_wall_s=prior_wall_s + wall_s, compile_s=last["compile_s"],
      tokens_per_s=steps_per_s * s.tokens_per_step if steady else None,
      flops_per_step=s.flops_per_step, cumulative_flops=step * s.flops_per_step,
      flops_per_s=steps_per_s * s.flops_per_step if steady else None,
      mfu=steps_per_s * s.flops_per_step / (n_peak * peak) if steady else None,
      peak_flops=peak, peak_devices=n_peak,
      num_params=num_params,
      final_train_loss=last["train"].get("loss"), final_eval_loss=last["eval"].get("loss"),
      final_train=last["train"], final_eval=last["eval"], unigram_entropy=unigram_h,
      checkpoints=checkpoints, rollback_checkpoint=rollback["step"])
  _write_summary(workdir, summary)
  _say(f"done: {step} steps ({stop_reason}) in {format_duration(wall_s)}; summary "
       + json.dumps({k: summary[k] for k in ("steps", "wall_s", "tokens_per_s", "mfu",
                                             "cumulative_flops", "final_train_loss",
                                             "final_eval_loss")}))
  ev = last["eval"]
  acc_key = next((k for k in ("mlm_accuracy", "gen_accuracy") if k in ev), None)
  loss_key = next((k for k in ("mlm_loss", "gen_loss") if k in ev), None)
  if "unigram_loss" in ev and acc_key and loss_key:
    at = loss_key.replace("_loss", "_at_mask")
    _say(f"held-out MLM at step {step}: accuracy {ev[acc_key]:.1%} (unigram baseline "
         f"{ev['unigram_accuracy']:.1%}), loss {ev[loss_key]:.3f} nats = "
         f"{ev['unigram_loss'] - ev[loss_key]:.3f} below the unigram baseline's "
         f"{ev['unigram_loss']:.3f} (corpus unigram entropy {unigram_h:.3f}); at [MASK] "
         f"inputs only: accuracy {ev[at + '_accuracy']:.1%} (unigram "
         f"{ev['unigram_at_mask_accuracy']:.1%}), loss "
         f"{ev['unigram_at_mask_loss'] - ev[at + '_loss']:.3f} below the unigram baseline")
  return summary


def _write_summary(workdir: epath.Path, summary: dict) -> None:
  if jax.process_index() == 0:
    paths.write_atomic(workdir / SUMMARY_FILE, json.dumps(summary, indent=2, default=float))
