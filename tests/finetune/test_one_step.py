"""One train step for every trainer: pre-training and fine-tuning both build theirs with
encoder_jax.train.step.make_step, so a second copy of the gradient + optimizer update (which
could drift from pre-training's: clipping, donation, sharding, metrics) cannot come back
unnoticed; the fine-tuning loop checks every step's loss as the pre-training loop does."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from encoder_jax.finetune import setup, tasks, trainer
from encoder_jax.finetune.backbone import Backbone, build_model
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives import finetune as objective
from encoder_jax.train import step as step_lib

CFG = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, ffn_size=64, num_layers=1,
                  max_positions=16, hidden_dropout=0.0, attention_dropout=0.0)


def _rows(n: int) -> tasks.Encoded:
  rng = np.random.default_rng(0)
  return tasks.Encoded({"input_ids": rng.integers(5, 64, (n, 16)).astype(np.int32),
                        "mask": np.ones((n, 16), np.int32),
                        "token_types": np.zeros((n, 16), np.int32),
                        "labels": np.arange(n, dtype=np.int32) % 2})


def _finetune(tiny_config, **changes):
  """A 1-layer classifier fine-tuned for one epoch of 3 steps (6 rows, batches of 2)."""
  spec = tasks.get_task("glue/cola")
  model = build_model(Backbone(CFG, None, None, "random"), "classify", 2, pooling="cls", seed=0)
  config = tiny_config("glue/cola", "", **{"dropout": False, "warmup_frac": 0.0,
                                            "learning_rate": 1e-2, "epochs": 1,
                                            "batch_size": 2, "log_every": 2, **changes})
  data = {"train": _rows(6), "validation": _rows(6)}
  return model, config, trainer.finetune_one_seed(spec, model, data, setup.build(config).train,
                                                  seed=0)


def test_pretraining_and_finetuning_run_the_one_step_maker(made_steps, tiny_config):
  obj = step_lib.ObjectiveConfig(objective="mlm", sentence_task="none", vocab_size=64,
                                 mask_id=4, special_ids=(0, 1, 2, 3, 4), max_predictions=4)
  tr, _ = step_lib.create(CFG, obj, optax.sgd(0.0), optax.constant_schedule(0.0), seed=0)
  assert step_lib.make_train_step(tr) is made_steps[0]["step"]

  model, config, record = _finetune(tiny_config)
  assert len(made_steps) == 2
  ft = made_steps[1]
  assert len(ft["calls"]) == 3 and ft["kw"]["frozen"] is None  # every step went through it
  # The run's parameters are the maker's step's output: its last call, run again on the same
  # inputs, gives them bit for bit ...
  (state, batch), extra, _ = ft["calls"][-1]
  again, _ = ft["jitted"](jax.tree.map(jnp.asarray, state), batch, *extra)
  final = nnx.state(model, nnx.Param)
  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(a, b)
  # ... which is AdamW's update of the task loss's gradient, computed here by hand.
  params = jax.tree.map(jnp.asarray, state.params)
  loss_fn = objective.make_loss(nnx.graphdef(model), "classify", dropout=False)
  grads = jax.jit(jax.grad(lambda p: loss_fn(p, state.step, batch, *extra)[0]))(params)
  tx, _ = ft["args"][1:]
  updates, _ = tx.update(grads, jax.tree.map(jnp.asarray, state.opt_state), params)
  expected = optax.apply_updates(params, updates)
  assert not np.array_equal(jax.tree.leaves(expected)[0], jax.tree.leaves(params)[0])
  for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Log rows (steps 2 and 3, the epoch's end) average their steps, as pre-training's do.
  losses = [float(m["loss"]) for _, _, m in ft["calls"]]
  assert record["history"][0]["train_loss_logged_mean"] == pytest.approx(
      ((losses[0] + losses[1]) / 2 + losses[2]) / 2, rel=1e-12)
  assert record["history"][0]["train_examples_per_s"] > 0


def test_a_non_finite_loss_stops_finetuning_at_its_step(tiny_config, monkeypatch):
  """The pre-training loop's check (loop_parts.PendingMetrics): every step's loss is checked
  when the metrics are fetched, here once at the epoch's end, and the error names the first
  bad step, not the step that fetched it."""
  real = step_lib.make_step

  def poisoned(*args, **kwargs):
    step, calls = real(*args, **kwargs), [0]

    def poison_second(state, batch, *extra):
      state, metrics = step(state, batch, *extra)
      calls[0] += 1
      return state, dict(metrics, loss=metrics["loss"] * (np.nan if calls[0] == 2 else 1))
    return poison_second

  monkeypatch.setattr(step_lib, "make_step", poisoned)
  with pytest.raises(FloatingPointError, match=r"non-finite training loss nan at step 2 "
                                               r"\(seed 0\)"):
    _finetune(tiny_config, log_every=100)


def test_frozen_leaves_come_back_bit_identical():
  """make_step's `frozen`: AdamW with weight decay moves every leaf with a gradient (and turns
  -0.0 into +0.0); leaves the predicate marks come back as they went in, byte for byte."""
  params = {"encoder": {"w": np.array([-0.0, 1.0, -2.0], np.float32)},
            "head": {"w": np.array([0.5, 3.0], np.float32)}}
  loss_fn = lambda p, step, batch: (jnp.sum(p["encoder"]["w"] * batch) * jnp.sum(p["head"]["w"]),
                                    {})
  tx = optax.adamw(0.1, weight_decay=0.1)
  batch = jnp.array([1.0, 2.0, 3.0])
  state = lambda: step_lib.TrainState(jnp.zeros((), jnp.int32), jax.tree.map(jnp.asarray, params),
                                      tx.init(params))  # (fresh arrays: the step donates them)
  for frozen in (None, trainer.is_encoder_param):
    step = step_lib.make_step(loss_fn, tx, optax.constant_schedule(0.1), frozen=frozen)
    after, metrics = step(state(), batch)
    kept = params["encoder"]["w"].tobytes() == np.asarray(after.params["encoder"]["w"]).tobytes()
    assert kept == (frozen is not None)
    assert not np.array_equal(after.params["head"]["w"], params["head"]["w"])
    assert int(after.step) == 1 and float(metrics["grad_norm"]) > 0
