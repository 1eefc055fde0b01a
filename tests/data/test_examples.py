"""Format invariants over the demo corpus (>= 10k examples each): labels, provenance, layout."""
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.data import examples

T = 128


def _plan(corpus, **kw):
  cfg = examples.ExampleConfig(max_length=kw.pop("max_length", T), **kw)
  return cfg, examples.make_plan(corpus, cfg)


def _pieces(plan, e):
  return [(int(plan.start_P[q]), int(plan.end_P[q]), int(plan.seg_P[q]))
          for q in range(plan.piece_ptr_E1[e], plan.piece_ptr_E1[e + 1])]


def _ab(plan):
  """Per example: (A start, A end, B start, B end) for the pair formats (one piece each)."""
  assert (np.diff(plan.piece_ptr_E1) == 2).all()
  s, e = plan.start_P.reshape(-1, 2), plan.end_P.reshape(-1, 2)
  assert (plan.seg_P.reshape(-1, 2) == [0, 1]).all()
  return s[:, 0], e[:, 0], s[:, 1], e[:, 1]


@pytest.mark.parametrize("fmt", ["segment_pair", "sentence_pair"])
def test_nsp_labels_and_provenance(demo_corpus, fmt):
  c = demo_corpus
  _, plan = _plan(c, format=fmt, nsp=True)
  labels = plan.label_E
  assert len(labels) >= 10_000 and set(np.unique(labels)) == {0, 1}
  assert abs(labels.mean() - 0.5) <= 0.02, labels.mean()
  a0, a1, b0, b1 = _ab(plan)
  assert (a1 > a0).all() and (b1 > b0).all()
  doc_a, doc_a_end = c.doc_of_token(a0), c.doc_of_token(a1 - 1)
  doc_b, doc_b_end = c.doc_of_token(b0), c.doc_of_token(b1 - 1)
  assert (doc_a == doc_a_end).all() and (doc_b == doc_b_end).all()
  rand = labels == 1
  assert (doc_b[rand] != doc_a[rand]).all()          # random next: always another document
  assert (doc_b[~rand] == doc_a[~rand]).all()        # true next: same document, after A
  assert (b0[~rand] >= a1[~rand]).all()
  print(f"\n{fmt}+NSP: {len(labels)} examples, {labels.mean():.4f} random")


@pytest.mark.parametrize("fmt", ["segment_pair", "sentence_pair"])
def test_sop(demo_corpus, fmt):
  c = demo_corpus
  _, plan = _plan(c, format=fmt, sop=True)
  labels = plan.label_E
  assert len(labels) >= 10_000 and abs(labels.mean() - 0.5) <= 0.02
  a0, a1, b0, b1 = _ab(plan)
  assert (c.doc_of_token(a0) == c.doc_of_token(b0)).all()
  assert (b0[labels == 0] >= a1[labels == 0]).all() and (a0[labels == 1] >= b1[labels == 1]).all()


@pytest.mark.parametrize("fmt", ["full_sentences", "doc_sentences"])
def test_contiguous_formats_cover_corpus_once(demo_corpus, fmt):
  c = demo_corpus
  _, plan = _plan(c, format=fmt)
  assert len(plan.len_E) >= 10_000
  order = np.argsort(plan.start_P)
  s, e = plan.start_P[order], plan.end_P[order]
  assert s[0] == 0 and e[-1] == c.num_tokens and (s[1:] == e[:-1]).all()  # no gap, no overlap
  example_of_piece = np.repeat(np.arange(len(plan.len_E)), np.diff(plan.piece_ptr_E1))
  doc_first = c.doc_of_token(plan.start_P)
  doc_last = c.doc_of_token(plan.end_P - 1)
  assert (doc_first == doc_last).all()  # a piece never spans two documents
  first_doc_of_example = doc_first[plan.piece_ptr_E1[:-1]][example_of_piece]
  crosses = doc_first != first_doc_of_example
  if fmt == "doc_sentences":
    assert not crosses.any() and not plan.sep_before_P.any()
  else:  # an extra [SEP] exactly where a row moves on to the next document
    assert crosses.any() and (plan.sep_before_P == (doc_first != np.roll(doc_first, 1)) &
                              (plan.piece_ptr_E1[example_of_piece] != np.arange(len(s)))).all()


