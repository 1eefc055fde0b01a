r"""Input pipeline throughput: tokens/s the grain loader delivers, per format.

  python -m bench.input_pipeline                       # demo corpus, T=128, batch 32
  python -m bench.input_pipeline --max_length=512 --repeats=7 --train_tokens_per_s=6000

Each format is timed `repeats` times, interleaved (A B C A B C ...) so drift of a shared,
noisy machine hits all alike; the median is printed. "real" counts non-pad tokens, "slots"
counts B*T. Also times tokenization (HF tokenizers over the corpus sentences). With
--train_tokens_per_s (the mini train step's consumption, from the trainer's benchmark) it prints
the loader's headroom ratio (target >= 5x).
"""
import statistics
import time

from absl import app, flags
import numpy as np

from encoder_jax.data import examples, pipeline, shards, sources, tokenizer, vocab as vocab_lib

_MAX_LENGTH = flags.DEFINE_integer("max_length", 128, "Tokens per row.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Global batch size (one host).")
_BATCHES = flags.DEFINE_integer("batches", 150, "Batches timed per repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Interleaved repeats per format (median shown).")
_THREADS = flags.DEFINE_integer("read_threads", 2, "grain read threads.")
_WORKERS = flags.DEFINE_integer("worker_count", 0, "grain worker processes (0: threads only).")
_TRAIN_TPS = flags.DEFINE_float("train_tokens_per_s", None, "Tokens/s the train step consumes; "
                                "prints the loader/trainer ratio when given.")

FORMATS = {
    "full_sentences": dict(format="full_sentences"),
    "doc_sentences+pack": dict(format="doc_sentences", pack=True),
    "segment_pair+nsp": dict(format="segment_pair", nsp=True),
    "sentence_pair+pack": dict(format="sentence_pair", pack=True),
}


def _time_loader(rows, n_batches):
  loader = pipeline.Loader(rows, pipeline.LoaderConfig(
      _BATCH.value, seed=int(time.time()) % 1000, read_threads=_THREADS.value,
      worker_count=_WORKERS.value))
  it = iter(loader)
  next(it)  # start-up (threads, first reads) is not throughput
  real = 0
  t = time.perf_counter()
  for _ in range(n_batches):
    real += int(next(it)["mask"].sum())
  dt = time.perf_counter() - t
  return real / dt, n_batches * _BATCH.value * _MAX_LENGTH.value / dt


def demo_rows(cfg: examples.ExampleConfig) -> shards.ShardedRows:
  """The demo corpus's training rows for `cfg`, as the trainer reads them (row shards, built
  once into the cache)."""
  return shards.ShardedRows(shards.prepare_shards("demo", "minilm", cfg), "train")


def main(argv):
  del argv
  tok = tokenizer.load(vocab_lib.resolve_vocab("minilm"))

  sents = [s for d in sources.demo_documents(split="train")[:150] for s in d.sentences]
  t = time.perf_counter()
  ids, _ = tok.encode_batch_np(sents)
  tok_tps = len(ids) / (time.perf_counter() - t)
  print(f"tokenization: {tok_tps:,.0f} tokens/s ({len(ids):,} tokens, {len(sents):,} sentences)")

  rows = {}
  for name, kw in FORMATS.items():
    cfg = examples.ExampleConfig(max_length=_MAX_LENGTH.value, **kw)
    t = time.perf_counter()
    rows[name] = demo_rows(cfg)
    print(f"shards {name:20s} {len(rows[name]):7,d} rows, ready in "
          f"{time.perf_counter() - t:.2f} s (built once, then read from the cache)")

  results = {name: [] for name in FORMATS}
  for _ in range(_REPEATS.value):
    for name in FORMATS:
      results[name].append(_time_loader(rows[name], _BATCHES.value))
  print(f"\nloader, batch {_BATCH.value} x {_MAX_LENGTH.value}, {_THREADS.value} read threads, "
        f"{_WORKERS.value} workers, median of {_REPEATS.value} interleaved repeats:")
  for name, runs in results.items():
    real = statistics.median(r[0] for r in runs)
    slots = statistics.median(r[1] for r in runs)
    spread = (max(r[0] for r in runs) - min(r[0] for r in runs)) / real
    line = f"  {name:20s} {real:12,.0f} real tokens/s {slots:12,.0f} slots/s (spread {spread:.0%})"
    if _TRAIN_TPS.value:
      line += f"  {slots / _TRAIN_TPS.value:6.1f}x the train step"
    print(line)
  all_slots = np.median([r[1] for runs in results.values() for r in runs])
  print(f"median over formats: {all_slots:,.0f} slots/s")


if __name__ == "__main__":
  app.run(main)
