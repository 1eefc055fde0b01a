"""finetune_and_evaluate end to end on tfds.testing.mock_data with a tiny random encoder.

Mock records are random (text over 'a'-'j', random labels and answer offsets), so those tests
check plumbing, shapes, files and bookkeeping. Each task kind compiles its own train step
(~10-30 s on 2 shared cores), so training runs once per kind (pairs with two dev splits,
regression, spans); every GLUE task is read, encoded and scored without a model; SQuAD v1.1
trains under @slow. Two tasks on real demo text must be *learned* well above chance: Brown POS
tags, and real reviews labelled by a rule on their text.
"""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from encoder_jax.finetune import finetune_and_evaluate, tasks


def _run(tiny_config, tiny_vocab, tmp_path, task, num_examples=10, **changes):
  config = tiny_config(task, tiny_vocab, **changes)
  with tfds.testing.mock_data(num_examples=num_examples):
    return finetune_and_evaluate(config, str(tmp_path)), config


def _check_files(tmp_path, results):
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["summary"] == json.loads(json.dumps(results["summary"]))
  table = (tmp_path / "results.md").read_text()
  assert table.startswith("| task | init | seeds |") and results["task"] in table


def test_glue_pairs_two_dev_splits_and_seeds(tiny_config, tiny_vocab, tmp_path):
  # MNLI: sentence pairs, 3 classes, matched + mismatched dev; 2 seeds from one backbone.
  results, _ = _run(tiny_config, tiny_vocab, tmp_path, "glue/mnli", seeds=2, dropout=False,
                    epochs=2)
  assert [r["seed"] for r in results["runs"]] == [0, 1]
  for r in results["runs"]:
    assert len(r["history"]) == 2 and r["best_epoch"] in (1, 2)
    assert set(r["dev"]) == {"validation_matched", "validation_mismatched"}
    # The reported dev metrics are those of the selected epoch, which has the best value.
    best = max(h["dev"]["validation_matched"]["accuracy"] for h in r["history"])
    assert r["dev"]["validation_matched"]["accuracy"] == best
    assert r["test"] is None  # GLUE test labels are hidden
    assert r["history"][0]["train_examples_per_s"] > 0
  s = results["summary"]["validation_matched/accuracy"]
  assert s["n"] == 2 and s["median"] == pytest.approx(np.median(
      [r["dev"]["validation_matched"]["accuracy"] for r in results["runs"]]))
  assert results["data_rows"] == {"train": 10, "validation_matched": 10,
                                  "validation_mismatched": 10}
  _check_files(tmp_path, results)


def test_glue_regression_stsb(tiny_config, tiny_vocab, tmp_path):
  results, _ = _run(tiny_config, tiny_vocab, tmp_path, "glue/stsb", dropout=False,
                    export_embeddings="validation", export_pooling="mean")
  dev = results["runs"][0]["dev"]["validation"]
  assert set(dev) == {"pearson", "spearman", "score"}
  assert dev["score"] == pytest.approx((dev["pearson"] + dev["spearman"]) / 2)
  emb = np.load(tmp_path / "embeddings" / "glue_stsb_validation_mean.npy")
  assert emb.shape == (10, 32) and emb.dtype == np.float32 and np.isfinite(emb).all()
  assert np.load(tmp_path / "embeddings" / "glue_stsb_validation_mean_labels.npy").shape == (10,)


def test_squad_v2_end_to_end(tiny_config, tiny_vocab, tmp_path):
  # Windows of 48 tokens with a doc stride of 8 over contexts of up to ~20 random words.
  results, config = _run(tiny_config, tiny_vocab, tmp_path, "squad/v2.0", dropout=False,
                         max_length=48, doc_stride=8, max_query_length=16)
  dev = results["runs"][0]["dev"]["validation"]
  assert {"exact", "f1", "total", "score"} <= set(dev)
  # An exact match scores F1 = 100 too, so EM can never exceed F1.
  assert dev["exact"] <= dev["f1"] and dev["total"] == 10
  assert results["data_rows"]["train"] >= 10  # one or more windows per question


