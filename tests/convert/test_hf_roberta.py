"""HF RoBERTa parity: randomly initialised transformers models built from a RobertaConfig (no
hub), read by encoder_jax, compute the same hidden states and MLM logits on right-padded rows;
our models exported as RoBERTa load in transformers with nothing missing and compute ours."""
import json

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_jax.convert import export_hf_roberta, load_hf_roberta  # noqa: E402
from encoder_jax.hf.bert import _pure_params  # noqa: E402
from encoder_jax.model import BertForPreTraining, ModelConfig  # noqa: E402

pytestmark = pytest.mark.parity
TOL = 1e-5
PAD = 1  # RoBERTa's <pad>
# Right-padded rows of four different lengths, the longest filling the row. <s> = 0, </s> = 2.
LENGTHS = (12, 9, 5, 3)


def _config(**kw):
  """roberta-base's shape in miniature: 514 = 512 + pad + 1 rows there, 36 = 34 + 2 here."""
  base = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, max_position_embeddings=36, type_vocab_size=1,
              layer_norm_eps=1e-5, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  return transformers.RobertaConfig(**{**base, **kw})


def _hf(cls, seed=0, **kw):
  """A random transformers model; every parameter (LayerNorms and biases too) drawn, so a
  tensor mapped to the wrong place cannot hide behind an initial 1 or 0."""
  torch.manual_seed(seed)
  model = cls(_config(**kw)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2)
  return model


def _rows():
  rng = np.random.default_rng(0)
  T = max(LENGTHS)
  ids = np.full((len(LENGTHS), T), PAD, np.int64)
  for r, n in enumerate(LENGTHS):
    ids[r, :n] = [0, *rng.integers(4, 97, n - 2), 2]
  return ids, ids != PAD


def _theirs(model, ids, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                 output_hidden_states=True)


def _save(model, folder):
  model.save_pretrained(folder)  # safetensors, transformers' own layout and config.json
  return folder


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
def test_masked_lm_matches_transformers(tmp_path, scan):
  hf = _hf(transformers.RobertaForMaskedLM)
  ours = load_hf_roberta(_save(hf, tmp_path / "hf"), scan_layers=scan)
  assert isinstance(ours, BertForPreTraining) and ours.nsp is None
  assert ours.cfg.max_positions == 34 and ours.cfg.type_vocab_size == 1
  ids, mask = _rows()
  ref = _theirs(hf, ids, mask)
  logits, _, out = ours(ids, mask)
  err_h = np.abs(np.asarray(out.hidden_BxTxD)[mask] - ref.hidden_states[-1].numpy()[mask]).max()
  err_l = np.abs(np.asarray(logits)[mask] - ref.logits.numpy()[mask]).max()
  print(f"RoBERTa MLM parity ({'scan' if scan else 'unrolled'}): hidden {err_h:.2e}, "
        f"logits {err_l:.2e}")
  assert err_h <= TOL and err_l <= TOL


def test_roberta_model_with_pooler_matches_transformers(tmp_path):
  hf = _hf(transformers.RobertaModel, seed=1)
  ours = load_hf_roberta(_save(hf, tmp_path / "hf"))
  ids, mask = _rows()
  ref = _theirs(hf, ids, mask)
  out, pooled = ours(ids, mask)
  assert np.abs(np.asarray(out.hidden_BxTxD)[mask] -
                ref.last_hidden_state.numpy()[mask]).max() <= TOL
  assert np.abs(np.asarray(pooled) - ref.pooler_output.numpy()).max() <= TOL


def test_positions_start_past_the_padding_row(tmp_path):
  """Our position 0 is HF's row pad + 1: a table read one row off would give other numbers."""
  hf = _hf(transformers.RobertaForMaskedLM, seed=2)
  ours = load_hf_roberta(_save(hf, tmp_path / "hf"))
  table = hf.roberta.embeddings.position_embeddings.weight.detach().numpy()
  np.testing.assert_array_equal(np.asarray(ours.bert.encoder.embeddings.position.embedding[...]),
                                table[PAD + 1:])


def test_export_loads_in_transformers_and_round_trips_bit_exact(tmp_path):
  cfg = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                    max_positions=34, type_vocab_size=1, layer_norm_eps=1e-5,
                    pad_token_id=PAD, hidden_dropout=0.0, attention_dropout=0.0,
                    scan_layers=False)
  ours = load_hf_roberta(_save(_hf(transformers.RobertaForMaskedLM, seed=3), tmp_path / "src"),
                         scan_layers=False)
  assert ours.cfg == cfg
  assert export_hf_roberta(ours, tmp_path / "out") == "RobertaForMaskedLM"
  hf_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
  assert (hf_cfg["model_type"], hf_cfg["max_position_embeddings"], hf_cfg["pad_token_id"],
          hf_cfg["type_vocab_size"]) == ("roberta", 36, PAD, 1)
  hf, info = transformers.AutoModelForMaskedLM.from_pretrained(
      tmp_path / "out", local_files_only=True, output_loading_info=True)
  assert type(hf).__name__ == "RobertaForMaskedLM"
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask = _rows()
  logits, _, _ = ours(ids, mask)
  assert np.abs(np.asarray(logits)[mask] - _theirs(hf.eval(), ids, mask).logits.numpy()[mask]
                ).max() <= TOL
  again = load_hf_roberta(tmp_path / "out", scan_layers=False)
  jax.tree.map(np.testing.assert_array_equal, _pure_params(ours), _pure_params(again))


def test_pre_ln_and_relu_heads_are_refused_naming_the_switch(tmp_path):
  cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, ffn_size=32,
                    max_positions=8, type_vocab_size=1, activation="relu", norm_first=True)
  with pytest.raises(ValueError, match=r"model\.norm_first=True .* and model\.activation="
                                       r"'relu' \(HF RoBERTa's MLM head always applies exact "
                                       r"GELU\)"):
    export_hf_roberta(BertForPreTraining(cfg, nsp=False, rngs=nnx.Rngs(0)), tmp_path)
  assert not any(tmp_path.iterdir())
