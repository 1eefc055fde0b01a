"""Recovering from what goes wrong: a divergence (roll back with a lower learning rate, or
skipping batches), a failed checkpoint save, SIGTERM during start-up.

Same tiny model and corpus as test_loop.py (tests/loop_helpers.py). The save fault is
injected into Orbax's writer: tests run as root, which file permissions do not stop.
"""
import json
import re
import subprocess
import time

import jax
import numpy as np
import pytest

from encoder_jax.train import checkpoint, loop, setup
from encoder_jax.train import step as step_lib
from loop_helpers import N, restore, run_cli, tiny_config, train_rows


def _divergence(e) -> tuple[int, int, str]:
  msg = str(e.value)
  return (int(re.search(r"at step (\d+)", msg)[1]), int(re.search(r"resume_step=(\d+)", msg)[1]),
          msg)


def test_lr_spike_keeps_a_usable_checkpoint_and_a_lower_lr_trains_on(env, tmp_path):
  quiet = dict(log_every=1, eval_every=0, eval_steps=0, checkpoint_every=1, keep=3)
  loop.train_and_evaluate(tiny_config(env, steps=4, **quiet), str(tmp_path))
  good_config = (tmp_path / "config.json").read_text()

  spike = tiny_config(env, steps=2 * N, **quiet)  # resumed at a learning rate of 1e30
  spike.optim.learning_rate = 1e30  # Adam's steps are ~lr whatever the clipping
  with pytest.raises(FloatingPointError, match=r"Non-finite \w+ .* at step") as e:
    loop.train_and_evaluate(spike, str(tmp_path))
  bad, back, msg = _divergence(e)
  assert (tmp_path / "config.json").read_text() == good_config  # the failed run left it
  # The state that produced the non-finite step is set aside, never offered for a resume.
  assert (tmp_path / "checkpoints_set_aside" / str(bad - 1) / "why.txt").exists()
  kept = checkpoint.Checkpointer(tmp_path / "checkpoints").all_steps()
  assert bad - 1 not in kept and back in kept and back < bad - 1
  assert "--config.optim.learning_rate" in msg and "skip_batches" in msg
  state, _, _ = restore(tmp_path, back, spike)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))

  lower = tiny_config(env, steps=2 * N, resume_step=back, **quiet)
  lower.optim.learning_rate = 1e-3
  summary = loop.train_and_evaluate(lower, str(tmp_path))
  assert summary["resumed_from"] == back and summary["steps"] == 2 * N
  assert all(np.isfinite(r["loss"]) for r in train_rows(tmp_path).values())
  assert json.loads((tmp_path / "config.json").read_text())["optim"]["learning_rate"] == 1e-3
  assert (tmp_path / f"config.before_step_{back}.json").read_text() == good_config


