"""train_and_evaluate: bit-exact resume after SIGKILL and SIGTERM (metrics row for row), FLOP
budget, traces, intervals, a host that stays within one step of the device, config checks.

One tiny model (1 block, d=32, rows of 32 tokens, batch 4, dropout on) on a three-document
text corpus built once per session (tests/loop_helpers.py). Every run here shares the
step's compiled program (same shapes and optimizer constants: optim.total_steps is pinned,
only the loop's stopping rule varies), so the persistent compilation cache makes the
subprocess runs cheap.
"""
import json
import os
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.train import checkpoint, loop, setup
from encoder_jax.train import loop_parts as parts
from encoder_jax.train import step as step_lib
from encoder_jax.objectives import pretraining
from encoder_jax.train.metrics_io import Stage
from loop_helpers import (N, assert_bitwise_equal, budget_for, eval_rows, pretrain, restore,
                          run_subprocess, tiny_config, train_rows, wait_for)


@pytest.fixture(scope="module")
def straight(env, tmp_path_factory):
  """2N steps without interruption, counting traces of the train and eval losses."""
  traces = {True: 0, False: 0}
  real = pretraining.loss_and_metrics

  def counting(*args, train, **kwargs):
    traces[train] += 1  # runs only while jax traces the step
    return real(*args, train=train, **kwargs)

  config = tiny_config(env)
  config.train.flops_budget = budget_for(config, 2 * N)
  workdir = tmp_path_factory.mktemp("straight")
  pretraining.loss_and_metrics = counting
  try:
    summary = loop.train_and_evaluate(config, str(workdir))
  finally:
    pretraining.loss_and_metrics = real
  return dict(config=config, workdir=workdir, summary=summary, traces=traces)


def test_flops_budget_and_summary(straight):
  s = straight["summary"]
  assert s["steps"] == 2 * N and s["stop_reason"] == "flops_budget"
  assert s["cumulative_flops"] >= straight["config"].train.flops_budget
  assert s["checkpoints"] == [N, 2 * N]
  assert s["final_eval_loss"] is not None and np.isfinite(s["final_train_loss"])
  rows = train_rows(straight["workdir"])
  assert sorted(rows) == [4, 8, 12]  # every log_every = 4 steps, and the last step
  assert rows[2 * N]["cumulative_flops"] == s["cumulative_flops"]
  saved = json.loads((straight["workdir"] / "config.json").read_text())
  assert saved["seed"] == 0 and saved["train"]["checkpoint_every"] == N


def test_no_retrace_after_first_step(straight):
  # 2N train steps and two evaluations of two batches each: one trace of each function.
  assert straight["traces"] == {True: 1, False: 1}


def assert_same_run(workdir, straight_workdir):
  """Same rows (every metric, bit for bit: floats are repr'd in JSON) and final state."""
  want, got = train_rows(straight_workdir), train_rows(workdir)
  assert sorted(got) == sorted(want)  # lost steps' rows were dropped, then redone once
  for step in want:
    assert got[step] == want[step], step
  assert eval_rows(workdir) == eval_rows(straight_workdir)


def test_resume_after_sigkill_is_bit_exact(env, straight, tmp_path):
  config, workdir = straight["config"], tmp_path / "killed"
  proc, marker = run_subprocess(env, config, workdir, hang_after=N + 2)
  sealed = workdir / "checkpoints" / str(N) / checkpoint.CHECKSUMS
  wait_for(lambda: os.path.exists(marker) and sealed.exists(), proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=30) == -signal.SIGKILL
  assert max(train_rows(workdir)) == N + 2  # the row of step 8 is lost work past step 6

  summary = loop.train_and_evaluate(config, str(workdir))
  assert summary["resumed_from"] == N and summary["steps"] == 2 * N
  # The first row after the resume (step 8) averages steps 5-8, two of them before the
  # checkpoint: their sums travelled in it.
  assert_same_run(workdir, straight["workdir"])
  a, data_a, _ = restore(straight["workdir"], 2 * N, config)
  b, data_b, _ = restore(workdir, 2 * N, config)
  assert_bitwise_equal(a, b)  # step, params, optimizer state
  assert data_a == data_b and data_a["step"] == 2 * N


