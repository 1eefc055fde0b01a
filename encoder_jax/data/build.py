r"""Build (once) and inspect the pre-training row shards and the demo tasks.

  python -m encoder_jax.data.build                              # demo shards + both tasks
  python -m encoder_jax.data.build --datasets=corpus --format=segment_pair --nsp --show=2
  python -m encoder_jax.data.build --datasets=corpus --source='files:books/*.txt' \
      --vocab=my_vocab.txt
  python -m encoder_jax.data.build --datasets=corpus --source='parquet:dump/*.parquet:text'
  python -m encoder_jax.data.build --datasets=corpus --source='hf:./my_saved_dataset:train'
  # at scale: rows built by 16 processes into array_record shards on a bucket
  python -m encoder_jax.data.build --datasets=corpus --build_workers=16 \
      --format=segment_pair --nsp --data_dir=gs://bucket/shards \
      --source='mix:tfds:wikipedia/20230601.en:text@0.75+files:gs://bucket/books/*.txt@0.25'
  # spread over 8 hosts, one independent job each (e.g. a SLURM array), into one folder:
  python -m encoder_jax.data.build --datasets=corpus --num_hosts=8 \
      --host_index=$SLURM_ARRAY_TASK_ID --data_dir=gs://bucket/shards ...

Prints per source and split the shards, rows, documents and tokens, the build's
rate, the rows' fill and NSP balance, task split sizes, a few decoded rows, and last the
--config.* flags with which a training run (encoder_jax.main --mode=pretrain) reads exactly
these shards. The rows are built for --format, --max_length, --nsp/--sop, --pack,
--short_seq_prob and --seed; other values build their own.

With --num_hosts=N, job --host_index=i builds the shards i, i+N, i+2N, ... of every source
(the files are the same whatever N: data/shard_build.py) and records its share; the last job
to finish writes the index and prints the summary, the others say which shares they wait for.
A job that died leaves no share: run it again (a finished job's rerun only checks). The task
datasets are built by host 0 alone. Errors print one line (encoder_jax/cli.py).
"""
import shlex
import time

from absl import app, flags, logging
import numpy as np

from encoder_jax.data import examples, shards, tables, tasks, tokenizer
from encoder_jax.data.vocab import resolve_vocab

_DATASETS = flags.DEFINE_list(
    "datasets", ["corpus", "rotten_tomatoes", "brown_pos"],
    "What to build: 'corpus' (the pre-training row shards), 'rotten_tomatoes' (sentiment, "
    "split by movie), 'brown_pos' (POS tagging, split by document).")
_SOURCE = flags.DEFINE_string(
    "source", "demo", "Corpus text: 'demo' (SOTU + Moby-Dick + Brown), "
    "'files:<glob>[,<glob>][:<field>]' (local or gs://; .txt: one document per file; .jsonl: "
    "one per line, its text in <field>; .gz of either), 'parquet:<glob>[:<column>]' (one "
    "document per row, column default 'text'), "
    f"{tables.HF_FORM} (a datasets save_to_disk folder, a folder of data files or a hub name), "
    "'tfds:<name>[/<config>]:<text_field>' "
    "(a TFDS dataset prepared as array_record), or a weighted mixture "
    "'mix:<source>@<weight>+<source>@<weight>...' (e.g. "
    "'mix:tfds:wikipedia/20230601.en:text@0.75+files:books/*.txt@0.25'; NSP negatives are "
    "drawn within a source).")
_BUILD_WORKERS = flags.DEFINE_integer(
    "build_workers", 2, "Processes that split, tokenize and plan shards (0: this process).")
_SHARD_DOCS = flags.DEFINE_integer("shard_docs", examples.DOCS_PER_SHARD,
                                   "Documents per shard (NSP negatives come from the same "
                                   "shard).")
_BLANK_LINE_DOCS = flags.DEFINE_bool(
    "blank_line_docs", False, "With files: every blank-line-separated block is a document "
    "(else one per file). ~1 document in 50 is held out for validation.")
