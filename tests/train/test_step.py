"""The jitted pre-training step: overfitting 8 sentences (MLM, ELECTRA), one trace, ELECTRA and
NSP wiring.

Real text through the MiniLM WordPiece tokenizer, then the ids remapped to the ~60 that occur
(specials first): a 65-way softmax instead of 30,522 keeps the tiny model's steps cheap; the
step sees an ordinary vocabulary. Compiling dominates the cost here (seconds per program under
load), so each test compiles at most one step and the wiring tests only trace (eval_shape).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from encoder_jax.data.fetch import minilm_dir
from encoder_jax.data.tokenizer import WordPieceTokenizer
from encoder_jax.model import ModelConfig
from encoder_jax.train import loop
from encoder_jax.train import step as step_lib
from encoder_jax.objectives import pretraining
from encoder_jax.train.optim import OptimConfig, build_optimizer, path_names

SENTENCES = [
    "Call me Ishmael.",
    "Some years ago, never mind how long precisely, having little money in my purse",
    "The state of the union is strong.",
    "It is a way I have of driving off the spleen",
    "and regulating the circulation.",
    "Whenever I find myself growing grim about the mouth",
    "whenever it is a damp, drizzly November in my soul",
    "then, I account it high time to get to sea as soon as I can.",
]


@functools.lru_cache(maxsize=1)
def fixed_batch():
  """8 tokenized sentences [8, 20] with ids remapped to 0..V-1; returns (batch, V)."""
  tok = WordPieceTokenizer.from_vocab(minilm_dir() / "vocab.txt")
  b = tok.batch_encode_pairs(SENTENCES, max_length=20)
  specials = [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]  # -> 0..4
  vocab_V = np.array(specials + sorted(set(np.unique(b["input_ids"]).tolist()) - set(specials)))
  lookup = np.zeros(tok.vocab_size, np.int32)
  lookup[vocab_V] = np.arange(len(vocab_V))
  batch = {"input_ids": lookup[b["input_ids"]], "mask": b["mask"].astype(bool),
           "token_types": b["token_types"], "nsp_label": np.arange(8, dtype=np.int32) % 2}
  return batch, len(vocab_V)


def tiny(objective="mlm", sentence_task="none", **model):
  batch, V = fixed_batch()
  cfg = ModelConfig(**{**dict(vocab_size=V, hidden_size=64, num_layers=2, num_heads=4,
                              ffn_size=128, max_positions=32, hidden_dropout=0.0,
                              attention_dropout=0.0), **model})
  obj = step_lib.ObjectiveConfig(objective=objective, sentence_task=sentence_task,
                                 vocab_size=V, mask_id=4, special_ids=(0, 1, 2, 3, 4),
                                 max_predictions=4, gen_hidden_frac=1.0)
  return cfg, obj, batch


# ELECTRA needs the second block and more steps: the discriminator's loss reaches 0 only once
# the generator's samples are (nearly) always the original token.
@pytest.mark.usefixtures("full_xla_optimization")  # hundreds of steps: level 2 (conftest)
@pytest.mark.parametrize("objective,layers,steps", [("mlm", 1, 600), ("electra", 2, 800)])
def test_overfits_eight_sentences_with_one_trace(objective, layers, steps, monkeypatch):
  traces = []
  real = pretraining.loss_and_metrics
  monkeypatch.setattr(pretraining, "loss_and_metrics",
                      lambda *a, **k: traces.append(1) or real(*a, **k))
  cfg, obj, batch = tiny(objective, num_layers=layers)
  tx, schedule = build_optimizer(OptimConfig(learning_rate=3e-3, warmup_steps=10,
                                             total_steps=steps, weight_decay=0.0))
  tr, init = step_lib.create(cfg, obj, tx, schedule, seed=0)
  state, train_step = loop.initial_state(init), step_lib.make_train_step(tr)
  history = []
  for _ in range(steps):  # masks are redrawn every step (fold_in(seed, step)): dynamic
    state, m = train_step(state, {k: jnp.asarray(v) for k, v in batch.items()})
    history.append(m)
  history = jax.device_get(history)
  final = {k: np.mean([h[k] for h in history[-20:]]) for k in history[0]}
  assert len(traces) == 1  # one trace for all calls: no retracing after the first step
  assert int(state.step) == steps
  if objective == "mlm":
    assert history[0]["mlm_loss"] > 3.5 and final["mlm_loss"] < 0.05, final
    assert final["mlm_accuracy"] > 0.99
  else:
    assert history[0]["gen_loss"] > 3.5 and history[0]["disc_loss"] > 0.6
    assert final["gen_loss"] < 0.05 and final["disc_loss"] < 0.02, final
    assert final["disc_accuracy"] > 0.99


def param_paths(cfg, obj):
  model = nnx.eval_shape(lambda: step_lib.build_model(cfg, obj, rngs=nnx.Rngs(0)))
  flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
  return {"/".join(map(str, path_names(p))): x.shape for p, x in flat}


def metric_names(cfg, obj, batch):
  """The step's metric keys, from tracing alone (no compile)."""
  tr, init = step_lib.create(cfg, obj, *build_optimizer(OptimConfig(warmup_steps=0,
                                                                     total_steps=1)), seed=0)
  params = jax.eval_shape(init).params
  fn = lambda p, b: pretraining.loss_and_metrics(nnx.merge(tr.graphdef_train, p), b,
                                              jax.random.key(0), obj, train=True)[1]
  return set(jax.eval_shape(fn, params, {k: jnp.asarray(v) for k, v in batch.items()}))


