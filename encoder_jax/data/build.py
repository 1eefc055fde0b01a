r"""Build (once) and inspect the pre-training row shards and the demo tasks.

  python -m encoder_jax.data.build                              # demo shards + both tasks
  python -m encoder_jax.data.build --datasets=corpus --format=segment_pair --nsp --show=2
  python -m encoder_jax.data.build --datasets=corpus --source='files:books/*.txt' \
      --vocab=my_vocab.txt
  # at scale: rows built by 16 processes into array_record shards on a bucket
  python -m encoder_jax.data.build --datasets=corpus --build_workers=16 \
      --format=segment_pair --nsp --data_dir=gs://bucket/shards \
      --source='mix:tfds:wikipedia/20230601.en:text@0.75+files:gs://bucket/books/*.txt@0.25'

Prints per source and split the shards, rows, documents and tokens, the build's
rate, the rows' fill and NSP balance, task split sizes and a few decoded rows. The rows are
built for --format, --max_length, --nsp/--sop, --pack and --seed: a training run with the same
values (data.* and seed in its config) reads these shards; other values build their own.
"""
import time

from absl import app, flags, logging
import numpy as np

from encoder_jax.data import builders, examples, shards, tokenizer

_DATASETS = flags.DEFINE_list(
    "datasets", ["corpus", "rotten_tomatoes", "brown_pos"],
    "What to build: 'corpus' (the pre-training row shards), 'rotten_tomatoes' (sentiment, "
    "split by movie), 'brown_pos' (POS tagging, split by document).")
_SOURCE = flags.DEFINE_string(
    "source", "demo", "Corpus text: 'demo' (SOTU + Moby-Dick + Brown), "
    "'files:<glob>[,<glob>][:<field>]' (local or gs://; .txt: one document per file; .jsonl: "
    "one per line, its text in <field>; .gz of either), 'tfds:<name>[/<config>]:<text_field>' "
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
    "blank_line_docs", False, "With files: every blank-line-separated block is a document.")
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
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the example plan.")
_SHOW = flags.DEFINE_integer("show", 1, "Decoded rows to print.")


def _example_config() -> examples.ExampleConfig:
  return examples.ExampleConfig(format=_FORMAT.value, max_length=_MAX_LENGTH.value,
                                nsp=_NSP.value, sop=_SOP.value, pack=_PACK.value,
                                seed=_SEED.value)


def _show(rows, tok):
  rng = np.random.default_rng(_SEED.value)
  for r in rng.choice(len(rows), size=min(_SHOW.value, len(rows)), replace=False):
    row = rows[r]
    n = int(row["mask"].sum())
    label = f" label={int(row['nsp_label'])}" if "nsp_label" in row else ""
    print(f"--- row {r}: {n} tokens, segments {int(row['segment_ids'].max())}{label}")
    print(tok.decode(row["input_ids"][:n]))


def _corpus():
  t = time.time()
  parts = shards.prepare_shards(_SOURCE.value, _VOCAB.value, _example_config(), _DATA_DIR.value,
                                _CACHE_DIR.value, workers=_BUILD_WORKERS.value,
                                docs_per_shard=_SHARD_DOCS.value,
                                blank_line_docs=_BLANK_LINE_DOCS.value,
                                source_data_dir=_SOURCE_DATA_DIR.value)
  print(f"row shards ready in {time.time() - t:.1f} s")
  for folder, weight in parts:
    index = shards.read_index(folder)
    print(f"  {index['source']} (weight {weight}) at {folder}")
    for split, c in index["splits"].items():
      print(f"    {split:10s} {len(c['shards'])} shards, {c['rows']} rows, "
            f"{c['documents']} documents, {c['sentences']} sentences, {c['tokens']} tokens")
    b = index["build"]
    print(f"    built by {b['workers']} workers in {b['seconds']:.1f} s "
          f"({b['tokens_per_s']:.0f} tokens/s; "
          f"{b.get('shards_from_token_cache', 0)} shards from the token cache)")
  rows = shards.ShardedRows(parts, "train")
  print(f"train: {len(rows)} rows per epoch, "
        f"{dict(zip(rows.names, rows.take_S.tolist()))} from each source")
  sample = np.linspace(0, len(rows) - 1, min(len(rows), 20_000)).round().astype(np.int64)
  picked = [rows[int(i)] for i in sample]
  fill = np.mean([r["mask"].mean() for r in picked])
  print(f"  fill {fill:.3f} (real tokens per position, over {len(picked)} evenly spaced rows)")
  if "nsp_label" in picked[0]:
    print(f"  label 1 fraction {np.mean([int(r['nsp_label']) == 1 for r in picked]):.4f}")
  tok = tokenizer.load(builders.resolve_vocab(_VOCAB.value, _CACHE_DIR.value))
  _show(rows, tok)


def _task(name):
  b = builders.prepare_task(name, data_dir=_DATA_DIR.value, cache_dir=_CACHE_DIR.value)
  sizes = {s: b.info.splits[s].num_examples for s in b.info.splits}
  print(f"{name} at {b.data_dir}: {sizes}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  for name in _DATASETS.value:
    if name == "corpus":
      _corpus()
    elif name in builders.TASKS:
      _task(name)
    else:
      raise app.UsageError(f"--datasets: unknown {name!r}; known: corpus, "
                           f"{', '.join(builders.TASKS)}")


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.data.build")
