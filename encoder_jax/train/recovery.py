"""What a restarted pre-training run picks up, and what it says after a divergence.

  start, branch = choose_start(ckpt, s.train, say)        # newest good, or a rollback branch
  begin = restore_or_init(ckpt, s.train, abstract, init, train_it, say)  # + the state
  window = Window(meta.get("window"))                     # the open log window, restored
  record = ConfigRecord(s.config_json, workdir, start, say)  # config.json and its history

`s` is the run's frozen train.setup.Setup: recovery reads its TrainSettings, never the
ConfigDict.
  raise FloatingPointError(divergence_message(...))       # how to roll back and train on

Used by encoder_jax.train.loop, whose docstring states the behaviour these pieces give.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from etils import epath
from flax.traverse_util import flatten_dict
import jax
import numpy as np

from encoder_jax import paths
from encoder_jax.train.checkpoint import Checkpointer, CheckpointError
from encoder_jax.train.metrics_io import Stage
from encoder_jax.train.setup import CONFIG_FILE, TrainSettings


class Window:
  """The per-step metrics since the last log row, as float64 sums in step order.

  A log row is their mean. The sums travel with every checkpoint, so the first row after a
  resume averages the same steps, summed in the same order, as the uninterrupted run's row:
  metrics.jsonl matches row for row whatever log_every and checkpoint_every are.
  """

  def __init__(self, saved: dict | None = None):
    self.n = int(saved["n"]) if saved else 0
    self.sums = {k: float(v) for k, v in saved["sums"].items()} if saved else {}

  def add(self, m: dict[str, np.ndarray]) -> None:
    self.n += 1
    for k, v in m.items():
      self.sums[k] = self.sums.get(k, 0.0) + float(v)

  def take_means(self) -> dict[str, float] | None:
    if not self.n:
      return None
    means = {k: v / self.n for k, v in self.sums.items()}
    self.n, self.sums = 0, {}
    return means

  def state(self) -> dict:
    return {"n": self.n, "sums": dict(self.sums)}


class ConfigRecord:
  """config.json holds the config of the newest checkpoints.

  A fresh run writes it at once. A resumed run whose config differs (a new learning rate, a
  rollback) replaces it only once it has sealed a checkpoint of its own, keeping the old one
  as config.before_step_<start>.json: a run that fails before that (e.g. diverging at a too
  high learning rate) leaves the good run's config.json as it was.
  """

  def __init__(self, config_json: str, workdir: str, start: int, say: Callable[[str], None]):
    self.text = config_json
    self.path = epath.Path(workdir) / CONFIG_FILE
    self.start, self.pending = start, False
    self.enabled = jax.process_index() == 0
    if not self.path.exists():
      self._write()
      return
    old_text = self.path.read_text()
    if old_text == self.text:
      return
    try:
      old, new = (flatten_dict(json.loads(x), sep=".") for x in (old_text, self.text))
      changed = [f"{k}: {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new))
                 if old.get(k) != new.get(k)]
    except ValueError:
      changed = ["(config.json is not JSON)"]
    say(f"the config differs from {self.path} ({'; '.join(changed[:6])}"
        f"{' ...' if len(changed) > 6 else ''}); it is recorded there once this run saves "
        "a checkpoint")
    self.pending = True

  def _write(self):
    if self.enabled:
      paths.write_atomic(self.path, self.text)

  def commit(self) -> None:
    """Call once this run has sealed a checkpoint."""
    if not self.pending:
      return
    self.pending = False
    if self.enabled:
      old, n = self.path.parent / f"config.before_step_{self.start}.json", 1
      while old.exists():
        old, n = self.path.parent / f"config.before_step_{self.start}.{n}.json", n + 1
      self.path.rename(old)
    self._write()


def choose_start(ckpt: Checkpointer, t: TrainSettings,
                 say: Callable[[str], None]) -> tuple[int, dict | None]:
  """(step to restore, 0 for none; the branch to record, or None to keep the checkpoint's).

  train.resume_step = S rolls back to checkpoint S and starts a branch {"from": S, "skip": K}
  that its checkpoints record; when the newest good checkpoint already continues that branch
  (a restart of the same command after a preemption), it is resumed instead.
  """
  newest = ckpt.newest_good(report=say)
  want = t.resume_step
  if not want:
    return newest or 0, None
  branch = {"from": want, "skip": t.skip_batches}
  if newest is not None and newest > want and ckpt.read_meta(newest).get("branch") == branch:
    return newest, branch
  if newest is None or ckpt.newest_good(below=want + 1, report=say) != want:
    raise CheckpointError(f"train.resume_step={want}: {ckpt.directory} holds no good checkpoint "
                      f"at that step (good steps: {ckpt.all_steps() or 'none'}); pick one of "
                      "them, or 0 for the newest.")
  for step, aside in ckpt.set_aside_after(want, f"set aside when the run rolled back to step "
                                                f"{want} (train.resume_step)"):
    say(f"rolling back to step {want}: checkpoint {step} moved to {aside}")
  return want, branch


@dataclasses.dataclass
class Begin:
  """Where a run starts: its state, step (0 for a fresh one), branch and checkpoint meta."""
  state: Any
  step: int
  branch: dict | None
  meta: dict


def restore_or_init(ckpt: Checkpointer, t: TrainSettings, abstract: Any,
                    init: Callable[[], Any], data_it: Any,
                    say: Callable[[str], None]) -> Begin:
  """Restores the checkpoint `choose_start` picks into `abstract`'s shapes and shardings, and
  the data iterator `data_it` to where it was (moved on by train.skip_batches when a rollback
  branch starts here); or, with no checkpoint to resume, returns `init()`."""
  start, branch = choose_start(ckpt, t, say)
  if not start:
    with Stage("initialising the parameters"):
      return Begin(init(), 0, branch, {})
  with Stage(f"restoring checkpoint {start} from {ckpt.directory}"):
    state, data_state, meta = ckpt.restore(start, abstract)
  if int(state.step) != start:
    raise ValueError(f"checkpoint {start} in {ckpt.directory} holds step {int(state.step)}; "
                     "the directory is corrupt or was written by another tool.")
  if branch is not None and meta.get("branch") != branch:  # a new rollback starts here
    data_state = dict(data_state, step=int(data_state["step"]) + branch["skip"])
    if branch["skip"]:
      say(f"skipping {branch['skip']} batches after step {start} (train.skip_batches)")
  data_it.set_state(data_state)
  return Begin(state, start, branch or meta.get("branch"), meta)


def divergence_message(e: FloatingPointError, ckpt: Checkpointer, aside, rollback: dict,
                        lr: float) -> str:
  bad_step, key, value = e.args
  kept = ckpt.all_steps()
  msg = [f"Non-finite {key} ({value}) at step {bad_step}: stopped without saving that state."]
  if aside is not None:
    msg.append(f"Checkpoint {bad_step - 1}, the state that produced it, was moved to {aside}.")
  if not kept:
    msg.append(f"No checkpoint was kept in {ckpt.directory}; lower optim.learning_rate, "
               "lengthen optim.warmup_steps, keep optim.clip_grad_norm > 0, or use norm=pre.")
    return " ".join(msg)
  msg.append(f"Kept checkpoints: {', '.join(map(str, kept))} in {ckpt.directory}; a plain "
             f"restart resumes from {kept[-1]} and meets the same batches at the same "
             "learning rate.")
  back = rollback["step"] if rollback["step"] in kept else kept[-1]
  why = (f"the rollback checkpoint, saved before the finite evaluation at step "
         f"{rollback['at']}" if back == rollback["step"] else "the newest kept checkpoint")
  msg.append(f"To train on from {back} ({why}), re-run with --config.train.resume_step={back} "
             f"and a lower --config.optim.learning_rate (now {lr:g}; e.g. {lr / 2:g}) and/or "
             f"--config.train.skip_batches={bad_step - back} (skip the batches that led here, "
             "as PaLM did after loss spikes).")
  return "\n".join(msg)
