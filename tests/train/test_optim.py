"""Optimizer chain: decay masks on nnx paths, schedules, clipping, accumulation, LAMB, LLRD."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from encoder_jax.train import optim
from encoder_jax.train.optim import OptimConfig, build_optimizer

L, D = 3, 4


def bert_like_params(stacked: bool):
  """A dict pytree named like encoder_jax's BertForPreTraining (blocks stacked or unrolled)."""
  rng = np.random.default_rng(0)
  r = lambda *s: rng.standard_normal(s).astype(np.float32)  # numpy: no op-by-op compiles
  block = lambda: {"attn": {"query": {"kernel": r(D, D), "bias": r(D)}},
                   "ln_attn": {"scale": r(D), "bias": r(D)},
                   "ffn_in": {"kernel": r(D, 2 * D), "bias": r(2 * D)}}
  blocks = [block() for _ in range(L)]
  if stacked:
    blocks = jax.tree.map(lambda *xs: np.stack(xs), *blocks)
  else:
    blocks = dict(enumerate(blocks))
  return {"bert": {"encoder": {"embeddings": {"token": {"embedding": r(11, D)},
                                              "ln": {"scale": r(D), "bias": r(D)},
                                              "projection": {"kernel": r(D, D)}},
                               "blocks": blocks,
                               "final_ln": {"scale": r(D), "bias": r(D)}}},
          "mlm": {"transform": {"kernel": r(D, D), "bias": r(D)}, "bias": r(11)},
          "LayerNorm": {"gamma": r(D)}}  # HF/TF naming is caught too


