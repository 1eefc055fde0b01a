"""DP / FSDP / TP on 8 fake CPU devices give the single-device numbers (MLM and ELECTRA):
losses, parameters and the gradient norm. Clipped AdamW normalises the gradient's scale away,
so equal parameters after a few steps cannot show a gradient that is off by a constant
factor (a sum over shards instead of a mean); the gradient norm itself can."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from encoder_jax.model import ModelConfig
from encoder_jax.train import sharding as sh
from encoder_jax.train import step as S
from encoder_jax.objectives import pretraining
from encoder_jax.train.optim import OptimConfig, build_optimizer

CFG = ModelConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, ffn_size=128,
                  max_positions=32, hidden_dropout=0.1, attention_dropout=0.1)
MESHES = {"dp8": (8, 1, 1), "fsdp8": (1, 8, 1), "dp2xtp4": (2, 1, 4), "fsdp4xtp2": (1, 4, 2)}


def _batch():
  rng = np.random.default_rng(0)
  lengths = [16, 12, 9, 16, 5, 14, 16, 11]
  ids = np.zeros((8, 16), np.int32)
  for i, n in enumerate(lengths):  # [CLS]=2 ... [SEP]=3, pads 0
    ids[i, :n] = np.concatenate([[2], rng.integers(5, 256, n - 2), [3]])
  return {"input_ids": ids, "mask": ids != 0, "token_types": np.zeros_like(ids)}


def _objective(objective: str) -> S.ObjectiveConfig:
  return S.ObjectiveConfig(objective=objective, vocab_size=256, mask_id=4,
                           special_ids=(0, 1, 2, 3, 4), max_predictions=4, gen_hidden_frac=0.5)


def _trainer(objective: str):
  parts = build_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=1, total_steps=10))
  return S.create(CFG, _objective(objective), parts.tx, parts.schedule, seed=0)


def _run(objective: str, mesh_dims, steps=3):
  tr, init = _trainer(objective)
  batch = _batch()
  if mesh_dims is None:
    state, step = jax.jit(init)(), S.make_train_step(tr)
    put = lambda b: {k: jnp.asarray(v) for k, v in b.items()}
  else:
    mesh = sh.make_mesh(mesh_dims)
    shardings = sh.state_shardings(jax.eval_shape(init), mesh)
    state = jax.jit(init, out_shardings=shardings)()
    step = S.make_train_step(tr, shardings, sh.batch_sharding(mesh))
    put = lambda b: sh.shard_batch(b, mesh)
  losses, grad_norms = [], []
  for _ in range(steps):
    state, m = step(state, put(batch))
    losses.append(float(m["loss"]))
    grad_norms.append(float(m["grad_norm"]))
  return (np.array(losses), np.array(grad_norms), jax.tree.map(np.asarray, state.params), state)


def _first_grad_norm(objective: str) -> float:
  """|grad| of the first step's loss, differentiated directly on one device (no train step,
  no mesh): what every train step, sharded or not, must report."""
  tr, init = _trainer(objective)
  batch = {k: jnp.asarray(v) for k, v in _batch().items()}
  key = S.step_key(tr.seed, 0)
  loss = lambda p: pretraining.loss_and_metrics(nnx.merge(tr.graphdef_train, p), batch, key, tr.obj,
                                      train=True)[0]
  return float(optax.tree.norm(jax.jit(jax.grad(loss))(jax.jit(init)().params)))


@functools.lru_cache(maxsize=None)
def _reference(objective: str):
  ref = _run(objective, None)
  np.testing.assert_allclose(ref[1][0], _first_grad_norm(objective), rtol=1e-5)
  return ref


# Each objective on one pure and one mixed mesh: together every axis (data, fsdp, tensor) for
# both; each case compiles a partitioned step, the bulk of this file's time.
@pytest.mark.parametrize("objective,name", [("mlm", "dp8"), ("mlm", "fsdp4xtp2"),
                                            ("electra", "fsdp8"), ("electra", "dp2xtp4")])
def test_mesh_matches_single_device(objective, name):
  ref_losses, ref_norms, ref_params, _ = _reference(objective)
  losses, norms, params, state = _run(objective, MESHES[name])
  rel = np.abs(losses - ref_losses) / np.abs(ref_losses)
  rel_g = np.abs(norms - ref_norms) / ref_norms
  diff = max(float(np.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)))
  print(f"{objective} {name}: loss rel diff {rel.max():.1e}, grad norm rel diff "
        f"{rel_g.max():.1e}, params abs diff {diff:.1e}")
  assert rel.max() <= 1e-5 and rel_g.max() <= 1e-5 and diff <= 1e-5
  # The state really is distributed the way the rules say.
  kernel = state.params["bert" if objective == "mlm" else "discriminator"]
  qkv = (kernel["encoder"] if objective == "mlm" else kernel)["blocks"]["attn"]["qkv_kernel"]
  spec = qkv[...].sharding.spec
  dims = dict(zip(sh.MESH_AXES, MESHES[name]))
  assert ("fsdp" in spec) == (dims["fsdp"] > 1) and ("tensor" in spec) == (dims["tensor"] > 1)


def test_rules_replicate_indivisible_and_reuse():
  mesh = sh.make_mesh((1, 2, 4))
  assert sh.logical_to_mesh(P("embed", "mlp"), (64, 128), mesh) == P("fsdp", "tensor")
  assert sh.logical_to_mesh(P("vocab", "embed"), (30522, 64), mesh) == P(None, "fsdp")
  assert sh.logical_to_mesh(P("embed_out", "mlp"), (64, 128), mesh) == P("tensor", None)
  with pytest.raises(ValueError, match="no rule"):
    sh.logical_to_mesh(P("bogus"), (8,), mesh)


def test_mesh_shape_fill_and_errors():
  assert sh.mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
  with pytest.raises(ValueError, match="at most one"):
    sh.mesh_shape((-1, -1, 1), 8)
  with pytest.raises(ValueError, match="uses 6 devices"):
    sh.mesh_shape((2, 3, 1), 8)
  assert isinstance(sh.batch_sharding(sh.make_mesh()), NamedSharding)


def _global_batch_buffers(encoder_module=None, heads_module=None) -> list[str]:
  """Buffers of the compiled FSDP-8 MLM step whose shape holds the global batch (8 rows) next
  to the row length: activations some device computes for every row, not only its own."""
  tr, init = _trainer("mlm")
  mesh = sh.make_mesh(MESHES["fsdp8"])
  shardings = sh.state_shardings(jax.eval_shape(init), mesh)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          jax.eval_shape(init), shardings)
  batch_sharding = sh.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
           for k, v in _batch().items()}
  hlo = S.make_train_step(tr, shardings, batch_sharding).lower(abstract, batch).compile(
  ).as_text()
  # [8,16,...] (rows, length, ...) or [L,8,16,...]: per device a row count of 8 means all rows.
  # Not counted: a fusion's parameters (their producer is), and the embedding lookup's gather:
  # FSDP splits the table's width, so each device looks up every row's 1/8 of it (f32[8,16,8],
  # the bytes of its own rows at full width) before the exchange; XLA's CPU pipeline without
  # its fusion emitters leaves that gather unfused, so it shows here.
  found = re.findall(r"= ((?:f32|bf16)\[(?:\d+,)?8,16,\d+[^\]]*\])\S* ([\w-]+)\(", hlo)
  return sorted({shape for shape, op in found if op not in ("parameter", "gather")})


def test_fsdp_step_computes_only_its_own_rows(monkeypatch):
  """Under FSDP every device must compute its own rows and gather the weights, never the
  reverse (model/activation_sharding.py: XLA chose to gather the global batch's activations
  for BERT-base's FFN on a v5e-16 slice: 9 GiB and ~16x the work per chip). The check is
  live: without the constraints the same compile holds global-batch activations."""
  assert _global_batch_buffers() == []
  from encoder_jax.model import encoder, heads
  monkeypatch.setattr(encoder, "batch_split", lambda x: x)
  monkeypatch.setattr(heads, "batch_split", lambda x: x)
  assert _global_batch_buffers() != []
