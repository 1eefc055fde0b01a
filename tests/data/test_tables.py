"""parquet: and hf: sources (data/tables.py) on files the tests write: documents with stable
ids, shards and mixtures built from them, keys that follow the data, one-line errors, a
damaged file that builds nothing, and memory bounded by a batch of rows, not the file. The hub
is never asked for anything (HF_HUB_OFFLINE; local folders only)."""
import os
import pathlib
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from encoder_jax.data import examples, shards, sources, tables

CFG = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=48, seed=1)


@pytest.fixture(scope="module")
def paragraphs(moby_chapters) -> list[str]:
  """Real prose: the paragraphs of Moby-Dick's first 16 chapters (310)."""
  return [p.strip() for ch in moby_chapters for p in ch.split("\n\n") if p.strip()]


@pytest.fixture(autouse=True)
def offline_hf(monkeypatch, tmp_path):
  """Nothing reaches the hub, and `datasets` caches what it converts in this test's folder."""
  import datasets  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
  tables.open_hf.cache_clear()


def _parquet(path, texts, row_group_size=None, **extra):
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.table({"text": texts, **extra}), path, row_group_size=row_group_size)


def test_parquet_rows_are_documents_with_stable_ids(tmp_path, paragraphs):
  """One document per row, id '<file relative to the common folder>#<row>'; null and blank
  rows are skipped and counted; several row groups read in order."""
  _parquet(tmp_path / "a" / "part-0.parquet", paragraphs[:100], row_group_size=7)
  _parquet(tmp_path / "b" / "part-1.parquet", [paragraphs[100], None, "  ", paragraphs[101]],
           n=[1, 2, 3, 4])
  stats = sources.ReadStats()
  docs = list(tables.parquet_texts([f"{tmp_path}/*/*.parquet"], "text", stats))
  assert [d for d, _ in docs] == ([f"a/part-0.parquet#{i}" for i in range(100)]
                                  + ["b/part-1.parquet#0", "b/part-1.parquet#3"])
  assert [t for _, t in docs] == paragraphs[:102]
  assert (stats.files, stats.empty_documents) == (2, 2)
  # The same files elsewhere (e.g. copied to a bucket): the same ids, hence the same split.
  moved = tmp_path / "moved"
  for f in ("a/part-0.parquet", "b/part-1.parquet"):
    (moved / f).parent.mkdir(parents=True, exist_ok=True)
    (moved / f).write_bytes((tmp_path / f).read_bytes())
  assert [d for d, _ in tables.parquet_texts([f"{moved}/*/*.parquet"])] == [d for d, _ in docs]


def test_parquet_and_text_mixture_builds_and_reads(tmp_path, paragraphs):
  _parquet(tmp_path / "wiki" / "x.parquet", paragraphs[:200], row_group_size=50,
           title=[f"t{i}" for i in range(200)])
  (tmp_path / "books").mkdir()
  for i in range(8):
    (tmp_path / "books" / f"b{i}.txt").write_text("\n\n".join(paragraphs[200 + 10 * i:
                                                                         210 + 10 * i]))
  spec = f"mix:parquet:{tmp_path}/wiki/*.parquet:text@0.7+files:{tmp_path}/books/*.txt@0.3"
  parts = shards.prepare_shards(spec, "minilm", CFG, tmp_path / "out", workers=0,
                                docs_per_shard=32)
  rows = shards.ShardedRows(parts, "train")
  assert rows.names == (f"parquet:{tmp_path}/wiki/*.parquet:text", f"files:{tmp_path}/books/*.txt")
  assert np.allclose(rows.weights_S, [0.7, 0.3])
  index = shards.read_index(parts[0][0])
  assert index["content"].startswith("parquet_")
  got = sorted(r["doc_id"] for s in shards.SPLITS
               for r in shards.tokenized_documents(parts[0][0], s))
  assert got == sorted(f"x.parquet#{i}" for i in range(200))
  val = [r["doc_id"] for r in shards.tokenized_documents(parts[0][0], "validation")]
  assert val and all(sources.split_of(d) == "validation" for d in val)
  assert len(shards.ShardedRows(parts, "validation")) > 0
  assert all(rows[i]["mask"].sum() <= 48 for i in range(0, len(rows), 7))


