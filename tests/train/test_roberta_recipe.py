"""recipe=roberta end to end: a tiny variant of RoBERTa's recipe (size tiny, a few steps, a
small batch, Moby-Dick of the demo corpus with a 512-token byte-level BPE) trains through
train_and_evaluate on RoBERTa's rows, with finite losses."""
import numpy as np

from encoder_jax.train import loop, setup

from configs import pretrain

STEPS = 3


def test_a_tiny_roberta_recipe_trains(tmp_path):
  config = pretrain.get_config("recipe=roberta,size=tiny,precision=fp32")
  config.model.update(dict(num_layers=1, hidden_size=32, num_heads=2, ffn_size=64,
                           max_positions=64))
  config.data.update(dict(vocab="demo-bpe:512", source="demo:moby_dick",
                          data_dir=str(tmp_path / "tfds"), max_length=64, batch_size=4,
                          eval_split="train"))
  config.optim.update(dict(warmup_steps=1))
  config.train.update(dict(steps=STEPS, log_every=1, eval_every=STEPS, eval_steps=1,
                           checkpoint_every=STEPS))
  # What it trains on: byte-level BPE rows, <s> ... </s>, packed, no token types.
  loader = setup.make_loader(setup.DataSettings.of(config), "train")
  tok = loader.tokenizer
  assert (tok.kind, tok.layout, tok.vocab_size) == ("bpe", "roberta", 512)
  batch = next(iter(loader))
  ids, mask = batch["input_ids"], batch["mask"].astype(bool)
  assert (ids[:, 0] == tok.cls_id).all() and (ids[~mask] == tok.pad_id).all()
  assert not batch["token_types"].any() and (ids == tok.sep_id).any()
  assert np.isin(ids[mask], tok.special_ids).mean() < 0.2

  summary = loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert summary["steps"] == STEPS and summary["num_params"] > 0
  assert np.isfinite(summary["final_train_loss"]) and np.isfinite(summary["final_eval_loss"])
  assert summary["final_train_loss"] > 1.0  # an MLM loss over 512 ids, not a degenerate 0
