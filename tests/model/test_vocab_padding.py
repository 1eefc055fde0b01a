"""A token table padded to a multiple of rows (ModelConfig.vocab_pad_multiple) changes nothing
a user can see: the padded ids are never predicted or sampled, the loss, accuracy and the
gradients of the real rows are the unpadded model's, the padded rows stay zero under AdamW,
and unpad_vocab / pad_vocab convert between the two parameter trees exactly."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from encoder_jax.model import ModelConfig
from encoder_jax.model.heads import NEG_INF
from encoder_jax.model.vocab_padding import pad_vocab, unpad_vocab
from encoder_jax.objectives import electra as electra_obj
from encoder_jax.objectives import pretraining
from encoder_jax.objectives.pretraining import ObjectiveConfig

V, MULT = 45, 16  # 45 ids -> a table of 48 rows
CFG = ModelConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=2, ffn_size=64,
                  max_positions=16, hidden_dropout=0.0, attention_dropout=0.0)
PADDED = CFG.replace(vocab_pad_multiple=MULT)


def _obj(objective="mlm"):
  return ObjectiveConfig(objective=objective, vocab_size=V, mask_id=4,
                         special_ids=(0, 1, 2, 3, 4), max_predictions=5, gen_hidden_frac=0.5)


def _batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, V, (4, 12)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  return {"input_ids": jnp.asarray(ids), "mask": jnp.ones_like(ids, dtype=bool),
          "token_types": jnp.zeros_like(ids)}


def _params(cfg, objective="mlm"):
  return nnx.state(pretraining.build_model(cfg, _obj(objective), rngs=nnx.Rngs(0)), nnx.Param)


def _loss(cfg, params, objective="mlm"):
  graphdef, _ = nnx.split(pretraining.build_model(cfg, _obj(objective), rngs=nnx.Rngs(0)),
                          nnx.Param)
  def f(p):
    return pretraining.loss_and_metrics(nnx.merge(graphdef, p), _batch(), jax.random.key(1),
                                        _obj(objective), train=False)
  return jax.jit(jax.value_and_grad(f, has_aux=True))(params)


def test_padded_table_starts_as_the_unpadded_one_plus_zero_rows():
  assert PADDED.padded_vocab_size == 48 and CFG.padded_vocab_size == V
  small, big = nnx.to_pure_dict(_params(CFG)), nnx.to_pure_dict(_params(PADDED))
  table = big["bert"]["encoder"]["embeddings"]["token"]["embedding"]
  assert table.shape == (48, 32) and big["mlm"]["bias"].shape == (48,)
  np.testing.assert_array_equal(table[:V], small["bert"]["encoder"]["embeddings"]["token"][
      "embedding"])
  assert not np.any(np.asarray(table[V:]))
  # unpad_vocab gives exactly the unpadded tree; pad_vocab gives back the padded one.
  jax.tree.map(np.testing.assert_array_equal, unpad_vocab(big, V), small)
  jax.tree.map(np.testing.assert_array_equal, pad_vocab(small, 48), big)
  # The head's transform bias (768 wide in BERT) is not on the vocabulary axis.
  assert unpad_vocab(big, V)["mlm"]["transform"]["bias"].shape == (32,)


def test_loss_accuracy_and_real_gradients_are_the_unpadded_models():
  for objective in ("mlm", "electra"):
    small = _params(CFG, objective)
    big = _params(PADDED, objective)
    (loss_s, m_s), g_s = _loss(CFG, small, objective)
    (loss_b, m_b), g_b = _loss(PADDED, big, objective)
    np.testing.assert_allclose(loss_b, loss_s, rtol=1e-6)
    for k in m_s:
      np.testing.assert_allclose(m_b[k], m_s[k], rtol=1e-6, atol=1e-7, err_msg=k)
    g_b_pure, g_s_pure = nnx.to_pure_dict(g_b), nnx.to_pure_dict(g_s)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8),
                 unpad_vocab(g_b_pure, V), g_s_pure)
    # The padded rows get no gradient from the lookup or the tied decoder, nor the bias.
    emb = (g_b_pure["bert"]["encoder"] if objective == "mlm" else g_b_pure["discriminator"])[
        "embeddings"]["token"]["embedding"]
    assert not np.any(np.asarray(emb[V:]))
    heads = ("mlm",) if objective == "mlm" else ("gen_mlm",)
    for h in heads:
      assert not np.any(np.asarray(g_b_pure[h]["bias"][V:]))


def test_padded_ids_are_never_predicted_nor_sampled():
  """Even with the padded rows and biases set far above every real one, the masked logits
  keep the padded ids out of the argmax and out of the generator's samples."""
  model = pretraining.build_model(PADDED, _obj(), rngs=nnx.Rngs(0))
  model.mlm.bias[...] = model.mlm.bias[...].at[V:].set(1e4)
  table = model.bert.encoder.embeddings.token.embedding
  table[...] = table[...].at[V:].set(3.0)
  batch = _batch()
  logits, _, _ = model(batch["input_ids"], batch["mask"], batch["token_types"],
                       mlm_positions_BxP=jnp.asarray([[1, 2, 3, 4, 5]] * 4))
  assert logits.shape[-1] == 48
  np.testing.assert_array_equal(np.asarray(logits[..., V:]), NEG_INF)
  assert int(jnp.argmax(logits, -1).max()) < V
  samples = electra_obj.sample_tokens(jax.random.key(3), jnp.broadcast_to(logits, (64,) +
                                                                             logits.shape))
  assert int(samples.max()) < V


def test_adamw_keeps_the_padded_rows_at_zero():
  params = _params(PADDED)
  tx = optax.adamw(1e-2, weight_decay=0.01)
  opt = tx.init(params)
  for _ in range(3):
    _, grads = _loss(PADDED, params)
    updates, opt = tx.update(grads, opt, params)
    params = optax.apply_updates(params, updates)
  pure = nnx.to_pure_dict(params)
  assert not np.any(np.asarray(pure["bert"]["encoder"]["embeddings"]["token"]["embedding"][V:]))
  assert not np.any(np.asarray(pure["mlm"]["bias"][V:]))
  assert np.any(np.asarray(pure["mlm"]["bias"][:V]))  # (the real ones did train)
