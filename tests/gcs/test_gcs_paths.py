"""encoder_jax.paths and the run files against a GCS API on 127.0.0.1 (tests/gcs/conftest.py):
globs, whole-object writes and appends, metrics + TensorBoard, a sealed Orbax checkpoint that
is verified, damaged and set aside, all on gs://; nothing lands in a local `gs:` folder."""
import json
import os
import pathlib

from etils import epath
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax import paths
from encoder_jax.data import sources
from encoder_jax.train import checkpoint, metrics_io


@pytest.fixture
def root(gcs, request):
  return epath.Path(gcs["root"]) / request.node.name


def test_glob_and_corpus_files_on_a_bucket(root):
  for name in ("b.txt", "a.txt", ".hidden.txt", "sub/c.txt", "notes.md"):
    (root / name).write_text(f"Text of {name}. A second sentence.")
  got = paths.glob(f"{root}/*.txt")
  assert got == [f"{root}/a.txt", f"{root}/b.txt"]  # sorted; dot files skipped, like glob
  assert paths.glob(f"{root}/*/*.txt") == [f"{root}/sub/c.txt"]
  assert paths.glob(f"{root}/a.txt") == [f"{root}/a.txt"] and paths.glob(f"{root}/x*") == []
  with pytest.raises(ValueError, match=r"'\*\*' is not supported.*name the folders"):
    paths.glob(f"{root}/**/*.txt")
  files, common = sources.resolve_files([f"{root}/*.txt", f"{root}/sub/*.txt"])
  assert common == str(root) and len(files) == 3
  docs = sources.local_documents([f"{root}/*.txt", f"{root}/sub/*.txt"])
  assert [d.doc_id for d in docs] == ["a.txt", "b.txt", "sub/c.txt"]  # ids relative to root
  with pytest.raises(FileNotFoundError, match="check the glob of the source"):
    sources.resolve_files([f"{root}/missing.txt"])


def test_atomic_writes_and_appends_on_a_bucket(root):
  paths.write_atomic(root / "s.json", '{"a": 1}')
  paths.write_atomic(root / "s.json", '{"a": 2}')
  assert json.loads((root / "s.json").read_text()) == {"a": 2}
  assert [p.name for p in root.iterdir()] == ["s.json"]  # no temporary left behind
  with paths.Appender(root / "log.txt") as f:
    f.write("one\n")
    f.flush()
    assert (root / "log.txt").read_text() == "one\n"  # visible at each flush
  with paths.Appender(root / "log.txt") as f:  # a second writer (a resumed run) appends
    f.write("two\n")
  assert (root / "log.txt").read_text() == "one\ntwo\n"
  assert paths.make_folder(root / "empty").exists()


def test_metrics_and_tensorboard_on_a_bucket(root):
  w = metrics_io.MetricWriter(root)
  for step in (4, 8, 12):
    w.write(step, "train", {"loss": 1.0 / step})
  w.close()
  assert [r["step"] for r in metrics_io.read_jsonl(root / "metrics.jsonl")] == [4, 8, 12]
  w = metrics_io.MetricWriter(root, resume_step=6)  # resumed at 6: rows 8 and 12 go
  w.write(8, "train", {"loss": 0.5})
  w.close()
  rows = metrics_io.read_jsonl(root / "metrics.jsonl")
  assert [(r["step"], r["loss"]) for r in rows] == [(4, 0.25), (8, 0.5)]
  events = sorted((root / "tensorboard").iterdir())
  assert len(events) == 2 and all(e.name.startswith("events.out.tfevents") for e in events)
  assert all(b"train/loss" in e.read_bytes() for e in events)


def test_checkpoint_sealed_verified_and_set_aside_on_a_bucket(root):
  state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.int32(3)}
  ckpt = checkpoint.Checkpointer(root / "checkpoints", keep=2, async_save=False)
  assert str(ckpt.directory) == f"{root}/checkpoints"  # not <cwd>/gs:/...
  for step in (1, 2):
    ckpt.save(step, state, data_state={"step": step}, meta={"wall_s": 1.0})
  ckpt.wait()
  assert ckpt.all_steps() == [1, 2]
  sums = json.loads((root / "checkpoints" / "2" / checkpoint.CHECKSUMS).read_text())["files"]
  assert any(rel.startswith("state/") for rel in sums)
  assert checkpoint.verify(ckpt.step_dir(2)) is None
  restored, data, meta = ckpt.restore(2, jax_abstract(state))
  np.testing.assert_array_equal(restored["w"], state["w"])
  assert data == {"step": 2} and meta == {"wall_s": 1.0}
  # Damage step 2 (an object rewritten with other bytes of the same size): set aside.
  victim = root / "checkpoints" / "2" / "data" / next(
      n for n in sorted(p.name for p in (root / "checkpoints" / "2" / "data").iterdir()))
  raw = victim.read_bytes()
  victim.write_bytes(bytes([raw[0] ^ 1]) + raw[1:])
  seen = []
  assert ckpt.newest_good(report=seen.append) == 1
  aside = root / "checkpoints_set_aside" / "2"
  assert "does not match its sha256" in (aside / "why.txt").read_text() and seen
  assert ckpt.all_steps() == [1] and not (root / "checkpoints" / "2").exists()
  ckpt.close()
  assert not pathlib.Path("gs:").exists() and not os.path.exists(os.path.join(os.getcwd(), "gs:"))


def jax_abstract(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
