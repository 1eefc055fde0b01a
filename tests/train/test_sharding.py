"""DP / FSDP / TP on 8 fake CPU devices give the single-device numbers (MLM and ELECTRA)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from encoder_jax.model import ModelConfig
from encoder_jax.train import sharding as sh
from encoder_jax.train import step as S
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


def _run(objective: str, mesh_dims, steps=3):
  obj = S.ObjectiveConfig(objective=objective, vocab_size=256, mask_id=4,
                          special_ids=(0, 1, 2, 3, 4), max_predictions=4, gen_hidden_frac=0.5)
  parts = build_optimizer(OptimConfig(learning_rate=1e-3, warmup_steps=1, total_steps=10))
  tr, init = S.create(CFG, obj, parts.tx, parts.schedule, seed=0)
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
  losses = []
  for _ in range(steps):
    state, m = step(state, put(batch))
    losses.append(float(m["loss"]))
  return np.array(losses), jax.tree.map(np.asarray, state.params), state


@pytest.fixture(scope="module", params=["mlm", "electra"])
def reference(request):
  return request.param, _run(request.param, None)


@pytest.mark.parametrize("name", sorted(MESHES))
def test_mesh_matches_single_device(reference, name):
  objective, (ref_losses, ref_params, _) = reference
  losses, params, state = _run(objective, MESHES[name])
  rel = np.abs(losses - ref_losses) / np.abs(ref_losses)
  diff = max(float(np.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)))
  print(f"{objective} {name}: loss rel diff {rel.max():.1e}, params abs diff {diff:.1e}")
  assert rel.max() <= 1e-5 and diff <= 1e-5
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
