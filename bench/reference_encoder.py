"""A plain pure-JAX BERT pre-training step of the same shapes as ours: the ceiling our step is
compared with in bench/tpu_aot.py --with_reference (every time there a compiler ESTIMATE).

No Flax, no NNX, no sharding rules, no masking on device: parameters are a dict of fp32 arrays
(BERT's shapes, the token table as wide as ours, padding included), the forward pass is
einsums in the compute dtype with fp32 softmax and LayerNorm statistics, BERT's post-LN
block with exact GELU, dropout 0.1 on hidden states and attention probabilities, sparse MLM
(the decoder tied to the token table, run at the masked positions only) and NSP, fp32
cross-entropy; optax AdamW with global-norm clipping at 1.0. The masked inputs, their
positions and labels come in the batch (computed on the host), so the masking our step does
on device is not part of the ceiling. Compiled like ours: the same mesh (data parallel,
parameters and optimizer replicated), rows, layer layout (unrolled, or lax.scan) and remat
policy ("dots" saves matmul outputs, as ours).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

REMAT = {"none": None, "dots": jax.checkpoint_policies.checkpoint_dots, "full": "full"}


def init_params(cfg, key, nsp: bool = True) -> dict:
  """BERT's parameters at ModelConfig `cfg`'s sizes (fp32); blocks stacked on axis 0."""
  d, f, h, L = cfg.hidden_size, cfg.ffn_size, cfg.num_heads, cfg.num_layers
  ks = iter(jax.random.split(key, 16))
  normal = lambda shape: 0.02 * jax.random.normal(next(ks), shape, jnp.float32)
  zeros, ones = (lambda s: jnp.zeros(s, jnp.float32)), (lambda s: jnp.ones(s, jnp.float32))
  p = {"tok": normal((cfg.padded_vocab_size, d)), "pos": normal((cfg.max_positions, d)),
       "typ": normal((2, d)), "emb_ln": (ones(d), zeros(d)),
       "blocks": {"qkv": normal((L, d, 3 * d)), "qkv_b": zeros((L, 3 * d)),
                  "out": normal((L, d, d)), "out_b": zeros((L, d)),
                  "ln1": (ones((L, d)), zeros((L, d))),
                  "ffn_in": normal((L, d, f)), "ffn_in_b": zeros((L, f)),
                  "ffn_out": normal((L, f, d)), "ffn_out_b": zeros((L, d)),
                  "ln2": (ones((L, d)), zeros((L, d)))},
       "mlm_w": normal((d, d)), "mlm_b": zeros(d), "mlm_ln": (ones(d), zeros(d)),
       "mlm_bias": zeros(cfg.padded_vocab_size)}
  if nsp:
    p.update(pool_w=normal((d, d)), pool_b=zeros(d), nsp_w=normal((d, 2)), nsp_b=zeros(2))
  del h
  return p


def _ln(x, scale_bias, eps=1e-12):
  scale, bias = scale_bias
  x32 = x.astype(jnp.float32)
  mu = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mu).mean(-1, keepdims=True)
  return ((x32 - mu) * jax.lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


def _drop(x, key, rate):
  if key is None or rate == 0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _block(cfg, dt, x, bp, bias, key):
  B, T, d = x.shape
  h = cfg.num_heads
  ks = jax.random.split(key, 3) if key is not None else (None,) * 3
  qkv = jnp.einsum("btd,de->bte", x, bp["qkv"].astype(dt)) + bp["qkv_b"].astype(dt)
  q, k, v = jnp.split(qkv.reshape(B, T, 3, h, d // h), 3, axis=2)
  s = jnp.einsum("bqhk,bshk->bhqs", q[:, :, 0], k[:, :, 0],
                 preferred_element_type=jnp.float32) / math.sqrt(d // h) + bias
  probs = _drop(jax.nn.softmax(s, axis=-1).astype(dt), ks[0], cfg.attention_dropout)
  ctx = jnp.einsum("bhqs,bshk->bqhk", probs, v[:, :, 0]).reshape(B, T, d)
  a = jnp.einsum("btd,de->bte", ctx, bp["out"].astype(dt)) + bp["out_b"].astype(dt)
  x = _ln(x + _drop(a, ks[1], cfg.hidden_dropout), bp["ln1"])
  u = jax.nn.gelu(jnp.einsum("btd,df->btf", x, bp["ffn_in"].astype(dt))
                  + bp["ffn_in_b"].astype(dt), approximate=False)
  o = jnp.einsum("btf,fd->btd", u, bp["ffn_out"].astype(dt)) + bp["ffn_out_b"].astype(dt)
  return _ln(x + _drop(o, ks[2], cfg.hidden_dropout), bp["ln2"])


def loss_fn(cfg, params, batch, key, *, scan: bool, remat: str):
  """MLM (sparse) + NSP loss of one batch, dropout keys from `key`."""
  dt = jnp.dtype(cfg.dtype)
  ids, types = batch["input_ids"], batch["token_types"]
  T = ids.shape[1]
  x = (jnp.take(params["tok"], ids, axis=0) + params["pos"][:T][None]
       + jnp.take(params["typ"], types, axis=0)).astype(dt)
  k_emb, k_layers = jax.random.split(key)
  x = _drop(_ln(x, params["emb_ln"]), k_emb, cfg.hidden_dropout)
  bias = jnp.where(batch["mask"][:, None, None, :], 0.0, -1e9).astype(jnp.float32)
  layer_keys = jax.random.split(k_layers, cfg.num_layers)
  body = lambda x, bp, k: _block(cfg, dt, x, bp, bias, k)
  if REMAT[remat] == "full":
    body = jax.checkpoint(body)
  elif REMAT[remat] is not None:
    body = jax.checkpoint(body, policy=REMAT[remat])
  if scan:
    x, _ = jax.lax.scan(lambda c, a: (body(c, *a), None), x, (params["blocks"], layer_keys))
  else:
    for i in range(cfg.num_layers):
      x = body(x, jax.tree.map(lambda a, i=i: a[i], params["blocks"]), layer_keys[i])
  picked = jnp.take_along_axis(x, batch["mlm_positions"][..., None], axis=1)
  t = jax.nn.gelu(picked @ params["mlm_w"].astype(dt) + params["mlm_b"].astype(dt),
                  approximate=False)
  t = _ln(t, params["mlm_ln"])
  logits = jnp.einsum("bpd,vd->bpv", t, params["tok"].astype(dt),
                      preferred_element_type=jnp.float32) + params["mlm_bias"]
  logits = jnp.where(jnp.arange(logits.shape[-1]) < cfg.vocab_size, logits, -1e9)
  w = batch["mlm_weights"]
  nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
      logits, batch["mlm_labels"][..., None], axis=-1)[..., 0]
  loss = (nll * w).sum() / jnp.maximum(w.sum(), 1.0)
  if "pool_w" in params:
    pooled = jnp.tanh(x[:, 0] @ params["pool_w"].astype(dt) + params["pool_b"].astype(dt))
    nsp = (pooled @ params["nsp_w"].astype(dt)).astype(jnp.float32) + params["nsp_b"]
    loss = loss + (jax.nn.logsumexp(nsp, -1) - jnp.take_along_axis(
        nsp, batch["nsp_label"][:, None], axis=-1)[:, 0]).mean()
  return loss


def batch_shapes(batch_size: int, seq_len: int, max_predictions: int) -> dict:
  i32 = np.int32
  return {"input_ids": ((batch_size, seq_len), i32), "token_types": ((batch_size, seq_len), i32),
          "mask": ((batch_size, seq_len), np.bool_),
          "mlm_positions": ((batch_size, max_predictions), i32),
          "mlm_labels": ((batch_size, max_predictions), i32),
          "mlm_weights": ((batch_size, max_predictions), np.float32),
          "nsp_label": ((batch_size,), i32)}


def lower_step(cfg, devices, batch_size: int, seq_len: int, max_predictions: int, *,
               scan: bool, remat: str, nsp: bool = True):
  """The reference train step lowered for `devices` (data parallel), from abstract values."""
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-4, weight_decay=0.01))
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), nsp))
  opt = jax.eval_shape(tx.init, params)
  state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                       (params, opt, jax.ShapeDtypeStruct((), jnp.int32)))
  batch = {k: jax.ShapeDtypeStruct(s, d, sharding=split)
           for k, (s, d) in batch_shapes(batch_size, seq_len, max_predictions).items()}

  def step(state, batch):
    params, opt, n = state
    key = jax.random.fold_in(jax.random.key(0), n)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(cfg, p, batch, key, scan=scan,
                                                       remat=remat))(params)
    updates, opt = tx.update(grads, opt, params)
    return (optax.apply_updates(params, updates), opt, n + 1), loss

  shardings = jax.tree.map(lambda a: a.sharding, state)
  return jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, rep)).lower(state, batch)
