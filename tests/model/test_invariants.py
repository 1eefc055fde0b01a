"""The seeds' checks (bidirectional attention, padding, positions, segments, memory) and the
encoder's API guarantees."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from encoder_jax.model import (BertForPreTraining, BertModel, Encoder, ModelConfig, SpanQaHead,
                               TaggerHead, masked_mean, model_config_for_size, pool)
from encoder_jax.model.attention import make_attention_mask

TOL = 1e-5


@nnx.jit
def run(enc, x, m, tt=None, seg=None):
  """Jitted forward (eager op-by-op dispatch is ~10x slower on 2 cores); returns hidden."""
  return enc(x, m, token_types_BxT=tt, segment_ids_BxT=seg).hidden_BxTxD


def tiny(**kw):
  base = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64,
              max_positions=24, hidden_dropout=0.1, attention_dropout=0.1)
  return ModelConfig(**{**base, **kw})


def ids(rows, length):
  """Rows of token ids padded with 0 to `length`, and their mask."""
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return jnp.asarray(out), jnp.asarray(out != 0)


@pytest.fixture(params=[False, True], ids=["post_ln", "pre_ln"])
def encoder(request):
  return Encoder(tiny(norm_first=request.param), rngs=nnx.Rngs(0))


def test_bidirectional(encoder):
  x, m = ids([[5, 6, 7, 8, 9]], 5)
  y = x.at[0, 4].set(11)  # change the LAST token only
  h1, h2 = run(encoder, x, m), run(encoder, y, m)
  # An accidental causal mask would leave position 0 unchanged.
  assert float(jnp.abs(h1[0, 0] - h2[0, 0]).max()) > 1e-4


def test_padding_masked_is_invisible_and_unmasked_moves(encoder):
  x, m = ids([[5, 6, 7, 8]], 4)
  xp, mp = ids([[5, 6, 7, 8]], 9)
  h = run(encoder, x, m)
  hp = run(encoder, xp, mp)
  np.testing.assert_allclose(hp[:, :4], h, atol=TOL)
  # Whatever the padded slots hold: only the mask says what is padding, not the pad id.
  garbage = xp.at[:, 4:].set(jnp.array([50, 60, 70, 80, 90]))
  np.testing.assert_allclose(run(encoder, garbage, mp)[:, :4], h, atol=TOL)
  h_unmasked = run(encoder, xp, jnp.ones_like(mp))  # pads visible: outputs must move
  assert float(jnp.abs(h_unmasked[:, :4] - h).max()) > 1e-4


def test_padding_is_invisible_in_train_mode_too(encoder):
  """Train mode with attention dropout takes the explicit softmax path: padded keys get no
  weight there either (same key and shape, so the same dropout masks)."""
  encoder.train()
  fwd = nnx.jit(lambda e, x, m: e(x, m, dropout_rng=jax.random.key(3)).hidden_BxTxD)
  x, m = ids([[5, 6, 7, 8], [9, 10]], 7)
  garbage = jnp.where(m, x, jnp.arange(40, 47)[None, :])
  h, hg = fwd(encoder, x, m), fwd(encoder, garbage, m)
  np.testing.assert_allclose(hg[np.asarray(m)], h[np.asarray(m)], atol=TOL)
  assert float(jnp.abs(fwd(encoder, garbage, jnp.ones_like(m))[0, :4] - h[0, :4]).max()) > 1e-4
  encoder.eval()


def test_fully_masked_rows_are_finite(encoder):
  x, m = ids([[5, 6, 7], []], 6)
  assert bool(jnp.all(jnp.isfinite(run(encoder, x, m))))
  # Packed rows where a segment sees no key at all also stay finite.
  seg = jnp.array([[1, 1, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0]])
  assert bool(jnp.all(jnp.isfinite(run(encoder, x, m, seg=seg))))


def test_batched_equals_unbatched_in_eval(encoder):
  x, m = ids([[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]], 8)
  hb = run(encoder, x, m)
  for i in range(3):
    hi = run(encoder, x[i:i + 1], m[i:i + 1])
    valid = np.asarray(m[i])
    np.testing.assert_allclose(hb[i][valid], hi[0][valid], atol=TOL)


def test_dropout_only_in_train_mode():
  enc = Encoder(tiny(), rngs=nnx.Rngs(0))
  x, m = ids([[5, 6, 7, 8, 9, 10]], 6)
  assert enc.embeddings.dropout.deterministic, "models are built in eval mode"
  e1, e2 = enc(x, m).hidden_BxTxD, enc(x, m).hidden_BxTxD
  np.testing.assert_array_equal(e1, e2)
  enc.train()
  with pytest.raises(ValueError, match="dropout_rng"):
    enc(x, m)
  t1 = enc(x, m, dropout_rng=jax.random.key(1)).hidden_BxTxD
  t2 = enc(x, m, dropout_rng=jax.random.key(2)).hidden_BxTxD
  t1b = enc(x, m, dropout_rng=jax.random.key(1)).hidden_BxTxD
  assert float(jnp.abs(t1 - t2).max()) > 1e-3  # different masks
  np.testing.assert_array_equal(t1, t1b)  # same key, same result
  enc.eval()
  np.testing.assert_array_equal(enc(x, m).hidden_BxTxD, e1)


def test_eval_mode_is_not_freezing():
  """Eval mode only turns dropout off: gradients still flow to every parameter."""
  enc = Encoder(tiny(), rngs=nnx.Rngs(0))
  x, m = ids([[5, 6, 7, 8]], 4)
  r = jax.random.normal(jax.random.key(0), (1, 4, 32))
  grads = nnx.grad(lambda e: jnp.sum(e(x, m).hidden_BxTxD * r))(enc)
  norms = [float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)]
  assert all(n > 0 for n in norms)


def test_masked_mean_ignores_pads():
  h = jnp.array([[[2.0, 0.0], [0.0, 4.0], [100.0, 100.0]]])
  m = jnp.array([[True, True, False]])
  np.testing.assert_allclose(masked_mean(h, m), [[1.0, 2.0]])
  np.testing.assert_allclose(pool(h, m, "mean"), [[1.0, 2.0]])
  np.testing.assert_allclose(jnp.linalg.norm(pool(h, m, "mean", normalize=True)), 1.0,
                             rtol=1e-6)
  np.testing.assert_allclose(masked_mean(h, jnp.zeros_like(m)), [[0.0, 0.0]])  # empty row


def test_mean_pooling_over_rows_of_different_lengths():
  """Each row is averaged over its own real tokens (not the batch's, not T): lengths 1, 3, 5
  and an empty row, pads holding large values."""
  rng = np.random.default_rng(0)
  lengths = np.array([1, 3, 5, 0])
  m = np.arange(5)[None, :] < lengths[:, None]
  h = np.where(m[..., None], rng.normal(size=(4, 5, 3)), 1e3).astype(np.float32)
  want = [h[b, :n].mean(0) if n else np.zeros(3) for b, n in enumerate(lengths)]
  np.testing.assert_allclose(masked_mean(jnp.asarray(h), jnp.asarray(m)), want, rtol=1e-6)
  # The classifier's mean pooling: each row's logits in a batch equal the row's own, unpadded.
  from encoder_jax.finetune.backbone import FinetuneModel
  model = FinetuneModel(tiny(), "classify", 3, pooling="mean", rngs=nnx.Rngs(0))
  rows = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
  x, mask = ids(rows, 8)
  predict = nnx.jit(lambda mod, x, m: mod({"input_ids": x, "mask": m})["logits"])
  batched = predict(model, x, mask)
  for i, r in enumerate(rows):
    alone = predict(model, *ids([r], len(r)))
    np.testing.assert_allclose(batched[i], alone[0], atol=TOL)


def _count(model_fn):
  abstract = nnx.eval_shape(model_fn)
  return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def test_bert_base_parameter_count_matches_hf():
  cfg = model_config_for_size("base")
  # HF BertForPreTraining(BertConfig()) has 110,106,428 parameters (decoder tied).
  assert _count(lambda: BertForPreTraining(cfg, nsp=True, rngs=nnx.Rngs(0))) == 110_106_428
  # BertModel (with pooler) at the same config: 109,482,240.
  assert _count(lambda: BertModel(cfg, rngs=nnx.Rngs(0))) == 109_482_240


@pytest.mark.parametrize("d,h", [(128, 2), (768, 12)])
def test_parameters_per_block(d, h):
  cfg = ModelConfig(hidden_size=d, num_heads=h, ffn_size=4 * d, num_layers=1, vocab_size=8,
                    max_positions=8)
  one = _count(lambda: Encoder(cfg, rngs=nnx.Rngs(0)))
  two = _count(lambda: Encoder(cfg.replace(num_layers=2), rngs=nnx.Rngs(0)))
  # 12 d^2 weights + biases (3d qkv + d out + 4d + d ffn) + two LayerNorms (4d) = 12d^2 + 13d.
  assert two - one == 12 * d * d + 13 * d


def test_memory_for_cross_attention():
  """The encoder hands back all T vectors and the mask it was given (not one derived from pad
  ids): cross-attention that takes `mask_BxT` as its key mask reads exactly what it would read
  from each row's memory without padding, whatever the padded slots hold."""
  enc = Encoder(tiny(), rngs=nnx.Rngs(0))
  lengths = [3, 5]
  x = jnp.asarray(np.random.default_rng(0).integers(5, 97, (2, 7)))  # no pad id anywhere
  m = jnp.arange(7)[None, :] < jnp.array(lengths)[:, None]
  mem = nnx.jit(lambda e, x, m: e(x, m))(enc, x, m)
  assert mem.hidden_BxTxD.shape == (2, 7, 32)
  np.testing.assert_array_equal(mem.mask_BxT, m)
  q_1xQxNxH = jax.random.normal(jax.random.key(0), (1, 3, 4, 8))
  heads = lambda h_BxTxD: h_BxTxD.reshape(h_BxTxD.shape[:2] + (4, 8))
  for b, n in enumerate(lengths):
    kv = heads(mem.hidden_BxTxD[b:b + 1])
    got = jax.nn.dot_product_attention(q_1xQxNxH, kv, kv,
                                       mask=mem.mask_BxT[b:b + 1, None, None, :])
    alone = heads(run(enc, x[b:b + 1, :n], m[b:b + 1, :n]))
    want = jax.nn.dot_product_attention(q_1xQxNxH, alone, alone)
    np.testing.assert_allclose(got, want, atol=TOL)


def test_packed_rows_equal_separate_sequences(encoder):
  a, b = [5, 6, 7, 8], [9, 10, 11]
  xa, ma = ids([a], 4)
  xb, mb = ids([b], 3)
  packed, pm = ids([a + b], 10)
  seg = jnp.array([[1, 1, 1, 1, 2, 2, 2, 0, 0, 0]])
  tt = jnp.array([[0, 0, 1, 1, 0, 1, 1, 0, 0, 0]])
  hp = run(encoder, packed, pm, tt, seg)
  ha = run(encoder, xa, ma, tt[:, :4])
  hb = run(encoder, xb, mb, tt[:, 4:7])
  np.testing.assert_allclose(hp[:, :4], ha, atol=TOL)
  np.testing.assert_allclose(hp[:, 4:7], hb, atol=TOL)


def test_attention_mask_shape_and_segments():
  m = make_attention_mask(jnp.array([[1, 1, 1, 0]]), jnp.array([[1, 1, 2, 0]]))
  assert m.shape == (1, 1, 4, 4)
  np.testing.assert_array_equal(m[0, 0], [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0],
                                          [0, 0, 0, 0]])


