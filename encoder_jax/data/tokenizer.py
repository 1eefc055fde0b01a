"""Subword tokenizers on HF `tokenizers` (Rust, batched, multi-threaded): BERT's WordPiece and
RoBERTa's byte-level BPE behind one interface (`SubwordTokenizer`), so the shard build, the
trainer's special ids, fine-tuning and the tools never ask which kind they hold.

  WordPiece (a vocab.txt)      BERT's pipeline: BertNormalizer (clean text, CJK spacing,
      lowercase + strip accents when uncased) -> BertPreTokenizer (whitespace + punctuation) ->
      WordPiece with `##` continuations: the ids of `transformers.BertTokenizerFast`. Specials
      [PAD] [UNK] [CLS] [SEP] [MASK]; pairs `[CLS] A [SEP] B [SEP]`, token types 0 on
      [CLS] A [SEP] and 1 on B [SEP] (layout "bert"). A word starts at every token but a `##`.
  Byte-level BPE (vocab.json + merges.txt beside it)   RoBERTa's (GPT-2's) pipeline: no
      normalization (cased), the ByteLevel pre-tokenizer (GPT-2's split pattern, every byte a
      character, a space carried as the `Ġ` that begins the next token; no space added before a
      text, RoBERTa's add_prefix_space=False), BPE merges: the ids of
      `transformers.RobertaTokenizerFast` built from the same two files. Specials <s> </s>
      <pad> <mask> <unk>; pairs `<s> A </s></s> B </s>`, token types all 0 (layout "roberta":
      RoBERTa has no segment embedding). A word starts at a token beginning with `Ġ`; the first
      token of a text has no space before it, so the row builder marks sentence starts and the
      masking counts the token after a special as a start.

  tok = load("vocab.txt" | "roberta/vocab.json" | a folder holding either)  # cached per contents
  tok.encode("Hello there.")                      # ids, no specials
  batch = tok.batch_encode_pairs(["a b"], ["c"], max_length=16)
  batch["input_ids"]  # int32 [B, T]: the pair layout above, pad_id after
  batch["mask"]       # int32 [B, T]: 1 on real tokens, 0 on pads
  batch["token_types"]# int32 [B, T]
  train_vocab(texts, 8192, "vocab.txt")   /   train_bpe(texts, 8192, "bpe_folder/")
  tokenize_documents(docs, tok)   # documents -> (doc_id, {ids, word_starts, sentence_lengths})
                                  #   in large batches: what the shard build stores
Which file a vocab name means (minilm, demo, a path) is vocab.py's.
"""
import hashlib
import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from absl import logging
from etils import epath
import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from encoder_jax import paths

if TYPE_CHECKING:
  from encoder_jax.data import sources

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION = "##"
# Byte-level BPE: the specials in the order of the released RoBERTa files' first ids (<s>=0,
# <pad>=1, </s>=2, <unk>=3; there <mask> is the last id, 50,264; a trained vocab puts it at 4).
BPE_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
WORD_START = "Ġ"  # what the ByteLevel pre-tokenizer makes of the space before a word
BPE_MERGES = "merges.txt"


def _bert_pipeline(tok: tokenizers.Tokenizer, lowercase: bool) -> tokenizers.Tokenizer:
  # strip_accents=None follows `lowercase`, exactly as BERT's uncased/cased vocabularies expect.
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=None, lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
  return tok


def _byte_level_pipeline(tok: tokenizers.Tokenizer,
                         add_prefix_space: bool = False) -> tokenizers.Tokenizer:
  # RobertaTokenizerFast's: ByteLevel(add_prefix_space, trim_offsets=True, use_regex=True).
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
  tok.decoder = decoders.ByteLevel()
  return tok