_NUM_HOSTS = flags.DEFINE_integer(
    "num_hosts", 1, "Independent jobs that build the corpus together into one (shared, e.g. "
    "gs://) --data_dir; each builds every num_hosts-th shard.")
_HOST_INDEX = flags.DEFINE_integer(
    "host_index", 0, "This job's share, in [0, --num_hosts) (e.g. $SLURM_ARRAY_TASK_ID).")
_VOCAB = flags.DEFINE_string(
    "vocab", "minilm", "'minilm' (BERT uncased WordPiece, 30,522 tokens, fetched), "
    "'demo[:<size>]' / 'demo-bpe[:<size>]' (WordPiece / byte-level BPE trained on the demo "
    "corpus), a WordPiece vocab.txt, a byte-level BPE vocab.json with merges.txt beside it, or "
    "a folder holding either (e.g. from `python -m encoder_jax.data.train_vocab`).")
_SOURCE_DATA_DIR = flags.DEFINE_string(
    "source_data_dir", None, "With tfds:<name> sources: the TFDS data_dir holding the source "
    "dataset (default: TFDS's own, $TFDS_DATA_DIR or ~/tensorflow_datasets).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Where the row shards and the task datasets are written (default "
    "<cache_dir>/tfds; gs:// works).")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "Artifact cache (default $ENCODER_JAX_CACHE or ~/.cache/encoder_jax).")
