"""HF ELECTRA parity on random models transformers builds offline, and export/import.

ELECTRA-small widths (embedding 128 projected to hidden 256, 4 heads, FFN 1024; the generator
at 1/4: hidden 64, 1 head, FFN 256, embedding 128) with 2 layers instead of 12 for speed.
Every parameter, LayerNorms and biases included, is drawn at random, so a swapped or dropped
tensor shows in the outputs.
"""
import jax
import numpy as np
import pytest
from absl import logging as absl_logging
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_jax.convert import (export_hf_electra, load_hf_bert, load_hf_electra,  # noqa: E402
                                 load_hf_electra_pair)
from encoder_jax.hf.bert import _pure_params  # noqa: E402
from encoder_jax.model.electra import (ElectraDiscriminator, ElectraGenerator,  # noqa: E402
                                       ElectraModel)

pytestmark = pytest.mark.parity
TOL = 1e-5
SMALL = dict(vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=1024, max_position_embeddings=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
GENERATOR = dict(SMALL, hidden_size=64, num_attention_heads=1, intermediate_size=256)


def _randomize(model, seed):
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      p.copy_(1 + 0.1 * noise if name.endswith("LayerNorm.weight")
              else 0.1 * noise if name.endswith("bias") else 0.05 * noise)
  return model.eval()


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """HF discriminator and generator with tied (equal) embeddings, a generator with its own,
  and a bare ElectraModel, each saved with save_pretrained (safetensors)."""
  root = tmp_path_factory.mktemp("hf_electra")
  disc = _randomize(transformers.ElectraForPreTraining(transformers.ElectraConfig(**SMALL)), 0)
  gen = _randomize(transformers.ElectraForMaskedLM(transformers.ElectraConfig(**GENERATOR)), 1)
  gen.save_pretrained(root / "gen_untied")
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  disc.save_pretrained(root / "disc")
  gen.save_pretrained(root / "gen")
  disc.electra.save_pretrained(root / "bare")
  return {"disc": disc, "gen": gen, "dirs": {k: root / k for k in ("disc", "gen", "bare",
                                                                 "gen_untied")}}


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  lengths = [24, 17, 9, 3]
  ids = rng.integers(5, SMALL["vocab_size"], size=(4, 24))
  mask = np.arange(24)[None, :] < np.array(lengths)[:, None]
  ids = np.where(mask, ids, 0)
  types = np.where(np.arange(24)[None, :] >= np.array(lengths)[:, None] // 2, 1, 0) * mask
  return ids, mask, types


def _torch_out(model, batch):
  ids, mask, types = batch
  with torch.no_grad():
    o = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
              token_type_ids=torch.tensor(types), output_hidden_states=True)
  return o.logits.numpy(), o.hidden_states[-1].numpy()


def _ours(model, batch):
  """(head logits, last hidden states) of our ElectraDiscriminator / ElectraGenerator."""
  ids, mask, types = batch
  logits, out = nnx.jit(lambda m, a, b, c: m(a, b, c))(model, ids, mask, types)
  return (None if logits is None else np.asarray(logits)), np.asarray(out.hidden_BxTxD)


def _max_err(a, b, mask):
  return float(np.abs(a[mask] - b[mask]).max())


def _assert_same_params(a, b):
  jax.tree.map(np.testing.assert_array_equal, _pure_params(a), _pure_params(b))


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_import_matches_transformers_and_export_roundtrips(hf, batch, scan, tmp_path):
  mask = batch[1]
  for name, cls, hf_cls in (("disc", ElectraDiscriminator, transformers.ElectraForPreTraining),
                            ("gen", ElectraGenerator, transformers.ElectraForMaskedLM)):
    ref_logits, ref_hidden = _torch_out(hf[name], batch)
    ours = load_hf_electra(hf["dirs"][name], scan_layers=scan)
    assert isinstance(ours, cls) and ours.cfg.scan_layers == scan
    logits, hidden = _ours(ours, batch)
    errs = _max_err(hidden, ref_hidden, mask), _max_err(logits, ref_logits, mask)
    print(f"{name} ({'scan' if scan else 'unrolled'}) vs transformers: hidden {errs[0]:.2e}, "
          f"logits {errs[1]:.2e}")
    assert max(errs) <= TOL

    export_hf_electra(ours, tmp_path / name)
    back, info = hf_cls.from_pretrained(tmp_path / name, local_files_only=True,
                                        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back_logits, _ = _torch_out(back.eval(), batch)
    assert _max_err(back_logits, ref_logits, mask) <= TOL
    _assert_same_params(ours, load_hf_electra(tmp_path / name, scan_layers=scan))


def test_bare_electra_model_loads_as_encoder_and_exports_as_electra_model(hf, batch, tmp_path):
  ours = load_hf_electra(hf["dirs"]["bare"])
  assert isinstance(ours, ElectraDiscriminator) and ours.rtd is None
  _, ref_hidden = _torch_out(hf["disc"], batch)
  logits, hidden = _ours(ours, batch)
  assert logits is None and _max_err(hidden, ref_hidden, batch[1]) <= TOL
  export_hf_electra(ours, tmp_path)
  back, info = transformers.ElectraModel.from_pretrained(tmp_path, local_files_only=True,
                                                         output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  _assert_same_params(ours, load_hf_electra(tmp_path))


def _pair_outputs(model: ElectraModel, batch):
  ids, mask, types = batch
  gen_out = model.generator(ids, mask, types)
  disc_out = model.discriminator(ids, mask, types)
  return (np.asarray(model.gen_mlm(gen_out.hidden_BxTxD, model.token_embed)),
          np.asarray(model.rtd(disc_out.hidden_BxTxD)))


def test_pair_ties_embeddings_and_exports_two_folders(hf, batch, tmp_path):
  mask = batch[1]
  pair = load_hf_electra_pair(hf["dirs"]["disc"], hf["dirs"]["gen"], scan_layers=False)
  assert pair.gen_cfg.hidden_size == 64 and pair.disc_cfg.embed_size == 128
  gen_logits, rtd_logits = _pair_outputs(pair, batch)
  assert _max_err(gen_logits, _torch_out(hf["gen"], batch)[0], mask) <= TOL
  assert _max_err(rtd_logits, _torch_out(hf["disc"], batch)[0], mask) <= TOL

  disc_dir, gen_dir = export_hf_electra(pair, tmp_path / "run")
  assert gen_dir == disc_dir / "generator"
  disc = transformers.ElectraForPreTraining.from_pretrained(disc_dir, local_files_only=True)
  gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir, local_files_only=True)
  # HF keeps a copy of the tied embeddings in each model: both copies are written.
  for a, b in zip(disc.electra.embeddings.state_dict().values(),
                  gen.electra.embeddings.state_dict().values()):
    assert torch.equal(a, b)
  assert _max_err(_torch_out(gen.eval(), batch)[0], gen_logits, mask) <= TOL
  assert _max_err(_torch_out(disc.eval(), batch)[0], rtd_logits, mask) <= TOL
  _assert_same_params(pair, load_hf_electra_pair(disc_dir, gen_dir, scan_layers=False))


def test_pair_with_different_embeddings_keeps_the_discriminators(hf, caplog):
  with caplog.at_level("WARNING", logger=absl_logging.get_absl_logger().name):
    pair = load_hf_electra_pair(hf["dirs"]["disc"], hf["dirs"]["gen_untied"])
  assert "differ from the discriminator's" in caplog.text
  np.testing.assert_array_equal(
      np.asarray(pair.token_embed.embedding[...]),
      hf["disc"].electra.embeddings.word_embeddings.weight.detach().numpy())
  # One module, one table: the generator reads the discriminator's.
  assert pair.generator.embeddings is pair.discriminator.embeddings


def test_wrong_folders_say_what_to_do(hf):
  with pytest.raises(ValueError, match="load_hf_electra"):
    load_hf_bert(hf["dirs"]["disc"])
  with pytest.raises(ValueError, match="ElectraForPreTraining checkpoint as the discriminator"):
    load_hf_electra_pair(hf["dirs"]["gen"], hf["dirs"]["disc"])
