"""Pre-training rows from a tokenized corpus: BERT / RoBERTa input formats, NSP / SOP, packing.

A *plan* says which token spans of the corpus make each row; it is pure numpy, computed once
from a seed (identically on every host), and a row is only materialized when the loader asks
for it. Formats (RoBERTa, arXiv 1907.11692, Table 2; BERT's create_pretraining_data.py):

  segment_pair   BERT's original: per document, fill a target length (max_length - 3, 4 in
                 RoBERTa's layout, or with probability short_seq_prob a random one in [2, that
                 number]) with whole sentences, cut them at a random sentence boundary into
                 A and B; with NSP, 50% of the time B is instead a run of sentences from
                 another document (label 1; the unused sentences go back to the stream).
                 Longest-first truncation, each removed token from the front or the back with
                 equal chance. One departure: a one-sentence chunk is cut inside the sentence
                 instead of forcing a random B, which keeps the labels at 50% (BERT's rule
                 gives ~55% random here).
  sentence_pair  two natural sentences: consecutive ones (label 0) or the second replaced by a
                 sentence of another document (label 1). Rows are short: pack them or use a
                 bigger batch (RoBERTa did the latter).
  full_sentences contiguous sentences filling the row, crossing documents with an extra [SEP]
                 between them (packed: a segment per document instead, see pack); no NSP.
  doc_sentences  the same but a row never crosses a document (shorter rows at document ends:
                 pack them); no NSP.

  nsp=True       next-sentence labels for the two pair formats (0 = B follows A, 1 = random).
  sop=True       sentence-order labels instead (ALBERT): A, B consecutive, swapped 50% (1 =
                 swapped); a one-sentence chunk is cut inside the sentence.
  pack=True      unpadded packing: several examples share a row, each keeping its own
                 [CLS]..[SEP], with segment id 1..k and positions from 0 (the model keeps
                 attention inside a segment and restarts positions, RoPE's included). Every
                 format packs:
                   doc_sentences, segment_pair, sentence_pair: the unpacked plan's examples,
                     the same ones (the same draws), packed best-fit decreasing; a packed
                     row's segments are exactly those examples' unpacked rows.
                   full_sentences: ModernBERT's / MosaicBERT's packing of documents. Rows are
                     filled in corpus order with whole sentences as unpacked full_sentences
                     fills them, but every document (or the part of it a row holds: its
                     row-sized chunks) is its own segment, [CLS] doc [SEP] [CLS] next doc
                     [SEP], instead of documents meeting inside one segment at an extra
                     [SEP]. A row closes only when the next sentence does not fit, as
                     unpacked (whole sentences leave ~16% of a 128-token row empty on the
                     demo text, ~4.5% at 512; doc_sentences leaves more: 17% / 9% unpacked).
                 With nsp / sop packing is refused (ExampleConfig.validate): the sentence-pair
                 head reads one [CLS] per row, and a packed row would need one label per segment
                 and a head over every segment's [CLS]. BERT and ALBERT, who trained NSP / SOP,
                 did not pack; RoBERTa and ModernBERT, who pack, dropped the sentence task.

Sentences longer than a row are cut into row-sized pieces (full/doc_sentences) or truncated
(pair formats, as BERT), never a crash. Row layout: see `Rows`.

Where the specials go is the tokenizer's `layout` (LAYOUTS), the same in every format:
  bert      [CLS] A [SEP] B [SEP]      token types 0 on [CLS] A [SEP], 1 on B [SEP]
  roberta   <s> A </s></s> B </s>      token types all 0 (RoBERTa has no segment embedding)
A single segment is [CLS] A [SEP] / <s> A </s>; full_sentences' document separator is one
[SEP] / </s>. Below, [CLS] and [SEP] stand for either kind's tokens.
"""
import dataclasses

import numpy as np

FORMATS = ("segment_pair", "sentence_pair", "full_sentences", "doc_sentences")


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a pair row's specials go (see the module docstring)."""
  pair_seps: int  # separators between A and B: BERT's one [SEP], RoBERTa's </s></s>
  typed: bool     # token type 1 on B and its [SEP] (BERT); all 0 otherwise


LAYOUTS = {"bert": Layout(pair_seps=1, typed=True), "roberta": Layout(pair_seps=2, typed=False)}