def flat(tree):
  return {"/".join(map(str, optim.path_names(p))): v
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_decay_mask_excludes_norms_and_biases_by_path():
  for stacked in (False, True):
    mask = flat(optim.decay_mask(bert_like_params(stacked)))
    decayed = sorted(k for k, v in mask.items() if v)
    blocks = ([f"bert/encoder/blocks/{i}/" for i in range(L)] if not stacked
              else ["bert/encoder/blocks/"])
    want = sorted(["bert/encoder/embeddings/token/embedding",
                   "bert/encoder/embeddings/projection/kernel", "mlm/transform/kernel"]
                  + [b + k for b in blocks for k in ("attn/query/kernel", "ffn_in/kernel")])
    assert decayed == want


class Block(nnx.Module):

  def __init__(self, rngs):
    self.dense = nnx.Linear(D, D, rngs=rngs)
    self.ln = nnx.LayerNorm(D, rngs=rngs)


class Toy(nnx.Module):
  """Embeddings, an unrolled list and a vmapped (stacked) set of blocks, as nnx builds them."""

  def __init__(self, rngs):
    self.embeddings = nnx.Embed(7, D, rngs=rngs)
    self.blocks = nnx.List([Block(rngs) for _ in range(2)])

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def make(rngs):
      return Block(rngs)

    self.stack = make(rngs)


def test_weight_decay_applies_only_where_masked_on_nnx_state():
  model = nnx.jit(lambda: Toy(nnx.Rngs(0)))()  # one compile instead of one per init op
  cfg = OptimConfig(learning_rate=0.1, weight_decay=0.5, warmup_steps=0, total_steps=10)
  opt = nnx.Optimizer(model, build_optimizer(cfg).tx, wrt=nnx.Param)
  before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  zero_grads = jax.tree.map(np.zeros_like, before)
  # Adam's step is 0 for zero grads: only the decay moves params. (nnx.jit: eager nnx updates
  # compile op by op and take seconds.)
  nnx.jit(lambda o, m, g: o.update(m, g))(opt, model, zero_grads)
  after = flat(jax.tree.map(np.asarray, nnx.state(model, nnx.Param)))
  for name, old in flat(before).items():
    shrunk = np.allclose(after[name], old * (1 - 0.1 * 0.5))
    unchanged = np.array_equal(after[name], old)
    if name.endswith("kernel") or name.endswith("embedding"):
      assert shrunk and not unchanged, name
    else:
      assert unchanged, name  # biases and LayerNorm scales, stacked or not
  assert {k.split("/")[0] for k in after} == {"embeddings", "blocks", "stack"}


def test_schedules():
  kw = dict(learning_rate=1.0, warmup_steps=10, total_steps=110, end_lr_frac=0.1)
  lin = optim.learning_rate_schedule(OptimConfig(schedule="linear", **kw))
  np.testing.assert_allclose([lin(0), lin(5), lin(10), lin(60), lin(110), lin(500)],
                             [0.0, 0.5, 1.0, 0.55, 0.1, 0.1], rtol=1e-6)
  cos = optim.learning_rate_schedule(OptimConfig(schedule="cosine", **kw))
  np.testing.assert_allclose([cos(5), cos(10), cos(60), cos(110)], [0.5, 1.0, 0.55, 0.1],
                             rtol=1e-6)
  const = optim.learning_rate_schedule(OptimConfig(schedule="constant", **kw))
  np.testing.assert_allclose([const(5), const(10), const(1000)], [0.5, 1.0, 1.0])
  no_warmup = optim.learning_rate_schedule(OptimConfig(learning_rate=3e-4, warmup_steps=0,
                                                       total_steps=100))
  np.testing.assert_allclose([no_warmup(0), no_warmup(50)], [3e-4, 1.5e-4], rtol=1e-6)


def test_wsd_schedule_by_hand():
  """Warm-up 10, stable to step 70, decay over the last 30 (decay_frac 0.3 of 100) to 0.1:
  values computed by hand from the formulas in the module docstring."""
  kw = dict(learning_rate=2.0, warmup_steps=10, total_steps=100, end_lr_frac=0.1,
            schedule="wsd", decay_frac=0.3)
  lin = optim.learning_rate_schedule(OptimConfig(decay_shape="linear", **kw))
  sqrt = optim.learning_rate_schedule(OptimConfig(decay_shape="1-sqrt", **kw))
  steps = [0, 5, 10, 45, 69, 70, 77.5, 85, 100, 200]
  # warm-up 0 -> 2 over 10 steps; stable 2.0 in [10, 70); at 70 + s: 0.2 + 1.8 * f(s / 30)
  want_lin = [0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.2 + 1.8 * 0.75, 0.2 + 1.8 * 0.5, 0.2, 0.2]
  want_sqrt = [0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.2 + 1.8 * 0.5, 0.2 + 1.8 * (1 - 0.5 ** 0.5),
               0.2, 0.2]
  np.testing.assert_allclose([lin(s) for s in steps], want_lin, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose([sqrt(s) for s in steps], want_sqrt, rtol=1e-6, atol=1e-7)
  assert OptimConfig(**kw).decay_steps == 30
  no_warmup = optim.learning_rate_schedule(OptimConfig(
      learning_rate=1.0, warmup_steps=0, total_steps=100, schedule="wsd", decay_frac=1.0,
      decay_shape="1-sqrt"))
  np.testing.assert_allclose([no_warmup(0), no_warmup(25), no_warmup(100)], [1.0, 0.5, 0.0],
                             atol=1e-7)  # all decay, 1-sqrt: 1 - sqrt(1/4) at a quarter
  for bad, match in ((dict(decay_frac=0.0), "decay_frac"), (dict(decay_shape="cos"), "1-sqrt"),
                     (dict(warmup_steps=80), "overlap")):
    with pytest.raises(ValueError, match=match):
      OptimConfig(**{**kw, **bad})


def run_steps(tx, params, grads_list):
  state = tx.init(params)
  step = jax.jit(tx.update)
  for g in grads_list:
    updates, state = step(g, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def test_global_norm_clipping():
  params = {"w": jnp.ones((3,)), "b": jnp.zeros((2,))}
  g1 = {"w": jnp.array([3e3, 0.0, 4e3]), "b": jnp.zeros((2,))}  # global norm 5e3
  g2 = {"w": jnp.array([0.1, -0.2, 0.3]), "b": jnp.array([0.5, 0.0])}
  kw = dict(learning_rate=0.1, warmup_steps=0, total_steps=10, weight_decay=0.0)
  clipped, _ = run_steps(build_optimizer(OptimConfig(clip_grad_norm=1.0, **kw)).tx, params,
                         [g1, g2])
  manual, _ = run_steps(build_optimizer(OptimConfig(clip_grad_norm=0.0, **kw)).tx, params,
                        [jax.tree.map(lambda x: x / 5e3, g1), g2])
  unclipped, _ = run_steps(build_optimizer(OptimConfig(clip_grad_norm=0.0, **kw)).tx, params,
                           [g1, g2])
  np.testing.assert_allclose(clipped["w"], manual["w"], rtol=1e-5)
  np.testing.assert_allclose(clipped["b"], manual["b"], rtol=1e-5)
  assert not np.allclose(clipped["w"], unclipped["w"], rtol=1e-3)


def test_accumulation_equals_mean_gradient_step():
  params = {"w": jnp.arange(4.0)}
  g1, g2 = {"w": jnp.array([1.0, -2.0, 0.5, 0.0])}, {"w": jnp.array([3.0, 0.0, -0.5, 1.0])}
  kw = dict(learning_rate=0.1, warmup_steps=0, total_steps=10)
  acc_tx = build_optimizer(OptimConfig(accumulation_steps=2, **kw)).tx
  after_first, _ = run_steps(acc_tx, params, [g1])
  np.testing.assert_array_equal(after_first["w"], params["w"])  # no update mid-accumulation
  acc, _ = run_steps(acc_tx, params, [g1, g2])
  mean, _ = run_steps(build_optimizer(OptimConfig(**kw)).tx, params,
                      [jax.tree.map(lambda a, b: (a + b) / 2, g1, g2)])
  np.testing.assert_allclose(acc["w"], mean["w"], rtol=1e-6)


def unstack(tree):
  """Stacked blocks [L, ...] -> blocks/<i>/... (the unrolled layout of the same model)."""
  enc = tree["bert"]["encoder"]
  blocks = {i: jax.tree.map(lambda x, i=i: np.asarray(x)[i], enc["blocks"]) for i in range(L)}
  return {**tree, "bert": {"encoder": {**enc, "blocks": blocks}}}


def test_lamb_matches_optax_and_is_per_layer_when_stacked():
  params = bert_like_params(stacked=False)
  rng = np.random.default_rng(1)
  grads = [jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32), params)
           for _ in range(3)]
  cfg = OptimConfig(optimizer="lamb", learning_rate=0.01, warmup_steps=0, total_steps=10,
                    clip_grad_norm=0.0)
  ours, _ = run_steps(build_optimizer(cfg).tx, params, grads)
  ref_tx = optax.lamb(optim.learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, mask=optim.decay_mask)
  ref, _ = run_steps(ref_tx, params, grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), ours, ref)
  # The stacked layout gives each layer its own trust ratio: same result as unrolled.
  stacked = bert_like_params(stacked=True)
  stacked_grads = [jax.tree.map(lambda *xs: np.stack(xs), *[g["bert"]["encoder"]["blocks"][i]
                                                            for i in range(L)]) for g in grads]
  stacked_grads = [{**g, "bert": {"encoder": {**g["bert"]["encoder"], "blocks": sg}}}
                   for g, sg in zip(grads, stacked_grads)]
  ours_stacked, _ = run_steps(build_optimizer(cfg).tx, stacked, stacked_grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               unstack(ours_stacked), ours)


