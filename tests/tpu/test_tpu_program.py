"""The step compiled for a TPU topology is the TPU's program, not the CPU host's.

Every "auto" in a config (layer layout, remat, compute dtype, dot dtype, attention path) is
resolved for the platform the step is compiled for (train/setup.py model_config). The unit
tests check the resolution without a TPU compiler; the compile tests build abstract TPU
devices with libtpu (`bash run.sh test` installs it and names its folder in
ENCODER_JAX_LIBTPU) and inspect the compiled HLO, in a subprocess whose PYTHONPATH holds
libtpu (the suite's own processes stay CPU-only).
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import pretrain
from encoder_jax.model.attention import attention_path
from encoder_jax.model.matmul import bf16_dots
from encoder_jax.train import setup

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBTPU = os.environ.get("ENCODER_JAX_LIBTPU", "")


def _cfg(arg, backend):
  config = pretrain.get_config(arg)
  return setup.model_config(config, 8192, backend)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_auto_resolves_for_the_accelerator_named_not_the_host(backend):
  cfg = _cfg("size=base,dropout=none", backend)  # the host running this is a CPU
  assert (cfg.platform, cfg.dtype, cfg.scan_layers, cfg.remat_policy) == (
      backend, "bfloat16", True, "dots")
  assert not bf16_dots(cfg.dot_dtype, cfg.dtype, cfg.backend)  # native bf16 dots there
  path = attention_path(cfg.attention_impl, cfg.dtype, dropout_active=False,
                        backend=cfg.backend, dot_dtype=cfg.dot_dtype)
  assert path == ("cudnn" if backend == "gpu" else "pallas")


def test_auto_on_cpu_keeps_fp32_activations_and_the_unrolled_layout():
  cfg = _cfg("size=base", "cpu")
  assert (cfg.platform, cfg.dtype, cfg.scan_layers, cfg.remat_policy) == (
      "cpu", "float32", False, "none")


def test_explicit_choices_are_not_overridden_by_the_platform():
  cfg = _cfg("size=base,precision=fp32", "tpu")
  assert cfg.dtype == "float32" and cfg.dot_dtype == ""
  cfg = _cfg("size=base,precision=bf16_dots", "tpu")
  assert cfg.dtype == "float32" and bf16_dots(cfg.dot_dtype, cfg.dtype, cfg.backend)


def test_the_layers_trace_the_platform_of_their_config(monkeypatch):
  """The attention layer asks its config's platform, not jax.default_backend(): a model built
  for "gpu" in bf16 traces the cuDNN path here on a CPU host (where cuDNN then fails to
  lower, which is the point: the choice was the GPU's)."""
  from encoder_jax.model import attention
  seen = []
  real = attention.attention_path
  monkeypatch.setattr(attention, "attention_path",
                      lambda *a, **k: seen.append(k["backend"]) or real(*a, **k))
  import jax.numpy as jnp
  from flax import nnx
  from encoder_jax.model.config import ModelConfig
  mha = attention.MultiHeadAttention(
      ModelConfig(hidden_size=16, num_heads=2, platform="tpu", dtype="bfloat16"),
      rngs=nnx.Rngs(0))
  mha(jnp.ones((1, 4, 16)), jnp.ones((1, 1, 4, 4), bool))
  assert seen == ["tpu"]


# --------------------------------------------------------------- compiled with libtpu

# One subprocess compiles every case below: starting Python, JAX and libtpu costs about as
# much as a compile (each case took 17-25 s in its own process, the default BERT-base config
# no more than the mini one).
_SCRIPT = r"""
import json, re, sys
import jax
from jax.experimental import topologies
from configs import pretrain
from encoder_jax.train import compile_check as cc
def run(case):
  jax.config.update("jax_default_prng_impl", case.get("prng", "threefry2x32"))
  config = pretrain.get_config(case["arg"])
  config.data.vocab = "demo"  # committed with the package: no fetch
  config.data.batch_size = 32
  if case.get("mesh"):
    config.mesh = case["mesh"]
  for key, value in case.get("set", {}).items():  # "optim.accumulation_steps": 2, ...
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = value
  devices = topologies.get_topology_desc(platform="tpu", topology_name=case["topology"]).devices
  compiled, s, _, _, mesh, secs = cc.compile_train_step(config, devices)
  hlo = compiled.as_text()
  dots = re.findall(r"= (\w+)\[[^\]]*\][^ ]* (?:convolution|dot)\(", hlo)
  a = cc.analyze(compiled)
  print(json.dumps(dict(
      case=case["name"], kind=devices[0].device_kind, platform=s.model_cfg.platform,
      dtype=s.model_cfg.dtype, scan=s.model_cfg.scan_layers, remat=s.model_cfg.remat_policy,
      program=cc.describe_program(s.model_cfg), dots=dots, while_loops=hlo.count(" while("),
      explicit="attention_explicit" in hlo, xla_attention="attention_xla" in hlo,
      pallas="attention_pallas" in hlo, mosaic='custom_call_target="tpu_custom_call"' in hlo,
      rbg="rng-bit-generator(" in hlo, mesh=dict(mesh.shape), analysis=a, secs=secs,
      conditionals=hlo.count(" conditional("))),
      flush=True)
for case in json.loads(sys.argv[1]):
  try:
    run(case)
  except Exception:  # one case's failure is that case's test's, not all of them
    import traceback
    print(json.dumps(dict(case=case["name"], error=traceback.format_exc()[-3000:])), flush=True)
"""

# name -> the pretrain config argument, the TPU topology, and optionally a mesh / PRNG.
_CASES = {
    "default": dict(arg="", topology="v4:2x2x1"),
    # Pallas and FSDP in one program (the 5 cases in 3 programs: 29.5 s alone, 45 s in 5): the
    # kernel runs inside shard_map over the batch, which FSDP splits like data parallelism
    # does. (Compiled for a v4 with FSDP over its 8 devices, compile_check.collectives finds no
    # reduce-scatter in the program, so this case is the v5e's and the default one the v4's.)
    "pallas": dict(arg="size=mini,dropout=none", topology="v5e:2x2", mesh="1,-1,1"),
    # also the rbg PRNG's case: neither the attention path nor the cost model's estimate
    # depends on the other
    "untileable_rows": dict(arg="dropout=none,runlocal", topology="v5e:2x2", prng="rbg"),
    # mesh=auto's first candidate on a v5e: data parallel, the optimizer split over the data
    # axis, two micro-steps an update.
    "zero1": dict(arg="size=mini,dropout=none", topology="v5e:2x2", mesh="-1,1,1",
                  set={"optim_sharding": "zero1", "optim.accumulation_steps": 2}),
}


@pytest.fixture(scope="module")
def compiled():
  """{case name: what _SCRIPT reports}, every case compiled in one subprocess."""
  if not LIBTPU or not pathlib.Path(LIBTPU, "libtpu").is_dir():
    pytest.skip("libtpu is not installed: run the suite with `bash run.sh test`, which "
                "installs it (pip: libtpu==0.0.42.1, the TPU compiler of jax[tpu]==0.10.2) "
                "and sets ENCODER_JAX_LIBTPU")
  # ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise takes a machine-wide lock file, and a
  # compile-only process needs no exclusive TPU.
  env = dict(os.environ, PYTHONPATH=f"{LIBTPU}:{ROOT}", JAX_PLATFORMS="cpu",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1",
             XLA_FLAGS="")  # the suite's fake-CPU-device flags mean nothing to a TPU compile
  cases = [dict(name=k, **v) for k, v in _CASES.items()]
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(cases)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  return _Cases({r["case"]: r for r in out})


class _Cases(dict):
  """A case's report; a case that raised fails its own test with its traceback."""

  def __getitem__(self, name):
    r = super().__getitem__(name)
    if "error" in r:
      pytest.fail(f"compiling case {name!r} failed:\n{r['error']}")
    return r


def test_default_config_compiles_to_the_bf16_scanned_tpu_program(compiled):
  """configs/pretrain.py with no arguments, compiled for a v4-8 from this CPU: bf16
  activations and matmuls, scanned layers with dots remat, BERT's attention dropout on the
  explicit path; the HLO's matmuls are bf16 x bf16 and the layers are one while loop."""
  r = compiled["default"]
  assert r["kind"] == "TPU v4" and r["platform"] == "tpu"
  assert (r["dtype"], r["scan"], r["remat"]) == ("bfloat16", True, "dots")
  bf16 = sum(d == "bf16" for d in r["dots"])
  # Only the losses' fp32 logits may be fp32 results; the layers' matmuls are bf16.
  assert bf16 >= 0.75 * len(r["dots"]) and bf16 >= 10, r["dots"]
  assert r["while_loops"] >= 2  # the scanned blocks, forward and backward
  assert r["explicit"]  # attention dropout 0.1 (BERT) needs the probabilities
  assert r["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}  # auto: data-parallel on TPU
  assert r["analysis"]["n_all_reduce"] >= 1  # the gradients' all-reduce over its 8 devices
  assert 0 < r["analysis"]["optimal_seconds"] < 1.0


def test_without_attention_dropout_the_tpu_step_runs_the_pallas_flash_kernel(compiled):
  """auto on a TPU: the Pallas flash-attention kernel (a Mosaic custom call), inside
  shard_map over the 4 chips of a v5e-4 (split by FSDP); rows of 128 tile its blocks."""
  r = compiled["pallas"]
  assert r["kind"] == "TPU v5 lite" and r["dtype"] == "bfloat16"
  assert "training attention pallas" in r["program"]
  assert r["pallas"] and r["mosaic"] and not r["explicit"] and not r["xla_attention"]


def test_rows_the_kernel_cannot_tile_fall_back_to_xla_attention(compiled):
  r = compiled["untileable_rows"]  # the demo recipe's rows of 64 tokens
  assert r["xla_attention"] and not r["pallas"] and not r["mosaic"]


def test_the_cost_model_estimate_survives_custom_calls_it_prices_at_minus_one(compiled):
  """With the rbg PRNG (MaxText's choice on TPU) the step holds X64Combine custom calls,
  which XLA's TPU cost model prices at -1 s each, like ConcatBitcast: raw optimal_seconds is
  negative; analyze() adds them back to a real estimate."""
  r = compiled["untileable_rows"]  # (the demo recipe, compiled with prng rbg)
  assert r["rbg"] and not compiled["pallas"]["rbg"]  # the PRNG switch reached the program
  assert 0 < r["analysis"].get("optimal_seconds", -1) < 1.0, r["analysis"]


def test_fsdp_gathers_parameters_and_reduce_scatters_gradients(compiled):
  """Under FSDP the TPU program all-gathers the parameters and reduce-scatters the gradients
  (XLA's TPU backend writes a reduce-scatter as a fusion calling an all-reduce-scatter
  computation; compile_check.collectives counts it as one)."""
  r = compiled["pallas"]  # (size mini, no dropout, on a v5e-4)
  assert r["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert r["analysis"].get("n_reduce_scatter", 0) >= 1, r["analysis"]
  assert r["analysis"].get("n_all_gather", 0) >= 1, r["analysis"]


def test_zero1_reduce_scatters_gradients_and_gathers_parameters_on_a_tpu(compiled):
  """ZeRO-1 with accumulation, compiled for a v5e-4: the gradients are reduce-scattered (not
  all-reduced) and the parameters all-gathered, and the optimizer sits in a conditional (the
  k-th micro-step's branch, train/step.py)."""
  r = compiled["zero1"]
  assert r["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert r["analysis"].get("n_reduce_scatter", 0) >= 1, r["analysis"]
  assert r["analysis"].get("n_all_gather", 0) >= 1, r["analysis"]
  assert r["conditionals"] >= 1
