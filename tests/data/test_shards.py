"""The row shards (data/shards.py), the only pre-training corpus path: rows identical to the
in-memory plan of each shard, deterministic for any number of build workers, the token cache
reused across example configs, mixtures by weight with NSP inside a source, disjoint hosts,
every file kind, interrupted builds redone, bad specs explained."""
import dataclasses
import gzip
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from encoder_jax.data import (examples, pipeline, records, shard_build, shards, sources, tokenizer,
                              unigram, vocab as vocab_lib)

# Two synthetic sources whose words (hence WordPiece ids) are disjoint: a row's ids tell which
# source each of its segments came from.
WORDS_A = ("apple river stone cloud green house window garden bread music paper light "
           "mountain forest summer").split()
WORDS_B = ("seven eight nine table chair orange winter doctor money school market number "
           "letter silver engine").split()
NSP = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=32, seed=3)


def _doc(rng, words) -> str:
  sents = [" ".join(rng.choice(words, rng.integers(4, 10))).capitalize() + "."
           for _ in range(rng.integers(3, 9))]
  return " ".join(sents)


def _write_txt(folder, words, n_docs, seed):
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  for i in range(n_docs):
    (folder / f"d{i:03d}.txt").write_text(_doc(rng, words))


@pytest.fixture(scope="module")
def tok():
  return tokenizer.WordPieceTokenizer.load(vocab_lib.resolve_vocab("minilm"))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("text")
  _write_txt(root / "a", WORDS_A, 150, seed=0)
  _write_txt(root / "b", WORDS_B, 60, seed=1)
  return root


@pytest.fixture(scope="module")
def id_sets(tok, corpus_dir):
  ids_a = set(tok.encode(" ".join(WORDS_A))) - {tok.cls_id, tok.sep_id}
  ids_b = set(tok.encode(" ".join(WORDS_B))) - {tok.cls_id, tok.sep_id}
  assert not ids_a & ids_b  # (the test's premise)
  return ids_a, ids_b


def _read_bytes(folder, name) -> bytes:
  with open(os.path.join(folder, name), "rb") as f:
    return f.read()


def _source_of(row, ids_a, ids_b) -> set[str]:
  ids = set(row["input_ids"][row["mask"]].tolist())
  return {name for name, ids_s in (("a", ids_a), ("b", ids_b)) if ids & ids_s}


def test_rows_are_the_shard_plans_rows(tmp_path, corpus_dir, tok):
  """Shard k's records decode to exactly examples.Rows of shard k's documents planned with the
  shard's seed; shard rows, documents and tokens add up to the index totals and to len(rows)."""
  source = f"files:{corpus_dir}/a/*.txt"
  (folder, _), = shards.prepare_shards(source, "minilm", NSP, tmp_path, workers=0,
                                       docs_per_shard=16)
  index = shards.read_index(folder)
  train = index["splits"]["train"]
  rows = shards.ShardedRows([(folder, 1.0)], "train")
  assert len(rows) == train["rows"] == sum(s["rows"] for s in train["shards"])
  n_train = sum(sources.split_of(i) == "train" for i, _ in sources.local_texts(source[6:]))
  assert train["documents"] == n_train and len(train["shards"]) == n_train // 16
  assert index["splits"]["validation"]["documents"] == 150 - n_train
  # Shard 1 (the second) rebuilt in memory: its documents are train documents 16..31.
  docs = [sources.Document(i, sources.split_sentences(t))
          for i, t in sources.local_texts(source[6:]) if sources.split_of(i) == "train"][16:32]
  corpus = examples.Corpus.from_records(r for _, r in tokenizer.tokenize_documents(docs, tok))
  cfg = dataclasses.replace(NSP, seed=shard_build.shard_seed(NSP.seed, "train", 1))
  expected = examples.Rows(corpus, examples.make_plan(corpus, cfg), cfg, tok.cls_id, tok.sep_id,
                           tok.pad_id)
  first = train["shards"][0]["rows"]
  assert train["shards"][1]["rows"] == len(expected)
  for r in range(len(expected)):
    got, want = rows[first + r], expected[r]
    assert got.keys() == want.keys()
    for k in want:
      assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), (r, k)


@pytest.mark.parametrize("example", [NSP, examples.ExampleConfig(format="full_sentences",
                                                                   max_length=32, pack=True)])
