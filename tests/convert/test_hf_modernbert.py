"""HF ModernBERT parity (transformers' torch ModernBertModel / ModernBertForMaskedLM built from a
ModernBertConfig with random weights; no hub), the modernbert size family against HF's
parameter counts, and import / export both ways (encoder_jax.hf.modernbert)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from encoder_jax.hf import modernbert as hf_modernbert  # noqa: E402
from encoder_jax.hf.bert import _pure_params  # noqa: E402
from encoder_jax.model import BertForPreTraining, BertModel, ModelConfig  # noqa: E402
from encoder_jax.model.config import MODERNBERT_BLOCK, model_config_for_size  # noqa: E402
from encoder_jax.model.electra import ElectraModel, generator_config  # noqa: E402

pytestmark = pytest.mark.parity
TOL = 1e-4
# Small, but with what matters: 7 layers (global 0, 3, 6: local layers on both sides of a
# global one, and a scanned stack of 6 after layer 0), a window (16) well inside the rows.
SMALL_HF = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=7,
                num_attention_heads=4, max_position_embeddings=128, local_attention=16,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
BIASED = dict(attention_bias=True, mlp_bias=True, classifier_bias=True, norm_bias=True,
              hidden_activation="silu", classifier_activation="silu")  # SwiGLU, all biases


def _perturb(model, qk_scale):
  """Norms, biases and the decoder bias moved off their init values (ones / zeros), so a
  missing or swapped one shows; Wqkv scaled up, so that attention logits are O(1) and
  positions (RoPE's theta) change the outputs by far more than the tolerance (HF's init,
  std 0.02, leaves a small model's attention nearly uniform)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
      if "Wqkv.weight" in name:
        p.mul_(qk_scale)
  return model


def _hf_mlm(seed=0, attn="eager", **extra):
  """ModernBertForMaskedLM with random weights (`_perturb`)."""
  torch.manual_seed(seed)
  cfg = transformers.ModernBertConfig(**{**SMALL_HF, **extra}, attn_implementation=attn)
  return _perturb(transformers.ModernBertForMaskedLM(cfg).eval(), 8.0)


def _inputs(t=64, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([t, 50, 21, 5])
  ids = rng.integers(3, SMALL_HF["vocab_size"], (4, t))
  mask = np.arange(t)[None, :] < lengths[:, None]
  ids[~mask] = 0
  return ids, mask


def _hf_outputs(model, ids, mask):
  with torch.no_grad():
    ids_t, mask_t = torch.tensor(ids), torch.tensor(mask.astype(np.int64))
    if isinstance(model, transformers.ModernBertForMaskedLM):
      hidden = model.model(ids_t, attention_mask=mask_t).last_hidden_state.numpy()
      return hidden, model(ids_t, attention_mask=mask_t).logits.numpy()
    return model(ids_t, attention_mask=mask_t).last_hidden_state.numpy(), None


@nnx.jit
def _ours(model, ids, mask):
  if isinstance(model, BertForPreTraining):
    logits, _, out = model(ids, mask)
    return out.hidden_BxTxD, logits
  out, _ = model(ids, mask)
  return out.hidden_BxTxD, None


def _max_diff(a, b, mask):
  return float(np.abs(np.asarray(a) - np.asarray(b))[mask].max())


@pytest.mark.parametrize("size,hf_kwargs", [
    ("modernbert-base", {}),  # HF ModernBertConfig's defaults are ModernBERT-base
    ("modernbert-large", dict(hidden_size=1024, intermediate_size=2624, num_hidden_layers=28,
                              num_attention_heads=16))])
def test_sizes_match_hf_modernbert(size, hf_kwargs):
  """Parameter count equal to transformers' ModernBertModel of the same config (149,014,272
  and 394,781,696: the paper's 149M and 395M, arXiv 2412.13663 Table 3), and the block's
  switches equal to what HF reads from that config."""
  hf_cfg = transformers.ModernBertConfig(**hf_kwargs)
  with torch.device("meta"):
    n_hf = sum(p.numel() for p in transformers.ModernBertModel(hf_cfg).parameters())
  ours = model_config_for_size(size, vocab_size=hf_cfg.vocab_size)
  for scan in (True, False):
    model = nnx.eval_shape(lambda s=scan: BertModel(ours.replace(scan_layers=s), pooler=False,
                                                    rngs=nnx.Rngs(0)))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == n_hf
  assert ours.global_layers == tuple(t == "full_attention" for t in hf_cfg.layer_types)
  assert ours.local_window // 2 == hf_cfg.sliding_window == 64
  assert (ours.rope_theta, ours.rope_theta_local) == (
      hf_cfg.rope_parameters["full_attention"]["rope_theta"],
      hf_cfg.rope_parameters["sliding_attention"]["rope_theta"])
  assert (ours.layer_norm_eps, ours.max_positions) == (hf_cfg.norm_eps,
                                                       hf_cfg.max_position_embeddings)
  print(f"{size}: {n_hf:,} parameters")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize("variant", ["modernbert", "swiglu_biased"])
def test_outputs_match_transformers(tmp_path, attn, scan, variant):
  """Hidden states and ModernBertForMaskedLM logits, fp32, padded rows, <= 1e-4."""
  hf = _hf_mlm(attn=attn, **(BIASED if variant == "swiglu_biased" else {}))
  hf.save_pretrained(tmp_path)
  ids, mask = _inputs()
  h_ref, logits_ref = _hf_outputs(hf, ids, mask)
  ours, cfg = hf_modernbert.load(tmp_path, scan_layers=scan)
  assert isinstance(ours, BertForPreTraining) and cfg.glu and cfg.rope
  h, logits = _ours(ours, jnp.asarray(ids), jnp.asarray(mask))
  err_h, err_l = _max_diff(h, h_ref, mask), _max_diff(logits, logits_ref, mask)
  print(f"ModernBERT parity {variant} {attn} scan={scan}: hidden {err_h:.2e}, logits "
        f"{err_l:.2e}")
  assert err_h <= TOL and err_l <= TOL


@pytest.mark.slow
def test_modernbert_base_matches_transformers(tmp_path):
  """The real size (22 x 768, RoPE 160k / 10k, 128-token windows) on rows of 300 tokens, past
  the window, padded."""
  torch.manual_seed(0)
  hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
      attn_implementation="sdpa", pad_token_id=0)).eval()
  _perturb(hf, 3.0)
  hf.save_pretrained(tmp_path)
  rng = np.random.default_rng(0)
  ids = rng.integers(3, 50368, (2, 300))
  mask = np.arange(300)[None, :] < np.array([[300], [170]])
  ids[~mask] = 0
  h_ref, logits_ref = _hf_outputs(hf, ids, mask)
  ours, cfg = hf_modernbert.load(tmp_path)
  assert cfg == model_config_for_size("modernbert-base", vocab_size=50368, pad_token_id=0)
  h, logits = _ours(ours, jnp.asarray(ids), jnp.asarray(mask))
  err_h, err_l = _max_diff(h, h_ref, mask), _max_diff(logits, logits_ref, mask)
  print(f"ModernBERT-base parity: hidden {err_h:.2e}, logits {err_l:.2e}")
  assert err_h <= TOL and err_l <= TOL


