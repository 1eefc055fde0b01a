"""Building one source's row shards, shared out over hosts: the plan (documents -> shards), the
shard workers, each host's share, and the index that joins the shares.

Plan (ShardPlan). The source's documents stream in a fixed order; each goes to train or
validation by its id (sources.split_of: ~1 in 50 held out), and each split is cut into shards
of `docs_per_shard` documents (the last two share the rest, so none is tiny). A source so small
that the hash holds out no document (or leaves < 2 for training) instead holds out its
documents of smallest id hash: round(n / 50), at least 1, while >= 2 remain to train on; with
fewer than 3 documents nothing can be held out. Either way the build says so in one line
(index["validation_note"]). Whole documents only: no text of a held-out document is in a
training shard. Shards are cut only once both splits have documents, so the fallback can still
move any document (in practice the first ~50 documents wait, never a large part of a corpus).

Hosts. Shard i of the plan (in the order the plan cuts them) is built by host i % num_hosts:
every host reads the whole source (cheap next to sentence splitting and tokenizing, which only
the owner of a shard does) and cuts the same plan, and a shard's rows depend only on its
documents and (seed, split, shard number). So the files are the same, byte for byte, for any
number of hosts. A host writes its shard files, then its share record
(`share-<host>-of-<hosts>.json`: the plan and its shards' counts). The index is written by
whoever finds every share of the build present: the last host to finish (a trainer's processes
also try once more after a barrier; rerunning any host's command does the same). A folder
without `index.json` is never read: a host killed mid-build left no share, and its rerun
builds its shards again.
"""
import collections
from collections.abc import Iterable, Iterator
import dataclasses
import json
import multiprocessing
import os
import time

from absl import logging
from etils import epath
import numpy as np

from encoder_jax import paths
from encoder_jax.data import examples, records, sources, tokenizer

INDEX = "index.json"
SPLITS = ("train", "validation")
PROGRESS_EVERY_S = 30.0  # a build logs its shards, tokens and rate at most this often


# ------------------------------------------------------------------------------------- plan


