"""The pre-training loop's pieces alone (encoder_jax/train/loop_parts.py and
recovery.restore_or_init): no model, no run; fake clocks and fake checkpointers."""
import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.train import loop_parts as parts
from encoder_jax.train import recovery


class Clock:
  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_meter_counts_steady_steps_without_excluded_time():
  clock = Clock()
  m = parts.ThroughputMeter(flops_per_step=2e9, tokens_per_step=1000, n_devices=2,
                            peak_per_device=1e10, clock=clock)
  assert m.lap(5) == {} and math.isnan(m.eta_s(10))  # nothing measured before start
  m.start(1)  # the compiling step (0 -> 1) is not counted
  clock.t += 5.0  # steps 1 -> 5 take 4 s of training + 1 s of evaluation
  m.exclude(1.0)
  row = m.lap(5)
  assert row["step_time_s"] == pytest.approx(1.0)
  assert row["tokens_per_s"] == pytest.approx(1000.0)
  assert row["flops_per_s"] == pytest.approx(2e9) and row["mfu"] == pytest.approx(0.1)
  assert row["flops_per_s_per_device"] == pytest.approx(1e9)
  clock.t += 0.5  # writing the row is not counted: mark() restarts the clock after it
  m.mark(5)
  clock.t += 10.0  # 5 -> 10 at 2 s a step; the exclusion was reset by mark()
  assert m.lap(10)["step_time_s"] == pytest.approx(2.0)
  m.mark(10)
  assert m.lap(10) == {}  # no new steps since the mark
  assert m.eta_s(7) == pytest.approx(7 * 14.0 / 9)
  s = m.summary()
  assert s["tokens_per_s"] == pytest.approx(9 * 1000 / 14.0)
  assert s["mfu"] == pytest.approx(9 / 14.0 * 2e9 / 2e10)
  assert parts.ThroughputMeter(1, 1, 1, 1).summary() == dict(tokens_per_s=None,
                                                             flops_per_s=None, mfu=None)


def test_pending_metrics_check_every_step_and_keep_step_order():
  window = recovery.Window()
  pending = parts.PendingMetrics(window)
  pending.fetch()  # nothing pending: no-op
  for step, loss in ((1, 3.0), (2, 1.0)):
    pending.push(step, {"loss": jnp.float32(loss), "grad_norm": jnp.float32(0.5)})
  assert window.n == 0  # nothing reaches the window before a fetch
  pending.fetch()
  assert window.n == 2 and window.take_means() == {"loss": 2.0, "grad_norm": 0.5}
  pending.push(3, {"loss": jnp.float32(1.0), "grad_norm": jnp.float32(1.0)})
  pending.push(4, {"loss": jnp.float32(1.0), "grad_norm": jnp.float32(np.inf)})
  pending.push(5, {"loss": jnp.float32(np.nan), "grad_norm": jnp.float32(1.0)})
  with pytest.raises(parts.NonFiniteError) as e:
    pending.fetch()
  assert e.value.args[:2] == (4, "grad_norm") and e.value.args[2] == np.inf
  assert isinstance(e.value, FloatingPointError)


class FakeCkpt:
  def __init__(self, steps):
    self.steps, self.protected = list(steps), []

  def all_steps(self):
    return list(self.steps)

  def protect(self, step):
    self.protected.append(step)


def test_rollback_is_the_newest_checkpoint_before_the_latest_healthy_check():
  ckpt = FakeCkpt([10, 20])
  r = parts.Rollback(ckpt, {"step": 10, "at": 15})
  assert r.state() == {"step": 10, "at": 15} and ckpt.protected == [10]
  r.healthy_at(20)  # 20 itself was saved after the check at 20 began: not older
  assert r.state() == {"step": 10, "at": 15}
  r.healthy_at(25)
  assert r.state() == {"step": 20, "at": 25} and ckpt.protected[-1] == 20
  r.saved_at(30)
  r.healthy_at(30)  # nothing older than 30 is newer than 20
  assert r.step == 20
  r.healthy_at(31)
  assert r.state() == {"step": 30, "at": 31}
  # a saved rollback whose checkpoint is gone (set aside) is forgotten; none is protected
  gone = parts.Rollback(FakeCkpt([20]), {"step": 10, "at": 15})
  assert gone.state() == {"step": None, "at": None} and gone.ckpt.protected == [None]
  fresh = parts.Rollback(FakeCkpt([]))
  fresh.healthy_at(5)
  assert fresh.step is None


