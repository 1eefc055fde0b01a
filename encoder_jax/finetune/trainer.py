"""One fine-tuning run (one seed): AdamW with layer-wise LR decay and warm-up, epochs, dev
evaluation after each epoch, best-epoch selection, test evaluation with the best parameters.
Step and loop are pre-training's (train.step.make_step, train.loop_parts) around the task loss
(encoder_jax.objectives.finetune), so the two trainers cannot drift apart. What a seed's
training reads is setup.TrainSettings, frozen once from the config (setup.build).

Freezing vs eval mode. They are independent switches:
  * `freeze_encoder` keeps every encoder parameter bit-identical: the optimizer is an
    optax.multi_transform that sends encoder leaves to optax.set_to_zero(), and the step
    (train.step.make_step's `frozen`) sees them through stop_gradient (so XLA prunes the
    encoder's backward pass) and writes them back unchanged (a zero update could still turn
    -0.0 into +0.0).
  * train/eval mode only switches dropout (graphdef_train vs graphdef_eval); training in eval
    mode (`dropout=False`) still updates every parameter.

Sharding: the same machinery as pre-training (encoder_jax.train.sharding): with a `mesh`
(config.mesh, "auto" = all devices data-parallel on TPU/GPU, one device on CPU) the train state
is placed by the parameters' logical axis names, batches are split over data x fsdp, and the
jitted step donates the old state with explicit in/out shardings, so a large model fine-tunes
FSDP/tensor-sharded instead of replicated. One process: every process of a multi-host run
would need its own block of rows (not implemented for fine-tuning).

Batches keep one shape per length bucket: rows are cut to the batch's longest row rounded up
to `length_bucket` tokens (0: always max_length), and the last partial batch is filled with
weight-0 rows, so a run compiles at most max_length / length_bucket train steps.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx

from encoder_jax.finetune import tasks as tasks_lib
from encoder_jax.finetune.backbone import FinetuneModel
from encoder_jax.finetune.setup import TrainSettings
from encoder_jax.model.heads import NEG_INF
from encoder_jax.objectives import finetune as objective
from encoder_jax.train import loop_parts, recovery
from encoder_jax.train import sharding as sharding_lib
from encoder_jax.train import step as step_lib
from encoder_jax.train.optim import OptimConfig, build_optimizer, path_names

_MODEL_KEYS = ("input_ids", "mask", "token_types")


def is_encoder_param(path) -> bool:
  return path_names(path)[:1] == ("encoder",)


def make_optimizer(config: TrainSettings, *, num_layers: int, total_steps: int):
  """AdamW (weight decay off LayerNorm/bias), linear warm-up + decay, clipping, LLRD, freeze."""
  warmup = int(round(config.warmup_frac * total_steps))
  ocfg = OptimConfig(optimizer="adamw", learning_rate=config.learning_rate, b1=0.9, b2=0.999,
                     eps=1e-6, weight_decay=config.weight_decay, schedule="linear",
                     warmup_steps=warmup, total_steps=max(total_steps, 1),
                     clip_grad_norm=config.clip_grad_norm, layer_decay=config.layer_decay)
  parts = build_optimizer(ocfg, num_layers=num_layers)
  tx = parts.tx
  if config.freeze_encoder:
    labels = lambda params: jax.tree_util.tree_map_with_path(
        lambda p, _: "frozen" if is_encoder_param(p) else "trained", params)
    tx = optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)
  return tx, parts.schedule


@dataclasses.dataclass
class Steps:
  train: Callable  # (state, batch, base_key) -> (state, metrics), donates state
  predict: Callable  # (params, batch) -> outputs, eval mode
  graphdef_eval: Any
  state_shardings: Any = None  # where `place` puts a TrainState (None: no mesh)

  def place(self, state: step_lib.TrainState) -> step_lib.TrainState:
    """The state on the mesh, as the jitted step expects it."""
    return state if self.state_shardings is None else jax.device_put(state, self.state_shardings)


def make_steps(model: FinetuneModel, tx, schedule, *, freeze: bool, dropout: bool,
               mesh=None) -> Steps:
  """The train step (train.step.make_step of the task loss) and predict step, on `mesh` if any."""
  graphdef_eval, _ = nnx.split(model, nnx.Param)
  if dropout:
    model.train()
  graphdef_train, _ = nnx.split(model, nnx.Param)
  model.eval()
  frozen = is_encoder_param if freeze else None
  loss_fn = objective.make_loss(graphdef_train, model.kind, dropout=dropout)
  predict = lambda params, batch: nnx.merge(graphdef_eval, params)(batch)
  if mesh is None:
    return Steps(step_lib.make_step(loss_fn, tx, schedule, frozen=frozen), jax.jit(predict),
                 graphdef_eval)
  params = nnx.state(model, nnx.Param)
  state_sh = sharding_lib.state_shardings(jax.eval_shape(
      lambda: step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))), mesh)
  batch_sh = sharding_lib.batch_sharding(mesh)
  train = step_lib.make_step(loss_fn, tx, schedule, state_shardings=state_sh,
                             batch_shardings=batch_sh, frozen=frozen, extra_shardings=(
                                 jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),))
  return Steps(train, jax.jit(predict, in_shardings=(state_sh.params, batch_sh)),
               graphdef_eval, state_sh)


# ----------------------------------------------------------------------------------- batching
def _bucket(mask_BxT: np.ndarray, multiple: int) -> int:
  t = mask_BxT.shape[1]
  if multiple <= 0:
    return t
  longest = int(mask_BxT.sum(axis=1).max()) if len(mask_BxT) else 1
  return min(t, max(multiple, -(-longest // multiple) * multiple))


def batches(enc: tasks_lib.Encoded, order: np.ndarray, batch_size: int,
            length_bucket: int) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
  """(row indices, batch) in `order`; partial batches padded with weight-0 copies of row 0."""
  for i in range(0, len(order), batch_size):
    idx = order[i:i + batch_size]
    n = len(idx)
    full = np.concatenate([idx, np.full(batch_size - n, idx[0])]) if n < batch_size else idx
    t = _bucket(enc.arrays["mask"][idx], length_bucket)
    batch = {k: (v[full][:, :t] if k in _MODEL_KEYS or (v.ndim == 2 and k == "labels")
                 else v[full]) for k, v in enc.arrays.items()}
    batch["weights"] = (np.arange(batch_size) < n).astype(np.float32)
    yield idx, batch


def length_grouped_order(lengths_N: np.ndarray, rng: np.random.Generator, batch_size: int,
                         pool_batches: int = 50) -> np.ndarray:
  """A shuffled order whose consecutive batches hold rows of similar length: shuffle, sort
  inside pools of `pool_batches` batches, then shuffle the batches. With length buckets this
  cuts padding (short snippets no longer wait for the longest row of a random batch) while
  every row is still seen once per epoch in a seed-dependent order."""
  order = rng.permutation(len(lengths_N))
  pool = batch_size * pool_batches
  pooled = [p[np.argsort(lengths_N[p], kind="stable")]
            for p in np.split(order, range(pool, len(order), pool))]
  order = np.concatenate(pooled) if pooled else order
  groups = np.split(order, range(batch_size, len(order), batch_size))
  # Only the last group may be partial; it stays last so that batch boundaries stay aligned.
  full, rest = (groups, []) if len(groups[-1]) == batch_size else (groups[:-1], groups[-1:])
  return np.concatenate([full[i] for i in rng.permutation(len(full))] + rest)


def predict_split(steps: Steps, params, enc: tasks_lib.Encoded, batch_size: int,
                  length_bucket: int) -> dict[str, np.ndarray]:
  """Model outputs for every row, in row order. Rows are batched by length (less padding)."""
  t_full = enc.arrays["input_ids"].shape[1]
  order = np.argsort(enc.arrays["mask"].sum(axis=1), kind="stable")
  parts: dict[str, list] = {}
  for idx, batch in batches(enc, order, batch_size, length_bucket):
    out = jax.device_get(steps.predict(params, {k: batch[k] for k in _MODEL_KEYS}))
    for k, v in out.items():
      v = np.asarray(v)[:len(idx)]
      per_token = k in ("start_logits", "end_logits") or v.ndim == 3  # [B, t(, C)]
      if per_token and v.shape[1] < t_full:  # back to [B, T(, C)]; pads are never answers
        pad = [(0, 0), (0, t_full - v.shape[1])] + [(0, 0)] * (v.ndim - 2)
        v = np.pad(v, pad, constant_values=0.0 if v.ndim == 3 else NEG_INF)
      parts.setdefault(k, []).append(v)
  out = {k: np.concatenate(v) for k, v in parts.items()}
  inverse = np.empty_like(order)
  inverse[order] = np.arange(len(order))
  return {k: v[inverse] for k, v in out.items()}


def evaluate(spec, steps: Steps, params, enc: tasks_lib.Encoded,
             config: TrainSettings) -> dict[str, float]:
  outputs = predict_split(steps, params, enc, config.eval_batch_size, config.length_bucket)
  return tasks_lib.score(spec, enc, outputs, max_answer_length=config.max_answer_length,
                         null_threshold=config.null_threshold)


# ----------------------------------------------------------------------------------- one run
def host_copy(tree):
  """numpy copies that own their memory. On CPU, device_get / np.asarray can return views of
  device buffers, which the next donated step overwrites in place."""
  return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def total_steps(spec: tasks_lib.TaskSpec, data, config: TrainSettings) -> int:
  return math.ceil(len(data[spec.train_split]) / config.batch_size) * config.epochs


# build_steps' last few results. A jax.jit object keeps its traced and compiled programs, so a
# later run that gets the same one neither retraces nor recompiles; XLA's persistent cache
# would skip only the compile. Tracing and lowering are most of a small model's cost: a
# grid's in-process dry run fine-tunes 14 points of one shape, each retraced for ~2.6 s.
_STEPS_CACHE: collections.OrderedDict = collections.OrderedDict()
_STEPS_CACHE_SIZE = 4


def build_steps(spec: tasks_lib.TaskSpec, model: FinetuneModel, data, config: TrainSettings,
                mesh=None):
  """(steps, optimizer) from the run's settings, shared by every seed of a run (one
  compilation) and by later runs in this process whose programs are the same: equal model
  structure (the graphdef holds every shape, the ModelConfig and the head), equal settings,
  step count (the schedule's) and mesh. Parameters are the steps' arguments, not part of them."""
  steps_total = total_steps(spec, data, config)
  key = (nnx.split(model, nnx.Param)[0], config, steps_total, mesh)
  if key in _STEPS_CACHE:
    _STEPS_CACHE.move_to_end(key)
    return _STEPS_CACHE[key]
  tx, schedule = make_optimizer(config, num_layers=model.cfg.num_layers, total_steps=steps_total)
  built = make_steps(model, tx, schedule, freeze=config.freeze_encoder, dropout=config.dropout,
                     mesh=mesh), tx
  _STEPS_CACHE[key] = built
  while len(_STEPS_CACHE) > _STEPS_CACHE_SIZE:
    _STEPS_CACHE.popitem(last=False)
  return built


def finetune_one_seed(spec: tasks_lib.TaskSpec, model: FinetuneModel,
                      data: dict[str, tasks_lib.Encoded], config: TrainSettings, seed: int,
                      mesh=None) -> dict[str, Any]:
  """Trains `model` on data['train'], picks the epoch with the best first dev metric, scores
  dev and test splits with those parameters. Returns the run's record (JSON-ready).
  With config.eval_dev False no dev split is scored: the last epoch is kept and the record's
  "dev" is empty (for one-epoch runs, where there is nothing to select).
  The steps come from build_steps, on `mesh` if any: another seed's, when already built."""
  train, steps_total = data[spec.train_split], total_steps(spec, data, config)
  steps, tx = build_steps(spec, model, data, config, mesh)
  params = nnx.state(model, nnx.Param)
  state = steps.place(step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)))
  base_key = jax.random.key(seed)
  select_split, metric = spec.dev_splits[0], spec.select_metric
  history, best, best_params = [], None, host_copy(params)
  t_run, step, pending = time.time(), 0, loop_parts.PendingMetrics(recovery.Window())
  for epoch in range(1, config.epochs + 1):
    rng = np.random.default_rng([seed, epoch])
    order = (length_grouped_order(train.arrays["mask"].sum(axis=1), rng, config.batch_size)
             if config.group_by_length else rng.permutation(len(train)))
    # Metrics stay on device until a log row checks every step's (as in pre-training); rates
    # count real rows and tokens, without the epoch's first step (it may compile).
    end = step + math.ceil(len(order) / config.batch_size)
    schedule = loop_parts.Schedule(config.log_every, 0, 0, end, evaluating=False)
    t0, rows, meter = time.time(), [], loop_parts.ThroughputMeter(None, 0)
    for idx, batch in batches(train, order, config.batch_size, config.length_bucket):
      state, metrics = steps.train(state, batch, base_key)
      step += 1
      pending.push(step, metrics)
      if meter.mark_t is None:
        jax.block_until_ready(metrics)
        meter.start(step)
      else:
        meter.count(examples=len(idx), tokens=int(batch["mask"][:len(idx)].sum()))
      if schedule.at(step).log:
        try:
          pending.fetch()
        except loop_parts.NonFiniteError as e:
          raise FloatingPointError(f"non-finite training {e.args[1]} {e.args[2]} at step "
                                   f"{e.args[0]} (seed {seed}); lower learning_rate or check "
                                   "the inputs.") from None
        rows.append(pending.window.take_means() | meter.lap(step))
        logging.info("seed %d epoch %d step %d/%d loss %.4f lr %.2e | %.1f examples/s, %.0f "
                     "tokens/s", seed, epoch, step, steps_total, rows[-1]["loss"],
                     rows[-1]["learning_rate"], rows[-1].get("examples_per_s", 0.0),
                     rows[-1].get("tokens_per_s", 0.0))
        meter.mark(step)
    train_s = time.time() - t0  # (the epoch's last log row waited for its last step)
    rate = meter.summary().get("examples_per_s") or 0.0
    dev = ({s: evaluate(spec, steps, state.params, data[s], config) for s in spec.dev_splits}
           if config.eval_dev else {})
    value = dev[select_split][metric] if config.eval_dev else float(epoch)  # else: the last
    record = {"epoch": epoch, "step": step, "train_seconds": round(train_s, 2),
              "train_examples_per_s": round(rate, 2),
              "train_loss_logged_mean": sum(r["loss"] for r in rows) / max(len(rows), 1),
              "dev": dev}
    history.append(record)
    logging.info("seed %d epoch %d: %s (%.0f s train, %.1f examples/s)", seed, epoch,
                 f"dev {select_split} {metric} = {value:.4f}" if config.eval_dev else
                 "no dev evaluation (eval_dev=False)", train_s, rate)
    if best is None or value > best:
      best, best_epoch = value, epoch
      best_params = host_copy(state.params)
  # On the device once: numpy leaves would be copied host -> device at every predict call.
  best_params = jax.tree.map(jnp.asarray, best_params)
  if history:
    final_dev = history[best_epoch - 1]["dev"]
  else:  # epochs=0: the loaded model as it is (e.g. a frozen-feature baseline's head at init)
    best_epoch = 0
    final_dev = ({s: evaluate(spec, steps, best_params, data[s], config)
                  for s in spec.dev_splits} if config.eval_dev else {})
  test = (evaluate(spec, steps, best_params, data[spec.test_split], config)
          if spec.test_split and spec.test_split in data else None)
  nnx.update(model, best_params)
  return {"seed": seed, "best_epoch": best_epoch,
          "select": f"{select_split}/{metric}" if config.eval_dev else "last epoch",
          "dev": final_dev, "test": test, "history": history,
          "seconds": round(time.time() - t_run, 1)}
