"""The pre-training objective: its config, the model it trains, and its loss.

Everything between a clean batch and the scalar the optimizer minimises lives here, composed
from the pure pieces of this package (masking, mlm, nsp, electra): `loss_and_metrics` corrupts
the batch on device with keys derived from the step's key (so a resumed run draws exactly the
same masks, dropout and generator samples), runs the model, and adds up MLM | ELECTRA (and its
Table-5 variants) + NSP/SOP. encoder_jax.train.step only takes gradients and applies updates.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from encoder_jax.model.bert import BertForPreTraining
from encoder_jax.model.config import BERT_VOCAB_SIZE, ModelConfig
from encoder_jax.model.dropout import fold_rng
from encoder_jax.model.electra import ElectraModel, generator_config
from encoder_jax.objectives import electra as electra_obj
from encoder_jax.objectives.masking import mask_tokens, static_mask_keys
from encoder_jax.objectives.mlm import mlm_loss, unigram_baseline
from encoder_jax.objectives.nsp import sentence_pair_loss

OBJECTIVES = ("mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm")
SENTENCE_TASKS = ("none", "nsp", "sop")
MASKINGS = ("dynamic", "static")
STATIC_MASK_STREAM = 0x57A71C  # folded into the seed key: static masks' own key stream


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """What the step optimises. Small and frozen: a static argument of the jitted step."""

  objective: str = "mlm"  # mlm | electra | electra_15 | replace_mlm | all_tokens_mlm
  sentence_task: str = "none"  # none | nsp | sop (needs nsp_label in the batch)
  vocab_size: int = BERT_VOCAB_SIZE
  mask_id: int = 103
  special_ids: tuple[int, ...] = (0, 100, 101, 102, 103)  # never chosen / never drawn
  mask_rate: float = 0.15
  max_predictions: int = 20
  mask_frac: float | None = None  # None: 0.8 for MLM (BERT), 0.85 for ELECTRA objectives
  random_frac: float | None = None  # None: 0.1 for MLM (BERT), 0.0 for ELECTRA objectives
  whole_word: bool = False
  gen_hidden_frac: float = 0.25
  gen_layers_frac: float = 1.0
  temperature: float = 1.0
  disc_weight: float | None = None  # None: the variant's default (50 for RTD)
  # "dynamic": a new mask every time a row is seen (RoBERTa); "static": BERT's offline masks,
  # a function of (example, epoch % dupe_factor) only (needs example_id/epoch in the batch).
  masking: str = "dynamic"
  dupe_factor: int = 10

  def __post_init__(self):
    if self.objective not in OBJECTIVES:
      raise ValueError(f"objective={self.objective!r}; choose one of {OBJECTIVES}.")
    if self.sentence_task not in SENTENCE_TASKS:
      raise ValueError(f"sentence_task={self.sentence_task!r}; choose one of {SENTENCE_TASKS}.")
    if self.masking not in MASKINGS:
      raise ValueError(f"masking={self.masking!r}; choose one of {MASKINGS}.")
    if self.dupe_factor < 1:
      raise ValueError(f"dupe_factor={self.dupe_factor} must be >= 1 (BERT used 10).")

  @property
  def is_electra(self) -> bool:
    return self.objective != "mlm"

  def generator_config(self, disc: ModelConfig) -> ModelConfig | None:
    """ELECTRA's generator for the discriminator `disc` (None for MLM): the one place it is
    derived, for the model, the FLOPs counter and the grids."""
    if not self.is_electra:
      return None
    return generator_config(disc, self.gen_hidden_frac, self.gen_layers_frac)

  @property
  def fractions(self) -> tuple[float, float]:
    default = (0.85, 0.0) if self.is_electra else (0.8, 0.1)
    return (default[0] if self.mask_frac is None else self.mask_frac,
            default[1] if self.random_frac is None else self.random_frac)


def build_model(cfg: ModelConfig, obj: ObjectiveConfig, *, rngs: nnx.Rngs):
  """The pre-training model for `obj`: BertForPreTraining (MLM) or ElectraModel."""
  if obj.vocab_size != cfg.vocab_size:
    raise ValueError(f"The objective's vocab_size={obj.vocab_size} differs from the model's "
                     f"{cfg.vocab_size}; build both from the tokenizer's vocabulary.")
  nsp = obj.sentence_task != "none"
  if not obj.is_electra:
    return BertForPreTraining(cfg, nsp=nsp, rngs=rngs)
  variant = electra_obj.get_variant(obj.objective)
  return ElectraModel(cfg, obj.generator_config(cfg), main_head=variant.main_head, nsp=nsp,
                      rngs=rngs)


def loss_and_metrics(model, batch: dict[str, jax.Array], key: jax.Array, obj: ObjectiveConfig,
                     *, train: bool, unigram_logp_V: jax.Array | None = None,
                     mask_keys_B: jax.Array | None = None
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Corrupts `batch` with `key`, runs `model`, returns (loss, metrics). Pure; jit it.

  `mask_keys_B` (one key per row) replaces the step's masking key: static masking.

  With `unigram_logp_V` the metrics also hold the unigram baseline scored on the same masked
  positions (`unigram_loss`, `unigram_accuracy`): the plateau a context-free model reaches;
  and the MLM and unigram scores at the positions whose input was [MASK] only (`*_at_mask_*`).
  With BERT's 80/10/10 a tenth of the targets stay visible in the input, and copying them is
  worth ~0.5 nats of loss and up to 10 points of accuracy without any context: the [MASK]-only
  scores measure context alone.
  """
  k_mask, k_drop, k_sample = jax.random.split(key, 3)
  drop = k_drop if train else None
  mask_BxT = batch["mask"].astype(bool)
  masked = corrupt(batch, k_mask if mask_keys_B is None else mask_keys_B, obj)
  ctx = dict(mask_BxT=mask_BxT, token_types_BxT=batch.get("token_types"),
             segment_ids_BxT=batch.get("segment_ids"), positions_BxT=batch.get("positions"))
  metrics: dict[str, jax.Array] = {}
  if not obj.is_electra:
    mlm_logits, nsp_logits, _ = model(masked.ids_BxT, mlm_positions_BxP=masked.positions_BxP,
                                      dropout_rng=drop, **ctx)
    loss, metrics = mlm_loss(mlm_logits, masked.labels_BxP, masked.weights_BxP)
    pred_logits_BxPxV, pred = mlm_logits, "mlm"
  else:
    loss, metrics, nsp_logits, pred_logits_BxPxV = _electra_loss(model, masked, ctx, obj,
                                                                 k_sample, drop)
    pred = "gen"
  if obj.sentence_task != "none":
    nsp_l, nsp_m = sentence_pair_loss(nsp_logits, batch["nsp_label"], prefix=obj.sentence_task)
    loss = loss + nsp_l
    metrics |= nsp_m
  if unigram_logp_V is not None:
    metrics |= unigram_baseline(unigram_logp_V, masked.labels_BxP, masked.weights_BxP)
    shown_BxP = jnp.take_along_axis(masked.ids_BxT, masked.positions_BxP, axis=1)
    at_mask_BxP = masked.weights_BxP * (shown_BxP == obj.mask_id)
    metrics |= unigram_baseline(unigram_logp_V, masked.labels_BxP, at_mask_BxP,
                                prefix="unigram_at_mask")
    metrics |= mlm_loss(pred_logits_BxPxV, masked.labels_BxP, at_mask_BxP,
                        prefix=f"{pred}_at_mask")[1]
  metrics["loss"] = loss
  metrics["pad_fraction"] = pad_fraction(mask_BxT)
  return loss, metrics


