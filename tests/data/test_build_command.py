"""`python -m encoder_jax.data.build` as a user meets it: one-line errors naming the input and
the fix, a user's own text trained on the first try (validation held out and said so, the
training flags printed and read back by the trainer's config), no progress-bar escape codes
in a log, and the build spread over independent host jobs: the same files, byte for byte, as
one host, and a host killed mid-build leaving nothing a rerun trusts."""
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from unittest import mock

import pytest

from encoder_jax.data import examples, shard_build, shards

ROOT = pathlib.Path(__file__).resolve().parents[2]
HINT = "(--verbose or ENCODER_JAX_VERBOSE=1 shows the traceback)"


def _env() -> dict:
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("ENCODER_JAX_VERBOSE", None)
  return env


def build(*args, wait=True):
  cmd = [sys.executable, "-m", "encoder_jax.data.build", *map(str, args)]
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)


def _write_parquet(path, **columns):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  pq.write_table(pa.table(columns), path)


def _bad_input(tmp_path, case) -> str:
  """Writes the case's input; returns its --source."""
  if case == "missing_glob":
    return f"files:{tmp_path}/nope/*.txt"
  if case == "empty_file":
    (tmp_path / "empty.txt").write_text(" \n\n ")
    return f"files:{tmp_path}/empty.txt"
  if case == "unknown_source":
    return "wiki:enwiki"
  if case == "wrong_column":
    _write_parquet(tmp_path / "x.parquet", body=["Call me Ishmael."] * 4, n=[1, 2, 3, 4])
    return f"parquet:{tmp_path}/x.parquet"
  if case == "not_text_column":
    _write_parquet(tmp_path / "x.parquet", body=["Call me Ishmael."] * 4, n=[1, 2, 3, 4])
    return f"parquet:{tmp_path}/x.parquet:n"
  if case == "corrupt_parquet":
    _write_parquet(tmp_path / "a.parquet", text=["Call me Ishmael. Some years ago."] * 40)
    (tmp_path / "b.parquet").write_bytes((tmp_path / "a.parquet").read_bytes()[:-40])
    return f"parquet:{tmp_path}/*.parquet"
  if case == "jsonl_field":
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "Call me Ishmael."}) + "\n")
    return f"files:{tmp_path}/a.jsonl:text"
  if case == "hf_missing":
    return f"hf:{tmp_path}/no_dataset:train"
  raise AssertionError(case)


@pytest.mark.parametrize("case, error", [
    ("missing_glob", "corpus source: no such file(s): ['{tmp}/nope/*.txt']; check the glob"),
    ("empty_file", "source 'files:{tmp}/empty.txt' holds no document: its 1 file(s) hold no "
                   "text (1 empty"),
    ("unknown_source", "unknown corpus source 'wiki:enwiki'; expected 'demo[:<parts>]'"),
    ("wrong_column", "{tmp}/x.parquet has no column 'text'; its columns are ['body', 'n']: name "
                     "the text column after the glob"),
    ("not_text_column", "{tmp}/x.parquet: column 'n' holds int64, not text; its text columns "
                        "are ['body']"),
    ("corrupt_parquet", "{tmp}/b.parquet is not a readable parquet file ("),
    ("jsonl_field", "{tmp}/a.jsonl, line 1: no field 'text' (it has ['body'])"),
    ("hf_missing", "hf dataset '{tmp}/no_dataset': no such folder"),
], ids=lambda x: x if " " not in x else "")
def test_bad_input_is_one_line_and_builds_nothing(tmp_path, case, error):
  source = _bad_input(tmp_path, case)
  got = build("--datasets=corpus", f"--source={source}", f"--data_dir={tmp_path}/out",
              "--build_workers=0")
  assert got.returncode == 1, got.stderr[-3000:]
  assert "Traceback" not in got.stdout + got.stderr
  lines = got.stderr.strip().splitlines()
  errors = [line for line in lines if line.startswith("error: ")]
  assert len(errors) == 1 and errors[0].startswith("error: " + error.format(tmp=tmp_path)), (
      got.stderr[-3000:])
  assert lines[-1] == HINT and lines[-2] == errors[0]
  built = tmp_path / "out" / "pretrain_shards"
  assert not built.exists() or not [p for p in built.iterdir() if p.is_dir()], (
      list(built.iterdir()))


