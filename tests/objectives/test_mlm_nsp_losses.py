"""MLM / NSP losses: fp32, averaged over the chosen positions only."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoder_jax.objectives.masking import IGNORE_LABEL
from encoder_jax.model.heads import gather_positions
from encoder_jax.objectives.mlm import mlm_loss, softmax_cross_entropy
from encoder_jax.objectives.nsp import sentence_pair_loss


# Jitted once per signature: op-by-op dispatch compiles every small op and dominates test time.
mlm_loss_j = jax.jit(mlm_loss, static_argnames="prefix")


def random_case(seed=0, B=3, P=5, V=11):
  rng = np.random.default_rng(seed)
  logits = (3 * rng.standard_normal((B, P, V))).astype(np.float32)
  labels = rng.integers(0, V, (B, P)).astype(np.int32)
  labels[0, 3:] = labels[2, 1] = IGNORE_LABEL
  return logits, labels


def np_nll(logits, labels):
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]


def test_matches_reference_on_kept_positions():
  logits, labels = random_case()
  loss, metrics = mlm_loss_j(logits, labels)
  keep = labels != IGNORE_LABEL
  np.testing.assert_allclose(loss, np_nll(logits, labels)[keep].mean(), rtol=1e-5)
  acc = (np.argmax(logits, -1)[keep] == labels[keep]).mean()
  np.testing.assert_allclose(metrics["mlm_accuracy"], acc)
  assert metrics["mlm_count"] == keep.sum()


def test_ignored_positions_do_not_change_loss_or_gradient():
  logits, labels = random_case(1)
  weights = np.ones(labels.shape, np.float32)
  weights[1, 4] = 0.0  # weight 0 also ignores
  ignored = (labels == IGNORE_LABEL) | (weights == 0)
  loss_and_grad = jax.jit(jax.value_and_grad(lambda x: mlm_loss(x, labels, weights)[0]))
  loss, grad = loss_and_grad(logits)
  noise = 1e4 * np.random.default_rng(7).standard_normal(logits.shape).astype(np.float32)
  noisy = np.where(ignored[..., None], noise, logits)
  bad = np.where(ignored[..., None], np.nan, logits).astype(np.float32)
  bad[0, 4, 0] = np.inf
  for perturbed in (noisy, bad):
    loss2, grad2 = loss_and_grad(perturbed)
    assert loss2 == loss
    np.testing.assert_array_equal(grad2, grad)
  assert (np.asarray(grad)[ignored] == 0).all()
  assert (np.abs(np.asarray(grad)[~ignored]).sum(-1) > 0).all()


def test_weights_scale_the_mean_and_empty_is_zero():
  logits, labels = random_case(2)
  w = np.ones(labels.shape, np.float32)
  w[1] = 2.0
  keep = labels != IGNORE_LABEL
  ref = (np_nll(logits, labels) * w * keep).sum() / (w * keep).sum()
  np.testing.assert_allclose(mlm_loss_j(logits, labels, w)[0], ref, rtol=1e-5)
  none = np.full(labels.shape, IGNORE_LABEL, np.int32)
  loss, grad = jax.jit(jax.value_and_grad(lambda x: mlm_loss(x, none)[0]))(logits)
  assert loss == 0 and np.isfinite(grad).all() and (grad == 0).all()


def test_bf16_logits_give_fp32_loss():
  """bf16 logits are scored in fp32: the loss is the exact (float64) cross-entropy of the
  bf16 values to fp32 precision. A bf16 log-softmax over these logits (|x| up to ~10, steps
  of 2^-8 relative) would be off by ~1e-2."""
  logits, labels = random_case(3)
  bf16 = jnp.asarray(logits, jnp.bfloat16)
  loss, _ = mlm_loss_j(bf16, labels)
  assert loss.dtype == jnp.float32
  keep = labels != IGNORE_LABEL
  want = np_nll(np.asarray(bf16, np.float64), labels)[keep].mean()
  np.testing.assert_allclose(loss, want, rtol=1e-6)


def test_sparse_head_equals_dense_head_at_chosen_positions():
  B, T, V = 2, 7, 13
  rng = np.random.default_rng(4)
  logits_BxTxV = rng.standard_normal((B, T, V)).astype(np.float32)
  ids = rng.integers(0, V, (B, T)).astype(np.int32)
  positions = np.array([[1, 4, 0], [2, 3, 6]], np.int32)
  weights = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], np.float32)
  labels_BxP = np.where(weights > 0, np.take_along_axis(ids, positions, 1), IGNORE_LABEL)
  chosen = np.zeros((B, T), bool)
  chosen[0, [1, 4]] = chosen[1, [2, 3, 6]] = True
  labels_BxT = np.where(chosen, ids, IGNORE_LABEL)
  sparse = jax.jit(lambda x, p, l, w: mlm_loss(gather_positions(x, p), l, w)[0])(
      logits_BxTxV, positions, labels_BxP, weights)
  np.testing.assert_allclose(sparse, mlm_loss_j(logits_BxTxV, labels_BxT)[0], rtol=1e-6)
  # and both are the cross-entropy of the chosen tokens (not only equal to each other)
  np.testing.assert_allclose(sparse, np_nll(logits_BxTxV, ids)[chosen].mean(), rtol=1e-6)
  np.testing.assert_array_equal(jax.jit(gather_positions)(ids[..., None], positions)[1, :, 0],
                                ids[1, [2, 3, 6]])


def test_sentence_pair_loss():
  logits = np.array([[2.0, -1.0], [0.0, 3.0], [1.0, 0.5], [9.0, -9.0]], np.float32)
  labels = np.array([0, 1, 1, 1], np.int32)
  weights = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
  loss, m = jax.jit(sentence_pair_loss)(logits, labels, weights)
  np.testing.assert_allclose(loss, np_nll(logits[:3], labels[:3]).mean(), rtol=1e-6)
  np.testing.assert_allclose(m["nsp_accuracy"], 2 / 3)
  assert "sop_loss" in jax.eval_shape(
      lambda x, y: sentence_pair_loss(x, y, prefix="sop"), logits, labels)[1]
  with pytest.raises(ValueError, match="batch, 2"):
    sentence_pair_loss(np.zeros((4, 3)), labels)


def test_shape_errors_name_the_arguments():
  with pytest.raises(ValueError, match="labels"):
    softmax_cross_entropy(np.zeros((2, 3, 5)), np.zeros((2, 4), np.int32))
  with pytest.raises(ValueError, match="weights"):
    softmax_cross_entropy(np.zeros((2, 3, 5)), np.zeros((2, 3), np.int32), np.ones((3, 2)))