def test_scan_equals_unrolled():
  from encoder_jax.hf.bert import hf_tensors_to_params, params_to_hf_tensors
  from encoder_jax.hf.bert import _assign, _pure_params
  cfg = tiny(num_layers=3)
  scanned = BertModel(cfg, rngs=nnx.Rngs(0))
  unrolled = BertModel(cfg.replace(scan_layers=False), rngs=nnx.Rngs(1))
  tensors = params_to_hf_tensors(_pure_params(scanned), cfg, pretraining=False)
  _assign(unrolled, hf_tensors_to_params(tensors, cfg.replace(scan_layers=False),
                                         pretraining=False))
  x, m = ids([[5, 6, 7, 8, 9], [10, 11]], 6)
  fwd = nnx.jit(lambda model, x, m: model(x, m))
  hs, ps = fwd(scanned, x, m)
  hu, pu = fwd(unrolled, x, m)
  np.testing.assert_allclose(hs.hidden_BxTxD, hu.hidden_BxTxD, atol=TOL)
  np.testing.assert_allclose(ps, pu, atol=TOL)


@pytest.mark.parametrize("scan", [True, False])
def test_jitted_forward_traces_once(scan):
  enc = Encoder(tiny(scan_layers=scan, remat_policy="dots"), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(enc)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def forward(state, x, m):
    return nnx.merge(graphdef, state)(x, m).hidden_BxTxD

  x, m = ids([[5, 6, 7, 8, 9], [10, 11]], 6)
  for k in range(3):
    forward(state, x + k, m)
  chex.clear_trace_counter()


def test_remat_policies_give_same_gradients():
  x, m = ids([[5, 6, 7, 8, 9], [10, 11]], 6)
  r = jax.random.normal(jax.random.key(0), (2, 6, 32))  # a loss that LayerNorm cannot cancel

  def grad_of(policy):
    enc = Encoder(tiny(remat_policy=policy), rngs=nnx.Rngs(0))
    return nnx.jit(nnx.grad(lambda e: jnp.sum(e(x, m).hidden_BxTxD * r)))(enc)
  base = grad_of("none")
  for policy in ("full", "dots"):
    chex.assert_trees_all_close(base, grad_of(policy), rtol=1e-4, atol=1e-5)


def test_explicit_and_fused_attention_agree():
  """The explicit softmax path (used when attention dropout is active) equals the fused
  jax.nn.dot_product_attention path when its dropout rate is 0."""
  from encoder_jax.model.attention import MultiHeadAttention
  cfg = tiny(attention_dropout=0.0)
  mha = MultiHeadAttention(cfg, rngs=nnx.Rngs(3))
  h = jax.random.normal(jax.random.key(0), (2, 6, 32))
  _, m = ids([[5, 6, 7, 8, 9], [10, 11]], 6)
  mask = make_attention_mask(m)
  fused = mha(h, mask)
  q, k, v = (jnp.einsum("btd,dnh->btnh", h, mha.qkv_kernel[...][:, i])
             + mha.qkv_bias[...][i][None, None] for i in range(3))
  explicit = mha._explicit_attention(q, k, v, mask, jax.random.key(0))
  explicit = (jnp.einsum("btnh,nhd->btd", explicit, mha.out_kernel[...])
              + mha.out_bias[...][None, None])
  valid = np.asarray(m)
  np.testing.assert_allclose(fused[valid], explicit[valid], atol=TOL)


@pytest.mark.parametrize("bad,match", [
    (dict(input_ids_BxT=np.array([[5, 97]])), r"input_ids .*\[0, 97\)"),
    (dict(input_ids_BxT=np.array([[5, -1]])), r"input_ids"),
    (dict(input_ids_BxT=np.ones((1, 25), np.int32)), r"max_positions=24"),
    (dict(input_ids_BxT=np.ones((1, 4), np.int32), mask_BxT=np.ones((1, 5))), r"mask has shape"),
    (dict(input_ids_BxT=np.ones((1, 4), np.int32), token_types_BxT=np.ones((2, 4), np.int32)),
     r"token_types has shape"),
    (dict(input_ids_BxT=np.ones((1, 4), np.int32), token_types_BxT=np.full((1, 4), 2)),
     r"token_types .*type_vocab_size=2"),
    (dict(input_ids_BxT=np.ones((4,), np.int32)), r"\[batch, length\]"),
    (dict(input_ids_BxT=np.ones((1, 4), np.float32)), r"integers"),
])
def test_bad_input_raises_value_error_naming_argument(bad, match):
  enc = Encoder(tiny(), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=match):
    enc(**bad)


def test_config_validation():
  with pytest.raises(ValueError, match="num_heads"):
    ModelConfig(hidden_size=30, num_heads=4)
  with pytest.raises(ValueError, match="activation"):
    ModelConfig(activation="swish")
  with pytest.raises(ValueError, match="Unknown model config keys"):
    ModelConfig.from_dict({"hidden": 3})
  with pytest.raises(ValueError, match="Unknown model size"):
    model_config_for_size("gigantic")
  assert model_config_for_size("electra-small").embed_size == 128


def test_nsp_off_has_no_nsp_parameters():
  m = BertForPreTraining(tiny(), nsp=False, rngs=nnx.Rngs(0))
  paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))]
  assert not any("nsp" in p or "pooler" in p for p in paths)