_FORMAT = flags.DEFINE_enum(
    "format", "full_sentences", list(examples.FORMATS), "Example format to plan and show "
    "(RoBERTa Table 2; segment_pair is BERT's original).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 128, "Tokens per row, specials included.")
_NSP = flags.DEFINE_bool("nsp", False, "Next-sentence labels (pair formats only).")
_SOP = flags.DEFINE_bool("sop", False, "Sentence-order labels instead of NSP (pair formats).")
_PACK = flags.DEFINE_bool("pack", False, "Pack short examples into full rows (segment ids).")
_SHORT_SEQ_PROB = flags.DEFINE_float(
    "short_seq_prob", examples.ExampleConfig.short_seq_prob,
    "segment_pair: the share of rows with a shorter target length (BERT's 0.1).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the example plan.")
_SHOW = flags.DEFINE_integer("show", 1, "Decoded rows to print.")


def _example_config() -> examples.ExampleConfig:
  return examples.ExampleConfig(format=_FORMAT.value, max_length=_MAX_LENGTH.value,
                                nsp=_NSP.value, sop=_SOP.value, pack=_PACK.value,
                                short_seq_prob=_SHORT_SEQ_PROB.value, seed=_SEED.value)


def _show(rows, tok):
  rng = np.random.default_rng(_SEED.value)
  for r in rng.choice(len(rows), size=min(_SHOW.value, len(rows)), replace=False):
    row = rows[r]
    n = int(row["mask"].sum())
    label = f" label={int(row['nsp_label'])}" if "nsp_label" in row else ""
    print(f"--- row {r}: {n} tokens, segments {int(row['segment_ids'].max())}{label}")
    print(tok.decode(row["input_ids"][:n]))


def training_flags() -> list[str]:
  """The config overrides with which `encoder_jax.main --mode=pretrain` reads the shards these
  flags build (the config's data.* leaves, its sentence task and seed; configs/pretrain.py)."""
  task = "nsp" if _NSP.value else "sop" if _SOP.value else "none"
  values = {"data.source": _SOURCE.value, "data.vocab": _VOCAB.value,
            "data.format": _FORMAT.value, "data.max_length": _MAX_LENGTH.value,
            "data.pack": _PACK.value, "data.short_seq_prob": _SHORT_SEQ_PROB.value,
            "data.shard_docs": _SHARD_DOCS.value, "data.blank_line_docs": _BLANK_LINE_DOCS.value,
            "data.data_dir": _DATA_DIR.value or "", "data.cache_dir": _CACHE_DIR.value or "",
            "data.source_data_dir": _SOURCE_DATA_DIR.value or "",
            "objective.sentence_task": task, "seed": _SEED.value}
  return [f"--config.{k}={shlex.quote(str(v))}" for k, v in values.items()
          if v != "" or k == "data.source"]


def _print_index(folder: str, weight: float) -> None:
  index = shards.read_index(folder)
  print(f"  {index['source']} (weight {weight}) at {folder}")
  for split, c in index["splits"].items():
    print(f"    {split:10s} {len(c['shards'])} shards, {c['rows']} rows, "
          f"{c['documents']} documents, {c['sentences']} sentences, {c['tokens']} tokens")
  if index.get("validation_note"):
    print(f"    note: {index['validation_note']}")
  b = index["build"]
  print(f"    built by {b.get('hosts', 1)} host(s) x {b['workers']} workers in "
        f"{b['seconds']:.1f} s ({b['tokens_per_s']:.0f} tokens/s; "
        f"{b.get('shards_from_token_cache', 0)} shards from the token cache)")


def _print_rows(parts) -> None:
  rows = shards.ShardedRows(parts, "train")
  print(f"train: {len(rows)} rows per epoch, "
        f"{dict(zip(rows.names, rows.take_S.tolist()))} from each source")
  sample = np.linspace(0, len(rows) - 1, min(len(rows), 20_000)).round().astype(np.int64)
  picked = [rows[int(i)] for i in sample]
  fill = np.mean([r["mask"].mean() for r in picked])
  print(f"  fill {fill:.3f} (real tokens per position, over {len(picked)} evenly spaced rows)")
  if "nsp_label" in picked[0]:
    print(f"  label 1 fraction {np.mean([int(r['nsp_label']) == 1 for r in picked]):.4f}")
  tok = tokenizer.load(resolve_vocab(_VOCAB.value, _CACHE_DIR.value))
  _show(rows, tok)


def _corpus():
  t = time.time()
  host, hosts = _HOST_INDEX.value, _NUM_HOSTS.value
  if not 0 <= host < hosts:
    raise app.UsageError(f"--host_index={host} is not in [0, --num_hosts={hosts})")
  parts = shards.build_shares(_SOURCE.value, _VOCAB.value, _example_config(), _DATA_DIR.value,
                              _CACHE_DIR.value, host_index=host, num_hosts=hosts,
                              workers=_BUILD_WORKERS.value, docs_per_shard=_SHARD_DOCS.value,
                              blank_line_docs=_BLANK_LINE_DOCS.value,
                              source_data_dir=_SOURCE_DATA_DIR.value)
  waiting = [f for f, _ in parts if shards.read_index(f) is None]
  if waiting:
    print(f"host {host} of {hosts}: built its share in {time.time() - t:.1f} s; {waiting} "
          "get their index from the last host to finish (rerun any host's command once all "
          "are done to write it)")
    return
  print(f"row shards ready in {time.time() - t:.1f} s")
  for folder, weight in parts:
    _print_index(folder, weight)
  _print_rows(parts)
  print("train on these shards with (encoder_jax.main --mode=pretrain --config=...):")
  print("  " + " ".join(training_flags()))


def _task(name):
  b = tasks.prepare_task(name, data_dir=_DATA_DIR.value, cache_dir=_CACHE_DIR.value)
  sizes = {s: b.info.splits[s].num_examples for s in b.info.splits}
  print(f"{name} at {b.data_dir}: {sizes}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  unknown = [n for n in _DATASETS.value if n != "corpus" and n not in tasks.TASKS]
  if unknown:
    raise app.UsageError(f"--datasets: unknown {unknown}; known: corpus, "
                         f"{', '.join(tasks.TASKS)}")
  for name in _DATASETS.value:
    if name == "corpus":
      _corpus()
    elif _HOST_INDEX.value == 0:  # (one job builds a task: they are small)
      _task(name)


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.data.build")
