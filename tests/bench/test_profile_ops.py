"""bench/profile_ops.py reads a real XLA:CPU trace: a jitted step's dots are found by their HLO
shapes, their FLOPs and time add up, and the other ops are listed by kind."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A profiled process of its own: XLA_FLAGS (the HLO dump) must be set before JAX starts, and
# this test process already runs 8 fake devices.
_PROFILED = """
import jax, jax.numpy as jnp
x, w = jnp.ones((256, 128)), jnp.ones((128, 512))
step = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(axis=1))
step(x, w).block_until_ready()
jax.profiler.start_trace({trace!r})
for _ in range(3):
  step(x, w).block_until_ready()
jax.profiler.stop_trace()
"""


def test_a_real_trace_attributes_the_dot_and_the_rest(tmp_path):
  trace, hlo = tmp_path / "trace", tmp_path / "hlo"
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_dump_to={hlo} --xla_dump_hlo_as_text "
                       "--xla_dump_hlo_module_re=.*lambda.*")
  subprocess.run([sys.executable, "-c", _PROFILED.format(trace=str(trace))], env=env,
                 check=True, timeout=300)
  out = subprocess.run(
      [sys.executable, "bench/profile_ops.py", f"--trace={trace}", f"--hlo={hlo}",
       "--module=lambda", "--steps=3"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  text = out.stdout
  assert "| [256, 128] x [128, 512] -> [256, 512] | 1 |" in text, text
  dot_row = next(line for line in text.splitlines() if line.startswith("| dots ("))
  rate = float(dot_row.split("|")[4])
  assert 0.1 < rate < 10_000, dot_row  # GFLOP/s of 2 x 256 x 128 x 512 per step: plausible
  assert "| other op |" in text
  # Without the HLO there are no shapes, only kinds.
  bare = subprocess.run([sys.executable, "bench/profile_ops.py", f"--trace={trace}"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
  assert bare.returncode == 0 and "-> [256, 512]" not in bare.stdout and "| kind |" in bare.stdout