def test_byte_level_bpe_rows_are_the_shard_plans_rows(tmp_path, corpus_dir, example):
  """With a byte-level BPE vocab the shards hold RoBERTa's rows (`<s> A </s></s> B </s>`, no
  token types): every shard's records decode to exactly examples.Rows of its documents planned
  in that layout."""
  bpe = tokenizer.load(vocab_lib.resolve_vocab("demo-bpe"))
  source = f"files:{corpus_dir}/a/*.txt"
  (folder, _), = shards.prepare_shards(source, "demo-bpe", example, tmp_path, workers=0,
                                       docs_per_shard=16)
  rows = shards.ShardedRows([(folder, 1.0)], "train")
  docs = [sources.Document(i, sources.split_sentences(t))
          for i, t in sources.local_texts(source[6:]) if sources.split_of(i) == "train"]
  at = 0
  for k, s in enumerate(shards.read_index(folder)["splits"]["train"]["shards"]):
    corpus = examples.Corpus.from_records(
        r for _, r in tokenizer.tokenize_documents(docs[16 * k:16 * (k + 1)], bpe))
    cfg = dataclasses.replace(example, seed=shard_build.shard_seed(example.seed, "train", k))
    want = examples.Rows(corpus, examples.make_plan(corpus, cfg, "roberta"), cfg, bpe.cls_id,
                         bpe.sep_id, bpe.pad_id, "roberta")
    assert s["rows"] == len(want) > 0
    for r in range(len(want)):
      got = rows[at + r]
      assert got.keys() == want[r].keys()
      for key in got:
        assert np.array_equal(got[key], want[r][key]), (k, r, key)
    at += len(want)
  assert at == len(rows)
  seps = [int((rows[r]["input_ids"] == bpe.sep_id).sum()) for r in range(len(rows))]
  assert not any(rows[r]["token_types"].any() for r in range(len(rows)))
  if example.nsp:  # <s> A </s></s> B </s>
    assert set(seps) == {3}


def test_record_round_trip_packed_and_wide_ids(tok):
  """Packed rows (several segment ids, restarting positions) and ids past uint16 survive
  encode/decode unchanged."""
  rng = np.random.default_rng(0)
  docs = [[list(rng.integers(1000, 2000, rng.integers(2, 20))) for _ in range(rng.integers(1, 6))]
          for _ in range(40)]
  corpus = examples.Corpus.from_sentences(docs, lambda ids: ids % 3 > 0)
  cfg = examples.ExampleConfig(format="doc_sentences", pack=True, max_length=64)
  rows = examples.Rows(corpus, examples.make_plan(corpus, cfg), cfg, 101, 102, 0)
  assert max(int(rows[r]["segment_ids"].max()) for r in range(len(rows))) > 2
  wide = dict(rows[0], input_ids=np.where(rows[0]["mask"], 70_000, 0).astype(np.int32))
  for row in [rows[r] for r in range(len(rows))] + [wide]:
    back = records.decode_row(records.encode_row(row), 64, 0, with_label=False)
    assert back.keys() == row.keys()
    for k in row:
      assert back[k].dtype == row[k].dtype and np.array_equal(back[k], row[k]), k


def test_two_worker_command_builds_what_this_process_builds(tmp_path, corpus_dir, monkeypatch):
  """`python -m encoder_jax.data.build --build_workers=2` (results arriving in any
  order) writes the same shards, byte for byte, as a build in this process; and a training
  process with the same settings finds that build instead of building again."""
  source = f"files:{corpus_dir}/a/*.txt"
  out = subprocess.run(
      [sys.executable, "-m", "encoder_jax.data.build", "--datasets=corpus",
       "--build_workers=2", "--shard_docs=16", f"--source={source}", f"--data_dir={tmp_path}/2",
       "--vocab=minilm", "--format=segment_pair", "--nsp", "--max_length=32", "--seed=3",
       "--show=1"], check=True, capture_output=True, text=True).stdout
  assert "built by 1 host(s) x 2 workers" in out and "label=" in out, out
  built = {}
  for workers in (0, 2):
    (folder, _), = shards.prepare_shards(source, "minilm", NSP, tmp_path / str(workers),
                                         workers=workers, docs_per_shard=16)
    index = shards.read_index(folder)
    assert index["build"]["workers"] == workers
    built[workers] = {s["file"]: (_read_bytes(folder, s["file"]), s["rows"])
                      for split in shards.SPLITS for s in index["splits"][split]["shards"]}
    monkeypatch.setattr(shard_build, "build_share", lambda *a, **k: pytest.fail("rebuilt"))
  assert built[0] == built[2] and len(built[0]) >= 5


