"""Backbones: pre-training runs (BERT and ELECTRA layouts, every config field kept) and HF
folders of each family, loaded through encoder_jax.train.pretrained into the fine-tuning model."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.train.pretrained import load_backbone
from encoder_jax.finetune import backbone as bb
from encoder_jax.model import BertModel, ModelConfig
from encoder_jax.model.config import ACTIVATIONS

import run_helpers as R

CFG = ModelConfig(vocab_size=40, hidden_size=16, num_heads=2, ffn_size=32, num_layers=2,
                  max_positions=24)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return R.tiny_vocab(tmp_path_factory.mktemp("vocab"))


def _filled(make):
  """A model built abstractly and filled with random numbers (see run_helpers)."""
  model = nnx.eval_shape(make)
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(0)
  nnx.replace_by_pure_dict(state, jax.tree.map(
      lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), nnx.to_pure_dict(state)))
  nnx.update(model, state)
  return model


@pytest.mark.parametrize("model", [dict(), dict(scan_layers="True", norm_first=True)],
                         ids=["unrolled_post_ln", "scanned_pre_ln"])
def test_run_round_trip_with_its_nsp_pooler(tmp_path, vocab, model):
  config = R.run_config(vocab, "size=tiny,nsp=nsp", **model)
  saved = R.saved_run(tmp_path / "run", config)[7]
  got = load_backbone(f"ckpt:{tmp_path / 'run'}")
  assert got.source.endswith("checkpoints/7") and got.vocab == vocab
  ft = bb.build_model(got, "classify", 3, pooling="cls", seed=0)
  R.assert_same(ft.encoder, saved["bert"]["encoder"])
  R.assert_same(ft.head.pooler, saved["bert"]["pooler"])  # NSP pooler reused


def _not_default(field: dataclasses.Field):
  """A value of a ModelConfig field other than its default that changes no parameter shape,
  or None for a field that sets shapes or is the platform's."""
  default = field.default
  others = {"activation": "gelu_tanh", "position_bias": "alibi", "position_init": "sinusoidal",
            "attention_impl": "explicit", "remat_policy": "full", "dot_dtype": "bfloat16"}
  if field.name in others:
    return others[field.name]
  if isinstance(default, float):
    return default / 7 + 1e-9
  # (pad_token_id is not a run's to set: setup.model_config gives the model its tokenizer's)
  return None


def test_every_numeric_config_field_survives_ckpt_fine_tuning(tmp_path, vocab):
  """Every ModelConfig field that leaves no trace in a parameter shape (activation, ALiBi,
  norm eps, dropout, ...: a new field too, through the generic loop) reaches the fine-tuning
  encoder from the run's config.json, and the encoder computes what the run's does."""
  changes = {f.name: v for f in dataclasses.fields(ModelConfig)
             if (v := _not_default(f)) is not None}
  assert {"activation", "position_bias", "layer_norm_eps", "hidden_dropout"} <= set(changes)
  config = R.run_config(vocab, **changes)
  R.saved_run(tmp_path / "run", config)
  got = load_backbone(f"ckpt:{tmp_path / 'run'}", model_overrides={"hidden_dropout": 0.0})
  for name, value in changes.items():
    want = 0.0 if name == "hidden_dropout" else value
    assert getattr(got.cfg, name) == want, name
  # the numbers: our encoder in the fine-tuning model = the run's encoder (eval mode)
  from encoder_jax.train.run_dir import RunDir
  run = RunDir.find(tmp_path / "run")
  ids = np.array([[2, 5, 6, 7, 3, 0, 0], [2, 8, 9, 10, 11, 12, 3]], np.int32)
  mask = ids != 0
  ref = run.model(7, dtype="float32", dot_dtype="").bert.encoder(ids, mask).hidden_BxTxD
  enc = bb.build_model(dataclasses.replace(got, cfg=got.cfg.replace(dot_dtype="")), "tag", 2,
                       pooling="cls", seed=0).encoder
  np.testing.assert_allclose(np.asarray(enc(ids, mask).hidden_BxTxD)[mask],
                             np.asarray(ref)[mask], atol=1e-6)
  assert got.cfg.activation in ACTIVATIONS


def test_shapes_cannot_be_overridden_and_non_runs_are_named(tmp_path, vocab):
  R.saved_run(tmp_path / "run", R.run_config(vocab))
  with pytest.raises(ValueError, match="change shapes"):
    load_backbone(f"ckpt:{tmp_path / 'run'}", model_overrides={"hidden_size": 32})
  (tmp_path / "run" / "config.json").unlink()
  with pytest.raises(FileNotFoundError, match=r"lacks config\.json, which"):
    load_backbone(f"ckpt:{tmp_path / 'run' / 'checkpoints'}")


def test_electra_run_gives_the_discriminator(tmp_path, vocab):
  config = R.run_config(vocab, "size=tiny,objective=electra", embedding_size=8)
  saved = R.saved_run(tmp_path / "run", config)[7]
  got = load_backbone(f"ckpt:{tmp_path / 'run' / 'checkpoints' / '7'}")  # a step folder
  assert got.cfg.embed_size == 8 and got.pooler is None
  ft = bb.build_model(got, "tag", 5, pooling="cls", seed=0)
  R.assert_same(ft.encoder, saved["discriminator"])


def test_hf_folder_backbone(tmp_path):
  from encoder_jax.convert import export_hf_bert
  model = _filled(lambda: BertModel(CFG, rngs=nnx.Rngs(2)))
  export_hf_bert(model, tmp_path / "hf")
  got = load_backbone(f"hf:{tmp_path / 'hf'}", model_overrides={"hidden_dropout": 0.0})
  assert got.cfg.hidden_dropout == 0.0 and got.cfg.num_layers == 2
  ft = bb.build_model(got, "classify", 2, pooling="cls", seed=0)
  R.assert_same(ft.encoder, model.encoder)
  R.assert_same(ft.head.pooler, model.pooler)
  # Mean pooling has no pooler to fill; building still works and the head is fresh.
  assert bb.build_model(got, "classify", 2, pooling="mean", seed=0).head.pooler is None


def test_hf_electra_and_roberta_folder_backbones(tmp_path):
  from encoder_jax.convert import export_hf_electra, export_hf_roberta
  from encoder_jax.model import BertForPreTraining
  from encoder_jax.model.electra import ElectraDiscriminator
  disc = _filled(lambda: ElectraDiscriminator(CFG.replace(embedding_size=8), rngs=nnx.Rngs(4)))
  export_hf_electra(disc, tmp_path / "electra")
  got = load_backbone(f"hf:{tmp_path / 'electra'}", model_overrides={"hidden_dropout": 0.0})
  assert got.cfg == disc.cfg.replace(hidden_dropout=0.0) and got.pooler is None
  R.assert_same(bb.build_model(got, "classify", 2, pooling="cls", seed=0).encoder,
                disc.encoder)
  roberta_cfg = CFG.replace(type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
  mlm = _filled(lambda: BertForPreTraining(roberta_cfg, nsp=False, rngs=nnx.Rngs(5)))
  export_hf_roberta(mlm, tmp_path / "roberta")
  got = load_backbone(f"hf:{tmp_path / 'roberta'}")
  assert got.cfg == roberta_cfg and got.pooler is None
  R.assert_same(bb.build_model(got, "tag", 2, pooling="cls", seed=0).encoder, mlm.bert.encoder)
  R.assert_same(got.heads["mlm"], mlm.mlm)  # the LM head comes along (init_from takes it)