def _small_cfg(**kw) -> ModelConfig:
  return ModelConfig(**{**MODERNBERT_BLOCK, **dict(
      vocab_size=300, hidden_size=64, ffn_size=96, num_layers=4, num_heads=4,
      max_positions=128, local_window=16), **kw})


def _randomize(model, seed):
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(seed)
  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.asarray((1.0 if str(p[-1]) == "scale" else 0.0)
                               + 0.1 * rng.standard_normal(x.shape), x.dtype),
      nnx.to_pure_dict(state)))
  nnx.update(model, state)


@pytest.mark.parametrize("scan", [True, False], ids=["scan", "unrolled"])
def test_export_loads_in_transformers_and_roundtrips_bit_exact(tmp_path, scan):
  ours = BertForPreTraining(_small_cfg(scan_layers=scan), nsp=False, rngs=nnx.Rngs(0))
  _randomize(ours, 0)
  hf_modernbert.export(ours, tmp_path / "mlm")
  hf, info = transformers.ModernBertForMaskedLM.from_pretrained(
      tmp_path / "mlm", output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"]
  ids, mask = _inputs()
  h_ref, logits_ref = _hf_outputs(hf.eval(), ids, mask)
  h, logits = _ours(ours, jnp.asarray(ids), jnp.asarray(mask))
  assert _max_diff(h, h_ref, mask) <= TOL and _max_diff(logits, logits_ref, mask) <= TOL
  back, _ = hf_modernbert.load(tmp_path / "mlm", scan_layers=scan)
  for a, b in zip(jax.tree.leaves(_pure_params(ours)), jax.tree.leaves(_pure_params(back))):
    np.testing.assert_array_equal(a, b)
  # the bare encoder -> ModernBertModel
  base = BertModel(ours.cfg, pooler=False, rngs=nnx.Rngs(1))
  hf_modernbert.export(base, tmp_path / "base")
  hf_base = transformers.ModernBertModel.from_pretrained(tmp_path / "base",
                                                         attn_implementation="eager")
  h_ref, _ = _hf_outputs(hf_base.eval(), ids, mask)
  assert _max_diff(_ours(base, jnp.asarray(ids), jnp.asarray(mask))[0], h_ref, mask) <= TOL


@pytest.mark.parametrize("main_head", ["rtd", "mlm"])
def test_electra_with_a_modernbert_discriminator_exports_it(tmp_path, main_head):
  """HF has no ModernBERT ELECTRA: the discriminator goes out as ModernBertModel (RTD: its
  head has no HF ModernBERT counterpart) or ModernBertForMaskedLM (Replace-MLM's MLM head)."""
  disc = _small_cfg()
  model = ElectraModel(disc, generator_config(disc), main_head=main_head, rngs=nnx.Rngs(0))
  _randomize(model, 1)
  hf_modernbert.export(model, tmp_path)
  ids, mask = _inputs()
  out = model.discriminator(jnp.asarray(ids), jnp.asarray(mask))
  if main_head == "rtd":
    hf = transformers.ModernBertModel.from_pretrained(tmp_path, attn_implementation="eager")
    h_ref, _ = _hf_outputs(hf.eval(), ids, mask)
  else:
    hf = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path,
                                                            attn_implementation="eager")
    h_ref, logits_ref = _hf_outputs(hf.eval(), ids, mask)
    logits = model.disc_mlm(out.hidden_BxTxD, model.token_embed)
    assert _max_diff(logits, logits_ref, mask) <= TOL
  assert _max_diff(out.hidden_BxTxD, h_ref, mask) <= TOL


