"""Fine-tuning runs on the pre-training machinery's mesh: on 8 fake devices (data 2 x fsdp 2 x
tensor 2, parameters and optimizer state sharded by their logical axes) it equals 1 device."""
import jax
import numpy as np
import pytest
from flax import nnx

from encoder_jax.data import fetch
from encoder_jax.data.tokenizer import WordPieceTokenizer
from encoder_jax.finetune import backbone, run, setup, trainer
from encoder_jax.model.config import ModelConfig
from encoder_jax.train import sharding

CFG = ModelConfig(vocab_size=30522, hidden_size=32, num_heads=2, ffn_size=64, num_layers=2,
                  max_positions=64, hidden_dropout=0.1, attention_dropout=0.1)


def _finetune(config, mesh):
  s = setup.build(config)
  data = run.load_data(s.task, WordPieceTokenizer.from_vocab(fetch.minilm_vocab()), s.data)
  model = backbone.build_model(backbone.Backbone(CFG, None, None, "random"), "classify", 2,
                               pooling="cls", seed=0)
  record = trainer.finetune_one_seed(s.task, model, data, s.train, 0, mesh)
  steps, _ = trainer.build_steps(s.task, model, data, s.train, mesh)  # the ones the run used
  return record, trainer.host_copy(nnx.state(model, nnx.Param)), steps


def test_eight_devices_equal_one(tiny_config):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
  config = tiny_config("rotten_tomatoes", "minilm", max_train_examples=64, max_eval_examples=32,
                       max_length=64, epochs=2, batch_size=16, eval_batch_size=16,
                       learning_rate=1e-3, log_every=100)
  one, params_1, _ = _finetune(config, sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
  eight, params_8, steps_8 = _finetune(config, sharding.mesh_from_config("2,2,2"))
  # the 8-device run really is sharded: parameters over fsdp and tensor (batches over data)
  specs = {str(s.spec) for s in jax.tree.leaves(steps_8.state_shardings)}
  assert any("fsdp" in s for s in specs) and any("tensor" in s for s in specs), specs
  for key in ("best_epoch", "select"):
    assert one[key] == eight[key]
  for a, b in zip(one["history"], eight["history"]):
    assert a["train_loss_logged_mean"] == pytest.approx(b["train_loss_logged_mean"], rel=1e-5)
    assert a["dev"] == b["dev"]
  assert one["test"] == eight["test"]
  for x, y in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_8)):
    np.testing.assert_allclose(x, y, atol=2e-5, rtol=1e-4)


def test_the_trainer_reads_a_frozen_config_made_once(tiny_config):
  import dataclasses
  config = tiny_config("rotten_tomatoes", "minilm", learning_rate=2e-3)
  t = setup.build(config).train
  assert t.learning_rate == 2e-3 and t.batch_size == config.batch_size
  with pytest.raises(dataclasses.FrozenInstanceError):
    t.learning_rate = 1.0
  config.learning_rate = 5.0  # the ConfigDict changing later does not reach the view
  assert t.learning_rate == 2e-3


def test_a_frozen_encoder_fine_tunes_on_the_sharded_mesh(tiny_config):
  """freeze_encoder on a mesh (what finetune_and_evaluate always passes): the optimizer state
  of frozen leaves is optax.MaskedNode, which the state's shardings keep as is; the encoder's
  parameters stay bit-identical through a sharded run, the head's move."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
  config = tiny_config("rotten_tomatoes", "minilm", max_train_examples=32, max_eval_examples=16,
                       max_length=64, epochs=1, batch_size=16, eval_batch_size=16,
                       learning_rate=1e-2, log_every=100, freeze_encoder=True)
  model = backbone.build_model(backbone.Backbone(CFG, None, None, "random"), "classify", 2,
                               pooling="cls", seed=0)
  before = trainer.host_copy(nnx.state(model, nnx.Param))
  s = setup.build(config)
  data = run.load_data(s.task, WordPieceTokenizer.from_vocab(fetch.minilm_vocab()), s.data)
  trainer.finetune_one_seed(s.task, model, data, s.train, 0, sharding.mesh_from_config("2,2,2"))
  after = trainer.host_copy(nnx.state(model, nnx.Param))
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a),
                                                                jax.tree.leaves(b)))
  assert same(before["encoder"], after["encoder"])
  assert not same({k: v for k, v in before.items() if k != "encoder"},
                  {k: v for k, v in after.items() if k != "encoder"})
