"""Pre-training with `config.init_from` resolved: the entry point of `--mode=pretrain`, the demo
and the grid runner's in-process points.

  from encoder_jax.pretrain import pretrain
  summary = pretrain(config, workdir)   # = train.loop.train_and_evaluate + init_from loaded

Sources are read here, above the trainer in the package's layers: HF folders through
encoder_jax.convert, pre-training checkpoints through encoder_jax.finetune.backbone (which
verifies their checksums and reads the run's vocab).
"""
from __future__ import annotations

from etils import epath

from encoder_jax import paths
from encoder_jax.data import builders, fetch
from encoder_jax.finetune import backbone
from encoder_jax.train.init_from import Pretrained
from encoder_jax.train import loop


def pretrain(config, workdir: str) -> dict:
  """encoder_jax.train.loop.train_and_evaluate, with config.init_from's parameters loaded here
  (HF folders are read by encoder_jax.convert, a layer above the trainer)."""
  spec = config.get("init_from", "")
  return loop.train_and_evaluate(
      config, workdir, load_pretrained(spec, config.data.cache_dir or None) if spec else None)


def load_pretrained(spec: str, cache_dir=None):
  """config.init_from -> encoder_jax.train.init_from.Pretrained: 'minilm', a HF BERT/ELECTRA
  folder (config.json with a model_type), or a pre-training workdir / checkpoint step folder
  (local or gs://)."""
  hf = spec == "minilm" or (not paths.is_uri(spec) and backbone.hf_model_type(spec))
  if hf:
    folder = fetch.minilm_dir(cache_dir) if spec == "minilm" else epath.Path(spec)
    b = backbone.load_backbone("minilm" if spec == "minilm" else f"hf:{spec}",
                               cache_dir=cache_dir)
    vocab = folder / "vocab.txt"
    return Pretrained(spec, encoder=b.encoder, pooler=b.pooler,
                      vocab=str(vocab) if vocab.exists() else None)
  b = backbone.load_backbone(f"ckpt:{spec}")
  return Pretrained(spec, full=b.params, vocab=builders.resolve_vocab(b.vocab, cache_dir)
                    if b.vocab else None)

