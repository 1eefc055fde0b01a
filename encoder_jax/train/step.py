"""The jitted pre-training step: corruption on device, MLM | ELECTRA (+ NSP/SOP) losses, update.

One function per job, one code path: `loss_and_metrics` builds the corrupted inputs from the
clean batch with keys derived from `fold_in(seed_key, step)` (so a resumed run draws exactly the
same masks, dropout and generator samples), runs the model, and composes the losses of
encoder_jax.objectives. `make_train_step` wraps it with `jax.value_and_grad`, the optax update
and donation, under `jax.jit` with explicit shardings when given.

The train state is a pure pytree (`TrainState`), checkpointed as is by Orbax; the module
structure (`graphdef`) is static, one for train mode (dropout on) and one for eval mode.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx

from encoder_jax.model.attention import describe_attention
from encoder_jax.model.bert import BertForPreTraining
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.electra import ElectraModel, generator_config
from encoder_jax.model.heads import gather_positions
from encoder_jax.objectives import electra as electra_obj
from encoder_jax.objectives.masking import mask_tokens, static_mask_keys
from encoder_jax.objectives.mlm import mlm_loss, unigram_baseline
from encoder_jax.objectives.nsp import sentence_pair_loss

OBJECTIVES = ("mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm")
SENTENCE_TASKS = ("none", "nsp", "sop")
MASKINGS = ("dynamic", "static")
_STATIC_MASK_STREAM = 0x57A71C  # folded into the seed key: static masks' own key stream


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """What the step optimises. Small and frozen: a static argument of the jitted step."""

  objective: str = "mlm"  # mlm | electra | electra_15 | replace_mlm | all_tokens_mlm
  sentence_task: str = "none"  # none | nsp | sop (needs nsp_label in the batch)
  vocab_size: int = 30522
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
  gen = generator_config(cfg, obj.gen_hidden_frac, obj.gen_layers_frac)
  return ElectraModel(cfg, gen, main_head=variant.main_head, nsp=nsp, rngs=rngs)


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
  ids_BxT, mask_BxT = batch["input_ids"], batch["mask"].astype(bool)
  specials = jnp.asarray(obj.special_ids, ids_BxT.dtype)
  maskable_BxT = mask_BxT & ~jnp.isin(ids_BxT, specials)
  mask_frac, random_frac = obj.fractions
  masked = mask_tokens(
      k_mask if mask_keys_B is None else mask_keys_B, ids_BxT, maskable_BxT, vocab_size=obj.vocab_size, mask_id=obj.mask_id,
      rate=obj.mask_rate, max_predictions=obj.max_predictions, mask_frac=mask_frac,
      random_frac=random_frac, special_ids=obj.special_ids,
      word_starts_BxT=batch.get("word_starts") if obj.whole_word else None)
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
  return loss, metrics


def _electra_loss(model: ElectraModel, masked, ctx, obj: ObjectiveConfig, k_sample, drop):
  variant = electra_obj.get_variant(obj.objective)
  fold = (lambda i: None) if drop is None else (lambda i: jax.random.fold_in(drop, i))
  gen_out = model.generator(masked.ids_BxT, dropout_rng=fold(0), **ctx)
  gen_logits_BxPxV = model.gen_mlm(gen_out.hidden_BxTxD, model.token_embed,
                                   masked.positions_BxP)
  gen_loss, metrics = mlm_loss(gen_logits_BxPxV, masked.labels_BxP, masked.weights_BxP,
                               prefix="gen")
  sampled_BxP = electra_obj.gumbel_sample(k_sample, gen_logits_BxPxV, obj.temperature)
  inputs = electra_obj.electra_inputs(masked, sampled_BxP)
  disc_out = model.discriminator(inputs.ids_BxT, dropout_rng=fold(1), **ctx)
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


class TrainState(NamedTuple):
  """Everything that changes during training; a pytree Orbax saves and restores as is."""
  step: jax.Array  # int32 scalar: number of optimizer updates applied
  params: Any  # nnx.State of the model's nnx.Param variables
  opt_state: Any  # optax state


@dataclasses.dataclass
class Trainer:
  """The static half of training: module structure, optimizer, objective, base key."""
  graphdef_train: Any
  graphdef_eval: Any
  tx: optax.GradientTransformation
  schedule: Callable[[jax.Array], jax.Array]
  obj: ObjectiveConfig
  seed: int


def create(cfg: ModelConfig, obj: ObjectiveConfig, tx: optax.GradientTransformation,
           schedule, seed: int) -> tuple[Trainer, Callable[[], TrainState]]:
  """Returns the Trainer and a function that builds the initial TrainState.

  The init function is pure (jit it with out_shardings to initialise directly sharded; see
  encoder_jax.train.state). Parameters are initialised from `seed` only. Logs which attention
  computation the training and evaluation steps will trace, and why (model.attention_path).
  """
  logging.info("%s", describe_attention(cfg))
  abstract = nnx.eval_shape(lambda: build_model(cfg, obj, rngs=nnx.Rngs(seed)))
  abstract.eval()
  graphdef_eval, _ = nnx.split(abstract, nnx.Param)
  abstract.train()
  graphdef_train, _ = nnx.split(abstract, nnx.Param)

  def init() -> TrainState:
    model = build_model(cfg, obj, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return Trainer(graphdef_train, graphdef_eval, tx, schedule, obj, seed), init


def step_key(seed: int, step: jax.Array) -> jax.Array:
  return jax.random.fold_in(jax.random.key(seed), step)


def static_keys(tr: Trainer, batch) -> jax.Array | None:
  """Row keys of static masking (None when masking is dynamic): a function of the seed, the
  row's example id and its epoch % dupe_factor only, so a row is masked identically in every
  epoch that maps to the same copy, whatever its step or place in the batch."""
  if tr.obj.masking != "static":
    return None
  if "example_id" not in batch or "epoch" not in batch:
    raise ValueError("objective.masking='static' needs example_id and epoch in every batch; "
                     "build the loader with example_ids=True.")
  base = jax.random.fold_in(jax.random.key(tr.seed), _STATIC_MASK_STREAM)
  return static_mask_keys(base, batch["example_id"], batch["epoch"],
                          dupe_factor=tr.obj.dupe_factor)


def train_loss(tr: Trainer, params, step: jax.Array, batch
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, metrics) of `params` on `batch` at `step` in train mode (dropout on): exactly what
  the train step differentiates."""
  model = nnx.merge(tr.graphdef_train, params)
  return loss_and_metrics(model, batch, step_key(tr.seed, step), tr.obj, train=True,
                          mask_keys_B=static_keys(tr, batch))


