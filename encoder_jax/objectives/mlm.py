"""Masked-LM loss with sparse prediction, and the weighted fp32 cross-entropy it rests on.

Sparse prediction: the trainer gathers the P = max_predictions chosen positions *before* the
vocabulary projection (`encoder_jax.model.heads.gather_positions`), so the V-wide matmul runs on
B*P rows instead of
B*T (BERT at 128 tokens: 20 rows instead of 128 per sequence). The loss is averaged over the
chosen positions only: padded slots (label -100 or weight 0) contribute nothing, not even
through NaN/inf logits, because their logits are replaced by zeros before the softmax.

Losses are computed in float32 whatever the compute dtype (bf16 log-softmax over 30k classes
loses the small probabilities that carry the gradient).

Metrics come back with their weight (`*_count`) so the trainer can aggregate steps or
microbatches as sum(loss * count) / sum(count) instead of averaging means.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from encoder_jax.objectives.masking import IGNORE_LABEL


def label_weights(labels: jax.Array, weights: jax.Array | None) -> jax.Array:
  """float32 weights: the given ones (or 1) zeroed wherever the label is IGNORE_LABEL."""
  w = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
  if w.shape != labels.shape:
    raise ValueError(f"weights {w.shape} must have the labels' shape {labels.shape}.")
  return jnp.where(labels == IGNORE_LABEL, 0.0, w)


def safe_mean(total: jax.Array, count: jax.Array) -> jax.Array:
  """total / count, 0 when count == 0 (no NaN in the value or the gradient)."""
  return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


def softmax_cross_entropy(logits_NxC: jax.Array, labels_N: jax.Array,
                          weights_N: jax.Array | None = None
                          ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Weighted mean fp32 cross-entropy, accuracy and weight sum.

  Any leading shape works (`logits [..., C]`, `labels [...]`); labels equal to -100 or with
  weight 0 are ignored: they change neither the loss nor the gradient.

  Returns:
    (loss, accuracy, count): weighted means over the kept positions and their weight sum.
  """
  if logits_NxC.shape[:-1] != labels_N.shape:
    raise ValueError(f"logits {logits_NxC.shape} must be labels {labels_N.shape} + [classes].")
  w_N = label_weights(labels_N, weights_N)
  keep_Nx1 = (w_N > 0)[..., None]
  # Zeroing ignored rows first keeps NaN/inf there out of the forward and backward pass.
  logits_NxC = jnp.where(keep_Nx1, logits_NxC.astype(jnp.float32), 0.0)
  safe_labels_N = jnp.where(labels_N == IGNORE_LABEL, 0, labels_N).astype(jnp.int32)
  # -log_softmax(logits)[label] as logsumexp - the label's logit, picked with a one-hot mask
  # instead of take_along_axis (optax's way): that gather's gradient zero-fills an [N, C]
  # buffer and scatters into it, 3 of the demo step's ~65 ms on CPU (bench/README.md); the
  # mask's gradient is element-wise and fuses with the softmax's.
  label_NxC = jax.nn.one_hot(safe_labels_N, logits_NxC.shape[-1], dtype=jnp.bool_)
  label_logit_N = jnp.sum(jnp.where(label_NxC, logits_NxC, 0.0), axis=-1)
  nll_N = jax.nn.logsumexp(logits_NxC, axis=-1) - label_logit_N
  # Correct = the label's logit is the row's maximum (argmax's test, up to exact ties, which
  # count as correct here); a max is one fused reduction where XLA:CPU's argmax is a slow
  # (value, index) tuple reduction: 3 of the demo step's ~65 ms.
  correct_N = (label_logit_N >= jnp.max(logits_NxC, axis=-1)).astype(jnp.float32)
  count = w_N.sum()
  return (safe_mean((w_N * nll_N).sum(), count), safe_mean((w_N * correct_N).sum(), count),
          count)


def mlm_loss(logits_BxPxV: jax.Array, labels_BxP: jax.Array,
             weights_BxP: jax.Array | None = None, *, prefix: str = "mlm"
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """MLM loss over the chosen positions only, plus metrics named `{prefix}_loss/accuracy/count`.

  Works for the sparse head ([B, P, V] with MaskedBatch.labels_BxP / weights_BxP) and for a
  dense head ([B, T, V] with MaskedBatch.labels_BxT). The generator of ELECTRA uses
  prefix="gen" (its accuracy is the argmax accuracy; the sampled accuracy is in electra.py).
  """
  loss, accuracy, count = softmax_cross_entropy(logits_BxPxV, labels_BxP, weights_BxP)
  return loss, {f"{prefix}_loss": loss, f"{prefix}_accuracy": accuracy, f"{prefix}_count": count}


def unigram_baseline(logp_V: jax.Array, labels_BxP: jax.Array,
                     weights_BxP: jax.Array | None = None, *, prefix: str = "unigram"
                     ) -> dict[str, jax.Array]:
  """What a context-free model scores on the same targets: the cross-entropy of the labels
  under a unigram distribution `logp_V` (see encoder_jax.data.unigram) and the accuracy of
  always predicting its most frequent token. Compare with `mlm_loss`'s loss and accuracy."""
  w = label_weights(labels_BxP, weights_BxP)
  safe = jnp.where(labels_BxP == IGNORE_LABEL, 0, labels_BxP).astype(jnp.int32)
  nll = -logp_V.astype(jnp.float32)[safe]
  top = jnp.argmax(logp_V)
  count = w.sum()
  return {f"{prefix}_loss": safe_mean((w * nll).sum(), count),
          f"{prefix}_accuracy": safe_mean((w * (safe == top)).sum(), count)}