def test_schedule_intervals_end_step_and_final_eval():
  s = parts.Schedule(log_every=10, eval_every=25, checkpoint_every=0, end_step=60,
                     evaluating=True)
  assert s.at(10) == parts.Due(log=True, eval=False, save=False)
  assert s.at(50) == parts.Due(log=True, eval=True, save=False)
  assert not s.at(7).any
  assert s.at(60) == parts.Due(log=True, eval=False, save=True)  # the end logs and saves
  assert s.needs_final_eval(60, start=0)
  assert not s.needs_final_eval(50, start=0)  # just evaluated at 50
  assert s.needs_final_eval(50, start=50)  # a resumed process that ran no step yet
  assert not s.log_is_health_check
  off = parts.Schedule(log_every=0, eval_every=25, checkpoint_every=5, end_step=60,
                       evaluating=False)
  assert off.at(25) == parts.Due(log=False, eval=False, save=True)
  assert off.log_is_health_check and not off.needs_final_eval(60, start=0)
  assert parts.Schedule(0, 0, 0, 60, True).log_is_health_check  # no periodic evaluations


def test_heldout_line_states_the_gap_to_the_unigram_baseline():
  ev = dict(mlm_accuracy=0.3, mlm_loss=4.0, unigram_accuracy=0.05, unigram_loss=6.5,
            mlm_at_mask_accuracy=0.25, mlm_at_mask_loss=4.5, unigram_at_mask_accuracy=0.04,
            unigram_at_mask_loss=6.6)
  line = parts.heldout_line(100, ev, unigram_entropy=6.2)
  assert line.startswith("held-out MLM at step 100: accuracy 30.0% (unigram baseline 5.0%)")
  assert "2.500 below the unigram baseline's 6.500" in line and "entropy 6.200" in line
  assert line.endswith("accuracy 25.0% (unigram 4.0%), loss 2.100 below the unigram baseline")
  gen = {k.replace("mlm", "gen"): v for k, v in ev.items()}
  assert "accuracy 30.0%" in parts.heldout_line(1, gen, 6.2)
  assert parts.heldout_line(1, {"loss": 1.0}, None) is None
  # another split than validation is scored the same way but never called held out
  other = parts.heldout_line(100, ev, 6.2, split="train")
  assert other.startswith("MLM on the train split (data.eval_split='train': not held out) at "
                          "step 100: accuracy 30.0%") and "held-out" not in other
  assert parts.heldout_line(1, {k: v for k, v in ev.items() if "unigram" not in k}, 6.2) is None


class FakeRestoreCkpt:
  directory = "ckpts"

  def __init__(self, newest, state_step=None, meta=None):
    self.newest, self.meta = newest, meta or {}
    self.state_step = newest if state_step is None else state_step

  def newest_good(self, below=None, report=None):
    return self.newest

  def all_steps(self):
    return [] if self.newest is None else [self.newest]

  def read_meta(self, step):
    return self.meta

  def set_aside_after(self, step, why):
    return []

  def restore(self, step, abstract):
    return types.SimpleNamespace(step=self.state_step), {"step": 7}, self.meta


class FakeIterator:
  state = None

  def set_state(self, s):
    self.state = s


