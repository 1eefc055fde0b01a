"""BERT WordPiece tokenization on HF `tokenizers` (Rust, batched, multi-threaded).

The pipeline is BERT's: BertNormalizer (clean text, CJK spacing, lowercase + strip accents when
uncased) -> BertPreTokenizer (whitespace + punctuation) -> WordPiece with `##` continuations.
With the BERT uncased vocab.txt this gives the same ids as `transformers.BertTokenizerFast`
(tested in tests/data/test_tokenizer.py).

  tok = WordPieceTokenizer.from_vocab(minilm_vocab())
  tok.encode("Hello there.")                      # [7592, 2045, 1012], no specials
  batch = tok.batch_encode_pairs(["a b"], ["c"], max_length=16)
  batch["input_ids"]  # int32 [B, T]: [CLS] A [SEP] B [SEP] [PAD]...
  batch["mask"]       # int32 [B, T]: 1 on real tokens, 0 on pads
  batch["token_types"]# int32 [B, T]: 0 on [CLS] A [SEP], 1 on B [SEP], 0 on pads
"""
import hashlib
import os
import pathlib
from collections.abc import Iterable, Sequence

from etils import epath
import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from encoder_jax import paths

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"


def _bert_pipeline(tok: tokenizers.Tokenizer, lowercase: bool) -> tokenizers.Tokenizer:
  # strip_accents=None follows `lowercase`, exactly as BERT's uncased/cased vocabularies expect.
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=None, lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
  return tok


_LOADED: dict[tuple[str, bool], "WordPieceTokenizer"] = {}  # WordPieceTokenizer.load's