def _check_row_layout(row, tok, n_segments_per_example, T):
  ids, types, seg, pos = row["input_ids"], row["token_types"], row["segment_ids"], row["positions"]
  n = int(row["mask"].sum())
  assert ids.shape == (T,) and n <= T and row["mask"][:n].all() and not row["mask"][n:].any()
  assert (ids[n:] == tok.pad_id).all() and not types[n:].any() and not seg[n:].any()
  assert not pos[n:].any() and not row["word_starts"][n:].any()
  special = np.isin(ids, [tok.cls_id, tok.sep_id, tok.pad_id])
  assert not row["word_starts"][special].any()
  for k in range(1, seg.max() + 1):
    idx = np.flatnonzero(seg == k)
    assert (np.diff(idx) == 1).all()
    x, t = ids[idx], types[idx]
    assert x[0] == tok.cls_id and (x[1:] != tok.cls_id).all() and x[-1] == tok.sep_id
    assert (pos[idx] == np.arange(len(idx))).all()
    seps = np.flatnonzero(x == tok.sep_id)
    if tok.layout == "roberta":  # <s> A </s></s> B </s>, no token types
      assert not t.any()
      if n_segments_per_example == 2:
        assert len(seps) == 3 and seps[1] == seps[0] + 1 and seps[0] > 1 and seps[2] > seps[1] + 1
    elif n_segments_per_example == 2:
      assert len(seps) == 2 and not t[:seps[0] + 1].any() and t[seps[0] + 1:].all()
    else:
      assert not t.any()


@pytest.mark.parametrize("fmt,kw,max_length", [
    ("segment_pair", {"nsp": True}, 128), ("segment_pair", {"nsp": True}, 512),
    ("sentence_pair", {"nsp": True}, 128), ("full_sentences", {}, 128),
    ("doc_sentences", {}, 128), ("doc_sentences", {"pack": True}, 128),
    ("sentence_pair", {"pack": True}, 128)])
