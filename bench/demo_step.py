r"""Train-step time of the demo recipe under config variants, interleaved.

  python -m bench.demo_step        # fp32 vs bf16 matmuls (model.dot_dtype), 5 rounds x 10 steps
  python -m bench.demo_step --variant='xla:model.attention_impl=xla' \
      --variant='explicit:model.attention_impl=explicit' --rounds=3 --steps=5 --arg=runlocal

The real jitted step of encoder_jax.train.step for configs/pretrain.py:<--arg> (the demo recipe
by default), each variant with its `--config`-style overrides (LABEL:key=value[;key=value]),
on random token rows that fill all B x T slots. Steps are timed in interleaved rounds (A B,
B A, ...) after one compile each, so drift of a shared machine hits all alike; the table shows
the median ms per step and the median of the per-round time ratios to the first variant
(< 1: faster). It decided what attention_impl "auto" picks off GPU
(encoder_jax.model.attention._AUTO_OFF_GPU) and measures the bf16 matmul path on CPU
(encoder_jax.model.matmul).
"""
from __future__ import annotations

import os
import statistics
import time

from absl import app, flags


_VARIANTS = flags.DEFINE_multi_string(
    "variant", ["fp32:model.dot_dtype=", "bf16_dots:model.dot_dtype=bfloat16"],
    "LABEL:key=value[;key=value...]: config overrides of one timed variant (values parsed as "
    "the leaf's type; repeat the flag for more variants, the first is the reference).")
_ARG = flags.DEFINE_string("arg", "runlocal", "configs/pretrain.py argument.")
_VOCAB = flags.DEFINE_integer("vocab_size", 8192, "Vocabulary (the demo WordPiece's size).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per implementation per round.")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
  label, _, rest = text.partition(":")
  pairs = [kv.split("=", 1) for kv in rest.split(";") if kv]
  if not label or any(len(kv) != 2 for kv in pairs):
    raise app.UsageError(f"--variant={text!r}: use LABEL:key=value[;key=value...]")
  return label, dict(pairs)


def _set(config, key: str, value: str) -> None:
  *path, leaf = key.split(".")
  node = config
  for name in path:
    node = node[name]
  old = node[leaf]
  node[leaf] = (value.lower() in ("1", "true") if isinstance(old, bool)
                else type(old)(value) if old is not None else value)


def build(label: str, overrides: dict[str, str]):
  import jax
  import numpy as np
  from configs import pretrain
  from encoder_jax.objectives import pretraining
  from encoder_jax.train import loop, setup, step as step_lib
  from encoder_jax.train.optim import OptimConfig, build_optimizer
  config = pretrain.get_config(_ARG.value)
  for key, value in overrides.items():
    _set(config, key, value)
  cfg = setup.model_config(config, _VOCAB.value)
  o, t = config.objective, config.data.max_length
  obj = step_lib.ObjectiveConfig(
      objective=o.objective, vocab_size=_VOCAB.value, mask_id=4, special_ids=(0, 1, 2, 3, 4),
      mask_rate=o.mask_rate, max_predictions=pretraining.default_max_predictions(
          o.objective, o.mask_rate, t))
  od = config.optim.to_dict()
  od["total_steps"] = config.train.steps
  parts = build_optimizer(OptimConfig.from_dict(od), num_layers=cfg.num_layers)
  tr, init = step_lib.create(cfg, obj, parts.tx, parts.schedule, config.seed)
  rng = np.random.default_rng(0)
  b = config.data.batch_size
  batch = {"input_ids": jax.numpy.asarray(rng.integers(5, _VOCAB.value, (b, t), np.int32)),
           "mask": jax.numpy.ones((b, t), bool)}
  step = step_lib.make_train_step(tr)
  state = loop.initial_state(init)
  t0 = time.perf_counter()
  state, m = step(state, batch)
  jax.block_until_ready(m)
  print(f"{label}: compiled + first step in {time.perf_counter() - t0:.1f} s", flush=True)
  return step, state, batch, b * t


def main(argv):
  del argv
  import jax
  runs = {}
  for text in _VARIANTS.value:
    label, overrides = parse_variant(text)
    runs[label] = list(build(label, overrides))
  times = {impl: [] for impl in runs}
  order = list(runs)
  for r in range(_ROUNDS.value):
    for impl in (order if r % 2 == 0 else order[::-1]):
      step, state, batch, _ = runs[impl]
      t0 = time.perf_counter()
      for _ in range(_STEPS.value):
        state, m = step(state, batch)
      jax.block_until_ready(m)
      runs[impl][1] = state
      times[impl].append((time.perf_counter() - t0) / _STEPS.value)
  first = order[0]
  print(f"configs/pretrain.py:{_ARG.value}, {_ROUNDS.value} rounds x {_STEPS.value} steps, "
        f"load average {os.getloadavg()[0]:.1f}")
  for impl in order:
    ratio = statistics.median(a / b for a, b in zip(times[impl], times[first]))
    ms = statistics.median(times[impl]) * 1e3
    per_round = ", ".join(f"{x * 1e3:.0f}" for x in times[impl])
    print(f"  {impl:12s} {ms:8.1f} ms/step  {runs[impl][3] / ms * 1e3:9.0f} tokens/s  "
          f"time x{ratio:.2f} of {first}'s  (ms per round: {per_round})")


if __name__ == "__main__":
  app.run(main)
