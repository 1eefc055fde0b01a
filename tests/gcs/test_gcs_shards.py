"""The sharded corpus with its text and its shards on a bucket (tests/gcs/conftest.py's GCS API
on 127.0.0.1): built through a local folder and copied up, index last, then read row by row
from gs:// exactly as a local build reads."""
import gzip
import os

from etils import epath
import numpy as np

from encoder_jax.data import examples, shard_build, shards


def test_shards_built_from_and_onto_a_bucket(gcs, tmp_path):
  root = epath.Path(gcs["root"]) / "shards_test"
  rng = np.random.default_rng(0)
  words = "the whale sea ship captain harpoon deck storm night morning".split()
  for i in range(30):
    text = " ".join(" ".join(rng.choice(words, 6)).capitalize() + "." for _ in range(5))
    (root / "text" / f"d{i:02d}.txt.gz").write_bytes(gzip.compress(text.encode()))
  cfg = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=32)
  source = f"files:{root}/text/*.txt.gz"
  (remote, _), = shards.prepare_shards(source, "minilm", cfg, f"{root}/data", workers=0,
                                       docs_per_shard=8)
  assert remote.startswith("gs://") and shards.read_index(remote) is not None
  assert not os.path.exists("gs:")  # (nothing went to a local folder named "gs:")
  (local, _), = shards.prepare_shards(source, "minilm", cfg, tmp_path, workers=0,
                                      docs_per_shard=8)
  a, b = shards.ShardedRows([(remote, 1.0)]), shards.ShardedRows([(local, 1.0)])
  assert len(a) == len(b) > 20
  for i in range(len(a)):
    for k, v in b[i].items():
      assert np.array_equal(a[i][k], v), (i, k)


def test_two_hosts_build_one_source_onto_a_bucket(gcs, tmp_path):
  """Host 0 and host 1 of 2 (independent jobs, one after the other here) each copy their shard
  files and then their share record up; the index appears only with the second share, and the
  files are those of a local one-host build, byte for byte."""
  root = epath.Path(gcs["root"]) / "hosts_test"
  rng = np.random.default_rng(1)
  words = "the whale sea ship captain harpoon deck storm night morning".split()
  for i in range(60):
    text = " ".join(" ".join(rng.choice(words, 6)).capitalize() + "." for _ in range(5))
    (root / "text" / f"d{i:02d}.txt").write_text(text)
  cfg = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=32)
  source = f"files:{root}/text/*.txt"
  kwargs = dict(workers=0, docs_per_shard=8, num_hosts=2)
  (remote, _), = shards.build_shares(source, "minilm", cfg, f"{root}/data", host_index=0,
                                     **kwargs)
  assert shards.read_index(remote) is None
  assert (epath.Path(remote) / shard_build.share_name(0, 2)).exists()
  shards.build_shares(source, "minilm", cfg, f"{root}/data", host_index=1, **kwargs)
  index = shards.read_index(remote)
  assert index is not None and [h["shards"] for h in index["build"]["per_host"]] == [5, 4]
  (local, _), = shards.build_shares(source, "minilm", cfg, tmp_path, workers=0,
                                    docs_per_shard=8)
  files = sorted(s["file"] for split in index["splits"].values() for s in split["shards"])
  assert len(files) == 9
  for f in files:
    assert (epath.Path(remote) / f).read_bytes() == (epath.Path(local) / f).read_bytes(), f
