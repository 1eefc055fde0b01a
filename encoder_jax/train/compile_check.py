"""Compile the train step for a target mesh without running it; report per-device memory.

  python -m encoder_jax.train.compile_check --size=base --mesh=1,4,2 --batch=256 --seq_len=128
      (8 fake CPU devices are created when --fake_devices=8, the default)

What works where (jax 0.10.2):
  * CPU: any mesh over fake host devices (`--xla_force_host_platform_device_count`); the
    numbers are XLA:CPU's buffer assignment, a good proxy for argument/parameter bytes, a
    rough one for temporaries (TPU/GPU fusion differs).
  * TPU without a TPU: in a separate venv with `jax[tpu]==0.10.2` (libtpu),
    `jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name="v4:2x2x1")`
    gives TPU devices to build the Mesh on; pass --tpu_topology=v4:2x2x1 to use it. That path
    needs libtpu installed and is not exercised in CI.
  * GPU: compile on a GPU host (no abstract GPU topology in jax 0.10).
"""
from __future__ import annotations

import os
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("size", "base", "Model size (tiny|mini|small|medium|base|large|electra-small).")
flags.DEFINE_string("objective", "mlm", "mlm | electra | electra_15 | replace_mlm | all_tokens_mlm.")
flags.DEFINE_bool("nsp", True, "Include the NSP head and loss.")
flags.DEFINE_string("mesh", "1,4,2", "Mesh shape data,fsdp,tensor (one entry may be -1).")
flags.DEFINE_integer("batch", 256, "Global batch size (sequences).")
flags.DEFINE_integer("seq_len", 128, "Sequence length.")
flags.DEFINE_integer("max_predictions", 20, "MLM predictions per sequence (sparse head).")
flags.DEFINE_integer("fake_devices", 8, "Fake CPU devices to create (0: use real devices).")
flags.DEFINE_string("tpu_topology", None, "Compile for an abstract TPU topology, e.g. "
                    "v4:2x2x1 (needs jax[tpu] / libtpu).")
flags.DEFINE_string("dtype", "float32", "Compute dtype (float32 | bfloat16).")
flags.DEFINE_bool("table", False, "Also print the sharding of every parameter.")
flags.DEFINE_enum("remat", "none", ["none", "full", "dots", "dots_no_batch"],
                  "Rematerialisation policy of each block (trades compute for activation memory).")


def compile_step(size: str, mesh_shape, *, batch: int, seq_len: int, objective: str = "mlm",
                 nsp: bool = True, max_predictions: int = 20, dtype: str = "float32",
                 remat: str = "none", devices=None):
  """Lowers + compiles the sharded train step from abstract values only. Returns
  (compiled, shardings, abstract_state, seconds)."""
  import jax
  import jax.numpy as jnp

  from encoder_jax.model.config import model_config_for_size
  from encoder_jax.train import sharding as sh
  from encoder_jax.train import step as S
  from encoder_jax.train.optim import OptimConfig, build_optimizer

  cfg = model_config_for_size(size, dtype=dtype, remat_policy=remat)
  obj = S.ObjectiveConfig(objective=objective, sentence_task="nsp" if nsp else "none",
                          max_predictions=max_predictions)
  parts = build_optimizer(OptimConfig())
  tr, init = S.create(cfg, obj, parts.tx, parts.schedule, seed=0)
  mesh = sh.make_mesh(mesh_shape, devices)
  abstract = jax.eval_shape(init)
  shardings = sh.state_shardings(abstract, mesh)
  bs = sh.batch_sharding(mesh)
  state_in = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  batch_in = {k: jax.ShapeDtypeStruct(shape, dt, sharding=bs) for k, shape, dt in [
      ("input_ids", (batch, seq_len), jnp.int32), ("mask", (batch, seq_len), jnp.bool_),
      ("token_types", (batch, seq_len), jnp.int32)]}
  if nsp:
    batch_in["nsp_label"] = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=bs)
  step = S.make_train_step(tr, shardings, bs)
  t0 = time.perf_counter()
  compiled = step.lower(state_in, batch_in).compile()
  return compiled, shardings, abstract, time.perf_counter() - t0


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}")
  import jax
  devices = None
  if FLAGS.tpu_topology:
    from jax.experimental import topologies
    devices = topologies.get_topology_desc(platform="tpu",
                                           topology_name=FLAGS.tpu_topology).devices
  from encoder_jax.train import sharding as sh
  shape = tuple(int(x) for x in FLAGS.mesh.split(","))
  compiled, shardings, abstract, secs = compile_step(
      FLAGS.size, shape, batch=FLAGS.batch, seq_len=FLAGS.seq_len, objective=FLAGS.objective,
      nsp=FLAGS.nsp, max_predictions=FLAGS.max_predictions, dtype=FLAGS.dtype,
      remat=FLAGS.remat, devices=devices)
  n = len(devices or jax.devices())
  mem = compiled.memory_analysis()
  gib = lambda b: f"{b / 2**30:.3f} GiB"
  print(f"{FLAGS.size} {FLAGS.objective} nsp={FLAGS.nsp} batch={FLAGS.batch}x{FLAGS.seq_len} "
        f"remat={FLAGS.remat} mesh(data,fsdp,tensor)={sh.mesh_shape(shape, n)} on {n} "
        f"{(devices or jax.devices())[0].platform} devices: compiled in {secs:.1f}s")
  if mem is not None:
    print(f"per device: arguments {gib(mem.argument_size_in_bytes)}, outputs "
          f"{gib(mem.output_size_in_bytes)}, temporaries {gib(mem.temp_size_in_bytes)}, "
          f"aliased (donated) {gib(mem.alias_size_in_bytes)}")
  if FLAGS.table:
    params = {"params": abstract.params}
    rows = sh.describe({"params": shardings.params}, params)
    width = max(len(r[0]) for r in rows)
    for name, shape_, spec in rows:
      print(f"{name:<{width}}  {str(shape_):<22} {spec}")


if __name__ == "__main__":
  if "--fake_devices=0" not in sys.argv and not any(a.startswith("--tpu_topology") for a in sys.argv):
    n = next((a.split("=")[1] for a in sys.argv if a.startswith("--fake_devices=")), "8")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={n}")
  app.run(main)
