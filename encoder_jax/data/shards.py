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
  tfds:<name>[/<config>]:<field>       a TFDS dataset prepared as array_record
  mix:<source>@<weight>+<source>@<weight>...
                                       a weighted mixture, e.g. BERT's
                                       `mix:tfds:wikipedia/20230601.en:text@0.75+files:books/*.txt@0.25`

Build (process 0 only; the others wait at a barrier and then only read). Each source of a
mixture is built on its own into <data_dir>/pretrain_shards/<source>-<key>/, keyed by what it
is made of (the files' contents or the TFDS version, the vocab's sha256, the example config,
the shard size, BUILD_VERSION), so changing the weights rebuilds nothing. On a local data_dir
the tokenized documents of each shard are also kept in <data_dir>/pretrain_tokens/ (keyed the
same minus the example config): another format, length or data seed re-plans the rows from
them instead of tokenizing the source again. The main process
streams the source's documents in a fixed order, routes each to train or validation by its
id (sources.split_of), and cuts each split into shards of `docs_per_shard` documents; a pool of
`workers` processes takes whole shards: splits sentences, tokenizes, plans the rows of the shard
(examples.make_plan, seed derived from the example seed and the shard) and writes every row,
materialized, to `<split>-<shard>.array_record`. NSP / SOP negatives therefore come from the
same shard, hence the same source. `index.json` is written last: a folder without it is an
interrupted build and is built again. On a gs:// data_dir the source is built in a local
temporary folder and copied up, the index last.

Row records (encode_row / decode_row): int32 header [n real tokens, k packed examples, label,
id width], the n ids (uint16, or int32 for vocabularies past 65,535), the k example lengths
(uint16), word starts and token types as bit arrays; decoding gives back exactly the fixed-
length dict `examples.Rows` makes (about 2.3 bytes per real token instead of 18 per position).

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
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence

from absl import logging
from etils import epath
import filelock
import numpy as np

from encoder_jax import paths
from encoder_jax.data import builders, examples, sources, tokenizer

BUILD_VERSION = 1  # bump when sentence splitting, tokenization or the record layout changes
INDEX = "index.json"
SPLITS = ("train", "validation")
PROGRESS_EVERY_S = 30.0  # a build logs its shards, tokens and rate at most this often


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
  elif kind == "tfds":
    name, _, field = rest.rpartition(":")
    if not name or not field:
      raise ValueError(f"source {source!r}: expected 'tfds:<name>[/<config>]:<text_field>'")
    yield from sources.tfds_texts(name, field, "train", opts.source_data_dir)
  else:
    raise ValueError(f"unknown corpus source {source!r}; expected 'demo[:<parts>]', "
                     "'files:<glob>[,<glob>][:<jsonl field>]', 'tfds:<name>:<text_field>' or "
                     "'mix:<source>@<weight>+...'")


# ------------------------------------------------------------------------------ row records


_HEADER = 4  # int32: n, k, label, id width in bytes


def encode_row(row: dict[str, np.ndarray]) -> bytes:
  """A row of examples.Rows -> compact bytes (only its n real tokens; see the module doc)."""
  n = int(row["mask"].sum())
  seg = row["segment_ids"][:n]
  k = int(seg.max()) if n else 0
  lens_K = np.bincount(seg, minlength=k + 1)[1:].astype(np.uint16)
  ids = row["input_ids"][:n]
  width = 2 if n == 0 or int(ids.max()) < 1 << 16 else 4
  label = int(row["nsp_label"]) if "nsp_label" in row else -1
  return b"".join([
      np.array([n, k, label, width], np.int32).tobytes(),
      ids.astype(np.uint16 if width == 2 else np.int32).tobytes(),
      lens_K.tobytes(),
      np.packbits(row["word_starts"][:n]).tobytes(),
      np.packbits(row["token_types"][:n].astype(bool)).tobytes()])


