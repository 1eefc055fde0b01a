r"""The sharded corpus at scale: build throughput per worker, and a training process's memory.

  python -m bench.corpus_scale                                # x1, x10, x30; 1 and 2 workers
  python -m bench.corpus_scale --scales=1,10 --workers=1,2,4 --shard_docs=64

A memory / throughput test, not more data: the x10 and x30 corpora repeat the demo corpus's
documents (SOTU + Moby-Dick + Brown, ~3.6M WordPiece tokens) under new document ids, written
as .jsonl files (one document per line, its sentences separated by blank lines) and read
through `files:...:text`, so the workers split sentences and tokenize like on a real corpus.

For each scale and worker count, a fresh process builds the shards (shards.prepare_shards,
segment_pair + NSP rows of T tokens) and reports tokens/s overall and per worker (a worker's
tokens over the seconds it spent on its shards). Then a fresh process, as a training process
would, opens the loader on the built shards (pipeline.pretrain_loader) and reads
the first --batches batches: its peak RSS (getrusage) must not grow with the corpus; the check
is RSS(x_max) <= 1.2 x RSS(x1). The resident size after the imports and after the batches
(VmRSS) is printed too: the peak is set by the imports, so it alone would hide a loader that
grows by less than their transient. Results go to stdout; save them under bench/results/.
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_SCALES = flags.DEFINE_list("scales", ["1", "10", "30"], "Copies of the demo corpus.")
_WORKERS = flags.DEFINE_list("workers", ["1", "2"], "Build worker counts to time per scale.")
_SHARD_DOCS = flags.DEFINE_integer("shard_docs", 64, "Documents per shard.")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 128, "Tokens per row.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Global batch size of the read test.")
_BATCHES = flags.DEFINE_integer("batches", 100, "Batches the read test takes.")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch folder (default: a temporary one, "
                                "removed at the end).")
_CHILD = flags.DEFINE_enum("child", None, ["build", "read"], "Internal: run one step.")
_SOURCE = flags.DEFINE_string("source", None, "Internal: the child's corpus source.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Internal: the child's data_dir.")
_BUILD_WORKERS = flags.DEFINE_integer("build_workers", 1, "Internal: the child's workers.")


def _example():
  from encoder_jax.data import examples  # pylint: disable=g-import-not-at-top
  return examples.ExampleConfig(format="segment_pair", nsp=True, max_length=_MAX_LENGTH.value)


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def _rss_now_mb() -> float:
  """Resident memory now (VmRSS), which unlike the peak is not hidden by the imports' peak."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _child_build():
  from encoder_jax.data import shards  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  (folder, _), = shards.prepare_shards(_SOURCE.value, "minilm", _example(), _DATA_DIR.value,
                                       workers=_BUILD_WORKERS.value,
                                       docs_per_shard=_SHARD_DOCS.value)
  index = shards.read_index(folder)
  print(json.dumps({"seconds": time.perf_counter() - start, "build": index["build"],
                    "rows": index["splits"]["train"]["rows"],
                    "shards": len(index["splits"]["train"]["shards"]),
                    "peak_rss_mb": _peak_rss_mb()}))


def _child_read():
  from encoder_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  import jax  # noqa: F401  # pylint: disable=g-import-not-at-top  # (a trainer has it loaded)
  rss_imports, now_imports = _peak_rss_mb(), _rss_now_mb()
  start = time.perf_counter()
  loader = pipeline.pretrain_loader(_SOURCE.value, "minilm", example=_example(),
                                    global_batch_size=_BATCH.value, data_dir=_DATA_DIR.value,
                                    process_index=0, process_count=1,
                                    shard_docs=_SHARD_DOCS.value)
  opened = time.perf_counter() - start
  it = iter(loader)
  next(it)
  t = time.perf_counter()
  for _ in range(_BATCHES.value - 1):
    next(it)
  dt = time.perf_counter() - t
  print(json.dumps({"rows": len(loader.rows), "open_s": opened,
                    "batches_per_s": (_BATCHES.value - 1) / dt, "rss_imports_mb": rss_imports,
                    "rss_now_imports_mb": now_imports, "rss_now_mb": _rss_now_mb(),
                    "peak_rss_mb": _peak_rss_mb()}))


