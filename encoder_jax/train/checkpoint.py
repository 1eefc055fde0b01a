"""Orbax checkpoints of a pre-training run: train state + data iterator + run meta, together.

  ckpt = Checkpointer(workdir / "checkpoints", keep=3)
  ckpt.save(step, state, data_state=it.get_state(), meta={"wall_s": ...})   # async
  state, data_state, meta = ckpt.restore(ckpt.latest_step(), abstract_state)

Layout: <directory>/<step>/{state, data, meta}. `state` is the TrainState pytree (step, params,
optimizer state) written by Orbax's StandardSave; `data` is the loader's JSON iterator state
(the next batch index), `meta` a small JSON dict (wall time so far, cumulative FLOPs). The RNG
is not stored: every key derives from (config.seed, step), and the config is in the workdir.

A step directory appears only when its save has completed (Orbax writes to a temporary name
and renames), so a process killed mid-save leaves the previous checkpoint as the latest.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


class Checkpointer:
  """An async Orbax CheckpointManager keeping the newest `keep` checkpoints."""

  def __init__(self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True):
    if keep < 1:
      raise ValueError(f"train.keep={keep}: keep at least one checkpoint, or resume is "
                       "impossible.")
    self.directory = os.path.abspath(os.fspath(directory))
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save),
        item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, *, data_state: dict, meta: dict) -> None:
    """Starts saving `state` at `step` and returns once the arrays are safe to donate.

    The train step donates its input state, and on CPU Orbax's device-to-host transfer may
    alias the device buffers it is still writing; a device copy first keeps the bytes intact
    whatever the next step does with the originals.
    """
    if step in self.manager.all_steps():
      return  # e.g. preempted right after a restore: the checkpoint is already there
    state = jax.tree.map(jnp.copy, state)
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta)))

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
    """(state, data_state, meta) of `step`; `abstract_state` gives structure, dtypes, shardings."""
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return out["state"], out["data"], out["meta"]

  def wait(self) -> None:
    """Blocks until every started save has completed."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
