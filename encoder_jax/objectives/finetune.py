"""Fine-tuning's task losses, as the loss_fn that train.step.make_step differentiates."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.objectives.mlm import safe_mean, softmax_cross_entropy


def task_loss(kind: str, out: dict[str, jax.Array], batch: dict[str, jax.Array]):
  """Mean loss over real examples (weight 1); tagging ignores labels of -100 (non-first
  subtokens, specials, pads), whose logits therefore get no gradient."""
  w_B = batch["weights"]
  if kind == "classify":
    loss, acc, _ = softmax_cross_entropy(out["logits"], batch["labels"], w_B)
    return loss, {"accuracy": acc}
  if kind == "regress":
    err_B = out["logits"][:, 0] - batch["labels"].astype(jnp.float32)
    return safe_mean(jnp.sum(w_B * err_B * err_B), jnp.sum(w_B)), {}
  if kind == "tag":
    w_BxT = jnp.broadcast_to(w_B[:, None], batch["labels"].shape)
    loss, acc, _ = softmax_cross_entropy(out["logits"], batch["labels"], w_BxT)
    return loss, {"accuracy": acc}
  ls, _, _ = softmax_cross_entropy(out["start_logits"], batch["start_positions"], w_B)
  le, _, _ = softmax_cross_entropy(out["end_logits"], batch["end_positions"], w_B)
  return (ls + le) / 2, {}


def make_loss(graphdef, kind: str, *, dropout: bool):
  """loss_fn(params, step, batch, base_key) -> (loss, metrics) of a FinetuneModel's graphdef;
  dropout keys fold_in(base_key, step), a jitted argument, so every seed runs one program."""
  def loss_fn(params, step, batch, base_key):
    key = jax.random.fold_in(base_key, step)
    out = nnx.merge(graphdef, params)(batch, dropout_rng=key if dropout else None)
    return task_loss(kind, out, batch)
  return loss_fn
