"""The block's switches (ModelConfig: norm, norm_bias, linear_bias, glu, rope, local_window /
global_every, learned_positions, embedding_norm, first_attn_norm), each against the float64
numpy encoder of numpy_reference.py, written from the papers; their parameter trees; scanned
stacks with per-layer kinds (still one scan) equal to unrolled ones, with remat; the
pre-training objectives (MLM + NSP, ELECTRA, Replace-MLM) and the decoder on top of them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import numpy_reference
from encoder_jax.model import BertForPreTraining, Encoder, ModelConfig
from encoder_jax.model.attention import KeyMask, MultiHeadAttention, describe_attention
from encoder_jax.model.config import MODERNBERT_BLOCK, bert_block_departures
from encoder_jax.model.encoder import packed_positions
from encoder_jax.model.rotary import apply_rope, rope_angles
from encoder_jax.objectives import pretraining
from random_params import randomize
from seq2seq_decoder import Seq2Seq

BASE = dict(vocab_size=50, hidden_size=32, num_layers=4, num_heads=4, ffn_size=48,
            max_positions=32, hidden_dropout=0.0, attention_dropout=0.0, layer_norm_eps=1e-5,
            scan_layers=False)
MODERNBERT_SMALL = {**MODERNBERT_BLOCK, "max_positions": 32, "local_window": 4,
                    "global_every": 3}
SWITCHES = {
    "rope_post_ln": dict(rope=True, learned_positions=False),
    "rope_two_thetas_window_pre_ln": dict(rope=True, rope_theta=160_000.0, local_window=4,
                                          global_every=2, norm_first=True),
    "window_learned_positions_post_ln": dict(local_window=6, global_every=3),
    "geglu": dict(glu=True, activation="gelu"),
    "swiglu_rmsnorm_pre_ln": dict(glu=True, activation="silu", norm="rmsnorm",
                                  norm_first=True),
    "bias_free_no_embedding_norm": dict(linear_bias=False, norm_bias=False,
                                        embedding_norm=False),
    "modernbert_block": MODERNBERT_SMALL,
}


def _batch():
  """Two rows, T = 14: row 0 two packed examples (6 + 5) and 3 pads, row 1 one of 12."""
  rng = np.random.default_rng(1)
  ids = rng.integers(1, 50, (2, 14)).astype(np.int32)
  seg = np.array([[1] * 6 + [2] * 5 + [0] * 3, [1] * 12 + [0] * 2], np.int32)
  ids[seg == 0] = 0
  return ids, seg > 0, seg, np.asarray(packed_positions(jnp.asarray(seg)))


@nnx.jit
def _run(enc, ids, mask, seg, pos):
  return enc(ids, mask, segment_ids_BxT=seg, positions_BxT=pos).hidden_BxTxD


@pytest.mark.parametrize("name", list(SWITCHES))
def test_switch_matches_the_numpy_reference(name):
  cfg = ModelConfig(**{**BASE, **SWITCHES[name]})
  enc = Encoder(cfg, rngs=nnx.Rngs(0))
  randomize(enc, 0)
  ids, mask, seg, pos = _batch()
  ours = np.asarray(_run(enc, ids, mask, seg, pos))
  params = nnx.to_pure_dict(nnx.state(enc, nnx.Param))
  want = numpy_reference.encoder(params, cfg, ids, mask, seg, pos)
  err = np.abs(ours - want)[mask].max()
  print(f"{name}: max abs diff vs numpy {err:.2e}")
  assert err < 2e-5


def test_parameter_trees_follow_the_switches():
  cfg = ModelConfig(**{**BASE, **MODERNBERT_SMALL, "scan_layers": True})
  model = BertForPreTraining(cfg, nsp=True, rngs=nnx.Rngs(0))
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  shapes = jax.tree.map(np.shape, pure)
  paths = {"/".join(str(k.key) for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(pure)}
  # bias-free linears and norms: only the layers that output logits keep a bias
  assert {p for p in paths if "bias" in p} == {"mlm/bias", "nsp/out/bias"}
  enc = shapes["bert"]["encoder"]
  assert set(enc["embeddings"]) == {"token", "ln"}  # no position / type table
  assert "ln_attn" not in enc["first_block"] and "ln_attn" in enc["blocks"]
  assert enc["blocks"]["ffn_in"]["kernel"] == (3, 32, 2, 48)  # layers 1..3, [D, 2, F]
  rms = Encoder(cfg.replace(norm="rmsnorm", embedding_norm=False, first_attn_norm=True),
                rngs=nnx.Rngs(0))
  rms_shapes = nnx.to_pure_dict(nnx.state(rms, nnx.Param))
  assert "ln" not in rms_shapes["embeddings"] and set(rms_shapes["final_ln"]) == {"scale"}


def test_config_refuses_what_cannot_be_built():
  with pytest.raises(ValueError, match="first_attn_norm=False .* needs norm_first=True"):
    ModelConfig(**BASE, first_attn_norm=False)
  with pytest.raises(ValueError, match="head_dim=5 is odd"):
    ModelConfig(**{**BASE, "hidden_size": 20}, rope=True)
  with pytest.raises(ValueError, match="local_window=-2"):
    ModelConfig(**BASE, local_window=-2)
  with pytest.raises(ValueError, match="norm='batchnorm'"):
    ModelConfig(**BASE, norm="batchnorm")
  assert ModelConfig(**{**BASE, "num_layers": 7}, local_window=8, global_every=3
                     ).global_layers == (True, False, False, True, False, False, True)


def test_bert_block_departures_name_every_switch_set():
  """What a BERT-block converter (HF BERT / ELECTRA) must refuse: nothing for BERT's block,
  each switch of every config above, and no window whose layers are all global."""
  assert bert_block_departures(ModelConfig()) == []
  assert bert_block_departures(ModelConfig(**BASE, local_window=8, global_every=1)) == []
  assert len(bert_block_departures(ModelConfig(**{**BASE, **MODERNBERT_SMALL}))) == 7
  for name, switches in SWITCHES.items():
    found = bert_block_departures(ModelConfig(**{**BASE, **switches}))
    assert len(found) == len({k for k in switches if k in (
        "norm", "norm_bias", "linear_bias", "glu", "learned_positions", "rope",
        "local_window", "embedding_norm", "first_attn_norm")}), (name, found)


def test_rope_rotates_pairs_as_the_paper_and_keeps_logits_relative():
  rng = np.random.default_rng(0)
  q, k = rng.standard_normal((2, 1, 9, 3, 16))
  pos = np.array([[0, 1, 2, 7, 50, 300, 511, 3, 4]])
  cos, sin = rope_angles(jnp.asarray(pos), 16, (10_000.0, 10_000.0))
  got = np.asarray(apply_rope(jnp.asarray(q, jnp.float32), cos, sin))
  want = numpy_reference.rope(q[0], pos[0].astype(np.float64), 10_000.0)
  np.testing.assert_allclose(got[0], want, atol=2e-4)
  # q_i . k_j depends on i - j only: shifting every position by 37 keeps all logits
  def logits(p):
    c, s = rope_angles(jnp.asarray(p), 16, (500.0, 500.0))
    rq, rk = (apply_rope(jnp.asarray(x, jnp.float32), c, s) for x in (q, k))
    return np.einsum("btnh,bsnh->bnts", rq, rk)
  np.testing.assert_allclose(logits(pos), logits(pos + 37), atol=2e-4)


def _stacked(unrolled: dict, first_apart: bool) -> dict:
  """An unscanned Encoder's pure params in the scanned layout (first_block apart or not)."""
  layers = [unrolled["blocks"][i] for i in sorted(unrolled["blocks"])]
  out = {k: v for k, v in unrolled.items() if k != "blocks"}
  if first_apart:
    out["first_block"], layers = layers[0], layers[1:]
  out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return out


