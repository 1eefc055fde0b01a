"""`pretrain(config, workdir)`: the trainer, encoder_jax.train.loop.train_and_evaluate, which
loads config.init_from itself (train/init_from.py).

This name is kept only for the callers not yet moved to train_and_evaluate (the demo,
encoder_jax/demo.py, and `main --mode=pretrain`); it goes once they call the trainer.
"""
from encoder_jax.train.loop import train_and_evaluate as pretrain

__all__ = ["pretrain"]
