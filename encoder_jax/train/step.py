"""The jitted train step of every trainer: `make_step` wraps a loss with `jax.value_and_grad`,
the optax update and donation, under `jax.jit` with explicit shardings when given. Pre-training's
loss (`train_loss`: encoder_jax.objectives.pretraining, corruption on device) draws its key from
`fold_in(seed_key, step)`, so a resumed run draws exactly the same masks, dropout and generator
samples; fine-tuning's is encoder_jax.objectives.finetune's.

The train state is a pure pytree (`TrainState`), checkpointed as is by Orbax; the module
structure (`graphdef`) is static, one for train mode (dropout on) and one for eval mode.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx

from encoder_jax.model.attention import describe_attention
from encoder_jax.model.matmul import describe_dots
from encoder_jax.model.config import ModelConfig
from encoder_jax.objectives import pretraining
from encoder_jax.train import optim
# The objective's config and model choice are the step's static inputs; re-exported so that
# callers building a step need one import.
from encoder_jax.objectives.pretraining import ObjectiveConfig, build_model

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
  accumulation_steps: int = 1  # micro-batches per update (tx is an optax.MultiSteps of them)


def create(cfg: ModelConfig, obj: ObjectiveConfig, tx: optax.GradientTransformation,
           schedule, seed: int, accumulation_steps: int = 1
           ) -> tuple[Trainer, Callable[[], TrainState]]:
  """Returns the Trainer and a function that builds the initial TrainState.

  The init function is pure (jit it with out_shardings to initialise directly sharded; see
  encoder_jax.train.state). Parameters are initialised from `seed` only. Logs which attention
  computation the training and evaluation steps will trace, and why (model.attention_path).
  """
  logging.info("%s", describe_attention(cfg))
  logging.info("%s", describe_dots(cfg.dot_dtype, cfg.dtype, cfg.backend))
  logging.info("layers: %s, remat %s (model.scan_layers / model.remat_policy)",
               "scanned" if cfg.scan_layers else "unrolled", cfg.remat_policy)
  abstract = nnx.eval_shape(lambda: build_model(cfg, obj, rngs=nnx.Rngs(seed)))
  abstract.eval()
  graphdef_eval, _ = nnx.split(abstract, nnx.Param)
  abstract.train()
  graphdef_train, _ = nnx.split(abstract, nnx.Param)

  def init() -> TrainState:
    model = build_model(cfg, obj, rngs=nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  return Trainer(graphdef_train, graphdef_eval, tx, schedule, obj, seed,
                 accumulation_steps), init


def step_key(seed: int, step: jax.Array) -> jax.Array:
  return jax.random.fold_in(jax.random.key(seed), step)


def static_keys(tr: Trainer, batch) -> jax.Array | None:
  """Row keys of static masking (None when masking is dynamic); pretraining.static_keys."""
  return pretraining.static_keys(tr.obj, tr.seed, batch)


def train_loss(tr: Trainer, params, step: jax.Array, batch
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, metrics) of `params` on `batch` at `step` in train mode (dropout on): exactly what
  the train step differentiates."""
  model = nnx.merge(tr.graphdef_train, params)
  return pretraining.loss_and_metrics(model, batch, step_key(tr.seed, step), tr.obj,
                                      train=True, mask_keys_B=static_keys(tr, batch))