# Documents per row shard (data/shards.py). Rows are planned per shard, so NSP / SOP negatives
# and cross-document rows come from the same shard's documents.
DOCS_PER_SHARD = 1024


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Documents concatenated as flat arrays: one row shard's documents, as shards.py plans them."""
  ids_N: np.ndarray             # int32 [N]
  word_starts_N: np.ndarray     # bool [N]
  sent_start_S: np.ndarray      # int64 [S]   offset of each sentence in ids_N
  sent_len_S: np.ndarray        # int64 [S]
  doc_sent_start_D1: np.ndarray  # int64 [D+1] sentences of document d: [start[d], start[d+1])
  doc_ids: tuple[str, ...]

  @classmethod
  def from_records(cls, records) -> "Corpus":
    """records: dicts with ids, word_starts, sentence_lengths (and doc_id), one per document."""
    records = [r for r in records if len(r["ids"])]
    if not records:
      raise ValueError("Corpus.from_records: no document with tokens")
    sent_len_S = np.concatenate([np.asarray(r["sentence_lengths"], np.int64) for r in records])
    ids_N = np.concatenate([np.asarray(r["ids"], np.int32) for r in records])
    if sent_len_S.sum() != len(ids_N):
      raise ValueError("sentence_lengths do not add up to the number of ids")
    n_sents = np.array([len(r["sentence_lengths"]) for r in records])
    doc_ids = tuple(r["doc_id"].decode() if isinstance(r.get("doc_id"), bytes)
                    else str(r.get("doc_id", i)) for i, r in enumerate(records))
    return cls(ids_N=ids_N,
               word_starts_N=np.concatenate([np.asarray(r["word_starts"], bool) for r in records]),
               sent_start_S=np.concatenate([[0], np.cumsum(sent_len_S)[:-1]]).astype(np.int64),
               sent_len_S=sent_len_S,
               doc_sent_start_D1=np.concatenate([[0], np.cumsum(n_sents)]).astype(np.int64),
               doc_ids=doc_ids)

  @classmethod
  def from_sentences(cls, docs_ids, word_starts_fn=None) -> "Corpus":
    """docs_ids: per document, a list of sentences, each a list of token ids (for tests)."""
    recs = []
    for i, doc in enumerate(docs_ids):
      ids = np.array([t for s in doc for t in s], np.int32)
      ws = word_starts_fn(ids) if word_starts_fn else np.ones(len(ids), bool)
      recs.append({"doc_id": str(i), "ids": ids, "word_starts": ws,
                   "sentence_lengths": np.array([len(s) for s in doc if len(s)], np.int32)})
    return cls.from_records(recs)

  @property
  def num_docs(self) -> int:
    return len(self.doc_sent_start_D1) - 1

  @property
  def num_sentences(self) -> int:
    return len(self.sent_len_S)

  @property
  def num_tokens(self) -> int:
    return len(self.ids_N)

  def doc_of_token(self, offsets) -> np.ndarray:
    """Document index of token offsets (for checks: which document a span came from)."""
    sent = np.searchsorted(self.sent_start_S, offsets, side="right") - 1
    return np.searchsorted(self.doc_sent_start_D1, sent, side="right") - 1


@dataclasses.dataclass(frozen=True)
class ExampleConfig:
  format: str = "full_sentences"
  max_length: int = 128
  nsp: bool = False
  sop: bool = False
  pack: bool = False
  short_seq_prob: float = 0.1  # segment_pair only (BERT's default)
  dupe_factor: int = 1         # >1: BERT's static duplication, each copy with its own draws
  seed: int = 0

  def validate(self):
    if self.format not in FORMATS:
      raise ValueError(f"format={self.format!r}; expected one of {FORMATS}")
    if self.max_length < 8:
      raise ValueError(f"max_length={self.max_length} is too small (>= 8)")
    pair = self.format in ("segment_pair", "sentence_pair")
    if (self.nsp or self.sop) and not pair:
      raise ValueError(f"nsp/sop need a pair format (segment_pair, sentence_pair), not "
                       f"{self.format!r} (RoBERTa's full/doc_sentences have no NSP)")
    if self.nsp and self.sop:
      raise ValueError("choose nsp or sop, not both")
    if self.pack and (self.nsp or self.sop):
      raise ValueError("pack=True with nsp/sop is refused: the sentence-pair head reads one "
                       "[CLS] and one label per row, a packed row holds several. Use "
                       "pack=False (data.pack=False), or train without the sentence task")
    if self.dupe_factor < 1:
      raise ValueError(f"dupe_factor={self.dupe_factor} must be >= 1")