def _run_child(mode, source, data_dir, workers=1) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), f"--child={mode}", f"--source={source}",
         f"--data_dir={data_dir}", f"--build_workers={workers}",
         f"--shard_docs={_SHARD_DOCS.value}", f"--max_length={_MAX_LENGTH.value}",
         f"--batch_size={_BATCH.value}", f"--batches={_BATCHES.value}"]
  out = subprocess.run(cmd, check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def _write_copies(folder, n_copies) -> int:
  """The demo corpus's documents, n_copies times, one .jsonl file per copy; returns tokens."""
  from encoder_jax.data import sources  # pylint: disable=g-import-not-at-top
  docs = sources.demo_documents(split=None)
  lines = "".join(json.dumps({"text": "\n\n".join(d.sentences)}) + "\n" for d in docs)
  for c in range(n_copies):
    with open(os.path.join(folder, f"copy_{c:03d}.jsonl"), "w") as f:
      f.write(lines)
  return len(docs)


def main(argv):
  del argv
  if _CHILD.value == "build":
    return _child_build()
  if _CHILD.value == "read":
    return _child_read()
  scales = sorted(int(s) for s in _SCALES.value)
  workers = [int(w) for w in _WORKERS.value]
  print("corpus_scale: a MEMORY / THROUGHPUT test, not more data: x10 and x30 repeat the demo "
        "corpus's documents under new document ids.")
  print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start "
        f"(a shared machine: other jobs may take CPU during the timings)")
  print(f"rows: segment_pair + NSP, T={_MAX_LENGTH.value}; {_SHARD_DOCS.value} documents per "
        f"shard; read test: {_BATCHES.value} batches of {_BATCH.value}")
  work = _WORK_DIR.value or tempfile.mkdtemp(prefix="corpus_scale_")
  text = os.path.join(work, "text")
  os.makedirs(text, exist_ok=True)
  n_docs = _write_copies(text, max(scales))
  rss = {}
  try:
    for k in scales:
      files = ",".join(os.path.join(text, f"copy_{c:03d}.jsonl") for c in range(k))
      source = f"files:{files}:text"
      for w in workers:
        data_dir = os.path.join(work, f"x{k}_w{w}")
        shutil.rmtree(data_dir, ignore_errors=True)
        b = _run_child("build", source, data_dir, w)
        per = sorted(b["build"]["per_worker"], key=lambda p: p["tokens_per_s"])
        wall = ", ".join(f"{p['tokens_per_s']:,.0f}" for p in per)
        cpu = ", ".join(f"{p['tokens_per_cpu_s']:,.0f}" for p in per)
        print(f"x{k:<3d} ({k * n_docs} docs) build, {w} worker(s): {b['build']['tokens']:,} "
              f"tokens in {b['seconds']:.1f} s = {b['build']['tokens_per_s']:,.0f} tokens/s "
              f"total; per worker {wall} tokens/s (per CPU second: {cpu}); main process "
              f"{b['build']['main_cpu_seconds']:.1f} CPU s; {b['rows']:,} train rows in "
              f"{b['shards']} shards; build process peak RSS {b['peak_rss_mb']:.0f} MB",
              flush=True)
      r = _run_child("read", source, data_dir)
      rss[k] = r["peak_rss_mb"]
      print(f"x{k:<3d} read: {r['rows']:,} rows, loader opened in {r['open_s']:.1f} s, "
            f"{r['batches_per_s']:.1f} batches/s; training process peak RSS "
            f"{r['peak_rss_mb']:.0f} MB ({r['rss_imports_mb']:.0f} MB after imports); resident "
            f"{r['rss_now_imports_mb']:.0f} MB after imports, {r['rss_now_mb']:.0f} MB after the "
            "batches",
            flush=True)
      for w in workers:
        shutil.rmtree(os.path.join(work, f"x{k}_w{w}"), ignore_errors=True)
  finally:
    if _WORK_DIR.value is None:
      shutil.rmtree(work, ignore_errors=True)
  lo, hi = min(scales), max(scales)
  ratio = rss[hi] / rss[lo]
  print(f"peak RSS x{hi} / x{lo} = {rss[hi]:.0f} / {rss[lo]:.0f} MB = {ratio:.3f} "
        f"({'PASS' if ratio <= 1.2 else 'FAIL'}: target <= 1.2)")


if __name__ == "__main__":
  app.run(main)