def test_skipping_the_batches_of_a_spike_trains_on_and_restarts_keep_the_branch(
    env, tmp_path, monkeypatch):
  """A batch that makes the loss non-finite (a forced spike): the rollback checkpoint from
  before the last finite evaluation survives keep=1, and resuming there while skipping the
  batches up to the spike trains on; the same command after a restart continues that branch
  instead of rolling back again."""
  config = tiny_config(env, steps=10, log_every=2, eval_every=4, eval_steps=1,
                       checkpoint_every=2, keep=1)
  it = iter(setup.make_loader(setup.DataSettings.of(config), "train"))
  batches = [next(it)["input_ids"] for _ in range(16)]
  poison = batches[9]  # consumed by step 10
  assert sum(np.array_equal(b, poison) for b in batches) == 1
  real = step_lib.make_train_step

  def make(*args, **kwargs):
    f = real(*args, **kwargs)

    def step(state, batch):
      state, metrics = f(state, batch)
      if np.array_equal(np.asarray(batch["input_ids"]), poison):
        metrics = dict(metrics, loss=metrics["loss"] * np.nan)
      return state, metrics
    return step

  monkeypatch.setattr(step_lib, "make_train_step", make)
  with pytest.raises(FloatingPointError) as e:
    loop.train_and_evaluate(config, str(tmp_path))
  bad, back, msg = _divergence(e)
  assert (bad, back) == (10, 6)  # 6: the newest checkpoint before the finite eval at step 8
  assert checkpoint.Checkpointer(tmp_path / "checkpoints").all_steps() == [6, 8]
  assert "--config.train.skip_batches=4" in msg and "resumes from 8" in msg

  branch = tiny_config(env, steps=12, log_every=2, eval_every=4, eval_steps=1,
                       checkpoint_every=2, keep=1, resume_step=6, skip_batches=4)
  summary = loop.train_and_evaluate(branch, str(tmp_path))
  assert summary["resumed_from"] == 6 and summary["steps"] == 12
  assert (tmp_path / "checkpoints_set_aside" / "8").is_dir()  # the rolled-back branch
  _, data, meta = restore(tmp_path, 12, branch)
  assert data["step"] == 12 + 4 and meta["branch"] == {"from": 6, "skip": 4}

  branch.train.steps = 14  # e.g. preempted and restarted with the same flags
  again = loop.train_and_evaluate(branch, str(tmp_path))
  assert again["resumed_from"] == 12 and again["steps"] == 14


def test_failed_save_stops_at_once_with_one_line(env, tmp_path):
  """The writer fails (EACCES on the step's temporary folder, as for an unwritable
  directory): the run stops before its next checkpoint, prints one line naming the path and
  the cause, exits non-zero within seconds (Orbax's abandoned threads would otherwise hold
  the exit for ever), removes the partial folder and keeps the previous checkpoint."""
  config = tiny_config(env, steps=4 * N, log_every=1, eval_every=0, eval_steps=0,
                       checkpoint_every=N)
  workdir = tmp_path / "failing"
  proc = run_cli(env, config, workdir, fault=f"{2 * N}.orbax-checkpoint-tmp/data")
  try:
    out = proc.communicate(timeout=180)[0]
  except subprocess.TimeoutExpired:
    proc.kill()
    raise AssertionError("the run hung after a failed save") from None
  t_exit = time.time()
  fault_at = float(re.search(r"^FAULT (\S+)$", out, re.M)[1])
  print(f"\nfailed save: exited {t_exit - fault_at:.2f} s after the fault")
  assert proc.returncode == 1, out
  assert t_exit - fault_at < 30, out
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in out, out
  assert re.match(rf"error: could not save checkpoint step {2 * N} in \S+/checkpoints: "
                  r"PermissionError: .*Permission denied", errors[0]), errors[0]
  assert max(train_rows(workdir)) < 3 * N  # stopped before the next checkpoint was due
  ckpts = workdir / "checkpoints"
  assert sorted(p.name for p in ckpts.iterdir()) == [str(N)]  # no partial tmp folder left
  assert checkpoint.verify(ckpts / str(N)) is None


def test_sigterm_during_startup_exits_zero_and_the_first_line_comes_fast(env, tmp_path):
  config = tiny_config(env, steps=2 * N)
  t0 = time.perf_counter()
  proc = run_cli(env, config, tmp_path / "startup")
  first = proc.stdout.readline()
  first_s = time.perf_counter() - t0
  lines = [first]
  while "initialising the parameters" not in lines[-1]:  # start-up, before the loop
    lines.append(proc.stdout.readline())
    assert lines[-1], "".join(lines)
  t_signal = time.perf_counter()
  proc.send_signal(15)
  out = "".join(lines) + proc.communicate(timeout=120)[0]
  print(f"\nfirst line after {first_s:.2f} s; exit {time.perf_counter() - t_signal:.2f} s after "
        "SIGTERM")
  assert first.startswith("encoder_jax.main: starting") and first_s < 5, (first_s, out)
  assert proc.returncode == 0, out
  assert "SIGTERM outside the training loop" in out and "Traceback" not in out, out