@dataclasses.dataclass(frozen=True)
class Plan:
  """Examples as token spans. Piece p: corpus tokens [start_P[p], end_P[p]) in segment seg_P[p]
  (0 = A, 1 = B), preceded by an extra [SEP] when sep_before_P[p]. Example e owns pieces
  [piece_ptr_E1[e], piece_ptr_E1[e+1]); row r packs examples [ex_ptr_R1[r], ex_ptr_R1[r+1])."""
  start_P: np.ndarray
  end_P: np.ndarray
  seg_P: np.ndarray
  sep_before_P: np.ndarray
  piece_ptr_E1: np.ndarray
  label_E: np.ndarray   # NSP / SOP label, -1 when the format has none
  len_E: np.ndarray     # tokens of the example with its specials
  ex_ptr_R1: np.ndarray

  @property
  def num_rows(self) -> int:
    return len(self.ex_ptr_R1) - 1


class _Builder:
  """Collects pieces and examples in Python lists (one pass, then numpy)."""

  def __init__(self):
    self.start, self.end, self.seg, self.sep_before, self.ptr, self.label = [], [], [], [], [0], []

  def add(self, pieces, label):
    """pieces: [(start, end, seg, sep_before)] with non-empty spans."""
    for s, e, g, b in pieces:
      self.start.append(s)
      self.end.append(e)
      self.seg.append(g)
      self.sep_before.append(b)
    self.ptr.append(len(self.start))
    self.label.append(label)


def _run(c: Corpus, first_sent: int, n_sents: int):
  """The token span of sentences [first_sent, first_sent + n_sents) (contiguous in ids_N)."""
  s = int(c.sent_start_S[first_sent])
  last = first_sent + n_sents - 1
  return s, int(c.sent_start_S[last] + c.sent_len_S[last])


def _truncate_pair(a, b, max_tokens, rng):
  """BERT's truncate_seq_pair on spans: drop from the longer side, front or back at random."""
  (a0, a1), (b0, b1) = a, b
  la, lb = a1 - a0, b1 - b0
  excess = la + lb - max_tokens
  if excess <= 0:
    return a, b
  # Longest-first one token at a time == trim the longer to the shorter, then alternate.
  cut_a = min(excess, max(0, la - lb))
  cut_b = min(excess - cut_a, max(0, lb - la))
  rest = excess - cut_a - cut_b
  cut_a += (rest + 1) // 2
  cut_b += rest // 2
  front_a, front_b = rng.binomial(cut_a, 0.5), rng.binomial(cut_b, 0.5)
  return (a0 + front_a, a1 - (cut_a - front_a)), (b0 + front_b, b1 - (cut_b - front_b))


def _pair_budget(cfg: "ExampleConfig", layout: Layout) -> int:
  """Corpus tokens a pair row holds: max_length less [CLS], the separators, the final [SEP]."""
  return cfg.max_length - 2 - layout.pair_seps


def _add_pair(out: "_Builder", a, b, label, cfg: "ExampleConfig", layout: Layout, rng):
  """A two-segment example: with SOP, A and B swapped half the time (label 1); truncated."""
  if cfg.sop:
    label = int(rng.random() < 0.5)
    if label:
      a, b = b, a
  a, b = _truncate_pair(a, b, _pair_budget(cfg, layout), rng)
  out.add([(a[0], a[1], 0, False), (b[0], b[1], 1, False)], label)


def _other_doc(rng, d, n_docs):
  o = int(rng.integers(0, n_docs - 1))
  return o + (o >= d)


