"""train_and_evaluate: bit-exact resume after SIGKILL, SIGTERM, non-finite stop, FLOP budget, traces.

One tiny model (1 block, d=32, rows of 32 tokens, batch 4, dropout on) on a three-document
text corpus built once per module. Every run here shares the step's compiled program (same
shapes and optimizer constants: optim.total_steps is pinned, only the loop's stopping rule
varies), so the persistent compilation cache makes the subprocess runs cheap.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from encoder_jax.train import checkpoint, loop, metrics_io
from encoder_jax.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from configs import pretrain  # noqa: E402

N = 6  # checkpoint interval; the straight run is 2N steps
PERF_KEYS = {"time", "step_time_s", "tokens_per_s", "flops_per_s", "mfu"}

DOCS = [
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no "
    "money in my purse, and nothing particular to interest me on shore, I thought I would "
    "sail about a little and see the watery part of the world. It is a way I have of driving "
    "off the spleen and regulating the circulation. Whenever I find myself growing grim "
    "about the mouth, then I account it high time to get to sea as soon as I can.",
    "Mr. Speaker, Mr. Vice President, members of Congress, my fellow Americans. The state of "
    "our union is strong. Our economy is growing, and our people are at work. We have more "
    "to do, and we will do it together. Tonight I ask you to join me in this work.",
    "The Fulton County Grand Jury said Friday an investigation of the recent primary "
    "election produced no evidence that any irregularities took place. The jury further said "
    "in term-end presentments that the City Executive Committee deserves the praise and "
    "thanks of the City of Atlanta for the manner in which the election was conducted.",
]

# Runs a config in a fresh process; after `hang_after` step calls it writes `marker` and
# sleeps, like a worker caught mid-run by the scheduler's SIGKILL.
DRIVER = """
import json, sys, time
import ml_collections
from encoder_jax.train import loop, step as step_lib
cfg_path, workdir, hang_after, marker = sys.argv[1:]
config = ml_collections.ConfigDict(json.load(open(cfg_path)))
real = step_lib.make_train_step
def make(*args, **kwargs):
  f, calls = real(*args, **kwargs), [0]
  def step(state, batch):
    calls[0] += 1
    if calls[0] > int(hang_after) > 0:
      open(marker, "w").close()
      time.sleep(3600)
    return f(state, batch)
  return step
step_lib.make_train_step = make
loop.train_and_evaluate(config, workdir)
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """Corpus files, a TFDS data_dir and a compilation cache shared by every run here."""
  base = tmp_path_factory.mktemp("loop")
  for i, text in enumerate(DOCS):
    (base / f"doc{i}.txt").write_text(text + "\n")
  cache = str(base / "xla_cache")
  old = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                             "jax_persistent_cache_min_compile_time_secs")}
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  yield {"base": base, "source": f"files:{base}/doc*.txt", "data_dir": str(base / "tfds"),
         "cache": cache}
  for k, v in old.items():
    jax.config.update(k, v)


def tiny_config(env, **train):
  config = pretrain.get_config("size=tiny")
  config.model.update(dict(num_layers=1, hidden_size=32, num_heads=2, ffn_size=64,
                           max_positions=32))
  config.data.update(dict(source=env["source"], data_dir=env["data_dir"], max_length=32,
                          batch_size=4, eval_split="train"))  # too small for a validation split
  config.optim.update(dict(learning_rate=3e-3, warmup_steps=2, total_steps=2 * N))
  config.train.update(dict(steps=1000, log_every=1, eval_every=N, eval_steps=2,
                           checkpoint_every=N, keep=5, flops_budget=0.0, peak_flops=1e11))
  config.train.update(train)
  return config


def budget_for(config, steps):
  """A FLOP budget that the run reaches exactly at `steps`."""
  return (steps - 0.5) * loop.build(config).flops_per_step


