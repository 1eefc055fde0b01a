"""Text sources and bad input: empty / non-UTF-8 files, one huge document, TFDS by name."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from encoder_jax.data import examples, fetch, shards, sources


def _moby_text(n_chapters=3):
  import json  # pylint: disable=g-import-not-at-top
  folder = fetch.extract_artifact("moby_dick") / "package" / "data"
  return [json.loads((folder / f"chapter_{i}.json").read_text())["text"]
          for i in range(1, n_chapters + 1)]


def test_split_sentences_leading_parenthesis():
  text = ("(3) An arrangement was signed at Madrid. The United States is a signatory. "
          "It will be submitted to the Senate.")
  assert sources.split_sentences(" ".join([text] * 40))[:3] == (
      "(3) An arrangement was signed at Madrid.", "The United States is a signatory.",
      "It will be submitted to the Senate.")
  assert sources.split_sentences("One.\n\n\n  \nTwo\nlines.") == ("One.", "Two lines.")


def test_local_files_bad_input(tmp_path):
  chapters = _moby_text()
  (tmp_path / "a.txt").write_text(chapters[0] + "\n\n" + chapters[1], encoding="utf-8")
  (tmp_path / "empty.txt").write_text("  \n\n ")
  (tmp_path / "latin1.txt").write_bytes("Café au lait, naïve façade. Second sentence.".encode(
      "latin-1"))
  stats = sources.ReadStats()
  docs = sources.local_documents(str(tmp_path / "*.txt"), stats=stats)
  assert [d.doc_id for d in docs] == ["a.txt", "latin1.txt"]
  assert (stats.files, stats.empty_files, stats.files_with_bad_bytes, stats.replaced_chars) == (
      3, 1, 1, 3)  # é, ï, ç: one undecodable latin-1 byte each
  assert "\ufffd" in docs[1].text and docs[1].sentences[-1] == "Second sentence."
  blocks = sources.local_documents(str(tmp_path / "a.txt"), blank_line_docs=True)
  assert len(blocks) >= 2 and blocks[0].sentences[0] == "Call me Ishmael."
  with pytest.raises(ValueError, match="hold no text"):
    sources.local_documents(str(tmp_path / "empty.txt"))
  with pytest.raises(FileNotFoundError, match="nope.txt"):
    sources.local_documents(str(tmp_path / "nope.txt"))


def test_local_corpus_with_one_huge_document(tmp_path, bert_tok):
  """Moby-Dick chapters as small documents plus one huge document without any punctuation."""
  chapters = _moby_text(12)
  for i, ch in enumerate(chapters):
    (tmp_path / f"ch{i:02d}.txt").write_text(ch)
  words = " ".join(chapters).replace(".", " ").replace("?", " ").replace("!", " ").split()
  (tmp_path / "huge.txt").write_text(" ".join(words * 3))  # one "sentence" of ~100k words
  (tmp_path / "empty.txt").write_text("")
  cfg = examples.ExampleConfig(format="full_sentences", max_length=128)
  (folder, _), = shards.prepare_shards(f"files:{tmp_path}/*.txt", "minilm", cfg,
                                       str(tmp_path / "tfds"), workers=0)
  index = shards.read_index(folder)
  stats = index["read_stats"]
  assert stats["empty_files"] == 1 and stats["files"] == 14
  corpus = examples.Corpus.from_records(shards.tokenized_documents(folder, "train"))
  assert corpus.num_tokens > 100_000 and corpus.sent_len_S.max() > 50_000
  assert corpus.num_tokens == index["splits"]["train"]["tokens"]
  # 13 documents, none held out by the hash split: the one of smallest hash is, and said so
  assert index["splits"]["validation"]["documents"] == 1 and index["validation_note"]
  assert len(shards.ShardedRows([(folder, 1.0)], "validation")) > 0
  rows = shards.ShardedRows([(folder, 1.0)])
  real = [int(rows[r]["mask"].sum()) for r in range(len(rows))]
  # Every token once, plus [CLS] ... [SEP] per row and a [SEP] where a row crosses documents.
  assert max(real) <= 128
  assert 0 <= sum(real) - 2 * len(rows) - corpus.num_tokens < corpus.num_docs


def test_tfds_text_dataset_by_name():
  """Any TFDS text dataset by name + field (mocked records carrying real text)."""
  chapters = _moby_text(4)
  records = [{"text": ch.encode(), "label": np.int64(0)} for ch in chapters]
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: records):
    docs = list(sources.tfds_documents("imdb_reviews", "text", "train"))
    assert len(docs) == 4 and docs[0].sentences[0] == "Call me Ishmael."
    with pytest.raises(ValueError, match=r"no field 'body'.*\['label', 'text'\]"):
      list(sources.tfds_documents("imdb_reviews", "body", "train"))
    docs = shards.raw_documents("tfds:imdb_reviews:text", shards.SourceOptions(),
                                sources.ReadStats())
    assert len(list(docs)) == 4


def test_rotten_tomatoes_pretraining_part_holds_only_train_movies():
  """Task-adaptive pre-training text must never include a dev or test snippet of the task."""
  from encoder_jax.data import rotten_tomatoes
  rows = rotten_tomatoes.rows()
  split = rotten_tomatoes.split_movies(sorted({r["movie"] for r in rows}))
  docs = sources.demo_documents(split=None, parts=("rotten_tomatoes",))
  movies = {d.doc_id.split("/", 1)[1] for d in docs}
  assert movies == {m for m, s in split.items() if s == "train"}
  train_texts = {r["text"] for r in rows if split[r["movie"]] == "train"}
  held_out = {r["text"] for r in rows if split[r["movie"]] != "train"}
  # The source repeats one snippet under a train and a test movie; nothing else is shared.
  assert not (held_out - train_texts) & {s for d in docs for s in d.sentences}
  assert sum(len(d.sentences) for d in docs) == sum(split[r["movie"]] == "train" for r in rows)


def test_jsonl_field_and_gzip(tmp_path):
  """.jsonl lines are documents (their text in the named field), .gz is read through gzip, and a
  jsonl without a field, a missing field or a field on text files each say what to write."""
  import gzip  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  lines = [{"text": "First doc. It has two sentences.", "id": 1}, {"text": "  "},
           {"text": "Third doc here."}]
  body = "\n".join(json.dumps(r) for r in lines) + "\n\n"
  (tmp_path / "a.jsonl").write_text(body)
  (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(body.encode()))
  (tmp_path / "c.txt.gz").write_bytes(gzip.compress(b"Zipped text. Para one.\n\nPara two."))
  assert sources.parse_files_spec(f"{tmp_path}/*.jsonl*:text") == ([f"{tmp_path}/*.jsonl*"],
                                                                   "text")
  assert sources.parse_files_spec("gs://b/x/*.txt,gs://b/y.txt") == (
      ["gs://b/x/*.txt", "gs://b/y.txt"], None)
  stats = sources.ReadStats()
  docs = sources.local_documents([f"{tmp_path}/*.jsonl*", f"{tmp_path}/*.txt.gz"], field="text",
                                 stats=stats)
  assert [d.doc_id for d in docs] == ["a.jsonl#0", "a.jsonl#2", "b.jsonl.gz#0", "b.jsonl.gz#2",
                                      "c.txt.gz"]
  assert docs[0].sentences == ("First doc.", "It has two sentences.")
  assert docs[3].sentences == ("Third doc here.",) and stats.empty_documents == 2
  assert docs[4].sentences == ("Zipped text.", "Para one.", "Para two.")
  blocks = sources.local_documents(f"{tmp_path}/c.txt.gz", blank_line_docs=True)
  assert [d.doc_id for d in blocks] == ["c.txt.gz#0", "c.txt.gz#1"]
  with pytest.raises(ValueError, match=r"no field names its text.*:text'"):
    sources.local_documents(f"{tmp_path}/a.jsonl")
  with pytest.raises(ValueError, match=r"line 1: no field 'body'.*\['id', 'text'\]"):
    sources.local_documents(f"{tmp_path}/a.jsonl", field="body")
  with pytest.raises(ValueError, match="only read from .jsonl"):
    sources.local_documents(f"{tmp_path}/c.txt.gz", field="text")