def _segment_pairs(c: Corpus, cfg: ExampleConfig, layout: Layout, rng, out: _Builder):
  max_tokens = _pair_budget(cfg, layout)
  starts = c.doc_sent_start_D1
  for d in range(c.num_docs):
    first, stop = int(starts[d]), int(starts[d + 1])
    target = max_tokens
    if rng.random() < cfg.short_seq_prob:
      target = int(rng.integers(2, max_tokens + 1))
    chunk_first, chunk_n, chunk_len = first, 0, 0
    i = first
    while i < stop:
      chunk_n += 1
      chunk_len += int(c.sent_len_S[i])
      if i == stop - 1 or chunk_len >= target:
        a_n = 1 if chunk_n < 2 else int(rng.integers(1, chunk_n))
        a = _run(c, chunk_first, a_n)
        label = -1
        # BERT forces a random B whenever the chunk holds a single sentence; on this corpus
        # that skews the labels to ~55% random. The coin decides alone here, and a one-sentence
        # chunk with a true next segment is cut inside the sentence (below).
        if cfg.nsp and rng.random() < 0.5:
          label = 1
          o = _other_doc(rng, d, c.num_docs)
          o_first, o_stop = int(starts[o]), int(starts[o + 1])
          j = int(rng.integers(o_first, o_stop))
          b_target, b_n, b_len = max(1, target - (a[1] - a[0])), 0, 0
          while j + b_n < o_stop and b_len < b_target:
            b_len += int(c.sent_len_S[j + b_n])
            b_n += 1
          b = _run(c, j, b_n)
          i -= chunk_n - a_n  # BERT puts the unused sentences back
        elif chunk_n == 1:  # no boundary to cut at: cut inside the sentence (SOP / no label)
          s, e = a
          if e - s < 2:
            chunk_first, chunk_n, chunk_len = i + 1, 0, 0
            i += 1
            continue
          mid = int(rng.integers(s + 1, e))
          a, b = (s, mid), (mid, e)
          label = 0 if cfg.nsp else -1
        else:
          b = _run(c, chunk_first + a_n, chunk_n - a_n)
          label = 0 if cfg.nsp else -1
        _add_pair(out, a, b, label, cfg, layout, rng)
        chunk_first, chunk_n, chunk_len = i + 1, 0, 0
      i += 1


def _sentence_pairs(c: Corpus, cfg: ExampleConfig, layout: Layout, rng, out: _Builder):
  starts = c.doc_sent_start_D1
  for d in range(c.num_docs):
    first, stop = int(starts[d]), int(starts[d + 1])
    for i in range(first, stop, 2):
      has_next = i + 1 < stop
      a = _run(c, i, 1)
      if cfg.nsp and rng.random() < 0.5:
        o = _other_doc(rng, d, c.num_docs)
        b, label = _run(c, int(rng.integers(starts[o], starts[o + 1])), 1), 1
      elif has_next:
        b, label = _run(c, i + 1, 1), (0 if cfg.nsp else -1)
      else:
        continue  # the last odd sentence has no partner; keeping it would bias the labels
      _add_pair(out, a, b, label, cfg, layout, rng)


def _contiguous(c: Corpus, cfg: ExampleConfig, out: _Builder, cross_docs: bool):
  budget = cfg.max_length - 2  # [CLS] ... [SEP]
  pieces, used = [], 0
  starts = c.doc_sent_start_D1

  def close():
    nonlocal pieces, used
    if pieces:
      out.add(pieces, -1)
    pieces, used = [], 0

  for d in range(c.num_docs):
    if not cross_docs:
      close()
    for i in range(int(starts[d]), int(starts[d + 1])):
      s, e = _run(c, i, 1)
      sep = bool(pieces) and i == starts[d]  # an extra [SEP] where a new document starts
      if used + sep + (e - s) > budget:
        close()
        sep = False
      while e - s > budget:  # a sentence longer than a row: row-sized pieces, nothing dropped
        out.add([(s, s + budget, 0, False)], -1)
        s += budget
      pieces.append((s, e, 0, sep))
      used += sep + (e - s)
  close()


def _documents_packed(c: Corpus, cfg: ExampleConfig, out: _Builder) -> list[list[int]]:
  """full_sentences packed (module docstring): rows in corpus order, a segment per document
  or per row-sized chunk of one. Returns the rows as lists of the example indices it added."""
  T, budget = cfg.max_length, cfg.max_length - 2  # a segment's [CLS] ... [SEP]
  rows, row, pieces, free = [], [], [], T
  starts = c.doc_sent_start_D1

  def close_segment():
    nonlocal pieces
    if pieces:
      row.append(len(out.label))
      out.add(pieces, -1)
      pieces = []

  def close_row():
    nonlocal row, free
    close_segment()
    if row:
      rows.append(row)
    row, free = [], T

  for d in range(c.num_docs):
    close_segment()  # a new document opens a new segment, in this row if it fits
    for i in range(int(starts[d]), int(starts[d + 1])):
      s, e = _run(c, i, 1)
      if e == s:
        continue
      cost = (e - s) + (0 if pieces else 2)
      if cost > free:  # the rest of the document goes on in the next row, a segment again
        close_row()
        while e - s > budget:  # a sentence longer than a row: row-sized pieces of their own
          pieces = [(s, s + budget, 0, False)]
          close_row()
          s += budget
        cost = (e - s) + 2
      pieces.append((s, e, 0, False))
      free -= cost
  close_row()
  return rows


