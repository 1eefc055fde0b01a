"""An encoder forward pass in float64 numpy, written from the papers rather than from
encoder_jax's modules: the independent reference of tests/model/test_block_switches.py and
test_packed_rows.py. It reads the weights of an unscanned encoder_jax Encoder (a pure dict) and
the ModelConfig, and recomputes everything else its own way (loops over rows, heads and
rotation pairs; no shared helper).

  LayerNorm   Ba et al. 2016: (x - mean) / sqrt(var + eps) * g [+ b]
  RMSNorm     Zhang & Sennrich 2019, eq. 4: x / sqrt(mean(x^2) + eps) * g
  GLU FFN     Shazeer 2020, eq. 5-6: (act(x W) * (x V)) W2; GEGLU act = GELU, SwiGLU act = Swish_1
  RoPE        Su et al. 2021, eq. 34: each pair of coordinates rotated by m * theta_d,
              theta_d = base^(-2d/H); pairs (d, d + H/2) (the "rotate half" layout HF uses)
  window      a query i of a local layer sees keys j with |i - j| <= local_window // 2
  packing     a query sees keys of its own segment only, never padding
"""
import math

import numpy as np


def gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


ACT = {"gelu": gelu, "relu": lambda x: np.maximum(x, 0.0),
       "silu": lambda x: x / (1.0 + np.exp(-x)),
       "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                     * (x + 0.044715 * x ** 3)))}


def norm(x, p, cfg):
  g = p["scale"]
  if cfg.norm == "rmsnorm":
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.layer_norm_eps) * g
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(var + cfg.layer_norm_eps) * g
  return y + p["bias"] if "bias" in p else y


def linear(x, p):
  y = x @ p["kernel"]
  return y + p["bias"] if "bias" in p else y


def rope(x_TxNxH, pos_T, base):
  """Rotate every pair (d, d + H/2) of every head by pos * base^(-2d/H)."""
  out = np.array(x_TxNxH)
  h = x_TxNxH.shape[-1]
  for d in range(h // 2):
    angle = pos_T * base ** (-2.0 * d / h)
    c, s = np.cos(angle)[:, None], np.sin(angle)[:, None]
    a, b = x_TxNxH[..., d], x_TxNxH[..., d + h // 2]
    out[..., d], out[..., d + h // 2] = a * c - b * s, a * s + b * c
  return out


def attention(x_TxD, p, cfg, valid_T, seg_T, pos_T, is_global):
  t, n, h = x_TxD.shape[0], cfg.num_heads, cfg.head_dim
  w = p["qkv_kernel"].reshape(cfg.hidden_size, 3 * n * h)
  qkv = x_TxD @ w
  if "qkv_bias" in p:
    qkv = qkv + p["qkv_bias"].reshape(-1)
  q, k, v = (qkv[:, i * n * h:(i + 1) * n * h].reshape(t, n, h) for i in range(3))
  if cfg.rope:
    base = cfg.rope_theta if is_global else cfg.rope_theta_local
    q, k = rope(q, pos_T, base), rope(k, pos_T, base)
  out = np.zeros((t, n, h))
  for i in range(t):
    allowed = [j for j in range(t) if valid_T[j] and seg_T[j] == seg_T[i]
               and (is_global or abs(i - j) <= cfg.local_window // 2)]
    if not allowed:
      continue
    for head in range(n):
      logits = np.array([q[i, head] @ k[j, head] for j in allowed]) / math.sqrt(h)
      prob = np.exp(logits - logits.max())
      prob /= prob.sum()
      out[i, head] = sum(pj * v[j, head] for pj, j in zip(prob, allowed))
  y = out.reshape(t, n * h) @ p["out_kernel"].reshape(n * h, cfg.hidden_size)
  return y + p["out_bias"] if "out_bias" in p else y


def ffn(x, layer, cfg):
  act = ACT[cfg.activation]
  if cfg.glu:
    w = layer["ffn_in"]["kernel"]  # [D, 2, F]: W (activated), V (gate)
    a, g = x @ w[:, 0], x @ w[:, 1]
    if "bias" in layer["ffn_in"]:
      a, g = a + layer["ffn_in"]["bias"][0], g + layer["ffn_in"]["bias"][1]
    hidden = act(a) * g
  else:
    hidden = act(linear(x, layer["ffn_in"]))
  return linear(hidden, layer["ffn_out"])


def encoder(params, cfg, ids, valid, segments, positions, types=None):
  """Hidden states [B, T, D] (float64) of an unscanned Encoder with `params` (pure dict)."""
  params = _as_np(params)
  emb, rows = params["embeddings"], []
  for b in range(ids.shape[0]):
    x = emb["token"]["embedding"][ids[b]]
    if cfg.learned_positions:
      x = x + emb["position"]["embedding"][positions[b]]
    if cfg.type_vocab_size:
      x = x + emb["token_type"]["embedding"][np.zeros_like(ids[b]) if types is None
                                              else types[b]]
    if cfg.embedding_norm:
      x = norm(x, emb["ln"], cfg)
    if cfg.embed_size != cfg.hidden_size:
      x = linear(x, params["embed_proj"])
    for i in range(cfg.num_layers):
      layer = params["blocks"][i]
      is_global = cfg.local_window == 0 or i % cfg.global_every == 0
      attn = lambda y, layer=layer, g=is_global: attention(y, layer["attn"], cfg, valid[b],
                                                           segments[b], positions[b], g)
      if cfg.norm_first:
        x = x + attn(norm(x, layer["ln_attn"], cfg) if "ln_attn" in layer else x)
        x = x + ffn(norm(x, layer["ln_ffn"], cfg), layer, cfg)
      else:
        x = norm(x + attn(x), layer["ln_attn"], cfg)
        x = norm(x + ffn(x, layer, cfg), layer["ln_ffn"], cfg)
    if cfg.norm_first:
      x = norm(x, params["final_ln"], cfg)
    rows.append(x)
  return np.stack(rows)


def _as_np(tree):
  if isinstance(tree, dict):
    return {k: _as_np(v) for k, v in tree.items()}
  return np.asarray(tree, np.float64)
