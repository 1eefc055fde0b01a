"""ModelConfig.attention_impl: "auto" (default: cuDNN only on GPU in bf16/fp16, else XLA),
"xla", "explicit" and an explicit "cudnn", which raises where cuDNN cannot run instead of
silently measuring something else (bench/gpu.py relies on that to print its fallback note).
Which path the jitted train step traces: tests/train/test_attention_path.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model.config import ModelConfig, model_config_for_size
from encoder_jax.model.encoder import Encoder


def _out(impl, dtype="float32"):
  cfg = model_config_for_size("tiny", vocab_size=64, max_positions=16, attention_impl=impl,
                              dtype=dtype)
  enc = Encoder(cfg, rngs=nnx.Rngs(0))
  ids = jnp.array([[2, 5, 7, 9, 0, 0], [3, 4, 0, 0, 0, 0]])
  return enc(ids, ids != 0).hidden_BxTxD


def _asked_for(monkeypatch, backend, dtype):
  """The implementations "auto" asks jax.nn.dot_product_attention for, in order, on a
  machine whose default backend reads `backend` (the calls still run on this CPU)."""
  asked, real = [], jax.nn.dot_product_attention

  def spy(*args, implementation=None, **kwargs):
    asked.append(implementation)
    return real(*args, implementation=implementation, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  out = _out("auto", dtype)
  monkeypatch.undo()
  return asked, out


def _out_on(monkeypatch, backend, impl, dtype):
  """_out on a machine whose default backend reads `backend` (which also picks the matmuls:
  encoder_jax.model.matmul.bf16_dots)."""
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  out = _out(impl, dtype)
  monkeypatch.undo()
  return out


def test_auto_picks_cudnn_only_on_gpu_in_half_precision(monkeypatch):
  layers = model_config_for_size("tiny").num_layers  # at most a cuDNN try + an XLA call each
  for backend, dtype in (("cpu", "float32"), ("tpu", "bfloat16"), ("gpu", "float32")):
    asked, out = _asked_for(monkeypatch, backend, dtype)
    assert set(asked) == {"xla"}, (backend, dtype, asked)  # XLA, cuDNN never tried
    np.testing.assert_array_equal(out, _out_on(monkeypatch, backend, "xla", dtype))
  # A bf16 model on CPU runs its dots through model.matmul's fp32-accumulating path, which the
  # fused call would bypass: "auto" is the explicit path there.
  asked, out = _asked_for(monkeypatch, "cpu", "bfloat16")
  assert asked == [], asked
  np.testing.assert_array_equal(out, _out("explicit", "bfloat16"))
  # On a GPU in bf16 "auto" asks for cuDNN first; where cuDNN cannot run (this CPU) it falls
  # back to XLA (an explicit "cudnn" raises instead, below).
  asked, out = _asked_for(monkeypatch, "gpu", "bfloat16")
  assert asked[0] == "cudnn" and len(asked) <= 2 * layers, asked
  if jax.default_backend() != "gpu":
    assert asked[1:2] == ["xla"], asked
    np.testing.assert_array_equal(out, _out_on(monkeypatch, "gpu", "xla", "bfloat16"))


def test_explicit_cudnn_raises_without_cudnn():
  if jax.default_backend() == "gpu":
    pytest.skip("needs a machine without cuDNN")
  with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
    _out("cudnn")


def test_unknown_impl_is_a_config_error():
  """The error names the flag and every choice, from ModelConfig and from a run config (the
  path a --config.model.attention_impl override takes)."""
  import ml_collections
  from encoder_jax.model.config import ATTENTION_IMPLS
  from encoder_jax.train import setup
  config = ml_collections.ConfigDict({"model": ModelConfig().to_dict(),
                                      "data": {"max_length": 16}})
  config.model.attention_impl = "flash"
  for build in (lambda: ModelConfig(attention_impl="flash"),
                lambda: setup.model_config(config, vocab_size=64)):
    with pytest.raises(ValueError, match="attention_impl") as err:
      build()
    assert "--config.model.attention_impl" in str(err.value)
    assert all(repr(choice) in str(err.value) for choice in ATTENTION_IMPLS), err.value


@pytest.mark.parametrize("backend,dtype,dropout,train_path", [
    ("cpu", "float32", 0.1, "explicit einsum"),
    ("cpu", "float32", 0.0, "(XLA)"),
    ("gpu", "bfloat16", 0.0, "(cuDNN flash attention)"),
    ("gpu", "float32", 0.0, "(XLA)"),
    ("gpu", "bfloat16", 0.1, "explicit einsum"),
])
def test_start_up_line_names_the_training_path_and_why(backend, dtype, dropout, train_path):
  from encoder_jax.model.attention import describe_attention
  line = describe_attention(ModelConfig(dtype=dtype, attention_dropout=dropout), backend)
  train, _, evaluation = line.partition("; evaluation uses ")
  assert train_path in train, line
  assert f"attention_dropout={dropout}" in train, line
  # With dropout on, evaluation (no dropout) still takes the fused call.
  assert ("jax.nn.dot_product_attention" in evaluation) is (dropout > 0), line