def _example_lengths(piece_ptr_E1, start_P, end_P, seg_P, sep_before_P, layout: Layout):
  tokens_E = np.add.reduceat(end_P - start_P + sep_before_P, piece_ptr_E1[:-1])
  has_b_E = np.maximum.reduceat(seg_P, piece_ptr_E1[:-1])
  return tokens_E + 2 + layout.pair_seps * has_b_E  # [CLS] + final [SEP] (+ separators)


def _pack(len_E: np.ndarray, max_length: int) -> list[list[int]]:
  """Best-fit decreasing: each example (longest first) goes into the open row whose free space
  fits it most tightly. `rows_by_free[f]` holds rows with f tokens free, so a fit is found with
  one vectorized scan instead of a pass over all rows."""
  rows = []
  rows_by_free = [[] for _ in range(max_length + 1)]
  n_by_free = np.zeros(max_length + 1, np.int64)
  for e in np.argsort(-len_E, kind="stable"):
    need = int(len_E[e])
    fits = np.flatnonzero(n_by_free[need:])
    if fits.size:
      f = need + int(fits[0])
      r = rows_by_free[f].pop()
      n_by_free[f] -= 1
      rows[r].append(int(e))
    else:
      r, f = len(rows), max_length
      rows.append([int(e)])
    f -= need
    rows_by_free[f].append(r)
    n_by_free[f] += 1
  # Examples within a row in corpus order; rows in the order of their first example.
  rows = [sorted(r) for r in rows]
  rows.sort(key=lambda r: r[0])
  return rows


def make_plan(c: Corpus, cfg: ExampleConfig, layout: str = "bert") -> Plan:
  """The rows of one pass over the corpus (dupe_factor passes, each with its own draws), for
  the tokenizer's `layout` (a pair's separators count against max_length)."""
  cfg.validate()
  lay = _layout(layout)
  if (cfg.nsp and c.num_docs < 2):
    raise ValueError(f"NSP needs at least 2 documents for random next segments; the corpus has "
                     f"{c.num_docs}")
  out = _Builder()
  doc_rows = []  # full_sentences packed: its rows, planned with its examples
  for k in range(cfg.dupe_factor):
    rng = np.random.default_rng([cfg.seed, k])
    if cfg.format == "segment_pair":
      _segment_pairs(c, cfg, lay, rng, out)
    elif cfg.format == "sentence_pair":
      _sentence_pairs(c, cfg, lay, rng, out)
    elif cfg.format == "full_sentences" and cfg.pack:
      doc_rows += _documents_packed(c, cfg, out)
    else:
      _contiguous(c, cfg, out, cross_docs=cfg.format == "full_sentences")
  if len(out.label) == 0:
    raise ValueError(f"format {cfg.format!r} produced no example from {c.num_docs} documents / "
                     f"{c.num_sentences} sentences (documents too short for a pair?)")
  start_P, end_P = np.array(out.start, np.int64), np.array(out.end, np.int64)
  seg_P, sep_P = np.array(out.seg, np.int64), np.array(out.sep_before, np.int64)
  ptr_E1 = np.array(out.ptr, np.int64)
  len_E = _example_lengths(ptr_E1, start_P, end_P, seg_P, sep_P, lay)
  assert (len_E <= cfg.max_length).all(), "a planned example exceeds max_length"
  if doc_rows:  # (examples already in row order)
    ex_ptr = np.concatenate([[0], np.cumsum([len(r) for r in doc_rows])]).astype(np.int64)
    labels = np.array(out.label, np.int64)
  elif cfg.pack:
    rows = _pack(len_E, cfg.max_length)
    order = np.array([e for r in rows for e in r], np.int64)
    ex_ptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    # Re-order examples so that each row's examples are contiguous.
    n_pieces = np.diff(ptr_E1)
    piece_idx = np.concatenate([np.arange(ptr_E1[e], ptr_E1[e + 1]) for e in order])
    start_P, end_P, seg_P, sep_P = (x[piece_idx] for x in (start_P, end_P, seg_P, sep_P))
    ptr_E1 = np.concatenate([[0], np.cumsum(n_pieces[order])]).astype(np.int64)
    labels, len_E = np.array(out.label, np.int64)[order], len_E[order]
  else:
    ex_ptr = np.arange(len(len_E) + 1, dtype=np.int64)
    labels = np.array(out.label, np.int64)
  return Plan(start_P, end_P, seg_P, sep_P.astype(bool), ptr_E1, labels, len_E, ex_ptr)


