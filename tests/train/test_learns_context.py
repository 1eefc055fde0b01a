"""The trainer learns context, not just unigram frequencies.

A model that ignores its context can at best predict every masked token from the corpus's
token frequencies: its held-out MLM loss is the unigram cross-entropy of the targets (the
"unigram plateau"). This file pre-trains the demo recipe (configs/pretrain.py:runlocal) for a
few hundred steps on a real text (Moby-Dick, fetched like the demo corpus) and requires the
held-out loss to end `MARGIN` nats below that baseline, scored by the trainer on exactly the
evaluated positions. The same run with attention broken (every key masked: no token sees any
other) must fail the same check, so the check measures context and nothing else.

Every chosen token becomes [MASK] here (no 10% kept / 10% random): with BERT's 80/10/10 a
context-free model could still learn "a visible token is its own label" and dip below the
unigram baseline without looking at any neighbour.

Guards every part of the pipeline at once: masking, data rows, attention, optimiser, step.
"""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from configs import pretrain  # noqa: E402
from encoder_jax.data import sources, tokenizer  # noqa: E402
from encoder_jax.model import encoder as encoder_lib  # noqa: E402
from encoder_jax.train import loop  # noqa: E402

MARGIN = 0.5  # nats below the unigram baseline after STEPS steps
STEPS = 600


@pytest.fixture(scope="module")
def moby(tmp_path_factory):
  base = tmp_path_factory.mktemp("moby")
  docs = sources.demo_documents(split="train", parts=("moby_dick",))
  vocab = tokenizer.train_vocab([" ".join(d.sentences) for d in docs], 2048,
                                base / "vocab.txt")
  return {"base": base, "vocab": str(base / "vocab.txt"), "vocab_size": vocab.vocab_size}


def run(moby, name: str) -> dict:
  config = pretrain.get_config("runlocal")
  config.data.update(dict(source="demo:moby_dick", vocab=moby["vocab"],
                          data_dir=str(moby["base"] / "tfds")))
  config.objective.update(dict(mask_frac=1.0, random_frac=0.0))
  # One held-out evaluation, at the end.
  config.train.update(dict(steps=STEPS, log_every=STEPS // 4, eval_every=STEPS,
                           checkpoint_every=STEPS, eval_steps=8))
  summary = loop.train_and_evaluate(config, str(moby["base"] / name))
  return summary["final_eval"]


def test_pretraining_beats_the_unigram_baseline(moby):
  ev = run(moby, "intact")
  gap = ev["unigram_loss"] - ev["mlm_loss"]
  assert gap > MARGIN, (f"held-out MLM loss {ev['mlm_loss']:.3f} is only {gap:.3f} nats below "
                        f"the unigram baseline {ev['unigram_loss']:.3f}: the trainer did not "
                        f"learn context")
  assert ev["mlm_accuracy"] > ev["unigram_accuracy"] + 0.05


def test_broken_attention_stays_on_the_plateau(moby, monkeypatch):
  """The check above must fail for a model that cannot see its context."""
  real = encoder_lib.make_attention_mask
  monkeypatch.setattr(encoder_lib, "make_attention_mask",
                      lambda mask_BxT, seg=None: real(mask_BxT, seg) & False)
  ev = run(moby, "broken")
  assert ev["unigram_loss"] - ev["mlm_loss"] < MARGIN / 4