class SubwordTokenizer:
  """A vocabulary with its pipeline, special ids, row layout and word-start table.

  Subclasses set `kind`, `layout` (examples.LAYOUTS), `SPECIALS` (the pad, unk, cls, sep and
  mask tokens, in that order), `_starts_word` and `_post_processor`."""
  kind = ""
  layout = ""
  SPECIALS: tuple[str, ...] = ()

  def __init__(self, tok: tokenizers.Tokenizer, source: str = "<memory>"):
    vocab = tok.get_vocab(with_added_tokens=True)
    missing = [t for t in self.SPECIALS if t not in vocab]
    if missing:
      raise ValueError(self._missing_specials(source, missing))
    self.source = source
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        vocab[t] for t in self.SPECIALS)
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    # Special tokens are matched in the raw text before normalization, as the transformers
    # tokenizers do.
    tok.add_special_tokens(list(self.SPECIALS))
    tok.post_processor = self._post_processor()
    self._plain = tok
    # Copies carry truncation + padding, so `encode` stays state-free (enable_truncation
    # mutates the Rust object): one for texts, one for pre-split words.
    self._pairs = tokenizers.Tokenizer.from_str(tok.to_str())
    self._words = self._words_pipeline(tokenizers.Tokenizer.from_str(tok.to_str()))
    id_to_token = {i: t for t, i in vocab.items()}
    # Whole-word masking: a table lookup lets stored ids give word starts without
    # re-tokenizing.
    self.is_word_start_V = np.array(
        [self._starts_word(id_to_token.get(i, "")) for i in range(self.vocab_size)])

  @property
  def special_ids(self) -> tuple[int, ...]:
    """The ids masking never picks and random replacement never draws, ascending."""
    return tuple(sorted({self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}))

  @classmethod
  def load(cls, path, lowercase: bool = True) -> "SubwordTokenizer":
    """The module's `load`: either kind, by the vocabulary's file (kept as the method that
    callers of WordPieceTokenizer.load know)."""
    return load(path, lowercase)

  def _missing_specials(self, source, missing) -> str:
    raise NotImplementedError

  def _starts_word(self, token: str) -> bool:
    raise NotImplementedError

  def _post_processor(self):
    raise NotImplementedError

  def _words_pipeline(self, tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    return tok

  def continuing(self, sentence: str) -> str:
    """How a sentence is tokenized when another of its document precedes it (the shard build
    tokenizes sentences one by one): as it stands in the running text."""
    return sentence

  def hf_tokenizer(self) -> tokenizers.Tokenizer:
    """A copy of the pipeline without padding or truncation (for offsets into the text)."""
    return tokenizers.Tokenizer.from_str(self._plain.to_str())

  def encode(self, text: str) -> list[int]:
    """The ids of `text`, without specials."""
    return self._plain.encode(text, add_special_tokens=False).ids

  def encode_batch_np(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids (int32 [N]) and each text's length (int32 [len(texts)]): cheap to store."""
    encs = self._plain.encode_batch(list(texts), add_special_tokens=False)
    lengths_S = np.fromiter((len(e.ids) for e in encs), np.int32, len(encs))
    ids_N = np.fromiter((i for e in encs for i in e.ids), np.int32, int(lengths_S.sum()))
    return ids_N, lengths_S

  def word_starts(self, ids) -> np.ndarray:
    """Boolean array, True where the token begins a word (see the module docstring)."""
    return self.is_word_start_V[np.asarray(ids, dtype=np.int64)]

  def decode(self, ids) -> str:
    return self._plain.decode(list(map(int, ids)), skip_special_tokens=False)

  def id_to_token(self, i: int) -> str:
    return self._plain.id_to_token(int(i))

  def batch_encode_pairs(self, texts_a: Sequence[str], texts_b: Sequence[str] | None = None,
                         max_length: int = 128) -> dict[str, np.ndarray]:
    """Single texts or pairs in the tokenizer's layout, truncated longest-first and padded to
    `max_length`.

    Returns int32 arrays of shape [B, max_length]: input_ids (pads = pad_id), mask (1 = real
    token), token_types (bert: 0 for [CLS] A [SEP], 1 for B [SEP]; roberta: 0; 0 on pads).
    """
    if texts_b is not None and len(texts_b) != len(texts_a):
      raise ValueError(f"texts_a has {len(texts_a)} entries but texts_b has {len(texts_b)}")
    n_special = self._pairs.num_special_tokens_to_add(texts_b is not None)
    if max_length <= n_special:
      raise ValueError(f"max_length={max_length} leaves no room for text after {n_special} "
                       "special tokens")
    inputs = list(texts_a) if texts_b is None else list(zip(texts_a, texts_b))
    return self._encode_padded(self._pairs, inputs, max_length)[1]

  def _encode_padded(self, tok: tokenizers.Tokenizer, inputs, max_length: int, **kwargs):
    """(encodings, {input_ids, mask, token_types} int32 [B, max_length]) of `inputs` with
    specials, truncated longest-first and padded."""
    tok.enable_truncation(max_length, strategy="longest_first")
    tok.enable_padding(pad_id=self.pad_id, pad_token=self.SPECIALS[0], length=max_length)
    encs = tok.encode_batch(inputs, **kwargs)
    return encs, {k: np.array([getattr(e, a) for e in encs], np.int32).reshape(-1, max_length)
                  for k, a in (("input_ids", "ids"), ("mask", "attention_mask"),
                               ("token_types", "type_ids"))}

  def batch_encode_words(self, words_batch: Sequence[Sequence[str]],
                         labels_batch: Sequence[Sequence[int]] | None = None,
                         max_length: int = 128, ignore_label: int = -100) -> dict[str, np.ndarray]:
    """Pre-split words (e.g. Brown POS) -> `[CLS] pieces [SEP]` rows for token tagging.

    Returns input_ids / mask / token_types as in `batch_encode_pairs`, plus int32 [B, T]
    `labels` (only with labels_batch): each word's label on its first piece, ignore_label
    (-100) on later pieces, specials, pads and words cut off by truncation; and `first_piece`
    (bool [B, T]) marking the labelled positions.
    """
    encs, out = self._encode_padded(self._words, [list(w) for w in words_batch], max_length,
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


class WordPieceTokenizer(SubwordTokenizer):
  """A WordPiece vocab.txt with BERT's normalization (see the module docstring)."""
  kind = "wordpiece"
  layout = "bert"
  SPECIALS = SPECIAL_TOKENS

  def _missing_specials(self, source, missing) -> str:
    return (f"vocabulary {source} lacks the special token(s) {missing}; a BERT vocab needs all "
            f"of {list(SPECIAL_TOKENS)}. Add them as lines of vocab.txt, or train one with "
            "`python -m encoder_jax.data.train_vocab` (which always adds them).")

  def _starts_word(self, token: str) -> bool:
    # BERT's create_pretraining_data: a token starts a word unless it is a `##` continuation.
    return not token.startswith(CONTINUATION)

  def _post_processor(self):
    return processors.TemplateProcessing(
        single="[CLS] $A:0 [SEP]:0", pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", self.cls_id), ("[SEP]", self.sep_id)])

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


class ByteLevelBPETokenizer(SubwordTokenizer):
  """RoBERTa's byte-level BPE from vocab.json + merges.txt (see the module docstring)."""
  kind = "bpe"
  layout = "roberta"
  SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")

  def _missing_specials(self, source, missing) -> str:
    return (f"vocabulary {source} lacks the special token(s) {missing}; a RoBERTa vocab.json "
            f"needs all of {list(BPE_SPECIAL_TOKENS)}. Add them as entries, or train one with "
            "`python -m encoder_jax.data.train_vocab --kind=bpe` (which always adds them).")

  def _starts_word(self, token: str) -> bool:
    return token.startswith(WORD_START)

  def _post_processor(self):
    return processors.RobertaProcessing(("</s>", self.sep_id), ("<s>", self.cls_id),
                                        trim_offsets=True, add_prefix_space=False)

  def _words_pipeline(self, tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    # Pre-split words each get the space a word has in running text: what
    # RobertaTokenizerFast(add_prefix_space=True) does, and requires, for is_split_into_words.
    tok = _byte_level_pipeline(tok, add_prefix_space=True)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", self.sep_id), ("<s>", self.cls_id), trim_offsets=True, add_prefix_space=True)
    return tok

  def continuing(self, sentence: str) -> str:
    # A sentence inside a document follows a space: its first word is `Ġword`, as when the
    # whole paragraph is tokenized (and as RoBERTa saw it), not the text-initial `word`.
    return " " + sentence

  @classmethod
  def from_files(cls, path) -> "ByteLevelBPETokenizer":
    """Loads vocab.json and the merges.txt beside it, local or on a bucket (gs://)."""
    path = epath.Path(path)
    merges_path = path.parent / BPE_MERGES
    for p in (path, merges_path):
      if not p.is_file():
        raise FileNotFoundError(f"byte-level BPE file {p} does not exist: a BPE vocabulary is "
                                f"vocab.json with {BPE_MERGES} in the same folder (train one "
                                "with `python -m encoder_jax.data.train_vocab --kind=bpe`)")
    try:
      vocab = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
      raise ValueError(f"{path} is not a JSON token -> id map ({e})") from e
    # merges.txt is read here rather than by models.BPE.from_file (local files only) so that
    # a vocabulary on a bucket loads too. Its format: an optional "#version" line, then one
    # merge per line, the two tokens separated by one space (tokenizers' own reader).
    merges = []
    for n, line in enumerate(merges_path.read_text(encoding="utf-8").split("\n"), 1):
      if not line or line.startswith("#version"):
        continue
      pair = tuple(line.split(" "))
      if len(pair) != 2:
        raise ValueError(f"{merges_path} line {n}: {line!r} is not two tokens separated by "
                         "one space")
      merges.append(pair)
    # RobertaTokenizerFast's model: no unknown token, no dropout, no affixes.
    bpe = models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="",
                     end_of_word_suffix="", fuse_unk=False)
    return cls(_byte_level_pipeline(tokenizers.Tokenizer(bpe)), source=str(path))


# ------------------------------------------------------------------------ files and loading


def is_bpe(path) -> bool:
  """A vocabulary file's kind: vocab.json (byte-level BPE) or anything else (vocab.txt)."""
  return str(path).endswith(".json")


def vocab_file(path) -> epath.Path:
  """The vocabulary file a path names: a file itself, or in a folder its vocab.json (with
  merges.txt beside it) or else its vocab.txt."""
  path = epath.Path(path)
  if path.is_dir():
    bpe = path / "vocab.json"
    return bpe if bpe.exists() and (path / BPE_MERGES).exists() else path / "vocab.txt"
  return path


def vocab_digest(path) -> str:
  """sha256 of what the vocabulary's ids depend on: vocab.txt, or vocab.json and merges.txt."""
  h = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    h.update(f.read())
  if not is_bpe(path):
    return h.hexdigest()
  merges = hashlib.sha256((epath.Path(path).parent / BPE_MERGES).read_bytes()).hexdigest()
  return hashlib.sha256(f"{h.hexdigest()} {merges}".encode()).hexdigest()


_LOADED: dict[tuple[str, bool | None], SubwordTokenizer] = {}  # load's


def load(path, lowercase: bool = True) -> SubwordTokenizer:
  """The tokenizer of a vocabulary file or folder (`vocab_file`), built once per process and
  contents: a run's trainer, its train and eval loaders share one. An edited file is rebuilt;
  the tokenizer holds no per-call state, so sharing it is safe. `lowercase` applies to
  WordPiece only (byte-level BPE never normalizes, as RoBERTa)."""
  path = vocab_file(path)
  bpe = is_bpe(path)
  if not path.is_file() or (bpe and not (path.parent / BPE_MERGES).is_file()):
    # (their errors name the missing file)
    return (ByteLevelBPETokenizer.from_files(path) if bpe
            else WordPieceTokenizer.from_vocab(path, lowercase))
  key = (vocab_digest(path), None if bpe else lowercase)
  if key not in _LOADED:
    _LOADED[key] = (ByteLevelBPETokenizer.from_files(path) if bpe
                    else WordPieceTokenizer.from_vocab(path, lowercase))
  return _LOADED[key]


# ---------------------------------------------------------------------------------- training


def _train(tok: tokenizers.Tokenizer, trainer, files_or_iterator, what: str) -> None:
  """Trains `tok` on paths of UTF-8 text files or an iterable of texts."""
  if isinstance(files_or_iterator, (str, os.PathLike)):  # one path, never one text
    files_or_iterator = [pathlib.Path(files_or_iterator)]
  items = files_or_iterator
  if isinstance(items, Sequence) and items and all(
      isinstance(p, os.PathLike) or (isinstance(p, str) and os.path.isfile(p)) for p in items):
    missing = [str(p) for p in items if not os.path.isfile(p)]
    if missing:
      raise FileNotFoundError(f"{what}: no such file(s): {missing}")
    tok.train([str(p) for p in items], trainer)
  else:
    tok.train_from_iterator(items, trainer)


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
  _train(tok, trainer, files_or_iterator, "train_vocab")
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


def train_bpe(files_or_iterator: Iterable[str] | Sequence[os.PathLike], vocab_size: int,
              out_dir, min_frequency: int = 2) -> ByteLevelBPETokenizer:
  """Trains a byte-level BPE (RoBERTa's kind; specials <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4,
  then the 256 byte symbols, then the merges) and writes `out_dir`/merges.txt and vocab.json,
  each renamed into place, vocab.json last (a folder with vocab.json is complete).

  Deterministic, unlike the WordPiece trainer (tested): tokenizers' BpeTrainer (0.23.3) numbers
  the byte alphabet sorted, adds no continuing-subword tokens in hash-map order (there is no
  prefix), gives each merge the next id and breaks ties between equally frequent pairs by
  those ids; pair counts are sums, the same in any thread order.
  """
  tok = _byte_level_pipeline(tokenizers.Tokenizer(models.BPE()))
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency,
      special_tokens=list(BPE_SPECIAL_TOKENS), show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  _train(tok, trainer, files_or_iterator, "train_bpe")
  if not json.loads(tok.to_str())["model"]["merges"]:
    raise ValueError("train_bpe: the input held no text to learn merges from")
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=out_dir, prefix=".train_bpe_") as tmp:
    tok.model.save(tmp)  # vocab.json + merges.txt ("#version: 0.2" header), as released
    for name in (BPE_MERGES, "vocab.json"):
      os.replace(os.path.join(tmp, name), out_dir / name)
  return ByteLevelBPETokenizer.from_files(out_dir / "vocab.json")


# ------------------------------------------------------------------------------ documents
_TOKENIZE_BATCH_SENTENCES = 32768  # big batches keep the Rust tokenizer busy


def tokenize_documents(docs: Iterable["sources.Document"],
                       tok: SubwordTokenizer) -> Iterator[tuple[str, dict]]:
  """Tokenizes documents in large batches; yields (doc_id, record), skipping (with a warning)
  documents without a token.

  Sentence by sentence, each after the first as it stands in the running text
  (`tok.continuing`: a byte-level BPE's `Ġ` before its first word). The first token of every
  sentence starts a word: a WordPiece sentence never begins with a `##` piece, and a BPE
  document's first word has no space before it to carry the `Ġ` that marks the others."""

  def flush(batch):
    sents = [s if j == 0 else tok.continuing(s) for d in batch for j, s in enumerate(d.sentences)]
    ids_N, lengths_S = tok.encode_batch_np(sents)
    starts_N = tok.word_starts(ids_N)
    starts_N[(np.cumsum(lengths_S) - lengths_S)[lengths_S > 0]] = True
    tok_off = sent_off = 0
    for d in batch:
      lengths = lengths_S[sent_off:sent_off + len(d.sentences)]
      keep = lengths > 0  # sentences that normalize to nothing (e.g. control characters)
      n = int(lengths.sum())
      rec = {"doc_id": d.doc_id, "ids": ids_N[tok_off:tok_off + n],
             "word_starts": starts_N[tok_off:tok_off + n],
             "sentence_lengths": lengths[keep].astype(np.int32)}
      tok_off += n
      sent_off += len(d.sentences)
      if n == 0:
        logging.warning("document %s has no tokens; skipped", d.doc_id)
        continue
      yield d.doc_id, rec

  batch, batch_sents = [], 0
  for d in docs:
    batch.append(d)
    batch_sents += len(d.sentences)
    if batch_sents >= _TOKENIZE_BATCH_SENTENCES:
      yield from flush(batch)
      batch, batch_sents = [], 0
  if batch:
    yield from flush(batch)
