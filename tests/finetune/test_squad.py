"""SQuAD windows, labels and answer extraction on a hand-made example (no model)."""
import numpy as np
import pytest

from encoder_jax.data.tokenizer import WordPieceTokenizer
from encoder_jax.finetune import squad

WORDS = "the cat sat on mat . dog ran far away where did sit ? a big red".split()
CONTEXT = "The cat sat on the mat. The dog ran far away. A big red dog sat."
QUESTION = "Where did the cat sit?"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("squad_vocab") / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
  return WordPieceTokenizer.from_vocab(path)


def _example(answer="the mat", qid="q1"):
  if answer is None:
    return squad.SquadExample(qid, QUESTION, CONTEXT, (), ())
  return squad.SquadExample(qid, QUESTION, CONTEXT, (answer,), (CONTEXT.index(answer),))


def test_windows_cover_context_and_label_answers(tok):
  # Question: 6 tokens; max_length 16 -> 16 - 6 - 3 = 7 context tokens per window; the context
  # has 19 tokens; windows start every 3 tokens: 0, 3, 6, 9, 12 (12 + 7 reaches the end).
  feats = squad.build_features([_example()], tok, max_length=16, doc_stride=3,
                               max_query_length=8)
  assert feats.input_ids.shape == (5, 16)
  assert (feats.input_ids[:, 0] == tok.cls_id).all()
  n_ctx = (feats.offsets_FxTx2[..., 0] >= 0).sum(axis=1)
  assert n_ctx.tolist() == [7, 7, 7, 7, 7]
  # Every context token has exactly one max-context window.
  starts = np.array([0, 3, 6, 9, 12])
  counts = np.zeros(19, int)
  for f in range(5):
    cols = np.flatnonzero(feats.max_context_FxT[f])
    counts[starts[f] + cols - 8] += 1  # 8 = [CLS] + 6 question tokens + [SEP]
  assert (counts == 1).all()
  # "the mat" = context tokens 4..5: inside windows starting at 0 and 3, not later ones.
  assert feats.start_positions.tolist() == [8 + 4, 8 + 1, 0, 0, 0]
  assert feats.end_positions.tolist() == [8 + 5, 8 + 2, 0, 0, 0]
  assert (feats.token_types[:, 8:15] == 1).all() and (feats.token_types[:, :8] == 0).all()


def test_extract_answers_maps_back_to_text(tok):
  exs = [_example("the mat", "q1"), _example("far away", "q2"), _example(None, "q3")]
  feats = squad.build_features(exs, tok, max_length=16, doc_stride=3, max_query_length=8)
  f, t = feats.input_ids.shape
  start, end = np.zeros((f, t), np.float32), np.zeros((f, t), np.float32)
  for i in range(f):  # put the logit peaks on the labelled span of each window
    if feats.start_positions[i] > 0:
      start[i, feats.start_positions[i]] = end[i, feats.end_positions[i]] = 5.0
  # q3 has no labelled window: give its null ([CLS]) a high score.
  for i in np.flatnonzero(feats.example_index == 2):
    start[i, 0] = end[i, 0] = 10.0
  preds, null_diff = squad.extract_answers(exs, feats, start, end, max_answer_length=5,
                                           version="v2.0")
  assert preds == {"q1": "the mat", "q2": "far away", "q3": ""}
  assert null_diff["q3"] > 0 > null_diff["q1"]
  # v1.1 never predicts "": q3 gets its best span.
  preds_v1, _ = squad.extract_answers(exs, feats, start, end, version="v1.1")
  assert preds_v1["q3"] != ""


def test_max_answer_length_is_enforced(tok):
  feats = squad.build_features([_example()], tok, max_length=32, doc_stride=128,
                               max_query_length=8)
  start, end = np.zeros((1, 32), np.float32), np.zeros((1, 32), np.float32)
  first = int(np.flatnonzero(feats.offsets_FxTx2[0, :, 0] >= 0)[0])
  start[0, first] = 9.0  # "The" ...
  end[0, first + 10] = 9.0  # ... a span of 11 tokens
  end[0, first + 1] = 1.0
  preds, _ = squad.extract_answers([_example()], feats, start, end, max_answer_length=4)
  assert preds["q1"] == "The cat"


def test_examples_from_tfds_records():
  recs = [{"id": b"x", "question": b"q?", "context": b"abc def", "is_impossible": True,
           "answers": {"text": np.array([b"abc"]), "answer_start": np.array([0])}}]
  assert squad.examples_from_records(recs, "v2.0")[0].answer_texts == ()
  assert squad.examples_from_records(recs, "v1.1")[0].answer_texts == ("abc",)


def test_byte_level_bpe_windows_use_robertas_layout_and_map_answers_back():
  """With a byte-level BPE (the demo one): `<s> question </s></s> window </s>`, all token
  types 0, one more special per window; answers come back as the context's text (offsets
  without the space that `Ġ` carries)."""
  from encoder_jax.data import tokenizer, vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  bpe = tokenizer.load(vocab_lib.resolve_vocab("demo-bpe"))
  exs = [_example("the mat", "q1"), _example("far away", "q2")]
  feats = squad.build_features(exs, bpe, max_length=20, doc_stride=3, max_query_length=8)
  q = bpe.encode(QUESTION)
  prefix = [bpe.cls_id, *q, bpe.sep_id, bpe.sep_id]
  assert (feats.input_ids[:, :len(prefix)] == prefix).all() and not feats.token_types.any()
  n_ctx = (feats.offsets_FxTx2[..., 0] >= 0).sum(axis=1)
  assert n_ctx.max() == 20 - len(q) - 4  # <s> q </s></s> ... </s>
  for f in range(len(n_ctx)):
    last = len(prefix) + n_ctx[f]
    assert feats.input_ids[f, last] == bpe.sep_id and (feats.input_ids[f, last + 1:] ==
                                                        bpe.pad_id).all()
  f, t = feats.input_ids.shape
  start, end = np.zeros((f, t), np.float32), np.zeros((f, t), np.float32)
  labelled = np.flatnonzero(feats.start_positions > 0)
  assert set(feats.example_index[labelled]) == {0, 1}
  for i in labelled:
    start[i, feats.start_positions[i]] = end[i, feats.end_positions[i]] = 5.0
  preds, _ = squad.extract_answers(exs, feats, start, end, max_answer_length=5, version="v1.1")
  assert preds == {"q1": "the mat", "q2": "far away"}
