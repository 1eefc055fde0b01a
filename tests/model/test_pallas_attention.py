"""The Pallas TPU flash-attention path (attention_impl="pallas", what "auto" takes on a TPU)
computes what the XLA path computes, forward and backward, with padding, packed segments and
ALiBi, and refuses what it cannot tile. The kernel's own code runs on CPU under Pallas's HLO
interpreter; tests/tpu/ compiles it for TPU topologies."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src import config as jax_config

from encoder_jax.model.attention import KeyMask, MultiHeadAttention
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.encoder import Encoder

BASE = dict(vocab_size=100, hidden_size=128, num_layers=2, num_heads=2, ffn_size=256,
            max_positions=256, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)


@contextlib.contextmanager
def _hlo_interpret():
  """Runs every pallas_call traced inside as Pallas's HLO interpreter (`interpret=True`: the
  kernel body discharged into a jitted scan over its grid). Not `pltpu.force_tpu_interpret_mode`:
  that simulator runs the kernel through host callbacks that themselves run JAX ops, and on the
  2-core CI machine it deadlocked the CPU runtime (a 600 s hang, also with one host device).
  The flag is private to jax (pinned in setup.py); `force_tpu_interpret_mode` sets the same one."""
  prev = jax_config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
  try:
    yield
  finally:
    jax_config.pallas_tpu_interpret_mode_context_manager.set_local(prev)


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
  with _hlo_interpret():
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
  with _hlo_interpret():
    got = grads(pallas)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-4, atol=2e-5)


def test_pallas_refuses_what_it_cannot_tile_and_auto_falls_back():
  cfg = ModelConfig(**{**BASE, "hidden_size": 32}, attention_impl="pallas")
  mha = MultiHeadAttention(cfg, rngs=nnx.Rngs(0))
  x = jnp.ones((1, 64, 32))
  with pytest.raises(ValueError, match="not a multiple of 128"):
    mha(x, KeyMask(jnp.ones((1, 64), bool)))
  with pytest.raises(ValueError, match="factored key mask"):
    mha(jnp.ones((1, 128, 32)), jnp.ones((1, 1, 128, 128), bool))
  auto = MultiHeadAttention(cfg.replace(attention_impl="auto", platform="tpu"),
                            rngs=nnx.Rngs(0))
  ref = MultiHeadAttention(cfg.replace(attention_impl="xla"), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(auto(x, KeyMask(jnp.ones((1, 64), bool))),
                             ref(x, jnp.ones((1, 1, 64, 64), bool)), rtol=1e-6, atol=1e-6)
