"""The pre-LN encoder stack, end to end, against a float64 numpy reference written from the
definitions, not from the package's layers:

  Pre-LN Transformer (Xiong et al. 2020, "On Layer Normalization in the Transformer
  Architecture", Figure 1 (b) / Table 1):   x_{l,i}  = x_l + Attn(LN(x_l))
                                             x_{l+1} = x_{l,i} + FFN(LN(x_{l,i}))
                                             output  = LN(x_L)  (the final LayerNorm)
  embeddings (BERT): x_0 = LN(token[id] + position[pos] + type[tt])
  ALiBi (Press et al. 2022, section 3; symmetric |i - j| for a bidirectional encoder, as in
  MosaicBERT): logits_n(i, j) += -m_n * |i - j|, m_n = 2^(-8n / N) for head n = 1..N.

Several layers, non-trivial parameters everywhere (so a skipped or misplaced piece shows),
padding in the batch, learned positions alone and with ALiBi, scanned and unrolled stacks.
tests/model/test_torch_parity.py checks one block of either kind against torch; this checks
the stack around it (embeddings, depth, final LayerNorm, masks, the ALiBi bias).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from encoder_jax.model import Encoder, ModelConfig
from random_params import randomize

D, N, F, L, V, T = 32, 4, 64, 3, 50, 9
EPS = 1e-5
LENGTHS = [9, 6, 2]  # padding in two of the three rows


def _cfg(position_bias: str, scan: bool) -> ModelConfig:
  # Dropout rates stay at BERT's 0.1: a model is built in eval mode, which must drop nothing.
  return ModelConfig(vocab_size=V, hidden_size=D, num_layers=L, num_heads=N, ffn_size=F,
                     max_positions=16, norm_first=True, layer_norm_eps=EPS,
                     position_bias=position_bias, scan_layers=scan)


# --------------------------------------------------------------------------- the reference
def _ln(x, p):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + EPS) * p["scale"] + p["bias"]


def _gelu(x):  # exact (erf) GELU, BERT's
  return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _alibi_slopes(n):  # Press et al.: geometric, starting at and with ratio 2^(-8/n) (n = 2^k)
  return np.array([2.0 ** (-8.0 * k / n) for k in range(1, n + 1)])


def _attention(x_BxTxD, p, keys_BxT, bias_NxTxT):
  """Multi-head self-attention from its definition: per head n, softmax over visible keys of
  q_n k_n^T / sqrt(H) (+ bias_n), times v_n; heads concatenated and projected."""
  H = D // N
  w, b = p["qkv_kernel"], p["qkv_bias"]  # the package's fused layout: [D, 3, N, H], [3, N, H]
  out = np.zeros_like(x_BxTxD)
  for n in range(N):
    q = x_BxTxD @ w[:, 0, n] + b[0, n]
    k = x_BxTxD @ w[:, 1, n] + b[1, n]
    v = x_BxTxD @ w[:, 2, n] + b[2, n]
    logits = q @ np.swapaxes(k, 1, 2) / np.sqrt(H)
    if bias_NxTxT is not None:
      logits = logits + bias_NxTxT[n]
    logits = np.where(keys_BxT[:, None, :], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out += (probs @ v) @ p["out_kernel"][n]  # head n's rows of the output projection
  return out + p["out_bias"]


def _ffn(x, p):
  return _gelu(x @ p["ffn_in"]["kernel"] + p["ffn_in"]["bias"]) @ p["ffn_out"]["kernel"] + (
      p["ffn_out"]["bias"])


def reference_pre_ln(params, ids_BxT, types_BxT, keys_BxT, alibi: bool):
  """Embeddings -> L pre-LN blocks -> final LayerNorm, in float64."""
  e = params["embeddings"]
  pos_BxT = np.broadcast_to(np.arange(ids_BxT.shape[1]), ids_BxT.shape)
  x = _ln(e["token"]["embedding"][ids_BxT] + e["position"]["embedding"][pos_BxT]
          + e["token_type"]["embedding"][types_BxT], e["ln"])
  bias = None
  if alibi:
    dist_TxT = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    bias = -_alibi_slopes(N)[:, None, None] * dist_TxT[None]
  for layer in params["layers"]:
    x = x + _attention(_ln(x, layer["ln_attn"]), layer["attn"], keys_BxT, bias)
    x = x + _ffn(_ln(x, layer["ln_ffn"]), layer)
  return _ln(x, params["final_ln"])


def _std(name: str) -> float:
  """The random parameters' scale, where attention is far from uniform; every bias
  non-zero."""
  if name == "scale":
    return 0.2
  return {"embedding": 0.5, "qkv_kernel": 0.3}.get(name, 0.1 if "bias" in name else 0.15)


def _params_as_float64(enc: Encoder):
  """The model's parameters (from its nnx state) as nested float64 arrays, one dict per layer
  whether the stack is scanned (stacked on a leading axis) or unrolled (a list)."""
  pure = jax.tree.map(lambda a: np.asarray(a, np.float64),
                      nnx.to_pure_dict(nnx.state(enc, nnx.Param)))
  blocks = pure.pop("blocks")
  if enc.cfg.scan_layers:
    pure["layers"] = [jax.tree.map(lambda a, i=i: a[i], blocks) for i in range(L)]
  else:
    pure["layers"] = [blocks[i] for i in range(L)]
  return pure


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
@pytest.mark.parametrize("position_bias", ["none", "alibi"], ids=["learned_pos", "alibi"])
def test_pre_ln_stack_matches_numpy_reference(position_bias, scan):
  enc = Encoder(_cfg(position_bias, scan), rngs=nnx.Rngs(0))
  randomize(enc, 1, _std)
  rng = np.random.default_rng(2)
  keys_BxT = np.arange(T)[None, :] < np.array(LENGTHS)[:, None]
  ids_BxT = np.where(keys_BxT, rng.integers(1, V, (len(LENGTHS), T)), 0).astype(np.int32)
  types_BxT = np.where(keys_BxT & (np.arange(T)[None, :] >= 4), 1, 0).astype(np.int32)

  got = nnx.jit(lambda e, x, m, tt: e(x, m, token_types_BxT=tt).hidden_BxTxD)(
      enc, jnp.asarray(ids_BxT), jnp.asarray(keys_BxT), jnp.asarray(types_BxT))
  want = reference_pre_ln(_params_as_float64(enc), ids_BxT, types_BxT, keys_BxT,
                          alibi=position_bias == "alibi")
  err = np.abs(np.asarray(got, np.float64) - want)[keys_BxT].max()
  print(f"pre-LN stack vs numpy reference ({position_bias}, scan={scan}): max abs diff {err:.1e}")
  assert err <= 1e-5