def test_parquet_key_follows_the_contents(tmp_path, paragraphs):
  _parquet(tmp_path / "c" / "x.parquet", paragraphs[:20])
  key = lambda src: shards.source_key(src, data_dir=str(tmp_path / "out"))
  first = key(f"parquet:{tmp_path}/c/*.parquet")
  os.utime(tmp_path / "c" / "x.parquet")  # touched, same bytes: same key
  assert key(f"parquet:{tmp_path}/c/*.parquet") == first
  assert key(f"parquet:{tmp_path}/c/*.parquet:title") != first  # another column
  _parquet(tmp_path / "c" / "x.parquet", paragraphs[1:21])
  assert key(f"parquet:{tmp_path}/c/*.parquet") != first


@pytest.mark.parametrize("damage", ["footer", "row_group"])
def test_a_damaged_parquet_file_is_named_and_nothing_is_built(tmp_path, paragraphs, damage):
  _parquet(tmp_path / "p" / "a.parquet", paragraphs[:150], row_group_size=20)
  good = (tmp_path / "p" / "a.parquet").read_bytes()
  bad = bytearray(good)
  if damage == "footer":
    bad = bad[:-40]
  else:  # a run of bytes in the middle of the file: a row group's compressed pages
    bad[len(bad) // 2:len(bad) // 2 + 2000] = b"\x5a" * 2000
  (tmp_path / "p" / "b.parquet").write_bytes(bytes(bad))
  with pytest.raises(ValueError) as e:
    shards.prepare_shards(f"parquet:{tmp_path}/p/*.parquet", "minilm", CFG, tmp_path / "out",
                          workers=0, docs_per_shard=16)
  assert str(e.value).startswith(f"{tmp_path}/p/b.parquet is not a readable parquet file (")
  assert "\n" not in str(e.value)
  built = tmp_path / "out" / "pretrain_shards"
  assert not [p for p in built.iterdir() if p.is_dir()]  # nothing half-built left behind


def test_parquet_memory_is_a_batch_not_the_file(tmp_path, paragraphs, monkeypatch):
  """A 40-row-group file of 21 MiB of text (14 MiB compressed) is read through
  ParquetFile.iter_batches (never read_table or ParquetFile.read): Arrow's memory and Python's
  stay a small fraction of the file's text while every row is yielded (measured: 2.0 and 1.9
  MiB; 15 MiB of Arrow memory when pyarrow pre-buffers, its default)."""
  texts = [f"{i}: {paragraphs[i % len(paragraphs)]}" for i in range(40_000)]
  text_bytes = sum(len(t.encode()) for t in texts)
  _parquet(tmp_path / "big.parquet", texts, row_group_size=1000)
  del texts
  assert pq.ParquetFile(tmp_path / "big.parquet").metadata.num_row_groups == 40
  whole = lambda *a, **k: pytest.fail("read a whole file")
  monkeypatch.setattr(pq, "read_table", whole)
  monkeypatch.setattr(pq.ParquetFile, "read", whole)
  asked = []
  iter_batches = pq.ParquetFile.iter_batches
  monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                      lambda self, **k: asked.append(k) or iter_batches(self, **k))
  arrow_peak, n, before = 0, 0, pa.total_allocated_bytes()
  tracemalloc.start()
  try:
    for doc_id, _ in tables.parquet_texts([str(tmp_path / "big.parquet")]):
      n += 1
      if n % 97 == 0:
        arrow_peak = max(arrow_peak, pa.total_allocated_bytes() - before)
    python_peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert n == 40_000 and doc_id == "big.parquet#39999"
  assert asked == [{"batch_size": tables._BATCH_ROWS, "columns": ["text"], "use_threads": False}]
  print(f"\n{text_bytes / 2**20:.1f} MiB of text; peak while reading: Arrow "
        f"{arrow_peak / 2**20:.2f} MiB, Python {python_peak / 2**20:.2f} MiB")
  assert text_bytes > 20 * 2**20
  assert arrow_peak < text_bytes / 8 and python_peak < text_bytes / 8


# --------------------------------------------------------------------------------------- hf


def _saved(tmp_path, paragraphs, name="ds", n=120):
  import datasets  # pylint: disable=g-import-not-at-top
  ds = datasets.Dataset.from_dict({"text": paragraphs[:n] + [None],
                                   "n": list(range(n + 1))})
  ds.save_to_disk(str(tmp_path / name))
  return ds