def run_subprocess(env, config, workdir, hang_after=0):
  cfg_path = env["base"] / f"{os.path.basename(workdir)}.json"
  cfg_path.write_text(config.to_json())
  (env["base"] / "driver.py").write_text(DRIVER)
  # PYTHONPATH: the child imports the encoder_jax under test, not whichever one is installed.
  e = dict(os.environ, JAX_COMPILATION_CACHE_DIR=env["cache"],
           JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
           PYTHONPATH=os.pathsep.join([str(ROOT)] + os.environ.get("PYTHONPATH", "").split(
               os.pathsep)).rstrip(os.pathsep))
  marker = str(workdir) + ".hung"
  proc = subprocess.Popen([sys.executable, str(env["base"] / "driver.py"), str(cfg_path),
                           str(workdir), str(hang_after), marker], cwd=ROOT, env=e,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return proc, marker


def wait_for(predicate, proc, timeout=240.0):
  deadline = time.time() + timeout
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f"the run exited ({proc.returncode}) early:\n{proc.stdout.read()}")
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"timed out:\n{proc.stdout.read()}")
    time.sleep(0.1)


def train_rows(workdir):
  rows = [r for r in metrics_io.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")
          if r["split"] == "train"]
  return {r["step"]: {k: v for k, v in r.items() if k not in PERF_KEYS} for r in rows}


def restore(workdir, step, config):
  s = loop.build(config)
  ckpt = checkpoint.Checkpointer(pathlib.Path(workdir) / "checkpoints")
  state, data, meta = ckpt.restore(step, jax.eval_shape(s.init_fn))
  ckpt.close()
  return state, data, meta


def assert_bitwise_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


@pytest.fixture(scope="module")
def straight(env, tmp_path_factory):
  """2N steps without interruption, counting traces of the train and eval losses."""
  traces = {True: 0, False: 0}
  real = step_lib.loss_and_metrics

  def counting(*args, train, **kwargs):
    traces[train] += 1  # runs only while jax traces the step
    return real(*args, train=train, **kwargs)

  config = tiny_config(env)
  config.train.flops_budget = budget_for(config, 2 * N)
  workdir = tmp_path_factory.mktemp("straight")
  step_lib.loss_and_metrics = counting
  try:
    summary = loop.train_and_evaluate(config, str(workdir))
  finally:
    step_lib.loss_and_metrics = real
  return dict(config=config, workdir=workdir, summary=summary, traces=traces)


def test_flops_budget_and_summary(straight):
  s = straight["summary"]
  assert s["steps"] == 2 * N and s["stop_reason"] == "flops_budget"
  assert s["cumulative_flops"] >= straight["config"].train.flops_budget
  assert s["checkpoints"] == [N, 2 * N]
  assert s["final_eval_loss"] is not None and np.isfinite(s["final_train_loss"])
  rows = train_rows(straight["workdir"])
  assert sorted(rows) == list(range(1, 2 * N + 1))
  assert rows[2 * N]["cumulative_flops"] == s["cumulative_flops"]
  saved = json.loads((straight["workdir"] / "config.json").read_text())
  assert saved["seed"] == 0 and saved["train"]["checkpoint_every"] == N


def test_no_retrace_after_first_step(straight):
  # 2N train steps and two evaluations of two batches each: one trace of each function.
  assert straight["traces"] == {True: 1, False: 1}


def test_resume_after_sigkill_is_bit_exact(env, straight, tmp_path):
  config, workdir = straight["config"], tmp_path / "killed"
  proc, marker = run_subprocess(env, config, workdir, hang_after=N + 2)
  ckpt_n = workdir / "checkpoints" / str(N)
  wait_for(lambda: os.path.exists(marker) and ckpt_n.is_dir(), proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=30) == -signal.SIGKILL
  assert max(train_rows(workdir)) == N + 2  # two steps past the checkpoint are lost

  summary = loop.train_and_evaluate(config, str(workdir))
  assert summary["resumed_from"] == N and summary["steps"] == 2 * N
  want, got = train_rows(straight["workdir"]), train_rows(workdir)
  assert sorted(got) == sorted(want)  # the lost steps' rows were dropped, then redone
  for step in want:  # every per-step loss and metric, bit for bit (floats repr'd in JSON)
    assert got[step] == want[step], step
  a, data_a, _ = restore(straight["workdir"], 2 * N, config)
  b, data_b, _ = restore(workdir, 2 * N, config)
  assert_bitwise_equal(a, b)  # step, params, optimizer state
  assert data_a == data_b and data_a["step"] == 2 * N


