r"""The input pipeline vs the train step: can the loader feed the step? (issue 7, item d)

  python -m bench.pipeline_vs_step                  # mini MLM+NSP step, B32x128, all formats
  python -m bench.pipeline_vs_step --formats=segment_pair+nsp --rounds=5

Times bench/input_pipeline.py's loader (its `_time_loader`, its flags: --batch_size,
--max_length, --batches, --read_threads, --worker_count) and our mini MLM+NSP train step in
its own process (bench/systems.py), in interleaved rounds, and prints the loader's slots/s
over the step's tokens/s: the headroom (>= 5x means the loader costs the trainer little; the
loader runs on the same cores as the step, so in training its share of the CPU is the
inverse of this ratio).
"""
from __future__ import annotations

import statistics
import time

from absl import app, flags

from bench import input_pipeline as ip
from bench import systems

_SIZE = flags.DEFINE_string("size", "mini", "Model size of the step.")
_FORMATS = flags.DEFINE_list("formats", list(ip.FORMATS), "Loader formats (input_pipeline).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved rounds.")
_STEPS = flags.DEFINE_integer("steps", 2, "Train steps per round.")


def main(argv):
  del argv
  from encoder_jax.data import examples
  B, T = ip._BATCH.value, ip._MAX_LENGTH.value
  rows = {name: ip.demo_rows(examples.ExampleConfig(max_length=T, **ip.FORMATS[name]))
          for name in _FORMATS.value}
  spec = systems.StepSpec(system="ours", size=_SIZE.value, batch_size=B, seq_len=T)
  t0 = time.perf_counter()
  loader_tps = {name: [] for name in rows}
  step_tps = []
  with systems.Worker(spec, systems.load_batches(B, T, n=4)) as worker:
    print(f"step worker ready in {time.perf_counter() - t0:.0f} s")
    for r in range(_ROUNDS.value):
      step_tps.append(spec.tokens_per_step * _STEPS.value / worker.run(_STEPS.value)[0])
      for name in rows:
        loader_tps[name].append(ip._time_loader(rows[name], ip._BATCHES.value)[1])
      print(f"  round {r + 1}: step {step_tps[-1]:,.0f} tokens/s; loader " +
            ", ".join(f"{n} {v[-1]:,.0f}" for n, v in loader_tps.items()))
  step = statistics.median(step_tps)
  print(f"\nloader (batch {B} x {T}, {ip._THREADS.value} read threads, {ip._WORKERS.value} "
        f"workers) vs our {_SIZE.value} MLM+NSP train step; medians of {_ROUNDS.value} "
        "interleaved rounds")
  head = f"{'format':22s} {'loader slots/s':>14s} {'step tokens/s':>13s} {'ratio':>7s}"
  print(head)
  print("-" * len(head))
  for name, v in loader_tps.items():
    ratios = [l / s for l, s in zip(v, step_tps)]
    print(f"{name:22s} {statistics.median(v):14,.0f} {step:13,.0f} "
          f"{statistics.median(ratios):6.1f}x")


if __name__ == "__main__":
  app.run(main)