def test_hf_saved_dataset_and_dataset_dict(tmp_path, paragraphs):
  import datasets  # pylint: disable=g-import-not-at-top
  _saved(tmp_path, paragraphs)
  stats = sources.ReadStats()
  docs = list(tables.hf_texts(tables.parse_hf_spec(f"{tmp_path}/ds:train"), stats))
  assert [d for d, _ in docs] == [f"ds/train/{i}" for i in range(120)]
  assert [t for _, t in docs] == paragraphs[:120] and stats.empty_documents == 1
  datasets.DatasetDict({
      "train": datasets.Dataset.from_dict({"body": paragraphs[:100]}),
      "test": datasets.Dataset.from_dict({"body": paragraphs[100:130]}),
  }).save_to_disk(str(tmp_path / "dd"))
  test = list(tables.hf_texts(tables.parse_hf_spec(f"{tmp_path}/dd:test:body")))
  assert [t for _, t in test] == paragraphs[100:130] and test[0][0] == "dd/test/0"
  with pytest.raises(ValueError, match=r"has no split 'validation'; its splits are \['train', "
                                       r"'test'\]"):
    tables.open_hf(tables.parse_hf_spec(f"{tmp_path}/dd:validation:body"))
  with pytest.raises(ValueError, match=r"has no column 'text'; its columns are \['body'\]"):
    tables.open_hf(tables.parse_hf_spec(f"{tmp_path}/dd:train"))


def test_hf_parquet_tree_offline_builds_in_a_mixture(tmp_path, paragraphs):
  """A folder of parquet files laid out as on the hub (data/<split>-*.parquet) goes through
  `datasets.load_dataset` with no network, and mixes with a saved dataset."""
  _parquet(tmp_path / "tree" / "data" / "train-00000-of-00002.parquet", paragraphs[:80])
  _parquet(tmp_path / "tree" / "data" / "train-00001-of-00002.parquet", paragraphs[80:160])
  _parquet(tmp_path / "tree" / "data" / "test-00000-of-00001.parquet", paragraphs[160:170])
  docs = list(tables.hf_texts(tables.parse_hf_spec(f"{tmp_path}/tree:train")))
  assert [t for _, t in docs] == paragraphs[:160] and docs[-1][0] == "tree/train/159"
  _saved(tmp_path, paragraphs[160:], n=120)
  spec = f"mix:hf:{tmp_path}/tree:train@0.5+hf:{tmp_path}/ds:train:text@0.5"
  parts = shards.prepare_shards(spec, "minilm", CFG, tmp_path / "out", workers=0,
                                docs_per_shard=32)
  rows = shards.ShardedRows(parts, "train")
  assert len(rows.names) == 2 and len(rows) > 100
  for folder, _ in parts:
    assert shards.read_index(folder)["content"].startswith("hf_")
  got = sorted(r["doc_id"] for s in shards.SPLITS
               for r in shards.tokenized_documents(parts[0][0], s))
  assert got == sorted(f"tree/train/{i}" for i in range(160))


def test_hf_key_is_the_data(tmp_path, paragraphs):
  key = lambda: shards.source_key(f"hf:{tmp_path}/ds:train", data_dir=str(tmp_path / "out"))
  _saved(tmp_path, paragraphs)
  first = key()
  tables.open_hf.cache_clear()
  assert key() == first  # opened again: the same data, the same key
  assert shards.source_key(f"hf:{tmp_path}/ds:train:n",
                             data_dir=str(tmp_path / "out")) != first  # another column...
  _saved(tmp_path, paragraphs[1:], name="ds")  # ... or other rows: another key
  tables.open_hf.cache_clear()
  assert key() != first


@pytest.mark.parametrize("rest, want", [
    ("./ds:train", ("./ds", None, "train", "text")),
    ("./ds:train:body", ("./ds", None, "train", "body")),
    ("wikimedia/wikipedia:20231101.en:train", ("wikimedia/wikipedia", "20231101.en", "train",
                                               "text")),
    ("wikimedia/wikipedia:20231101.en:train:text", ("wikimedia/wikipedia", "20231101.en",
                                                    "train", "text")),
    ("gs://bucket/ds:validation:body", ("gs://bucket/ds", None, "validation", "body")),
    ("org/name::train:content", ("org/name", None, "train", "content")),
])
def test_hf_spec(rest, want):
  s = tables.parse_hf_spec(rest)
  assert (s.path, s.config, s.split, s.column) == want


@pytest.mark.parametrize("rest, match", [
    ("./ds", "expected 'hf:<path or name>"),
    ("./ds:a:b:c:d", "expected 'hf:<path or name>"),
    ("./ds:train:test", r"cannot tell whether \['train', 'test'\]"),
    ("./ds:en:body", r"cannot tell whether \['en', 'body'\]"),
])
def test_bad_hf_specs_say_what_to_write(rest, match):
  with pytest.raises(ValueError, match=match):
    tables.parse_hf_spec(rest)
