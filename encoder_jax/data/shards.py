"""The pre-training corpus, from the demo to a pod: built by N worker processes into
array_record row shards, read row by row (grain), so that no process ever holds the whole
corpus. It is the only pre-training data path: the CPU demo reads the same shards a pod does.

  parts = prepare_shards("mix:tfds:wikipedia/20230601.en:text@0.7+files:books/*.txt@0.3",
                         vocab="minilm", example=ExampleConfig(format="segment_pair", nsp=True),
                         data_dir="gs://bucket/shards", workers=16)
  rows = ShardedRows(parts, "train")   # random access: len(rows), rows[i] -> the dict of Rows
  loader = pipeline.Loader(rows, ...)  # (pipeline.pretrain_loader does this)

Sources (data.source):
  demo[:<part>+...]                    the demo corpus
  files:<glob>[,<glob>...][:<field>]   text files (one document per file, or per blank-line
                                       block with blank_line_docs), `.jsonl` files (one
                                       document per line, its text in <field>), `.gz` of either;
                                       local or gs://
  parquet:<glob>[,<glob>...][:<column>]
                                       parquet files, one document per row (column default
                                       "text"); local or gs:// (tables.py)
  hf:<path or name>[:<config>]:<split>[:<column>]
                                       a Hugging Face `datasets` dataset: a save_to_disk folder,
                                       a folder of data files, or a hub name (tables.py)
  tfds:<name>[/<config>]:<field>       a TFDS dataset prepared as array_record
  mix:<source>@<weight>+<source>@<weight>...
                                       a weighted mixture, e.g. BERT's
                                       `mix:tfds:wikipedia/20230601.en:text@0.75+files:books/*.txt@0.25`

Build (shard_build.py). Each source of a mixture is built on its own into
<data_dir>/pretrain_shards/<source>-<key>/, keyed by what it is made of (the files' contents,
the hf dataset's Arrow files or the TFDS version, the vocab's sha256, the example config, the
shard size, BUILD_VERSION), so changing the weights rebuilds nothing. On a local data_dir the
tokenized documents of each shard are also kept in <data_dir>/pretrain_tokens/ (keyed the same
minus the example config): another format, length or data seed re-plans the rows from them
instead of tokenizing the source again. The reading process streams the source's documents in a
fixed order, routes each to train or validation by its id (whole documents; a source too small
for the hash split holds out its documents of smallest hash, and says so), and cuts each split
into shards of `docs_per_shard` documents; a pool of `workers` processes takes whole shards:
splits sentences, tokenizes, plans the rows of the shard (examples.make_plan, seed derived from
the example seed and the shard) and writes every row, materialized (records.py), to
`<split>-<shard>.array_record`. NSP / SOP negatives therefore come from the same shard, hence
the same source.

Hosts: every host builds its share, shard i going to host i % num_hosts, the files the same
byte for byte for any number of hosts; each host then writes a share record, and the index is
written once all shares are there. `index.json` is always last: a folder without it is an
interrupted build, never read. A trainer's processes do this between two barriers
(prepare_shards); `python -m encoder_jax.data.build --num_hosts=N --host_index=i` runs one
host's share as an independent job (a SLURM array task, a pod worker), the last to finish
writing the index (build_shares). On a gs:// data_dir each host builds in a local temporary
folder and copies its files up, its share record after them.

Mixtures (ShardedRows): source s has n_s rows and weight w_s (normalized). An epoch is the
L = max_s ceil(n_s / w_s) rows in which every source's rows all appear and source s fills
k_s ~= w_s * L of them: the source that is scarcest relative to its weight is read once,
the others are repeated (row j of source s is row j mod n_s). Index -> (source, row) is pure
arithmetic, so the loader's shuffle, host dealing and resume work unchanged.
"""
import collections
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import filelock
import numpy as np

from encoder_jax import paths
from encoder_jax.data import examples, fetch, records, shard_build, sources, tables, tokenizer
from encoder_jax.data.shard_build import INDEX, SPLITS
from encoder_jax.data.vocab import resolve_vocab