def test_layer_decay_scales_by_depth_for_unrolled_and_stacked():
  decay = 0.5
  unrolled = flat(optim.layer_decay_scales(bert_like_params(False), L, decay))
  assert unrolled["bert/encoder/embeddings/token/embedding"] == decay ** (L + 1)
  assert unrolled["bert/encoder/embeddings/ln/scale"] == decay ** (L + 1)
  for i in range(L):
    assert unrolled[f"bert/encoder/blocks/{i}/attn/query/kernel"] == decay ** (L - i)
  assert unrolled["mlm/transform/kernel"] == 1.0
  assert unrolled["bert/encoder/final_ln/scale"] == 1.0
  stacked = flat(optim.layer_decay_scales(bert_like_params(True), L, decay))
  s = stacked["bert/encoder/blocks/attn/query/kernel"]
  assert s.shape == (L, 1, 1)
  np.testing.assert_allclose(s[:, 0, 0], [decay ** (L - i) for i in range(L)])
  # In the chain: stacked and unrolled layouts move every layer identically.
  cfg = OptimConfig(learning_rate=0.01, warmup_steps=0, total_steps=10, layer_decay=decay)
  p_s = bert_like_params(True)
  g_s = jax.tree.map(np.ones_like, p_s)
  out_s, _ = run_steps(build_optimizer(cfg, num_layers=L).tx, p_s, [g_s])
  out_u, _ = run_steps(build_optimizer(cfg, num_layers=L).tx, unstack(p_s), [unstack(g_s)])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), unstack(out_s), out_u)
  with pytest.raises(ValueError, match="num_layers"):
    build_optimizer(cfg)
  with pytest.raises(ValueError, match="num_layers=5"):
    optim.layer_decay_scales(bert_like_params(True), 5, decay)


