"""Fine-tuning tasks: what each one reads, how it is encoded, and how it is scored.

  rotten_tomatoes   demo sentiment (encoder_jax.data.tasks, split by movie)      accuracy, F1
  brown_pos         demo POS tagging, 12 universal tags, first-subtoken labels   accuracy
  glue/<task>       the nine GLUE tasks from TFDS: cola (MCC), sst2, mnli (matched and
                    mismatched dev), qnli, rte, wnli (accuracy), mrpc, qqp (F1, accuracy),
                    stsb (Pearson, Spearman; regression)
  squad/v1.1, squad/v2.0   extractive QA from TFDS (see squad.py)               EM, F1

Splits: `train` trains, the first dev split picks the best epoch, a labelled `test` split is
scored once with the best parameters. GLUE's test labels are hidden and TFDS SQuAD has no
test split, so those tasks report their dev splits (as the BERT/ELECTRA papers do).

TFDS tasks read prepared array_record data (`tfds.data_source`); prepare it where the network
reaches the sources: `tfds build glue/cola --file_format=array_record --data_dir=DIR`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from encoder_jax.data.tokenizer import SubwordTokenizer
from encoder_jax.finetune import metrics as metrics_lib
from encoder_jax.finetune import squad as squad_lib


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  kind: str  # classify | regress | tag | span
  num_labels: int  # classes, tags; 1 for regression; 2 (start, end) for spans
  metrics: tuple[str, ...]  # the first picks the best epoch
  dev_splits: tuple[str, ...]  # the first picks the best epoch
  test_split: str | None  # a labelled test split, or None
  text_keys: tuple[str, ...] = ()
  label_key: str = "label"
  train_split: str = "train"
  source: str = "tfds"  # tfds | demo

  @property
  def select_metric(self) -> str:
    return self.metrics[0]

  @property
  def splits(self) -> tuple[str, ...]:
    """Every split a run reads: train, the dev splits, the labelled test split if any."""
    return (self.train_split, *self.dev_splits) + ((self.test_split,) if self.test_split else ())


def _glue(task: str, text_keys, num_labels=2, dev=("validation",)) -> TaskSpec:
  kind = "regress" if task == "stsb" else "classify"
  return TaskSpec(f"glue/{task}", kind, num_labels, metrics_lib.GLUE_METRICS[task], dev, None,
                  text_keys)


TASKS: dict[str, TaskSpec] = {
    "rotten_tomatoes": TaskSpec("rotten_tomatoes", "classify", 2, ("accuracy", "f1"),
                                ("validation",), "test", ("text",), source="demo"),
    "brown_pos": TaskSpec("brown_pos", "tag", 12, ("accuracy",), ("validation",), "test",
                          ("words",), "tags", source="demo"),
    "glue/cola": _glue("cola", ("sentence",)),
    "glue/sst2": _glue("sst2", ("sentence",)),
    "glue/mrpc": _glue("mrpc", ("sentence1", "sentence2")),
    "glue/qqp": _glue("qqp", ("question1", "question2")),
    "glue/stsb": _glue("stsb", ("sentence1", "sentence2"), num_labels=1),
    "glue/mnli": _glue("mnli", ("premise", "hypothesis"), num_labels=3,
                       dev=("validation_matched", "validation_mismatched")),
    "glue/qnli": _glue("qnli", ("question", "sentence")),
    "glue/rte": _glue("rte", ("sentence1", "sentence2")),
    "glue/wnli": _glue("wnli", ("sentence1", "sentence2")),
    "squad/v1.1": TaskSpec("squad/v1.1", "span", 2, ("f1", "exact"), ("validation",), None),
    "squad/v2.0": TaskSpec("squad/v2.0", "span", 2, ("f1", "exact"), ("validation",), None),
}
GLUE_TASKS = tuple(t for t in TASKS if t.startswith("glue/"))


def get_task(name: str) -> TaskSpec:
  if name not in TASKS:
    raise ValueError(f"unknown fine-tuning task {name!r}; known: {sorted(TASKS)} "
                     "(GLUE and SQuAD need their TFDS data prepared, see encoder_jax.finetune)")
  return TASKS[name]


# ----------------------------------------------------------------------------------- reading
def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _register_tfds_builders():
  # TFDS registers community builders lazily by module; without TensorFlow the glue and squad
  # modules must be imported by hand before tfds.data_source can find them.
  from tensorflow_datasets.datasets.squad import squad_dataset_builder  # noqa: F401
  from tensorflow_datasets.text import glue  # noqa: F401


def read_split(spec: TaskSpec, split: str, *, data_dir=None, cache_dir=None,
               max_examples: int = 0, download: bool = False) -> list[dict[str, Any]]:
  """All records of a split (a seeded subset of `max_examples` when > 0), as python dicts."""
  import tensorflow_datasets as tfds
  if spec.source == "demo":
    from encoder_jax.data.tasks import prepare_task
    src = prepare_task(spec.name, data_dir=data_dir, cache_dir=cache_dir).as_data_source(split)
  else:
    _register_tfds_builders()
    try:
      src = tfds.data_source(spec.name, split=split, data_dir=data_dir, download=download)
    except Exception as e:  # TFDS raises several types for "not prepared here"
      raise FileNotFoundError(
          f"TFDS dataset {spec.name} split {split!r} is not readable from data_dir={data_dir!r} "
          f"({type(e).__name__}: {e}). Prepare it on a machine that reaches its source: "
          f"`tfds build {spec.name} --file_format=array_record --data_dir=DIR`, then pass "
          "--config.data_dir=DIR (or set download=True where the network allows).") from e
  n = len(src)
  if n == 0:
    raise ValueError(f"{spec.name} split {split!r} is empty.")
  index = np.arange(n)
  if 0 < max_examples < n:  # a fixed subset (seed 0) whatever the fine-tuning seed
    index = np.sort(np.random.default_rng(0).permutation(n)[:max_examples])
  return [src[int(i)] for i in index]


# ---------------------------------------------------------------------------------- encoding
@dataclasses.dataclass
class Encoded:
  """A split as model-ready numpy arrays (rows of one length) + what scoring needs."""
  arrays: dict[str, np.ndarray]  # input_ids, mask, token_types [N, T] and labels
  squad_examples: list | None = None  # span tasks: the questions, for answer text and scoring
  squad_features: Any = None

  def __len__(self) -> int:
    return len(self.arrays["input_ids"])


def encode(spec: TaskSpec, records: list[dict[str, Any]], tok: SubwordTokenizer, *,
           max_length: int, doc_stride: int = 128, max_query_length: int = 64) -> Encoded:
  if spec.kind in ("classify", "regress"):
    texts = [[_text(r[k]) for r in records] for k in spec.text_keys]
    arrays = tok.batch_encode_pairs(texts[0], texts[1] if len(texts) > 1 else None,
                                    max_length=max_length)
    dtype = np.float32 if spec.kind == "regress" else np.int32
    arrays["labels"] = np.asarray([r[spec.label_key] for r in records], dtype)
    return Encoded(arrays)
  if spec.kind == "tag":
    words = [[_text(w) for w in r[spec.text_keys[0]]] for r in records]
    tags = [np.asarray(r[spec.label_key], np.int32) for r in records]
    arrays = tok.batch_encode_words(words, tags, max_length=max_length)
    arrays.pop("first_piece")
    return Encoded(arrays)
  version = spec.name.split("/")[1]
  examples = squad_lib.examples_from_records(records, version)
  feats = squad_lib.build_features(examples, tok, max_length=max_length, doc_stride=doc_stride,
                                   max_query_length=max_query_length)
  arrays = {"input_ids": feats.input_ids, "mask": feats.mask, "token_types": feats.token_types,
            "start_positions": feats.start_positions, "end_positions": feats.end_positions}
  return Encoded(arrays, examples, feats)


def score(spec: TaskSpec, enc: Encoded, outputs: dict[str, np.ndarray], *,
          max_answer_length: int = 30, null_threshold: float = 0.0) -> dict[str, float]:
  """Task metrics from the model's outputs over a whole split (in row order)."""
  if spec.kind == "classify":
    return metrics_lib.classification_metrics(
        spec.metrics, outputs["logits"].argmax(-1), enc.arrays["labels"])
  if spec.kind == "regress":
    return metrics_lib.classification_metrics(
        spec.metrics, outputs["logits"][:, 0], enc.arrays["labels"])
  if spec.kind == "tag":
    acc = metrics_lib.tagging_accuracy(outputs["logits"].argmax(-1), enc.arrays["labels"])
    return {"accuracy": acc, "score": acc}
  version = spec.name.split("/")[1]
  preds, _ = squad_lib.extract_answers(
      enc.squad_examples, enc.squad_features, outputs["start_logits"], outputs["end_logits"],
      max_answer_length=max_answer_length, version=version, null_threshold=null_threshold)
  golds = {e.qid: e.answer_texts for e in enc.squad_examples}
  out = metrics_lib.squad_scores(golds, preds, version)
  out["score"] = (out["exact"] + out["f1"]) / 2
  return out
