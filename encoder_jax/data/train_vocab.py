r"""Train a corpus-specific WordPiece vocab.txt (BERT specials first: [PAD] [UNK] [CLS] [SEP]
[MASK]).

  python -m encoder_jax.data.train_vocab --corpus=demo --vocab_size=16000 --out=demo_vocab.txt
  python -m encoder_jax.data.train_vocab --input='texts/*.txt' --vocab_size=30522 --out=vocab.txt

A smaller vocab makes small models cheaper: at d=128 the 30,522-wide MLM head is ~25% of a step.
"""
import glob
import time

from absl import app, flags, logging

from encoder_jax.data import tokenizer

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
                                   "character alphabet included.")
_MIN_FREQUENCY = flags.DEFINE_integer("min_frequency", 2, "Merges seen fewer times are dropped.")
_LIMIT_ALPHABET = flags.DEFINE_integer("limit_alphabet", 1000, "At most this many single "
                                       "characters are kept (rarer ones become [UNK]).")
_LOWERCASE = flags.DEFINE_bool("lowercase", True, "Lowercase and strip accents (uncased vocab).")
_OUT = flags.DEFINE_string("out", None, "Where to write vocab.txt (one token per line).",
                           required=True)


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
  logging.info("training a %d-token WordPiece vocab on %s", _VOCAB_SIZE.value, what)
  tok = tokenizer.train_vocab(source, _VOCAB_SIZE.value, _OUT.value, lowercase=_LOWERCASE.value,
                              min_frequency=_MIN_FREQUENCY.value,
                              limit_alphabet=_LIMIT_ALPHABET.value)
  print(f"wrote {_OUT.value}: {tok.vocab_size} tokens from {what} in {time.time() - start:.1f} s")


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.data.train_vocab")