def decode_row(data: bytes, max_length: int, pad_id: int,
               with_label: bool) -> dict[str, np.ndarray]:
  """`encode_row`'s bytes -> the fixed-length dict (see examples.Rows)."""
  n, k, label, width = (int(x) for x in np.frombuffer(data, np.int32, _HEADER))
  at = 4 * _HEADER
  ids = np.frombuffer(data, np.uint16 if width == 2 else np.int32, n, at)
  at += n * width
  lens_K = np.frombuffer(data, np.uint16, k, at).astype(np.int64)
  at += 2 * k
  nb = (n + 7) // 8
  word_starts = np.unpackbits(np.frombuffer(data, np.uint8, nb, at), count=n).astype(bool)
  types = np.unpackbits(np.frombuffer(data, np.uint8, nb, at + nb), count=n)
  row = examples.empty_row(max_length, pad_id)
  row["input_ids"][:n] = ids
  row["mask"][:n] = True
  row["token_types"][:n] = types
  row["word_starts"][:n] = word_starts
  starts_K = np.concatenate([[0], np.cumsum(lens_K)[:-1]]).astype(np.int64)
  row["segment_ids"][:n] = np.repeat(np.arange(1, k + 1), lens_K)
  row["positions"][:n] = np.arange(n) - np.repeat(starts_K, lens_K)
  if with_label:
    row["nsp_label"] = np.int32(label)
  return row


# ------------------------------------------------------------------------------------ build


@dataclasses.dataclass(frozen=True)
class _ShardTask:
  path: str          # local .array_record file to write
  split: str
  shard: int
  docs: tuple        # ((doc_id, raw text or sentences), ...)
  vocab_path: str
  lowercase: bool
  example: examples.ExampleConfig
  tokens: str | None = None  # the shard's token cache (.npz), shared by every example config


def shard_seed(seed: int, split: str, shard: int) -> int:
  """The plan seed of one shard: independent draws per shard, fixed by (seed, split, shard)."""
  return int(np.random.SeedSequence([seed, SPLITS.index(split), shard]).generate_state(1)[0])


def _init_worker():
  """One build worker per core: the Rust tokenizer's own thread pool would oversubscribe them
  (and make one worker's tokens/s depend on the cores left idle)."""
  os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _save_tokens(path: str, records: list[dict], empty: int) -> None:
  """A shard's tokenized documents, flat, written atomically (two builds of the same source
  for different example configs may write the same file at once)."""
  n_tok = np.array([len(r["ids"]) for r in records], np.int64)
  n_sent = np.array([len(r["sentence_lengths"]) for r in records], np.int64)
  cat = lambda key, dtype: (np.concatenate([np.asarray(r[key], dtype) for r in records])
                            if records else np.zeros(0, dtype))
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  np.savez(tmp, ids=cat("ids", np.int32), word_starts=cat("word_starts", bool),
           sentence_lengths=cat("sentence_lengths", np.int32), n_tok=n_tok, n_sent=n_sent,
           doc_ids=np.array([str(r["doc_id"]) for r in records], str), empty=np.int64(empty))
  os.replace(tmp, path)


def _load_tokens(path: str) -> tuple[list[dict], int] | None:
  """_save_tokens's records, or None where the file is missing or unreadable (rebuilt)."""
  try:
    with np.load(path) as z:
      t1 = np.concatenate([[0], np.cumsum(z["n_tok"])])
      s1 = np.concatenate([[0], np.cumsum(z["n_sent"])])
      ids, ws, lens = z["ids"], z["word_starts"], z["sentence_lengths"]
      records = [{"doc_id": str(d), "ids": ids[t1[i]:t1[i + 1]],
                  "word_starts": ws[t1[i]:t1[i + 1]],
                  "sentence_lengths": lens[s1[i]:s1[i + 1]]}
                 for i, d in enumerate(z["doc_ids"])]
      return records, int(z["empty"])
  except (OSError, KeyError, ValueError) as e:
    if os.path.exists(path):
      logging.warning("token cache %s unreadable (%s); tokenizing again", path, e)
    return None