def test_sparse_mlm_equals_dense_at_gathered_positions():
  m = BertForPreTraining(tiny(), rngs=nnx.Rngs(0))
  x, msk = ids([[5, 6, 7, 8, 9], [10, 11, 12]], 6)
  pos = jnp.array([[1, 3], [0, 2]])
  sparse, _, _ = m(x, msk, mlm_positions_BxP=pos)
  dense, _, _ = m(x, msk)
  np.testing.assert_allclose(sparse, jnp.take_along_axis(dense, pos[..., None], axis=1),
                             atol=TOL)


def test_task_heads_exclude_pads():
  cfg = tiny()
  h = jax.random.normal(jax.random.key(0), (2, 5, 32))
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  start, end = SpanQaHead(cfg, rngs=nnx.Rngs(0))(h, mask)
  assert start.shape == (2, 5) and float(start[0, 3]) < -1e8 and float(end[0, 4]) < -1e8
  assert bool(jnp.all(jnp.argmax(start, -1) < jnp.array([3, 5])))
  tags = TaggerHead(cfg, num_tags=7, rngs=nnx.Rngs(0))(h)
  assert tags.shape == (2, 5, 7) and tags.dtype == jnp.float32


def test_bf16_compute_keeps_fp32_params():
  """bf16 compute: fp32 parameters (the same ones as an fp32 model from the same seed),
  outputs within bf16 rounding of the fp32 model's, but really computed in bf16."""
  m = BertForPreTraining(tiny(dtype="bfloat16"), rngs=nnx.Rngs(0))
  ref = BertForPreTraining(tiny(), rngs=nnx.Rngs(0))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
  x, msk = ids([[5, 6, 7, 8], [9, 10]], 4)
  fwd = nnx.jit(lambda model, x, msk: model(x, msk))
  (logits, nsp, out), (logits32, nsp32, out32) = fwd(m, x, msk), fwd(ref, x, msk)
  assert out.hidden_BxTxD.dtype == jnp.bfloat16
  assert logits.dtype == jnp.float32 and nsp.dtype == jnp.float32
  valid = np.asarray(msk)
  err = np.abs(np.asarray(out.hidden_BxTxD, np.float32) - np.asarray(out32.hidden_BxTxD))[valid]
  # Post-LN outputs are O(1); bf16 keeps 8 bits of mantissa (relative step 2^-8 = 0.004).
  assert 1e-3 < err.max() < 0.1, err.max()
  np.testing.assert_allclose(logits[valid], logits32[valid], atol=0.1)
  np.testing.assert_allclose(nsp, nsp32, atol=0.05)


def test_logical_axis_names_on_every_parameter():
  m = BertForPreTraining(tiny(), rngs=nnx.Rngs(0))
  for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
    names = var.get_metadata().get("out_sharding")
    assert names is not None and len(names) == var[...].ndim, path
  stacked = nnx.state(m, nnx.Param)["bert"]["encoder"]["blocks"]["attn"]["qkv_kernel"]
  assert stacked.get_metadata()["out_sharding"] == ("layers", "embed", None, "heads", "kv")
