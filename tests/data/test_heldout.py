"""Held out means held out: every row of a validation shard is text of a validation document,
and validation documents are whole documents no training shard holds; a source too small for
the hash split still gets one (its documents of smallest id hash), and says so.

The split rule is recomputed here from its definition (sha256 of the document id, 1 in 50,
else the smallest hashes) and the documents are tokenized here, sentence by sentence, so the
rows are traced to documents without the build's own bookkeeping."""
import hashlib

import numpy as np
import pytest

from encoder_jax.data import examples, shard_build, shards, sources

EVERY = 50  # the hash split's 1 in 50


def _hash(doc_id: str) -> int:
  return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:4], "little")


def expected_validation(doc_ids: list[str]) -> set[str]:
  """The validation documents by the rule's definition: the hash's ~1 in 50 when that leaves
  both splits something (>= 1 held out, >= 2 to train), else the round(n/50) (at least 1)
  smallest hashes while >= 2 remain, else none."""
  by_hash = {d for d in doc_ids if _hash(d) % EVERY == 0}
  n = len(doc_ids)
  if by_hash and n - len(by_hash) >= 2:
    return by_hash
  if n < 3:
    return set()
  return set(sorted(doc_ids, key=lambda d: (_hash(d), d))[:max(1, round(n / EVERY))])


def _runs(ids: np.ndarray, specials: set[int]) -> list[bytes]:
  """The row's text pieces between [CLS] / [SEP], as int32 bytes."""
  out, cur = [], []
  for t in ids.tolist() + [next(iter(specials))]:
    if t in specials:
      if cur:
        out.append(np.asarray(cur, np.int32).tobytes())
      cur = []
    else:
      cur.append(t)
  return out


def _inside(piece: bytes, docs: list[bytes]) -> bool:
  """`piece` is a contiguous run of some document's ids (at an id boundary)."""
  for hay in docs:
    i = hay.find(piece)
    while i != -1:
      if i % 4 == 0:
        return True
      i = hay.find(piece, i + 1)
  return False


def _doc_bytes(sentences, tok) -> bytes:
  return np.asarray([i for s in sentences for i in tok.encode(s)], np.int32).tobytes()


def assert_rows_from(folder: str, split: str, docs: dict[str, bytes], tok) -> int:
  """Every row of `split` of the built folder is made of runs of the documents `docs`."""
  rows = shards.ShardedRows([(folder, 1.0)], split)
  specials = {tok.cls_id, tok.sep_id}
  hay = list(docs.values())
  for r in range(len(rows)):
    row = rows[r]
    for piece in _runs(row["input_ids"][row["mask"]], specials):
      assert _inside(piece, hay), f"{split} row {r} holds text of no {split} document"
  return len(rows)


def assert_split_documents(folder: str, want_validation: set[str], all_ids: set[str]) -> None:
  """The token cache's documents of each split: validation exactly `want_validation`, train
  the rest; no document in both (whole documents)."""
  val = [r["doc_id"] for r in shards.tokenized_documents(folder, "validation")]
  train = [r["doc_id"] for r in shards.tokenized_documents(folder, "train")]
  assert set(val) == want_validation and len(val) == len(set(val))
  assert set(train) == all_ids - want_validation and len(train) == len(set(train))


def test_demo_validation_rows_come_from_validation_documents(demo_shards, bert_tok):
  docs = [d for d in sources.demo_documents(split=None) if d.sentences]
  want = expected_validation([d.doc_id for d in docs])
  assert len(want) == 15
  assert_split_documents(demo_shards, want, {d.doc_id for d in docs})
  val_docs = {d.doc_id: _doc_bytes(d.sentences, bert_tok) for d in docs if d.doc_id in want}
  n = assert_rows_from(demo_shards, "validation", val_docs, bert_tok)
  assert n > 300


@pytest.fixture(scope="module")
def chapters(tmp_path_factory, moby_chapters):
  """A new user's text: Moby-Dick chapters, one file each, in folders of 6 and of 16."""
  texts = moby_chapters
  folders = {}
  for n in (6, 16):
    folders[n] = tmp_path_factory.mktemp(f"own_text_{n}")
    for i, text in enumerate(texts[:n], 1):
      (folders[n] / f"chapter_{i:02d}.txt").write_text(text)
  return folders


@pytest.fixture(scope="module")
def own_text(chapters):
  return chapters[6]