def build_shard(task: _ShardTask) -> dict:
  """Worker: documents -> sentences -> ids -> the shard's plan -> rows -> one array_record file.
  Returns counts, the seconds it took and the CPU seconds it used (for tokens/s per worker)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  start, cpu_start = time.perf_counter(), time.process_time()
  tok = tokenizer.load(task.vocab_path, lowercase=task.lowercase)
  cached = _load_tokens(task.tokens) if task.tokens else None
  if cached is None:
    docs, empty = [], 0
    for doc_id, text in task.docs:
      sents = sources.split_sentences(text) if isinstance(text, str) else tuple(text)
      if sents:
        docs.append(sources.Document(doc_id, sents))
      else:
        empty += 1
    records = [rec for _, rec in builders.tokenize_documents(docs, tok)]
    empty += len(docs) - len(records)
    if task.tokens:
      _save_tokens(task.tokens, records, empty)
  else:
    records, empty = cached
  counts = {"documents": len(records), "empty_documents": empty,
            "sentences": sum(len(r["sentence_lengths"]) for r in records),
            "tokens": sum(len(r["ids"]) for r in records), "rows": 0,
            "from_token_cache": cached is not None}
  writer = array_record_module.ArrayRecordWriter(task.path, "group_size:1")
  try:
    if records:
      corpus = examples.Corpus.from_records(records)
      cfg = dataclasses.replace(task.example, seed=shard_seed(task.example.seed, task.split,
                                                              task.shard))
      try:
        plan = examples.make_plan(corpus, cfg, tok.layout)
      except ValueError as e:  # (the config was validated up front: too few / short documents)
        logging.warning("%s: no rows from %d documents: %s", task.path, len(records), e)
        plan = None
      if plan is not None:
        rows = examples.Rows(corpus, plan, cfg, tok.cls_id, tok.sep_id, tok.pad_id, tok.layout)
        for r in range(len(rows)):
          writer.write(encode_row(rows[r]))
        counts["rows"] = len(rows)
  finally:
    writer.close()
  return {"split": task.split, "shard": task.shard, "file": os.path.basename(task.path),
          "pid": os.getpid(), "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu_start, **counts}


def _source_dir(part: str, vocab_path: str, example: examples.ExampleConfig, root: str,
                opts: SourceOptions, docs_per_shard: int, lowercase: bool
                ) -> tuple[str, str, dict]:
  """(the source's build folder, its token cache folder, what the build folder's name hashes).
  The token cache's name hashes the same minus the example config."""
  key = {"version": BUILD_VERSION, "source": part,
         "content": builders.source_key(part, data_dir=root, blank_line_docs=opts.blank_line_docs,
                                        source_data_dir=opts.source_data_dir),
         "vocab_sha256": tokenizer.vocab_digest(vocab_path), "lowercase": lowercase,
         "example": dataclasses.asdict(example), "docs_per_shard": docs_per_shard}
  digest = lambda d: hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]
  name = builders.slug(part)
  tokens = {k: v for k, v in key.items() if k != "example"}
  return (str(epath.Path(root) / "pretrain_shards" / f"{name}-{digest(key)}"),
          str(epath.Path(root) / "pretrain_tokens" / f"{name}-{digest(tokens)}"), key)


