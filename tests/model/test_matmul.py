"""The bf16 matmul path (encoder_jax.model.matmul): what it computes, that the model really takes
it, and that it runs on XLA:CPU whatever the shapes.

Its forward and both gradients must equal fp32 einsums of the bf16-rounded operands (fp32
accumulation, one rounding at the end); every dot the model traces with dot_dtype="bfloat16"
must be bf16 x bf16 -> fp32; and models of awkward shapes (batch 1, one output unit, tiny
heads) must compile and run, since XLA:CPU has no bf16 x bf16 -> fp32 kernel off its fast path.
"""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model import matmul
from encoder_jax.model.bert import BertForPreTraining
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.electra import ElectraDiscriminator

BF16 = jnp.bfloat16

# Every spec the model uses (attention, decoder, Linear, tied logits), with shapes that make
# each index distinct, plus degenerate ones the fast path refuses (a side of length 1).
SPECS = [
    ("btd,dcnh->btcnh", (2, 9, 16), (16, 3, 2, 8)),
    ("btnh,bsnh->bnts", (2, 9, 2, 8), (2, 11, 2, 8)),
    ("bnts,bsnh->btnh", (2, 2, 9, 11), (2, 11, 2, 8)),
    ("btnh,nhd->btd", (2, 9, 2, 8), (2, 8, 16)),
    ("bsm,mcnh->bscnh", (2, 11, 12), (12, 2, 2, 8)),
    ("abi,io->abo", (3, 5, 16), (16, 24)),
    ("ai,io->ao", (1, 16), (16, 24)),          # batch 1: M = 1
    ("abi,io->abo", (3, 5, 16), (16, 1)),      # one output unit: N = 1
    ("abe,ve->abv", (3, 4, 16), (40, 16)),
]


def _rounded(x):
  return x.astype(BF16).astype(jnp.float32)


@pytest.mark.parametrize("spec,sa,sb", SPECS)
@pytest.mark.parametrize("act", [jnp.float32, BF16])
def test_einsum_is_fp32_accumulation_of_bf16_operands(spec, sa, sb, act):
  ka, kb, kg = jax.random.split(jax.random.key(0), 3)
  a = jax.random.normal(ka, sa, jnp.float32).astype(act)
  b = jax.random.normal(kb, sb, jnp.float32).astype(act)
  out = jax.jit(lambda a, b: matmul.einsum(spec, a, b, bf16=True))(a, b)
  ref = jnp.einsum(spec, _rounded(a), _rounded(b), precision="highest")
  assert out.dtype == act
  tol = 1e-5 if act == jnp.float32 else 1e-2  # fp32 sum vs one more rounding to bf16
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=tol, atol=tol)

  g = jax.random.normal(kg, out.shape, jnp.float32).astype(act)
  da, db = jax.jit(jax.grad(lambda a, b: jnp.vdot(
      matmul.einsum(spec, a, b, bf16=True).astype(jnp.float32), g.astype(jnp.float32)),
      argnums=(0, 1)))(a, b)
  ref_da, ref_db = jax.grad(lambda a, b: jnp.vdot(
      jnp.einsum(spec, a, b, precision="highest"), _rounded(g)), argnums=(0, 1))(
          _rounded(a), _rounded(b))
  assert da.dtype == a.dtype and db.dtype == b.dtype
  # The backward dots' results are rounded to bf16 (the operands' dtype on the path), as
  # torch autocast's are, whatever the activations' dtype: the fp32 sum, rounded once.
  np.testing.assert_allclose(np.asarray(da, np.float32), ref_da, rtol=1e-2, atol=1e-2)
  np.testing.assert_allclose(np.asarray(db, np.float32), ref_db, rtol=1e-2, atol=1e-2)


def test_out_dtype_keeps_the_fp32_accumulator():
  a = jnp.full((4, 300), 1.0 + 2.0 ** -7, BF16)  # 300 * 1.0078125 = 302.34375: not a bf16
  b = jnp.ones((300, 8), BF16)
  out = matmul.einsum("ai,io->ao", a, b, bf16=True, out_dtype=jnp.float32)
  assert out.dtype == jnp.float32 and float(out[0, 0]) == 302.34375


def test_a_spec_without_an_einsum_gradient_is_refused():
  with pytest.raises(ValueError, match="indices"):
    matmul.einsum("ij,jk->i", jnp.ones((2, 3)), jnp.ones((3, 4)), bf16=True)


