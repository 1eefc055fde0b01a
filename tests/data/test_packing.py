"""Unpadded packing (data/examples.py, pack=True) on the demo corpus, every format: a packed
row's segments are exactly the unpacked rows of its examples; full_sentences packs a segment
per document (or row-sized chunk of one) in corpus order; packed rows survive the shard record;
MLM corruption of packed rows never picks a special nor lets a whole word run across two
segments; and packed rows read back from built shards give the model, on the explicit and the
XLA attention paths, what each example gives alone (a planted cross-segment leak does not)."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.data import examples, records, shards
from encoder_jax.model import Encoder, ModelConfig
from encoder_jax.model.config import MODERNBERT_BLOCK
from encoder_jax.objectives import pretraining
from encoder_jax.objectives.masking import IGNORE_LABEL

T = 128
ROW_KEYS = ("input_ids", "token_types", "word_starts", "positions")


def _rows(corpus, tok, layout="bert", **kw):
  cfg = examples.ExampleConfig(max_length=T, **kw)
  plan = examples.make_plan(corpus, cfg, layout)
  return plan, examples.Rows(corpus, plan, cfg, tok.cls_id, tok.sep_id, tok.pad_id, layout)


def _spans(plan, e):
  """What example e is made of: its pieces (corpus span, segment A/B, separator before)."""
  q = range(plan.piece_ptr_E1[e], plan.piece_ptr_E1[e + 1])
  return tuple((int(plan.start_P[i]), int(plan.end_P[i]), int(plan.seg_P[i]),
                bool(plan.sep_before_P[i])) for i in q)


def _sample(n, k=400):
  return range(0, n, max(1, n // k))


@pytest.mark.parametrize("fmt,layout", [("doc_sentences", "bert"), ("segment_pair", "bert"),
                                        ("sentence_pair", "bert"),
                                        ("sentence_pair", "roberta")])
def test_packed_segments_are_the_unpacked_rows(request, fmt, layout):
  corpus, tok = (request.getfixturevalue(n) for n in (
      ("demo_corpus", "bert_tok") if layout == "bert" else ("bpe_demo_corpus", "bpe_tok")))
  plan_u, rows_u = _rows(corpus, tok, layout, format=fmt)
  plan_p, rows_p = _rows(corpus, tok, layout, format=fmt, pack=True)
  where_u = {_spans(plan_u, e): e for e in range(len(plan_u.len_E))}
  assert len(where_u) == len(plan_u.len_E)  # (each example told apart by its spans)
  # The same examples, each once: packing only places them.
  assert collections.Counter(_spans(plan_p, e) for e in range(len(plan_p.len_E))) == (
      collections.Counter(where_u.keys()))
  k_R = np.diff(plan_p.ex_ptr_R1)
  assert k_R.max() >= 2 and len(rows_p) < len(rows_u)
  checked = 0
  for r in _sample(len(rows_p)):
    row = rows_p[r]
    assert row["segment_ids"].max() == k_R[r]
    for k in range(k_R[r]):
      alone = rows_u[where_u[_spans(plan_p, plan_p.ex_ptr_R1[r] + k)]]
      n = int(alone["mask"].sum())
      seg = row["segment_ids"] == k + 1
      assert seg.sum() == n and (alone["segment_ids"][:n] == 1).all()
      for key in ROW_KEYS:
        np.testing.assert_array_equal(row[key][seg], alone[key][:n], err_msg=f"{r} {k} {key}")
      checked += 1
  fill = lambda p: p.len_E.sum() / (p.num_rows * T)
  print(f"\n{fmt} ({layout}): {checked} segments checked; fill {fill(plan_u):.3f} unpacked, "
        f"{fill(plan_p):.3f} packed")


def test_full_sentences_packs_a_segment_per_document(demo_corpus, bert_tok):
  """Rows filled in corpus order (a row closes only when the next sentence does not fit);
  every segment is [CLS] + sentences of one document + [SEP]; all text once, in order."""
  c = demo_corpus
  plan, rows = _rows(c, bert_tok, format="full_sentences", pack=True)
  s, e = plan.start_P, plan.end_P
  assert s[0] == 0 and e[-1] == c.num_tokens and (s[1:] == e[:-1]).all()  # all text, in order
  assert not plan.sep_before_P.any()
  ex_of_piece = np.repeat(np.arange(len(plan.len_E)), np.diff(plan.piece_ptr_E1))
  doc = c.doc_of_token(s)
  assert (doc == c.doc_of_token(e - 1)).all()
  assert (doc == doc[plan.piece_ptr_E1[:-1]][ex_of_piece]).all()  # one document a segment
  # A document is split only where a row ends: consecutive segments of one row hold
  # different documents.
  first_doc = doc[plan.piece_ptr_E1[:-1]]
  same_row = np.repeat(np.arange(plan.num_rows), np.diff(plan.ex_ptr_R1))
  inner = same_row[1:] == same_row[:-1]
  assert (first_doc[1:][inner] != first_doc[:-1][inner]).all()
  # Greedy: what opens row r + 1 did not fit in row r (a sentence of the same document costs
  # its length, a new document 2 more for its [CLS] and [SEP]).
  used_R = np.add.reduceat(plan.len_E, plan.ex_ptr_R1[:-1])
  assert (used_R <= T).all()
  nxt = plan.piece_ptr_E1[plan.ex_ptr_R1[1:-1]]  # first piece of rows 1..
  last = plan.piece_ptr_E1[plan.ex_ptr_R1[1:-1]] - 1  # last piece of rows 0..
  cost = (e[nxt] - s[nxt]) + 2 * (doc[nxt] != doc[last])
  assert (cost > T - used_R[:-1]).all()
  for r in _sample(len(rows)):
    row = rows[r]
    for k, ex in enumerate(range(plan.ex_ptr_R1[r], plan.ex_ptr_R1[r + 1])):
      seg = row["segment_ids"] == k + 1
      text = np.concatenate([c.ids_N[a:b] for a, b, _, _ in _spans(plan, ex)])
      np.testing.assert_array_equal(row["input_ids"][seg],
                                    np.concatenate([[bert_tok.cls_id], text, [bert_tok.sep_id]]))
      assert (row["positions"][seg] == np.arange(seg.sum())).all()
      for key in ROW_KEYS:  # and it is the row this example makes alone
        np.testing.assert_array_equal(row[key][seg], rows.example_row(ex)[key][:seg.sum()])
  unpacked, _ = _rows(c, bert_tok, format="full_sentences")
  print(f"\nfull_sentences packed: {len(plan.len_E)} segments in {plan.num_rows} rows "
        f"(unpacked {unpacked.num_rows}), {(np.diff(plan.ex_ptr_R1) > 1).sum()} rows hold >1")


@pytest.mark.parametrize("fmt", examples.FORMATS)
def test_packed_rows_survive_the_shard_record(demo_corpus, bert_tok, fmt):
  _, rows = _rows(demo_corpus, bert_tok, format=fmt, pack=True)
  for r in _sample(len(rows), 300):
    row = rows[r]
    back = records.decode_row(records.encode_row(row), T, bert_tok.pad_id, with_label=False)
    assert back.keys() == row.keys()
    for key in row:
      assert back[key].dtype == row[key].dtype and np.array_equal(back[key], row[key]), key


def _words(ids, word_starts, special):
  """Whole words of one row, told apart without the masking code: a word starts at a token
  marked as a word start or right after a special (or at position 0), runs over the tokens
  after it that are neither, and never over a special. Returns a word id per token (-1 on
  specials and pads)."""
  out, w = np.full(len(ids), -1), -1
  for t in range(len(ids)):
    if special[t]:
      continue
    if word_starts[t] or t == 0 or special[t - 1]:
      w += 1
    out[t] = w
  return out


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_packed_rows_picks_no_special_and_keeps_words_in_their_segment(
    demo_corpus, bert_tok, whole_word):
  _, rows = _rows(demo_corpus, bert_tok, format="segment_pair", pack=True)
  picked = [row for row in map(rows.__getitem__, _sample(len(rows), 2000))
            if row["segment_ids"].max() >= 2][:64]  # rows that hold several examples
  batch = {k: np.stack([r[k] for r in picked]) for k in picked[0]}
  # Segments of the demo text start at word starts; one cut inside a word (which BERT's
  # front truncation can make) starts after [CLS] without one: make every packed segment
  # after the first start so, and the masking must still end the word before at [SEP] [CLS].
  after_inner_cls = np.zeros_like(batch["mask"])
  after_inner_cls[:, 1:] = (batch["input_ids"][:, :-1] == bert_tok.cls_id) & (
      batch["segment_ids"][:, 1:] > 1)
  batch["word_starts"] = batch["word_starts"] & ~after_inner_cls
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  specials = tuple(bert_tok.special_ids)
  obj = pretraining.ObjectiveConfig(vocab_size=bert_tok.vocab_size, mask_id=bert_tok.mask_id,
                                    special_ids=specials, mask_rate=0.15, max_predictions=20,
                                    whole_word=whole_word)
  corrupt = jax.jit(lambda b, k: pretraining.corrupt(b, k, obj))
  ids, seg = np.asarray(batch["input_ids"]), np.asarray(batch["segment_ids"])
  starts = np.asarray(batch["word_starts"])
  special = np.isin(ids, specials) | ~np.asarray(batch["mask"])
  words = [_words(ids[b], starts[b], special[b]) for b in range(len(ids))]
  # Word pairs a special separates where the second word does not begin with a word start
  # (B cut inside a sentence, a segment cut inside a word): they are still two words.
  pairs = [(b, words[b][t - 1 - np.argmax(~special[b][t - 1::-1])], words[b][t],
            seg[b, t] != seg[b, t - 1 - np.argmax(~special[b][t - 1::-1])])
           for b in range(len(ids)) for t in range(1, ids.shape[1])
           if not special[b, t] and special[b, t - 1] and not starts[b, t]
           and (~special[b, :t]).any()]
  apart = collections.Counter()
  for i in range(64):
    chosen = np.asarray(corrupt(batch, jax.random.key(i)).labels_BxT) != IGNORE_LABEL
    assert chosen.any() and not (chosen & special).any()  # never a [CLS], [SEP] or pad
    if not whole_word:
      continue
    for b in range(len(ids)):
      for w in np.unique(words[b][chosen[b]]):  # whole words only, each inside one segment
        assert chosen[b][words[b] == w].all() and len(np.unique(seg[b][words[b] == w])) == 1
    for j, (b, w0, w1, _) in enumerate(pairs):
      apart[j] += chosen[b][words[b] == w0].any() != chosen[b][words[b] == w1].any()
  if whole_word:
    assert len(picked) == 64 and sum(cross for *_, cross in pairs) >= 64
    assert all(apart[j] > 0 for j in range(len(pairs))), "a word ran across a special"
    print(f"\n{len(pairs)} words cut at a special, "
          f"{sum(cross for *_, cross in pairs)} of them at a segment boundary")


@pytest.fixture(scope="module")
def packed_shard_rows():
  """Rows of the demo corpus built into shards as sentence_pair packed, read back."""
  (folder, _), = shards.prepare_shards("demo", "minilm", examples.ExampleConfig(
      format="sentence_pair", pack=True, max_length=T))
  return shards.ShardedRows([(folder, 1.0)], "validation")


@pytest.mark.parametrize("impl", ["explicit", "xla"])
def test_packed_shard_rows_through_the_model_equal_their_examples_alone(packed_shard_rows,
                                                                        bert_tok, impl):
  """ModernBERT's block (RoPE, windows, GeGLU; small), fp32: each example's vectors in its
  packed row equal those of the example alone in a row of its own; with the segments
  ignored (every example seeing the others: a cross-segment leak) they do not."""
  cfg = ModelConfig(**{**MODERNBERT_BLOCK, "local_window": 16}, vocab_size=bert_tok.vocab_size,
                    hidden_size=32, num_layers=3, num_heads=2, ffn_size=48, attention_impl=impl)
  enc = Encoder(cfg, rngs=nnx.Rngs(0))
  rows = [r for r in map(packed_shard_rows.__getitem__, range(64))
          if r["segment_ids"].max() >= 2][:16]
  assert len(rows) == 16
  batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  alone, spans = [], []
  for b, row in enumerate(rows):
    for k in range(1, row["segment_ids"].max() + 1):
      at = np.flatnonzero(row["segment_ids"] == k)
      alone.append(np.pad(row["input_ids"][at], (0, T - len(at)),
                          constant_values=bert_tok.pad_id))
      spans.append((b, at))
  alone = np.stack(alone)

  def hidden(ids, mask, segment_ids=None, positions=None):
    out = enc(jnp.asarray(ids), jnp.asarray(mask), segment_ids_BxT=segment_ids,
              positions_BxT=positions)
    return np.asarray(out.hidden_BxTxD)

  ref = hidden(alone, alone != bert_tok.pad_id)

  def gap(segment_ids):
    out = hidden(batch["input_ids"], batch["mask"], segment_ids, jnp.asarray(batch["positions"]))
    return max(float(np.abs(out[b, at] - ref[i, :len(at)]).max())
               for i, (b, at) in enumerate(spans))

  packed = gap(jnp.asarray(batch["segment_ids"]))
  print(f"\n{impl}: {len(spans)} examples in {len(rows)} shard rows, packed vs alone {packed:.1e}")
  assert packed < 2e-5
  assert gap(None) > 1e-3  # the leak: segments ignored
