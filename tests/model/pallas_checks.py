"""The Pallas TPU flash-attention path (attention_impl="pallas", what "auto" takes on a TPU)
computes what the XLA path computes, forward and backward, with padding, packed segments and
ALiBi. Run on CPU under Pallas's TPU interpret mode (the kernel's own code, interpreted);
tests/tpu/ compiles it for TPU topologies.

Not collected by the suite directly: tests/model/test_pallas_attention.py runs this file in
a child pytest on one host device (the interpreter's callbacks deadlock the CPU runtime when
it has the suite's 8 fake devices)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from encoder_jax.model.config import ModelConfig
from encoder_jax.model.encoder import Encoder

BASE = dict(vocab_size=100, hidden_size=128, num_layers=2, num_heads=2, ffn_size=256,
            max_positions=256, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 100, (2, 128))
  mask = np.ones((2, 128), bool)
  mask[0, 100:] = False  # padding
  ids[~mask] = 0
  seg = np.where(mask, 1, 0)
  seg[1, 60:] = 2  # two examples packed in row 1
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(seg)


def _encoders(**extra):
  kw = {**BASE, **extra}
  return (Encoder(ModelConfig(**kw, attention_impl="xla"), rngs=nnx.Rngs(0)),
          Encoder(ModelConfig(**kw, attention_impl="pallas"), rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("bias", ["none", "alibi"])
@pytest.mark.parametrize("packed", [False, True])
def test_pallas_matches_xla_at_every_valid_position(bias, packed):
  ids, mask, seg = _inputs()
  xla, pallas = _encoders(position_bias=bias)
  segs = seg if packed else None
  want = xla(ids, mask, segment_ids_BxT=segs).hidden_BxTxD
  with pltpu.force_tpu_interpret_mode():
    got = pallas(ids, mask, segment_ids_BxT=segs).hidden_BxTxD
  diff = np.abs(np.asarray(want) - np.asarray(got))
  assert diff[np.asarray(mask)].max() < 2e-5  # pad positions are ignored by every loss
  assert np.isfinite(np.asarray(got)).all()


def test_pallas_gradients_match_xla():
  """The kernel's backward (its dq / dkv kernels) against XLA's, through one layer
  (interpreted kernels are slow)."""
  ids, mask, seg = _inputs()
  xla, pallas = _encoders(position_bias="alibi", num_layers=1)

  def grads(model):
    graphdef, params = nnx.split(model, nnx.Param)
    def loss(p):
      h = nnx.merge(graphdef, p)(ids, mask, segment_ids_BxT=seg).hidden_BxTxD
      return jnp.sum(jnp.where(mask[..., None], h, 0.0) ** 2)
    return jax.grad(loss)(params)

  want = grads(xla)
  with pltpu.force_tpu_interpret_mode():
    got = grads(pallas)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)
