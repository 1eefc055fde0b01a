"""train/run_dir.py: the one reader of a run folder. Where a run is named, which checkpoint
counts (the trainer's rule too), what a folder that is not a run gets told, and the restore."""
import os
import shutil

import numpy as np
import pytest

from encoder_jax.train import checkpoint, run_dir
from encoder_jax.train.run_dir import RunDir

import run_helpers as R


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  base = tmp_path_factory.mktemp("run_dir")
  config = R.run_config(R.tiny_vocab(base))
  saved = R.saved_run(base / "run", config, steps=(3, 5))
  return base / "run", config, saved


def test_a_run_is_found_from_its_workdir_checkpoints_step_or_state_folder(run):
  workdir, _, _ = run
  for given, step in ((workdir, None), (workdir / "checkpoints", None),
                      (workdir / "checkpoints" / "3", 3),
                      (workdir / "checkpoints" / "3" / "state", 3)):
    found = RunDir.find(given)
    assert (found.workdir, found.step) == (workdir, step), given


def test_the_restore_is_the_saved_parameters_with_every_config_field(run):
  workdir, config, saved = run
  found = RunDir.find(workdir)
  assert found.good_step(report=print) == 5
  R.assert_same(found.params(5), saved[5])
  R.assert_same(found.model(3), saved[3])  # the model, with the step's parameters
  assert found.model_cfg.hidden_size == 16 and found.vocab == config.data.vocab


def test_a_folder_without_config_json_gets_one_line_naming_what_it_lacks(run, tmp_path):
  workdir, _, _ = run
  bare = tmp_path / "bare"
  shutil.copytree(workdir / "checkpoints", bare / "checkpoints")  # parameters, no config
  with pytest.raises(FileNotFoundError) as e:
    RunDir.find(bare / "checkpoints" / "5")
  msg = str(e.value)
  assert "\n" not in msg and f"{bare} lacks config.json, which" in msg, msg
  assert "checkpoints/ " not in msg.split("lacks")[1].split(",")[0]  # it has checkpoints/
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="lacks config.json and checkpoints/, which"):
    RunDir.find(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="does not exist"):
    RunDir.find(tmp_path / "nope")


def _flip(step_dir):
  leaf = max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
             key=lambda p: p.stat().st_size)
  raw = bytearray(leaf.read_bytes())
  raw[len(raw) // 2] ^= 1
  leaf.write_bytes(bytes(raw))


def _unseal(step_dir):
  (step_dir / checkpoint.CHECKSUMS).unlink()


@pytest.mark.parametrize("damage", [_flip, _unseal])
def test_reader_and_trainer_apply_one_rule_the_reader_moves_nothing(run, tmp_path, damage):
  """A damaged or unsealed newest checkpoint: the reader skips it naming the problem and leaves
  it in place; the trainer (Checkpointer.newest_good) picks the same step and sets it aside."""
  workdir = tmp_path / "run"
  shutil.copytree(run[0], workdir)
  damage(workdir / "checkpoints" / "5")
  said = []
  assert RunDir.find(workdir).good_step(report=said.append) == 3
  assert len(said) == 1 and said[0].startswith(f"skipping checkpoint 5 in {workdir}"), said
  assert (workdir / "checkpoints" / "5").is_dir()  # left for the run to set aside
  with pytest.raises(checkpoint.CheckpointError, match="checkpoint 5 .* is damaged: "):
    RunDir.find(workdir / "checkpoints" / "5").good_step()  # named: refused, not replaced
  with pytest.raises(ValueError, match=r"step 4 has no checkpoint .* available: \[3, 5\]"):
    RunDir.find(workdir).good_step(4)
  ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=5)
  assert ckpt.newest_good(report=lambda _: None) == 3
  ckpt.close()
  assert os.listdir(workdir / "checkpoints_set_aside") == ["5"]


def test_the_rule_is_newest_first_below_a_bound(tmp_path):
  seen = []
  for step in (1, 2, 3):
    (tmp_path / str(step)).mkdir()
    checkpoint.seal(tmp_path / str(step))
  (tmp_path / "3" / "extra").write_text("x")  # not in its checksums: still verifies
  (tmp_path / "2" / checkpoint.CHECKSUMS).write_text("{")
  on_damaged = lambda s, p: seen.append((s, p))
  assert run_dir.newest_good(tmp_path, [1, 2, 3], on_damaged=on_damaged) == 3
  assert run_dir.newest_good(tmp_path, [1, 2, 3], below=3, on_damaged=on_damaged) == 1
  assert [s for s, _ in seen] == [2] and "unreadable" in seen[0][1]
  assert run_dir.newest_good(tmp_path, [], on_damaged=on_damaged) is None
  np.testing.assert_equal(run_dir.step_folders(tmp_path), [1, 2, 3])