@pytest.mark.parametrize("embedding_size", [None, 32])
def test_electra_token_embedding_is_one_parameter(embedding_size):
  cfg, obj, _ = tiny("electra", embedding_size=embedding_size)
  obj = step_lib.ObjectiveConfig(**{**obj.__dict__, "gen_hidden_frac": 0.25})
  paths = param_paths(cfg, obj)
  tables = [p for p, shape in paths.items() if shape == (cfg.vocab_size, cfg.embed_size)]
  assert tables == ["discriminator/embeddings/token/embedding"]
  assert [p for p in paths if p.endswith("position/embedding")] == [
      "discriminator/embeddings/position/embedding"]  # positions are tied too
  assert not any(p.startswith("generator/embeddings") for p in paths)
  # The generator is a quarter as wide and reads the shared tables (through its own
  # projection when the embedding width differs from its hidden size).
  assert paths["generator/blocks/attn/qkv_kernel"][1] == 16
  assert ("generator/embed_proj/kernel" in paths) == (cfg.embed_size != 16)


@pytest.mark.parametrize("objective", ["mlm", "electra"])
def test_sentence_task_off_means_no_parameters_and_no_loss(objective):
  for task in ("none", "nsp", "sop"):
    cfg, obj, batch = tiny(objective, task, num_layers=1)
    paths, names = param_paths(cfg, obj), metric_names(cfg, obj, batch)
    has_params = any(("nsp" in p or "pooler" in p) for p in paths)
    has_metrics = {n for n in names if n.startswith(("nsp_", "sop_"))}
    if task == "none":
      assert not has_params and not has_metrics, (paths, names)
    else:
      assert has_params and has_metrics == {f"{task}_loss", f"{task}_accuracy",
                                            f"{task}_count"}


def frozen(objective="mlm", seed=0, **model):
  """A Trainer whose updates are zero (SGD at learning rate 0): every step sees the initial
  parameters, so losses differ between steps through the step's randomness alone."""
  cfg, obj, batch = tiny(objective, num_layers=1, **model)
  tr, init = step_lib.create(cfg, obj, optax.sgd(0.0), optax.constant_schedule(0.0), seed=seed)
  return tr, init, {k: jnp.asarray(v) for k, v in batch.items()}


def step_losses(train_step, init, batch, n=3):
  state, out = loop.initial_state(init), []
  for _ in range(n):
    state, m = train_step(state, batch)
    out.append(float(m["loss"]))
  return out


def test_train_step_randomness_and_modes():
  """Masks come from fold_in(seed, step): new at every step and for every seed, the same when
  a step is repeated. Train mode applies dropout, eval mode never does; the eval step at index
  i draws the masks of train step i under seed 1234, so without dropout the two agree. What
  padded slots hold never matters."""
  eval_seed = 1234
  tr, init, batch = frozen(seed=eval_seed)
  train_step = step_lib.make_train_step(tr)
  losses = step_losses(train_step, init, batch)
  assert len(set(losses)) == 3, losses  # same parameters, new masks at every step
  assert step_losses(train_step, init, batch) == losses  # a repeated step: bit for bit
  other_seed, _, _ = frozen(seed=eval_seed + 1)
  assert step_losses(step_lib.make_train_step(other_seed), init, batch, 1)[0] != losses[0]

  params = jax.jit(init)().params
  eval_step = step_lib.make_eval_step(tr, eval_seed=eval_seed)
  eval_loss = lambda step_fn, i: float(step_fn(params, batch, i)["loss"])
  np.testing.assert_allclose(eval_loss(eval_step, 0), losses[0], rtol=1e-6)
  assert eval_loss(eval_step, 0) == eval_loss(eval_step, 0) != eval_loss(eval_step, 1)
  # Only batch["mask"] says what is padding: ordinary ids in the padded slots change nothing.
  mask = np.asarray(batch["mask"])
  assert (~mask).sum() > 20
  garbage = dict(batch, input_ids=jnp.where(mask, batch["input_ids"], 7))
  np.testing.assert_allclose(float(eval_step(params, garbage, 0)["loss"]), eval_loss(eval_step, 0),
                             rtol=1e-6)

  # The same model with dropout: the train step drops (another loss for the same masks and
  # parameters, repeatable), the eval step does not (the dropout-free loss).
  tr_drop, init_drop, _ = frozen(seed=eval_seed, hidden_dropout=0.3, attention_dropout=0.3)
  train_drop = step_lib.make_train_step(tr_drop)
  dropped = step_losses(train_drop, init_drop, batch, 1)[0]
  assert abs(dropped - losses[0]) > 1e-3
  np.testing.assert_allclose(step_losses(train_drop, init_drop, garbage, 1)[0], dropped,
                             rtol=1e-6)
  eval_drop = step_lib.make_eval_step(tr_drop, eval_seed=eval_seed)
  np.testing.assert_allclose(eval_loss(eval_drop, 0), losses[0], rtol=1e-6)


