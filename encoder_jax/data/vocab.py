"""Which vocabulary a name means (data.vocab, fine-tuning's vocab), and the demo vocabularies.

  resolve_vocab("minilm" | "demo[:4096]" | "demo-bpe[:4096]" | "vocab.txt" | "bpe/vocab.json"
                | "a folder holding either")      # -> the file tokenizer.load reads
  demo_vocab(8192), demo_bpe_vocab(8192)         # trained on the demo corpus, once per cache

The tokenizers themselves (WordPiece, byte-level BPE, their training) are tokenizer.py's.
"""
import pathlib
from collections.abc import Callable

from absl import logging
import filelock

from encoder_jax.data import fetch, sources, tokenizer

DEMO_VOCAB_SIZE = 8192
# A byte-level BPE holds its 256 byte symbols and 5 specials before any merge.
MIN_BPE_SIZE = 256 + len(tokenizer.BPE_SPECIAL_TOKENS)


def resolve_vocab(vocab: str, cache_dir=None) -> str:
  """data.vocab -> the vocabulary file every tokenizer user loads (`tokenizer.load`):
    minilm               BERT uncased WordPiece (30,522), fetched
    demo[:<size>]        WordPiece trained on the demo corpus (`demo_vocab`; 8,192 by default)
    demo-bpe[:<size>]    byte-level BPE trained on the demo corpus (`demo_bpe_vocab`; 8,192)
    a vocab.txt          WordPiece (BERT's format)
    a vocab.json         byte-level BPE, with merges.txt in the same folder (RoBERTa's files)
    a folder             its vocab.json + merges.txt if it has them, else its vocab.txt
  Paths may be local or gs://. Returns the file's path (vocab.txt or vocab.json)."""
  if vocab == "minilm":
    return str(fetch.minilm_vocab(cache_dir))
  name, _, size = vocab.partition(":")
  if name in ("demo", "demo-bpe"):
    least = 256 if name == "demo" else MIN_BPE_SIZE
    size = size or str(DEMO_VOCAB_SIZE)
    if not size.isdigit() or int(size) < least:
      raise ValueError(f"vocab {vocab!r}: the size after '{name}:' must be an integer >= "
                       f"{least} (e.g. {name}:{DEMO_VOCAB_SIZE}).")
    return str(demo_vocab(int(size), cache_dir) if name == "demo"
               else demo_bpe_vocab(int(size), cache_dir))
  path = tokenizer.vocab_file(vocab)
  if not path.is_file():
    raise FileNotFoundError(f"vocab {vocab!r} is neither 'minilm', 'demo[:<size>]', "
                            "'demo-bpe[:<size>]' nor an existing vocab.txt, vocab.json or "
                            "folder holding one (a local path or gs://...)")
  if tokenizer.is_bpe(path) and not (path.parent / tokenizer.BPE_MERGES).is_file():
    raise FileNotFoundError(f"vocab {vocab!r}: a byte-level BPE vocab.json needs "
                            f"{tokenizer.BPE_MERGES} in the same folder "
                            f"({path.parent / tokenizer.BPE_MERGES} does not exist)")
  return str(path)


# The demo vocab, committed: HF tokenizers' WordPiece trainer (0.23.3) is not deterministic.
# It numbers continuing-subword tokens in hash-map order (a seed drawn per process) and breaks
# ties between equally frequent merges by those numbers (huggingface/tokenizers issue #1794,
# fix proposed in PR #2066): trained twice on the same documents, 16 of 8,192 entries
# differed, and the same demo run on two fresh caches differed from the first steps (loss
# 7.631 vs 7.625 at step 100, held-out accuracy 29.9% vs 29.4% after 15,000 steps) where two
# runs on one cache agree exactly.
# This file is the output of `tokenizer.train_vocab` on the demo corpus's train documents
# (size 8,192, tokenizers 0.23.3): every machine now trains on the same ids.
DEMO_VOCAB_FILE = pathlib.Path(__file__).resolve().parent / "vocabs" / "demo-wordpiece-8192.txt"
DEMO_VOCAB_SHA256 = "0fad335073f75d74dae08300fe6bb8efca6b524cb2010426583c577a9f258b5b"


def demo_vocab(size: int = DEMO_VOCAB_SIZE, cache_dir=None) -> pathlib.Path:
  """A WordPiece vocab of `size` tokens trained on the demo corpus's train documents (the
  validation documents and the Brown POS dev/test documents are left out).

  Size 8,192 (the demo recipe's) is the committed `DEMO_VOCAB_FILE`: the trainer is not
  deterministic (above). Any other size is trained once per cache (~10 s) under a file lock
  and renamed into place; a second cache may then hold a slightly different vocab, and the
  corpus cache is keyed by the vocab's hash, so the two never mix.

  Why a corpus vocab for the demo: with BERT's 30,522 ids a tiny model sees too few masked
  targets per entry in minutes of training, and most of its step is the vocabulary projection;
  small-compute recipes use 6-16k (BabyLM 2023 strict-small winners: ELC-BERT 6,144, LTG-BERT
  16,384; BabyBERTa 8,192). The name carries the tokenizers version: another trainer version
  may pick other merges, and the corpus cache is keyed by the vocab's hash anyway.
  """
  if size == DEMO_VOCAB_SIZE:
    return DEMO_VOCAB_FILE
  import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
  path = (fetch.cache_root(cache_dir) / "vocab" /
          f"demo-wordpiece-{size}-tokenizers{hf_tokenizers.__version__}.txt")
  return _trained_once(path, path, f"the demo vocab ({size} WordPiece tokens)", cache_dir,
                       lambda docs: tokenizer.train_vocab(docs, size, path))


def demo_bpe_vocab(size: int = DEMO_VOCAB_SIZE, cache_dir=None) -> pathlib.Path:
  """vocab.json (merges.txt beside it) of a byte-level BPE of `size` tokens trained on the
  demo corpus's train documents, once per cache (~10 s) under a file lock.

  Not committed, unlike the WordPiece demo vocab: the BPE trainer is deterministic
  (`tokenizer.train_bpe`; tests/data/test_bpe.py trains twice and compares the files), so
  every cache trains the same files. The folder's name carries the tokenizers version, since
  another version may merge differently; the corpus cache is keyed by the files' hash anyway.
  """
  import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
  folder = (fetch.cache_root(cache_dir) / "vocab" /
            f"demo-bpe-{size}-tokenizers{hf_tokenizers.__version__}")
  # (vocab.json is written last: once it exists, the folder is complete)
  return _trained_once(folder / "vocab.json", folder, f"the demo byte-level BPE ({size} tokens)",
                       cache_dir, lambda docs: tokenizer.train_bpe(docs, size, folder))


def _trained_once(path: pathlib.Path, target: pathlib.Path, what: str, cache_dir,
                  train: Callable[[list[str]], object]) -> pathlib.Path:
  """`path`, made by `train(the demo corpus's train documents)` into `target` (a file or a
  folder) unless it exists, under a file lock beside `target`: parallel processes on one
  cache train it once."""
  if path.exists():
    return path
  target.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(str(target) + ".lock"):
    if not path.exists():
      logging.info("training %s into %s", what, target)
      train([d.text for d in sources.demo_documents(cache_dir, split="train")])
  return path
