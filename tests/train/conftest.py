"""The trainer tests' shared corpus (tests/loop_helpers.py) and the learnability corpus."""

import filelock
import pytest

from encoder_jax.data import sources, tokenizer

import loop_helpers


@pytest.fixture(scope="session")
def env(tmp_path_factory):
  """Corpus files and a TFDS data_dir shared by every trainer run of the session."""
  return loop_helpers.make_env(tmp_path_factory.mktemp("loop"))


@pytest.fixture(scope="session")
def sotu_corpus(tmp_path_factory, worker_id):
  """The State-of-the-Union part of the demo corpus with a 256-token WordPiece vocab trained
  on it: a small real text on which local context pays off within a few hundred steps (the
  learnability tests' data). One folder for all xdist workers (the recipe of pytest-xdist's
  docs: the parent of the workers' base temp dirs): the vocab is trained once, under a lock,
  and the shards built once (the shard builder's own lock makes a second worker wait for the
  first and reuse its shards; 10.6 MB of text to tokenize)."""
  root = tmp_path_factory.getbasetemp()
  if worker_id != "master":
    root = root.parent
  base = root / "sotu"
  part = "sotu"
  with filelock.FileLock(str(root / "sotu.lock")):
    base.mkdir(exist_ok=True)
    if not (base / "vocab.txt").exists():
      docs = sources.demo_documents(split="train", parts=(part,))
      tokenizer.train_vocab([" ".join(d.sentences) for d in docs], 256, base / "vocab.tmp")
      (base / "vocab.tmp").rename(base / "vocab.txt")
  vocab = tokenizer.WordPieceTokenizer.load(str(base / "vocab.txt"))
  return {"base": base, "vocab": str(base / "vocab.txt"), "vocab_size": vocab.vocab_size,
          "source": f"demo:{part}"}