def test_a_long_build_logs_its_progress_with_a_rate(tmp_path, corpus_dir, monkeypatch,
                                                    caplog):
  monkeypatch.setattr(shard_build, "PROGRESS_EVERY_S", 0.0)  # every shard counts as "long"
  caplog.set_level(logging.INFO, logger="absl")
  (folder, _), = shards.prepare_shards(f"files:{corpus_dir}/b/*.txt", "minilm", NSP, tmp_path,
                                       workers=0, docs_per_shard=16)
  n = sum(len(shards.read_index(folder)["splits"][s]["shards"]) for s in shards.SPLITS)
  lines = [r.getMessage() for r in caplog.records if "tokens so far" in r.getMessage()]
  assert len(lines) == n >= 3, lines
  assert re.fullmatch(r"building files:.*: 1 shards, [1-9]\d* tokens so far \(\d+ tokens/s\)",
                      lines[0]), lines[0]


def test_unigram_counts_of_rows(tmp_path, corpus_dir, tok, monkeypatch):
  """unigram.row_counts counts the real tokens of the rows; capped, it reads evenly spaced
  rows (not the first ones, which in a mixture are all one source's)."""
  from encoder_jax.data import unigram  # pylint: disable=g-import-not-at-top
  spec = f"mix:files:{corpus_dir}/a/*.txt@1+files:{corpus_dir}/b/*.txt@1"
  rows = shards.ShardedRows(shards.prepare_shards(spec, "minilm", NSP, tmp_path, workers=0,
                                                  docs_per_shard=16))
  full = unigram.row_counts(rows, tok.vocab_size, max_tokens=None)
  want = sum(np.bincount(rows[i]["input_ids"][rows[i]["mask"]], minlength=tok.vocab_size)
             for i in range(len(rows)))
  assert np.array_equal(full, want)
  part = unigram.row_counts(rows, tok.vocab_size, max_tokens=len(rows) * 32 // 4)
  ids_b = tok.encode(" ".join(WORDS_B))[1:-1]
  assert 0.8 < part.sum() / (full.sum() / 4) < 1.2  # ~a quarter of the rows read
  assert 0.15 < part[ids_b].sum() / full[ids_b].sum() < 0.35  # b gets its quarter too
  # The same built rows again (another run of the process, e.g. a grid's next point): counted
  # once, handed out as copies; another cap or vocab size counts anew.
  again = shards.ShardedRows(shards.prepare_shards(spec, "minilm", NSP, tmp_path, workers=0,
                                                   docs_per_shard=16))
  monkeypatch.setattr(shards.ShardedRows, "real_ids", lambda *a: pytest.fail("read again"))
  first = unigram.row_counts(again, tok.vocab_size, max_tokens=None)
  first[:] = 0
  assert np.array_equal(unigram.row_counts(again, tok.vocab_size, max_tokens=None), full)
  with pytest.raises(pytest.fail.Exception, match="read again"):
    unigram.row_counts(again, tok.vocab_size + 1, max_tokens=None)


def test_mixture_weights_and_nsp_within_a_source(tmp_path, corpus_dir, id_sets):
  """Rows come from the sources in the weights' proportion (per epoch exactly, in a shuffled
  stream's first batches approximately); every NSP row, random next segment included, has the
  ids of one source only."""
  spec = f"mix:files:{corpus_dir}/a/*.txt@0.4+files:{corpus_dir}/b/*.txt@0.6"
  parts = shards.prepare_shards(spec, "minilm", NSP, tmp_path, workers=0, docs_per_shard=16)
  assert [w for _, w in parts] == [0.4, 0.6]
  rows = shards.ShardedRows(parts, "train")
  n_a, n_b = rows.rows_S.tolist()
  assert n_a > 1.5 * n_b  # a has more rows, but b gets the larger weight: b is repeated
  assert rows.take_S[0] == n_a and abs(rows.take_S[1] / len(rows) - 0.6) < 1e-3
  by_source = {"a": 0, "b": 0}
  labels = {"a": 0, "b": 0}
  for i in range(len(rows)):
    row = rows[i]
    src = _source_of(row, *id_sets)
    assert len(src) == 1, f"row {i} mixes sources: {src}"
    (s,) = src
    assert s == "ab"[rows.locate(i)[0]]
    by_source[s] += 1
    labels[s] += int(row["nsp_label"])
  assert by_source == {"a": rows.take_S[0], "b": rows.take_S[1]}
  assert all(0.3 < labels[s] / by_source[s] < 0.7 for s in "ab")  # negatives exist in both
  loader = pipeline.Loader(rows, pipeline.LoaderConfig(global_batch_size=50, seed=1))
  it = iter(loader)
  seen_b = sum(sum(("b" in _source_of({k: v[j] for k, v in batch.items()}, *id_sets))
                   for j in range(50)) for batch in (next(it) for _ in range(6)))
  assert abs(seen_b / 300 - 0.6) < 0.1


def test_hosts_read_disjoint_rows_covering_an_epoch(tmp_path, corpus_dir):
  """Two hosts (process 0 and 1 of 2) get disjoint rows of the sharded corpus that together
  are every row of the epoch but the last, incomplete global batch, through
  pretrain_loader."""
  spec = f"mix:files:{corpus_dir}/a/*.txt@1+files:{corpus_dir}/b/*.txt@1"
  ids = []
  for host in (0, 1):
    loader = pipeline.pretrain_loader(spec, "minilm", example=NSP, global_batch_size=16,
                                      num_epochs=1, process_index=host, process_count=2,
                                      data_dir=tmp_path, example_ids=True,
                                      build_workers=0, shard_docs=16)
    ids.append(np.concatenate([b["example_id"] for b in loader]))
  n = len(loader.rows)
  assert not set(ids[0]) & set(ids[1])
  both = set(ids[0]) | set(ids[1])
  assert len(both) == len(ids[0]) + len(ids[1]) and n - 16 < len(both) <= n
  assert both <= set(range(n))


def test_jsonl_gz_and_blank_line_documents(tmp_path):
  """`.jsonl` (a named field), `.gz` and blank-line documents all reach the shards, with
  sentence splitting done by the build."""
  rng = np.random.default_rng(0)
  docs = [_doc(rng, WORDS_A) for _ in range(40)]
  (tmp_path / "c").mkdir()
  lines = "\n".join(json.dumps({"body": d, "n": i}) for i, d in enumerate(docs[:20]))
  (tmp_path / "c" / "x.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
  (tmp_path / "c" / "y.jsonl").write_text(lines)
  (tmp_path / "t").mkdir()
  (tmp_path / "t" / "z.txt.gz").write_bytes(gzip.compress("\n\n".join(docs[20:]).encode()))
  cfg = examples.ExampleConfig(format="doc_sentences", max_length=32)
  for spec, blank, n_docs in ((f"files:{tmp_path}/c/*:body", False, 40),
                              (f"files:{tmp_path}/t/z.txt.gz", True, 20),
                              (f"files:{tmp_path}/t/z.txt.gz", False, 1)):
    (folder, _), = shards.prepare_shards(spec, "minilm", cfg, tmp_path / "out", workers=0,
                                         docs_per_shard=8, blank_line_docs=blank)
    index = shards.read_index(folder)
    assert sum(s["documents"] for s in index["splits"].values()) == n_docs, spec
    assert index["splits"]["train"]["sentences"] > index["splits"]["train"]["documents"]


def test_interrupted_build_is_redone_and_a_finished_one_reused(tmp_path, corpus_dir,
                                                               monkeypatch):
  source = f"files:{corpus_dir}/b/*.txt"
  (folder, _), = shards.prepare_shards(source, "minilm", NSP, tmp_path, workers=0,
                                       docs_per_shard=16)
  want = _read_bytes(folder, "train-00000.array_record")
  # Killed before its share record and the index were written ...
  os.remove(os.path.join(folder, shards.INDEX))
  os.remove(os.path.join(folder, shard_build.share_name(0, 1)))
  with open(os.path.join(folder, "train-00000.array_record"), "wb") as f:
    f.write(want[:100])  # ... in the middle of a shard
  with pytest.raises(FileNotFoundError, match="not built"):
    shards.ShardedRows([(folder, 1.0)])
  shards.prepare_shards(source, "minilm", NSP, tmp_path, workers=0, docs_per_shard=16)
  assert _read_bytes(folder, "train-00000.array_record") == want
  monkeypatch.setattr(shard_build, "build_share", lambda *a, **k: pytest.fail("rebuilt"))
  assert shards.prepare_shards(source, "minilm", NSP, tmp_path, workers=0,
                               docs_per_shard=16) == ((folder, 1.0),)


@pytest.mark.parametrize("spec, match", [
    ("mix:files:a.txt@0.5+files:b.txt", r"'mix:<source>@<weight>\+"),
    ("mix:files:a.txt@x+files:b.txt@1", r"weight 'x' of 'files:a.txt' is not a positive"),
    ("mix:files:a.txt@-1+files:b.txt@1", r"weight '-1'.*<source>@<weight>"),
    ("mix:files:a.txt@1+files:a.txt@2", r"names \['files:a.txt'\] more than once"),
    ("mix:", r"expected 'mix:<source>@<weight>"),
])
def test_bad_mixture_specs_say_what_to_write(spec, match):
  with pytest.raises(ValueError, match=match):
    shards.parse_mixture(spec)


def test_mixture_parts():
  assert shards.parse_mixture("mix:demo:sotu+brown@2+files:gs://b/x/*.jsonl:text@1") == (
      shards.Part("demo:sotu+brown", 2.0), shards.Part("files:gs://b/x/*.jsonl:text", 1.0))
  assert shards.parse_mixture("demo") == (shards.Part("demo", 1.0),)


def test_another_example_config_replans_from_the_token_cache(tmp_path, corpus_dir, monkeypatch):
  """A second build of the same source for another format, length and seed reads every shard's
  tokens from the cache (no sentence splitting or tokenizing) and holds the same tokens; a
  damaged cache file is tokenized again."""
  source = f"files:{corpus_dir}/a/*.txt"
  (first, _), = shards.prepare_shards(source, "minilm", NSP, tmp_path, workers=0,
                                      docs_per_shard=16)
  other = examples.ExampleConfig(format="doc_sentences", max_length=48, seed=9)
  token_dir, = (tmp_path / "pretrain_tokens").iterdir()
  n_cached = len(list(token_dir.glob("*.npz")))
  monkeypatch.setattr(tokenizer, "tokenize_documents",
                      lambda *a, **k: pytest.fail("tokenized again"))
  (second, _), = shards.prepare_shards(source, "minilm", other, tmp_path, workers=0,
                                       docs_per_shard=16)
  monkeypatch.undo()
  assert second != first
  a, b = shards.read_index(first), shards.read_index(second)
  assert b["build"]["shards_from_token_cache"] == n_cached == sum(
      len(s["shards"]) for s in b["splits"].values())
  for split in shards.SPLITS:
    assert a["splits"][split]["tokens"] == b["splits"][split]["tokens"]
    assert a["splits"][split]["documents"] == b["splits"][split]["documents"]
  rows = shards.ShardedRows([(second, 1.0)])
  assert all(rows[i]["mask"].sum() <= 48 for i in range(len(rows)))
  # A damaged cache file: warned about and tokenized again, same tokens.
  (token_dir / "train-00000.npz").write_bytes(b"not a zip")
  third = examples.ExampleConfig(format="full_sentences", max_length=40)
  (folder, _), = shards.prepare_shards(source, "minilm", third, tmp_path, workers=0,
                                       docs_per_shard=16)
  c = shards.read_index(folder)
  assert c["build"]["shards_from_token_cache"] == n_cached - 1
  assert c["splits"]["train"]["tokens"] == a["splits"]["train"]["tokens"]


def test_a_training_config_selects_the_sharded_mixture(tmp_path, corpus_dir):
  """A mix: source gives the trainer a loader over ShardedRows (NSP labels included) and
  unigram counts of those rows."""
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from encoder_jax.train import setup  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("size=tiny,nsp=nsp")
  config.seed = 3
  config.data.update(dict(
      source=f"mix:files:{corpus_dir}/a/*.txt@0.5+files:{corpus_dir}/b/*.txt@0.5",
      data_dir=str(tmp_path), max_length=32, batch_size=8, build_workers=0,
      shard_docs=16))
  loader = setup.make_loader(setup.DataSettings.of(config), "train")
  assert isinstance(loader.rows, shards.ShardedRows) and len(loader.rows.names) == 2
  batch = next(iter(loader))
  assert batch["input_ids"].shape == (8, 32) and batch["nsp_label"].shape == (8,)
  # the trainer's unigram baseline counts the loader's rows (loop.unigram_baseline) ...
  counts = unigram.row_counts(loader.rows, loader.tokenizer.vocab_size)
  # ... as the loader decodes them (not the ids-only fast path the count uses)
  rows = loader.rows
  want = np.bincount(np.concatenate([rows[i]["input_ids"][rows[i]["mask"]]
                                     for i in range(len(rows))]),
                     minlength=loader.tokenizer.vocab_size)
  assert np.array_equal(counts, want)
