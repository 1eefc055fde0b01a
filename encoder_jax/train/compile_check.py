r"""Compile the trainer's own step for a pre-training config on a target mesh, without running
it; report per-device memory.

  python -m encoder_jax.train.compile_check \
      --config=configs/pretrain.py:size=base,nsp=nsp --config.data.batch_size=256 \
      --config.mesh=1,4,2 --table
      (8 fake CPU devices are created unless --fake_devices=0 or --tpu_topology is given)

What is compiled is exactly what `python -m encoder_jax.main --mode=pretrain` would run for the
same --config: `setup.build(config)` (model config with the tokenizer's vocab size, objective,
optimizer and schedule, remat, dtype), the state shardings from the parameters' logical axes
(`sharding.state_shardings`), the batch sharding, `step.make_train_step`, and the batch keys,
shapes and dtypes the config's loader yields (`pipeline.batch_spec`). No corpus is built; the
vocabulary is read (fetched and cached like a run does) for its size.

What works where (jax 0.10.2):
  * TPU without a TPU: `bash run.sh tpu python -m encoder_jax.train.compile_check
    --tpu_topology=v5e:4x4 ...` (run.sh puts libtpu, the TPU compiler of `jax[tpu]==0.10.2`,
    on the path) builds the mesh on `jax.experimental.topologies.get_topology_desc(
    platform="tpu", topology_name=...)` devices, and every "auto" in config.model resolves for
    the TPU (setup.model_config): the printed program is the pod's. CI compiles BERT-base and
    ELECTRA-base this way (bench/tpu_aot.py --rows=ci); tests/tpu/ checks the program.
  * CPU: any mesh over fake host devices (the CPU's program: fp32 or bf16 dots, unrolled
    layers); memory is XLA:CPU's buffer assignment, a proxy for the TPU's at best.
  * GPU: compile on a GPU host (no abstract GPU topology in jax 0.10).
"""
from __future__ import annotations

import math
import os
import re
import sys
import time

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "A pre-training config, e.g. configs/pretrain.py:size=base,nsp=nsp; "
    "override any leaf with --config.a.b=value (the mesh is --config.mesh=data,fsdp,tensor).",
    lock_config=True)
flags.DEFINE_integer("fake_devices", 8, "Fake CPU devices to create (0: use the real devices).")
flags.DEFINE_string("tpu_topology", None, "Compile for an abstract TPU topology, e.g. "
                    "v4:2x2x1 (needs jax[tpu] / libtpu).")
flags.DEFINE_bool("table", False, "Also print the sharding of every parameter.")
flags.DEFINE_enum("platform", None, ["tpu", "gpu", "cpu"], "The platform whose choices every "
                  "'auto' in config.model takes (layer layout, remat, compute dtype, dot dtype, "
                  "attention path; train/setup.py model_config). Default: the devices' own, "
                  "which is the only faithful choice: the TPU's program comes from "
                  "--tpu_topology, not from --platform=tpu on CPU devices.")


def compile_train_step(config, devices=None, platform: str | None = None):
  """Lowers + compiles the trainer's sharded train step for `config` from abstract values, with
  the layer layout of `platform` (default: the devices' own) where config.model says "auto".
  Returns (compiled, setup, state_shardings, abstract_state, mesh, seconds)."""
  lowered, s, state_shardings, abstract, mesh = lower_train_step(config, devices, platform)
  t0 = time.perf_counter()
  compiled = lowered.compile()
  return compiled, s, state_shardings, abstract, mesh, time.perf_counter() - t0


def lower_train_step(config, devices=None, platform: str | None = None):
  """compile_train_step's first half: (lowered, setup, state_shardings, abstract_state, mesh).
  The lowered text names the program (shapes, shardings, every op) before the expensive XLA
  compile: encoder_jax.train.layout keys its cache on it."""
  import jax

  from encoder_jax.train import setup, sharding, step as step_lib

  if devices is None:
    devices = jax.devices()
  s = setup.build(config, platform or devices[0].platform)
  mesh = sharding.mesh_from_config(s.mesh, devices)
  abstract, state_shardings = sharding.sharded_abstract_state(s.init_fn, mesh,
                                                              s.optim_sharding)
  batch_sharding = sharding.batch_sharding(mesh)
  batch_in = setup.abstract_batch(s.data, batch_sharding)
  train_step = step_lib.make_train_step(
      s.trainer, state_shardings, batch_sharding,
      sharding.update_shardings(abstract.params, state_shardings.params, mesh, s.optim_sharding))
  return train_step.lower(abstract, batch_in), s, state_shardings, abstract, mesh


_COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                "collective-permute")


def collectives(hlo_text: str) -> dict[str, int]:
  """How many of each collective op the compiled (optimised, partitioned) HLO holds, async
  start/done pairs counted once. What the mesh should produce: data/FSDP parallelism an
  all-reduce (or reduce-scatter) of the gradients, FSDP all-gathers of the parameters,
  tensor parallelism all-reduces of activations. XLA's TPU backend writes a reduce-scatter
  as a fusion calling an `%all-reduce-scatter...` computation (an all-reduce inside): each
  call counts as one reduce-scatter, and the all-reduce inside it not at all."""
  counts: dict[str, int] = {}
  computation = ""
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():  # a computation's header, or its closing "}"
      computation = line
      continue
    in_reduce_scatter = computation.startswith("%all-reduce-scatter")
    for op in _COLLECTIVES:
      # "= f32[..] all-reduce(" or "all-reduce-start(": an op's name follows the result shape.
      if re.search(rf"\s{op}(?:-start)?\(", line) and not (
          in_reduce_scatter and op == "all-reduce"):
        counts[op] = counts.get(op, 0) + 1
    if "calls=%all-reduce-scatter" in line:
      counts["reduce-scatter"] = counts.get("reduce-scatter", 0) + 1
  return counts


UNPRICED_CUSTOM_CALLS = ("ConcatBitcast", "X64Combine")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\](\{[^}]*\})?")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_NO_TRAFFIC = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
               "partition-id", "replica-id", "opt-barrier", "copy-done", "all-gather-done",
               "all-reduce-done", "collective-permute-done", "async-done", "send-done",
               "recv-done"}


def _hbm_bytes(types: str) -> float:
  """Bytes of the arrays in an HLO type string that live in HBM: a layout with S(n), n > 0,
  is another memory space (on TPU S(1) is the on-chip VMEM)."""
  total = 0.0
  for dtype, dims, layout in _ARRAY.findall(types):
    if layout and re.search(r"S\([1-9]", layout):
      continue
    total += _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
  return total


def hbm_traffic_bytes(hlo_text: str) -> float:
  """HBM bytes the compiled program's entry computation moves: for every top-level
  instruction (a fusion, a custom call, a collective, a copy), the HBM-resident operands it
  reads and the HBM-resident result it writes; values in VMEM (layout S(1)) and free ops
  (parameters, tuples, bitcasts, the -done halves of async pairs) cost nothing. An
  approximation from above of the traffic (a fusion that reads a slice of an operand is
  charged the whole operand, as XLA's cost model does). It is not XLA's "bytes accessed",
  which is the cost model's sum over the program's accesses and no measure of HBM traffic
  (bench/results/tpu_aot_calibration.txt has both for BERT-base's step). Loop bodies (a
  scanned program's layers) are not multiplied by their trip count: use it on unrolled
  programs."""
  sizes: dict[str, float] = {}
  total, in_entry = 0.0, False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY "):
      in_entry = True
      continue
    if not in_entry:
      continue
    if line.startswith("}"):
      break
    m = _INSTR.match(line)
    if not m:
      continue
    name, types, op, rest = m.groups()
    sizes[name] = out = _hbm_bytes(types)
    if op in _NO_TRAFFIC:
      continue
    operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
    read = sum(sizes.get(o, 0.0) for o in operands)
    if op.endswith("-start"):  # its result tuple holds the operand again
      out = max(out - read, 0.0)
      sizes[name] = 0.0
    total += read + out
  return total


