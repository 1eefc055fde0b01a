r"""Train a corpus-specific vocabulary: BERT's WordPiece (a vocab.txt, specials first: [PAD]
[UNK] [CLS] [SEP] [MASK]) or RoBERTa's byte-level BPE (vocab.json + merges.txt in a folder,
specials <s> <pad> </s> <unk> <mask> first).

  python -m encoder_jax.data.train_vocab --corpus=demo --vocab_size=16000 --out=demo_vocab.txt
  python -m encoder_jax.data.train_vocab --input='texts/*.txt' --vocab_size=30522 --out=vocab.txt
  python -m encoder_jax.data.train_vocab --kind=bpe --input='texts/*.txt' --vocab_size=50265 \
      --out=my_bpe     # -> my_bpe/vocab.json, my_bpe/merges.txt; data.vocab=my_bpe

A smaller vocab makes small models cheaper: at d=128 the 30,522-wide MLM head is ~25% of a step.
"""
import glob
import time

from absl import app, flags, logging

from encoder_jax.data import tokenizer

_KIND = flags.DEFINE_enum(
    "kind", "wordpiece", ["wordpiece", "bpe"], "wordpiece: BERT's (lowercased by default; --out "
    "is a vocab.txt). bpe: RoBERTa's byte-level BPE (cased, no normalization; --out is a folder "
    "that gets vocab.json and merges.txt).")
_INPUT = flags.DEFINE_list(
    "input", [], "Comma-separated UTF-8 text files or glob patterns to learn from. "
    "Either this or --corpus.")
_CORPUS = flags.DEFINE_enum(
    "corpus", None, ["demo"], "A built-in corpus instead of --input: 'demo' = SOTU + Moby-Dick + "
    "Brown pre-training documents (fetched and cached on first use; the Brown POS dev/test "
    "documents are left out).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Artifact cache for --corpus "
                                 "(default $ENCODER_JAX_CACHE or ~/.cache/encoder_jax).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 16000, "Vocabulary size, specials and the "
                                   "character (BPE: 256-byte) alphabet included.")
_MIN_FREQUENCY = flags.DEFINE_integer("min_frequency", 2, "Merges seen fewer times are dropped.")
_LIMIT_ALPHABET = flags.DEFINE_integer("limit_alphabet", 1000, "WordPiece: at most this many "
                                       "single characters are kept (rarer ones become [UNK]).")
_LOWERCASE = flags.DEFINE_bool("lowercase", True, "WordPiece: lowercase and strip accents "
                               "(uncased vocab). A BPE is always cased, as RoBERTa's.")
_OUT = flags.DEFINE_string("out", None, "Where to write: wordpiece, the vocab.txt (one token per "
                           "line); bpe, the folder for vocab.json and merges.txt.", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if bool(_INPUT.value) == bool(_CORPUS.value):
    raise app.UsageError("give exactly one of --input or --corpus")
  start = time.time()
  if _CORPUS.value == "demo":
    from encoder_jax.data import sources  # pylint: disable=g-import-not-at-top
    source = [doc.text for doc in sources.demo_documents(_CACHE_DIR.value, split="train")]
    what = f"{len(source)} demo documents"
  else:
    source = sorted({p for pattern in _INPUT.value for p in glob.glob(pattern)})
    if not source:
      raise app.UsageError(f"--input={','.join(_INPUT.value)} matched no file")
    what = f"{len(source)} files"
  if _KIND.value == "bpe":
    logging.info("training a %d-token byte-level BPE on %s", _VOCAB_SIZE.value, what)
    tok = tokenizer.train_bpe(source, _VOCAB_SIZE.value, _OUT.value,
                              min_frequency=_MIN_FREQUENCY.value)
    wrote = f"{_OUT.value}/vocab.json and {tokenizer.BPE_MERGES}"
  else:
    logging.info("training a %d-token WordPiece vocab on %s", _VOCAB_SIZE.value, what)
    tok = tokenizer.train_vocab(source, _VOCAB_SIZE.value, _OUT.value,
                                lowercase=_LOWERCASE.value, min_frequency=_MIN_FREQUENCY.value,
                                limit_alphabet=_LIMIT_ALPHABET.value)
    wrote = _OUT.value
  print(f"wrote {wrote}: {tok.vocab_size} tokens from {what} in {time.time() - start:.1f} s")


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.data.train_vocab")
