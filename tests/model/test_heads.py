"""The heads (encoder_jax/model/heads.py) against numpy written from BERT's / ELECTRA's
definitions, and the whole models (bert.py) wired to them: every input reaches the encoder,
and the heads read its output.

  MLM head (BERT, `cls/predictions`): logits = LN(gelu(h W_t + b_t)) E^T + b, E the token table
  pooler: tanh(h_[CLS] W_p + b_p);  NSP: pooled W + b (2 classes)
  RTD head (ELECTRA's discriminator): gelu(h W_1 + b_1) w_2 + b_2, one logit per token
"""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from encoder_jax.model import BertForPreTraining, ModelConfig, RtdHead
from random_params import randomize

D, E, V, T, EPS = 32, 16, 40, 7, 1e-5


def _cfg(**kw):
  return ModelConfig(**{**dict(vocab_size=V, hidden_size=D, num_layers=2, num_heads=4,
                               ffn_size=64, max_positions=16, layer_norm_eps=EPS,
                               hidden_dropout=0.0, attention_dropout=0.0), **kw})


def _np(x):
  return np.asarray(x, np.float64)


def _gelu(x):
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _ln(x, p):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS) * _np(
      p.scale[...]) + _np(p.bias[...])


def _dense(x, p):
  return x @ _np(p.kernel[...]) + _np(p.bias[...])


@pytest.mark.parametrize("embedding_size", [None, E], ids=["tied_same_width", "factorized"])
def test_pretraining_model_heads_match_numpy_on_the_encoders_output(embedding_size):
  model = BertForPreTraining(_cfg(embedding_size=embedding_size), nsp=True, rngs=nnx.Rngs(0))
  randomize(model, 1)
  rng = np.random.default_rng(2)
  mask = np.arange(T)[None, :] < np.array([[T], [4]])
  ids = np.where(mask, rng.integers(1, V, (2, T)), 0).astype(np.int32)
  types = np.where(mask & (np.arange(T) >= 3), 1, 0).astype(np.int32)
  seg = np.where(mask, np.where(np.arange(T) < 5, 1, 2), 0).astype(np.int32)  # 2 packed in row 0
  # Not the default positions (which would restart at every packed example): offsets of 2.
  positions = np.broadcast_to(np.arange(T) + 2, (2, T)).astype(np.int32)
  mlm_pos = np.array([[1, 5, 6], [0, 2, 3]], np.int32)
  args = [jnp.asarray(a) for a in (ids, mask, types, seg, positions)]

  fwd = nnx.jit(lambda m, *a, p: m(*a, mlm_positions_BxP=p))
  mlm, nsp, out = fwd(model, *args, p=jnp.asarray(mlm_pos))
  # bert.py hands every input to the encoder: its output is the encoder's own on them ...
  enc = nnx.jit(lambda e, *a: e(*a).hidden_BxTxD)
  own = enc(model.bert.encoder, *args)
  np.testing.assert_array_equal(out.hidden_BxTxD, own)
  np.testing.assert_array_equal(out.mask_BxT, mask)
  # ... and each of them matters (so the check above could fail if one were dropped).
  for i in (2, 3, 4):
    dropped = list(args)
    dropped[i] = None
    moved = np.abs(np.asarray(enc(model.bert.encoder, *dropped)) - np.asarray(own))[mask]
    assert moved.max() > 1e-3, i

  h = _np(own)
  head = model.mlm
  picked = np.take_along_axis(h, mlm_pos[..., None], axis=1)
  want_mlm = (_ln(_gelu(_dense(picked, head.transform)), head.ln)
              @ _np(model.bert.encoder.embeddings.token.embedding[...]).T + _np(head.bias[...]))
  pooled = np.tanh(_dense(h[:, 0], model.bert.pooler.dense))
  want_nsp = _dense(pooled, model.nsp.out)
  assert mlm.shape == (2, 3, V) and mlm.dtype == jnp.float32 and nsp.dtype == jnp.float32
  np.testing.assert_allclose(_np(mlm), want_mlm, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(_np(nsp), want_nsp, atol=2e-5, rtol=1e-5)
  # The dense head (no positions) gives the same rows at every position.
  dense_mlm, _, _ = fwd(model, *args, p=None)
  np.testing.assert_allclose(
      _np(dense_mlm),
      _ln(_gelu(_dense(h, head.transform)), head.ln)
      @ _np(model.bert.encoder.embeddings.token.embedding[...]).T + _np(head.bias[...]),
      atol=2e-5, rtol=1e-5)


def test_rtd_head_matches_numpy():
  head = RtdHead(_cfg(), rngs=nnx.Rngs(0))
  randomize(head, 3)
  h = np.random.default_rng(4).standard_normal((2, T, D)).astype(np.float32)
  got = head(jnp.asarray(h))
  want = _dense(_gelu(_dense(_np(h), head.dense)), head.out)[..., 0]
  assert got.shape == (2, T) and got.dtype == jnp.float32
  np.testing.assert_allclose(_np(got), want, atol=2e-5, rtol=1e-5)