def test_represents_says_why_and_export_refuses_before_writing(tmp_path):
  assert hf_modernbert.represents(model_config_for_size("modernbert-large")) is None
  why = hf_modernbert.represents(ModelConfig())
  for phrase in ("post-LN", "learned position table", "no rotary", "plain FFN",
                 "token type embeddings"):
    assert phrase in why
  with pytest.raises(ValueError, match="HF ModernBERT cannot represent .* post-LN"):
    hf_modernbert.export(BertModel(ModelConfig(vocab_size=50, hidden_size=32, num_layers=1,
                                               num_heads=2, ffn_size=64), pooler=False,
                                   rngs=nnx.Rngs(0)), tmp_path / "out")
  with pytest.raises(ValueError, match="no pooler"):
    hf_modernbert.export(BertModel(_small_cfg(), rngs=nnx.Rngs(0)), tmp_path / "out")
  assert not (tmp_path / "out").exists()


def test_config_import_reads_the_older_hub_keys_as_transformers_does(tmp_path):
  """Hub configs written before transformers 5 say global_attn_every_n_layers /
  global_rope_theta / local_rope_theta and have no layer_types; transformers converts them,
  and so does the import. A layer pattern ModelConfig cannot describe is refused."""
  old = dict(model_type="modernbert", vocab_size=300, hidden_size=64, intermediate_size=96,
             num_hidden_layers=9, num_attention_heads=4, global_attn_every_n_layers=4,
             global_rope_theta=50_000.0, local_rope_theta=7_000.0, local_attention=32,
             norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
             sep_token_id=2)
  hf = transformers.ModernBertConfig(**old)
  cfg = hf_modernbert.hf_config_to_model_config(old)
  assert cfg.global_layers == tuple(t == "full_attention" for t in hf.layer_types)
  assert (cfg.rope_theta, cfg.rope_theta_local) == (50_000.0, 7_000.0)
  assert cfg.local_window // 2 == hf.sliding_window
  odd = {**json.loads(hf.to_json_string()), "layer_types": ["full_attention"] * 2
         + ["sliding_attention"] * 7}
  with pytest.raises(ValueError, match="not 'every k-th layer global"):
    hf_modernbert.hf_config_to_model_config(odd)


def test_a_fine_tuned_classifier_loads_as_its_encoder(tmp_path):
  """A ModernBertForSequenceClassification folder (head.* and classifier.*, no decoder) is no
  MLM: its encoder loads as BertModel, the task head is left out."""
  torch.manual_seed(0)
  hf = _perturb(transformers.ModernBertForSequenceClassification(transformers.ModernBertConfig(
      **SMALL_HF, num_labels=3, attn_implementation="eager")).eval(), 8.0)
  hf.save_pretrained(tmp_path)
  ours, _ = hf_modernbert.load(tmp_path)
  assert isinstance(ours, BertModel) and ours.pooler is None
  ids, mask = _inputs()
  h_ref, _ = _hf_outputs(hf.model, ids, mask)
  assert _max_diff(_ours(ours, jnp.asarray(ids), jnp.asarray(mask))[0], h_ref, mask) <= TOL
