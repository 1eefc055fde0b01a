"""Verified checkpoints: every kind of damage is named by step and file, set aside, and the
newest good checkpoint is used; a failed save stops with the path and the cause.

A small pytree stands in for the train state (the files Orbax writes have the same layout:
state/ with _METADATA and OCDBT data files, data/metadata, meta/metadata). Faults are
injected by editing bytes and files directly: tests run as root, which file permissions do
not stop.
"""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.train import checkpoint

STATE = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 7, "b": jnp.ones(64)}


def _saved(root, steps=(1, 2)):
  ckpt = checkpoint.Checkpointer(root, keep=5)
  for s in steps:
    ckpt.save(s, {k: v * s for k, v in STATE.items()}, data_state={"step": s},
              meta={"wall_s": float(s)})
  ckpt.close()
  return root


def _biggest_state_file(step_dir):
  files = [p for p in step_dir.joinpath("state").rglob("*") if p.is_file()]
  return max(files, key=lambda p: p.stat().st_size)


def _flip_bit(step_dir):
  path = _biggest_state_file(step_dir)
  raw = bytearray(path.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  path.write_bytes(bytes(raw))
  return path


def _random_bytes(step_dir):
  path = _biggest_state_file(step_dir)
  raw = bytearray(path.read_bytes())
  raw[16:80] = np.random.default_rng(0).bytes(64)
  path.write_bytes(bytes(raw))
  return path


def _truncate(step_dir):
  path = _biggest_state_file(step_dir)
  path.write_bytes(path.read_bytes()[:-100])
  return path


def _delete_data_file(step_dir):
  path = _biggest_state_file(step_dir)
  path.unlink()
  return path


def _delete_metadata(step_dir):
  path = step_dir / "state" / "_METADATA"
  path.unlink()
  return path


def _empty_data_metadata(step_dir):
  path = step_dir / "data" / "metadata"
  path.write_text("")
  return path


def _unsealed(step_dir):
  path = step_dir / checkpoint.CHECKSUMS
  path.unlink()
  return path


def _garbled_checksums(step_dir):
  path = step_dir / checkpoint.CHECKSUMS
  path.write_text("{not json")
  return path


@pytest.mark.parametrize("damage", [_flip_bit, _random_bytes, _truncate, _delete_data_file,
                                    _delete_metadata, _empty_data_metadata, _unsealed,
                                    _garbled_checksums])
def test_damaged_newest_is_named_set_aside_and_the_previous_restored(tmp_path, damage):
  root = _saved(tmp_path / "checkpoints")
  assert checkpoint.verify(root / "2") is None  # intact before the damage
  path = damage(root / "2")
  said = []
  ckpt = checkpoint.Checkpointer(root, keep=5)
  assert ckpt.newest_good(report=said.append) == 1
  assert len(said) == 1 and said[0].startswith("checkpoint 2 is damaged: ")
  assert os.path.relpath(path, root / "2") in said[0]  # the file that is wrong
  aside = tmp_path / "checkpoints_set_aside" / "2"
  assert aside.is_dir() and not (root / "2").exists() and ckpt.all_steps() == [1]
  assert (aside / "why.txt").read_text().startswith("checkpoint 2: ")
  state, data, meta = ckpt.restore(1, jax_abstract())
  ckpt.close()
  np.testing.assert_array_equal(state["w"], STATE["w"])
  assert data == {"step": 1} and meta == {"wall_s": 1.0}


def jax_abstract():
  import jax  # pylint: disable=g-import-not-at-top
  return jax.eval_shape(lambda: STATE)


def test_every_damaged_checkpoint_is_set_aside_none_deleted(tmp_path):
  root = _saved(tmp_path / "checkpoints", steps=(1, 2, 3))
  _flip_bit(root / "3")
  _truncate(root / "2")
  _flip_bit(root / "1")
  ckpt = checkpoint.Checkpointer(root, keep=5)
  assert ckpt.newest_good(report=lambda _: None) is None
  ckpt.close()
  aside = tmp_path / "checkpoints_set_aside"
  assert sorted(os.listdir(aside)) == ["1", "2", "3"]
  for step in "123":  # moved whole, for a person to inspect or restore by hand
    assert (aside / step / checkpoint.CHECKSUMS).exists()
    assert (aside / step / "state" / "_METADATA").exists()


def test_rollback_checkpoint_survives_rotation(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "c", keep=2)
  for s in range(1, 6):
    if s == 3:
      ckpt.protect(1)
    ckpt.save(s, STATE, data_state={}, meta={})
  ckpt.close()
  assert checkpoint.Checkpointer(tmp_path / "c").all_steps() == [1, 4, 5]


def test_restore_into_a_different_state_names_the_step_not_damage(tmp_path):
  root = _saved(tmp_path / "checkpoints", steps=(1,))
  ckpt = checkpoint.Checkpointer(root)
  import jax  # pylint: disable=g-import-not-at-top
  other = jax.eval_shape(lambda: {"w": jnp.zeros((32, 32)), "b": jnp.zeros(64)})
  with pytest.raises(checkpoint.CheckpointError, match="checkpoint 1 .* config most likely"):
    ckpt.restore(1, other)
  ckpt.close()
  assert (root / "1").is_dir()  # intact files: nothing is set aside


def test_seal_records_every_file(tmp_path):
  root = _saved(tmp_path / "checkpoints", steps=(1,))
  sums = json.loads((root / "1" / checkpoint.CHECKSUMS).read_text())["files"]
  on_disk = {os.path.relpath(os.path.join(d, f), root / "1")
             for d, _, fs in os.walk(root / "1") for f in fs} - {checkpoint.CHECKSUMS}
  assert set(sums) == on_disk and "state/_METADATA" in sums and "data/metadata" in sums
