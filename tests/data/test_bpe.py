"""Byte-level BPE (RoBERTa's tokenizer): ids identical to transformers.RobertaTokenizerFast built
from the same vocab.json + merges.txt, RoBERTa's pair layout, word starts from `Ġ`, a
deterministic trainer, the vocab specs, and sentences tokenized as the running text."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from encoder_jax.data import sources, tokenizer, vocab as vocab_lib
from word_labels import check_first_piece_labels

ODD = [
    "Café naïve RÉSUMÉ façade, jalapeño and Ærø",       # accents: cased, nothing stripped
    "emoji 🙂🐳 and a flag 🇺🇸 and ZWJ 👩‍👩‍👧",               # 4-byte characters, joiners
    "runs   of    spaces and\ttabs",                     # several spaces: standalone Ġ tokens
    "lines\nand\n\nparagraphs\r\n end  ",                # newlines (Ċ), trailing spaces
    " a leading space",
    "中文字符 and Ελληνικά",
    "Hello <mask> world, <s> and </s> as text",          # specials written in the text
    "",
]


@pytest.fixture(scope="module")
def texts():
  """Real sentences of the demo corpus (Moby-Dick, State of the Union), a few whole
  documents' opening paragraphs, and the odd cases above."""
  out = []
  for part in ("moby_dick", "sotu"):
    docs = sources.demo_documents(split=None, parts=(part,))
    sents = [s for d in docs for s in d.sentences]
    out += sents[::max(1, len(sents) // 150)][:150]
    out += [d.text[:2000] for d in docs[:5]]
  return out + ODD


@pytest.fixture(scope="module")
def hf(bpe_tok):
  transformers = pytest.importorskip("transformers")
  folder = os.path.dirname(bpe_tok.source)
  return (transformers.RobertaTokenizerFast.from_pretrained(folder, local_files_only=True),
          transformers.RobertaTokenizerFast.from_pretrained(folder, local_files_only=True,
                                                            add_prefix_space=True))


def test_special_ids_and_kind(bpe_tok):
  assert (bpe_tok.kind, bpe_tok.layout) == ("bpe", "roberta")
  assert [bpe_tok.id_to_token(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  assert (bpe_tok.cls_id, bpe_tok.pad_id, bpe_tok.sep_id, bpe_tok.unk_id,
          bpe_tok.mask_id) == (0, 1, 2, 3, 4)
  assert bpe_tok.special_ids == (0, 1, 2, 3, 4) and bpe_tok.vocab_size == 8192


@pytest.mark.parity
def test_ids_match_roberta_tokenizer_fast(bpe_tok, hf, texts):
  roberta, _ = hf
  assert len(texts) > 300
  for s in texts:
    ids = bpe_tok.encode(s)
    assert ids == roberta(s, add_special_tokens=False)["input_ids"], s
    assert bpe_tok.decode(ids) == s  # byte-level: lossless
  ids_N, lengths_S = bpe_tok.encode_batch_np(texts)
  assert ids_N.tolist() == [i for s in texts for i in bpe_tok.encode(s)]
  assert lengths_S.tolist() == [len(bpe_tok.encode(s)) for s in texts]
  assert bpe_tok.unk_id not in ids_N  # every byte has a symbol


@pytest.mark.parity
@pytest.mark.parametrize("max_length", [16, 128])
def test_singles_and_pairs_match_roberta_tokenizer_fast(bpe_tok, hf, texts, max_length):
  roberta, _ = hf
  a, b = texts[:-1], texts[1:]  # neighbours, odd cases and the empty text included
  ours = bpe_tok.batch_encode_pairs(a, b, max_length=max_length)
  theirs = roberta(a, b, truncation="longest_first", padding="max_length",
                   max_length=max_length, return_tensors="np")
  np.testing.assert_array_equal(ours["input_ids"], theirs["input_ids"])
  np.testing.assert_array_equal(ours["mask"], theirs["attention_mask"])
  assert not ours["token_types"].any()  # RoBERTa has no segment embedding
  single = bpe_tok.batch_encode_pairs(texts, max_length=max_length)
  theirs = roberta(texts, truncation=True, padding="max_length", max_length=max_length,
                   return_tensors="np")
  np.testing.assert_array_equal(single["input_ids"], theirs["input_ids"])
  np.testing.assert_array_equal(single["mask"], theirs["attention_mask"])


def test_pair_layout(bpe_tok):
  b = bpe_tok.batch_encode_pairs(["Call me Ishmael."], ["So be it."], max_length=24)
  ids, mask = b["input_ids"][0], b["mask"][0]
  a_ids, b_ids = bpe_tok.encode("Call me Ishmael."), bpe_tok.encode("So be it.")
  s, e = bpe_tok.cls_id, bpe_tok.sep_id
  want = [s, *a_ids, e, e, *b_ids, e]
  assert ids[:len(want)].tolist() == want and (ids[len(want):] == bpe_tok.pad_id).all()
  assert mask.sum() == len(want) and not b["token_types"].any()


@pytest.mark.parity
def test_pre_split_words_match_roberta_with_prefix_space(bpe_tok, hf):
  _, roberta = hf
  words = [["Call", "me", "Ishmael", "."], ["Unbelievably", "tokenizable", "Café"] * 10]
  labels = [[1, 2, 3, 4], [5, 6, 7] * 10]
  check_first_piece_labels(bpe_tok, roberta, words, labels, max_length=16)


def test_word_starts_are_the_tokens_after_a_space(bpe_tok):
  ids = bpe_tok.encode("Unbelievably tokenizable words, said Queequeg.")
  tokens = [bpe_tok.id_to_token(i) for i in ids]
  assert bpe_tok.word_starts(ids).tolist() == [t.startswith("Ġ") for t in tokens]
  assert bpe_tok.word_starts(ids).sum() == 4 and len(ids) > 6  # tokenizable, words, said, Q..


@pytest.mark.parametrize("vocab", ["minilm", "demo-bpe"])
def test_documents_are_tokenized_as_their_running_text(vocab):
  """Sentence by sentence, each document's ids are exactly those of its whole text (the
  sentences joined by spaces): a BPE sentence inside a document starts with `Ġ`. Every
  sentence's first token starts a word; elsewhere the starts are the tokenizer's table."""
  tok = tokenizer.load(vocab_lib.resolve_vocab(vocab))
  docs = sources.demo_documents(split=None, parts=("moby_dick",))[:40]
  n_sentence_firsts = 0
  for d, (doc_id, rec) in zip(docs, tokenizer.tokenize_documents(docs, tok)):
    assert doc_id == d.doc_id
    ids = tok.encode(d.text)
    assert rec["ids"].tolist() == ids and rec["sentence_lengths"].sum() == len(ids)
    firsts = np.cumsum(rec["sentence_lengths"]) - rec["sentence_lengths"]
    want = tok.word_starts(ids)
    want[firsts] = True
    np.testing.assert_array_equal(rec["word_starts"], want)
    n_sentence_firsts += len(firsts)
    if tok.kind == "bpe":  # only the document's first word lacks the space
      assert [tok.id_to_token(i)[0] == "Ġ" for i in rec["ids"][firsts]].count(False) == 1
  assert n_sentence_firsts > 1000


TRAIN = """
import sys
from encoder_jax.data import sources, tokenizer
docs = [d.text for d in sources.demo_documents(split=None, parts=("moby_dick",))[:20]]
tokenizer.train_bpe(docs, 600, sys.argv[1])
"""


def test_the_trainer_is_deterministic(tmp_path):
  """Trainings on the same text write the same files byte for byte (tokenizers' WordPiece
  trainer does not: vocab.py), ties between equally frequent pairs included (a small vocab
  on a small text has many): here and in two other processes with other hash seeds."""
  docs = [d.text for d in sources.demo_documents(split=None, parts=("moby_dick",))[:20]]
  tok = tokenizer.train_bpe(docs, 600, tmp_path / "a")
  assert tok.vocab_size == 600 and tok.kind == "bpe"
  for run, seed in (("b", "1"), ("c", "2")):
    subprocess.run([sys.executable, "-c", TRAIN, str(tmp_path / run)], check=True,
                   env=dict(os.environ, PYTHONHASHSEED=seed))
  digests = [[hashlib.sha256((tmp_path / run / f).read_bytes()).hexdigest()
              for f in ("vocab.json", "merges.txt")] for run in "abc"]
  assert digests[0] == digests[1] == digests[2]
  vocab = json.loads((tmp_path / "a" / "vocab.json").read_text())
  assert [t for t, _ in sorted(vocab.items(), key=lambda x: x[1])][:5] == list(
      tokenizer.BPE_SPECIAL_TOKENS)
  with pytest.raises(ValueError, match="no text"):
    tokenizer.train_bpe(["", ""], 300, tmp_path / "empty")


def test_vocab_specs_and_errors(tmp_path, bpe_tok):
  folder = os.path.dirname(bpe_tok.source)
  vocab_json = os.path.join(folder, "vocab.json")
  assert vocab_lib.resolve_vocab("demo-bpe") == vocab_json
  assert vocab_lib.resolve_vocab("demo-bpe:8192") == vocab_json
  assert vocab_lib.resolve_vocab(folder) == vocab_json  # a folder with vocab.json + merges.txt
  assert vocab_lib.resolve_vocab(vocab_json) == vocab_json
  assert tokenizer.load(folder) is bpe_tok  # one tokenizer per contents
  with pytest.raises(ValueError, match="demo-bpe:8192"):
    vocab_lib.resolve_vocab("demo-bpe:100")  # fewer than the 256 bytes + 5 specials
  lone = tmp_path / "lone"
  lone.mkdir()
  (lone / "vocab.json").write_text(open(vocab_json).read())
  with pytest.raises(FileNotFoundError, match="merges.txt"):
    vocab_lib.resolve_vocab(str(lone / "vocab.json"))
  # The ids depend on the merges too: the digest (hence the shards' key) changes with them.
  merges = open(os.path.join(folder, "merges.txt")).read().split("\n")
  (lone / "merges.txt").write_text("\n".join(merges[:1000]))  # the first 999 merges
  assert tokenizer.vocab_digest(lone / "vocab.json") != tokenizer.vocab_digest(vocab_json)
  assert tokenizer.load(lone).encode("Queequeg") != bpe_tok.encode("Queequeg")
  (lone / "merges.txt").write_text("#version: 0.2\nĠ t h\n")
  with pytest.raises(ValueError, match="line 2"):
    tokenizer.ByteLevelBPETokenizer.from_files(lone / "vocab.json")
  gpt2_like = tmp_path / "gpt2"
  gpt2_like.mkdir()
  (gpt2_like / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
  (gpt2_like / "merges.txt").write_text("#version: 0.2\na b\n")
  with pytest.raises(ValueError, match=r"lacks the special token\(s\).*train_vocab --kind=bpe"):
    tokenizer.load(gpt2_like)