def test_sigterm_saves_within_a_step_and_resumes_row_for_row(env, straight, tmp_path):
  """SIGTERM during step 5: step 5 is saved (not the next log or checkpoint step) with the
  open log window (steps 5-8 make the next row), the process exits 0, and a restart
  completes the straight run exactly."""
  config, workdir = straight["config"], tmp_path / "term"
  proc, marker = run_subprocess(env, config, workdir, term_at=5)
  out = proc.communicate(timeout=300)[0]
  exit_s = time.time() - float(open(marker).read())
  assert proc.returncode == 0, out
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["stop_reason"] == "preempted" and summary["checkpoints"] == [5], summary
  assert sorted(train_rows(workdir)) == [4]  # no partial row for steps 5..
  print(f"\nSIGTERM during step 5: step 5 saved, exited {exit_s:.2f} s after the signal")

  resumed = loop.train_and_evaluate(config, str(workdir))
  assert resumed["resumed_from"] == 5 and resumed["steps"] == 2 * N
  assert_same_run(workdir, straight["workdir"])


def test_damaged_newest_checkpoint_falls_back_and_finishes_bit_exact(straight, tmp_path):
  workdir = tmp_path / "damaged"
  shutil.copytree(straight["workdir"], workdir)
  data_files = [p for p in (workdir / "checkpoints" / str(2 * N) / "state").rglob("*")
                if p.is_file() and "/d/" in str(p)]
  path = max(data_files, key=lambda p: p.stat().st_size)
  raw = bytearray(path.read_bytes())
  raw[len(raw) // 2] ^= 1  # one flipped bit in the parameters
  path.write_bytes(bytes(raw))

  summary = loop.train_and_evaluate(straight["config"], str(workdir))
  assert summary["resumed_from"] == N and summary["steps"] == 2 * N
  assert (workdir / "checkpoints_set_aside" / str(2 * N) / "why.txt").exists()
  assert_same_run(workdir, straight["workdir"])
  a, _, _ = restore(straight["workdir"], 2 * N, straight["config"])
  b, _, _ = restore(workdir, 2 * N, straight["config"])
  assert_bitwise_equal(a, b)


def test_host_stays_within_one_step_of_the_device(env, tmp_path, monkeypatch):
  """With a device slower than the host (here: a slow program chained on the step's
  metrics), the loop must not queue steps ahead: a preemption would otherwise first run the
  whole queue before it could save."""
  heavy = jax.jit(lambda m, x: jax.tree.map(lambda v: v + 0 * jnp.tanh(x @ x @ x).mean(), m))
  x = jnp.full((384, 384), 1e-3)
  real, behind = step_lib.make_train_step, []  # per call: unfinished steps before it

  def make(*args, **kwargs):
    f, outputs = real(*args, **kwargs), []

    def step(state, batch):
      behind.append(sum(not all(v.is_ready() for v in jax.tree.leaves(m)) for m in outputs))
      state, metrics = f(state, batch)
      outputs.append(heavy(metrics, x))
      return state, outputs[-1]
    return step

  monkeypatch.setattr(step_lib, "make_train_step", make)
  config = tiny_config(env, steps=16, log_every=0, eval_every=0, eval_steps=0,
                       checkpoint_every=0)
  loop.train_and_evaluate(config, str(tmp_path))
  assert len(behind) == 16 and max(behind) == 1, behind  # one step queued, never more


def test_zero_interval_means_never_for_every_interval(env, tmp_path):
  config = tiny_config(env, steps=5, log_every=0, eval_every=0, eval_steps=1,
                       checkpoint_every=0)
  summary = loop.train_and_evaluate(config, str(tmp_path))
  # Nothing periodic; the end of the run still logs, evaluates and saves.
  assert sorted(train_rows(tmp_path)) == [5] and sorted(eval_rows(tmp_path)) == [5]
  assert summary["checkpoints"] == [5]


def test_profile_steps_write_a_tensorboard_trace_to_the_workdir(env, tmp_path):
  config = tiny_config(env, steps=5, log_every=0, eval_every=0, eval_steps=0,
                       checkpoint_every=0, profile_steps=2, profile_num_steps=2)
  loop.train_and_evaluate(config, str(tmp_path))
  traces = list((tmp_path / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1, traces
  assert b"jit_train_step" in traces[0].read_bytes()  # the step itself was traced


@pytest.mark.parametrize("arg", ["objective=electra,nsp=nsp", "objective=all_tokens_mlm",
                                 "objective=mlm,nsp=sop,format=sentence_pair,norm=pre",
                                 "runlocal", "size=electra-small,objective=electra_15"])
def test_configs_build(arg):
  config = pretrain.get_config(arg)
  s = setup.build(config)
  assert s.obj.objective == config.objective.objective
  assert s.obj.max_predictions == (20 if s.obj.objective == "mlm" else 19) or arg == "runlocal"
  assert s.optim_cfg.total_steps == config.train.steps and s.flops_per_step > 0


@pytest.mark.parametrize("override, match", [
    (dict(steps=0), "flops_budget"),
    (dict(steps=-5), r"train.steps=-5: give a positive"),
    (dict(flops_budget=-1.0), "flops_budget=-1"),
    (dict(checkpoint_every=-1), r"train.checkpoint_every=-1: must be >= 0 \(0 means never"),
    (dict(log_every=-3), r"train.log_every=-3"),
    (dict(keep=0), "keep at least one"),
    (dict(skip_batches=10), "skip_batches=10 needs train.resume_step"),
])
def test_bad_config_values_are_refused_naming_the_key(override, match):
  config = pretrain.get_config("runlocal")
  config.train.update(override)
  with pytest.raises(setup.ConfigError, match=match):
    setup.build(config)


def test_bad_config_args():
  with pytest.raises(ValueError, match="pair format"):
    pretrain.get_config("nsp=nsp,format=full_sentences")
  with pytest.raises(ValueError, match="objective"):
    pretrain.get_config("objective=gan")


def test_logged_learning_rate_counts_updates_not_micro_batches():
  """With accumulation over k micro-batches, call c runs with the lr of update c // k."""
  cfg = pretrain.get_config("size=tiny")
  cfg.optim.update(dict(accumulation_steps=2, warmup_steps=4, learning_rate=1e-3))
  cfg.train.steps = 16
  s = setup.build(cfg)
  from encoder_jax.train.optim import learning_rate_schedule
  updates = learning_rate_schedule(s.optim_cfg)
  for call in range(16):
    assert float(s.trainer.schedule(call)) == float(updates(call // 2))
  assert float(s.trainer.schedule(3)) != float(updates(3))  # the old, micro-step reading


def test_stage_prints_progress_while_it_lasts(capsys):
  with Stage("compiling something", every_s=0.05):
    time.sleep(0.3)
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == "compiling something ..." and lines[-1].startswith(
      "compiling something: done in 0.")
  assert sum(line.startswith("  ... still compiling something") for line in lines) >= 2


@pytest.mark.parametrize("masking", ["dynamic", "static"])
def test_steps_compiled_ahead_take_what_the_loop_passes(env, tmp_path, monkeypatch, masking):
  """The train and eval steps start compiling before the data and the state exist, from
  abstract shapes (setup.abstract_batch, the state's shardings); the loop's real batches and
  state must then be exactly what was compiled for. A mismatch (a batch key, dtype, shape or
  sharding that batch_spec gets wrong; static masking adds example_id / epoch) would only
  cost a second compile and a warning, so the test reads `fell_back` instead."""
  made, real = [], loop._Steps
  monkeypatch.setattr(loop, "_Steps", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
  config = tiny_config(env, steps=3, log_every=0, eval_every=3, eval_steps=1,
                       checkpoint_every=0)
  config.objective.masking = masking
  summary = loop.train_and_evaluate(config, str(tmp_path))
  assert summary["steps"] == 3 and np.isfinite(summary["final_eval_loss"])
  (steps,) = made
  for fn in (steps.train, steps.eval):
    assert isinstance(fn, parts.Precompiled) and not fn.fell_back, fn.name
    assert fn._compiled is not None and fn._future is None  # called, and through the program


def test_a_finished_run_is_never_rewritten(env, tmp_path, monkeypatch, capsys):
  """The same command again on a finished run says so, builds no step, and leaves every file
  of the run as it was (summary.json byte for byte); more steps then train on, saying what
  the learning-rate schedule does at the resume step."""
  config = tiny_config(env, steps=3, log_every=0, eval_every=3, eval_steps=1,
                       checkpoint_every=0)
  config.optim.total_steps = 0  # the run's own length: more steps stretch the decay
  summary = loop.train_and_evaluate(config, str(tmp_path))
  files = {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()}
  built = []
  monkeypatch.setattr(loop, "_Steps", lambda *a, **k: built.append(1))
  capsys.readouterr()
  again = loop.train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  assert "already finished at step 3 of 3; raise train.steps to continue" in out
  assert built == []
  assert json.dumps(again, sort_keys=True, default=float) == json.dumps(summary, sort_keys=True,
                                                                          default=float)
  assert {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()} == files
  monkeypatch.undo()
  config.train.steps = 6
  more = loop.train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  assert more["steps"] == 6 and more["resumed_from"] == 3
  assert ("resuming at step 3 with another learning-rate schedule: decay horizon 3 -> 6 "
          "updates") in out and "(the old schedule had ended)" in out


def test_a_warm_up_longer_than_the_run_is_scaled_with_a_note(env, caplog):
  """BERT's 10,000 warm-up steps in a 100-step run would never reach the peak: warm up over
  10% of the run, and say so; a total_steps given with a longer warm-up is refused."""
  config = tiny_config(env, steps=100)
  config.optim.update(dict(warmup_steps=10_000, total_steps=0))
  with caplog.at_level("INFO"):
    s = setup.build(config)
  assert s.optim_cfg.total_steps == 100 and s.optim_cfg.warmup_steps == 10
  assert "optim.warmup_steps=10000 is not shorter than this run's 100 updates: warming up " \
         "over 10 instead" in caplog.text
  config.optim.total_steps = 50
  with pytest.raises(ValueError, match=r"optim.warmup_steps=10000 must be in \[0, total_steps"):
    setup.build(config)


def test_a_progress_line_comes_whatever_log_every_is(env, tmp_path, monkeypatch, capsys):
  """With metrics rows far apart (log_every beyond the run), the heartbeat still prints where
  the run is, its rate and ETA (here due at every step: PROGRESS_EVERY_S = 0)."""
  monkeypatch.setattr(parts, "PROGRESS_EVERY_S", 0.0)
  config = tiny_config(env, steps=5, log_every=1000, eval_every=0, eval_steps=0,
                       checkpoint_every=0)
  loop.train_and_evaluate(config, str(tmp_path))
  beats = [line for line in capsys.readouterr().out.splitlines() if "steps/s" in line]
  assert [line.split("/")[0] for line in beats] == [f"step {i}" for i in (2, 3, 4)], beats
  assert all("tok/s so far | ETA " in line and "metrics at step 5" in line for line in beats)


def test_heartbeat_is_due_every_interval_and_after_printed_lines():
  now = [0.0]
  beat = parts.Heartbeat(100, 64, log_every=50, every_s=30.0, clock=lambda: now[0])
  assert beat.line(1) is None  # not started (the first step compiles)
  beat.start(1)
  now[0] = 29.0
  assert beat.line(5) is None
  now[0] = 31.0
  line = beat.line(7)
  assert line.startswith("step   7/100 | 0.194 steps/s, 12.4 tok/s so far | ETA ")
  assert line.endswith("| metrics at step 50")
  now[0] = 50.0
  assert beat.line(9) is None  # 19 s since the last line
  beat.printed()  # a metrics row was printed at 50 s
  now[0] = 75.0
  assert beat.line(12) is None
  now[0] = 81.0
  assert beat.line(13) is not None


def test_precompiled_falls_back_to_jit_for_other_arguments_and_passes_wrappers_through():
  f = jax.jit(lambda x: 2 * x)
  same = parts.Precompiled.of(f, jax.ShapeDtypeStruct((3,), jnp.float32), name="f")
  np.testing.assert_array_equal(same(jnp.ones(3)), 2 * np.ones(3))
  assert not same.fell_back and same._compiled is not None
  other = parts.Precompiled.of(f, jax.ShapeDtypeStruct((3,), jnp.float32), name="f")
  np.testing.assert_array_equal(other(jnp.ones(4)), 2 * np.ones(4))  # another shape: jit
  assert other.fell_back and other._compiled is None
  np.testing.assert_array_equal(other(jnp.ones(5)), 2 * np.ones(5))
  wrapper = lambda x: f(x)  # noqa: E731  (a test's wrapper: cannot be lowered)
  assert parts.Precompiled.of(wrapper, jax.ShapeDtypeStruct((3,), jnp.float32),
                              name="w") is wrapper


def test_the_loop_reads_only_the_frozen_setup(env, tmp_path, monkeypatch):
  """train_and_evaluate reads the ConfigDict once, through setup.build: a config changed right
  after that (every value the loop or recovery could read, made unusable) runs exactly as
  built, and the workdir records the config as it was built."""
  config = tiny_config(env, steps=3, log_every=1, eval_every=3, checkpoint_every=3)
  real = setup.build

  def build_then_poison(cfg, *a, **k):
    s = real(cfg, *a, **k)
    cfg.train.update(dict(steps=-7, eval_steps=-1, log_every=-1, keep=0, resume_step=99))
    cfg.data.update(dict(source="files:/nonexistent/*.txt", batch_size=3, max_length=999,
                         vocab="/nonexistent/vocab.txt"))
    cfg.optim.learning_rate = float("nan")
    cfg.mesh = "bad,mesh"
    cfg.init_from = "/nonexistent"
    return s

  monkeypatch.setattr(setup, "build", build_then_poison)
  summary = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert summary["steps"] == 3 and np.isfinite(summary["final_eval_loss"])
  recorded = json.loads((tmp_path / "run" / setup.CONFIG_FILE).read_text())
  assert recorded["train"]["steps"] == 3 and recorded["data"]["batch_size"] == 4