# Bump when sentence splitting, tokenization, the record layout or the choice of documents
# changes. 2: a source too small for the hash split holds out its smallest-hash documents.
BUILD_VERSION = 2
# Bump when examples.make_plan makes other rows from the same documents and ExampleConfig (the
# token cache, keyed without it, is kept). 2: full_sentences packed keeps documents apart.
PLAN_VERSION = 2


# ---------------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Part:
  """One source of a mixture and its weight (not normalized)."""
  source: str
  weight: float = 1.0


_PART = re.compile(r"(.+?)@([^@+]*)(?:\+|$)")


def parse_mixture(spec: str) -> tuple[Part, ...]:
  """'mix:<source>@<weight>+...' -> its parts; any other source is one part of weight 1."""
  if not spec.startswith("mix:"):
    return (Part(spec, 1.0),)
  body = spec[len("mix:"):]
  parts, at = [], 0
  for m in _PART.finditer(body):
    if m.start() != at:
      break
    source, weight = m.group(1), m.group(2)
    try:
      w = float(weight)
    except ValueError:
      w = float("nan")
    if not math.isfinite(w) or w <= 0:
      raise ValueError(f"mixture {spec!r}: weight {weight!r} of {source!r} is not a positive "
                       "number; write each part as <source>@<weight>, e.g. "
                       "'mix:files:wiki/*.txt@0.7+files:books/*.txt@0.3'")
    if source.startswith("mix:"):
      raise ValueError(f"mixture {spec!r}: a part cannot be a mixture itself ({source!r})")
    parts.append(Part(source, w))
    at = m.end()
  if not parts or at != len(body):
    raise ValueError(f"mixture {spec!r}: expected 'mix:<source>@<weight>+<source>@<weight>...' "
                     "with a weight after every source, e.g. "
                     "'mix:tfds:wikipedia/20230601.en:text@0.7+files:books/*.txt@0.3'")
  twice = sorted(s for s, n in collections.Counter(p.source for p in parts).items() if n > 1)
  if twice:
    raise ValueError(f"mixture {spec!r} names {twice} more than once; give each source once, "
                     "with the summed weight")
  return tuple(parts)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
  """How a source's text is read."""
  cache_dir: str | None = None
  blank_line_docs: bool = False
  source_data_dir: str | None = None  # tfds: where the source dataset lives


def raw_documents(source: str, opts: SourceOptions,
                  stats: sources.ReadStats) -> Iterator[tuple[str, str | tuple[str, ...]]]:
  """(doc_id, raw text or sentences) of one source, in a fixed order. Raw text is split into
  sentences by the build workers; the demo's sources come split already."""
  kind, _, rest = source.partition(":")
  if kind == "demo":
    parts = tuple(rest.split("+")) if rest else sources.DEMO_PARTS
    for d in sources.demo_documents(opts.cache_dir, split=None, parts=parts):
      yield d.doc_id, d.sentences
  elif kind == "files":
    globs, field = sources.parse_files_spec(rest)
    yield from sources.local_texts(globs, opts.blank_line_docs, field, stats)
  elif kind == "parquet":
    globs, column = tables.parse_parquet_spec(rest)
    yield from tables.parquet_texts(globs, column, stats)
  elif kind == "hf":
    yield from tables.hf_texts(tables.parse_hf_spec(rest), stats)
  elif kind == "tfds":
    name, _, field = rest.rpartition(":")
    if not name or not field:
      raise ValueError(f"source {source!r}: expected 'tfds:<name>[/<config>]:<text_field>'")
    yield from sources.tfds_texts(name, field, "train", opts.source_data_dir)
  else:
    raise ValueError(f"unknown corpus source {source!r}; expected 'demo[:<parts>]', "
                     "'files:<glob>[,<glob>][:<jsonl field>]', 'parquet:<glob>[:<column>]', "
                     f"{tables.HF_FORM}, 'tfds:<name>:<text_field>' or "
                     "'mix:<source>@<weight>+...'")


# ------------------------------------------------------------------------------------ keys


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
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    name = rest.rpartition(":")[0]
    try:
      name = tfds.builder(name, data_dir=source_data_dir).info.full_name
    except Exception:  # pylint: disable=broad-except  # reading it later raises clearly
      pass
    return slug(f"tfds:{name}:{rest.rpartition(':')[2]}")
  return slug(source)


