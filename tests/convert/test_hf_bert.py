"""HF parity on a real checkpoint nobody here trained (all-MiniLM-L6-v2), and export/import."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_jax.convert import export_hf_bert, load_hf_bert  # noqa: E402
from encoder_jax.hf.bert import _pure_params  # noqa: E402
from encoder_jax.data.fetch import minilm_dir  # noqa: E402
from encoder_jax.data.tokenizer import WordPieceTokenizer  # noqa: E402
from encoder_jax.model import BertForPreTraining, ModelConfig  # noqa: E402

pytestmark = pytest.mark.parity
TOL = 1e-5
TEXTS_A = ["The whale surfaced beside the ship.",
           "Mr. President, the state of our union is strong, and growing stronger every year.",
           "Call me Ishmael.",
           "Congress shall make no law respecting an establishment of religion.",
           "Yes."]
TEXTS_B = ["Nobody on deck said a word.", "Applause.", "Some years ago, never mind how long.",
           "", "No."]


@pytest.fixture(scope="module")
def ckpt():
  return minilm_dir()


@pytest.fixture(scope="module")
def batch(ckpt):
  tok = WordPieceTokenizer.from_vocab(ckpt / "vocab.txt")
  b = tok.batch_encode_pairs(TEXTS_A, TEXTS_B, max_length=40)
  mask = np.asarray(b["mask"]).astype(bool)
  assert len(set(mask.sum(1))) >= 4, "inputs must differ in length"
  return {k: np.asarray(v) for k, v in b.items()}, mask


def _hf_outputs(model, batch):
  b, _ = batch
  with torch.no_grad():
    o = model(input_ids=torch.tensor(b["input_ids"]).long(),
              attention_mask=torch.tensor(b["mask"]).long(),
              token_type_ids=torch.tensor(b["token_types"]).long())
  return o.last_hidden_state.numpy(), o.pooler_output.numpy()


def _ours(model, batch):
  b, _ = batch
  fwd = nnx.jit(lambda m, x, msk, tt: m(x, msk, tt))
  out, pooled = fwd(model, jnp.asarray(b["input_ids"]), jnp.asarray(b["mask"]),
                    jnp.asarray(b["token_types"]))
  return np.asarray(out.hidden_BxTxD), np.asarray(pooled)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_minilm_matches_transformers(ckpt, batch, scan):
  hf = transformers.BertModel.from_pretrained(str(ckpt), local_files_only=True).eval()
  h_ref, p_ref = _hf_outputs(hf, batch)
  h, p = _ours(load_hf_bert(ckpt, scan_layers=scan), batch)
  mask = batch[1]
  err_h, err_p = np.abs(h[mask] - h_ref[mask]).max(), np.abs(p - p_ref).max()
  print(f"MiniLM parity ({'scan' if scan else 'unrolled'}): hidden {err_h:.2e}, "
        f"pooler {err_p:.2e}")
  assert err_h <= TOL and err_p <= TOL


def test_export_reloads_in_transformers_and_roundtrips_bit_exact(ckpt, batch, tmp_path):
  ours = load_hf_bert(ckpt)
  export_hf_bert(ours, tmp_path)
  hf = transformers.BertModel.from_pretrained(str(tmp_path), local_files_only=True).eval()
  h_ref, p_ref = _hf_outputs(hf, batch)
  h, p = _ours(ours, batch)
  mask = batch[1]
  err = max(np.abs(h[mask] - h_ref[mask]).max(), np.abs(p - p_ref).max())
  print(f"exported MiniLM reloaded in transformers: max abs diff {err:.2e}")
  assert err <= TOL
  again = load_hf_bert(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, _pure_params(ours), _pure_params(again))


def test_pretraining_model_export_loads_as_bert_for_pretraining(tmp_path):
  cfg = ModelConfig(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
                    max_positions=16, hidden_dropout=0.0, attention_dropout=0.0)
  ours = BertForPreTraining(cfg, nsp=True, rngs=nnx.Rngs(0))
  # Make the MLM bias non-zero so a dropped tensor would show.
  ours.mlm.bias[...] = jnp.linspace(-1, 1, 120)
  export_hf_bert(ours, tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
      "BertForPreTraining"]
  hf, info = transformers.BertForPreTraining.from_pretrained(
      str(tmp_path), local_files_only=True, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids = np.array([[2, 5, 6, 7, 3, 0], [2, 9, 3, 11, 12, 3]])
  mask = (ids != 0).astype(np.int64)
  tt = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]])
  with torch.no_grad():
    o = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                  token_type_ids=torch.tensor(tt))
  mlm, nsp, _ = ours(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(tt))
  valid = mask.astype(bool)
  assert np.abs(np.asarray(mlm)[valid] - o.prediction_logits.numpy()[valid]).max() <= TOL
  assert np.abs(np.asarray(nsp) - o.seq_relationship_logits.numpy()).max() <= TOL
  again = load_hf_bert(tmp_path, pretraining=True)
  jax.tree.map(np.testing.assert_array_equal, _pure_params(ours), _pure_params(again))


def test_export_refuses_pre_ln(tmp_path):
  cfg = ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64,
                    max_positions=8, norm_first=True)
  with pytest.raises(ValueError, match="post-LN"):
    export_hf_bert(BertForPreTraining(cfg, rngs=nnx.Rngs(0)), tmp_path)


def test_bare_checkpoint_as_pretraining_model_says_how(ckpt):
  with pytest.raises(ValueError, match="pretraining=False"):
    load_hf_bert(ckpt, pretraining=True)


def test_embedding_projection_matches_transformers_electra():
  """ELECTRA-small's embeddings are narrower than its hidden size (128 -> 256): the encoder
  projects them once, between the embedding LayerNorm and the first block, as HF's
  ElectraModel (`embeddings_project`) does. Same weights, same outputs."""
  from encoder_jax.hf.bert import _encoder_to_hf
  from encoder_jax.model import Encoder
  cfg = ModelConfig(vocab_size=50, hidden_size=32, embedding_size=16, num_layers=2,
                    num_heads=4, ffn_size=64, max_positions=16, scan_layers=False)
  ours = Encoder(cfg, rngs=nnx.Rngs(0))
  pure = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(ours, nnx.Param)))
  assert pure["embeddings"]["token"]["embedding"].shape == (50, 16)
  tensors = _encoder_to_hf(pure, cfg)
  tensors["embeddings_project.weight"] = pure["embed_proj"]["kernel"].T
  tensors["embeddings_project.bias"] = pure["embed_proj"]["bias"]
  hf = transformers.ElectraModel(transformers.ElectraConfig(
      vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=16,
      hidden_act="gelu", layer_norm_eps=cfg.layer_norm_eps)).eval()
  info = hf.load_state_dict({k: torch.tensor(np.array(v)) for k, v in tensors.items()},
                            strict=False)
  assert not info.unexpected_keys and not [k for k in info.missing_keys
                                           if not k.endswith("position_ids")], info
  ids = np.array([[2, 5, 6, 7, 3, 0], [2, 9, 3, 11, 12, 3]])
  mask = ids != 0
  tt = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1]])
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
             token_type_ids=torch.tensor(tt)).last_hidden_state.numpy()
  out = nnx.jit(lambda m, x, msk, t: m(x, msk, t))(ours, jnp.asarray(ids), jnp.asarray(mask),
                                                    jnp.asarray(tt)).hidden_BxTxD
  assert out.shape == (2, 6, 32)
  assert np.abs(np.asarray(out)[mask] - ref[mask]).max() <= TOL
