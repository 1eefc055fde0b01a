"""WordPiece tokenizer: ids identical to transformers.BertTokenizerFast on the MiniLM vocab."""
import numpy as np
import pytest

from encoder_jax.data import fetch
from encoder_jax.data.tokenizer import WordPieceTokenizer, train_vocab
from word_labels import check_first_piece_labels

SENTENCES = [
    "Call me Ishmael.",
    "Some years ago—never mind how long precisely—having little or no money in my purse,",
    "The Congress shall assemble at least once in every year; Café naïve RÉSUMÉ!",
    "unbelievably  tokenizable\twords\nwith   odd   spacing, 1,234.56 dollars & 7% tax",
    "中文字符 and emoji 🙂 and a [MASK] token",
    "",
]
PAIRS_B = [
    "It is a way I have of driving off the spleen.",
    "",
    "Short.",
    "another " * 80,  # forces longest-first truncation of B
    "x",
    "only b",
]


@pytest.fixture(scope="module")
def tok():
  return WordPieceTokenizer.from_vocab(fetch.minilm_vocab())


@pytest.fixture(scope="module")
def hf():
  transformers = pytest.importorskip("transformers")
  return transformers.BertTokenizerFast.from_pretrained(str(fetch.minilm_dir()),
                                                         local_files_only=True)


def test_special_ids(tok):
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
  assert tok.vocab_size == 30522


@pytest.mark.parity
def test_encode_matches_hf(tok, hf):
  for s in SENTENCES:
    assert tok.encode(s) == hf(s, add_special_tokens=False)["input_ids"], s
  ids_N, lengths_S = tok.encode_batch_np(SENTENCES)
  assert ids_N.dtype == np.int32 and lengths_S.sum() == len(ids_N)
  assert np.split(ids_N, np.cumsum(lengths_S)[:-1])[0].tolist() == tok.encode(SENTENCES[0])


@pytest.mark.parity
@pytest.mark.parametrize("max_length", [16, 64])
def test_pairs_match_hf(tok, hf, max_length):
  ours = tok.batch_encode_pairs(SENTENCES, PAIRS_B, max_length=max_length)
  theirs = hf(SENTENCES, PAIRS_B, truncation="longest_first", padding="max_length",
              max_length=max_length, return_tensors="np")
  np.testing.assert_array_equal(ours["input_ids"], theirs["input_ids"])
  np.testing.assert_array_equal(ours["mask"], theirs["attention_mask"])
  np.testing.assert_array_equal(ours["token_types"], theirs["token_type_ids"])
  for k, v in ours.items():
    assert v.dtype == np.int32 and v.shape == (len(SENTENCES), max_length), k
  single = tok.batch_encode_pairs(SENTENCES, max_length=max_length)
  theirs = hf(SENTENCES, truncation=True, padding="max_length", max_length=max_length,
              return_tensors="np")
  np.testing.assert_array_equal(single["input_ids"], theirs["input_ids"])


def test_pair_layout(tok):
  b = tok.batch_encode_pairs(["call me ishmael"], ["so be it"], max_length=12)
  ids, types, mask = b["input_ids"][0], b["token_types"][0], b["mask"][0]
  n_a, n_b = len(tok.encode("call me ishmael")), len(tok.encode("so be it"))
  assert ids[0] == tok.cls_id and ids[1 + n_a] == tok.sep_id and ids[2 + n_a + n_b] == tok.sep_id
  assert types.tolist() == [0] * (2 + n_a) + [1] * (n_b + 1) + [0] * (12 - 3 - n_a - n_b)
  assert mask.sum() == 3 + n_a + n_b and (ids[mask == 0] == tok.pad_id).all()


def test_word_starts(tok):
  ids = tok.encode("Unbelievably tokenizable")
  tokens = [tok.id_to_token(i) for i in ids]
  assert tok.word_starts(ids).tolist() == [not t.startswith("##") for t in tokens]
  assert tok.word_starts(ids).tolist().count(True) == 2 and len(ids) > 2


def test_vocab_missing_special_token(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "a"]) + "\n")
  with pytest.raises(ValueError, match=r"lacks the special token\(s\) \['\[MASK\]'\]"):
    WordPieceTokenizer.from_vocab(vocab)


def test_train_vocab(tmp_path):
  text = [open(fetch.minilm_dir() / "config.json").read()] + SENTENCES * 20 + PAIRS_B * 20
  tok = train_vocab(text, vocab_size=300, out_path=tmp_path / "v" / "vocab.txt")
  lines = (tmp_path / "v" / "vocab.txt").read_text().splitlines()
  assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(lines) <= 300
  assert tok.mask_id == 4 and tok.unk_id not in tok.encode("call me ishmael")
  with pytest.raises(ValueError, match="held no text"):
    train_vocab(["", ""], vocab_size=100, out_path=tmp_path / "empty.txt")


def test_trained_vocab_file_is_in_canonical_order(tmp_path):
  """Specials first, then tokens sorted: the same token set always gives the same file (the
  trainer's own id order changes from run to run), so the corpus cache keyed by the file's hash
  is reused whenever the set is the same."""
  text = SENTENCES * 20 + PAIRS_B * 20
  train_vocab(text, vocab_size=200, out_path=tmp_path / "v.txt")
  lines = (tmp_path / "v.txt").read_text().splitlines()
  assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert lines[5:] == sorted(lines[5:]) and len(set(lines)) == len(lines)


def test_resolve_vocab_names(tmp_path):
  from encoder_jax.data.vocab import resolve_vocab
  with pytest.raises(ValueError, match="demo:8192"):
    resolve_vocab("demo:lots")
  with pytest.raises(FileNotFoundError, match="demo"):
    resolve_vocab(str(tmp_path / "nope.txt"))


def test_the_demo_vocab_is_the_committed_file_on_every_machine(tmp_path):
  """The demo recipe's vocab never comes from the (non-deterministic) trainer: `demo` and
  `demo:8192` resolve to the committed file whatever the cache, with its recorded sha256, and
  nothing is trained or written into the cache."""
  import hashlib
  from encoder_jax.data import vocab as vocab_lib
  for name in ("demo", "demo:8192"):
    path = vocab_lib.resolve_vocab(name, cache_dir=tmp_path)
    assert path == str(vocab_lib.DEMO_VOCAB_FILE)
  data = vocab_lib.DEMO_VOCAB_FILE.read_bytes()
  assert hashlib.sha256(data).hexdigest() == vocab_lib.DEMO_VOCAB_SHA256
  lines = data.decode().splitlines()
  assert len(lines) == len(set(lines)) == vocab_lib.DEMO_VOCAB_SIZE
  assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert lines[5:] == sorted(lines[5:])
  assert not (tmp_path / "vocab").exists()


@pytest.mark.parity
def test_tagging_first_subtoken_labels(tok, hf):
  words = [["Call", "me", "Ishmael", "."], ["Unbelievably", "tokenizable", "words"] * 10]
  labels = [[1, 2, 3, 4], [5, 6, 7] * 10]
  b = check_first_piece_labels(tok, hf, words, labels, max_length=16)
  assert b["labels"][0].tolist()[:8] == [-100, 1, 2, 3, -100, -100, 4, -100]  # is ##hma ##el
  with pytest.raises(ValueError, match="4 words but 3 labels"):
    tok.batch_encode_words(words[:1], [[1, 2, 3]])