# ------------------------------------------------------------------------------------ build


def _source_dir(part: str, vocab_path: str, example: examples.ExampleConfig, root: str,
                opts: SourceOptions, docs_per_shard: int, lowercase: bool
                ) -> tuple[str, str, dict]:
  """(the source's build folder, its token cache folder, what the build folder's name hashes).
  The token cache's name hashes the same minus the example config."""
  key = {"version": BUILD_VERSION, "source": part,
         "content": source_key(part, data_dir=root, blank_line_docs=opts.blank_line_docs,
                               source_data_dir=opts.source_data_dir),
         "vocab_sha256": tokenizer.vocab_digest(vocab_path), "lowercase": lowercase,
         "example": dataclasses.asdict(example), "plan": PLAN_VERSION,
         "docs_per_shard": docs_per_shard}
  digest = lambda d: hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]
  name = slug(part)
  tokens = {k: v for k, v in key.items() if k not in ("example", "plan")}
  return (str(epath.Path(root) / "pretrain_shards" / f"{name}-{digest(key)}"),
          str(epath.Path(root) / "pretrain_tokens" / f"{name}-{digest(tokens)}"), key)


@dataclasses.dataclass(frozen=True)
class _Build:
  """What every source of one prepare_shards / build_shares call is built with."""
  vocab_path: str
  example: examples.ExampleConfig
  opts: SourceOptions
  workers: int
  docs_per_shard: int
  lowercase: bool
  host_index: int
  num_hosts: int

  def share(self, part: str, out_dir: str, key: dict, token_dir: str | None) -> dict:
    stats = sources.ReadStats()
    return shard_build.build_share(
        part, raw_documents(part, self.opts, stats), self.vocab_path, self.example, out_dir,
        key, stats=stats, workers=self.workers, docs_per_shard=self.docs_per_shard,
        lowercase=self.lowercase, token_dir=token_dir, host_index=self.host_index,
        num_hosts=self.num_hosts)


def _build_local(b: _Build, part: str, folder: str, key: dict, token_dir: str) -> None:
  """This host's share into a local (or shared) folder, under a file lock per share. One host
  alone starts from an empty folder and removes it again if the build fails, so nothing half
  built stays; several hosts only ever overwrite their own shards."""
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  share = os.path.join(folder, shard_build.share_name(b.host_index, b.num_hosts))
  with filelock.FileLock(f"{folder}.{b.host_index}-of-{b.num_hosts}.lock"):
    if read_index(folder) is not None or os.path.exists(share):
      return  # (another process built it meanwhile)
    if b.num_hosts == 1:
      shutil.rmtree(folder, ignore_errors=True)
    try:
      shard_build.write_share(folder, b.share(part, folder, key, token_dir))
    except BaseException:
      if b.num_hosts == 1:
        shutil.rmtree(folder, ignore_errors=True)
      raise


def _build_remote(b: _Build, part: str, folder: str, key: dict) -> None:
  """This host's share onto a bucket: built in a local temporary folder, its shard files
  copied up, then its share record. (No token cache there: built once, read many times.)"""
  if (epath.Path(folder) / shard_build.share_name(b.host_index, b.num_hosts)).exists():
    return
  with tempfile.TemporaryDirectory(prefix="encoder_jax_shards_") as tmp:
    share = b.share(part, tmp, key, None)
    logging.info("copying %s to %s", tmp, folder)
    paths.copy_tree(tmp, folder)
  shard_build.write_share(folder, share)