@pytest.mark.parametrize("n_files, blank_line_docs, n_docs, held_out", [
    (6, False, 6, ["chapter_05.txt"]),  # the hash holds out none of 6: the smallest hash
    (6, True, 126, 3),                   # nor of their 126 paragraphs: the 3 smallest hashes
    (16, True, 310, ["chapter_09.txt#3", "chapter_15.txt#12"]),  # the hash's own 2
], ids=["6_files", "6_files_paragraphs", "16_files_paragraphs"])
def test_own_text_holds_out_whole_documents(tmp_path, chapters, bert_tok, n_files,
                                            blank_line_docs, n_docs, held_out):
  """Every validation row is text of a held-out document, and no training shard holds a
  held-out document, whether the hash split held them out or (too few documents for it) the
  smallest hashes were, which the build then says in one line."""
  folder_in = chapters[n_files]
  texts = dict(sources.local_texts(f"{folder_in}/*.txt", blank_line_docs))
  want = expected_validation(list(texts))
  assert len(texts) == n_docs
  assert want == set(held_out) if isinstance(held_out, list) else len(want) == held_out
  cfg = examples.ExampleConfig(format="full_sentences", max_length=64)
  (folder, _), = shards.prepare_shards(f"files:{folder_in}/*.txt", "minilm", cfg, tmp_path,
                                       workers=0, docs_per_shard=64,
                                       blank_line_docs=blank_line_docs)
  index = shards.read_index(folder)
  by_hash = any(_hash(d) % EVERY == 0 for d in texts)
  note = index["validation_note"]
  if by_hash:
    assert note is None
  else:
    assert "\n" not in note and f"holds out the {len(want)} document(s) of smallest id" in note
    assert sorted(want)[0] in note and "blank_line_docs" in note
  assert_split_documents(folder, want, set(texts))
  val_docs = {d: _doc_bytes(sources.split_sentences(texts[d]), bert_tok) for d in want}
  assert assert_rows_from(folder, "validation", val_docs, bert_tok) > 0


def test_a_validation_shard_of_training_documents_is_caught(tmp_path, own_text, bert_tok,
                                                            monkeypatch):
  """The checks above fail on a build whose validation shard holds training documents."""
  original = shard_build.ShardPlan._shard

  def leaky(self, split, docs):  # the validation shard gets a training document too
    if split == "validation":
      docs = list(docs) + [("chapter_01.txt", (own_text / "chapter_01.txt").read_text())]
    return original(self, split, docs)

  monkeypatch.setattr(shard_build.ShardPlan, "_shard", leaky)
  texts = dict(sources.local_texts(f"{own_text}/*.txt"))
  cfg = examples.ExampleConfig(format="full_sentences", max_length=64)
  (folder, _), = shards.prepare_shards(f"files:{own_text}/*.txt", "minilm", cfg, tmp_path,
                                       workers=0, docs_per_shard=8)
  with pytest.raises(AssertionError):
    assert_split_documents(folder, {"chapter_05.txt"}, set(texts))
  val_docs = {"chapter_05.txt": _doc_bytes(sources.split_sentences(texts["chapter_05.txt"]),
                                           bert_tok)}
  with pytest.raises(AssertionError, match="holds text of no validation document"):
    assert_rows_from(folder, "validation", val_docs, bert_tok)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 120, 400])
def test_the_plan_holds_out_by_the_rule(n):
  """ShardPlan against the rule's definition, for sources from 1 to 400 documents; every
  document in exactly one shard, in stream order within each split."""
  ids = [f"doc{i}" for i in range(n)]
  plan = shard_build.ShardPlan(docs_per_shard=16, source="files:x")
  cut = list(plan.cut((d, "text") for d in ids))
  got = {s: [d for split, _, docs in cut if split == s for d, _ in docs]
         for s in shard_build.SPLITS}
  want = expected_validation(ids)
  assert set(got["validation"]) == want
  assert got["train"] == [d for d in ids if d not in want]
  assert got["validation"] == [d for d in ids if d in want]
  assert plan.documents == n and plan.shards == {
      s: sum(split == s for split, _, _ in cut) for s in shard_build.SPLITS}
  by_hash = {d for d in ids if _hash(d) % EVERY == 0}
  fallback = not (by_hash and n - len(by_hash) >= 2)
  assert (plan.note is not None) == (fallback and n >= 1)
  if n < 3:
    assert "cannot hold one out" in plan.note and "eval_steps=0" in plan.note


def test_one_document_cannot_be_held_out_and_training_says_what_to_do(tmp_path, own_text):
  source = f"files:{own_text}/chapter_01.txt"
  cfg = examples.ExampleConfig(format="full_sentences", max_length=64)
  (folder, _), = shards.prepare_shards(source, "minilm", cfg, tmp_path, workers=0)
  note = shards.read_index(folder)["validation_note"]
  assert "1 document(s) cannot hold one out" in note and "\n" not in note
  assert len(shards.ShardedRows([(folder, 1.0)], "train")) > 10
  with pytest.raises(ValueError) as e:
    shards.ShardedRows([(folder, 1.0)], "validation")
  msg = str(e.value)
  assert msg.startswith("no validation rows in [") and "\n" not in msg
  assert "blank_line_docs" in msg and "--config.train.eval_steps=0" in msg
