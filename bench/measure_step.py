r"""The pre-training step MEASURED on this host's devices (a TPU VM, a GPU host), written beside
what XLA estimates for the same compiled program, so that the first run on hardware calibrates
bench/tpu_aot.py's table (every figure there is a compiler estimate).

  # on a TPU VM (every host of the slice runs it, as the trainer; mesh=auto searches first):
  python -m bench.measure_step --config=configs/pretrain.py:size=base,nsp=nsp \
      --config.data.batch_size=8192 --config.data.data_dir=gs://BUCKET/shards ...
  # on a GPU host: the same command (mesh=auto: every GPU data-parallel)
  # dry, on this CPU (what the test suite runs; no estimate column on a CPU):
  python -m bench.measure_step --config=configs/pretrain.py:size=tiny --steps=3 --warmup=1

What it does: the trainer's own set-up (train/layout.py's choice where config.mesh is "auto"
on a TPU, setup.build, the sharded state, the compiled step of compile_check), the real
loader's batches, `--warmup` untimed steps, then `--steps` timed ones, each waited for
(block_until_ready) so a step's time is its own. It appends one row to --out (CSV):
  est_step_ms, est_tok_s_chip, est_mfu, hbm_gib   XLA's estimate and buffer assignment of the
      very program that runs (TPU; a scanned program's estimate covers one layer of L and is
      marked so; no cost-model time on GPU or CPU)
  step_ms (median), steps_s, tok_s_chip, mfu      measured (MFU by train/flops.py's count and
      peak, the project's definition), and peak_hbm_gib from the devices' memory statistics
      (peak_bytes_in_use, the largest of the local devices; none on CPU)
  est_over_measured                                est_step_ms / step_ms (1.0: a perfect model)
No hardware was available where this script was written: the suite runs it on a CPU only
(tests/bench/test_measure_step.py), and its first TPU or GPU row is the first measurement.
"""
from __future__ import annotations

import csv
import datetime
import pathlib
import statistics
import time

from absl import app, flags

# --config (a pre-training config with --config.a.b=value overrides) is compile_check's flag.
from encoder_jax.train import compile_check  # noqa: F401  pylint: disable=unused-import

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command's own flags, defined when it runs as one: `measure` is imported by tests
  beside other bench modules, whose --steps would clash."""
  flags.DEFINE_integer("steps", 20, "Timed steps (the median is reported).")
  flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first compiles and allocates).")
  flags.DEFINE_string("out", "bench/results/measure_step.csv", "CSV to append the row to.")

FIELDS = ("date", "platform", "device_kind", "devices", "model", "seq", "mesh", "optim_sharding",
          "batch", "accumulation", "program", "est_step_ms", "est_tok_s_chip", "est_mfu",
          "hbm_gib", "step_ms", "steps_s", "tok_s_chip", "mfu", "peak_hbm_gib",
          "est_over_measured")


def _peak_hbm_gib(devices) -> float | None:
  peaks = []
  for d in devices:
    try:
      stats = d.memory_stats() or {}
    except (AttributeError, NotImplementedError, RuntimeError):
      stats = {}
    if "peak_bytes_in_use" in stats:
      peaks.append(stats["peak_bytes_in_use"])
  return round(max(peaks) / 2**30, 3) if peaks else None


def measure(config, steps: int, warmup: int, say=print) -> dict:
  """One row of FIELDS for `config` on jax.devices() (module docstring)."""
  import jax

  from encoder_jax.train import compile_check as cc
  from encoder_jax.train import flops as flops_lib
  from encoder_jax.train import layout, loop, setup, sharding
  from encoder_jax.model import matmul

  layout.settle(config, None, say=say)
  setup.settle_layers(config)
  compiled, s, shardings, _, mesh, compile_s = cc.compile_train_step(config)
  a = cc.analyze(compiled)
  state = loop.initial_state(s.init_fn, shardings)
  it = iter(setup.make_loader(s.data, "train"))
  times = []
  for i in range(warmup + steps):
    batch = sharding.shard_batch(next(it), mesh)
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    if i >= warmup:
      times.append(time.perf_counter() - t0)
  devices = list(mesh.devices.flat)
  cfg = s.model_cfg
  dots = "bfloat16" if matmul.bf16_dots(cfg.dot_dtype, cfg.dtype, cfg.platform) else "float32"
  n_peak, peak, _ = flops_lib.peak_of_mesh(mesh, s.train.peak_flops, dots)
  chips = n_peak if devices[0].platform != "cpu" else 1
  step_s = statistics.median(times)
  tokens = s.tokens_per_step
  row = dict(date=str(datetime.date.today()), platform=devices[0].platform,
             device_kind=devices[0].device_kind, devices=len(devices),
             model=f"{config.size} {s.obj.objective}+{s.obj.sentence_task}",
             seq=s.data.example.max_length, mesh=",".join(str(v) for v in mesh.shape.values()),
             optim_sharding=s.optim_sharding, batch=s.data.batch_size,
             accumulation=s.optim_cfg.accumulation_steps, program=cc.describe_program(cfg),
             hbm_gib=round(a["peak_bytes"] / 2**30, 3) if "peak_bytes" in a else None,
             step_ms=round(step_s * 1e3, 3), steps_s=round(1 / step_s, 3),
             tok_s_chip=round(tokens / step_s / chips),
             mfu=round(flops_lib.mfu(s.flops_per_step, step_s, n_peak, peak), 4),
             peak_hbm_gib=_peak_hbm_gib(jax.local_devices()))
  est = a.get("optimal_seconds")
  if est:
    scanned = " (scanned: one layer of L)" if cfg.scan_layers else ""
    row.update(est_step_ms=f"{est * 1e3:.3f}{scanned}",
               est_tok_s_chip=round(tokens / est / chips),
               est_mfu=round(flops_lib.mfu(s.flops_per_step, est, n_peak, peak), 4),
               est_over_measured=round(est / step_s, 3))
  say(f"compiled in {compile_s:.1f} s; " + ", ".join(f"{k}={row.get(k)}" for k in FIELDS[11:]))
  return row


def write_row(path: pathlib.Path, row: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  new = not path.exists()
  with path.open("a", newline="") as f:
    w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
    if new:
      w.writeheader()
    w.writerow(row)


def main(argv):
  del argv
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/pretrain.py:size=base.")
  row = measure(FLAGS.config, FLAGS.steps, FLAGS.warmup)
  write_row(pathlib.Path(FLAGS.out), row)
  print(f"appended to {FLAGS.out}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