def test_electra_step_gradient_is_generator_plus_50_discriminator():
  """The train step differentiates gen MLM + 50 * RTD (ELECTRA's lambda): its gradient norm
  equals that of the two losses' gradients combined by hand, with the discriminator's share
  large enough that another weight would show."""
  tr, init, batch = frozen("electra")
  params = jax.jit(init)().params
  key = step_lib.step_key(tr.seed, 0)

  def parts(p):
    model = nnx.merge(tr.graphdef_train, p)
    _, m = pretraining.loss_and_metrics(model, batch, key, tr.obj, train=True)
    return m["gen_loss"], m["disc_loss"]

  g_gen, g_disc = jax.jit(jax.jacrev(parts))(params)
  combined = lambda w: float(optax.tree.norm(jax.tree.map(lambda a, b: a + w * b, g_gen,
                                                          g_disc)))
  _, m = step_lib.make_train_step(tr)(loop.initial_state(init), batch)
  np.testing.assert_allclose(m["grad_norm"], combined(50.0), rtol=1e-4)
  assert abs(combined(1.0) / combined(50.0) - 1) > 0.2 and abs(combined(40.0) / combined(50.0)
                                                                - 1) > 0.01
  # No discriminator gradient reaches the generator's own layers; the RTD head learns from RTD.
  assert all((np.asarray(x) == 0).all() for x in jax.tree.leaves(g_disc["generator"]["blocks"]))
  assert all((np.asarray(x) == 0).all() for x in jax.tree.leaves(g_gen["rtd"]))


def test_accumulation_runs_the_optimizer_only_at_the_kth_micro_step(fusion_emitters):
  """With optim.accumulation_steps = 3 the step branches (lax.cond): AdamW and the parameter
  update sit in the emitting branch only, and 6 calls give exactly what optax.MultiSteps'
  own update (which computes AdamW every call and keeps it every 3rd) gives."""
  cfg, obj, batch = tiny()
  parts = build_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0, total_steps=4,
                                      accumulation_steps=3))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  states = []
  for k in (3, 1):  # 1: MultiSteps' tx.update called every step, as before the branch
    tr, init = step_lib.create(cfg, obj, parts.tx, parts.schedule, seed=0,
                               accumulation_steps=k)
    state, step = loop.initial_state(init), step_lib.make_train_step(tr)
    for _ in range(6):
      state, _ = step(state, batch)
    states.append(state)
  got, want = states
  assert int(got.opt_state.gradient_step) == 2 and int(got.step) == 6
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               (got.params, got.opt_state), (want.params, want.opt_state))


def test_accumulation_runs_adam_only_in_the_emitting_branch():
  """Where the optimizer runs: Adam's bias correction (b ** count, a `pow`) only inside the
  cond's emitting branch (a sqrt would not do: the grad_norm metric takes one every step)."""
  cfg, obj, batch = tiny()
  parts = build_optimizer(OptimConfig(learning_rate=1e-2, warmup_steps=0, total_steps=4,
                                      accumulation_steps=3))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  tr, init = step_lib.create(cfg, obj, parts.tx, parts.schedule, seed=0, accumulation_steps=3)
  jaxpr = jax.make_jaxpr(step_lib.make_train_step(tr))(jax.eval_shape(init), batch).jaxpr
  (jitted,) = jaxpr.eqns  # the jit itself; its body:
  jaxpr = jitted.params["jaxpr"].jaxpr
  conds = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
  outside = _primitives(jaxpr.replace(eqns=[e for e in jaxpr.eqns if e not in conds]))
  assert "pow" in _primitives(jaxpr) and "pow" not in outside and len(conds) == 1
  branch_ops = [_primitives(b.jaxpr) for b in conds[0].params["branches"]]
  assert ["pow" in ops for ops in branch_ops] == [False, True]  # (false, true) branches


def _primitives(jaxpr) -> set[str]:
  """Every primitive of `jaxpr` and of the jaxprs nested in its equations (jit, cond, scan)."""
  out = set()
  for e in jaxpr.eqns:
    out.add(e.primitive.name)
    for v in e.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          out |= _primitives(inner)
  return out
