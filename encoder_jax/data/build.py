r"""Build (once) and inspect the tokenized pre-training corpus and the demo tasks.

  python -m encoder_jax.data.build                              # demo corpus + both tasks
  python -m encoder_jax.data.build --datasets=corpus --format=segment_pair --nsp --show=2
  python -m encoder_jax.data.build --datasets=corpus --source='files:books/*.txt' \
      --vocab=my_vocab.txt
  python -m encoder_jax.data.build --datasets=corpus --source=tfds:wikipedia/20230601.en:text
  # at scale: rows built by 16 processes into array_record shards (data/shards.py)
  python -m encoder_jax.data.build --datasets=corpus --sharded --build_workers=16 \
      --format=segment_pair --nsp --data_dir=gs://bucket/shards \
      --source='mix:tfds:wikipedia/20230601.en:text@0.75+files:gs://bucket/books/*.txt@0.25'

Prints counts (documents, sentences, WordPiece tokens per split), task split sizes, the rows a
format makes from the corpus (fill, NSP balance) and a few decoded rows. With --sharded the
rows are those of the shards (built for --format etc. and --seed; train with the same values).
"""
import time

from absl import app, flags, logging
import numpy as np

from encoder_jax.data import builders, examples, shards, tokenizer

_DATASETS = flags.DEFINE_list(
    "datasets", ["corpus", "rotten_tomatoes", "brown_pos"],
    "What to build: 'corpus' (pre-training text, tokenized), 'rotten_tomatoes' (sentiment, "
    "split by movie), 'brown_pos' (POS tagging, split by document).")
_SOURCE = flags.DEFINE_string(
    "source", "demo", "Corpus text: 'demo' (SOTU + Moby-Dick + Brown), "
    "'files:<glob>[,<glob>][:<field>]' (local or gs://; .txt: one document per file; .jsonl: "
    "one per line, its text in <field>; .gz of either), 'tfds:<name>[/<config>]:<text_field>' "
    "(a TFDS dataset prepared as array_record), or with --sharded a weighted mixture "
    "'mix:<source>@<weight>+<source>@<weight>...' (e.g. "
    "'mix:tfds:wikipedia/20230601.en:text@0.75+files:books/*.txt@0.25'; NSP negatives are "
    "drawn within a source).")
_SHARDED = flags.DEFINE_bool(
    "sharded", False, "Build the rows into array_record shards with --build_workers processes "
    "(data.sharded=True in a config) instead of the TFDS document corpus.")
_BUILD_WORKERS = flags.DEFINE_integer("build_workers", 2, "With --sharded: build processes.")
_SHARD_DOCS = flags.DEFINE_integer("shard_docs", 1024,
                                   "With --sharded: documents per shard (NSP negatives come "
                                   "from the same shard).")
_BLANK_LINE_DOCS = flags.DEFINE_bool(
    "blank_line_docs", False, "With files: every blank-line-separated block is a document.")
_VOCAB = flags.DEFINE_string(
    "vocab", "minilm", "'minilm' (BERT uncased, 30,522 tokens, fetched) or a vocab.txt path "
    "(e.g. from `python -m encoder_jax.data.train_vocab`).")
_SOURCE_DATA_DIR = flags.DEFINE_string(
    "source_data_dir", None, "With tfds:<name> sources: the TFDS data_dir holding the source "
    "dataset (default: TFDS's own, $TFDS_DATA_DIR or ~/tensorflow_datasets).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Where TFDS writes array_record files (default <cache_dir>/tfds).")
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


def _sharded_corpus():
  t = time.time()
  parts = shards.prepare_shards(_SOURCE.value, _VOCAB.value, _example_config(), _DATA_DIR.value,
                                _CACHE_DIR.value, workers=_BUILD_WORKERS.value,
                                docs_per_shard=_SHARD_DOCS.value,
                                blank_line_docs=_BLANK_LINE_DOCS.value,
                                source_data_dir=_SOURCE_DATA_DIR.value)
  print(f"sharded corpus ready in {time.time() - t:.1f} s")
  for folder, weight in parts:
    index = shards.read_index(folder)
    print(f"  {index['source']} (weight {weight}) at {folder}")
    for split, c in index["splits"].items():
      print(f"    {split:10s} {len(c['shards'])} shards, {c['rows']} rows, "
            f"{c['documents']} documents, {c['tokens']} tokens")
    b = index["build"]
    print(f"    built by {b['workers']} workers in {b['seconds']:.1f} s "
          f"({b['tokens_per_s']:.0f} tokens/s)")
  rows = shards.ShardedRows(parts, "train")
  print(f"train: {len(rows)} rows per epoch, "
        f"{dict(zip(rows.names, rows.take_S.tolist()))} from each source")
  tok = tokenizer.WordPieceTokenizer.load(builders.resolve_vocab(_VOCAB.value, _CACHE_DIR.value))
  _show(rows, tok)


def _corpus():
  t = time.time()
  b = builders.prepare_corpus(_SOURCE.value, _VOCAB.value, data_dir=_DATA_DIR.value,
                              cache_dir=_CACHE_DIR.value, blank_line_docs=_BLANK_LINE_DOCS.value,
                              source_data_dir=_SOURCE_DATA_DIR.value)
  print(f"corpus {b.builder_config.name} at {b.data_dir} (ready in {time.time() - t:.1f} s)")
  for split in b.info.splits:
    print(f"  {split:10s} {b.info.metadata.get(f'{split}_counts')}")
  if b.info.metadata.get("read_stats"):
    print(f"  read stats {b.info.metadata['read_stats']}")
  corpus = builders.read_corpus(b, "train")
  tok = tokenizer.WordPieceTokenizer.from_vocab(builders.resolve_vocab(_VOCAB.value,
                                                                       _CACHE_DIR.value))
  cfg = _example_config()
  t = time.time()
  plan = examples.make_plan(corpus, cfg)
  fill = plan.len_E.sum() / (plan.num_rows * cfg.max_length)
  print(f"format {cfg}: {len(plan.len_E)} examples in {plan.num_rows} rows, fill {fill:.3f}, "
        f"planned in {time.time() - t:.2f} s")
  if (plan.label_E >= 0).any():
    print(f"  label 1 fraction {np.mean(plan.label_E == 1):.4f}")
  rows = examples.Rows(corpus, plan, cfg, tok.cls_id, tok.sep_id, tok.pad_id)
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
      _sharded_corpus() if _SHARDED.value else _corpus()
    elif name in builders.TASKS:
      _task(name)
    else:
      raise app.UsageError(f"--datasets: unknown {name!r}; known: corpus, "
                           f"{', '.join(builders.TASKS)}")


if __name__ == "__main__":
  app.run(main)
