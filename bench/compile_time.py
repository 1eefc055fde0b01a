r"""Compile time of the train step: scanned vs unrolled layers (BERT-base by default).

  python -m bench.compile_time                         # base, MLM+NSP, scan and unrolled
  python -m bench.compile_time --modes=scan --objective=electra --remat_policy=dots

Each mode compiles in a fresh process (no in-memory cache; the persistent compilation cache
is off unless JAX_COMPILATION_CACHE_DIR is set, which this script refuses) from abstract shapes
(`jax.eval_shape` of the init: no parameter is materialised), and reports
  trace+lower  Python tracing of the NNX model, value_and_grad, optax -> StableHLO
  compile      XLA's optimisation and CPU code generation
each as wall seconds and as this process's CPU seconds. On a shared machine the wall time
grows with the load; XLA compiles mostly on one thread, so CPU seconds are the steadier figure.
Target (issue 7): BERT-base compile <= 20 s with scan on the 2-core dev CPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags


_SIZE = flags.DEFINE_string("size", "base", "Model size.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Batch size.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_OBJ = flags.DEFINE_enum("objective", "mlm", ["mlm", "electra"], "mlm (+NSP) or electra.")
_MODES = flags.DEFINE_list("modes", ["scan", "unrolled"], "scan and/or unrolled.")
_REMAT = flags.DEFINE_enum("remat_policy", "none", ["none", "full", "dots", "dots_no_batch"],
                           "Rematerialisation policy per block.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Fresh processes per mode (median shown).")
_CHILD = flags.DEFINE_string("child", None, "Internal: JSON spec to compile in this process.")


def compile_once(spec_json: str) -> dict:
  """Traces, lowers and compiles the step for the spec; returns the timings (and memory)."""
  import jax
  import jax.numpy as jnp
  from bench import systems
  spec = systems.StepSpec(**json.loads(spec_json))
  from encoder_jax.train import optim, step as step_lib
  wall0 = time.perf_counter()
  parts = optim.build_optimizer(systems.optim_config())
  tr, init = step_lib.create(systems.model_config(spec), systems.objective_config(spec),
                             parts.tx, parts.schedule, spec.seed)
  state = jax.eval_shape(init)
  B, T = spec.batch_size, spec.seq_len
  batch = dict(input_ids=jax.ShapeDtypeStruct((B, T), jnp.int32),
               mask=jax.ShapeDtypeStruct((B, T), jnp.bool_),
               token_types=jax.ShapeDtypeStruct((B, T), jnp.int32),
               nsp_label=jax.ShapeDtypeStruct((B,), jnp.int32))
  step = step_lib.make_train_step(tr)
  wall1, cpu1 = time.perf_counter(), time.process_time()
  lowered = step.lower(state, batch)
  wall2, cpu2 = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  wall3, cpu3 = time.perf_counter(), time.process_time()
  mem = compiled.memory_analysis()
  out = dict(setup_wall=wall1 - wall0, lower_wall=wall2 - wall1, compile_wall=wall3 - wall2,
             lower_cpu=cpu2 - cpu1, compile_cpu=cpu3 - cpu2,
             hlo_ops=lowered.as_text().count("\n"))
  for name in ("argument", "output", "alias", "temp", "generated_code"):
    out[f"{name}_bytes"] = getattr(mem, f"{name}_size_in_bytes", None)
  return out


def compile_in_subprocess(spec: dict, env: dict | None = None) -> dict:
  """`compile_once(spec)` in a fresh Python process (no in-process compilation cache)."""
  out = subprocess.run([sys.executable, os.path.abspath(__file__), f"--child={json.dumps(spec)}"],
                       capture_output=True, text=True, check=False,
                       env={**os.environ, **(env or {})})
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not line:
    raise RuntimeError(f"compile of {spec} failed:\n{out.stderr[-3000:]}")
  return json.loads(line[0][len("RESULT "):])


def main(argv):
  del argv
  if _CHILD.value:
    print("RESULT " + json.dumps(compile_once(_CHILD.value)))
    return
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    raise app.UsageError("Unset JAX_COMPILATION_CACHE_DIR: a cache hit is not a compile.")
  import statistics
  rows = []
  for mode in _MODES.value:
    spec = dict(system="ours", size=_SIZE.value, batch_size=_BATCH.value, seq_len=_SEQ.value,
                objective=_OBJ.value, nsp=_OBJ.value == "mlm", scan_layers=mode == "scan",
                remat_policy=_REMAT.value)
    runs = []
    for _ in range(_REPEATS.value):
      runs.append(compile_in_subprocess(spec))
      r = runs[-1]
      print(f"  {mode}: trace+lower {r['lower_wall']:.1f} s, compile {r['compile_wall']:.1f} s "
            f"(cpu {r['lower_cpu']:.1f} + {r['compile_cpu']:.1f} s)")
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if runs[0][k] is not None}
    rows.append((mode, med))
  obj = "MLM+NSP" if _OBJ.value == "mlm" else "ELECTRA"
  print(f"\ncompile time, {_SIZE.value} {obj} train step B{_BATCH.value}x{_SEQ.value}, remat "
        f"{_REMAT.value}, {os.cpu_count()} cores (median of {_REPEATS.value} fresh processes)")
  head = (f"{'layers':9s} {'trace+lower s':>13s} {'compile s':>10s} {'total s':>8s} "
          f"{'total cpu s':>11s} {'HLO lines':>9s}")
  print(head)
  print("-" * len(head))
  for mode, m in rows:
    print(f"{mode:9s} {m['lower_wall']:13.1f} {m['compile_wall']:10.1f} "
          f"{m['lower_wall'] + m['compile_wall']:8.1f} {m['lower_cpu'] + m['compile_cpu']:11.1f} "
          f"{m['hlo_ops']:9,.0f}")
  if _SIZE.value == "base" and "scan" in _MODES.value:
    m = dict(rows)["scan"]
    total = m["lower_wall"] + m["compile_wall"]
    print(f"target: scan total <= 20 s: {'met' if total <= 20 else 'NOT met'} ({total:.1f} s wall, "
          f"{m['lower_cpu'] + m['compile_cpu']:.1f} s cpu)")


if __name__ == "__main__":
  app.run(main)