def test_restore_or_init_fresh_resumed_and_branched():
  said, it = [], FakeIterator()
  train = types.SimpleNamespace(resume_step=0, skip_batches=0)  # (setup.TrainSettings' fields)
  begin = recovery.restore_or_init(FakeRestoreCkpt(None), train, None, lambda: "fresh", it,
                                   said.append)
  assert (begin.state, begin.step, begin.branch, begin.meta) == ("fresh", 0, None, {})
  assert it.state is None
  meta = {"wall_s": 3.0, "branch": {"from": 4, "skip": 2}}
  begin = recovery.restore_or_init(FakeRestoreCkpt(8, meta=meta), train, None, None, it,
                                   said.append)
  assert begin.step == 8 and begin.branch == meta["branch"] and begin.meta is meta
  assert it.state == {"step": 7}  # the iterator resumes where the checkpoint left it
  # train.resume_step=8 with skip_batches=5 starts a new branch: 5 batches are skipped
  branch = types.SimpleNamespace(resume_step=8, skip_batches=5)
  begin = recovery.restore_or_init(FakeRestoreCkpt(8), branch, None, None, it, said.append)
  assert begin.branch == {"from": 8, "skip": 5} and it.state == {"step": 12}
  assert said[-1] == "skipping 5 batches after step 8 (train.skip_batches)"
  with pytest.raises(ValueError, match="holds step 9"):
    recovery.restore_or_init(FakeRestoreCkpt(8, state_step=9), train, None, None, it,
                             said.append)


def test_profiler_traces_the_chosen_steps_once(tmp_path):
  calls = []
  prof = parts.StepProfiler(3, 2, tmp_path / "profile", start=lambda d: calls.append(("start", d)),
                            stop=lambda: calls.append("stop"))
  for step in range(8):  # the loop: before(step) runs the step that makes step + 1
    prof.before(step)
    prof.after(step + 1, jnp.zeros(()))
  assert calls == [("start", str(tmp_path / "profile")), "stop"]
  # steps 4 and 5 traced: started before the step from 3, stopped once 5 is done
  calls.clear()
  prof = parts.StepProfiler(3, 2, tmp_path, start=lambda d: calls.append("start"),
                            stop=lambda: calls.append("stop"))
  for step in (3,):
    prof.before(step)
    prof.after(step + 1, jnp.zeros(()))
  assert calls == ["start"]
  prof.close()  # the loop ended (preemption) inside the window: the trace is still stopped
  assert calls == ["start", "stop"]
  off = parts.StepProfiler(0, 3, tmp_path, start=lambda d: calls.append("x"), stop=None)
  resumed = parts.StepProfiler(3, 3, tmp_path, start=lambda d: calls.append("x"), stop=None)
  for step in range(5, 9):  # resumed past the first profiled step: nothing
    off.before(step)
    resumed.before(step)
  assert calls == ["start", "stop"]


def test_a_run_builds_its_tokenizer_once_and_the_loader_exposes_it(env, monkeypatch, tmp_path):
  from encoder_jax.data import tokenizer
  from encoder_jax.train import setup
  import loop_helpers as H
  built = []
  real = tokenizer.WordPieceTokenizer.from_vocab.__func__
  monkeypatch.setattr(tokenizer, "_LOADED", {})
  monkeypatch.setattr(tokenizer.WordPieceTokenizer, "from_vocab", classmethod(
      lambda cls, path, lowercase=True: built.append(path) or real(cls, path, lowercase)))
  config = H.tiny_config(env)
  s = setup.build(config)
  data = setup.DataSettings.of(config)
  train, ev = setup.make_loader(data, "train"), setup.make_loader(data, "train")
  assert len(built) == 1 and train.tokenizer is ev.tokenizer
  assert s.obj.vocab_size == train.tokenizer.vocab_size
  assert s.obj.mask_id == train.tokenizer.mask_id
  # an edited vocab file is a new tokenizer
  vocab = tmp_path / "vocab.txt"
  vocab.write_text(open(built[0]).read())
  tokenizer.WordPieceTokenizer.load(vocab)
  assert len(built) == 1  # same contents: the cached one
  vocab.write_text(open(built[0]).read().replace("[unused0]", "[unused0x]"))
  tokenizer.WordPieceTokenizer.load(vocab)
  assert len(built) == 2


def test_profiler_excludes_stopping_the_trace_but_not_the_traced_steps(tmp_path):
  """The seconds `after` reports (left out of the throughput) are the stop and the write, not
  the wait for the traced steps' device work, which is training."""
  import time as time_lib

  class Slow:  # outputs whose device work takes 0.3 s more
    def block_until_ready(self):
      time_lib.sleep(0.3)
      return self

  prof = parts.StepProfiler(1, 1, tmp_path, start=lambda d: None, stop=lambda: None)
  prof.before(1)
  assert prof.after(2, Slow()) < 0.1