def analyze(compiled) -> dict[str, float]:
  """Per-device memory (XLA's buffer assignment), the compiler's cost model (`flops`, `bytes
  accessed` and, on TPU, `optimal_seconds`: XLA's own estimate of the step's time, a
  prediction, never a measurement) and the collectives of a compiled step."""
  out: dict[str, float] = {}
  mem = compiled.memory_analysis()
  if mem is not None:
    out.update(argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
               temp_bytes=mem.temp_size_in_bytes, alias_bytes=mem.alias_size_in_bytes,
               # live at the peak: inputs + temporaries + outputs that do not reuse a donated
               # input's buffer
               peak_bytes=(mem.argument_size_in_bytes + mem.temp_size_in_bytes
                           + mem.output_size_in_bytes - mem.alias_size_in_bytes))
  cost = compiled.cost_analysis()
  for key, name in (("flops", "xla_flops"), ("bytes accessed", "bytes_accessed"),
                    ("optimal_seconds", "optimal_seconds")):
    if cost and key in cost:
      out[name] = float(cost[key])
  hlo = compiled.as_text()
  if "optimal_seconds" in out:
    # XLA's TPU cost model prices the custom calls it has no model for at exactly -1 s: a
    # step holding k of them reads -k + its real estimate. Seen: ConcatBitcast (a free
    # concatenation of async slices) and X64Combine (64-bit halves joined, e.g. by the rbg
    # PRNGs). Add them back; anything still <= 0 is no estimate at all.
    # (Inside a lax.cond's branches they lower that branch's price, and XLA prices a cond at
    # its dearer branch: train/layout.py keeps the raw figure and the count to undo that.)
    calls = sum(hlo.count(f'custom_call_target="{name}"') for name in UNPRICED_CUSTOM_CALLS)
    out["optimal_seconds_raw"], out["unpriced_calls"] = out["optimal_seconds"], calls
    out["optimal_seconds"] += calls
    if out["optimal_seconds"] <= 0:
      del out["optimal_seconds"]
  out["hbm_traffic_bytes"] = hbm_traffic_bytes(hlo)
  out.update({f"n_{k.replace('-', '_')}": v for k, v in collectives(hlo).items()})
  return out


def describe_program(model_cfg) -> str:
  """One line: what the compiled step is (dtype, matmul path, layers, remat, attention)."""
  from encoder_jax.model.attention import attention_path
  from encoder_jax.model.matmul import bf16_dots
  drop = model_cfg.attention_dropout > 0
  attn = attention_path(model_cfg.attention_impl, model_cfg.dtype, dropout_active=drop,
                        backend=model_cfg.backend, dot_dtype=model_cfg.dot_dtype)
  dots = ("bf16 operands, fp32 accumulation" if bf16_dots(
      model_cfg.dot_dtype, model_cfg.dtype, model_cfg.backend) else model_cfg.dtype)
  return (f"for {model_cfg.backend}: activations {model_cfg.dtype}, matmuls {dots}, "
          f"{'scanned' if model_cfg.scan_layers else 'unrolled'} layers, remat "
          f"{model_cfg.remat_policy}, training attention {attn}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}")
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/pretrain.py:size=base.")
  devices = None
  if FLAGS.tpu_topology:
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(platform="tpu",
                                           topology_name=FLAGS.tpu_topology).devices
  from encoder_jax.train import sharding as sh
  config = FLAGS.config
  compiled, s, shardings, abstract, mesh, secs = compile_train_step(config, devices,
                                                                    FLAGS.platform)
  a = analyze(compiled)
  gib = lambda b: f"{b / 2**30:.3f} GiB"
  dims = dict(mesh.shape)
  print(f"{config.size} {s.obj.objective} ({s.obj.sentence_task}) batch "
        f"{config.data.batch_size}x{config.data.max_length}, mesh(data,fsdp,tensor)=("
        f"{dims['data']},{dims['fsdp']},{dims['tensor']}) on {mesh.devices.size} "
        f"{mesh.devices.flat[0].device_kind} devices: compiled in {secs:.1f}s")
  print(f"program {describe_program(s.model_cfg)}")
  if "argument_bytes" in a:
    print(f"per device: arguments {gib(a['argument_bytes'])}, outputs {gib(a['output_bytes'])}"
          f", temporaries {gib(a['temp_bytes'])}, aliased (donated) {gib(a['alias_bytes'])}")
  if "xla_flops" in a:
    print(f"XLA cost model (an estimate), per device: {a['xla_flops']:.3e} FLOPs "
          f"(our analytic count {s.flops_per_step / mesh.devices.size:.3e}), "
          f"{a.get('bytes_accessed', 0):.3e} bytes accessed"
          + (f", optimal_seconds {a['optimal_seconds']:.4f} (the compiler's estimate of the "
             "step time)" if "optimal_seconds" in a else ""))
  coll = {k[2:]: v for k, v in a.items() if k.startswith("n_")}
  print(f"collectives: {coll or 'none'}")
  if FLAGS.table:
    rows = sh.describe({"params": shardings.params}, {"params": abstract.params})
    width = max(len(r[0]) for r in rows)
    for name, shape_, spec in rows:
      print(f"{name:<{width}}  {str(shape_):<22} {spec}")


if __name__ == "__main__":
  if ("--fake_devices=0" not in sys.argv
      and not any(a.startswith("--tpu_topology") for a in sys.argv)):
    n = next((a.split("=")[1] for a in sys.argv if a.startswith("--fake_devices=")), "8")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={n}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.train.compile_check")
