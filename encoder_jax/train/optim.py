"""Optimizers from a small config: AdamW / LAMB, warm-up + decay, clipping, accumulation, LLRD.

The chain, in order (`build_optimizer`):
  clip_by_global_norm(clip_grad_norm)        BERT and ELECTRA clip at 1.0
  adamw | lamb                                weight decay masked off LayerNorm params and biases
  scale_by_layer_decay (fine-tuning only)    lr * layer_decay ** (L + 1 - depth)
  all wrapped in optax.MultiSteps when accumulation_steps > 1

Config fields (`OptimConfig`, built from the `config.optim` ConfigDict by `from_dict`):
  optimizer       "adamw" | "lamb"
  learning_rate   peak learning rate (BERT-base 1e-4, ELECTRA-small 5e-4)
  b1, b2, eps     Adam moments; BERT's 0.9 / 0.999 / 1e-6
  weight_decay    decoupled decay, 0.01 as BERT/ELECTRA; never on LayerNorm params or biases
  schedule        "linear" (warm-up then linear to end_lr_frac * peak at total_steps), "cosine"
                  (warm-up then cosine), "constant" (warm-up then flat), "wsd" (warm-up, stable
                  at the peak, then a decay over the last decay_frac of total_steps: the
                  trapezoidal / warm-up-stable-decay schedule; Xing et al. 2018, Hu et al. 2024)
  decay_frac      "wsd": the share of total_steps spent decaying, at the end (ModernBERT: its last
                  50B of ~2T tokens)
  decay_shape     "wsd": "linear" (the trapezoid) or "1-sqrt" (lr = end + (peak - end) *
                  (1 - sqrt(s / decay_steps)) at s steps into the decay; Hägele et al. 2024,
                  ModernBERT's)
  warmup_steps    linear warm-up from 0 (BERT 10k; 0 is allowed, e.g. pre-LN)
  total_steps     where the decay reaches its end value, counted in optimizer updates
  end_lr_frac     final learning rate as a fraction of the peak (BERT 0)
  clip_grad_norm  global-norm clipping threshold; 0 disables
  accumulation_steps  micro-batches per update (optax.MultiSteps, see below)
  layer_decay     layer-wise learning-rate decay for fine-tuning; 1.0 disables
  mu_dtype        dtype of Adam's first moment (e.g. "bfloat16" to save memory); None = params'

Choices and why:
  * Linear schedule is HF/optax style: the peak at the end of warm-up, then linear to the end
    value at total_steps. BERT's TF code decays from step 0 (lr * (1 - step/total)) and lets
    the warm-up override it, so right after warm-up its lr is (1 - warmup/total) of the peak:
    1% lower for 10k of 1M steps. optax's AdamW also bias-corrects the moments; BERT's
    AdamWeightDecayOptimizer does not (it matters only for the first few thousand steps).
  * Weight-decay mask by parameter path (`decay_mask`), so it works for nnx.State, plain dicts
    and scanned (stacked) blocks alike, where "ndim <= 1" rules would decay a stacked bias [L, d].
  * Gradient accumulation with optax.MultiSteps' state, not a scan inside the step: the step
    stays one code path for k = 1 and k > 1, the partial sum lives in the optimizer state so a
    checkpoint taken mid-accumulation resumes exactly, and the schedule counts real updates.
    The cost is one fp32 parameter-sized buffer and k dispatches per update; the trainer calls
    the step once per micro-batch and folds the micro-step into the mask key. MultiSteps
    averages micro-batch mean gradients, equal to the full-batch mean when micro-batches carry
    equal prediction counts (exact-count masking makes them nearly equal). MultiSteps' own
    update computes the inner AdamW update at every micro-step and keeps it at the k-th only
    (and the trainer would add its zero update to the parameters every micro-step): the train
    step (train/step.py) instead branches with lax.cond on `emits`, running MultiSteps' update
    and the parameter update (with ZeRO-1 their all-gather too) at the k-th micro-step only,
    and `accumulate` (exactly MultiSteps' non-emitting result) at the others.
  * LAMB trust ratios per layer: optax.lamb computes one ratio per leaf, which for a scanned
    stack [L, ...] would mix all L layers into one norm. `scale_by_trust_ratio_per_layer`
    computes it per row of stacked leaves and equals optax's otherwise (tested against optax.lamb).
  * Layer-wise LR decay (ELECTRA fine-tuning): depth 0 for embeddings (incl. their LayerNorm
    and projection), depth i + 1 for block i, depth L + 1 for everything else (heads, pooler,
    final LayerNorm); scale = layer_decay ** (L + 1 - depth), so block i gets decay^(L - i) and
    the heads the full rate. ELECTRA's repo gives the heads depth L + 2 (one more factor of
    decay on every non-head group). The block index is read from a path like
    `blocks/3/...` (unrolled) or, for scanned params `blocks/...` of shape [L, ...], from the
    leading axis: those get a per-row scale of shape [L, 1, ...].
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from encoder_jax.model.config import dataclass_from_mapping

# Path components under which a model keeps its transformer blocks (encoder_jax uses "blocks":
# `blocks/<i>/...` unrolled, `blocks/...` stacked along axis 0 when scanned).
LAYER_KEYS = ("blocks", "layers")
SCHEDULES = ("linear", "cosine", "constant", "wsd")
WSD_DECAYS = ("linear", "1-sqrt")
_NORM_RE = re.compile(r"(^|_)(ln|norm|layernorm|layer_norm)(_|\d|$)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """Optimizer hyper-parameters; see the module docstring for each field."""

  optimizer: str = "adamw"
  learning_rate: float = 1e-4
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  weight_decay: float = 0.01
  schedule: str = "linear"
  warmup_steps: int = 10_000
  total_steps: int = 1_000_000
  end_lr_frac: float = 0.0
  decay_frac: float = 0.2
  decay_shape: str = "linear"
  clip_grad_norm: float = 1.0
  accumulation_steps: int = 1
  layer_decay: float = 1.0
  mu_dtype: str | None = None

  def __post_init__(self):
    if self.optimizer not in ("adamw", "lamb"):
      raise ValueError(f"optim.optimizer={self.optimizer!r}; use 'adamw' or 'lamb'.")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"optim.schedule={self.schedule!r}; use one of {SCHEDULES}.")
    if not 0 <= self.warmup_steps <= self.total_steps:
      raise ValueError(f"optim.warmup_steps={self.warmup_steps} must be in [0, total_steps="
                       f"{self.total_steps}]; raise total_steps or shorten the warm-up.")
    if self.schedule == "wsd":
      self._check_wsd()
    if self.accumulation_steps < 1:
      raise ValueError(f"optim.accumulation_steps={self.accumulation_steps} must be >= 1.")
    if not 0 < self.layer_decay <= 1:
      raise ValueError(f"optim.layer_decay={self.layer_decay} must be in (0, 1]; 1 disables it "
                       "(ELECTRA fine-tuning uses 0.8 for base, 0.9 for large).")
    if self.learning_rate <= 0 or self.clip_grad_norm < 0 or self.weight_decay < 0:
      raise ValueError("optim.learning_rate must be > 0 and clip_grad_norm, weight_decay >= 0; "
                       f"got {self.learning_rate}, {self.clip_grad_norm}, {self.weight_decay}.")

  def _check_wsd(self) -> None:
    if self.decay_shape not in WSD_DECAYS:
      raise ValueError(f"optim.decay_shape={self.decay_shape!r}; use one of {WSD_DECAYS}.")
    if not 0 < self.decay_frac <= 1:
      raise ValueError(f"optim.decay_frac={self.decay_frac} must be in (0, 1]: the share of "
                       "total_steps the wsd schedule spends decaying (e.g. 0.2).")
    if self.warmup_steps + self.decay_steps > self.total_steps:
      raise ValueError(f"optim.warmup_steps={self.warmup_steps} and the decay's "
                       f"{self.decay_steps} steps (decay_frac={self.decay_frac} of total_steps="
                       f"{self.total_steps}) overlap; shorten the warm-up or lower decay_frac.")

  @property
  def decay_steps(self) -> int:
    """"wsd": the steps of the final decay (at least 1)."""
    return max(1, round(self.decay_frac * self.total_steps))

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "OptimConfig":
    """From a mapping or ConfigDict (`config.optim`); unknown keys are an error."""
    return dataclass_from_mapping(cls, d, "optim")


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
  """Warm-up from 0 to the peak over warmup_steps, then the configured decay to total_steps."""
  peak, end = cfg.learning_rate, cfg.learning_rate * cfg.end_lr_frac
  decay_steps = cfg.total_steps - cfg.warmup_steps
  if cfg.schedule == "linear":
    decay = optax.linear_schedule(peak, end, max(decay_steps, 1))
  elif cfg.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, max(decay_steps, 1), alpha=cfg.end_lr_frac)
  elif cfg.schedule == "wsd":
    decay = _stable_then_decay(cfg, peak, end)
  else:
    decay = optax.constant_schedule(peak)
  if cfg.warmup_steps == 0:
    return decay
  warmup = optax.linear_schedule(0.0, peak, cfg.warmup_steps)
  return optax.join_schedules([warmup, decay], [cfg.warmup_steps])


def _stable_then_decay(cfg: OptimConfig, peak: float, end: float) -> optax.Schedule:
  """wsd after its warm-up: the peak until the last `decay_steps` of total_steps, then the
  decay_shape down to `end`, reached at total_steps and kept after. (optax has no 1-sqrt
  decay, so the decay is written here; the linear one is optax's.)"""
  n = cfg.decay_steps
  stable = cfg.total_steps - cfg.warmup_steps - n
  if cfg.decay_shape == "linear":
    decay = optax.linear_schedule(peak, end, n)
  else:
    decay = lambda s: end + (peak - end) * (
        1.0 - jnp.sqrt(jnp.clip(jnp.asarray(s, jnp.float32) / n, 0.0, 1.0)))
  return optax.join_schedules([optax.constant_schedule(peak), decay], [stable])


def path_names(path: tuple[Any, ...]) -> tuple[Any, ...]:
  """A jax key path as plain names: DictKey/GetAttrKey/SequenceKey -> str or int.

  nnx.State leaves sit under a trailing `.value` attribute; it is dropped so a path reads
  like the module tree (`encoder/blocks/ln_attn/scale`).
  """
  names = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        names.append(getattr(k, attr))
        break
    else:
      names.append(str(k))
  if names and names[-1] == "value":
    names.pop()
  return tuple(names)


def is_decayed(names: tuple[Any, ...]) -> bool:
  """False for biases (any component containing 'bias') and LayerNorm parameters.

  A LayerNorm parameter is a leaf named 'scale' (Flax norms; dense layers have 'kernel') or any
  leaf under a component named like a norm ('ln', 'ln_attn', 'final_ln', 'LayerNorm', ...).
  This is BERT's `exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]` in Flax terms.
  """
  strs = [str(n) for n in names]
  if any("bias" in s.lower() for s in strs):
    return False
  if strs and strs[-1] == "scale":
    return False
  return not any(_NORM_RE.search(s) for s in strs)


def decay_mask(params: Any) -> Any:
  """Pytree of bools with `params`' structure: True where weight decay applies."""
  return jax.tree_util.tree_map_with_path(lambda p, _: is_decayed(path_names(p)), params)


FIRST_BLOCK = "first_block"  # layer 0 kept out of a scanned stack (model.first_attn_norm=False)


def _layer_position(names: tuple[Any, ...]) -> tuple[str, int | None]:
  """("stacked", None) | ("layer", i) | ("embedding", 0) | ("top", None) for one param path."""
  if FIRST_BLOCK in names:
    return "layer", 0
  for j, n in enumerate(names):
    if n in LAYER_KEYS:
      nxt = names[j + 1] if j + 1 < len(names) else None
      if isinstance(nxt, int) or (isinstance(nxt, str) and nxt.isdigit()):
        return "layer", int(nxt)
      return "stacked", None
  if any("embed" in str(n).lower() for n in names):
    return "embedding", 0
  return "top", None


def layer_decay_scales(params: Any, num_layers: int, layer_decay: float) -> Any:
  """Per-leaf learning-rate multipliers: decay ** (L + 1 - depth); stacked leaves get [L, 1...]
  (layers 1..L-1, [L - 1, 1...], where layer 0 sits apart as `first_block`)."""
  L = num_layers
  first_apart = any(FIRST_BLOCK in path_names(p)
                    for p, _ in jax.tree_util.tree_leaves_with_path(params))
  stacked_rows = range(1, L) if first_apart else range(L)

  def scale(path, leaf):
    names = path_names(path)
    where, index = _layer_position(names)
    if where == "stacked":
      if leaf.ndim == 0 or leaf.shape[0] != len(stacked_rows):
        raise ValueError(f"parameter {'/'.join(map(str, names))} sits under a layer stack but "
                         f"its leading axis is {leaf.shape[:1]}, not {len(stacked_rows)} "
                         f"(num_layers={L}{', layer 0 apart' if first_apart else ''}); pass "
                         "the model's num_layers or keep stacked blocks on axis 0.")
      rows = jnp.asarray([layer_decay ** (L - i) for i in stacked_rows], jnp.float32)
      return rows.reshape((len(stacked_rows),) + (1,) * (leaf.ndim - 1))
    if where == "layer":
      if not 0 <= index < L:
        raise ValueError(f"parameter {'/'.join(map(str, names))} is layer {index} but "
                         f"num_layers={L}; pass the model's num_layers.")
      return jnp.float32(layer_decay ** (L - index))
    if where == "embedding":
      return jnp.float32(layer_decay ** (L + 1))
    return jnp.float32(1.0)

  return jax.tree_util.tree_map_with_path(scale, params)


def scale_by_layer_decay(num_layers: int, layer_decay: float) -> optax.GradientTransformation:
  """Multiplies each update by its layer's learning-rate factor (after the optimizer's lr)."""

  def update_fn(updates, state, params=None):
    del params
    scales = layer_decay_scales(updates, num_layers, layer_decay)
    return jax.tree.map(lambda u, s: u * s.astype(u.dtype), updates, scales), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


def scale_by_trust_ratio_per_layer() -> optax.GradientTransformation:
  """optax.scale_by_trust_ratio, but per layer for stacked [L, ...] leaves.

  trust = ||param|| / ||update||, 1 where either norm is 0; norms over all axes except the
  leading layer axis for leaves under a stacked layer key.
  """

  def update_fn(updates, state, params):
    if params is None:
      raise ValueError("LAMB's trust ratio needs params; call tx.update(grads, state, params).")

    def scale(path, u, p):
      stacked = _layer_position(path_names(path))[0] == "stacked" and u.ndim > 0
      axes = tuple(range(1, u.ndim)) if stacked else None
      p_norm = jnp.sqrt(jnp.sum(jnp.square(p), axis=axes, keepdims=stacked))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u), axis=axes, keepdims=stacked))
      ratio = jnp.where((p_norm == 0) | (u_norm == 0), 1.0,
                        p_norm / jnp.where(u_norm == 0, 1.0, u_norm))
      return u * ratio.astype(u.dtype)

    return jax.tree_util.tree_map_with_path(scale, updates, params), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update_fn)


