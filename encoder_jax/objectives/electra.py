"""ELECTRA replaced-token detection (RTD) and its Table-5 variants, as pure functions.

The model side (generator + discriminator with tied embeddings) lives with the model; these
functions are everything between the two networks and after them.
encoder_jax.objectives.pretraining composes them into one loss inside the jitted step
(`k_mask, _, k_sample = jax.random.split(key, 3)`; the heads gather the P chosen positions
themselves before their vocabulary projection):

    masked = mask_tokens(k_mask, ids_BxT, maskable_BxT, vocab_size=V, mask_id=MASK,
                         mask_frac=0.85, random_frac=0.0, max_predictions=P, special_ids=...)
    gen_h_BxTxD = model.generator(masked.ids_BxT, ...).hidden_BxTxD
    gen_logits_BxPxV = model.gen_mlm(gen_h_BxTxD, token_embed, masked.positions_BxP)
    gen_loss, metrics = mlm_loss(gen_logits_BxPxV, masked.labels_BxP, masked.weights_BxP,
                                 prefix="gen")
    sampled_BxP = sample_tokens(k_sample, gen_logits_BxPxV, temperature)
    inputs = electra_inputs(masked, sampled_BxP)
    variant = get_variant(name)            # "electra" | "electra_15" | "replace_mlm" | ...
    disc_h_BxTxD = model.discriminator(inputs.ids_BxT, ...).hidden_BxTxD
    labels_BxT, weights_BxT = main_targets(variant, inputs, attention_mask_BxT)
    if variant.main_head == "rtd":
      main_loss, m = rtd_loss(model.rtd(disc_h_BxTxD), labels_BxT, weights_BxT)
    elif variant.main_head == "mlm":       # replace_mlm: sparse, at the chosen positions
      main_loss, m = mlm_loss(model.disc_mlm(disc_h_BxTxD, token_embed, masked.positions_BxP),
                              masked.labels_BxP, masked.weights_BxP, prefix="main")
    else:                                  # all_tokens_mlm: every non-pad token, copy mechanism
      main_loss, m = copy_mlm_loss(model.disc_mlm(disc_h_BxTxD, token_embed),
                                   model.rtd(disc_h_BxTxD), inputs.ids_BxT, labels_BxT,
                                   weights_BxT)
    metrics |= m | sample_metrics(inputs)
    loss = electra_total_loss(gen_loss, main_loss, main_weight=variant.main_weight)

No gradient reaches the generator from the discriminator: the sample is an integer drawn from
stop-gradient logits, so the generator learns from its own MLM loss only (the paper's choice;
back-propagating through sampling is what makes GAN-style text training hard). With tied
embeddings the shared table still gets gradient from both losses through its two *uses*.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from encoder_jax.objectives.masking import IGNORE_LABEL, MaskedBatch
from encoder_jax.objectives.mlm import label_weights, safe_mean


@dataclasses.dataclass(frozen=True)
class Variant:
  """One row of ELECTRA's Table 5: which head the main model uses and where its loss counts.

  main_head: "rtd" (binary replaced/original per token), "mlm" (predict the original token),
    or "copy_mlm" (MLM over all tokens with a sigmoid copy gate, as the paper's All-Tokens MLM).
  loss_on: "non_pad" (every non-pad token, [CLS]/[SEP] included as in the repo's input_mask)
    or "chosen" (only the masked-out ~15%).
  main_weight: default lambda in loss = gen_mlm + lambda * main. 50 for RTD (the paper: the
    binary loss is much smaller than the generator's V-way loss); 1 for the MLM variants,
    whose main loss is already on the generator's scale (the paper does not state one).
  """

  main_head: str
  loss_on: str
  main_weight: float


VARIANTS: dict[str, Variant] = {
    "electra": Variant("rtd", "non_pad", 50.0),  # the paper's method (Table 5: 85.0 GLUE)
    "electra_15": Variant("rtd", "chosen", 50.0),  # disc loss on the masked 15% only (82.4)
    "replace_mlm": Variant("mlm", "chosen", 1.0),  # [MASK] -> generator samples, MLM (82.4)
    "all_tokens_mlm": Variant("copy_mlm", "non_pad", 1.0),  # predict every token (84.3)
}


def get_variant(name: str) -> Variant:
  if name not in VARIANTS:
    raise ValueError(f"Unknown ELECTRA variant {name!r}; choose one of {sorted(VARIANTS)}.")
  return VARIANTS[name]


class ElectraInputs(NamedTuple):
  """The discriminator's input and what it is judged against."""

  ids_BxT: jax.Array  # original ids with the generator's samples at the chosen positions
  original_BxT: jax.Array  # int32 uncorrupted ids
  replaced_BxT: jax.Array  # bool: chosen and sample != original (the RTD positive class)
  chosen_BxT: jax.Array  # bool: masked-out positions (where the generator sampled)


# Ids per block of the two-level inverse-CDF search in `sample_tokens` (a multiple of 8 and
# 16 for the vector units; 8,192 ids -> 64 blocks, 30,522 -> 239 after padding). Two levels
# make fewer passes over the generator's logits than a one-level search, and the demo ELECTRA
# step was measurably faster with them (bench/README.md, "ELECTRA's sampler in two levels").
SAMPLE_BLOCK = 128


def sample_tokens(key: jax.Array, logits_BxPxV: jax.Array, temperature: float | jax.Array = 1.0,
                  disallow_BxP: jax.Array | None = None) -> jax.Array:
  """One int32 sample per row from softmax(logits / temperature) (ELECTRA's generator sample).

  Inverse-CDF sampling: one uniform draw per row, located in the cumulative softmax
  (`inverse_cdf`). The Gumbel-max trick (argmax of logits + Gumbel noise, what
  google-research/electra does) is the same distribution but draws V random numbers per row
  (1.7M draws a step for the demo's 16 x 13 rows x 8,192 ids); with threefry on XLA:CPU that
  was most of the demo ELECTRA step's time (bench/README.md).
  The logits are stop-gradient'ed (no gradient through sampling, as ELECTRA). `disallow_BxP`
  (e.g. the original ids: the repo's `disallow_correct`) can never be sampled.
  """
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"temperature={temperature} must be > 0 (ELECTRA uses 1.0).")
  logits_BxPxV = jax.lax.stop_gradient(logits_BxPxV).astype(jnp.float32) / temperature
  if disallow_BxP is not None:
    vocab_1x1xV = jnp.arange(logits_BxPxV.shape[-1], dtype=jnp.int32)[None, None, :]
    logits_BxPxV = jnp.where(vocab_1x1xV == disallow_BxP[..., None], -jnp.inf, logits_BxPxV)
  probs_BxPxV = jax.nn.softmax(logits_BxPxV, axis=-1)
  u_BxP = jax.random.uniform(key, logits_BxPxV.shape[:-1], jnp.float32)
  return inverse_cdf(probs_BxPxV, u_BxP)


def inverse_cdf(probs_BxPxV: jax.Array, u_BxP: jax.Array, block: int = SAMPLE_BLOCK
                ) -> jax.Array:
  """The id whose CDF step holds u * total, for u in [0, 1): found in two levels.

  Hand-written because jax.random.categorical is the Gumbel-max trick (V random numbers a
  row, see sample_tokens) and a one-level search (a cumulative sum over all V ids, then a
  count of the entries <= the threshold) makes three passes over [B, P, V] that XLA:CPU runs
  slowly (the sum as a reduce-window). Here the ids are split into blocks of `block` (the last
  padded with zero probability): one pass sums each block, the search runs over the block
  totals' cumulative sum, then over the cumulative sum of the one chosen block. Each id is
  drawn with its probability up to fp32 rounding of the sums (~1e-7 absolute).
  The result is then checked (`never_impossible`): rounding can leave a zero-probability id
  (a disallowed one, a padded one, -inf logits) a CDF step of an ulp.
  """
  *lead, V = probs_BxPxV.shape
  G = -(-V // block)
  padded_BxPxV = probs_BxPxV
  if G * block != V:
    padded_BxPxV = jnp.pad(probs_BxPxV, [(0, 0)] * len(lead) + [(0, G * block - V)])
  blocks_BxPxGxS = padded_BxPxV.reshape(*lead, G, block)
  cdf_BxPxG = jnp.cumsum(blocks_BxPxGxS.sum(axis=-1), axis=-1)
  threshold_BxP = u_BxP * cdf_BxPxG[..., -1]
  # fl(u * total) < total for u < 1, so some block total exceeds the threshold; the min only
  # guards rounding between the two sums.
  g_BxP = jnp.minimum(jnp.sum(cdf_BxPxG <= threshold_BxP[..., None], axis=-1), G - 1)
  before_BxP = jnp.where(g_BxP > 0, jnp.take_along_axis(
      cdf_BxPxG, jnp.maximum(g_BxP - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
  inner_BxPxS = jnp.take_along_axis(blocks_BxPxGxS, g_BxP[..., None, None], axis=-2)[..., 0, :]
  j_BxP = jnp.sum(jnp.cumsum(inner_BxPxS, axis=-1) <= (threshold_BxP - before_BxP)[..., None],
                  axis=-1)
  return never_impossible(probs_BxPxV, g_BxP * block + jnp.minimum(j_BxP, block - 1))


def never_impossible(probs_BxPxV: jax.Array, index_BxP: jax.Array) -> jax.Array:
  """`index_BxP`, except that an id of zero probability or past the vocabulary becomes the
  row's most likely id.

  XLA:CPU computes a cumulative sum as a parallel scan, so neighbouring entries are rounded
  differently and a zero-probability id can get a CDF step of ~1 ulp (a fraction of a percent
  of the zero ids of random 8,192-wide rows; bench/README.md): such an id must never be drawn
  (a ~1e-7 chance per such id). The argmax over [B, P, V] runs under lax.cond, only for a batch
  that has such a row: computed always, it was a measurable share of the demo ELECTRA step's op
  time (bench/README.md).
  """
  V = probs_BxPxV.shape[-1]
  safe_BxP = jnp.minimum(index_BxP, V - 1)
  p_BxP = jnp.take_along_axis(probs_BxPxV, safe_BxP[..., None], axis=-1)[..., 0]
  ok_BxP = (index_BxP < V) & (p_BxP > 0)
  index_BxP = jax.lax.cond(
      jnp.all(ok_BxP), lambda: safe_BxP,
      lambda: jnp.where(ok_BxP, safe_BxP, jnp.argmax(probs_BxPxV, axis=-1)))
  return index_BxP.astype(jnp.int32)


def electra_inputs(masked: MaskedBatch, sampled_BxP: jax.Array) -> ElectraInputs:
  """Places the sampled tokens at the chosen positions of the *original* ids.

  Every chosen position gets its sample, whether the generator saw [MASK] or the kept token
  there (the repo scatters samples over all masked positions). A sample equal to the original
  is labelled "original" (0), as the paper specifies. Padded slots of positions_BxP are ignored.
  """
  if sampled_BxP.shape != masked.positions_BxP.shape:
    raise ValueError(f"sampled_BxP {sampled_BxP.shape} must match positions_BxP "
                     f"{masked.positions_BxP.shape}.")
  chosen_BxT = masked.labels_BxT != IGNORE_LABEL
  original_BxT = jnp.where(chosen_BxT, masked.labels_BxT, masked.ids_BxT).astype(jnp.int32)
  B = sampled_BxP.shape[0]
  valid_BxP = masked.weights_BxP > 0
  # Scatter-add of zeros from padded slots: they all point at position 0 and must not win.
  sampled_BxT = jnp.zeros(original_BxT.shape, jnp.int32).at[
      jnp.arange(B)[:, None], masked.positions_BxP].add(
          jnp.where(valid_BxP, sampled_BxP.astype(jnp.int32), 0))
  ids_BxT = jnp.where(chosen_BxT, sampled_BxT, original_BxT)
  return ElectraInputs(ids_BxT=ids_BxT.astype(masked.ids_BxT.dtype), original_BxT=original_BxT,
                       replaced_BxT=chosen_BxT & (ids_BxT != original_BxT), chosen_BxT=chosen_BxT)


def main_targets(variant: Variant, inputs: ElectraInputs, valid_BxT: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
  """(labels_BxT, weights_BxT) of the main (discriminator) loss for a Table-5 variant.

  valid_BxT is the attention mask (non-pad). RTD labels are int32 1 = replaced / 0 = original;
  MLM labels are the original ids, -100 where the loss does not count.
  """
  valid_BxT = valid_BxT.astype(bool)
  where_BxT = valid_BxT if variant.loss_on == "non_pad" else inputs.chosen_BxT & valid_BxT
  if variant.main_head == "rtd":
    labels_BxT = inputs.replaced_BxT.astype(jnp.int32)
  else:
    labels_BxT = jnp.where(where_BxT, inputs.original_BxT, IGNORE_LABEL)
  return labels_BxT, where_BxT.astype(jnp.float32)


def rtd_loss(logits_BxT: jax.Array, labels_BxT: jax.Array, weights_BxT: jax.Array, *,
             prefix: str = "disc") -> tuple[jax.Array, dict[str, jax.Array]]:
  """Sigmoid BCE in fp32, averaged over weight > 0, with accuracy, precision and recall.

  Precision/recall are for the "replaced" class at threshold 0.5 (logit 0), weighted like the
  loss; `{prefix}_replaced_frac` is the positive rate among the weighted tokens (how lopsided
  the task is: ~7% of non-pad tokens early in training, falling as the generator improves).
  """
  if logits_BxT.shape != labels_BxT.shape or weights_BxT.shape != labels_BxT.shape:
    raise ValueError(f"logits {logits_BxT.shape}, labels {labels_BxT.shape} and weights "
                     f"{weights_BxT.shape} must share one [batch, seq] shape; squeeze the RTD "
                     "head's last axis.")
  w_BxT = weights_BxT.astype(jnp.float32)
  logits_BxT = jnp.where(w_BxT > 0, logits_BxT.astype(jnp.float32), 0.0)
  y_BxT = labels_BxT.astype(jnp.float32)
  bce_BxT = optax.sigmoid_binary_cross_entropy(logits_BxT, y_BxT)
  count = w_BxT.sum()
  pred_BxT = (logits_BxT > 0).astype(jnp.float32)
  true_pos = (w_BxT * pred_BxT * y_BxT).sum()
  loss = safe_mean((w_BxT * bce_BxT).sum(), count)
  return loss, {
      f"{prefix}_loss": loss,
      f"{prefix}_accuracy": safe_mean((w_BxT * (pred_BxT == y_BxT)).sum(), count),
      f"{prefix}_precision": safe_mean(true_pos, (w_BxT * pred_BxT).sum()),
      f"{prefix}_recall": safe_mean(true_pos, (w_BxT * y_BxT).sum()),
      f"{prefix}_replaced_frac": safe_mean((w_BxT * y_BxT).sum(), count),
      f"{prefix}_count": count,
  }


def copy_mlm_loss(logits_BxTxV: jax.Array, copy_logits_BxT: jax.Array, input_ids_BxT: jax.Array,
                  labels_BxT: jax.Array, weights_BxT: jax.Array | None = None, *,
                  prefix: str = "main") -> tuple[jax.Array, dict[str, jax.Array]]:
  """All-Tokens MLM with the paper's copy mechanism, fp32.

  p(y) = D * [y == input] + (1 - D) * softmax(logits)[y], D = sigmoid(copy_logit): the model can
  copy an unreplaced input token cheaply and spend its softmax on the replaced ones.
  """
  if labels_BxT.shape != copy_logits_BxT.shape or labels_BxT.shape != input_ids_BxT.shape:
    raise ValueError(f"copy_logits {copy_logits_BxT.shape}, input_ids {input_ids_BxT.shape} and "
                     f"labels {labels_BxT.shape} must share one [batch, seq] shape.")
  w_BxT = label_weights(labels_BxT, weights_BxT)
  keep_BxT = w_BxT > 0
  logits_BxTxV = jnp.where(keep_BxT[..., None], logits_BxTxV.astype(jnp.float32), 0.0)
  copy_BxT = jnp.where(keep_BxT, copy_logits_BxT.astype(jnp.float32), 0.0)
  labels_BxT = jnp.where(keep_BxT, labels_BxT, 0).astype(jnp.int32)
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV, axis=-1)
  logp_label_BxT = jnp.take_along_axis(logp_BxTxV, labels_BxT[..., None], axis=-1)[..., 0]
  log_d_BxT, log_not_d_BxT = jax.nn.log_sigmoid(copy_BxT), jax.nn.log_sigmoid(-copy_BxT)
  inputs_BxT = input_ids_BxT.astype(jnp.int32)
  is_copy_BxT = inputs_BxT == labels_BxT
  logp_BxT = jnp.where(is_copy_BxT, jnp.logaddexp(log_d_BxT, log_not_d_BxT + logp_label_BxT),
                       log_not_d_BxT + logp_label_BxT)
  # Prediction of the mixture: the input token if its mixed probability beats the softmax's best.
  logp_input_BxT = jnp.take_along_axis(logp_BxTxV, inputs_BxT[..., None], axis=-1)[..., 0]
  copy_wins_BxT = (jnp.logaddexp(log_d_BxT, log_not_d_BxT + logp_input_BxT)
                   >= log_not_d_BxT + logp_BxTxV.max(axis=-1))
  pred_BxT = jnp.where(copy_wins_BxT, inputs_BxT, jnp.argmax(logp_BxTxV, axis=-1))
  count = w_BxT.sum()
  loss = safe_mean(-(w_BxT * logp_BxT).sum(), count)
  return loss, {f"{prefix}_loss": loss,
                f"{prefix}_accuracy": safe_mean((w_BxT * (pred_BxT == labels_BxT)).sum(), count),
                f"{prefix}_count": count}


def sample_metrics(inputs: ElectraInputs) -> dict[str, jax.Array]:
  """Generator sampled accuracy (sample == original at chosen positions) and replaced share."""
  chosen = inputs.chosen_BxT.sum().astype(jnp.float32)
  replaced = inputs.replaced_BxT.sum().astype(jnp.float32)
  return {"gen_sampled_accuracy": safe_mean(chosen - replaced, chosen),
          "replaced_frac_of_chosen": safe_mean(replaced, chosen)}


def electra_total_loss(gen_loss: jax.Array, main_loss: jax.Array, *,
                       main_weight: float = 50.0) -> jax.Array:
  """gen MLM + lambda * main (lambda = 50 for RTD, ELECTRA's `disc_weight`)."""
  return gen_loss + main_weight * main_loss