def _layout(name: str) -> Layout:
  if name not in LAYOUTS:
    raise ValueError(f"layout={name!r}; expected one of {sorted(LAYOUTS)} (a tokenizer's "
                     "`layout`)")
  return LAYOUTS[name]


def empty_row(T: int, pad_id: int) -> dict[str, np.ndarray]:
  """An all-padding row of the layout `Rows` documents (without nsp_label)."""
  return {"input_ids": np.full(T, pad_id, np.int32), "mask": np.zeros(T, bool),
          "token_types": np.zeros(T, np.int32), "segment_ids": np.zeros(T, np.int32),
          "positions": np.zeros(T, np.int32), "word_starts": np.zeros(T, bool)}


class Rows:
  """Random-access rows of a plan (a grain data source: __len__ and __getitem__).

  Each row is a dict of numpy arrays of length T = max_length:
    input_ids    int32  [CLS] A [SEP] (B [SEP]) per example (<s> A </s>(</s> B </s>) with
                        layout="roberta"), pad_id after
    mask         bool   True on real tokens
    token_types  int32  0 on [CLS], A and its [SEP]; 1 on B and its [SEP]; 0 on pads
                        (layout="roberta": 0 everywhere)
    segment_ids  int32  1..k for the k examples packed in the row, 0 on pads (k = 1 unpacked)
    positions    int32  0, 1, ... restarting at each packed example; 0 on pads
    word_starts  bool   True where a corpus token begins a word; False on specials and pads
    nsp_label    int32  scalar, only with nsp / sop (0 = B follows A / in order)
  """

  def __init__(self, corpus: Corpus, plan: Plan, cfg: ExampleConfig, cls_id: int, sep_id: int,
               pad_id: int, layout: str = "bert"):
    self.corpus, self.plan, self.cfg = corpus, plan, cfg
    self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
    self.layout = _layout(layout)
    self.with_label = cfg.nsp or cfg.sop

  def __len__(self) -> int:
    return self.plan.num_rows

  def _example(self, e):
    """Token ids, types and word starts of example e with its specials."""
    p, c = self.plan, self.corpus
    typed, n_seps = self.layout.typed, self.layout.pair_seps
    ids, types, starts = [[self.cls_id]], [[0]], [[False]]
    cur_seg = 0
    for q in range(p.piece_ptr_E1[e], p.piece_ptr_E1[e + 1]):
      seg = int(p.seg_P[q])
      if seg != cur_seg:  # closing [SEP] of A (RoBERTa: </s></s>)
        ids.append([self.sep_id] * n_seps), types.append([cur_seg * typed] * n_seps)
        starts.append([False] * n_seps)
        cur_seg = seg
      if p.sep_before_P[q]:  # document separator (full_sentences)
        ids.append([self.sep_id]), types.append([seg * typed]), starts.append([False])
      s, t = p.start_P[q], p.end_P[q]
      ids.append(c.ids_N[s:t])
      types.append(np.full(t - s, seg * typed))
      starts.append(c.word_starts_N[s:t])
    ids.append([self.sep_id]), types.append([cur_seg * typed]), starts.append([False])
    return np.concatenate(ids), np.concatenate(types), np.concatenate(starts)

  def _row(self, example_indices) -> dict[str, np.ndarray]:
    """The row holding these examples in this order, segment ids 1..k."""
    row = empty_row(self.cfg.max_length, self.pad_id)
    at = 0
    for k, e in enumerate(example_indices):
      ids, types, starts = self._example(e)
      n = len(ids)
      row["input_ids"][at:at + n] = ids
      row["token_types"][at:at + n] = types
      row["word_starts"][at:at + n] = starts
      row["segment_ids"][at:at + n] = k + 1
      row["positions"][at:at + n] = np.arange(n)
      at += n
    row["mask"][:at] = True
    if self.with_label:
      row["nsp_label"] = np.int32(self.plan.label_E[example_indices[0]])
    return row

  def __getitem__(self, r: int) -> dict[str, np.ndarray]:
    r = int(r)
    if not 0 <= r < len(self):
      raise IndexError(f"row {r} out of range [0, {len(self)})")
    return self._row(range(self.plan.ex_ptr_R1[r], self.plan.ex_ptr_R1[r + 1]))

  def example_row(self, e: int) -> dict[str, np.ndarray]:
    """Example e of the plan alone in a row: the row it makes unpacked (tests, benchmarks)."""
    if not 0 <= int(e) < len(self.plan.len_E):
      raise IndexError(f"example {e} out of range [0, {len(self.plan.len_E)})")
    return self._row([int(e)])