class OptimizerParts(NamedTuple):
  tx: optax.GradientTransformation
  # For logging: the learning rate in use at step call c (with accumulation over k
  # micro-batches, that of update c // k).
  schedule: optax.Schedule


def build_optimizer(cfg: OptimConfig, *, num_layers: int | None = None) -> OptimizerParts:
  """The optax chain for `cfg` (see the module docstring); num_layers is needed for LLRD."""
  schedule = learning_rate_schedule(cfg)
  mu_dtype = jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None
  parts = []
  if cfg.clip_grad_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_grad_norm))
  if cfg.optimizer == "adamw":
    parts.append(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, mu_dtype=mu_dtype,
                             weight_decay=cfg.weight_decay, mask=decay_mask))
  else:  # optax.lamb's chain with per-layer trust ratios for stacked blocks
    parts += [optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, mu_dtype=mu_dtype),
              optax.add_decayed_weights(cfg.weight_decay, mask=decay_mask),
              scale_by_trust_ratio_per_layer(),
              optax.scale_by_learning_rate(schedule)]
  if cfg.layer_decay < 1.0:
    if not num_layers:
      raise ValueError(f"optim.layer_decay={cfg.layer_decay} needs num_layers; pass "
                       "build_optimizer(cfg, num_layers=model_config.num_layers).")
    parts.append(scale_by_layer_decay(num_layers, cfg.layer_decay))
  tx = optax.chain(*parts)
  if cfg.accumulation_steps > 1:
    k = cfg.accumulation_steps
    tx = optax.MultiSteps(tx, every_k_schedule=k).gradient_transformation()
    return OptimizerParts(tx=tx, schedule=lambda call: schedule(call // k))
  return OptimizerParts(tx=tx, schedule=schedule)


def emits(opt_state: optax.MultiStepsState, k: int) -> jax.Array:
  """True when this micro-step is the k-th of its update (MultiSteps applies the update)."""
  return opt_state.mini_step == k - 1


def accumulate(grads: Any, opt_state: optax.MultiStepsState, k: int
               ) -> optax.MultiStepsState:
  """optax.MultiSteps(use_grad_mean=True)'s state after a micro-step that does not emit: the
  running mean of the gradients (Welford, as MultiSteps) and the micro-step count advanced,
  everything else unchanged (tests/train/test_optim.py checks it against MultiSteps)."""
  n = opt_state.mini_step
  acc = jax.tree.map(lambda g, a: (a + (g - a) / (n + 1)).astype(a.dtype), grads,
                     opt_state.acc_grads)
  return opt_state._replace(mini_step=optax.safe_increment(n) % k, acc_grads=acc)
