"""The attention computation the jitted train step traces is the configured one, and both
computations train alike.

Evidence read from the jaxpr of `make_train_step(...)` (the real jitted step, value_and_grad and
the optimizer included), not from the model's own bookkeeping alone:
  * the named scope each path runs under (`attention_xla` | `attention_cudnn` |
    `attention_explicit`, set by MultiHeadAttention._attend);
  * jax.nn.dot_product_attention's own einsum (`BTNH,BSNH->BNTS` in jax's name stack) against
    the explicit path's (`btnh,bsnh->bnts`);
  * the attention-probability dropout mask (uint32 bits of shape [B, N, T, S]) that only the
    explicit path draws;
  * cuDNN's fused-attention primitives (forward and backward) when "auto" runs on a GPU.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.extend import core as jcore

from encoder_jax.model import ModelConfig
from encoder_jax.train import step as step_lib

V, B, T, N = 64, 2, 8, 4
# Two packed examples then padding in row 0; one example then padding in row 1.
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]], np.int32)


def _trainer(tx=None, **model):
  cfg = ModelConfig(**{**dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=N,
                              ffn_size=64, max_positions=16, position_bias="alibi",
                              norm_first=True, remat_policy="dots", hidden_dropout=0.1),
                       **model})
  obj = step_lib.ObjectiveConfig(vocab_size=V, mask_id=4, special_ids=(0, 1, 2, 3, 4),
                                 max_predictions=3)
  return step_lib.create(cfg, obj, tx or optax.adamw(1e-3), lambda s: 1e-3, seed=0)


def _batch():
  ids = np.random.default_rng(0).integers(5, V, SEGMENTS.shape).astype(np.int32)
  mask = SEGMENTS > 0
  return {"input_ids": jnp.asarray(np.where(mask, ids, 0)), "mask": jnp.asarray(mask),
          "segment_ids": jnp.asarray(SEGMENTS)}


def _eqns(jaxpr, out):
  for eqn in jaxpr.eqns:
    out.append(eqn)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(sub, jcore.ClosedJaxpr):
          _eqns(sub.jaxpr, out)
        elif isinstance(sub, jcore.Jaxpr):
          _eqns(sub, out)
  return out


def _traced(**model) -> dict:
  """What the jitted train step of a tiny ALiBi + packed-rows model traces."""
  tr, init = _trainer(**model)
  train_step = step_lib.make_train_step(tr)
  closed = jax.make_jaxpr(train_step)(jax.eval_shape(init), _batch())
  eqns = _eqns(closed.jaxpr, [])
  assert len(eqns) > 100 and eqns[0].primitive.name in ("pjit", "jit")  # the jitted step
  stacks = [str(e.source_info.name_stack) for e in eqns]
  prob_bits = [v for e in eqns for v in e.outvars
               if getattr(v.aval, "dtype", None) == jnp.uint32 and v.aval.shape == (B, N, T, T)]
  return {
      "scopes": {s for s in ("attention_xla", "attention_cudnn", "attention_explicit")
                 if any(s in st for st in stacks)},
      "jax_einsum": any("BTNH,BSNH->BNTS" in st for st in stacks),
      "explicit_einsum": any("btnh,bsnh->bnts" in st for st in stacks),
      "prob_dropout": bool(prob_bits),
      "primitives": {e.primitive.name for e in eqns},
  }


@pytest.mark.parametrize("attention_dropout,path", [(0.0, "xla"), (0.1, "explicit")])
def test_train_step_traces_the_configured_attention(attention_dropout, path):
  # attention_impl="auto" (the default) on this CPU: XLA's jax.nn.dot_product_attention
  # unless dropout on the probabilities forces the explicit path.
  if jax.default_backend() == "gpu":
    pytest.skip("on a GPU 'auto' may pick cuDNN; the cuDNN test below covers that")
  got = _traced(attention_dropout=attention_dropout)
  assert got["scopes"] == {f"attention_{path}"}, got["scopes"]
  fused = path == "xla"
  assert got["jax_einsum"] is fused and got["explicit_einsum"] is not fused, got
  assert got["prob_dropout"] is not fused, got


def test_explicit_impl_without_dropout_traces_the_explicit_path():
  got = _traced(attention_dropout=0.0, attention_impl="explicit")
  assert got["scopes"] == {"attention_explicit"} and got["explicit_einsum"], got
  assert not got["jax_einsum"] and not got["prob_dropout"], got


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])
def test_auto_traces_cudnn_on_a_gpu_in_bf16(attention_dropout, monkeypatch):
  """"auto" on a GPU in bf16: cuDNN flash attention (forward and backward primitives) in the
  train step, with the ALiBi bias and the packed-row mask; the explicit path where attention
  dropout is on. On a CPU machine this traces (never compiles) with the backend reading "gpu"
  and cuDNN's version probe answering, which is all the choice depends on."""
  if jax.default_backend() != "gpu":
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
    monkeypatch.setattr(cudnn_fa, "check_cudnn_version", lambda: 90800)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  got = _traced(attention_dropout=attention_dropout, dtype="bfloat16")
  cudnn = {"dot_product_attention_fwd_wrapper", "dot_product_attention_bwd_wrapper"}
  if attention_dropout == 0.0:
    assert got["scopes"] == {"attention_cudnn"}, got["scopes"]
    assert cudnn <= got["primitives"], sorted(got["primitives"])
  else:
    assert got["scopes"] == {"attention_explicit"}, got["scopes"]
    assert not cudnn & got["primitives"]


def _keep_gradients() -> optax.GradientTransformation:
  """An "optimizer" whose state after a step is that step's gradients, exactly."""
  return optax.GradientTransformation(
      lambda params: jax.tree.map(jnp.zeros_like, params),
      lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))


def _one_step(attention_impl):
  """(metrics, gradients) of one real jitted train step."""
  tr, init = _trainer(tx=_keep_gradients(), attention_dropout=0.0,
                      attention_impl=attention_impl)
  state, metrics = step_lib.make_train_step(tr)(jax.jit(init)(), _batch())
  return jax.device_get(metrics), jax.device_get(state.opt_state)


def test_fused_and_explicit_train_steps_agree():
  """XLA's jax.nn.dot_product_attention vs the explicit einsum path in one training step
  (fp32, hidden dropout 0.1 with the same masks, ALiBi, packed rows with padding): loss to
  1e-6 relative, every gradient entry to 1e-4 relative + 1e-6 of the largest gradient absolute.
  Measured: equal loss; gradients within 4e-12 on an Intel AVX-512 host, within 1.2e-7 (1.1e-5
  relative, fp32 summation order) on an AMD AVX2 host. Still caught: the ALiBi bias scaled by
  0.99 in the explicit path alone (gradients 1.8x apart relative)."""
  m_fused, g_fused = _one_step("xla")
  m_explicit, g_explicit = _one_step("explicit")
  assert np.isfinite(m_fused["loss"]) and m_fused["loss"] > 1.0
  np.testing.assert_allclose(m_fused["loss"], m_explicit["loss"], rtol=1e-6)
  np.testing.assert_allclose(m_fused["grad_norm"], m_explicit["grad_norm"], rtol=1e-5)
  leaves_f, leaves_e = jax.tree.leaves(g_fused), jax.tree.leaves(g_explicit)
  assert len(leaves_f) == len(leaves_e) > 10
  scale = max(np.abs(g).max() for g in leaves_f)
  assert scale > 1e-3  # the gradients are not all ~0
  for gf, ge in zip(leaves_f, leaves_e):
    np.testing.assert_allclose(gf, ge, rtol=1e-4, atol=1e-6 * scale)
