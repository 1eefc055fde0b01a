"""ModelConfig.attention_impl: "xla" (default), "auto" (cuDNN only on GPU in bf16/fp16, else
XLA) and an explicit "cudnn", which raises where cuDNN cannot run instead of silently
measuring something else (bench/gpu.py relies on that to print its fallback note)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model.config import ModelConfig, model_config_for_size
from encoder_jax.model.encoder import Encoder


def _out(impl):
  cfg = model_config_for_size("tiny", vocab_size=64, max_positions=16, attention_impl=impl)
  enc = Encoder(cfg, rngs=nnx.Rngs(0))
  ids = jnp.array([[2, 5, 7, 9, 0, 0], [3, 4, 0, 0, 0, 0]])
  return enc(ids, ids != 0).hidden_BxTxD


def test_auto_is_xla_off_gpu():
  if jax.default_backend() == "gpu":
    pytest.skip("CPU/TPU behaviour")
  np.testing.assert_array_equal(_out("auto"), _out("xla"))


def test_explicit_cudnn_raises_without_cudnn():
  if jax.default_backend() == "gpu":
    pytest.skip("needs a machine without cuDNN")
  with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
    _out("cudnn")


def test_unknown_impl_is_a_config_error():
  with pytest.raises(ValueError, match="attention_impl"):
    ModelConfig(attention_impl="flash")