class WordPieceTokenizer:
  """A WordPiece vocabulary with BERT's normalization, special ids and word-start table."""

  def __init__(self, tok: tokenizers.Tokenizer, source: str = "<memory>"):
    vocab = tok.get_vocab(with_added_tokens=True)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
      raise ValueError(
          f"vocabulary {source} lacks the special token(s) {missing}; a BERT vocab needs all of "
          f"{list(SPECIAL_TOKENS)}. Add them as lines of vocab.txt, or train one with "
          "`python -m encoder_jax.data.train_vocab` (which always adds them).")
    self.source = source
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        vocab[t] for t in SPECIAL_TOKENS)
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    # Special tokens are matched before normalization, as BertTokenizerFast does.
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    self._plain = tok
    # A second copy carries the pair template + truncation + padding, so `encode` stays
    # state-free (enable_truncation mutates the Rust object).
    self._pairs = tokenizers.Tokenizer.from_str(tok.to_str())
    self._pairs.post_processor = processors.TemplateProcessing(
        single="[CLS] $A:0 [SEP]:0", pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)])
    id_to_token = {i: t for t, i in vocab.items()}
    # Whole-word masking (BERT's create_pretraining_data): a token starts a word unless it is a
    # `##` continuation. A table lookup lets stored ids give word starts without re-tokenizing.
    self.is_word_start_V = np.array(
        [not id_to_token.get(i, "").startswith(CONTINUATION) for i in range(self.vocab_size)])

  @classmethod
  def load(cls, path, lowercase: bool = True) -> "WordPieceTokenizer":
    """`from_vocab`, built once per process and vocab: a run's trainer, its train and eval
    loaders share one tokenizer. Keyed by the file's contents, so an edited vocab.txt is
    rebuilt; the tokenizer holds no per-call state, so sharing it is safe."""
    text = epath.Path(path).read_text(encoding="utf-8") if epath.Path(path).is_file() else None
    if text is None:
      return cls.from_vocab(path, lowercase)  # (its error names the missing file)
    key = (hashlib.sha256(text.encode()).hexdigest(), lowercase)
    if key not in _LOADED:
      _LOADED[key] = cls.from_vocab(path, lowercase)
    return _LOADED[key]

  @classmethod
  def from_vocab(cls, path, lowercase: bool = True) -> "WordPieceTokenizer":
    """Loads a one-token-per-line vocab.txt (BERT format), local or on a bucket (gs://)."""
    path = epath.Path(path)
    if not path.is_file():
      raise FileNotFoundError(f"vocab file {path} does not exist (fetch the BERT uncased vocab "
                              "with encoder_jax.data.fetch.minilm_vocab(), or train one)")
    tokens = path.read_text(encoding="utf-8").split("\n")
    if tokens and tokens[-1] == "":
      tokens.pop()  # the newline that ends the last line
    duplicated = len(tokens) - len(set(tokens))
    if duplicated:
      raise ValueError(f"vocab file {path} has {duplicated} duplicated lines; ids would be "
                       "ambiguous")
    wordpiece = models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                 max_input_chars_per_word=100)
    tok = _bert_pipeline(tokenizers.Tokenizer(wordpiece), lowercase)
    return cls(tok, source=str(path))

  def encode(self, text: str) -> list[int]:
    """WordPiece ids of `text`, without [CLS]/[SEP]."""
    return self._plain.encode(text, add_special_tokens=False).ids

  def encode_batch_np(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids (int32 [N]) and each text's length (int32 [len(texts)]): cheap to store."""
    encs = self._plain.encode_batch(list(texts), add_special_tokens=False)
    lengths_S = np.fromiter((len(e.ids) for e in encs), np.int32, len(encs))
    ids_N = np.fromiter((i for e in encs for i in e.ids), np.int32, int(lengths_S.sum()))
    return ids_N, lengths_S

  def word_starts(self, ids) -> np.ndarray:
    """Boolean array, True where the token begins a word (not a `##` continuation)."""
    return self.is_word_start_V[np.asarray(ids, dtype=np.int64)]

  def decode(self, ids) -> str:
    return self._plain.decode(list(map(int, ids)), skip_special_tokens=False)

  def id_to_token(self, i: int) -> str:
    return self._plain.id_to_token(int(i))

  def batch_encode_pairs(self, texts_a: Sequence[str], texts_b: Sequence[str] | None = None,
                         max_length: int = 128) -> dict[str, np.ndarray]:
    """`[CLS] A [SEP] (B [SEP])` rows, truncated longest-first and padded to `max_length`.

    Returns int32 arrays of shape [B, max_length]: input_ids (pads = pad_id), mask (1 = real
    token), token_types (0 for [CLS] A [SEP], 1 for B [SEP], 0 on pads).
    """
    if texts_b is not None and len(texts_b) != len(texts_a):
      raise ValueError(f"texts_a has {len(texts_a)} entries but texts_b has {len(texts_b)}")
    n_special = 3 if texts_b is not None else 2
    if max_length <= n_special:
      raise ValueError(f"max_length={max_length} leaves no room for text after {n_special} "
                       "special tokens")
    inputs = list(texts_a) if texts_b is None else list(zip(texts_a, texts_b))
    return self._encode_padded(inputs, max_length)[1]

  def _encode_padded(self, inputs, max_length: int, **kwargs):
    """(encodings, {input_ids, mask, token_types} int32 [B, max_length]) of `inputs` with
    specials, truncated longest-first and padded."""
    self._pairs.enable_truncation(max_length, strategy="longest_first")
    self._pairs.enable_padding(pad_id=self.pad_id, pad_token="[PAD]", length=max_length)
    encs = self._pairs.encode_batch(inputs, **kwargs)
    return encs, {k: np.array([getattr(e, a) for e in encs], np.int32).reshape(-1, max_length)
                  for k, a in (("input_ids", "ids"), ("mask", "attention_mask"),
                               ("token_types", "type_ids"))}

  def batch_encode_words(self, words_batch: Sequence[Sequence[str]],
                         labels_batch: Sequence[Sequence[int]] | None = None,
                         max_length: int = 128, ignore_label: int = -100) -> dict[str, np.ndarray]:
    """Pre-split words (e.g. Brown POS) -> `[CLS] pieces [SEP]` rows for token tagging.

    Returns input_ids / mask / token_types as in `batch_encode_pairs`, plus int32 [B, T]
    `labels` (only with labels_batch): each word's label on its first WordPiece, ignore_label
    (-100) on later pieces, specials, pads and words cut off by truncation; and `first_piece`
    (bool [B, T]) marking the labelled positions.
    """
    encs, out = self._encode_padded([list(w) for w in words_batch], max_length,
                                    is_pretokenized=True)
    word_BxT = np.array([[-1 if w is None else w for w in e.word_ids] for e in encs],
                        np.int64).reshape(-1, max_length)
    prev_BxT = np.concatenate([np.full((len(encs), 1), -1), word_BxT[:, :-1]], axis=1)
    first_BxT = (word_BxT >= 0) & (word_BxT != prev_BxT)
    out["first_piece"] = first_BxT
    if labels_batch is not None:
      labels_BxT = np.full(word_BxT.shape, ignore_label, np.int32)
      for b, labels in enumerate(labels_batch):
        if len(labels) != len(words_batch[b]):
          raise ValueError(f"example {b}: {len(words_batch[b])} words but {len(labels)} labels")
        cols = np.flatnonzero(first_BxT[b])
        labels_BxT[b, cols] = np.asarray(labels, np.int32)[word_BxT[b, cols]]
      out["labels"] = labels_BxT
    return out


def train_vocab(files_or_iterator: Iterable[str] | Sequence[os.PathLike], vocab_size: int,
                out_path, lowercase: bool = True, min_frequency: int = 2,
                limit_alphabet: int = 1000) -> WordPieceTokenizer:
  """Trains a WordPiece vocab (BERT specials first: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4).

  `files_or_iterator`: paths of UTF-8 text files, or an iterable of text strings (e.g.
  documents). Writes `out_path` (vocab.txt, one token per line) and returns the tokenizer.
  """
  tok = _bert_pipeline(tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
  trainer = trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
      limit_alphabet=limit_alphabet, continuing_subword_prefix=CONTINUATION, show_progress=False)
  if isinstance(files_or_iterator, (str, os.PathLike)):  # one path, never one text
    files_or_iterator = [pathlib.Path(files_or_iterator)]
  items = files_or_iterator
  if isinstance(items, Sequence) and items and all(
      isinstance(p, os.PathLike) or (isinstance(p, str) and os.path.isfile(p)) for p in items):
    missing = [str(p) for p in items if not os.path.isfile(p)]
    if missing:
      raise FileNotFoundError(f"train_vocab: no such file(s): {missing}")
    tok.train([str(p) for p in items], trainer)
  else:
    tok.train_from_iterator(items, trainer)
  vocab = tok.get_vocab()
  if len(vocab) <= len(SPECIAL_TOKENS):
    raise ValueError("train_vocab: the input held no text; nothing to learn a vocabulary from")
  out_path = pathlib.Path(out_path)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  # Specials first (their ids are fixed), then the rest sorted by string. The trainer numbers
  # its alphabet in hash-map order, which changes from run to run: on the 3.6M-token demo
  # corpus two runs gave the same 8,192 tokens in different orders (sorting makes those files
  # identical, so the corpus cache keyed by the file's hash is reused); on a small text, ties
  # between equally frequent merges can even change the set. WordPiece's greedy longest match
  # does not use the order.
  rest = sorted(t for t in vocab if t not in SPECIAL_TOKENS)
  paths.write_atomic(out_path, "".join(t + "\n" for t in [*SPECIAL_TOKENS, *rest]).encode())
  return WordPieceTokenizer.from_vocab(out_path, lowercase=lowercase)
