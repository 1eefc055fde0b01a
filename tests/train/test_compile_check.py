"""compile_check compiles the trainer's own step (encoder_jax/train/compile_check.py): the batch
it assumes is the batch the loader yields, and its executable runs on real trainer inputs."""
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import loop_helpers as H
from encoder_jax.data import pipeline
from encoder_jax.train import compile_check, loop, setup, sharding

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fmt, task, masking", [("full_sentences", "none", "dynamic"),
                                                ("segment_pair", "nsp", "static")])
def test_batch_spec_is_what_the_loader_yields(env, fmt, task, masking):
  config = H.tiny_config(env)
  config.data.format, config.objective.sentence_task = fmt, task
  config.objective.masking = masking
  batch = next(iter(setup.make_loader(setup.DataSettings.of(config), "train")))
  spec = pipeline.batch_spec(setup.example_config(config), config.data.batch_size,
                             example_ids=masking == "static")
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == spec


def test_compiled_step_runs_on_the_trainers_inputs(env):
  config = H.tiny_config(env)
  config.data.batch_size = 8
  config.mesh = "2,2,2"
  config.objective.sentence_task, config.data.format = "nsp", "segment_pair"
  compiled, s, shardings, _, mesh, _ = compile_check.compile_train_step(config, jax.devices())
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  mem = compiled.memory_analysis()
  assert mem is not None and mem.argument_size_in_bytes > 0
  # The executable takes exactly what the training loop feeds its step: a mismatch in any
  # batch key, shape, dtype or sharding, or in the state's structure, raises here.
  state = loop.initial_state(s.init_fn, shardings)
  loader = setup.make_loader(setup.DataSettings.of(config), "train")
  batch = sharding.shard_batch(next(iter(loader)), mesh)
  _, metrics = compiled(state, batch)
  assert np.isfinite(float(metrics["loss"])) and "nsp_accuracy" in metrics


def test_cli_prints_memory_and_the_sharding_table(env):
  proc = subprocess.run(
      [sys.executable, "-m", "encoder_jax.train.compile_check",
       "--config=configs/pretrain.py:size=tiny,nsp=nsp", "--config.mesh=1,4,2",
       "--config.data.batch_size=16", "--table"],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = proc.stdout
  assert "mesh(data,fsdp,tensor)=(1,4,2) on 8 cpu devices" in out and "per device:" in out
  assert "qkv_kernel" in out and "'tensor'" in out
  # parameter names read as paths: "bert/encoder/blocks/0/attn/out_bias", no key syntax
  names = [line.split()[0] for line in out.splitlines() if "kernel" in line and "P(" in line]
  assert names and all(re.fullmatch(r"[\w/]+", n) for n in names), names
  assert any(re.search(r"/blocks/\d+/attn/qkv_kernel$", n) for n in names), names


# A TPU program's entry computation as XLA prints it (jnp.tanh(x @ y).sum(0) + y[0].sum() on a
# v5e, layouts kept, attributes trimmed): x is prefetched into VMEM (S(1)), the matmul's
# result stays in VMEM, y is read twice from HBM.
_TPU_ENTRY = """
%fused_computation.1 (param_0.10: bf16[256,512]) -> f32[1024] {
  %param_0.10 = bf16[256,512]{1,0:T(8,128)(2,1)S(1)} parameter(0)
}
ENTRY %main.3 (x.1: bf16[256,512], y.1: f32[512,1024]) -> f32[1024] {
  %x.1 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(0), sharding={replicated}
  %copy-start = (bf16[256,512]{1,0:S(1)}, bf16[256,512]{1,0}, u32[]{:S(2)}) copy-start(%x.1)
  %y.1 = f32[512,1024]{1,0:T(8,128)} parameter(1), sharding={replicated}
  %slice_reduce_fusion = f32[]{:T(128)} fusion(%y.1), kind=kLoop, calls=%fused_computation.3
  %copy-done = bf16[256,512]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  %fusion = f32[1024]{0:T(1024)S(1)} fusion(%copy-done, %y.1), kind=kOutput
  ROOT %add_fusion = f32[1024]{0:T(1024)} fusion(%fusion, %slice_reduce_fusion), kind=kLoop
}
"""


def test_hbm_traffic_counts_hbm_operands_and_results_of_top_level_ops():
  x, y = 256 * 512 * 2, 512 * 1024 * 4
  want = (x            # the prefetch reads x from HBM (its VMEM copy is free to read)
          + y + 4      # slice_reduce_fusion reads all of y, writes a scalar
          + y          # the matmul fusion reads y; its result stays in VMEM
          + 4 + 4096)  # the last fusion reads the scalar, writes f32[1024] to HBM
  assert compile_check.hbm_traffic_bytes(_TPU_ENTRY) == want
