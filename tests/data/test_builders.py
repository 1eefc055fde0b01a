"""The demo corpus's counts (its row shards), the TFDS task splits, held-out Brown documents,
shards keyed by content."""
import collections
import os
import pathlib

import numpy as np

from encoder_jax.data import brown, examples, shards, sources, tasks, vocab as vocab_lib

# Pinned artifacts + BERT uncased vocab + sentencex 1.0.32 give exactly these numbers.
DEMO_TRAIN = {"documents": 749, "sentences": 112_715, "tokens": 3_353_819}
DEMO_VALIDATION = {"documents": 15, "sentences": 2_204, "tokens": 59_890}


def test_demo_corpus_counts(demo_shards, demo_corpus):
  splits = shards.read_index(demo_shards)["splits"]
  for split, want in (("train", DEMO_TRAIN), ("validation", DEMO_VALIDATION)):
    assert {k: splits[split][k] for k in want} == want, split
  assert (demo_corpus.num_docs, demo_corpus.num_sentences, demo_corpus.num_tokens) == tuple(
      DEMO_TRAIN.values())
  print(f"\ndemo corpus train {DEMO_TRAIN} validation {DEMO_VALIDATION}")
  parts = collections.Counter(d.split("/")[0] for d in demo_corpus.doc_ids)
  assert parts == {"sotu": 230, "moby_dick": 132, "brown": 387}


def test_demo_corpus_records(demo_shards, bert_tok):
  rec = shards.tokenized_documents(demo_shards, "validation")[0]
  assert rec["ids"].dtype == np.int32 and rec["word_starts"].dtype == bool
  assert rec["sentence_lengths"].sum() == len(rec["ids"]) and (rec["sentence_lengths"] > 0).all()
  np.testing.assert_array_equal(rec["word_starts"], bert_tok.word_starts(rec["ids"]))
  assert not {bert_tok.cls_id, bert_tok.sep_id, bert_tok.pad_id} & set(rec["ids"].tolist())


def test_pos_heldout_documents_not_in_pretraining(demo_corpus):
  heldout = brown.heldout_doc_ids()
  assert len(heldout) == 104
  used = {d.split("/", 1)[1] for d in demo_corpus.doc_ids if d.startswith("brown/")}
  val = {d.doc_id.split("/", 1)[1] for d in sources.demo_documents(split="validation")
         if d.doc_id.startswith("brown/")}
  assert used and not (used | val) & heldout


def test_rotten_tomatoes_split_by_movie():
  b = tasks.prepare_task("rotten_tomatoes")
  sizes, movies, labels = {}, {}, {}
  for split in ("train", "validation", "test"):
    src = b.as_data_source(split=split)
    recs = [src[i] for i in range(len(src))]
    sizes[split] = len(recs)
    movies[split] = {r["movie"] for r in recs}
    labels[split] = np.mean([r["label"] for r in recs])
  print(f"\nrotten_tomatoes sizes {sizes}, movies { {k: len(v) for k, v in movies.items()} }, "
        f"fresh fraction { {k: round(float(v), 3) for k, v in labels.items()} }")
  assert sum(sizes.values()) == 7403 + 5405  # every fresh and rotten snippet (plots left out)
  assert sizes == {"train": 10_217, "validation": 1_237, "test": 1_354}
  assert not movies["train"] & movies["validation"]
  assert not movies["train"] & movies["test"] and not movies["validation"] & movies["test"]
  assert [len(movies[s]) for s in ("train", "validation", "test")] == [406, 50, 52]


def test_brown_pos_splits_and_tags():
  b = tasks.prepare_task("brown_pos")
  sizes, docs = {}, {}
  for split in ("train", "validation", "test"):
    src = b.as_data_source(split=split)
    sizes[split] = len(src)
    docs[split] = {src[i]["doc_id"] for i in range(0, len(src), 7)}
  print(f"\nbrown_pos sentences {sizes}")
  assert sum(sizes.values()) == 57_340
  assert sizes == {"train": 44_955, "validation": 6_413, "test": 5_972}
  assert not docs["train"] & docs["validation"] and not docs["train"] & docs["test"]
  rec = b.as_data_source(split="train")[0]
  assert len(rec["words"]) == len(rec["tags"]) == len(rec["fine_tags"])
  assert set(np.asarray(rec["tags"]).tolist()) <= set(range(len(brown.UNIVERSAL_TAGS)))


def test_simplified_tagset():
  assert brown.base_tag("np-tl") == "np" and brown.base_tag("pps+bez") == "pps"
  assert brown.base_tag("bez*") == "bez" and brown.base_tag("*") == "*"
  assert brown.base_tag("nn-tl-hl") == "nn" and brown.base_tag("fw-in") == "fw"
  cases = {"nn$": "NOUN", "bedz*": "VERB", "jjt": "ADJ", "*": "ADV", "ppss+bem": "PRON",
           "at": "DET", "in-tl": "ADP", "cd": "NUM", "cs": "CONJ", "to": "PRT", "``": ".",
           "fw-nn": "X", "uh": "X", "ex": "DET", "od": "ADJ", "strange": "X"}
  assert {t: brown.universal_tag(t) for t in cases} == cases
  # Every base tag that occurs in Brown is mapped explicitly (nothing falls to X by accident).
  fine = {t for d in brown.load_documents() for s in d.sentences for _, t in s}
  unmapped = {brown.base_tag(t) for t in fine} - set(brown._UNIVERSAL) - {"fw"}
  assert not unmapped, unmapped


def test_corpus_cache_is_keyed_by_content(tmp_path, bert_tok):
  """Editing a source file (or the vocab) rebuilds the shards; an untouched one is reused."""
  texts = tmp_path / "texts"
  texts.mkdir()
  (texts / "a.txt").write_text("The whale rose beside the ship. Call me Ishmael.\n")
  (texts / "b.txt").write_text("The state of our union is strong.\n")
  source, data_dir = f"files:{texts}/*.txt", str(tmp_path / "tfds")
  cfg = examples.ExampleConfig(format="doc_sentences", max_length=32)

  def build(vocab="minilm"):
    (folder, _), = shards.prepare_shards(source, vocab, cfg, data_dir, workers=0,
                                         docs_per_shard=2)
    return folder

  def words(folder):
    rows = shards.ShardedRows([(folder, 1.0)])
    return " ".join(bert_tok.decode(rows[i]["input_ids"][rows[i]["mask"]].tolist())
                    for i in range(len(rows)))

  first = build()
  assert "whale" in words(first)
  os.utime(texts / "a.txt")  # touched, same bytes: same shards, nothing rebuilt
  assert build() == first
  (texts / "a.txt").write_text("The shark rose beside the boat. Call me Ishmael.\n")  # same size
  edited = build()
  assert edited != first
  assert "shark" in words(edited) and "whale" not in words(edited)

  vocab = tmp_path / "vocab.txt"
  vocab.write_text(pathlib.Path(vocab_lib.resolve_vocab("minilm")).read_text())
  named = build(str(vocab))
  with vocab.open("a") as f:
    f.write("brandnewtoken\n")
  assert build(str(vocab)) != named
