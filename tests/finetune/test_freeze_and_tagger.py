"""The tagger loss reads first subtokens only; freezing and eval mode are different switches,
both set from the run config (trainer.build_steps), freezing through the shared step's
`frozen` (train.step.make_step)."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from encoder_jax.finetune import setup, tasks, trainer
from encoder_jax.finetune.backbone import Backbone, build_model
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives.finetune import task_loss
from encoder_jax.train import sharding
from encoder_jax.train.step import TrainState


def test_tagger_loss_ignores_non_first_subtokens_and_pads(tiny_vocab):
  from encoder_jax.data.tokenizer import WordPieceTokenizer
  tok = WordPieceTokenizer.from_vocab(tiny_vocab)
  enc = tok.batch_encode_words([["abc", "d", "good"], ["efg"]], [[1, 2, 3], [4]], max_length=10)
  labels_BxT = enc["labels"]
  ignored_BxT = labels_BxT == -100
  # [CLS] a ##b ##c d good [SEP] pad...: only 'a', 'd', 'good' (and 'e' of row 2) carry labels.
  assert (~ignored_BxT).sum() == 4 and ignored_BxT[:, 0].all()
  batch = {"labels": jnp.asarray(labels_BxT), "weights": jnp.ones(2, jnp.float32)}
  logits = jax.random.normal(jax.random.key(0), labels_BxT.shape + (5,))
  loss_fn = lambda lg: task_loss("tag", {"logits": lg}, batch)[0]
  noise = 1e3 * jax.random.normal(jax.random.key(1), logits.shape)
  perturbed = jnp.where(jnp.asarray(ignored_BxT)[..., None], logits + noise, logits)
  assert loss_fn(perturbed) == loss_fn(logits)
  grad = jax.grad(loss_fn)(logits)
  assert (np.asarray(grad)[ignored_BxT] == 0).all()
  assert (np.abs(np.asarray(grad)[~ignored_BxT]).sum(-1) > 0).all()
  # Padded (weight-0) rows of a last partial batch are ignored too.
  half = dict(batch, weights=jnp.array([1.0, 0.0]))
  one_row = task_loss("tag", {"logits": logits}, half)[0]
  assert one_row == task_loss(
      "tag", {"logits": logits[:1]}, {"labels": batch["labels"][:1],
                                      "weights": jnp.ones(1)})[0]


CFG = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, ffn_size=64, num_layers=1,
                  max_positions=16, hidden_dropout=0.1, attention_dropout=0.0)


def _batch():
  rng = np.random.default_rng(0)
  return {"input_ids": rng.integers(5, 64, (4, 16)).astype(np.int32),
          "mask": np.ones((4, 16), np.int32), "token_types": np.zeros((4, 16), np.int32),
          "labels": np.array([0, 1, 0, 1], np.int32), "weights": np.ones(4, np.float32)}


def _setup(tiny_config, freeze: bool, dropout: bool, n: int = 2, **changes):
  """A classifier and its steps as a run builds them (trainer.build_steps from the config's
  freeze_encoder / dropout); the embedding LayerNorm's bias starts at -0.0, which a zero
  update would turn into +0.0."""
  model = build_model(Backbone(CFG, None, None, "random"), "classify", 2, pooling="cls", seed=0)
  model.encoder.embeddings.ln.bias[...] = jnp.full((CFG.hidden_size,), -0.0)
  config = tiny_config("glue/cola", "", freeze_encoder=freeze, dropout=dropout,
                       learning_rate=1e-2, warmup_frac=0.0, epochs=n, batch_size=4, **changes)
  data = {"train": tasks.Encoded(_batch())}
  steps, tx = trainer.build_steps(tasks.get_task("glue/cola"), model, data,
                                  setup.build(config).train)
  params = nnx.state(model, nnx.Param)
  return steps, tx, params


def _train_steps(tiny_config, freeze: bool, dropout: bool, n: int = 2):
  steps, tx, params = _setup(tiny_config, freeze, dropout, n)
  before = trainer.host_copy(params)
  state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  for _ in range(n):
    state, m = steps.train(state, _batch(), jax.random.key(0))
  return before, trainer.host_copy(state.params)


def _changed(before, after, encoder: bool):
  flat_b = jax.tree_util.tree_flatten_with_path(before)[0]
  flat_a = jax.tree.leaves(after)
  return {jax.tree_util.keystr(p): not np.array_equal(b, a) for (p, b), a in zip(flat_b, flat_a)
          if trainer.is_encoder_param(p) == encoder}


def test_freezing_keeps_encoder_bit_identical_and_trains_the_head(tiny_config, made_steps):
  # Dropout on (train mode): freezing is not eval mode, and still nothing in the encoder moves.
  before, after = _train_steps(tiny_config, freeze=True, dropout=True)
  [made] = made_steps  # the shared step, told which leaves to keep
  assert made["kw"]["frozen"] is trainer.is_encoder_param and len(made["calls"]) == 2
  enc = _changed(before, after, encoder=True)
  assert enc and not any(enc.values()), [k for k, v in enc.items() if v]
  head = _changed(before, after, encoder=False)
  assert head and all(head.values())
  # Bit-identical, not merely equal as floats (-0.0 == 0.0): compare raw bytes.
  assert np.signbit(before["encoder"]["embeddings"]["ln"]["bias"]).all()
  for (path, b), a in zip(jax.tree_util.tree_flatten_with_path(before)[0],
                          jax.tree.leaves(after)):
    if trainer.is_encoder_param(path):
      assert b.tobytes() == a.tobytes(), jax.tree_util.keystr(path)


def test_freezing_cuts_the_encoders_gradient_and_update(tiny_config):
  """Frozen: the step's gradient is the head's alone (so clipping by the global norm is not
  diluted by encoder gradients), and the optimizer updates no encoder parameter."""
  steps, tx, params = _setup(tiny_config, freeze=True, dropout=False, n=1)
  batch = _batch()
  loss = lambda p: task_loss("classify", nnx.merge(steps.graphdef_eval, p)(batch), batch)[0]
  grads = jax.jit(jax.grad(loss))(params)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  head_norm = np.sqrt(sum(float(jnp.sum(g * g)) for p, g in flat
                          if not trainer.is_encoder_param(p)))
  encoder_norm = np.sqrt(sum(float(jnp.sum(g * g)) for p, g in flat
                             if trainer.is_encoder_param(p)))
  assert encoder_norm > 0.1 * head_norm  # what an uncut gradient would add
  updates, _ = tx.update(grads, tx.init(params), params)
  for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
    assert (np.asarray(u) == 0).all() == trainer.is_encoder_param(path), path
  state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  _, m = steps.train(state, batch, jax.random.key(0))  # donates params
  np.testing.assert_allclose(m["grad_norm"], head_norm, rtol=1e-5)


def test_eval_mode_does_not_freeze(tiny_config):
  # Training with dropout off (eval mode) still updates every encoder parameter.
  before, after = _train_steps(tiny_config, freeze=False, dropout=False)
  enc = _changed(before, after, encoder=True)
  assert enc and all(enc.values()), [k for k, v in enc.items() if not v]


def test_dropout_only_while_training(tiny_config):
  """dropout=True: the train step drops (the loss it reports, of the parameters before its
  update, differs from the prediction's); predictions never do. dropout=False: the train
  step's loss is the prediction's."""
  batch = _batch()
  for dropout in (True, False):
    steps, tx, params = _setup(tiny_config, freeze=False, dropout=dropout, n=1)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    predicted = task_loss("classify", steps.predict(params, batch), batch)[0]
    assert float(predicted) == float(task_loss("classify", steps.predict(params, batch),
                                               batch)[0])
    _, m = steps.train(state, batch, jax.random.key(0))
    if dropout:
      assert abs(float(m["loss"]) - float(predicted)) > 1e-4
    else:
      np.testing.assert_allclose(m["loss"], predicted, rtol=1e-6)


def test_length_grouped_order_is_a_permutation_with_aligned_batches():
  lengths = np.random.default_rng(0).integers(3, 60, 1003)
  order = trainer.length_grouped_order(lengths, np.random.default_rng(1), 32)
  assert sorted(order.tolist()) == list(range(1003))
  maxes = [lengths[order[i:i + 32]].max() for i in range(0, 1003, 32)]
  assert np.mean(maxes) < 1.2 * lengths.mean()  # a random batch's max is ~57 here
  # The 11-row remainder is the last batch, so every other batch is full and homogeneous.
  tail = order[992:]
  assert len(tail) == 11 and np.ptp(lengths[order[:32]]) <= 5


def test_a_later_run_with_the_same_program_reuses_its_steps_and_no_other_does(tiny_config):
  """trainer.build_steps hands a run the steps an earlier run built when, and only when, the
  programs are the same: the traced and compiled step is reused (no retrace), and a change of
  a setting, of the step count or of the model gives new steps."""
  def built(n_labels=2, cfg=CFG, epochs=1, copies=1, mesh=None, **changes):
    model = build_model(Backbone(cfg, None, None, "random"), "classify", n_labels,
                        pooling="cls", seed=n_labels)
    config = tiny_config("glue/cola", "", epochs=epochs, batch_size=4, **changes)
    rows = {k: np.concatenate([v] * copies) for k, v in _batch().items()}
    return trainer.build_steps(tasks.get_task("glue/cola"), model,
                               {"train": tasks.Encoded(rows)}, setup.build(config).train,
                               mesh=mesh)
  first = built()
  for change in [dict(learning_rate=3e-3), dict(weight_decay=0.5), dict(dropout=False),
                 dict(freeze_encoder=True), dict(epochs=2), dict(copies=2),  # longer schedules
                 dict(n_labels=3), dict(cfg=CFG.replace(hidden_dropout=0.2)),
                 dict(cfg=CFG.replace(layer_norm_eps=1e-6)),  # same parameters' shapes
                 dict(mesh=sharding.mesh_from_config("-1,1,1"))]:
    assert built() is first, change  # another model of the same structure (another head)
    other = built(**change)
    assert other is not first and other[0] is not first[0], change
  # A later run with the reused steps trains exactly as with steps of its own: nothing of
  # an earlier run stays in them (the state is their argument).
  batch = _batch()
  results = []
  args, kw = _fresh(tiny_config)
  for steps, tx in (first, first, (trainer.make_steps(*args, **kw), args[1])):
    model = build_model(Backbone(CFG, None, None, "random"), "classify", 2, pooling="cls",
                        seed=7)
    params = nnx.state(model, nnx.Param)
    state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    for _ in range(2):
      state, m = steps.train(state, batch, jax.random.key(1))
    results.append(trainer.host_copy((state.params, m)))
  for reused in results[:2]:
    for a, b in zip(jax.tree.leaves(reused), jax.tree.leaves(results[2])):
      np.testing.assert_array_equal(a, b)


def _fresh(tiny_config):
  """make_steps' arguments for the settings of the test above's first run, built anew."""
  model = build_model(Backbone(CFG, None, None, "random"), "classify", 2, pooling="cls", seed=2)
  config = setup.build(tiny_config("glue/cola", "", epochs=1, batch_size=4)).train
  tx, schedule = trainer.make_optimizer(config, num_layers=CFG.num_layers, total_steps=1)
  return (model, tx, schedule), dict(freeze=config.freeze_encoder, dropout=config.dropout)