def test_sigterm_saves_current_step_and_exits_zero(env, straight, tmp_path):
  config, workdir = straight["config"].copy_and_resolve_references(), tmp_path / "term"
  config.train.flops_budget = 0.0  # would run 1000 steps
  config.train.checkpoint_every = 1000
  proc, _ = run_subprocess(env, config, workdir)
  wait_for(lambda: (workdir / "metrics.jsonl").exists() and max(train_rows(workdir),
                                                                default=0) >= 3, proc)
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == 0, out
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["stop_reason"] == "preempted" and 3 <= summary["steps"] < 1000
  assert summary["checkpoints"] == [summary["steps"]]
  state, data, _ = restore(workdir, summary["steps"], config)
  assert int(state.step) == data["step"] == summary["steps"]


def test_non_finite_loss_stops_naming_step_and_keeps_last_good(env, tmp_path):
  # A learning rate of 1e30 reached after a warm-up: a few sane steps, then overflow.
  config = tiny_config(env, checkpoint_every=1, eval_every=0, steps=30, keep=50)
  config.optim.update(dict(learning_rate=1e30, warmup_steps=6, total_steps=30,
                           clip_grad_norm=0.0))
  with pytest.raises(FloatingPointError, match=r"Non-finite \w+ .* at step (\d+)") as e:
    loop.train_and_evaluate(config, str(tmp_path))
  bad = int(str(e.value).split(" at step ")[1].split(":")[0])
  summary = json.loads((tmp_path / "summary.json").read_text())
  steps = checkpoint.Checkpointer(tmp_path / "checkpoints").all_steps()
  assert summary["stop_reason"] == "non_finite" and bad >= 2
  assert steps and max(steps) == bad - 1 == summary["last_good_checkpoint"]
  assert f"last good checkpoint is step {bad - 1}" in str(e.value)
  state, _, _ = restore(tmp_path, bad - 1, config)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))


@pytest.mark.parametrize("arg", ["objective=electra,nsp=nsp", "objective=all_tokens_mlm",
                                 "objective=mlm,nsp=sop,format=sentence_pair,norm=pre",
                                 "runlocal", "size=electra-small,objective=electra_15"])
def test_configs_build(arg):
  config = pretrain.get_config(arg)
  s = loop.build(config)
  assert s.obj.objective == config.objective.objective
  assert s.obj.max_predictions == (20 if s.obj.objective == "mlm" else 19) or arg == "runlocal"
  assert s.optim_cfg.total_steps == config.train.steps and s.flops_per_step > 0


def test_bad_config_args():
  with pytest.raises(ValueError, match="pair format"):
    pretrain.get_config("nsp=nsp,format=full_sentences")
  with pytest.raises(ValueError, match="objective"):
    pretrain.get_config("objective=gan")
  config = pretrain.get_config("runlocal")
  config.train.steps = 0
  with pytest.raises(ValueError, match="flops_budget"):
    loop.build(config)


def test_logged_learning_rate_counts_updates_not_micro_batches():
  """With accumulation over k micro-batches, call c runs with the lr of update c // k."""
  cfg = pretrain.get_config("size=tiny")
  cfg.optim.update(dict(accumulation_steps=2, warmup_steps=4, learning_rate=1e-3))
  cfg.train.steps = 16
  s = loop.build(cfg)
  from encoder_jax.train.optim import learning_rate_schedule
  updates = learning_rate_schedule(s.optim_cfg)
  for call in range(16):
    assert float(s.trainer.schedule(call)) == float(updates(call // 2))
  assert float(s.trainer.schedule(3)) != float(updates(3))  # the old, micro-step reading
