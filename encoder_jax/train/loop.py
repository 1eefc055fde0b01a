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
                   (pad_fraction: the share of padded positions in the batches; tokens_per_s
                   counts positions, real_tokens_per_s the tokens that are not padding)
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

The config is read once, by encoder_jax.train.setup.build, into a frozen Setup; everything
below reads that. The loop is built from the pieces in encoder_jax.train.loop_parts
(throughput meter, pending metrics, rollback choice, schedule of periodic actions) and
recovery.restore_or_init.

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
  * A finished run is never rewritten: its command run again prints "already finished at
    step N of N; raise train.steps to continue" and returns the recorded summary (summary.json
    stays byte for byte). A resume under another learning-rate schedule (more train.steps
    stretch the decay horizon) prints what the learning rate does at the resume step.
  * Progress: a line at least every loop_parts.PROGRESS_EVERY_S (30 s) of training whatever
    train.log_every is (steps/s, tokens/s and ETA from the steps so far), besides the metric
    rows every log_every steps.
"""
from __future__ import annotations

import json
import signal
import threading
import time

from etils import epath
import jax
import ml_collections
import numpy as np

from encoder_jax import paths
from encoder_jax.data import unigram
from encoder_jax.data.vocab import resolve_vocab
from encoder_jax.model import matmul
from encoder_jax.train import flops as flops_lib
from encoder_jax.train import init_from, layout
from encoder_jax.train import loop_parts as parts
from encoder_jax.train import recovery
from encoder_jax.train import setup, sharding
from encoder_jax.train import step as step_lib
from encoder_jax.train.checkpoint import Checkpointer, verify
from encoder_jax.train.metrics_io import (MetricWriter, Stage, format_duration,
                                          progress_line)

SUMMARY_FILE = "summary.json"


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


def unigram_baseline(s: setup.Setup, train_rows) -> tuple[jax.Array, float]:
  """(log-probabilities over the vocab, entropy) of the training rows' unigram distribution
  (`train_rows`: the train loader's built shards, already open): the context-free baseline
  every evaluation is compared with."""
  with Stage("counting the corpus's unigram frequencies"):
    counts = unigram.row_counts(train_rows, s.obj.vocab_size)
  return (jax.numpy.asarray(unigram.unigram_log_probs(counts, s.obj.special_ids)),
          unigram.unigram_entropy(counts, s.obj.special_ids))


def start_state(s: setup.Setup, state_shardings=None) -> step_lib.TrainState:
  """A new run's state: initialised from the seed, with config.init_from's parameters put in
  (loaded here, train/init_from.py)."""
  state = initial_state(s.init_fn, state_shardings)
  if not s.init_from:
    return state
  with Stage(f"loading init_from={s.init_from}"):
    source = init_from.load(s.init_from, s.data.cache_dir)
  vocab = resolve_vocab(s.data.vocab, s.data.cache_dir)
  return state._replace(params=init_from.apply(state.params, source, s.obj.is_electra, vocab,
                                               _say))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (resuming from `workdir` if it holds checkpoints), evaluates; returns the summary.
  A new run starts from config.init_from's parameters when it names a source
  (encoder_jax.train.init_from)."""
  t_start = time.perf_counter()
  workdir = paths.absolute(workdir)  # a gs:// workdir stays one (encoder_jax.paths)
  if not paths.is_uri(workdir):  # (a bucket needs no folders)
    workdir.mkdir(parents=True, exist_ok=True)
  layout.settle(config, workdir, say=_say)  # mesh=auto on a TPU: compiled candidates
  setup.settle_layers(config, workdir)
  s = setup.build(config)  # the one boundary: below, only the frozen Setup is read
  del config
  t = s.train
  finished = _finished_summary(s, workdir)
  if finished is not None:
    return finished
  record = workdir / setup.CONFIG_FILE
  recorded_config = record.read_text() if record.exists() else None
  # The mesh (data, fsdp, tensor) comes from config.mesh; nothing below depends on it:
  # batches are split over data x fsdp, checkpoints restore into the state's shardings.
  mesh = sharding.mesh_from_config(s.mesh)
  abstract, state_shardings = sharding.sharded_abstract_state(s.init_fn, mesh,
                                                              s.optim_sharding)
  ckpt = Checkpointer(workdir / "checkpoints", keep=t.keep)
  run = None
  try:
    # A finished run (its command run again, or experiments/rtd_identity.py re-evaluating it)
    # takes no step, so its train step is not compiled ahead: that compile is the largest of
    # the three. A rollback (train.resume_step) does train.
    steps = _Steps(s, mesh, abstract, state_shardings,
                   train_ahead=bool(t.resume_step) or (ckpt.latest_step() or 0) < s.end_step)
    with Stage(f"preparing the corpus ({s.data.source})"):
      train_loader = setup.make_loader(s.data, "train")
      train_it = iter(train_loader)
      eval_loader = _eval_loader(s) if t.eval_steps > 0 else None
    baseline = (unigram_baseline(s, train_loader.rows) if eval_loader is not None
                else (None, None))
    if eval_loader is not None:
      steps.start_eval(baseline[0])
    begin = recovery.restore_or_init(
        ckpt, t, abstract, lambda: start_state(s, state_shardings), train_it, _say)
    if begin.step and recorded_config is not None:
      note = setup.schedule_change_note(recorded_config, s, begin.step)
      if note:
        _say(note)
    n_peak, peak, num_params = _announce(s, mesh, begin)
    run = _Run(s, workdir, begin, ckpt, train_it, eval_loader, baseline[0], mesh,
               steps, parts.ThroughputMeter(s.flops_per_step, s.tokens_per_step, n_peak, peak),
               prior_wall_s=float(begin.meta.get("wall_s", 0.0)), t_start=t_start)
    try:
      stop_reason = run.train()
    except parts.NonFiniteError as e:
      run.diverged(e)
  finally:
    if run is not None:
      run.writer.close()
    ckpt.close()  # waits for saves in flight, whatever stopped the loop
  return _summarize(s, workdir, run, stop_reason, time.perf_counter() - t_start,
                    dict(resumed_from=begin.step or None, peak_flops=peak, peak_devices=n_peak,
                         num_params=num_params, unigram_entropy=baseline[1]))


def _announce(s: setup.Setup, mesh, begin: recovery.Begin) -> tuple[int, float, int]:
  """Prints what the run is (objective, size, batch, FLOPs, the MFU's peak, steps); returns
  (devices of the peak, peak FLOP/s per device, parameters)."""
  cfg = s.model_cfg
  dots = "bfloat16" if matmul.bf16_dots(cfg.dot_dtype, cfg.dtype, cfg.platform) else "float32"
  n_peak, peak, peak_source = flops_lib.peak_of_mesh(mesh, s.train.peak_flops, dots)
  num_params = sum(x.size for x in jax.tree.leaves(begin.state.params))
  _say(f"{s.obj.objective} ({s.obj.sentence_task}) | {num_params:,} params | "
       f"batch {s.data.batch_size} x {s.data.example.max_length} | "
       f"{s.flops_per_step:.3g} FLOPs/step | MFU against a peak of {n_peak} x "
       f"{peak / 1e9:.1f} GFLOP/s ({peak_source}) | "
       f"steps {begin.step} -> {s.end_step} ({s.planned_stop})")
  return n_peak, peak, num_params


def _summarize(s: setup.Setup, workdir: epath.Path, run: "_Run", stop_reason: str,
               wall_s: float, known: dict) -> dict:
  """summary.json of a run that stopped (`known`: what the start measured), written and
  printed with the held-out line."""
  summary = dict(
      steps=run.step, stop_reason=stop_reason, resumed_from=known["resumed_from"],
      wall_s=wall_s, total_wall_s=run.prior_wall_s + wall_s, compile_s=run.compile_s,
      **run.meter.summary(), flops_per_step=s.flops_per_step,
      cumulative_flops=run.step * s.flops_per_step, peak_flops=known["peak_flops"],
      peak_devices=known["peak_devices"], num_params=known["num_params"],
      final_train_loss=run.last_train.get("loss"), final_eval_loss=run.last_eval.get("loss"),
      final_train=run.last_train, final_eval=run.last_eval,
      unigram_entropy=known["unigram_entropy"], checkpoints=run.checkpoints,
      rollback_checkpoint=run.rollback.step)
  summary["mfu_note"] = flops_lib.mfu_above_peak_note(summary.get("mfu"))
  _write_summary(workdir, summary)
  _say(f"done: {run.step} steps ({stop_reason}) in {format_duration(wall_s)}; summary "
       + json.dumps({k: summary[k] for k in ("steps", "wall_s", "tokens_per_s", "mfu",
                                             "cumulative_flops", "final_train_loss",
                                             "final_eval_loss")}))
  for line in (summary["mfu_note"], parts.heldout_line(run.step, run.last_eval,
                                                      known["unigram_entropy"],
                                                      s.data.eval_split)):
    if line:
      _say(line)
  return summary


def _finished_summary(s: setup.Setup, workdir: epath.Path) -> dict | None:
  """A run that already reached its end (its command run again): says so and returns the
  recorded summary, rewriting nothing. None when there is training left to do, the summary is
  missing (e.g. experiments/rtd_identity.py re-evaluates a copy without it), the final
  checkpoint does not verify, or a rollback (train.resume_step) was asked for."""
  path = workdir / SUMMARY_FILE
  if s.train.resume_step or not path.exists():
    return None
  try:
    summary = json.loads(path.read_text())
  except ValueError:
    return None
  done = summary.get("steps")
  if summary.get("stop_reason") not in ("steps", "flops_budget") or not isinstance(done, int):
    return None
  if done < s.end_step:
    return None
  if verify(workdir / "checkpoints" / str(done)) is not None:
    return None  # its final checkpoint is damaged: resume as usual (which sets it aside)
  _say(f"already finished at step {done} of {s.end_step}; raise train.steps to continue "
       f"({path} is left as it is)" if done == s.end_step else
       f"already at step {done}, past this config's end step {s.end_step}; nothing to do "
       f"({path} is left as it is)")
  line = parts.heldout_line(done, summary.get("final_eval") or {},
                            summary.get("unigram_entropy"), s.data.eval_split)
  if line:
    _say(line)
  return summary


def _eval_loader(s: setup.Setup):
  """The held-out split's loader, or an error that says what to do when it has no rows."""
  try:
    return setup.make_loader(s.data, s.data.eval_split)
  except ValueError as e:
    if f"no {s.data.eval_split} rows" not in str(e):
      raise
    raise setup.ConfigError(
        f"data.source={s.data.source!r} has no {s.data.eval_split} rows to evaluate on (its "
        f"documents all went to training); give --config.train.eval_steps=0 to train without a "
        "held-out evaluation, or a source with more documents (files: one document per file, "
        "or --config.data.blank_line_docs=True for one per blank-line-separated block)"
        ) from None


class _Steps:
  """The jitted train and eval steps, their XLA compilation started ahead of the first call
  (loop_parts.Precompiled) for the argument types the loop will pass: the state's abstract
  shapes and shardings, and global batches of pipeline.batch_spec's shapes. Without
  `train_ahead` (a finished run) the train step stays a plain jit, compiled only if called."""

  def __init__(self, s: setup.Setup, mesh, abstract, state_shardings, *, train_ahead=True):
    self.abstract = abstract
    batch_sh = sharding.batch_sharding(mesh)
    self.batch = setup.abstract_batch(s.data, batch_sh)
    jitted = step_lib.make_train_step(
        s.trainer, state_shardings, batch_sh, sharding.update_shardings(
            abstract.params, state_shardings.params, mesh, s.optim_sharding))
    self.train = (parts.Precompiled.of(jitted, abstract, self.batch, name="train step")
                  if train_ahead else jitted)
    self.eval = step_lib.make_eval_step(s.trainer)

  def start_eval(self, unigram_logp_V) -> None:
    self.eval = parts.Precompiled.of(self.eval, self.abstract.params, self.batch, 0,
                                     unigram_logp_V, name="eval step")


class _Run:
  """One process's training from `begin` to the end step: the step loop and its periodic
  actions (log, evaluate, save), built from encoder_jax.train.loop_parts."""

  def __init__(self, s: setup.Setup, workdir, begin: recovery.Begin, ckpt: Checkpointer,
               train_it, eval_loader, unigram_logp_V, mesh, steps: "_Steps",
               meter: parts.ThroughputMeter, *, prior_wall_s: float, t_start: float):
    t = s.train
    self.s, self.t, self.workdir = s, t, workdir
    self.state, self.step, self.start, self.branch = begin.state, begin.step, begin.step, \
        begin.branch
    self.ckpt, self.train_it, self.eval_loader = ckpt, train_it, eval_loader
    self.unigram_logp_V, self.mesh, self.meter = unigram_logp_V, mesh, meter
    self.prior_wall_s, self.t_start = prior_wall_s, t_start
    self.window = recovery.Window(begin.meta.get("window"))
    self.pending = parts.PendingMetrics(self.window)
    self.rollback = parts.Rollback(ckpt, begin.meta.get("rollback"))
    self.record = recovery.ConfigRecord(s.config_json, workdir, begin.step, _say)
    self.schedule = parts.Schedule(t.log_every, t.eval_every, t.checkpoint_every, s.end_step,
                                   evaluating=eval_loader is not None)
    self.train_step, self.eval_step = steps.train, steps.eval
    self.writer = MetricWriter(workdir, resume_step=begin.step)
    self.profiler = parts.StepProfiler(t.profile_steps, t.profile_num_steps,
                                       workdir / "profile")
    self.heartbeat = parts.Heartbeat(s.end_step, s.tokens_per_step, t.log_every)
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
          self.heartbeat.start(self.step + 1)
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
        if (line := self.heartbeat.line(self.step)) is not None:
          _say(line)
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
    if "tokens_per_s" in scalars and "pad_fraction" in scalars:  # positions -> real tokens
      scalars["real_tokens_per_s"] = scalars["tokens_per_s"] * (1.0 - scalars["pad_fraction"])
    scalars["cumulative_flops"] = self.step * self.s.flops_per_step
    self.writer.write(self.step, "train", scalars)
    _say(progress_line(self.step, self.s.end_step, scalars,
                       eta_s=self.meter.eta_s(self.s.end_step - self.step)))
    self.heartbeat.printed()
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
                                      self.s.optim_cfg.learning_rate)
    _write_summary(self.workdir, dict(steps=bad_step, stop_reason="non_finite", error=msg,
                                      last_good_checkpoint=self.ckpt.latest_step(),
                                      rollback_checkpoint=self.rollback.step))
    raise FloatingPointError(msg) from None


def _write_summary(workdir: epath.Path, summary: dict) -> None:
  if jax.process_index() == 0:
    paths.write_atomic(workdir / SUMMARY_FILE, json.dumps(summary, indent=2, default=float))