def build_shares(source: str = "demo", vocab: str = "minilm",
                 example: examples.ExampleConfig = examples.ExampleConfig(), data_dir=None,
                 cache_dir=None, *, host_index: int = 0, num_hosts: int = 1, workers: int = 2,
                 docs_per_shard: int = examples.DOCS_PER_SHARD, blank_line_docs: bool = False,
                 source_data_dir: str | None = None,
                 lowercase: bool = True) -> tuple[tuple[str, float], ...]:
  """Builds host `host_index` of `num_hosts`'s share of every source of `source` (its shards
  i % num_hosts == host_index, shard_build's module docstring), and the index of each source
  whose shares are all present; returns ((folder, weight), ...), indexed or not (read_index).
  With num_hosts > 1 the data_dir must be shared by the hosts (gs://, or a shared disk)."""
  parts = parse_mixture(source)
  vocab_path = resolve_vocab(vocab, cache_dir)
  root = os.fspath(data_dir or fetch.default_data_dir(cache_dir))
  opts = SourceOptions(None if cache_dir is None else str(cache_dir), blank_line_docs,
                       source_data_dir)
  b = _Build(vocab_path, example, opts, workers, docs_per_shard, lowercase, host_index,
             num_hosts)
  out = []
  for part in parts:
    folder, token_dir, key = _source_dir(part.source, vocab_path, example, root, opts,
                                         docs_per_shard, lowercase)
    if read_index(folder) is None:
      if paths.is_uri(folder):
        _build_remote(b, part.source, folder, key)
      else:
        _build_local(b, part.source, folder, key, token_dir)
      if read_index(folder) is None:
        shard_build.finalize(folder, num_hosts)
    out.append((folder, part.weight))
  return tuple(out)


def tokenized_documents(folder: str, split: str) -> list[dict]:
  """The tokenized documents of a built source's split ({doc_id, ids, word_starts,
  sentence_lengths}, in shard order), from its token cache: for tools and tests that plan rows
  themselves (examples.Corpus.from_records)."""
  index = read_index(folder)
  if index is None or not index.get("token_dir"):
    raise FileNotFoundError(f"{folder}: not built locally with a token cache")
  out = []
  for s in index["splits"][split]["shards"]:
    loaded = shard_build.load_tokens(os.path.join(
        index["token_dir"], s["file"].replace(".array_record", ".npz")))
    if loaded is None:
      raise FileNotFoundError(f"{index['token_dir']}: the token cache of {s['file']} is gone")
    out += loaded[0]
  return out


def read_index(folder: str) -> dict | None:
  path = epath.Path(folder) / INDEX
  return json.loads(path.read_text()) if path.exists() else None


def prepare_shards(source: str = "demo", vocab: str = "minilm",
                   example: examples.ExampleConfig = examples.ExampleConfig(), data_dir=None,
                   cache_dir=None, *, workers: int = 2,
                   docs_per_shard: int = examples.DOCS_PER_SHARD, blank_line_docs: bool = False,
                   source_data_dir: str | None = None,
                   lowercase: bool = True) -> tuple[tuple[str, float], ...]:
  """Builds every source of `source` once; returns ((folder, weight), ...) for ShardedRows.

  Every JAX process builds its share (build_shares with its process index and count), then
  they meet at a barrier, process 0 writes any index still missing, and after a second barrier
  every process reads. With several processes the data_dir must be shared by their hosts
  (gs://, or a shared disk).
  """
  import jax  # pylint: disable=g-import-not-at-top
  host, hosts = jax.process_index(), jax.process_count()
  out = build_shares(source, vocab, example, data_dir, cache_dir, host_index=host,
                     num_hosts=hosts, workers=workers, docs_per_shard=docs_per_shard,
                     blank_line_docs=blank_line_docs, source_data_dir=source_data_dir,
                     lowercase=lowercase)
  if hosts > 1:
    paths.sync("encoder_jax: shard shares built")
    for folder, _ in out:
      if host == 0 and read_index(folder) is None:
        shard_build.finalize(folder, hosts)
    paths.sync("encoder_jax: shards ready")
  for folder, _ in out:
    if read_index(folder) is None:
      raise FileNotFoundError(f"{folder} has no {INDEX} after all {hosts} processes built their "
                              "shares: with several hosts the data_dir must be shared by all of "
                              "them (e.g. gs://)")
  return out


# ------------------------------------------------------------------------------------- read


def _no_rows(split: str, folders: list[str], notes: list[str]) -> str:
  """One line: why a split has no rows, and what gives it some."""
  if split == "train":
    return f"no train rows in {folders}"
  why = "; ".join(n for n in notes if n) or (
      f"too few held-out documents (~1 in {sources.VALIDATION_EVERY} go there), or too short "
      "for the row format")
  return (f"no {split} rows in {folders}: {why}. Give the source more documents (more files, "
          "or data.blank_line_docs=True / --blank_line_docs for one document per blank-line "
          "block), or train without evaluation: --config.train.eval_steps=0")