def make_train_step(tr: Trainer, state_shardings=None, batch_shardings=None):
  """jit(state, batch) -> (state, metrics), donating the old state."""
  def train_step(state: TrainState, batch):
    loss_fn = lambda params: train_loss(tr, params, state.step, batch)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tr.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(tr.schedule(state.step), jnp.float32)
    return TrainState(state.step + 1, params, opt_state), metrics

  kw = {}
  if state_shardings is not None:
    kw = dict(in_shardings=(state_shardings, batch_shardings),
              out_shardings=(state_shardings, None))
  return jax.jit(train_step, donate_argnums=(0,), **kw)


def make_eval_step(tr: Trainer, eval_seed: int = 1234):
  """jit(params, batch, index[, unigram_logp_V]) -> metrics in eval mode (no dropout), with
  masks drawn from a fixed key per eval batch so every evaluation scores the same corrupted
  inputs; with `unigram_logp_V`, also the unigram baseline on those same positions."""
  def eval_step(params, batch, index, unigram_logp_V=None):
    model = nnx.merge(tr.graphdef_eval, params)
    _, metrics = loss_and_metrics(model, batch, step_key(eval_seed, index), tr.obj, train=False,
                                  unigram_logp_V=unigram_logp_V)
    return metrics
  return jax.jit(eval_step)
