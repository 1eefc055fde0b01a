"""encoder_jax: BERT-style encoder pre-training in JAX / Flax NNX."""

__version__ = "0.1.0"