def test_unknown_dataset_is_a_usage_error(tmp_path):
  got = build("--datasets=corpus,wiki", f"--data_dir={tmp_path}")
  assert got.returncode == 2
  assert "error: --datasets: unknown ['wiki']; known: corpus, rotten_tomatoes, brown_pos" in (
      got.stderr)
  assert not any(tmp_path.iterdir())


def trainer_config(flag_line: str, *extra: str):
  """The training config the trainer builds from `--config=configs/pretrain.py` and these
  flags (ml_collections' config flag, as encoder_jax.main parses it)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=values)
  argv = ["main", f"--config={ROOT}/configs/pretrain.py", *shlex.split(flag_line), *extra]
  with mock.patch.object(sys, "argv", argv):  # (config_flags finds the overrides there)
    values(argv)
  return values.config


def _flag_line(stdout: str) -> str:
  lines = stdout.splitlines()
  at = [i for i, line in enumerate(lines) if line.startswith("train on these shards with")]
  assert len(at) == 1, stdout
  return lines[at[0] + 1].strip()


@pytest.mark.parametrize("blank_line_docs", [False, True], ids=["file_docs", "paragraph_docs"])
def test_own_text_trains_on_the_first_try(tmp_path, moby_chapters, monkeypatch,
                                          blank_line_docs):
  """Six chapter files of real prose: the build holds out whole documents (and says how, in
  one line, when the hash split could not) and prints the flags with which the trainer's
  config reads exactly these shards, blank_line_docs included: no second build."""
  from encoder_jax.train import setup  # pylint: disable=g-import-not-at-top
  for i, text in enumerate(moby_chapters[:6], 1):
    (tmp_path / f"chapter_{i:02d}.txt").write_text(text)
  got = build("--datasets=corpus", f"--source=files:{tmp_path}/*.txt", "--vocab=minilm",
              f"--data_dir={tmp_path}/out", "--max_length=64", "--build_workers=0",
              *(["--blank_line_docs"] if blank_line_docs else []))
  assert got.returncode == 0, got.stderr[-3000:]
  notes = [line.strip() for line in got.stdout.splitlines() if line.strip().startswith("note:")]
  held = "chapter_05.txt" if not blank_line_docs else "3 document(s) of smallest id hash"
  assert len(notes) == 1 and held in notes[0] and "blank_line_docs" in notes[0], got.stdout
  assert "validation 1 shards" in got.stdout
  line = _flag_line(got.stdout)
  assert f"--config.data.blank_line_docs={blank_line_docs}" in line
  config = trainer_config(line, "--config.data.batch_size=8")
  monkeypatch.setattr(shard_build, "build_share", lambda *a, **k: pytest.fail("built again"))
  for split in ("train", "validation"):
    batch = next(iter(setup.make_loader(setup.DataSettings.of(config), split)))
    assert batch["input_ids"].shape == (8, 64)


def test_one_document_says_it_cannot_hold_one_out(tmp_path, moby_chapters):
  (tmp_path / "book.txt").write_text(moby_chapters[0])
  got = build("--datasets=corpus", f"--source=files:{tmp_path}/book.txt", "--max_length=64",
              f"--data_dir={tmp_path}/out", "--build_workers=0")
  assert got.returncode == 0, got.stderr[-3000:]
  notes = [line.strip() for line in got.stdout.splitlines() if line.strip().startswith("note:")]
  assert len(notes) == 1 and "1 document(s) cannot hold one out for validation" in notes[0]
  assert "--blank_line_docs" in notes[0] and "--config.train.eval_steps=0" in notes[0]
  assert "validation 0 shards, 0 rows" in got.stdout


def test_task_builds_write_no_progress_bar_escape_codes(tmp_path):
  got = build("--datasets=rotten_tomatoes", f"--data_dir={tmp_path}")
  assert got.returncode == 0, got.stderr[-3000:]
  assert "rotten_tomatoes at" in got.stdout
  both = got.stdout + got.stderr
  assert "\x1b" not in both and "\r" not in both, repr(both[:2000])


# ------------------------------------------------------------------------------------ hosts

CORPUS_ARGS = ("--datasets=corpus", "--blank_line_docs", "--shard_docs=16", "--build_workers=0",
               "--format=segment_pair", "--nsp", "--max_length=64", "--seed=5", "--show=0")
HOSTS_EXAMPLE = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=64, seed=5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, moby_chapters):
  """16 Moby-Dick chapters as files, one document per paragraph (310 documents: 21 shards of
  ~16), and their build by one host (the reference)."""
  root = tmp_path_factory.mktemp("hosts")
  for i, text in enumerate(moby_chapters, 1):
    (root / "text" / f"chapter_{i:02d}.txt").parent.mkdir(exist_ok=True)
    (root / "text" / f"chapter_{i:02d}.txt").write_text(text)
  source = f"files:{root}/text/*.txt"
  (folder, _), = shards.build_shares(source, "minilm", HOSTS_EXAMPLE, root / "one", workers=0,
                                     docs_per_shard=16, blank_line_docs=True)
  return source, folder


def _content(folder) -> tuple[dict, dict]:
  """(every shard file's bytes, the index without what differs between any two builds: its
  timings and the token cache's location)."""
  folder = pathlib.Path(folder)
  index = json.loads((folder / shards.INDEX).read_text())
  files = {s["file"] for split in index["splits"].values() for s in split["shards"]}
  assert files == {p.name for p in folder.glob("*.array_record")}
  return ({f: (folder / f).read_bytes() for f in sorted(files)},
          {k: v for k, v in index.items() if k not in ("build", "token_dir")})


def _folder(data_dir) -> pathlib.Path:
  folder, = [p for p in (pathlib.Path(data_dir) / "pretrain_shards").iterdir() if p.is_dir()]
  return folder


def test_two_host_jobs_build_what_one_host_builds(tmp_path, corpus):
  source, one = corpus
  jobs = [build(*CORPUS_ARGS, f"--source={source}", f"--data_dir={tmp_path}", "--num_hosts=2",
                f"--host_index={h}", wait=False) for h in (0, 1)]
  outs = [p.communicate(timeout=600) for p in jobs]
  for p, (out, err) in zip(jobs, outs):
    assert p.returncode == 0, err[-3000:]
  assert sum("row shards ready" in out for out, _ in outs) >= 1  # the last to finish indexed
  folder = _folder(tmp_path)
  assert folder.name == pathlib.Path(one).name
  files, index = _content(folder)
  want_files, want_index = _content(one)
  assert len(files) == 21 and files == want_files
  assert index == want_index and index["splits"]["validation"]["rows"] > 0
  per_host = json.loads((folder / shards.INDEX).read_text())["build"]["per_host"]
  assert [h["shards"] for h in per_host] == [11, 10]


def test_a_host_killed_mid_build_leaves_nothing_trusted(tmp_path, corpus):
  source, one = corpus
  args = (*CORPUS_ARGS, f"--source={source}", f"--data_dir={tmp_path}", "--num_hosts=2")
  job = build(*args, "--host_index=1", wait=False)
  deadline = time.time() + 300
  while not list(tmp_path.glob("pretrain_shards/*/*.array_record")):
    assert job.poll() is None, "host 1 finished before it could be killed: " + job.stderr.read()
    assert time.time() < deadline
    time.sleep(0.01)
  job.send_signal(signal.SIGKILL)
  job.communicate()
  folder = _folder(tmp_path)
  assert not (folder / shard_build.share_name(1, 2)).exists()  # (killed mid-build, not after)
  got = build(*args, "--host_index=0")  # host 0 completes its share, and waits for host 1's
  assert got.returncode == 0, got.stderr[-3000:]
  assert "host 0 of 2: built its share" in got.stdout and "get their index" in got.stdout
  assert not (folder / shards.INDEX).exists()
  with pytest.raises(FileNotFoundError, match="no index.json: not built"):
    shards.ShardedRows([(str(folder), 1.0)])
  got = build(*args, "--host_index=1")  # the rerun builds host 1's share again and indexes
  assert got.returncode == 0, got.stderr[-3000:]
  assert "row shards ready" in got.stdout
  assert _content(folder) == _content(one)