@dataclasses.dataclass
class ShardPlan:
  """Documents in stream order -> (split, shard number, documents), see the module docstring.
  After `cut` is exhausted: documents (read), shards (per split) and note (None, or the line
  that says how the validation documents were chosen when the hash split could not)."""
  docs_per_shard: int
  source: str = ""
  documents: int = 0
  shards: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
  note: str | None = None

  def cut(self, docs: Iterable[tuple[str, object]]) -> Iterator[tuple[str, int, tuple]]:
    D = self.docs_per_shard
    waiting, seen = [], collections.Counter()  # all documents, until both splits have some
    buffers = None
    for doc in docs:
      self.documents += 1
      split = sources.split_of(doc[0])
      seen[split] += 1
      if buffers is None:
        waiting.append(doc)
        if seen["validation"] < 1 or seen["train"] < 2:
          continue
        buffers = {s: [d for d in waiting if sources.split_of(d[0]) == s] for s in SPLITS}
        waiting = []
      else:
        buffers[split].append(doc)
      for s in SPLITS:
        while len(buffers[s]) >= 2 * D:  # keep one shard back: the last is never tiny
          yield self._shard(s, buffers[s][:D])
          del buffers[s][:D]
    if buffers is None:
      buffers = self._hold_out(waiting, seen)
    for s, b in buffers.items():
      if len(b) > D:
        yield self._shard(s, b[:len(b) // 2])
        yield self._shard(s, b[len(b) // 2:])
      elif b:
        yield self._shard(s, b)

  def _shard(self, split: str, docs: list) -> tuple[str, int, tuple]:
    self.shards[split] += 1
    return split, self.shards[split] - 1, tuple(docs)

  def _hold_out(self, docs: list, seen: collections.Counter) -> dict[str, list]:
    """The split of a source the hash split could not serve: the documents of smallest id
    hash held out (stream order kept), or none when fewer than 3."""
    n, every = len(docs), sources.VALIDATION_EVERY
    more = ("give more documents (more files, or --blank_line_docs / data.blank_line_docs=True "
            "for one document per blank-line-separated block)")
    if n < 3:
      if n:
        self.note = (f"{self.source}: {n} document(s) cannot hold one out for validation (>= 2 "
                     f"must remain for training), so there is no validation split: {more}, or "
                     "train without evaluation (--config.train.eval_steps=0)")
      return {"train": docs, "validation": []}
    k = max(1, round(n / every))
    rank = sorted(range(n), key=lambda i: (sources.id_hash(docs[i][0]), docs[i][0]))
    held = set(rank[:k])
    names = [docs[i][0] for i in sorted(held)]
    shown = ", ".join(names[:3]) + (f" and {k - 3} more" if k > 3 else "")
    self.note = (f"{self.source}: the hash split (1 document in {every} held out) gave "
                 f"{seen['validation']} of its {n} documents to validation, so it holds out "
                 f"the {k} document(s) of smallest id hash instead ({shown}); for another "
                 f"split {more}")
    return {"train": [d for i, d in enumerate(docs) if i not in held],
            "validation": [docs[i] for i in sorted(held)]}


# ----------------------------------------------------------------------------------- shards


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


def save_tokens(path: str, records_: list[dict], empty: int) -> None:
  """A shard's tokenized documents, flat, written atomically (two builds of the same source
  for different example configs may write the same file at once)."""
  n_tok = np.array([len(r["ids"]) for r in records_], np.int64)
  n_sent = np.array([len(r["sentence_lengths"]) for r in records_], np.int64)
  cat = lambda key, dtype: (np.concatenate([np.asarray(r[key], dtype) for r in records_])
                            if records_ else np.zeros(0, dtype))
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  np.savez(tmp, ids=cat("ids", np.int32), word_starts=cat("word_starts", bool),
           sentence_lengths=cat("sentence_lengths", np.int32), n_tok=n_tok, n_sent=n_sent,
           doc_ids=np.array([str(r["doc_id"]) for r in records_], str), empty=np.int64(empty))
  os.replace(tmp, path)


def load_tokens(path: str) -> tuple[list[dict], int] | None:
  """save_tokens's records, or None where the file is missing or unreadable (rebuilt)."""
  try:
    with np.load(path) as z:
      t1 = np.concatenate([[0], np.cumsum(z["n_tok"])])
      s1 = np.concatenate([[0], np.cumsum(z["n_sent"])])
      ids, ws, lens = z["ids"], z["word_starts"], z["sentence_lengths"]
      recs = [{"doc_id": str(d), "ids": ids[t1[i]:t1[i + 1]],
               "word_starts": ws[t1[i]:t1[i + 1]],
               "sentence_lengths": lens[s1[i]:s1[i + 1]]}
              for i, d in enumerate(z["doc_ids"])]
      return recs, int(z["empty"])
  except (OSError, KeyError, ValueError) as e:
    if os.path.exists(path):
      logging.warning("token cache %s unreadable (%s); tokenizing again", path, e)
    return None


def _tokenized(task: _ShardTask, tok: tokenizer.SubwordTokenizer) -> tuple[list[dict], int,
                                                                                bool]:
  """(the shard's tokenized documents, documents without text, read from the cache?)."""
  cached = load_tokens(task.tokens) if task.tokens else None
  if cached is not None:
    return *cached, True
  docs, empty = [], 0
  for doc_id, text in task.docs:
    sents = sources.split_sentences(text) if isinstance(text, str) else tuple(text)
    if sents:
      docs.append(sources.Document(doc_id, sents))
    else:
      empty += 1
  recs = [rec for _, rec in tokenizer.tokenize_documents(docs, tok)]
  empty += len(docs) - len(recs)
  if task.tokens:
    save_tokens(task.tokens, recs, empty)
  return recs, empty, False


def build_shard(task: _ShardTask) -> dict:
  """Worker: documents -> sentences -> ids -> the shard's plan -> rows -> one array_record file.
  Returns counts, the seconds it took and the CPU seconds it used (for tokens/s per worker)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  start, cpu_start = time.perf_counter(), time.process_time()
  tok = tokenizer.load(task.vocab_path, lowercase=task.lowercase)
  recs, empty, from_cache = _tokenized(task, tok)
  counts = {"documents": len(recs), "empty_documents": empty,
            "sentences": sum(len(r["sentence_lengths"]) for r in recs),
            "tokens": sum(len(r["ids"]) for r in recs), "rows": 0,
            "from_token_cache": from_cache}
  writer = array_record_module.ArrayRecordWriter(task.path, "group_size:1")
  try:
    if recs:
      corpus = examples.Corpus.from_records(recs)
      cfg = dataclasses.replace(task.example, seed=shard_seed(task.example.seed, task.split,
                                                              task.shard))
      try:
        plan = examples.make_plan(corpus, cfg, tok.layout)
      except ValueError as e:  # (the config was validated up front: too few / short documents)
        logging.warning("%s: no rows from %d documents: %s", task.path, len(recs), e)
        plan = None
      if plan is not None:
        rows = examples.Rows(corpus, plan, cfg, tok.cls_id, tok.sep_id, tok.pad_id, tok.layout)
        for r in range(len(rows)):
          writer.write(records.encode_row(rows[r]))
        counts["rows"] = len(rows)
  finally:
    writer.close()
  return {"split": task.split, "shard": task.shard, "file": os.path.basename(task.path),
          "pid": os.getpid(), "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu_start, **counts}


class _Runner:
  """Builds shard tasks in this process (workers=0) or in a spawn pool of `workers` processes,
  with at most 2 shards per worker in flight, so the reading process holds a bounded number of
  documents whatever the corpus size. The pool starts with the third shard: a share of one or
  two shards (the demo, a grid's small parts) builds here, without paying for worker processes
  that import the package."""

  def __init__(self, part: str, workers: int):
    if workers > 0 and multiprocessing.current_process().daemon:
      # (a daemonic process, e.g. a benchmark's worker, may not start children)
      logging.info("building %s in this process: a daemonic process cannot start workers", part)
      workers = 0
    self.part, self.workers = part, workers
    self.pool, self.deferred, self.pending, self.done = None, [], collections.deque(), []
    self.start = self.last_log = time.perf_counter()

  def _finished(self, result: dict) -> None:  # a shard is built: progress with its rate, now
    self.done.append(result)                    # and then
    if (now := time.perf_counter()) - self.last_log >= PROGRESS_EVERY_S:
      self.last_log, tokens = now, sum(d["tokens"] for d in self.done)
      logging.info("building %s: %d shards, %d tokens so far (%.0f tokens/s)", self.part,
                   len(self.done), tokens, tokens / max(now - self.start, 1e-9))

  def submit(self, task: _ShardTask) -> None:
    if self.workers == 0:
      self._finished(build_shard(task))
      return
    if self.pool is None and len(self.deferred) < 2:
      self.deferred.append(task)
      return
    if self.pool is None:
      self.pool = multiprocessing.get_context("spawn").Pool(self.workers,
                                                            initializer=_init_worker)
      self.pending.extend(self.pool.apply_async(build_shard, (t,)) for t in self.deferred)
      self.deferred.clear()
    self.pending.append(self.pool.apply_async(build_shard, (task,)))
    while len(self.pending) > 2 * self.workers:
      self._finished(self.pending.popleft().get())

  def drain(self) -> list[dict]:
    for t in self.deferred:
      self._finished(build_shard(t))
    self.deferred.clear()
    while self.pending:
      self._finished(self.pending.popleft().get())
    return self.done

  def close(self) -> None:
    if self.pool is not None:
      self.pool.terminate()
      self.pool.join()


# ------------------------------------------------------------------------- shares and index


def share_name(host: int, hosts: int) -> str:
  return f"share-{host:05d}-of-{hosts:05d}.json"


def _no_document(part: str, stats: sources.ReadStats) -> str:
  read = (f": its {stats.files} file(s) hold no text ({stats.empty_files} empty, "
          f"{stats.empty_documents} empty documents)" if stats.files else "")
  return (f"source {part!r} holds no document{read}; give it text (--source of "
          "encoder_jax.data.build, data.source of a training config)")


def build_share(part: str, documents: Iterable[tuple[str, object]], vocab_path: str,
                example: examples.ExampleConfig, out_dir: str, key: dict, *,
                stats: sources.ReadStats, workers: int = 2,
                docs_per_shard: int = examples.DOCS_PER_SHARD, lowercase: bool = True,
                token_dir: str | None = None, host_index: int = 0,
                num_hosts: int = 1) -> dict:
  """Builds host `host_index`'s shards of one source (`documents`, read into `stats`) into the
  local folder `out_dir`; returns its share record (`write_share`, `finalize`).

  token_dir: a local folder of the source's tokenized shards (one .npz per shard, the same for
  every example config): a build for another format, length or seed reads them instead of
  splitting and tokenizing again. workers=0 builds in this process (tests).
  """
  example.validate()
  if docs_per_shard < 2:
    raise ValueError(f"docs_per_shard={docs_per_shard}: a shard needs >= 2 documents (NSP draws "
                     "negatives from other documents of the shard); use e.g. 1024")
  if not 0 <= host_index < num_hosts:
    raise ValueError(f"host_index={host_index} is not in [0, num_hosts={num_hosts})")
  os.makedirs(out_dir, exist_ok=True)
  if token_dir:
    os.makedirs(token_dir, exist_ok=True)
  start, cpu_start = time.perf_counter(), time.process_time()
  plan, runner = ShardPlan(docs_per_shard, part), _Runner(part, workers)
  try:
    for i, (split, shard, docs) in enumerate(plan.cut(documents)):
      if i % num_hosts == host_index:
        name = f"{split}-{shard:05d}"
        runner.submit(_ShardTask(os.path.join(out_dir, f"{name}.array_record"), split, shard,
                                 docs, vocab_path, lowercase, example,
                                 os.path.join(token_dir, f"{name}.npz") if token_dir else None))
    done = runner.drain()
  finally:
    runner.close()
  if plan.documents == 0:
    raise ValueError(_no_document(part, stats))
  if plan.note:
    logging.warning("%s", plan.note)
  tok = tokenizer.load(vocab_path, lowercase=lowercase)
  return {"host": host_index, "hosts": num_hosts,
          "meta": {**key, "max_length": example.max_length, "pad_id": tok.pad_id,
                   "token_dir": token_dir, "with_label": example.nsp or example.sop},
          "plan": {"documents": plan.documents, "shards": plan.shards,
                   "validation_note": plan.note, "read_stats": dataclasses.asdict(stats)},
          "results": done,
          "build": {"pid": os.getpid(), "workers": runner.workers,
                    "worker_processes_started": runner.pool is not None,
                    "seconds": time.perf_counter() - start,
                    "main_cpu_seconds": time.process_time() - cpu_start}}


def write_share(folder: str, share: dict) -> None:
  """The share record, after the share's shard files are in `folder` (whole or absent)."""
  paths.write_atomic(epath.Path(folder) / share_name(share["host"], share["hosts"]),
                     json.dumps(share))


def _splits(done: list[dict]) -> dict:
  splits = {}
  for split in SPLITS:
    shards = [d for d in done if d["split"] == split]
    splits[split] = {"shards": [{k: d[k] for k in ("file", "rows", "documents", "tokens")}
                                for d in shards],
                     **{k: sum(d[k] for d in shards)
                        for k in ("rows", "documents", "empty_documents", "sentences", "tokens")}}
  return splits


def _build_stats(shares: list[dict], done: list[dict]) -> dict:
  """tokens_per_s: wall clock (the slowest host's); tokens_per_cpu_s: per CPU second a worker
  got, which other jobs on a shared machine do not lower. main_cpu_seconds: the reading and
  dispatching processes (with workers=0, all of the build); pid: host 0's."""
  per_worker = collections.defaultdict(collections.Counter)
  for s in shares:
    for d in s["results"]:
      per_worker[s["host"], d["pid"]].update(tokens=d["tokens"], seconds=d["seconds"],
                                             cpu_seconds=d["cpu_seconds"], shards=1)
  seconds = max(s["build"]["seconds"] for s in shares)
  tokens = sum(d["tokens"] for d in done)
  b0 = shares[0]["build"]
  return {"hosts": len(shares), "pid": b0["pid"], "workers": b0["workers"],
          "worker_processes_started": any(s["build"]["worker_processes_started"]
                                          for s in shares),
          "seconds": seconds, "tokens": tokens,
          "shards_from_token_cache": sum(d["from_token_cache"] for d in done),
          "tokens_per_s": tokens / max(seconds, 1e-9),
          "main_cpu_seconds": sum(s["build"]["main_cpu_seconds"] for s in shares),
          "per_host": [{"host": s["host"], "pid": s["build"]["pid"], "shards": len(s["results"]),
                        "tokens": sum(d["tokens"] for d in s["results"]),
                        "seconds": s["build"]["seconds"]} for s in shares],
          "per_worker": [{"host": h, "tokens_per_s": w["tokens"] / max(w["seconds"], 1e-9),
                          "tokens_per_cpu_s": w["tokens"] / max(w["cpu_seconds"], 1e-9), **w}
                         for (h, _), w in per_worker.items()]}


def _read_shares(folder: str, num_hosts: int) -> list[dict] | None:
  shares = []
  for h in range(num_hosts):
    path = epath.Path(folder) / share_name(h, num_hosts)
    if not path.exists():
      return None
    shares.append(json.loads(path.read_text()))
  ignore = lambda meta: {k: v for k, v in meta.items() if k != "token_dir"}
  for s in shares[1:]:
    if s["plan"] != shares[0]["plan"] or ignore(s["meta"]) != ignore(shares[0]["meta"]):
      raise ValueError(f"{folder}: host {s['host']} of {num_hosts} planned its share from other "
                       "documents than host 0 (every host must read the same source); delete "
                       "the folder and build again")
  return shares


def finalize(folder: str, num_hosts: int) -> dict | None:
  """Writes the index of a source built by `num_hosts` hosts once all their shares are in
  `folder` (any host may call it, any number of times); returns it, or None while a share is
  missing."""
  shares = _read_shares(folder, num_hosts)
  if shares is None:
    return None
  meta, plan = shares[0]["meta"], shares[0]["plan"]
  done = sorted((d for s in shares for d in s["results"]),
                key=lambda d: (SPLITS.index(d["split"]), d["shard"]))
  want = [(split, k) for split in SPLITS for k in range(plan["shards"][split])]
  if [(d["split"], d["shard"]) for d in done] != want:
    raise ValueError(f"{folder}: the {num_hosts} shares do not add up to the planned shards "
                     f"{plan['shards']}; delete the folder and build again")
  splits = _splits(done)
  if splits["train"]["rows"] == 0:
    raise ValueError(f"source {meta['source']!r}: no training row from {plan['documents']} "
                     f"documents (too few or too short for format "
                     f"{meta['example']['format']!r}?)")
  index = {**meta, "splits": splits, "read_stats": plan["read_stats"],
           "validation_note": plan["validation_note"], "build": _build_stats(shares, done)}
  paths.write_atomic(epath.Path(folder) / INDEX, json.dumps(index, indent=1))
  b = index["build"]
  logging.info("built %s: %d documents, %d tokens, %d train rows in %d shards, %.1f s "
               "(%.0f tokens/s, %d hosts x %d workers)", meta["source"], plan["documents"],
               b["tokens"], splits["train"]["rows"], len(splits["train"]["shards"]),
               b["seconds"], b["tokens_per_s"], num_hosts, b["workers"])
  return index
