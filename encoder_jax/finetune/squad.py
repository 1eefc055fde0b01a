"""SQuAD v1.1 / v2.0 for span QA: windows with a doc stride, span labels, answer extraction.

Features (BERT's run_squad.py algorithm, numpy instead of per-token Python objects):
  * the question is cut to `max_query_length` tokens;
  * the context's tokens are cut into windows of at most
    `max_length - len(question) - 3` tokens (- 4 in RoBERTa's layout) whose starts are
    `doc_stride` tokens apart (BERT's meaning of doc_stride: the step between window starts,
    not HF's overlap), the last window ending at the context's end;
  * each window is `[CLS] question [SEP] window [SEP]` with token types 0 / 1, or with a
    byte-level BPE `<s> question </s></s> window </s>`, all types 0 (the tokenizer's layout,
    data/examples.py LAYOUTS);
  * the label is the (start, end) token of the answer when the whole answer lies inside the
    window, else (0, 0): [CLS] stands for "no answer here" (v2.0 unanswerable questions, and
    windows that miss the answer).
  * `max_context_BxT` marks, for each context token, whether this window gives it the most
    context (min of left and right context, + 0.01 x window length, as BERT); a start token is
    only taken from its max-context window.

Answers: for each window, the best (start, end) with start <= end < start + max_answer_length,
both inside the context, start max-context; the answer text is the original context between
the character offsets of the two tokens. v2.0: the null score is start[0] + end[0] (the minimum
over the question's windows); predict "" when null - best > null_threshold.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from encoder_jax.data.examples import LAYOUTS
from encoder_jax.data.tokenizer import SubwordTokenizer


@dataclasses.dataclass(frozen=True)
class SquadExample:
  qid: str
  question: str
  context: str
  answer_texts: tuple[str, ...]  # () for an unanswerable v2.0 question
  answer_starts: tuple[int, ...]  # character offsets into context


@dataclasses.dataclass
class SquadFeatures:
  """One row per window. int32 [F, T] arrays and per-window bookkeeping for answer text."""
  input_ids: np.ndarray
  mask: np.ndarray
  token_types: np.ndarray
  start_positions: np.ndarray  # int32 [F]
  end_positions: np.ndarray  # int32 [F]
  example_index: np.ndarray  # int32 [F]: which SquadExample the window came from
  offsets_FxTx2: np.ndarray  # int32 character offsets into the context; -1 outside it
  max_context_FxT: np.ndarray  # bool


def _window_starts(n: int, max_doc: int, doc_stride: int) -> list[int]:
  starts, s = [], 0
  while True:
    starts.append(s)
    if s + max_doc >= n:
      return starts
    s += min(max_doc, doc_stride)


def build_features(examples: Sequence[SquadExample], tok: SubwordTokenizer, *,
                   max_length: int = 384, doc_stride: int = 128,
                   max_query_length: int = 64) -> SquadFeatures:
  if max_length < max_query_length + 8:
    raise ValueError(f"max_length={max_length} leaves too little room for the context after a "
                     f"question of up to max_query_length={max_query_length} tokens; raise "
                     "max_length or lower max_query_length.")
  if doc_stride < 1:
    raise ValueError(f"doc_stride={doc_stride} must be >= 1 (BERT uses 128).")
  # The pipeline without padding or truncation: the offsets of each token into the original
  # string come from HF tokenizers.
  plain = tok.hf_tokenizer()
  layout = LAYOUTS[tok.layout]
  q_encs = plain.encode_batch([e.question for e in examples], add_special_tokens=False)
  c_encs = plain.encode_batch([e.context for e in examples], add_special_tokens=False)
  rows: dict[str, list] = {k: [] for k in ("ids", "types", "start", "end", "ex", "off", "maxc")}
  for i, (ex, q, c) in enumerate(zip(examples, q_encs, c_encs)):
    q_ids = q.ids[:max_query_length]
    c_ids = np.asarray(c.ids, np.int32)
    c_off = np.asarray(c.offsets, np.int32).reshape(-1, 2)
    max_doc = max_length - len(q_ids) - 2 - layout.pair_seps
    answer = None
    if ex.answer_texts and ex.answer_starts:
      a_start = int(ex.answer_starts[0])
      a_end = a_start + len(ex.answer_texts[0])
      # First token ending after the answer's start; last token starting before its end.
      inside = (c_off[:, 1] > a_start) & (c_off[:, 0] < a_end)
      if inside.any():
        answer = (int(np.flatnonzero(inside)[0]), int(np.flatnonzero(inside)[-1]))
    starts = _window_starts(len(c_ids), max_doc, doc_stride)
    for s in starts:
      n = min(max_doc, len(c_ids) - s)
      prefix = [tok.cls_id, *q_ids] + [tok.sep_id] * layout.pair_seps
      ids = prefix + c_ids[s:s + n].tolist() + [tok.sep_id]
      types = [0] * len(prefix) + [int(layout.typed)] * (n + 1)
      off = np.full((len(ids), 2), -1, np.int32)
      off[len(prefix):len(prefix) + n] = c_off[s:s + n]
      maxc = np.zeros(len(ids), bool)
      for j in range(n):
        maxc[len(prefix) + j] = _is_max_context(starts, len(c_ids), max_doc, s, s + j)
      start = end = 0
      if answer is not None and s <= answer[0] and answer[1] < s + n:
        start, end = answer[0] - s + len(prefix), answer[1] - s + len(prefix)
      for k, v in zip(("ids", "types", "start", "end", "ex", "off", "maxc"),
                      (ids, types, start, end, i, off, maxc)):
        rows[k].append(v)

  f = len(rows["ids"])
  pad = lambda seqs, value, dtype, extra=(): _pad(seqs, f, max_length, value, dtype, extra)
  input_ids = pad(rows["ids"], tok.pad_id, np.int32)
  return SquadFeatures(
      input_ids=input_ids, mask=(pad(rows["types"], -1, np.int32) >= 0).astype(np.int32),
      token_types=np.maximum(pad(rows["types"], -1, np.int32), 0),
      start_positions=np.asarray(rows["start"], np.int32),
      end_positions=np.asarray(rows["end"], np.int32),
      example_index=np.asarray(rows["ex"], np.int32),
      offsets_FxTx2=pad(rows["off"], -1, np.int32, (2,)),
      max_context_FxT=pad(rows["maxc"], False, bool))


def _pad(seqs, f, t, value, dtype, extra=()):
  out = np.full((f, t) + extra, value, dtype)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s
  return out


def _is_max_context(starts, n_tokens, max_doc, span_start, position) -> bool:
  """BERT's _check_is_max_context: does the window at span_start give `position` the most
  context (min(left, right) + 0.01 * length) among the windows containing it?"""
  best_score, best_start = None, None
  for s in starts:
    length = min(max_doc, n_tokens - s)
    end = s + length - 1
    if not s <= position <= end:
      continue
    score = min(position - s, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_start = score, s
  return best_start == span_start


def extract_answers(examples: Sequence[SquadExample], feats: SquadFeatures, start_FxT,
                    end_FxT, *, max_answer_length: int = 30, version: str = "v1.1",
                    null_threshold: float = 0.0) -> tuple[dict[str, str], dict[str, float]]:
  """Best answer text per question id, and (v2.0) the null-minus-best score per question."""
  start_FxT, end_FxT = np.asarray(start_FxT, np.float32), np.asarray(end_FxT, np.float32)
  t = start_FxT.shape[1]
  in_ctx_FxT = feats.offsets_FxTx2[..., 0] >= 0
  # Valid (start, end) pairs: end - start in [0, max_answer_length).
  diff_TxT = np.arange(t)[None, :] - np.arange(t)[:, None]
  band_TxT = (diff_TxT >= 0) & (diff_TxT < max_answer_length)
  best = {}  # example index -> (score, text)
  null = {}  # example index -> min null score over windows
  for fi in range(len(feats.input_ids)):
    ei = int(feats.example_index[fi])
    s_T, e_T = start_FxT[fi], end_FxT[fi]
    null[ei] = min(null.get(ei, np.inf), float(s_T[0] + e_T[0]))
    ok_TxT = (band_TxT & (in_ctx_FxT[fi] & feats.max_context_FxT[fi])[:, None]
              & in_ctx_FxT[fi][None, :])
    if not ok_TxT.any():
      continue
    score_TxT = np.where(ok_TxT, s_T[:, None] + e_T[None, :], -np.inf)
    i, j = np.unravel_index(np.argmax(score_TxT), score_TxT.shape)
    score = float(score_TxT[i, j])
    if ei not in best or score > best[ei][0]:
      ctx = examples[ei].context
      best[ei] = (score, ctx[feats.offsets_FxTx2[fi, i, 0]:feats.offsets_FxTx2[fi, j, 1]])
  preds, null_diff = {}, {}
  for ei, ex in enumerate(examples):
    score, text = best.get(ei, (-np.inf, ""))
    if version == "v2.0":
      null_diff[ex.qid] = float(null.get(ei, 0.0) - score)
      if null_diff[ex.qid] > null_threshold:
        text = ""
    preds[ex.qid] = text
  return preds, null_diff


def examples_from_records(records, version: str) -> list[SquadExample]:
  """TFDS `squad/v1.1` | `squad/v2.0` records (bytes or str fields) -> SquadExample."""
  def s(x):
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)
  out = []
  for r in records:
    texts = [s(t) for t in np.asarray(r["answers"]["text"]).tolist()]
    starts = [int(x) for x in np.asarray(r["answers"]["answer_start"]).tolist()]
    if version == "v2.0" and bool(r.get("is_impossible", False)):
      texts, starts = [], []
    # Every gold text is scored; only the first answer (with its start) labels training.
    out.append(SquadExample(qid=s(r["id"]), question=s(r["question"]), context=s(r["context"]),
                            answer_texts=tuple(texts), answer_starts=tuple(starts[:len(texts)])))
  return out
