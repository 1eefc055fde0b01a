"""ELECTRA pieces: sampling, discriminator inputs/labels, RTD loss, variants, no leaked gradient."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives import electra
from encoder_jax.objectives.masking import IGNORE_LABEL, MaskedBatch
from encoder_jax.model.heads import gather_positions
from encoder_jax.objectives.mlm import mlm_loss

MASK = 3


# Tests feed numpy and call jitted functions: op-by-op dispatch would compile every small op.
electra_inputs_j = jax.jit(electra.electra_inputs)


def hand_masked():
  """Row 0 chooses positions 1, 3 (slot 2 padded); row 1 chooses 2."""
  original = np.array([[1, 10, 11, 12, 2], [1, 20, 21, 2, 0]], np.int32)
  positions = np.array([[1, 3, 0], [2, 0, 0]], np.int32)
  weights = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
  labels_BxP = np.where(weights > 0, np.take_along_axis(original, positions, 1), IGNORE_LABEL)
  chosen = np.zeros(original.shape, bool)
  chosen[0, [1, 3]] = chosen[1, 2] = True
  return original, MaskedBatch(
      ids_BxT=np.where(chosen, MASK, original), positions_BxP=positions, labels_BxP=labels_BxP,
      weights_BxP=weights, labels_BxT=np.where(chosen, original, IGNORE_LABEL))


def test_sample_tokens_follows_softmax_and_temperature():
  logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
  logits_BxPxV = np.broadcast_to(logits, (100, 200, 4))
  sample = jax.jit(electra.sample_tokens)  # one compile: temperature and disallow are traced
  no_disallow = np.full((100, 200), -1, np.int32)
  draws = np.asarray(sample(jax.random.key(0), logits_BxPxV, 1.0, no_disallow))
  np.testing.assert_allclose(np.bincount(draws.ravel(), minlength=4) / draws.size,
                             [0.5, 0.3, 0.15, 0.05], atol=0.006)
  cold = sample(jax.random.key(1), logits_BxPxV, 0.01, no_disallow)
  assert (np.asarray(cold) == 0).all()
  never0 = sample(jax.random.key(2), logits_BxPxV, 1.0, np.zeros((100, 200), np.int32))
  assert (np.asarray(never0) != 0).all()
  # 100k draws (SE 0.0016): the renormalised probabilities within 3.7 SE
  never3 = np.asarray(sample(jax.random.key(3), np.broadcast_to(logits, (200, 500, 4)), 1.0,
                             np.full((200, 500), 3)))
  assert (never3 != 3).all()  # the last id: the search must not run past the CDF's end
  np.testing.assert_allclose(np.bincount(never3.ravel(), minlength=4)[:3] / never3.size,
                             np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.006)
  with pytest.raises(ValueError, match="temperature"):
    electra.sample_tokens(jax.random.key(0), logits_BxPxV, temperature=0.0)


def test_zero_probability_ids_are_never_returned():
  """A parallel-scan cumulative sum can give a zero-probability id a CDF step of one ulp; the
  search must then fall back to the most likely id, not draw the impossible one (nor an id of
  the padding past the vocabulary)."""
  probs = jnp.asarray([[[0.25, 0.0, 0.75]]], jnp.float32)
  guard = jax.jit(electra.never_impossible)
  for index, want in ((1, 2), (0, 0), (2, 2), (3, 2), (130, 2)):
    assert int(guard(probs, jnp.asarray([[index]], jnp.int32))[0, 0]) == want, index
  # a batch with one bad row: only that row changes
  probs2 = jnp.asarray([[[0.25, 0.0, 0.75], [0.6, 0.4, 0.0]]], jnp.float32)
  np.testing.assert_array_equal(guard(probs2, jnp.asarray([[1, 1]], jnp.int32)), [[2, 1]])


def test_two_level_search_finds_the_id_whose_cdf_step_holds_the_draw():
  """Exact thresholds on a 4-id vocabulary in blocks of 2 (id i holds [CDF(i-1), CDF(i))),
  and a vocabulary that is not a multiple of the block (padded with zero probability)."""
  probs = jnp.asarray([[[0.125, 0.125, 0.25, 0.5]]], jnp.float32)
  search = jax.jit(electra.inverse_cdf, static_argnames="block")
  for u, want in ((0.0, 0), (0.1, 0), (0.125, 1), (0.2, 1), (0.25, 2), (0.4, 2), (0.5, 3),
                  (0.999, 3)):
    for block in (1, 2, 3, 4, 128):
      got = int(search(probs, jnp.asarray([[u]], jnp.float32), block=block)[0, 0])
      assert got == want, (u, block, got)
  # the last id has no mass: a draw near 1 must not land on it or on the padding after it
  probs5 = jnp.asarray([[[0.5, 0.25, 0.125, 0.125, 0.0]]], jnp.float32)
  for u in (0.99, 0.9999999):
    assert int(search(probs5, jnp.asarray([[u]], jnp.float32), block=2)[0, 0]) == 3


def test_two_level_search_draws_each_id_with_its_probability():
  """300 ids (3 blocks of 128, the last padded), a third of them impossible, long-tailed
  probabilities, 400k draws: every drawn id is possible and the frequencies match (per-id SE
  <= 0.0008; checked at 5 SE), as does the mass of the 64-id tail."""
  rng = np.random.default_rng(0)
  p = 1.0 / np.arange(1, 301) ** 1.1
  p[rng.permutation(300)[:100]] = 0.0
  p = (p / p.sum()).astype(np.float32)
  logits = np.where(p > 0, np.log(np.maximum(p, 1e-30)), -np.inf).astype(np.float32)
  draws = np.asarray(jax.jit(electra.sample_tokens)(
      jax.random.key(0), np.broadcast_to(logits, (400, 1000, 300))))
  freq = np.bincount(draws.ravel(), minlength=300) / draws.size
  assert freq[p == 0].sum() == 0
  se = np.sqrt(p * (1 - p) / draws.size)
  assert (np.abs(freq - p) <= 5 * se + 1e-7).all(), np.abs(freq - p).max()
  tail = np.argsort(-p)[136:200]  # the 64 least likely possible ids
  assert abs(freq[tail].sum() - p[tail].sum()) < 5 * np.sqrt(p[tail].sum() / draws.size)


def test_inputs_place_samples_and_label_unchanged_samples_original():
  original, masked = hand_masked()
  # Row 0: slot 0 samples the original (10) -> "original"; slot 1 replaces 12 by 99.
  # Padded slots sample 77/88 at position 0: they must not touch [CLS].
  sampled = np.array([[10, 99, 77], [55, 88, 88]], np.int32)
  inputs = electra_inputs_j(masked, sampled)
  np.testing.assert_array_equal(inputs.ids_BxT, [[1, 10, 11, 99, 2], [1, 20, 55, 2, 0]])
  np.testing.assert_array_equal(inputs.original_BxT, original)
  np.testing.assert_array_equal(inputs.replaced_BxT, [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0]])
  np.testing.assert_array_equal(inputs.chosen_BxT, [[0, 1, 0, 1, 0], [0, 0, 1, 0, 0]])
  m = jax.jit(electra.sample_metrics)(inputs)
  np.testing.assert_allclose(m["gen_sampled_accuracy"], 1 / 3)
  np.testing.assert_allclose(m["replaced_frac_of_chosen"], 2 / 3)


def test_rtd_loss_and_metrics():
  logits = np.array([[3.0, -2.0, 1.0, -1.0], [0.5, -4.0, 2.0, 7.0]], np.float32)
  labels = np.array([[1, 0, 0, 1], [1, 0, 1, 0]], np.int32)
  weights = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]], np.float32)  # a pad at the end
  rtd_loss = jax.jit(electra.rtd_loss)
  loss, m = rtd_loss(logits, labels, weights)
  bce = np.logaddexp(0, logits) - labels * logits  # -[y log s(x) + (1-y) log(1-s(x))]
  np.testing.assert_allclose(loss, (bce * weights).sum() / 7, rtol=1e-6)
  # Predicted replaced: (0,0) (0,2) (1,0) (1,2); true replaced: (0,0) (0,3) (1,0) (1,2).
  np.testing.assert_allclose(m["disc_precision"], 3 / 4)
  np.testing.assert_allclose(m["disc_recall"], 3 / 4)
  np.testing.assert_allclose(m["disc_accuracy"], 5 / 7)
  np.testing.assert_allclose(m["disc_replaced_frac"], 4 / 7)
  # A pad's logit can be anything.
  logits[1, 3] = np.nan
  assert rtd_loss(logits, labels, weights)[0] == loss


def test_variant_targets():
  _, masked = hand_masked()
  inputs = electra_inputs_j(masked, np.array([[10, 99, 0], [55, 0, 0]], np.int32))
  valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], np.int32)
  targets = jax.jit(electra.main_targets, static_argnums=0)
  # By hand from hand_masked: chosen (0, 1), (0, 3), (1, 2) sampled 10 (= original), 99, 55.
  replaced = [[0, 0, 0, 1, 0], [0, 0, 1, 0, 0]]
  chosen = [[0, 1, 0, 1, 0], [0, 0, 1, 0, 0]]
  lab, w = targets(electra.get_variant("electra"), inputs, valid)
  np.testing.assert_array_equal(lab, replaced)  # every non-pad token is judged
  np.testing.assert_array_equal(w, valid)
  lab15, w15 = targets(electra.get_variant("electra_15"), inputs, valid)
  np.testing.assert_array_equal(lab15, replaced)  # judged at the chosen 15% only
  np.testing.assert_array_equal(w15, chosen)
  lab_r, w_r = targets(electra.get_variant("replace_mlm"), inputs, valid)
  np.testing.assert_array_equal(lab_r, [[-100, 10, -100, 12, -100], [-100, -100, 21, -100, -100]])
  np.testing.assert_array_equal(w_r, chosen)
  lab_a, w_a = targets(electra.get_variant("all_tokens_mlm"), inputs, valid)
  np.testing.assert_array_equal(lab_a, [[1, 10, 11, 12, 2], [1, 20, 21, 2, -100]])
  np.testing.assert_array_equal(w_a, valid)
  with pytest.raises(ValueError, match="electra_15"):
    electra.get_variant("electra15")
  assert electra.electra_total_loss(2.0, 0.1) == pytest.approx(7.0)


def test_copy_mlm_is_a_distribution_and_reduces_to_mlm():
  V = 6
  logits = np.random.default_rng(3).standard_normal((1, 1, V)).astype(np.float32)
  loss_fn = jax.jit(electra.copy_mlm_loss)
  one = lambda v, dtype=np.float32: np.full((1, 1), v, dtype)
  for copy_logit in (-2.0, 0.0, 1.5):
    probs = [np.exp(-loss_fn(logits, one(copy_logit), one(2, np.int32), one(y, np.int32))[0])
             for y in range(V)]
    np.testing.assert_allclose(sum(probs), 1.0, rtol=1e-5)
  plain = jax.jit(mlm_loss)(logits, one(4, np.int32))[0]
  gated_off = loss_fn(logits, one(-30.0), one(2, np.int32), one(4, np.int32))[0]
  np.testing.assert_allclose(gated_off, plain, rtol=1e-5)
  loss, m = loss_fn(logits, one(30.0), one(2, np.int32), one(2, np.int32))
  assert loss < 1e-6 and m["main_accuracy"] == 1.0


def test_generator_gets_no_gradient_from_discriminator_loss():
  """Tiny generator/discriminator sharing (tying) one embedding table E."""
  B, T, V, D = 2, 5, 32, 4
  _, masked = hand_masked()
  rng = np.random.default_rng(0)
  params = {"E": rng.standard_normal((V, D)).astype(np.float32),
            "gen_W": rng.standard_normal((D, D)).astype(np.float32),
            "disc_w": rng.standard_normal((D,)).astype(np.float32)}
  k_sample = jax.random.key(5)

  def gen_logits(p):
    h_BxTxD = jnp.tanh(p["E"][masked.ids_BxT] @ p["gen_W"])
    return gather_positions(h_BxTxD, masked.positions_BxP) @ p["E"].T

  def disc_loss(p, sampled=None):
    if sampled is None:  # sample inside the differentiated function, as the train step does
      sampled = electra.sample_tokens(k_sample, gen_logits(p))
    inputs = electra.electra_inputs(masked, sampled)
    logits_BxT = p["E"][inputs.ids_BxT] @ p["disc_w"]
    return electra.rtd_loss(logits_BxT, inputs.replaced_BxT, jnp.ones((B, T)))[0], sampled

  g, sampled = jax.jit(jax.grad(disc_loss, has_aux=True))(params)
  assert (g["gen_W"] == 0).all()
  # The shared table gets exactly the gradient of its discriminator use, nothing via the sample.
  g_const, _ = jax.jit(jax.grad(disc_loss, has_aux=True))(params, sampled)
  np.testing.assert_array_equal(g["E"], g_const["E"])
  assert np.abs(np.asarray(g["disc_w"])).sum() > 0
  # The generator does learn from its own MLM loss.
  g_gen = jax.jit(jax.grad(
      lambda p: mlm_loss(gen_logits(p), masked.labels_BxP, masked.weights_BxP)[0]))(params)
  assert np.abs(np.asarray(g_gen["gen_W"])).sum() > 0
