"""Shared fixtures: the demo corpus (built once per machine in the user's cache, ~25 s)."""
import pytest

from encoder_jax.data import builders, tokenizer


@pytest.fixture(scope="session")
def demo_builder():
  return builders.prepare_corpus("demo", "minilm")


@pytest.fixture(scope="session")
def demo_corpus(demo_builder):
  return builders.read_corpus(demo_builder, "train")


@pytest.fixture(scope="session")
def bert_tok():
  return tokenizer.WordPieceTokenizer.from_vocab(builders.resolve_vocab("minilm"))
