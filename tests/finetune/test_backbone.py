"""Backbones: our Orbax pre-training checkpoints (BERT and ELECTRA layouts), HF folders."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from encoder_jax.finetune import backbone as bb
from encoder_jax.model import BertForPreTraining, BertModel, ModelConfig
from encoder_jax.model.electra import ElectraModel, generator_config
from encoder_jax.train.step import TrainState

CFG = ModelConfig(vocab_size=40, hidden_size=16, num_heads=2, ffn_size=32, num_layers=2,
                  max_positions=24)


def _filled(make):
  """A model built abstractly and filled with random numbers: these tests check where values
  go, not the initialisers, whose eager XLA compilation costs seconds each on 2 cores."""
  model = nnx.eval_shape(make)
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(0)
  nnx.replace_by_pure_dict(state, jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), nnx.to_pure_dict(state)))
  nnx.update(model, state)
  return model


def _save_train_state(model, root):
  """What encoder_jax.train.loop writes: TrainState(step, nnx.State of params, opt_state)
  through its Checkpointer, as <root>/<step>/{state, data, meta}."""
  from encoder_jax.train.checkpoint import Checkpointer
  params = nnx.state(model, nnx.Param)
  tx = optax.adamw(1e-3)
  state = TrainState(jnp.asarray(7, jnp.int32), params, tx.init(params))
  ckpt = Checkpointer(root, keep=1, async_save=False)
  ckpt.save(7, state, data_state={"next_index": 0}, meta={"wall_s": 1.0})
  ckpt.close()


def _pure(module):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def _assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("cfg", [CFG, CFG.replace(scan_layers=False, norm_first=True)],
                             ids=["scanned_post_ln", "unrolled_pre_ln"])
def test_bert_checkpoint_round_trip(tmp_path, cfg):
  model = _filled(lambda: BertForPreTraining(cfg, nsp=True, rngs=nnx.Rngs(3)))
  _save_train_state(model, tmp_path / "ckpt")
  got = bb.load_backbone(f"ckpt:{tmp_path / 'ckpt'}")
  assert got.cfg == cfg
  ft = bb.build_model(got, "classify", 3, pooling="cls", seed=0)
  _assert_same(_pure(ft.encoder), _pure(model.bert.encoder))
  _assert_same(_pure(ft.head.pooler), _pure(model.bert.pooler))  # NSP pooler reused


def test_numerics_and_vocab_come_from_the_run_config(tmp_path):
  # encoder_jax.train.loop writes <workdir>/config.json beside <workdir>/checkpoints.
  import json
  model = _filled(lambda: BertForPreTraining(CFG, nsp=False, rngs=nnx.Rngs(0)))
  _save_train_state(model, tmp_path / "checkpoints")
  (tmp_path / "config.json").write_text(json.dumps(
      {"model": {"activation": "gelu_tanh", "layer_norm_eps": 1e-7, "num_layers": 2,
                 "position_bias": "alibi"},
       "data": {"vocab": "/some/vocab.txt"}}))
  got = bb.load_backbone(f"ckpt:{tmp_path / 'checkpoints'}",
                         model_overrides={"hidden_dropout": 0.0})
  # position_bias leaves no trace in the parameters: fine-tuning an ALiBi encoder without
  # its bias would silently be another model.
  assert (got.cfg.activation, got.cfg.layer_norm_eps, got.cfg.hidden_dropout,
          got.cfg.position_bias) == ("gelu_tanh", 1e-7, 0.0, "alibi")
  assert got.vocab == "/some/vocab.txt" and got.pooler is None


def test_pretraining_workdir_gives_its_newest_good_step(tmp_path):
  """init=ckpt:<pre-training workdir> (what a user has at hand) reads <workdir>/checkpoints,
  verifying checksums: a damaged newest step is skipped for the previous one."""
  from encoder_jax.train.checkpoint import Checkpointer
  model = _filled(lambda: BertForPreTraining(CFG, nsp=False, rngs=nnx.Rngs(0)))
  params = nnx.state(model, nnx.Param)
  tx = optax.adamw(1e-3)
  ckpt = Checkpointer(tmp_path / "run" / "checkpoints", keep=2, async_save=False)
  for step, scale in ((7, 1.0), (8, 2.0)):
    scaled = jax.tree.map(lambda x, s=scale: x * s, params)
    ckpt.save(step, TrainState(jnp.asarray(step, jnp.int32), scaled, tx.init(scaled)),
              data_state={}, meta={})
  ckpt.close()
  want = _pure(model.bert.encoder)
  got = bb.load_backbone(f"ckpt:{tmp_path / 'run'}")
  assert got.source.endswith("/8/state")
  _assert_same(_pure(bb.build_model(got, "tag", 3, pooling="cls", seed=0).encoder),
               jax.tree.map(lambda x: x * 2, want))
  leaf = max((p for p in (tmp_path / "run" / "checkpoints" / "8" / "state").rglob("*")
              if p.is_file()), key=lambda p: p.stat().st_size)
  raw = bytearray(leaf.read_bytes())
  raw[len(raw) // 2] ^= 1
  leaf.write_bytes(bytes(raw))
  got = bb.load_backbone(f"ckpt:{tmp_path / 'run'}")
  assert got.source.endswith("/7/state")
  _assert_same(_pure(bb.build_model(got, "tag", 3, pooling="cls", seed=0).encoder), want)


def test_electra_checkpoint_gives_the_discriminator(tmp_path):
  disc = CFG.replace(embedding_size=8)
  model = _filled(lambda: ElectraModel(disc, generator_config(disc, 0.5), rngs=nnx.Rngs(1)))
  _save_train_state(model, tmp_path / "ckpt")
  got = bb.load_backbone(f"ckpt:{tmp_path / 'ckpt' / '7'}")  # a step folder works too
  assert got.cfg == disc and got.pooler is None
  ft = bb.build_model(got, "tag", 5, pooling="cls", seed=0)
  _assert_same(_pure(ft.encoder), _pure(model.discriminator))


def test_bad_checkpoints_say_what_is_wrong(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    bb.load_backbone(f"ckpt:{tmp_path / 'nope'}")
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(tmp_path / "other", {"params": {"decoder": {"w": np.ones(3)}}, "step": 1,
                                  "opt_state": {}})
  ckptr.wait_until_finished()
  with pytest.raises(ValueError, match="expected 'bert'"):
    bb.load_backbone(f"ckpt:{tmp_path / 'other'}")
  model = _filled(lambda: BertForPreTraining(CFG, nsp=False, rngs=nnx.Rngs(0)))
  _save_train_state(model, tmp_path / "ok")
  with pytest.raises(ValueError, match="change shapes"):
    bb.load_backbone(f"ckpt:{tmp_path / 'ok'}", model_overrides={"hidden_size": 32})


def test_hf_folder_backbone(tmp_path):
  from encoder_jax.convert import export_hf_bert
  model = _filled(lambda: BertModel(CFG, rngs=nnx.Rngs(2)))
  export_hf_bert(model, tmp_path / "hf")
  got = bb.load_backbone(f"hf:{tmp_path / 'hf'}", model_overrides={"hidden_dropout": 0.0})
  assert got.cfg.hidden_dropout == 0.0 and got.cfg.num_layers == 2
  ft = bb.build_model(got, "classify", 2, pooling="cls", seed=0)
  _assert_same(_pure(ft.encoder), _pure(model.encoder))
  _assert_same(_pure(ft.head.pooler), _pure(model.pooler))
  # Mean pooling has no pooler to fill; building still works and the head is fresh.
  assert bb.build_model(got, "classify", 2, pooling="mean", seed=0).head.pooler is None


def test_hf_electra_folder_backbone(tmp_path):
  from encoder_jax.convert import export_hf_electra
  from encoder_jax.model.electra import ElectraDiscriminator
  disc = _filled(lambda: ElectraDiscriminator(CFG.replace(embedding_size=8), rngs=nnx.Rngs(4)))
  export_hf_electra(disc, tmp_path / "hf")
  got = bb.load_backbone(f"hf:{tmp_path / 'hf'}", model_overrides={"hidden_dropout": 0.0})
  assert got.cfg == disc.cfg.replace(hidden_dropout=0.0) and got.pooler is None
  ft = bb.build_model(got, "classify", 2, pooling="cls", seed=0)
  _assert_same(_pure(ft.encoder), _pure(disc.encoder))