def make_step(loss_fn: Callable, tx: optax.GradientTransformation, schedule, *,
              state_shardings=None, batch_shardings=None, extra_shardings=(),
              frozen: Callable[[Any], bool] | None = None,
              grad_metrics: Callable[[Any], dict[str, jax.Array]] | None = None,
              update_shardings=None, accumulation_steps: int = 1):
  """jit(state, batch, *extra) -> (state, metrics) of `loss_fn(params, step, batch, *extra) ->
  (loss, metrics)`, donating the old state; metrics gain the loss, "grad_norm" and the learning
  rate. Leaves whose path `frozen` marks get no gradient (XLA drops their backward pass) and
  come back unchanged (a zero update could still turn -0.0 into +0.0). With shardings, it traces
  under their abstract mesh: activations keep the batch split (model/activation_sharding.py).
  `grad_metrics(grads) -> dict` adds metrics computed from this step's gradients (before
  clipping), e.g. per-layer norms (experiments/layer_grads.py). `update_shardings` (a
  params-shaped tree, sharding.update_shardings) is where the optimizer update runs: the
  gradients (first to the parameters' own sharding, so the backward pass is unchanged) and
  parameters are constrained to it before `tx.update` (ZeRO-1: split over 'data', each device
  updating its slice of the all-reduced gradients), and the
  new parameters go back to `state_shardings` (gathered). With `accumulation_steps` k > 1
  (`tx` an optax.MultiSteps of k) only every k-th call runs the optimizer and changes the
  parameters; the others add the gradient to MultiSteps' running mean (optim.accumulate),
  through lax.cond, so neither the update nor its gather run k times."""
  mesh = next((s.mesh for s in jax.tree.leaves(state_shardings) if hasattr(s, "mesh")), None)
  param_shardings = getattr(state_shardings, "params", None)
  keep_frozen = lambda new, old: jax.tree_util.tree_map_with_path(
      lambda path, n, o: o if frozen(path) else n, new, old)

  def train_step(state: TrainState, batch, *extra):
    loss_of = lambda p: loss_fn(p if frozen is None else keep_frozen(p, jax.lax.stop_gradient(p)),
                                state.step, batch, *extra)
    with (contextlib.nullcontext() if mesh is None
          else jax.sharding.use_abstract_mesh(mesh.abstract_mesh)):
      (loss, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
    old_params = state.params
    if update_shardings is not None:
      # The gradients first where the parameters live, then split: constrained straight to
      # the split sharding, XLA propagated it into the backward pass (BERT-base's ZeRO-1 step
      # on v5e-16 all-gathered the batch's activations for the embedding's gradient and was
      # estimated at 30.5 ms a step of 16 rows a device vs 23.5 ms replicated).
      grads = jax.lax.with_sharding_constraint(grads, param_shardings)
      grads, old_params = (jax.lax.with_sharding_constraint(t, update_shardings)
                           for t in (grads, old_params))

    update = lambda g, o, old, _: apply_update(tx, g, o, old, param_shardings
                                               if update_shardings is not None else None)
    if accumulation_steps > 1:
      params, opt_state = jax.lax.cond(
          optim.emits(state.opt_state, accumulation_steps), update,
          lambda g, o, _, p: (p, optim.accumulate(g, o, accumulation_steps)),
          grads, state.opt_state, old_params, state.params)
    else:
      params, opt_state = update(grads, state.opt_state, old_params, state.params)
    if frozen is not None:
      params = keep_frozen(params, state.params)
    metrics = {"loss": loss, **metrics, "grad_norm": optax.tree.norm(grads),
               "learning_rate": jnp.asarray(schedule(state.step), jnp.float32),
               **(grad_metrics(grads) if grad_metrics is not None else {})}
    return TrainState(state.step + 1, params, opt_state), metrics

  kw = {} if mesh is None else dict(
      in_shardings=(state_shardings, batch_shardings, *extra_shardings),
      out_shardings=(state_shardings, None))
  return jax.jit(train_step, donate_argnums=(0,), **kw)


def apply_update(tx: optax.GradientTransformation, grads, opt_state, params,
                 gather_to=None) -> tuple[Any, Any]:
  """(new params, new optimizer state): `tx`'s update applied where `params` are placed,
  then constrained to `gather_to` (ZeRO-1: the gather of the split parameters). The step's
  optimizer half, also compiled alone by train/layout.py to price it."""
  updates, opt_state = tx.update(grads, opt_state, params)
  new = optax.apply_updates(params, updates)
  if gather_to is not None:
    new = jax.lax.with_sharding_constraint(new, gather_to)
  return new, opt_state


def make_train_step(tr: Trainer, state_shardings=None, batch_shardings=None,
                    update_shardings=None):
  """The pre-training step: make_step of `train_loss` (jit(state, batch) -> (state, metrics))."""
  return make_step(lambda p, step, batch: train_loss(tr, p, step, batch), tr.tx, tr.schedule,
                   state_shardings=state_shardings, batch_shardings=batch_shardings,
                   update_shardings=update_shardings,
                   accumulation_steps=tr.accumulation_steps)


def make_eval_step(tr: Trainer, eval_seed: int = 1234):
  """jit(params, batch, index[, unigram_logp_V]) -> metrics in eval mode (no dropout), with
  masks drawn from a fixed key per eval batch so every evaluation scores the same corrupted
  inputs; with `unigram_logp_V`, also the unigram baseline on those same positions."""
  def eval_step(params, batch, index, unigram_logp_V=None):
    model = nnx.merge(tr.graphdef_eval, params)
    _, metrics = pretraining.loss_and_metrics(model, batch, step_key(eval_seed, index), tr.obj,
                                              train=False, unigram_logp_V=unigram_logp_V)
    return metrics
  return jax.jit(eval_step)
