"""Pre-training with `config.init_from` resolved: the entry point of `--mode=pretrain`, the demo
and the grid runner's in-process points.

  from encoder_jax.pretrain import pretrain
  summary = pretrain(config, workdir)   # = train.loop.train_and_evaluate + init_from loaded

Sources are read here, above the trainer in the package's layers, by encoder_jax.convert.load:
HF folders of any registered family (BERT, RoBERTa, ELECTRA, ...) and pre-training runs
(train/run_dir.py, which verifies their checksums and reads the run's vocab).
"""
from __future__ import annotations

from encoder_jax.convert import load
from encoder_jax.train.init_from import Pretrained
from encoder_jax.train import loop


def pretrain(config, workdir: str) -> dict:
  """encoder_jax.train.loop.train_and_evaluate, with config.init_from's parameters loaded here
  (HF folders are read by encoder_jax.convert, a layer above the trainer)."""
  spec = config.get("init_from", "")
  return loop.train_and_evaluate(
      config, workdir, load_pretrained(spec, config.data.cache_dir or None) if spec else None)


def load_pretrained(spec: str, cache_dir=None) -> Pretrained:
  """config.init_from -> encoder_jax.train.init_from.Pretrained: 'minilm', a HF folder
  (config.json with a model_type: its encoder, pooler and MLM head where it has them), or a
  pre-training workdir / checkpoint step folder (local or gs://: every parameter)."""
  if spec == "minilm" or load.hf_model_type(spec):
    b = load.load_backbone(spec if spec == "minilm" else f"hf:{spec}", cache_dir=cache_dir)
    return Pretrained(spec, encoder=b.encoder, pooler=b.pooler, heads=b.heads, vocab=b.vocab)
  b = load.load_backbone(f"ckpt:{spec}")
  return Pretrained(spec, full=b.params, vocab=b.vocab)
