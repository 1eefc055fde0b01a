"""Verified Orbax checkpoints of a pre-training run: train state + data iterator + run meta.

  ckpt = Checkpointer(workdir / "checkpoints", keep=3)
  ckpt.save(step, state, data_state=it.get_state(), meta={"wall_s": ...})   # async
  ckpt.poll()                                  # every step: raises CheckpointSaveError at once
  step = ckpt.newest_good(report=print)        # damaged ones are set aside, never deleted
  state, data_state, meta = ckpt.restore(step, abstract_state)

Layout: <directory>/<step>/{state, data, meta, checksums.json}. `state` is the TrainState
pytree (step, params, optimizer state) written by Orbax's StandardSave; `data` is the loader's
JSON iterator state (the next batch index), `meta` a small JSON dict (wall time, cumulative
FLOPs, the rollback step, the open metrics window). The RNG is not stored: every key derives
from (config.seed, step), and the config is in the workdir.

A checkpoint counts once it is sealed: Orbax writes into a temporary folder and renames it
into place when every file is complete (on a gs:// bucket, which has no rename, it writes in
place and marks the step complete with a commit_success.txt), and then a background thread
writes `checksums.json` (size and sha256 of every file; hashed by hand because Orbax and
TensorStore record no checksums of their own). Restore verifies them, so a flipped bit, random
bytes, a truncated,
missing or emptied file is reported by step and file instead of restoring silently wrong
numbers or failing deep inside Orbax; the damaged checkpoint is moved to
`<directory>_set_aside/<step>` with a `why.txt`, and the run falls back to the newest good one.
A folder without `checksums.json` (its save never completed, or an older encoder_jax wrote it)
does not count either. That rule and `verify` are train/run_dir.py's, which every reader of a
run folder (export, fine-tuning, init_from) applies too; this writer adds the set-aside.

A failed save (disk full, permissions, a dead file system) is noticed at the next `poll()`,
its partial temporary folder is removed and `CheckpointSaveError` names the path and the
cause; older checkpoints are untouched (Orbax deletes old steps only after a save succeeds).
Orbax's threads that waited on the failed save never finish, so a process that gets this error
should exit promptly (encoder_jax.cli does, with os._exit) rather than wait for them at exit.

Besides the newest `keep`, one *rollback* checkpoint chosen by the trainer (`protect(step)`)
survives rotation: the state to go back to after a divergence.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Callable, Sequence

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from encoder_jax import paths
# The reading half (verify, the rule for which checkpoint counts) is run_dir's, shared with
# every reader of a run folder; checkpoint.verify names the same function.
from encoder_jax.train.run_dir import (CHECKSUMS, CheckpointError, hash_all, newest_good,
                                       verify)  # noqa: F401

_TMP_MARK = ".orbax-checkpoint-tmp"  # Orbax's suffix for a step folder still being written


class CheckpointSaveError(OSError):
  """A save that failed; names the path and the cause."""


# ------------------------------------------------------------------------------ checksums


def _files(step_dir: epath.Path) -> list[str]:
  """Every file under `step_dir` (relative, sorted), the checksum file itself excluded."""
  return [rel for rel in paths.files_under(step_dir) if rel != CHECKSUMS]


def seal(step_dir: str | epath.PathLike) -> dict[str, dict]:
  """Writes `checksums.json` (size + sha256 of every file) into a completed step folder."""
  step_dir = epath.Path(step_dir)
  rels = _files(step_dir)
  sums = {rel: {"size": (step_dir / rel).stat().length, "sha256": digest}
          for rel, digest in zip(rels, hash_all(step_dir, rels))}
  # Whole or absent: a kill mid-write leaves the step unsealed.
  paths.write_atomic(step_dir / CHECKSUMS, json.dumps({"files": sums}, indent=1, sort_keys=True))
  return sums


# ------------------------------------------------------------------------------ the manager


@dataclasses.dataclass
class _NewestAndRollback:
  """Orbax preservation policy: the newest `keep` checkpoints, plus the rollback step."""
  keep: int
  rollback: int | None = None

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> Sequence[bool]:
    del context
    newest = set(sorted(c.step for c in checkpoints)[-self.keep:])
    return [c.step in newest or c.step == self.rollback for c in checkpoints]


def _cause(e: BaseException) -> str:
  first = (str(e).strip().splitlines() or [""])[0]
  return f"{type(e).__name__}: {first}" if first else type(e).__name__


class Checkpointer:
  """An async Orbax CheckpointManager whose checkpoints are sealed with checksums."""

  def __init__(self, directory: str | epath.PathLike, *, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"train.keep={keep}: keep at least one checkpoint, or resume is "
                       "impossible.")
    self.directory = paths.absolute(directory)  # a gs:// URI stays one
    self._policy = _NewestAndRollback(keep)
    self._primary = jax.process_index() == 0
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=async_save, preservation_policy=self._policy,
            cleanup_tmp_directories=True),  # a save killed mid-way leaves a tmp folder
        item_names=("state", "data", "meta"))
    self._in_flight: int | None = None
    self.sealed: list[int] = []  # steps this object saved and saw completed (sealed on process 0)
    self._sealer: threading.Thread | None = None
    self._seal_error: BaseException | None = None
    self._failed = False

  # --------------------------------------------------------------------------- what exists
  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def all_steps(self) -> list[int]:
    """Sealed steps, oldest first."""
    return [s for s in sorted(self.manager.all_steps()) if (self.step_dir(s) / CHECKSUMS).exists()]

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def protect(self, step: int | None) -> None:
    """Keeps checkpoint `step` through rotation (until another step is protected)."""
    self._policy.rollback = step

  # --------------------------------------------------------------------------------- saving
  def save(self, step: int, state: Any, *, data_state: dict, meta: dict) -> None:
    """Starts saving `state` at `step` and returns once the arrays are safe to donate.

    The train step donates its input state, and on CPU Orbax's device-to-host transfer may
    alias the device buffers it is still writing; a device copy first keeps the bytes intact
    whatever the next step does with the originals.
    """
    self.wait()  # the previous save is sealed (or its failure raised) before the next starts
    if step in self.manager.all_steps():
      return  # e.g. preempted right after a restore: the checkpoint is already there
    state = jax.tree.map(jnp.copy, state)
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_state),
          meta=ocp.args.JsonSave(meta)))
    except Exception as e:  # pylint: disable=broad-except
      self._fail(step, e)
    self._in_flight = step
    if self._primary:
      self._seal_error = None
      self._sealer = threading.Thread(target=self._seal_when_written, args=(step,),
                                      name=f"seal_checkpoint_{step}", daemon=True)
      self._sealer.start()

  def _seal_when_written(self, step: int) -> None:
    # A thread of its own, so a checkpoint is sealed even while the main thread is stuck (a
    # hung step is what a wall-clock kill usually interrupts).
    while self.manager.is_saving_in_progress():
      time.sleep(0.02)
    if not self.step_dir(step).exists():
      return  # the save failed; poll() reports Orbax's error
    try:
      seal(self.step_dir(step))
    except Exception as e:  # pylint: disable=broad-except
      self._seal_error = e

  def poll(self) -> None:
    """Raises CheckpointSaveError if the save in flight failed; returns at once otherwise."""
    if self._in_flight is None or self.manager.is_saving_in_progress():
      return
    if self._sealer is not None and self._sealer.is_alive():
      return
    self._finish()

  def wait(self) -> None:
    """Blocks until the save in flight is written and sealed; raises CheckpointSaveError."""
    if self._in_flight is not None:
      self._finish()

  def _finish(self) -> None:
    step = self._in_flight
    try:
      self.manager.wait_until_finished()  # re-raises the background save's error
    except Exception as e:  # pylint: disable=broad-except
      self._fail(step, e)
    if self._sealer is not None:
      self._sealer.join()
      self._sealer = None
    if self._seal_error is not None:
      self._fail(step, self._seal_error)
    self._in_flight = None
    self.sealed.append(step)

  def _fail(self, step: int, e: BaseException) -> None:
    self._failed = True
    self._in_flight = None
    removed = []
    if self._primary:
      for tmp in self.directory.glob(f"{step}{_TMP_MARK}*"):
        tmp.rmtree(missing_ok=True)
        removed.append(tmp.name)
    note = f"; removed the partial {', '.join(removed)}" if removed else ""
    raise CheckpointSaveError(f"could not save checkpoint step {step} in {self.directory}: "
                              f"{_cause(e)}{note}. Earlier checkpoints are kept.") from e

  def close(self) -> None:
    """Waits for the save in flight; after a failed save returns at once (see module doc)."""
    if self._failed:
      return
    try:
      self.wait()
    finally:
      if not self._failed:
        self.manager.close()

  # ------------------------------------------------------------------------------ restoring
  def set_aside(self, step: int, why: str) -> epath.Path:
    """Moves step folder `step` to <directory>_set_aside/<step>[.n] with a why.txt; returns it.

    Process 0 moves; every process reloads the list of steps."""
    target = self._move_aside(step, why) if self._primary else None
    self._sync_and_reload()
    return target

  def _move_aside(self, step: int, why: str) -> epath.Path:
    aside_root = paths.make_folder(self.directory.parent / f"{self.directory.name}_set_aside")
    target, n = aside_root / str(step), 1
    while target.exists():
      target, n = aside_root / f"{step}.{n}", n + 1
    self.step_dir(step).rename(target)
    (target / "why.txt").write_text(why + "\n")
    return target

  def set_aside_after(self, step: int, why: str) -> list[tuple[int, epath.Path]]:
    """Sets aside every checkpoint newer than `step` (process 0 moves, all reload)."""
    moved = []
    if self._primary:
      moved = [(s, self._move_aside(s, f"checkpoint {s}: {why}"))
               for s in sorted(self.manager.all_steps()) if s > step]
    self._sync_and_reload()
    return moved

  def _sync_and_reload(self) -> None:
    paths.sync("encoder_jax checkpoint folders moved")
    self.manager.reload()

  def read_meta(self, step: int) -> dict:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
        "meta"]

  def newest_good(self, *, below: int | None = None,
                  report: Callable[[str], None] = print) -> int | None:
    """The newest step whose files verify (optionally < `below`): run_dir.newest_good, the
    rule every reader applies, with this writer's part added: damaged ones are set aside.

    Process 0 verifies and moves folders; the others receive its answer.
    """
    choice = -1
    if self._primary:
      def set_aside(step: int, problem: str) -> None:
        aside = self._move_aside(step, f"checkpoint {step}: {problem}")
        report(f"checkpoint {step} is damaged: {problem}; moved to {aside}")

      found = newest_good(self.directory, self.manager.all_steps(), below=below,
                          on_damaged=set_aside)
      choice = -1 if found is None else found
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      choice = int(multihost_utils.broadcast_one_to_all(np.int32(choice)))
    self._sync_and_reload()
    return None if choice < 0 else choice

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
    """(state, data_state, meta) of `step`; `abstract_state` gives structure, dtypes, shardings.

    Raises CheckpointError naming the step when Orbax cannot restore it.
    """
    try:
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=ocp.args.JsonRestore(),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(
          f"checkpoint {step} in {self.directory} does not restore into this run's state "
          f"({_cause(e)}). Its files are intact, so the config most likely changed (model "
          "size, optimizer, objective): resume with the config in config.json, or start a "
          "new workdir. Moved between CPU and TPU/GPU? model.scan_layers=auto picks unrolled "
          "layers on CPU and scanned ones elsewhere: give the run's own "
          "(--config.model.scan_layers=True|False).") from e
    return out["state"], out["data"], out["meta"]
