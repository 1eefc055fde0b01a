"""HF's recipe for word-level labels (token classification), the reference that both of our
tokenizers' batch_encode_words are held to (tests/data/test_tokenizer.py, test_bpe.py)."""
import numpy as np


def check_first_piece_labels(ours, hf_tokenizer, words, labels, max_length: int) -> dict:
  """Our batch_encode_words(words, labels) against HF's recipe: the same input_ids, and each
  word's label on its first piece, -100 on the other pieces, specials and padding (from HF's
  word_ids()). Returns our batch."""
  b = ours.batch_encode_words(words, labels, max_length=max_length)
  theirs = hf_tokenizer(words, is_split_into_words=True, truncation=True, padding="max_length",
                        max_length=max_length, return_tensors="np")
  np.testing.assert_array_equal(b["input_ids"], theirs["input_ids"])
  for i in range(len(words)):
    prev, want = None, []
    for w in theirs.word_ids(i):
      want.append(-100 if w is None or w == prev else labels[i][w])
      prev = w
    assert b["labels"][i].tolist() == want, i
  return b