class ShardedRows:
  """Random-access rows of built sources (a grain data source), mixed by weight.

  Nothing is read up front but the indexes: rows[i] reads one record from one shard file
  (grain's ArrayRecordDataSource opens files lazily) and decodes it to the dict examples.Rows
  returns. See the module docstring for the mixture's epoch.
  """

  def __init__(self, parts: Sequence[tuple[str, float]], split: str = "train"):
    import grain  # pylint: disable=g-import-not-at-top
    if split not in SPLITS:
      raise ValueError(f"split={split!r}; expected one of {SPLITS}")
    files, n_S, w_S, names, layout, notes = [], [], [], [], set(), []
    for folder, weight in parts:
      index = read_index(folder)
      if index is None:
        raise FileNotFoundError(f"{folder} has no {INDEX}: not built (or interrupted); build it "
                                "with shards.prepare_shards")
      layout.add((index["max_length"], index["pad_id"], index["with_label"]))
      shards = [s for s in index["splits"][split]["shards"] if s["rows"]]
      n = sum(s["rows"] for s in shards)
      if n == 0:
        notes.append(index.get("validation_note") or "")
        logging.warning("%s: no %s rows; left out of the mixture. %s", folder, split, notes[-1])
        continue
      files += [f"{epath.Path(folder) / s['file']}[0:{s['rows']}]" for s in shards]
      n_S.append(n)
      w_S.append(weight)
      names.append(index["source"])
    if len(layout) > 1:
      raise ValueError(f"the sources {[f for f, _ in parts]} were built with different "
                       f"(max_length, pad_id, labels) {sorted(layout)}; build them alike")
    if not n_S:
      raise ValueError(_no_rows(split, [f for f, _ in parts], notes))
    self.max_length, self.pad_id, self.with_label = layout.pop()
    self.names = tuple(names)
    self.rows_S = np.array(n_S, np.int64)
    self.weights_S = np.array(w_S) / sum(w_S)
    epoch = max(math.ceil(n / w) for n, w in zip(n_S, self.weights_S))
    # Every source's rows at least once per epoch, the others repeated to their weight.
    self.take_S = np.maximum(self.rows_S, np.rint(self.weights_S * epoch).astype(np.int64))
    self.take_start_S1 = np.concatenate([[0], np.cumsum(self.take_S)])
    self.row_start_S = np.concatenate([[0], np.cumsum(self.rows_S)[:-1]])
    self._records = grain.sources.ArrayRecordDataSource(files)
    # What the rows are: their files (a build folder's name hashes its source, vocab and row
    # settings) and the mixture's weights (unigram.row_counts counts such rows once a process).
    self.content_key = (tuple(files), tuple(float(w) for w in self.weights_S))

  def __len__(self) -> int:
    return int(self.take_start_S1[-1])

  def locate_many(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """Indices -> (source of each, row of that source), vectorized."""
    indices = np.asarray(indices, np.int64)
    if indices.size and not (0 <= indices.min() and indices.max() < len(self)):
      raise IndexError(f"rows {indices.min()}..{indices.max()} out of range [0, {len(self)})")
    s = np.searchsorted(self.take_start_S1, indices, side="right") - 1
    return s, (indices - self.take_start_S1[s]) % self.rows_S[s]

  def locate(self, i: int) -> tuple[int, int]:
    """Index -> (source, row of that source)."""
    s, j = self.locate_many([i])
    return int(s[0]), int(j[0])

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    s, j = self.locate(i)
    data = self._records[int(self.row_start_S[s]) + j]
    return records.decode_row(data, self.max_length, self.pad_id, self.with_label)

  def real_ids(self, indices) -> np.ndarray:
    """The real token ids of rows `indices` (= rows[i]["input_ids"][rows[i]["mask"]] for each,
    concatenated), read in one batch without decoding the rest of the records: what unigram
    counting needs."""
    s, j = self.locate_many(indices)
    out = []
    for data in self._records.__getitems__((self.row_start_S[s] + j).tolist()):
      out.append(records.real_ids(data))
    return np.concatenate(out) if out else np.zeros(0, np.int32)