def test_config_from_configdict_and_errors():
  cd = ml_collections.ConfigDict({"optimizer": "lamb", "learning_rate": 2e-3,
                                  "mu_dtype": "bfloat16"})
  cfg = OptimConfig.from_dict(cd)
  assert cfg.optimizer == "lamb" and cfg.learning_rate == 2e-3
  state = build_optimizer(cfg).tx.init({"w": jnp.ones((2, 2))})
  assert any(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state))
  with pytest.raises(ValueError, match="lr_peak"):
    OptimConfig.from_dict({"lr_peak": 1.0})
  with pytest.raises(ValueError, match="optim.optimizer='sgd'"):
    OptimConfig(optimizer="sgd")
  with pytest.raises(ValueError, match="warmup_steps=20"):
    OptimConfig(warmup_steps=20, total_steps=10)


def test_layer_decay_of_a_scanned_stack_with_layer_0_apart():
  """ModernBERT's block scanned (model.first_attn_norm=False): layer 0 is `first_block`, the
  stack holds layers 1..L-1; each gets its own depth's factor, as when unrolled."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from encoder_jax.model.bert import BertModel  # pylint: disable=g-import-not-at-top
  from encoder_jax.model.config import MODERNBERT_BLOCK, ModelConfig  # pylint: disable=g-import-not-at-top
  decay, layers = 0.5, 3
  base = dict(MODERNBERT_BLOCK, vocab_size=64, hidden_size=16, num_layers=layers, num_heads=2,
              ffn_size=24, max_positions=32, local_window=4)
  scales = {}
  for scan in (True, False):
    model = BertModel(ModelConfig(**base, scan_layers=scan), pooler=False, rngs=nnx.Rngs(0))
    scales[scan] = flat(optim.layer_decay_scales(nnx.state(model, nnx.Param), layers, decay))
  first = [k for k in scales[True] if "first_block" in k]
  assert first and all(scales[True][k] == decay ** layers for k in first)
  stacked = [k for k in scales[True] if "/blocks/" in k]
  assert stacked and all(np.asarray(scales[True][k]).shape[0] == layers - 1 for k in stacked)
  for k in stacked:
    np.testing.assert_allclose(np.asarray(scales[True][k]).reshape(layers - 1, -1)[:, 0],
                               [decay ** (layers - i) for i in (1, 2)])
  for i in range(layers):  # unrolled: blocks/i at decay ** (L - i)
    assert {float(v) for k, v in scales[False].items() if f"/blocks/{i}/" in k} == {
        decay ** (layers - i)}
