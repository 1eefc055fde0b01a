r"""Compile the trainer's own step for a pre-training config on a target mesh, without running
it; report per-device memory.

  python -m encoder_jax.train.compile_check \
      --config=configs/pretrain.py:size=base,nsp=nsp --config.data.batch_size=256 \
      --config.mesh=1,4,2 --table
      (8 fake CPU devices are created unless --fake_devices=0 or --tpu_topology is given)

What is compiled is exactly what `python -m encoder_jax.main --mode=pretrain` would run for the
same --config: `loop.build(config)` (model config with the tokenizer's vocab size, objective,
optimizer and schedule, remat, dtype), the state shardings from the parameters' logical axes
(`sharding.state_shardings`), the batch sharding, `step.make_train_step`, and the batch keys,
shapes and dtypes the config's loader yields (`pipeline.batch_spec`). No corpus is built; the
vocabulary is read (fetched and cached like a run does) for its size.

What works where (jax 0.10.2):
  * CPU: any mesh over fake host devices; the numbers are XLA:CPU's buffer assignment, a good
    proxy for argument/parameter bytes, a rough one for temporaries (TPU/GPU fusion differs).
  * TPU without a TPU: in a separate venv with `jax[tpu]==0.10.2` (libtpu),
    --tpu_topology=v4:2x2x1 builds the mesh on
    `jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name=...)` devices.
    Needs libtpu; not exercised in CI.
  * GPU: compile on a GPU host (no abstract GPU topology in jax 0.10).
"""
from __future__ import annotations

import os
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
flags.DEFINE_enum("platform", "tpu", ["tpu", "gpu", "cpu"], "The platform the checked run will "
                  "train on: model.scan_layers/remat_policy=auto take its layout (tpu, gpu: "
                  "scanned layers with dots remat; cpu: unrolled, no remat; configs/pretrain.py).")


def compile_train_step(config, devices=None, platform: str | None = None):
  """Lowers + compiles the trainer's sharded train step for `config` from abstract values, with
  the layer layout of `platform` (default: the devices' own) where config.model says "auto".
  Returns (compiled, setup, state_shardings, abstract_state, mesh, seconds)."""
  import jax

  from encoder_jax.train import loop, sharding, step as step_lib

  s = loop.build(config, platform)
  if devices is None:
    mesh = sharding.mesh_from_config(config.get("mesh", "auto"))
  else:
    spec = config.get("mesh", "auto")
    mesh = sharding.make_mesh((-1, 1, 1) if spec == "auto" else
                              tuple(int(x) for x in spec.split(",")), devices)
  abstract = jax.eval_shape(s.init_fn)
  state_shardings = sharding.state_shardings(abstract, mesh)
  state_in = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          abstract, state_shardings)
  batch_sharding = sharding.batch_sharding(mesh)
  batch_in = loop.abstract_batch(config, batch_sharding)
  train_step = step_lib.make_train_step(s.trainer, state_shardings, batch_sharding)
  t0 = time.perf_counter()
  compiled = train_step.lower(state_in, batch_in).compile()
  return compiled, s, state_shardings, abstract, mesh, time.perf_counter() - t0


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
  mem = compiled.memory_analysis()
  gib = lambda b: f"{b / 2**30:.3f} GiB"
  dims = dict(mesh.shape)
  print(f"{config.size} {s.obj.objective} ({s.obj.sentence_task}) batch "
        f"{config.data.batch_size}x{config.data.max_length} dtype {s.model_cfg.dtype} "
        f"{'scanned' if s.model_cfg.scan_layers else 'unrolled'} layers ({FLAGS.platform}'s), "
        f"remat {s.model_cfg.remat_policy} mesh(data,fsdp,tensor)=({dims['data']},{dims['fsdp']},"
        f"{dims['tensor']}) on {mesh.devices.size} {mesh.devices.flat[0].platform} devices: "
        f"compiled in {secs:.1f}s")
  if mem is not None:
    print(f"per device: arguments {gib(mem.argument_size_in_bytes)}, outputs "
          f"{gib(mem.output_size_in_bytes)}, temporaries {gib(mem.temp_size_in_bytes)}, "
          f"aliased (donated) {gib(mem.alias_size_in_bytes)}")
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
  app.run(main)