def build_source(part: str, vocab_path: str, example: examples.ExampleConfig, out_dir: str,
                 key: dict, *, opts: SourceOptions = SourceOptions(), workers: int = 2,
                 docs_per_shard: int = examples.DOCS_PER_SHARD, lowercase: bool = True,
                 token_dir: str | None = None) -> dict:
  """Builds one source into the local folder `out_dir` (emptied first); returns its index.

  token_dir: a local folder of the source's tokenized shards (one .npz per shard, the same for
  every example config): a build for another format, length or seed reads them instead of
  splitting and tokenizing again (the shards' documents depend only on the source and
  docs_per_shard). None: tokenize.

  workers=0 builds in this process (tests); otherwise a spawn pool of `workers` processes,
  with at most 2 shards per worker in flight, so the main process holds a bounded number of
  documents whatever the corpus size.
  """
  example.validate()
  if docs_per_shard < 2:
    raise ValueError(f"docs_per_shard={docs_per_shard}: a shard needs >= 2 documents (NSP draws "
                     "negatives from other documents of the shard); use e.g. 1024")
  shutil.rmtree(out_dir, ignore_errors=True)
  os.makedirs(out_dir)
  if token_dir:
    os.makedirs(token_dir, exist_ok=True)
  start, cpu_start = time.perf_counter(), time.process_time()
  stats = sources.ReadStats()
  done, pending = [], collections.deque()
  n_shards = dict.fromkeys(SPLITS, 0)
  if workers > 0 and multiprocessing.current_process().daemon:
    # (a daemonic process, e.g. a benchmark's worker, may not start children)
    logging.info("building %s in this process: a daemonic process cannot start workers", part)
    workers = 0
  # The pool starts with the third shard: a source of one or two shards (the demo, a grid's
  # small parts) builds here, without paying for worker processes that import the package.
  pool, deferred = None, []
  last_log = start

  def finished(result: dict) -> None:  # a shard is built: progress with its rate, now and then
    nonlocal last_log
    done.append(result)
    if (now := time.perf_counter()) - last_log >= PROGRESS_EVERY_S:
      last_log, tokens = now, sum(d["tokens"] for d in done)
      logging.info("building %s: %d shards, %d tokens so far (%.0f tokens/s)", part, len(done),
                   tokens, tokens / max(now - start, 1e-9))

  def submit(split, docs):
    name = f"{split}-{n_shards[split]:05d}"
    task = _ShardTask(os.path.join(out_dir, f"{name}.array_record"), split, n_shards[split],
                      tuple(docs), vocab_path, lowercase, example,
                      os.path.join(token_dir, f"{name}.npz") if token_dir else None)
    n_shards[split] += 1
    nonlocal pool
    if workers == 0:
      finished(build_shard(task))
      return
    if pool is None and len(deferred) < 2:
      deferred.append(task)
      return
    if pool is None:
      pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker)
      pending.extend(pool.apply_async(build_shard, (t,)) for t in deferred)
      deferred.clear()
    pending.append(pool.apply_async(build_shard, (task,)))
    while len(pending) > 2 * workers:
      finished(pending.popleft().get())

  try:
    buffers = {s: [] for s in SPLITS}
    n_docs = 0
    for doc_id, text in raw_documents(part, opts, stats):
      n_docs += 1
      b = buffers[sources.split_of(doc_id)]
      b.append((doc_id, text))
      if len(b) >= 2 * docs_per_shard:  # keep one shard back: the last is never tiny
        submit(sources.split_of(doc_id), b[:docs_per_shard])
        del b[:docs_per_shard]
    for split, b in buffers.items():
      if len(b) > docs_per_shard:
        submit(split, b[:len(b) // 2])
        submit(split, b[len(b) // 2:])
      elif b:
        submit(split, b)
    for t in deferred:
      finished(build_shard(t))
    while pending:
      finished(pending.popleft().get())
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()
  if n_docs == 0:
    raise ValueError(f"source {part!r} holds no document; check its files or dataset")
  seconds = time.perf_counter() - start
  splits = {}
  for split in SPLITS:
    shards = sorted((d for d in done if d["split"] == split), key=lambda d: d["shard"])
    splits[split] = {"shards": [{k: d[k] for k in ("file", "rows", "documents", "tokens")}
                                for d in shards],
                     **{k: sum(d[k] for d in shards)
                        for k in ("rows", "documents", "empty_documents", "sentences", "tokens")}}
  if splits["train"]["rows"] == 0:
    raise ValueError(f"source {part!r}: no training row from {n_docs} documents (too few or too "
                     f"short for format {example.format!r}?)")
  per_worker = collections.defaultdict(collections.Counter)
  for d in done:
    per_worker[d["pid"]].update(tokens=d["tokens"], seconds=d["seconds"],
                                cpu_seconds=d["cpu_seconds"], shards=1)
  tokens = sum(s["tokens"] for s in splits.values())
  tok = tokenizer.load(vocab_path, lowercase=lowercase)
  index = {**key, "max_length": example.max_length, "pad_id": tok.pad_id, "token_dir": token_dir,
           "with_label": example.nsp or example.sop, "splits": splits,
           "read_stats": dataclasses.asdict(stats),
           # tokens_per_s: wall clock; tokens_per_cpu_s: per CPU second a worker got, which
           # other jobs on a shared machine do not lower. main_cpu_seconds: the reading and
           # dispatching process (with workers=0, all of the build); pid: that process's.
           "build": {"pid": os.getpid(), "workers": workers,
                     "worker_processes_started": pool is not None, "seconds": seconds,
                     "tokens": tokens,
                     "shards_from_token_cache": sum(d["from_token_cache"] for d in done),
                     "tokens_per_s": tokens / seconds,
                     "main_cpu_seconds": time.process_time() - cpu_start,
                     "per_worker": [{"tokens_per_s": w["tokens"] / max(w["seconds"], 1e-9),
                                     "tokens_per_cpu_s": w["tokens"] / max(w["cpu_seconds"], 1e-9),
                                     **w} for w in per_worker.values()]}}
  paths.write_atomic(os.path.join(out_dir, INDEX), json.dumps(index, indent=1))
  logging.info("built %s: %d documents, %d tokens, %d train rows in %d shards, %.1f s "
               "(%.0f tokens/s, %d workers)", part, n_docs, tokens, splits["train"]["rows"],
               len(splits["train"]["shards"]), seconds, tokens / seconds, workers)
  return index


def tokenized_documents(folder: str, split: str) -> list[dict]:
  """The tokenized documents of a built source's split ({doc_id, ids, word_starts,
  sentence_lengths}, in shard order), from its token cache: for tools and tests that plan rows
  themselves (examples.Corpus.from_records)."""
  index = read_index(folder)
  if index is None or not index.get("token_dir"):
    raise FileNotFoundError(f"{folder}: not built locally with a token cache")
  records = []
  for s in index["splits"][split]["shards"]:
    loaded = _load_tokens(os.path.join(index["token_dir"], s["file"].replace(".array_record",
                                                                             ".npz")))
    if loaded is None:
      raise FileNotFoundError(f"{index['token_dir']}: the token cache of {s['file']} is gone")
    records += loaded[0]
  return records


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

  Process 0 builds (a local data_dir under a file lock; a gs:// one through a local temporary
  folder copied up, index last); every other process waits at a barrier and only reads. With a
  local data_dir and several processes, the folder must be shared by the hosts.
  """
  parts = parse_mixture(source)
  vocab_path = builders.resolve_vocab(vocab, cache_dir)
  root = os.fspath(data_dir or builders.default_data_dir(cache_dir))
  opts = SourceOptions(None if cache_dir is None else str(cache_dir), blank_line_docs,
                       source_data_dir)
  out = []
  for part in parts:
    folder, token_dir, key = _source_dir(part.source, vocab_path, example, root, opts,
                                         docs_per_shard, lowercase)
    if paths.is_primary() and read_index(folder) is None:
      kwargs = dict(opts=opts, workers=workers, docs_per_shard=docs_per_shard,
                    lowercase=lowercase)
      if paths.is_uri(folder):  # (no token cache on a bucket: built once, read many times)
        with tempfile.TemporaryDirectory(prefix="encoder_jax_shards_") as tmp:
          build_source(part.source, vocab_path, example, tmp, key, **kwargs)
          logging.info("copying %s to %s", tmp, folder)
          paths.copy_tree(tmp, folder, last=(INDEX,))
      else:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        with filelock.FileLock(folder + ".lock"):
          if read_index(folder) is None:  # (another process may have built it meanwhile)
            build_source(part.source, vocab_path, example, folder, key, token_dir=token_dir,
                         **kwargs)
    out.append((folder, part.weight))
  paths.sync(f"encoder_jax: shards ready in {root}")
  for folder, _ in out:
    if read_index(folder) is None:
      raise FileNotFoundError(f"{folder} has no {INDEX} after process 0 built it: with several "
                              "hosts the data_dir must be shared by all of them (e.g. gs://)")
  return tuple(out)


# ------------------------------------------------------------------------------------- read


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
    files, n_S, w_S, names, layout = [], [], [], [], set()
    for folder, weight in parts:
      index = read_index(folder)
      if index is None:
        raise FileNotFoundError(f"{folder} has no {INDEX}: not built (or interrupted); build it "
                                "with shards.prepare_shards")
      layout.add((index["max_length"], index["pad_id"], index["with_label"]))
      shards = [s for s in index["splits"][split]["shards"] if s["rows"]]
      n = sum(s["rows"] for s in shards)
      if n == 0:
        logging.warning("%s: no %s rows (a source this small gets ~1 in %d documents there); "
                        "left out of the mixture", folder, split, sources.VALIDATION_EVERY)
        continue
      files += [f"{epath.Path(folder) / s['file']}[0:{s['rows']}]" for s in shards]
      n_S.append(n)
      w_S.append(weight)
      names.append(index["source"])
    if len(layout) > 1:
      raise ValueError(f"the sources {[f for f, _ in parts]} were built with different "
                       f"(max_length, pad_id, labels) {sorted(layout)}; build them alike")
    if not n_S:
      raise ValueError(f"no {split} rows in {[f for f, _ in parts]}")
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
    return decode_row(data, self.max_length, self.pad_id, self.with_label)

  def real_ids(self, indices) -> np.ndarray:
    """The real token ids of rows `indices` (= rows[i]["input_ids"][rows[i]["mask"]] for each,
    concatenated), read in one batch without decoding the rest of the records: what unigram
    counting needs."""
    s, j = self.locate_many(indices)
    out = []
    for data in self._records.__getitems__((self.row_start_S[s] + j).tolist()):
      n, _, _, width = (int(x) for x in np.frombuffer(data, np.int32, _HEADER))
      out.append(np.frombuffer(data, np.uint16 if width == 2 else np.int32, n, 4 * _HEADER))
    return np.concatenate(out) if out else np.zeros(0, np.int32)
