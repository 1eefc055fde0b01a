"""The Pallas TPU flash-attention path: its interpreted kernel against XLA's attention
(tests/model/pallas_checks.py, in a child process) and what it refuses."""
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model.attention import KeyMask, MultiHeadAttention
from encoder_jax.model.config import ModelConfig

BASE = dict(vocab_size=100, hidden_size=128, num_layers=2, num_heads=2, ffn_size=256,
            max_positions=256, hidden_dropout=0.0, attention_dropout=0.0, scan_layers=False)
CHECKS = os.path.join(os.path.dirname(__file__), "pallas_checks.py")


def test_interpreted_kernel_matches_xla_forward_and_backward():
  """pallas_checks.py under Pallas's TPU interpret mode, in a child pytest with ONE host
  device: with the suite's 8 fake CPU devices the interpreter's callbacks (which run JAX ops
  on the same CPU runtime) deadlock it; a hang becomes a failure through the timeout."""
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  try:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "no:cacheprovider", CHECKS], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
  except subprocess.TimeoutExpired as err:
    pytest.fail(f"the interpreted Pallas checks hung for {err.timeout} s")
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert "5 passed" in proc.stdout, proc.stdout[-2000:]


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