@pytest.mark.parametrize("task", tasks.GLUE_TASKS)
def test_every_glue_task_reads_encodes_and_scores(tiny_vocab, task):
  # Each task's TFDS field names, splits, label type and metrics, without a model (the train
  # step is the same for every classification task and is covered above).
  from encoder_jax.data.tokenizer import WordPieceTokenizer
  tok = WordPieceTokenizer.from_vocab(tiny_vocab)
  spec = tasks.get_task(task)
  rng = np.random.default_rng(0)
  with tfds.testing.mock_data(num_examples=6):
    for split in (spec.train_split, *spec.dev_splits):
      enc = tasks.encode(spec, tasks.read_split(spec, split), tok, max_length=24)
      assert enc.arrays["input_ids"].shape == (6, 24)
      if len(spec.text_keys) == 2:  # pairs: segment B is present
        assert (enc.arrays["token_types"] == 1).any()
      out = tasks.score(spec, enc, {"logits": rng.normal(size=(6, spec.num_labels))})
      assert set(spec.metrics) <= set(out) and all(np.isfinite(v) for v in out.values())


@pytest.mark.slow
def test_squad_v1_end_to_end(tiny_config, tiny_vocab, tmp_path):
  results, _ = _run(tiny_config, tiny_vocab, tmp_path, "squad/v1.1", dropout=False,
                    max_length=48, max_query_length=16, doc_stride=8)
  dev = results["runs"][0]["dev"]["validation"]
  assert {"exact", "f1"} <= set(dev) and "NoAns_total" not in dev


def _majority_share(labels) -> float:
  labels = np.asarray(labels)
  labels = labels[labels != -100]
  return np.bincount(labels).max() / labels.size


def test_demo_pos_tagging_on_real_brown_beats_the_majority_tag(tiny_config, tmp_path):
  # Real Brown sentences and tags (fetched once, cached) through the BERT uncased vocab: a
  # one-layer random encoder learns word -> tag in 32 steps, far above always saying NOUN.
  config = tiny_config("brown_pos", "minilm", dropout=False, max_train_examples=256,
                       max_eval_examples=64, max_length=48, epochs=2, batch_size=16,
                       learning_rate=1e-2, log_every=100)
  config.model.update(vocab_size=30522, num_layers=1)
  results = finetune_and_evaluate(config, str(tmp_path))
  run = results["runs"][0]
  assert results["data_rows"] == {"train": 256, "validation": 64, "test": 64}
  spec = tasks.get_task("brown_pos")
  tags = [t for r in tasks.read_split(spec, "test", max_examples=64) for t in r["tags"]]
  majority = _majority_share(tags)
  assert majority < 0.35
  print(f"POS test accuracy {run['test']['accuracy']:.3f} (majority tag {majority:.3f})")
  assert run["test"]["accuracy"] > majority + 0.3
  assert run["dev"]["validation"]["accuracy"] > majority + 0.3


def test_classifier_learns_a_rule_on_real_reviews(tiny_config, tmp_path, monkeypatch):
  """Real review text with a label the text decides: does the review contain the word
  "the"? (half of them do). A random two-layer encoder reading [CLS] must learn it well above
  chance in 96 steps; labels that drift from their rows in reading, encoding, shuffling,
  batching or prediction could not be learned."""
  import re
  read = tasks.read_split

  def relabelled(spec, split, **kwargs):
    out = []
    for r in read(spec, split, **kwargs):
      # The first 150 characters fit in the 64 tokens the model reads.
      text = tasks._text(r["text"])[:150].lower()
      out.append(dict(r, label=int(re.search(r"\bthe\b", text) is not None)))
    return out

  monkeypatch.setattr(tasks, "read_split", relabelled)
  config = tiny_config("rotten_tomatoes", "minilm", dropout=False, max_train_examples=512,
                       max_eval_examples=256, max_length=64, epochs=3, batch_size=16,
                       learning_rate=3e-3, log_every=100, save_best=True)
  config.model.update(vocab_size=30522)
  results = finetune_and_evaluate(config, str(tmp_path))
  run = results["runs"][0]
  labels = [r["label"] for r in relabelled(tasks.get_task("rotten_tomatoes"), "test",
                                           max_examples=256)]
  majority = _majority_share(labels)
  assert majority < 0.6
  print(f"rule accuracy: test {run['test']['accuracy']:.3f} (majority {majority:.3f})")
  assert run["test"]["accuracy"] > 0.9 and run["dev"]["validation"]["accuracy"] > 0.9
  assert set(run["test"]) == {"accuracy", "f1", "score"}
  assert (tmp_path / "seed_0" / "best").is_dir()
