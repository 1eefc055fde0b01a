"""Activations keep the batch split over the mesh's batch axes.

Under FSDP a weight is sharded on its model dimension over the same 'fsdp' axis that splits
the batch. A matmul of batch-split activations with an fsdp-split weight can then be
partitioned two ways: all-gather the weight (FSDP's intent: every device computes its own
rows) or all-gather the activations (every device computes the whole global batch). Without a
constraint XLA's partitioner took the second for BERT-base's FFN on a v5e-16 slice: per device
a [12, 256, 512, 3072] bf16 stack, the global batch's FFN activations (9 GiB), and ~16x the
work (bench/tpu_aot.py). Pinning the leading (batch) dimension of the residual stream, the FFN
hidden and the heads' logits to ('data', 'fsdp') leaves the weights as the only thing to
gather. Other dimensions stay unconstrained, so tensor parallelism still splits heads and FFN.

The constraint needs a mesh in context: the train step traces under
`jax.sharding.use_abstract_mesh` (encoder_jax.train.step). Without one (eager calls, tests on
one device, fine-tuning without a mesh) `batch_split` returns its input unchanged.
"""
from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec as P

# The mesh axes that split the batch (encoder_jax.train.sharding builds meshes with them).
BATCH_AXES = ("data", "fsdp")


def batch_split(x: jax.Array) -> jax.Array:
  """`x` with its leading dimension split over the batch axes of the mesh in context."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
    return x
  n = math.prod(mesh.shape[axis] for axis in BATCH_AXES)
  if n == 1 or x.shape[0] % n:
    return x
  return jax.lax.with_sharding_constraint(
      x, P(BATCH_AXES, *([P.UNCONSTRAINED] * (x.ndim - 1))))
