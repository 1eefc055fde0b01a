"""ALiBi relative-position bias and sinusoidal position init (ModelConfig.position_bias /
position_init): values, the encoder invariants they must keep, and where they must act."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model import Encoder, ModelConfig
from encoder_jax.model.attention import (AlibiBias, MultiHeadAttention, alibi_slopes,
                                         make_attention_mask)

TOL = 1e-5


def cfg(**kw):
  base = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
              max_positions=24, hidden_dropout=0.0, attention_dropout=0.0, norm_first=True,
              position_bias="alibi")
  return ModelConfig(**{**base, **kw})


def reference_slopes(n):
  """ofirpress/attention_with_linear_biases, get_slopes (recursive form)."""
  def power_of_2(n):
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    return [start * start ** i for i in range(n)]
  if math.log2(n).is_integer():
    return power_of_2(n)
  closest = 2 ** math.floor(math.log2(n))
  return power_of_2(closest) + reference_slopes(2 * closest)[0::2][:n - closest]


@pytest.mark.parametrize("n", [1, 2, 4, 6, 8, 12, 16])
def test_alibi_slopes_match_the_papers_code(n):
  np.testing.assert_allclose(alibi_slopes(n), reference_slopes(n), rtol=1e-6)


def test_alibi_bias_is_symmetric_distance_from_position_ids():
  pos = jnp.array([[0, 1, 2, 3], [0, 1, 0, 1]])  # the second row packs two examples
  bias = AlibiBias.from_positions(pos, 2).full()
  s0, s1 = reference_slopes(2)
  np.testing.assert_allclose(bias[0, 0, 0], [0, -s0, -2 * s0, -3 * s0], rtol=1e-6)
  np.testing.assert_allclose(bias[0, 1, 3], [-3 * s1, -2 * s1, -s1, 0], rtol=1e-6)
  np.testing.assert_allclose(bias[1, 0, 2], [0, -s0, 0, -s0], rtol=1e-6)  # restarted positions
  np.testing.assert_array_equal(bias, jnp.swapaxes(bias, -1, -2))


@nnx.jit
def run(enc, x, m, seg=None):
  return enc(x, m, segment_ids_BxT=seg).hidden_BxTxD


def test_alibi_changes_the_output_and_keeps_bidirectionality():
  x = jnp.array([[5, 6, 7, 8, 9, 10]])
  m = jnp.ones_like(x, bool)
  plain = Encoder(cfg(position_bias="none"), rngs=nnx.Rngs(0))
  alibi = Encoder(cfg(), rngs=nnx.Rngs(0))  # same parameters: the bias is not one
  h = run(alibi, x, m)
  assert np.abs(h - run(plain, x, m)).max() > 1e-3
  later = x.at[0, 5].set(11)  # a later token moves an earlier output
  assert np.abs(run(alibi, later, m)[0, 0] - h[0, 0]).max() > 1e-4


def test_alibi_padding_and_packing_invariants():
  enc = Encoder(cfg(), rngs=nnx.Rngs(1))
  a, b = [5, 6, 7, 8], [9, 10, 11]
  ha = run(enc, jnp.array([a]), jnp.ones((1, 4), bool))
  padded = run(enc, jnp.array([a + [0, 0]]), jnp.array([[1, 1, 1, 1, 0, 0]], bool))
  np.testing.assert_allclose(padded[:, :4], ha, atol=TOL)
  packed = jnp.array([a + b + [0]])
  seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0]])
  hp = run(enc, packed, seg > 0, seg)
  hb = run(enc, jnp.array([b]), jnp.ones((1, 3), bool))
  np.testing.assert_allclose(hp[:, :4], ha, atol=TOL)
  np.testing.assert_allclose(hp[:, 4:7], hb, atol=TOL)


def test_alibi_in_fused_and_explicit_attention_paths_agree():
  mha = MultiHeadAttention(cfg(), rngs=nnx.Rngs(3))
  h = jax.random.normal(jax.random.key(0), (2, 6, 32))
  m = jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], bool)
  mask = make_attention_mask(m)
  bias = AlibiBias.from_positions(jnp.broadcast_to(jnp.arange(6), (2, 6)), 4).full()
  q, k, v = (jnp.einsum("btd,dnh->btnh", h, mha.qkv_kernel[...][:, i])
             + mha.qkv_bias[...][i][None, None] for i in range(3))
  fused, _ = mha._attend(q, k, v, mask, None, bias)
  explicit = mha._explicit_attention(q, k, v, mask, jax.random.key(0), bias)
  np.testing.assert_allclose(fused[m], explicit[m], atol=TOL)
  no_bias, _ = mha._attend(q, k, v, mask)
  assert np.abs(fused[m] - no_bias[m]).max() > 1e-3


def test_alibi_heads_favour_near_keys_at_init():
  """The point of the bias: attention concentrates on neighbours before any training."""
  mha = MultiHeadAttention(cfg(num_heads=8), rngs=nnx.Rngs(0))
  T = 16
  m = make_attention_mask(jnp.ones((1, T), bool))
  bias = AlibiBias.from_positions(jnp.arange(T)[None], 8).full()
  # Identity values: the output of query i is its attention distribution (head 0: slope 1/2).
  q = k = jnp.zeros((1, T, 8, T))
  v = jnp.broadcast_to(jnp.eye(T)[None, :, None, :], (1, T, 8, T))
  probs = mha._attend(q, k, v, m, None, bias)[0][0, 8, 0]  # query 8, head 0
  assert probs[7] == probs[9] and probs[7] > 2 / T and probs[8] > probs[7] > probs[5]


def test_sinusoidal_position_init_is_translation_structured():
  enc = Encoder(cfg(position_bias="none", position_init="sinusoidal", hidden_size=64,
                    max_positions=32), rngs=nnx.Rngs(0))
  table = np.asarray(enc.embeddings.position.embedding[...], np.float64)
  assert abs(np.sqrt((table ** 2).mean()) - 0.02) < 0.001  # BERT's init scale (RMS)
  gram = table @ table.T  # depends on |i - j| only: a Toeplitz matrix
  np.testing.assert_allclose(np.diag(gram, 3)[:-1], np.diag(gram, 3)[1:], rtol=1e-6)
  np.testing.assert_allclose(np.diag(gram, 1), np.diag(gram, -1), rtol=1e-6)
  normal = Encoder(cfg(position_bias="none", hidden_size=64, max_positions=32),
                   rngs=nnx.Rngs(0)).embeddings.position.embedding[...]
  assert np.abs(np.diff(np.diag(np.asarray(normal) @ np.asarray(normal).T, 3))).max() > 1e-5


def test_bad_position_options_name_the_choices():
  with pytest.raises(ValueError, match="alibi"):
    cfg(position_bias="rope")
  with pytest.raises(ValueError, match="sinusoidal"):
    cfg(position_init="zeros")


def test_hf_export_refuses_alibi():
  from encoder_jax.hf.bert import model_config_to_hf_config
  with pytest.raises(ValueError, match="position_bias"):
    model_config_to_hf_config(cfg(norm_first=False), ["BertModel"])
