"""Next-sentence (NSP) and sentence-order (SOP) prediction: one 2-class loss for both.

The two tasks differ only in how the data builder makes the negative pair (a segment from another
document for NSP, the two segments swapped for SOP), so they share this loss. Label convention
(BERT's `is_random_next`): 0 = B really follows A / correct order, 1 = random next / swapped.
With NSP off the trainer builds no NSP head and never calls this (no parameters, no loss).
"""
from __future__ import annotations

import jax

from encoder_jax.objectives.mlm import softmax_cross_entropy


def sentence_pair_loss(logits_Bx2: jax.Array, labels_B: jax.Array,
                       weights_B: jax.Array | None = None, *, prefix: str = "nsp"
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """fp32 2-class cross-entropy and accuracy over rows with weight > 0 (label -100 ignored).

  `prefix` names the metrics (`nsp_loss`, `nsp_accuracy`; use "sop" for sentence order).
  Weights let packed or filler rows that carry no pair drop out of the mean.
  """
  if logits_Bx2.ndim != 2 or logits_Bx2.shape[-1] != 2:
    raise ValueError(f"logits_Bx2 has shape {logits_Bx2.shape}; the NSP/SOP head must output "
                     "[batch, 2].")
  loss, accuracy, count = softmax_cross_entropy(logits_Bx2, labels_B, weights_B)
  return loss, {f"{prefix}_loss": loss, f"{prefix}_accuracy": accuracy, f"{prefix}_count": count}
