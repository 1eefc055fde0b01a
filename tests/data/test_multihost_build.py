"""A trainer's own corpus build on 2 JAX processes (jax.distributed on 127.0.0.1): each
process builds its share of the shards (shards.prepare_shards), and together they write the
files one process writes, byte for byte."""
import json
import pathlib
import subprocess
import sys

import pytest

from encoder_jax.data import examples, shards
from multihost_helpers import child_env, free_port

HERE = pathlib.Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _files(folder) -> dict[str, bytes]:
  folder = pathlib.Path(folder)
  return {p.name: p.read_bytes() for p in sorted(folder.glob("*.array_record"))}


def test_two_processes_build_their_shares_of_what_one_builds(tmp_path, moby_chapters):
  for i, text in enumerate(moby_chapters[:10], 1):
    (tmp_path / "text").mkdir(exist_ok=True)
    (tmp_path / "text" / f"chapter_{i:02d}.txt").write_text(text)
  source = f"files:{tmp_path}/text/*.txt"
  port, out = free_port(), tmp_path / "result.json"
  procs = [subprocess.Popen([sys.executable, str(HERE / "shard_build_worker.py"), str(p), "2",
                             str(port), source, str(tmp_path / "two"), str(out)],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for p in (0, 1)]
  try:
    outs = [p.communicate(timeout=420)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, o in zip(procs, outs):
    assert p.returncode == 0, o[-4000:]
  got = [json.loads(pathlib.Path(f"{out}.{p}").read_text()) for p in (0, 1)]
  assert got[0]["folder"] == got[1]["folder"] and got[0]["rows"] == got[1]["rows"] > 0
  build = got[0]["build"]
  assert build["hosts"] == 2
  assert [(h["host"], h["pid"]) for h in build["per_host"]] == [(0, got[0]["pid"]),
                                                                (1, got[1]["pid"])]
  assert all(h["shards"] > 0 for h in build["per_host"])
  cfg = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=64, seed=5)
  (one, _), = shards.build_shares(source, "minilm", cfg, tmp_path / "one", workers=0,
                                  docs_per_shard=16, blank_line_docs=True)
  assert sum(h["shards"] for h in build["per_host"]) == len(_files(one)) >= 8
  assert _files(got[0]["folder"]) == _files(one)
