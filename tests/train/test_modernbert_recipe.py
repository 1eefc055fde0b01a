"""recipe=modernbert end to end: a tiny variant of ModernBERT's recipe (its block at width 32, 3
layers with one global and two local, windows of 16; a few steps of a small batch; Moby-Dick of
the demo corpus with a 512-token byte-level BPE) trains through train_and_evaluate on packed
FULL-SENTENCES rows under the warm-up-stable-decay schedule, and every train row of
metrics.jsonl reports the share of padding of exactly the batches it trained on."""
import numpy as np

from encoder_jax.train import loop, metrics_io, setup

from configs import pretrain

STEPS = 4


def test_a_tiny_modernbert_recipe_trains_and_logs_its_padding(tmp_path):
  config = pretrain.get_config("recipe=modernbert,precision=fp32")
  config.model.update(dict(num_layers=3, hidden_size=32, num_heads=2, ffn_size=48,
                           local_window=16))
  config.data.update(dict(vocab="demo-bpe:512", source="demo:moby_dick",
                          data_dir=str(tmp_path / "tfds"), max_length=64, batch_size=4,
                          eval_split="train"))
  config.optim.update(dict(warmup_steps=1, decay_frac=0.5))
  config.train.update(dict(steps=STEPS, log_every=1, eval_every=STEPS, eval_steps=1,
                           checkpoint_every=STEPS))
  # What it trains on: packed rows, a segment per document (or row-sized chunk of one).
  loader = setup.make_loader(setup.DataSettings.of(config), "train")
  rows = loader.rows
  k = np.array([rows[i]["segment_ids"].max() for i in range(len(rows))])
  assert k.min() >= 1 and k.max() >= 2  # rows that hold the end of a chapter and the next
  it = iter(loader)
  want_pad = [1.0 - next(it)["mask"].mean() for _ in range(STEPS)]
  assert max(want_pad) > 0  # (sentence-aligned rows leave some padding)

  summary = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert summary["steps"] == STEPS
  assert np.isfinite(summary["final_train_loss"]) and summary["final_train_loss"] > 1.0
  train = [r for r in metrics_io.read_jsonl(tmp_path / "run" / metrics_io.METRICS_FILE)
           if r["split"] == "train"]
  assert [r["step"] for r in train] == list(range(1, STEPS + 1))
  np.testing.assert_allclose([r["pad_fraction"] for r in train], want_pad, rtol=1e-6)
  for r in train[1:]:  # (the first step compiles: no speed in its row)
    assert r["real_tokens_per_s"] == r["tokens_per_s"] * (1 - r["pad_fraction"])
  lrs = [r["learning_rate"] for r in train]  # warm-up 1, stable, 1-sqrt decay over the last 2
  np.testing.assert_allclose(lrs, [0.0, 8e-4, 8e-4, 8e-4 * (1 - 0.5 ** 0.5)], rtol=1e-5)