def pad_fraction(mask_BxT: jax.Array) -> jax.Array:
  """The share of a batch's B x T positions that are padding (False in `mask`): what packing
  saves. The trainer logs it with every train and eval row (metrics.jsonl `pad_fraction`, a
  mean over the steps of the row, each step's batch the same size)."""
  return 1.0 - jnp.mean(mask_BxT.astype(jnp.float32))


def corrupt(batch: dict[str, jax.Array], key: jax.Array, obj: ObjectiveConfig):
  """The MLM corruption of `batch` (masking.MaskedBatch): positions chosen among the real
  tokens that are not specials ([CLS], [SEP], [PAD], [MASK], [UNK] of `obj.special_ids`), so
  never a packed row's inner [CLS] / [SEP] nor a pad; with whole-word masking a word ends at a
  special, so it never spans two packed segments. `key`: one key, or one per row (static
  masking)."""
  ids_BxT, mask_BxT = batch["input_ids"], batch["mask"].astype(bool)
  specials = jnp.asarray(obj.special_ids, ids_BxT.dtype)
  maskable_BxT = mask_BxT & ~jnp.isin(ids_BxT, specials)
  mask_frac, random_frac = obj.fractions
  return mask_tokens(
      key, ids_BxT, maskable_BxT, vocab_size=obj.vocab_size, mask_id=obj.mask_id,
      rate=obj.mask_rate, max_predictions=obj.max_predictions, mask_frac=mask_frac,
      random_frac=random_frac, special_ids=obj.special_ids,
      word_starts_BxT=batch.get("word_starts") if obj.whole_word else None)