def test_rows_layout(demo_corpus, bert_tok, fmt, kw, max_length):
  cfg, plan = _plan(demo_corpus, format=fmt, max_length=max_length, **kw)
  assert (plan.len_E <= max_length).all()
  rows = examples.Rows(demo_corpus, plan, cfg, bert_tok.cls_id, bert_tok.sep_id, bert_tok.pad_id)
  check = range(0, len(rows), max(1, len(rows) // 2000))
  pair = fmt.endswith("_pair")
  for r in check:
    row = rows[r]
    _check_row_layout(row, bert_tok, 2 if pair else 1, max_length)
    if fmt == "full_sentences":  # separators: final one + one per document change
      assert (row["input_ids"] == bert_tok.sep_id).sum() == 1 + plan.sep_before_P[
          plan.piece_ptr_E1[r]:plan.piece_ptr_E1[r + 1]].sum()
    if kw.get("nsp"):
      assert row["nsp_label"] == plan.label_E[r]
  if kw.get("pack"):
    n_examples = np.diff(plan.ex_ptr_R1)
    assert n_examples.max() > 1 and n_examples.sum() == len(plan.len_E)
    used = np.add.reduceat(plan.len_E, plan.ex_ptr_R1[:-1])
    print(f"\n{fmt} packed: {len(plan.len_E)} examples in {len(rows)} rows, "
          f"fill {used.sum() / (len(rows) * max_length):.3f}")


@pytest.mark.parametrize("fmt,kw", [
    ("segment_pair", {"nsp": True}), ("sentence_pair", {"sop": True}), ("full_sentences", {}),
    ("doc_sentences", {"pack": True})])
def test_roberta_rows_layout(bpe_demo_corpus, bpe_tok, fmt, kw):
  """Byte-level BPE rows (the demo corpus tokenized by the demo BPE): `<s> A </s></s> B </s>`
  and no token types in every format; the pair's extra separator is planned for, so the
  longest examples fill the row exactly and none overflows it."""
  c = bpe_demo_corpus
  cfg = examples.ExampleConfig(format=fmt, max_length=T, **kw)
  plan = examples.make_plan(c, cfg, bpe_tok.layout)
  assert (plan.len_E <= T).all() and (fmt == "sentence_pair" or plan.len_E.max() == T)
  rows = examples.Rows(c, plan, cfg, bpe_tok.cls_id, bpe_tok.sep_id, bpe_tok.pad_id,
                       bpe_tok.layout)
  pair = fmt.endswith("_pair")
  for r in range(0, len(rows), max(1, len(rows) // 2000)):
    row = rows[r]
    _check_row_layout(row, bpe_tok, 2 if pair else 1, T)
    n = int(row["mask"].sum())
    assert n == plan.len_E[plan.ex_ptr_R1[r]:plan.ex_ptr_R1[r + 1]].sum()
    assert not np.isin(row["input_ids"][row["word_starts"]], bpe_tok.special_ids).any()
    if kw.get("nsp") or kw.get("sop"):
      assert row["nsp_label"] == plan.label_E[r]


def test_packed_attention_stays_inside_each_example(demo_corpus, bert_tok):
  """The encoder's own mask, built from segment ids, is exactly block-diagonal by example."""
  from encoder_jax.model.attention import make_attention_mask  # pylint: disable=g-import-not-at-top
  cfg, plan = _plan(demo_corpus, format="sentence_pair", pack=True)
  rows = examples.Rows(demo_corpus, plan, cfg, bert_tok.cls_id, bert_tok.sep_id, bert_tok.pad_id)
  batch = [rows[r] for r in range(64)]
  mask_BxT = np.stack([b["mask"] for b in batch])
  seg_BxT = np.stack([b["segment_ids"] for b in batch])
  allowed_BxTxT = np.asarray(make_attention_mask(jnp.asarray(mask_BxT), jnp.asarray(seg_BxT)))[:, 0]
  for b, r in enumerate(range(64)):
    # Token -> example index from the plan alone (independent of segment ids).
    owner = np.full(T, -1)
    at = 0
    for k, e in enumerate(range(plan.ex_ptr_R1[r], plan.ex_ptr_R1[r + 1])):
      owner[at:at + plan.len_E[e]] = k
      at += plan.len_E[e]
    expected = (owner[:, None] == owner[None, :]) & (owner[None, :] >= 0)
    valid_q = owner >= 0
    np.testing.assert_array_equal(allowed_BxTxT[b][valid_q], expected[valid_q])


def test_bad_inputs():
  one_doc = examples.Corpus.from_sentences([[[5, 6, 7], [8, 9]]])
  with pytest.raises(ValueError, match="NSP needs at least 2 documents"):
    examples.make_plan(one_doc, examples.ExampleConfig(format="segment_pair", nsp=True))
  tiny = examples.Corpus.from_sentences([[[5]], [[6]]])  # too short for a pair anywhere
  with pytest.raises(ValueError, match="produced no example"):
    examples.make_plan(tiny, examples.ExampleConfig(format="segment_pair"))
  with pytest.raises(ValueError, match="pack=True with nsp"):
    examples.make_plan(one_doc, examples.ExampleConfig(format="sentence_pair", nsp=True, pack=True))
  with pytest.raises(ValueError, match="need a pair format"):
    examples.make_plan(one_doc, examples.ExampleConfig(format="full_sentences", nsp=True))
  # One huge sentence: cut into full rows, nothing dropped, nothing over max_length.
  huge = examples.Corpus.from_sentences([[list(range(1000, 1000 + 1000))], [[7, 8]]])
  for fmt in ("full_sentences", "doc_sentences"):
    plan = examples.make_plan(huge, examples.ExampleConfig(format=fmt, max_length=64))
    assert (plan.len_E <= 64).all() and (plan.end_P - plan.start_P).sum() == 1002
