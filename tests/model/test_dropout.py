"""The counter-based dropout mask (encoder_jax/model/dropout.py): rate, independence,
determinism, modes, and sharding invariance."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from encoder_jax.model.dropout import Dropout, hash_bits, keep_mask


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_rate_within_tolerance(rate):
  m = np.asarray(keep_mask(jax.random.key(0), (64, 128, 128), rate))
  n = m.size
  assert abs(m.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)


def test_bits_uniform_and_neighbours_independent():
  bits = np.asarray(hash_bits(jax.random.key(3), (256, 4096))).astype(np.float64) / 2 ** 32
  counts, _ = np.histogram(bits, bins=16, range=(0, 1))
  expected = bits.size / 16
  assert ((counts - expected) ** 2 / expected).sum() < 60  # chi2, 15 dof: p ~ 1e-7
  x = bits - 0.5
  for a, b in ((x[:, :-1], x[:, 1:]), (x[:-1], x[1:])):  # along and across rows
    assert abs((a * b).mean() / x.var()) < 0.01


def test_deterministic_per_key_and_keys_differ():
  k1, k2 = jax.random.key(1), jax.random.key(2)
  a, b = keep_mask(k1, (4096,), 0.5), keep_mask(k1, (4096,), 0.5)
  c = keep_mask(k2, (4096,), 0.5)
  np.testing.assert_array_equal(a, b)
  assert 0.45 < float(jnp.mean(a == c)) < 0.55  # independent masks agree half the time
  folded = [keep_mask(jax.random.fold_in(k1, i), (4096,), 0.5) for i in range(2)]
  assert 0.45 < float(jnp.mean(folded[0] == folded[1])) < 0.55


def test_module_modes_and_scaling():
  drop = Dropout(0.25, deterministic=True)
  x = jnp.ones((64, 512))
  np.testing.assert_array_equal(drop(x, rngs=jax.random.key(0)), x)  # eval: identity
  drop.deterministic = False
  y = np.asarray(drop(x, rngs=jax.random.key(0)))
  assert set(np.unique(y).tolist()) <= {0.0, float(np.float32(1) / np.float32(0.75))}
  assert abs(y.mean() - 1.0) < 0.02
  with pytest.raises(ValueError, match="key"):
    drop(x)
  assert float(Dropout(1.0)(x, rngs=jax.random.key(0)).sum()) == 0.0
  model = nnx.Sequential(Dropout(0.5, deterministic=True))
  model.train()
  assert not np.array_equal(model(x, rngs=jax.random.key(0)), x)


def test_sharded_mask_equals_single_device():
  if len(jax.devices()) < 4:
    pytest.skip("needs 4 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
  f = jax.jit(lambda k: keep_mask(k, (8, 6, 32), 0.1),
              out_shardings=NamedSharding(mesh, P("a", None, "b")))
  np.testing.assert_array_equal(f(jax.random.key(5)), keep_mask(jax.random.key(5), (8, 6, 32), 0.1))