def _electra_loss(model: ElectraModel, masked, ctx, obj: ObjectiveConfig, k_sample, drop):
  variant = electra_obj.get_variant(obj.objective)
  gen_out = model.generator(masked.ids_BxT, dropout_rng=fold_rng(drop, 0), **ctx)
  gen_logits_BxPxV = model.gen_mlm(gen_out.hidden_BxTxD, model.token_embed,
                                   masked.positions_BxP)
  gen_loss, metrics = mlm_loss(gen_logits_BxPxV, masked.labels_BxP, masked.weights_BxP,
                               prefix="gen")
  sampled_BxP = electra_obj.sample_tokens(k_sample, gen_logits_BxPxV, obj.temperature)
  inputs = electra_obj.electra_inputs(masked, sampled_BxP)
  disc_out = model.discriminator(inputs.ids_BxT, dropout_rng=fold_rng(drop, 1), **ctx)
  h_BxTxD = disc_out.hidden_BxTxD
  labels_BxT, weights_BxT = electra_obj.main_targets(variant, inputs, ctx["mask_BxT"])
  if variant.main_head == "rtd":
    main_loss, m = electra_obj.rtd_loss(model.rtd(h_BxTxD), labels_BxT, weights_BxT)
  elif variant.main_head == "mlm":
    main_loss, m = mlm_loss(model.disc_mlm(h_BxTxD, model.token_embed, masked.positions_BxP),
                            masked.labels_BxP, masked.weights_BxP, prefix="main")
  else:
    main_loss, m = electra_obj.copy_mlm_loss(model.disc_mlm(h_BxTxD, model.token_embed),
                                             model.rtd(h_BxTxD), inputs.ids_BxT, labels_BxT,
                                             weights_BxT)
  metrics |= m | electra_obj.sample_metrics(inputs)
  weight = variant.main_weight if obj.disc_weight is None else obj.disc_weight
  loss = electra_obj.electra_total_loss(gen_loss, main_loss, main_weight=weight)
  nsp_logits = None
  if model.nsp is not None:
    nsp_logits = model.nsp(model.pooler(h_BxTxD))
  return loss, metrics, nsp_logits, gen_logits_BxPxV


def static_keys(obj: ObjectiveConfig, seed: int, batch) -> jax.Array | None:
  """Row keys of static masking (None when masking is dynamic): a function of the seed, the
  row's example id and its epoch % dupe_factor only, so a row is masked identically in every
  epoch that maps to the same copy, whatever its step or place in the batch."""
  if obj.masking != "static":
    return None
  if "example_id" not in batch or "epoch" not in batch:
    raise ValueError("objective.masking='static' needs example_id and epoch in every batch; "
                     "build the loader with example_ids=True.")
  base = jax.random.fold_in(jax.random.key(seed), STATIC_MASK_STREAM)
  return static_mask_keys(base, batch["example_id"], batch["epoch"],
                          dupe_factor=obj.dupe_factor)


def default_max_predictions(objective: str, mask_rate: float, max_length: int) -> int:
  """The prediction slots P of a row of `max_length` tokens: the trainer's default (used when
  config.objective.max_predictions is 0) and what bench/ and experiments/ count and time.

  MLM: ceil(rate * T), the fewest slots that never cut a row's count round(rate * n), n <= T
  (masking.py): 20 at 128 tokens, 77 at 512 (rate 0.15). ELECTRA objectives: its repo's
  int((rate + 0.005) * T) (configure_pretraining.py): 19 at 128, 79 at 512.
  """
  # BERT's release sets the cap by hand, max_predictions_per_seq (Devlin et al.'s
  # create_pretraining_data.py / run_pretraining.py flags; its README: "around max_seq_length *
  # masked_lm_prob"): 20 at 128 tokens, as here, and 80 at 512, 3 more than ceil(0.15 * 512) =
  # 77; those 3 slots are always empty padding (weight 0) whose MLM-head rows only cost time.
  if objective == "mlm":
    return max(1, math.ceil(mask_rate * max_length))
  return max(1, int((mask_rate + 0.005) * max_length))
