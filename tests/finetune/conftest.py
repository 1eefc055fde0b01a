"""Shared fixtures: a tiny WordPiece vocab for TFDS mock text, a tiny random-encoder config, and
a recorder of the train steps encoder_jax.train.step.make_step builds.

tfds.testing.mock_data fills Text features with random strings over 'a'-'j' and spaces, so a
vocab of the specials, those letters and their '##' continuations tokenizes any of them.
"""
import pathlib

import pytest

from encoder_jax.finetune import trainer
from encoder_jax.train import step as step_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
from configs import finetune as finetune_config  # noqa: E402

LETTERS = "abcdefghij"


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory) -> str:
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS),
            "the", "good", "bad", "movie", ".", ","]
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(tokens) + "\n")
  return str(path)


@pytest.fixture(scope="session")
def tiny_config():
  return make_tiny_config


def make_tiny_config(task: str, vocab: str, **changes):
  """configs/finetune.py for `task` with a 2-layer d=32 random encoder and a few steps.

  Dropout stays on (train mode) unless a test turns it off: its explicit attention path
  roughly doubles the train step's compile time on 2 cores."""
  c = finetune_config.get_config(f"task={task},init=random")
  c.random_like = "tiny"
  c.model.update(dict(vocab_size=64, hidden_size=32, num_heads=2, ffn_size=64, num_layers=2,
                      max_positions=128))
  c.vocab = vocab
  c.update(dict(max_length=32, length_bucket=0, epochs=1, batch_size=4, eval_batch_size=8,
                learning_rate=1e-3, log_every=1, cache_dir="", data_dir=""))
  c.update(changes)
  return c


@pytest.fixture
def made_steps(monkeypatch):
  """Every step train.step.make_step builds while the test runs, in order: a dict of its
  arguments ("args", "kw"), the function it returned ("step", "jitted") and each call's
  (state and batch before the call, as host copies; extra arguments; metrics)."""
  real, made = step_lib.make_step, []

  def make_step(loss_fn, tx, schedule, **kw):
    record = dict(args=(loss_fn, tx, schedule), kw=kw, calls=[],
                  jitted=real(loss_fn, tx, schedule, **kw))

    def step(state, batch, *extra):
      before = trainer.host_copy((state, batch))  # (the step donates the state)
      state, metrics = record["jitted"](state, batch, *extra)
      record["calls"].append((before, extra, metrics))
      return state, metrics
    record["step"] = step
    made.append(record)
    return step

  monkeypatch.setattr(step_lib, "make_step", make_step)
  # An empty cache of built steps for the test, so that every step its runs use is built (and
  # recorded) here, not taken from an earlier test's runs (trainer.build_steps).
  monkeypatch.setattr(trainer, "_STEPS_CACHE", type(trainer._STEPS_CACHE)())
  return made