def test_the_path_is_chosen_per_dtype_and_platform(monkeypatch):
  assert matmul.bf16_dots("bfloat16", jnp.float32, "gpu")
  assert not matmul.bf16_dots("", jnp.float32, "cpu")
  assert matmul.bf16_dots("", jnp.bfloat16, "cpu")        # bf16 model on CPU
  assert not matmul.bf16_dots("", jnp.bfloat16, "tpu")    # the compiler's own bf16 dots
  monkeypatch.setattr(matmul, "cpu_has_bf16", lambda: True)
  assert matmul.bf16_dots("auto", jnp.float32, "cpu")
  assert not matmul.bf16_dots("auto", jnp.float32, "gpu")
  monkeypatch.setattr(matmul, "cpu_has_bf16", lambda: False)
  assert not matmul.bf16_dots("auto", jnp.float32, "cpu")
  assert "fp32 accumulation" in matmul.describe_dots("bfloat16", jnp.float32, "cpu")
  assert "in float32" in matmul.describe_dots("auto", jnp.float32, "cpu")


def test_a_bad_dot_dtype_names_the_flag():
  with pytest.raises(ValueError, match="--config.model.dot_dtype"):
    ModelConfig(dot_dtype="float16")


def _cfg(**kw):
  base = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
              max_positions=32, hidden_dropout=0.0, attention_dropout=0.0)
  return ModelConfig(**{**base, **kw})


def _dots(fn, *args):
  """(lhs dtype, rhs dtype, preferred dtype) of every dot_general `fn` traces, sub-jaxprs too."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append((eqn.invars[0].aval.dtype, eqn.invars[1].aval.dtype,
                      eqn.params.get("preferred_element_type")))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def _grad_fn(model):
  graphdef, state = nnx.split(model)

  def loss(state, ids):
    logits, nsp, _ = nnx.merge(graphdef, state)(ids)
    return jnp.mean(logits) + jnp.mean(nsp)
  return jax.grad(loss), state


@pytest.mark.parametrize("scan", [True, False])
def test_the_model_takes_bf16_dots_forward_and_backward(scan):
  ids = jnp.arange(2 * 16, dtype=jnp.int32).reshape(2, 16) % 60 + 4
  dots = _dots(*_grad_fn(BertForPreTraining(_cfg(dot_dtype="bfloat16", scan_layers=scan),
                                            rngs=nnx.Rngs(0))), ids)
  fast = [d for d in dots if d == (BF16, BF16, jnp.float32)]
  # Forward and the two gradients of 6 dots per block (QKV, QK, PV, out, FFN in and out; a
  # scanned stack traces one block, an unrolled one both), the MLM head's transform and tied
  # decoder, the pooler and the NSP head (at batch 2 and 2 classes still on the path: only a
  # side of length 1 is refused).
  assert len(fast) == 3 * (6 * (1 if scan else 2) + 4), dots
  assert all(d[:2] in ((BF16, BF16), (jnp.float32, jnp.float32)) for d in dots), dots
  fp32 = _dots(*_grad_fn(BertForPreTraining(_cfg(scan_layers=scan), rngs=nnx.Rngs(0))), ids)
  assert fp32 and all(d[:2] == (jnp.float32, jnp.float32) for d in fp32), fp32


def _run_grad(model, ids, head_of):
  graphdef, state = nnx.split(model)

  def loss(state):
    return jnp.mean(head_of(nnx.merge(graphdef, state)(ids)))
  leaves = jax.tree.leaves(jax.jit(jax.grad(loss))(state))
  assert leaves and all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


@pytest.mark.parametrize("batch", [1, 3])
def test_awkward_shapes_compile_and_run_on_cpu(batch):
  # Batch 1 (M = 1 in the pooler and NSP head), ELECTRA's one-unit RTD head (N = 1), head dim
  # 4, a scanned + "dots"-rematerialised stack: every dot must run (off the fast path XLA:CPU
  # has no bf16 x bf16 -> fp32 kernel and fails at run time, not at trace time).
  cfg = _cfg(dot_dtype="bfloat16", num_heads=8, remat_policy="dots")
  ids = jnp.arange(batch * 16, dtype=jnp.int32).reshape(batch, 16) % 60 + 4
  _run_grad(BertForPreTraining(cfg, rngs=nnx.Rngs(0)), ids,
            lambda out: jnp.mean(out[0]) + jnp.mean(out[1]))
  _run_grad(ElectraDiscriminator(cfg, rngs=nnx.Rngs(0)), ids, lambda out: out[0])