def _scan_lengths(fn, *args) -> list[int]:
  return [e.params["length"] for e in jax.make_jaxpr(fn)(*args).eqns
          if e.primitive.name == "scan"]


@pytest.mark.parametrize("remat", ["none", "dots"])
@pytest.mark.parametrize("first_attn_norm", [True, False])
def test_scanned_kinds_equal_unrolled_and_still_scan(remat, first_attn_norm):
  """Layer kinds (window, theta) vary per layer; the stack still runs as one scan over them,
  with the same values and gradients as the unrolled stack."""
  kw = {**BASE, **MODERNBERT_SMALL, "num_layers": 5, "first_attn_norm": first_attn_norm,
        "remat_policy": remat}
  unrolled = Encoder(ModelConfig(**kw), rngs=nnx.Rngs(0))
  randomize(unrolled, 3)
  scanned = Encoder(ModelConfig(**{**kw, "scan_layers": True}), rngs=nnx.Rngs(0))
  state = nnx.state(scanned, nnx.Param)
  nnx.replace_by_pure_dict(state, _stacked(nnx.to_pure_dict(nnx.state(unrolled, nnx.Param)),
                                           not first_attn_norm))
  nnx.update(scanned, state)
  ids, mask, seg, pos = _batch()

  def loss_and_grad(model):
    graphdef, params = nnx.split(model, nnx.Param)
    def loss(p):
      h = nnx.merge(graphdef, p)(ids, mask, segment_ids_BxT=seg, positions_BxT=pos).hidden_BxTxD
      return jnp.sum(jnp.where(mask[..., None], h, 0.0) ** 2), h
    (_, h), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(h), nnx.to_pure_dict(g), loss, params

  h_u, g_u, _, _ = loss_and_grad(unrolled)
  h_s, g_s, loss_s, params_s = loss_and_grad(scanned)
  np.testing.assert_allclose(h_s[mask], h_u[mask], atol=2e-5)
  for a, b in zip(jax.tree.leaves(_stacked(g_u, not first_attn_norm)), jax.tree.leaves(g_s)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
  assert _scan_lengths(loss_s, params_s) == [4 if not first_attn_norm else 5]


def test_describe_attention_names_the_local_layers():
  line = describe_attention(ModelConfig(**{**BASE, **MODERNBERT_SMALL}), "cpu")
  assert "layers 0, 3 global, the others within |i - j| <= 2" in line


@pytest.mark.parametrize("objective,nsp", [("mlm", "nsp"), ("electra", "none"),
                                           ("replace_mlm", "none")])
def test_objectives_train_through_the_switches(objective, nsp):
  """A ModernBERT-block model (scanned, remat, dropout on) under each pre-training objective:
  finite loss, and a gradient in layer 0 and in the stacked layers."""
  cfg = ModelConfig(**{**BASE, **MODERNBERT_SMALL, "scan_layers": True, "remat_policy": "dots",
                       "hidden_dropout": 0.1, "attention_dropout": 0.1})
  obj = pretraining.ObjectiveConfig(objective=objective, sentence_task=nsp, vocab_size=50,
                                    mask_id=3, special_ids=(0, 1, 2, 3), max_predictions=4)
  model = pretraining.build_model(cfg, obj, rngs=nnx.Rngs(0))
  model.train()
  ids, mask, seg, pos = _batch()
  batch = {"input_ids": np.maximum(ids, 4) * mask, "mask": mask, "segment_ids": seg,
           "positions": pos, "nsp_label": np.array([0, 1], np.int32)}
  graphdef, params = nnx.split(model, nnx.Param)

  @jax.jit
  def grad(p):
    loss = lambda p: pretraining.loss_and_metrics(nnx.merge(graphdef, p), batch,
                                                  jax.random.key(0), obj, train=True)[0]
    return jax.value_and_grad(loss)(p)

  loss, g = grad(params)
  assert np.isfinite(loss)
  enc = g["bert"]["encoder"] if objective == "mlm" else g["discriminator"]
  for part in (enc["first_block"], enc["blocks"]):
    assert float(jnp.abs(part["attn"]["qkv_kernel"][...]).sum()) > 0


def test_decoder_composes_with_the_switches():
  """Seq2Seq with a ModernBERT-block encoder and decoder (RoPE and a causal window in the
  decoder's self-attention, bias-free, GeGLU): causal, blind to padded memory, decodes."""
  cfg = ModelConfig(**{**BASE, **MODERNBERT_SMALL})
  model = Seq2Seq(cfg, cfg.replace(num_layers=2, global_every=2), rngs=nnx.Rngs(0))
  randomize(model, 1)
  src = jnp.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
  tgt = jnp.array([[1, 20, 21, 22, 23, 24, 25], [1, 30, 31, 32, 33, 34, 35]])
  logits = np.asarray(model(src, tgt, src != 0, jnp.ones_like(tgt, bool)))
  changed = np.asarray(model(src, tgt.at[:, 5].set(40), src != 0, jnp.ones_like(tgt, bool)))
  np.testing.assert_allclose(changed[:, :5], logits[:, :5], atol=1e-5)  # causal
  assert np.abs(changed[:, 5:] - logits[:, 5:]).max() > 1e-4
  junk = np.asarray(model(src.at[0, 4:].set(33), tgt, src != 0, jnp.ones_like(tgt, bool)))
  np.testing.assert_allclose(junk, logits, atol=1e-5)  # padded memory slots are never seen
  assert np.isfinite(logits).all()


def test_explicit_pallas_refuses_local_layers():
  """The kernel takes no window: an explicit "pallas" refuses a local layer, static or traced
  (a scanned stack's), before any kernel runs ("auto" falls back: test_packed_rows.py)."""
  cfg = ModelConfig(**{**BASE, **MODERNBERT_SMALL, "hidden_size": 128, "num_heads": 2,
                       "max_positions": 128, "attention_impl": "pallas"})
  mha = MultiHeadAttention(cfg, rngs=nnx.Rngs(0))
  x, keys = jnp.ones((1, 128, 128)), KeyMask(jnp.ones((1, 128), bool))
  pos = jnp.arange(128)[None]
  with pytest.raises(ValueError, match="local layer's window"):
    mha(x, keys, positions_BxT=pos, is_global=False)
  with pytest.raises(ValueError, match="local layer's window"):
    jax.jit(lambda g: mha(x, keys, positions_BxT=pos, is_global=g))(jnp.bool_(True))


def test_cudnn_takes_the_window_in_its_mask(monkeypatch):
  """On a GPU in bf16 "auto" asks cuDNN, with the window as part of its mask in local layers
  (what the call is asked is checked here; on this CPU cuDNN then declines and XLA runs)."""
  cfg = ModelConfig(**{**BASE, **MODERNBERT_SMALL, "num_layers": 2, "global_every": 2,
                       "dtype": "bfloat16", "platform": "gpu"})
  masks, real = [], jax.nn.dot_product_attention

  def spy(*args, implementation=None, mask=None, **kwargs):
    if implementation == "cudnn":
      masks.append(np.asarray(mask[0, 0]))
    return real(*args, implementation=implementation, mask=mask, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  Encoder(cfg, rngs=nnx.Rngs(0))(jnp.arange(1, 13)[None])  # eager: the masks are concrete
  near = np.abs(np.arange(12)[:, None] - np.arange(12)[None, :]) <= 2
  assert len(masks) == 2
  np.testing.assert_array_equal(masks[0], np.ones((12, 12), bool))  # layer 0: global
  np.testing.assert_array_equal(masks[1], near)  # layer 1: |i - j| <= local_window // 2
