"""batch_split (encoder_jax/model/activation_sharding.py): under a mesh with the batch axes it
pins the leading dimension to ('data', 'fsdp') and nothing else; without one it is the
identity. tests/train/test_sharding.py checks what that does to a compiled FSDP step."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from encoder_jax.model.activation_sharding import batch_split


def _constraints(mesh_shape, axis_names, shape):
  """The sharding constraints batch_split traces for an array of `shape` under an abstract
  mesh (the way the train step traces; no devices needed), as PartitionSpecs."""
  mesh = jax.sharding.AbstractMesh(mesh_shape, axis_names)
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(batch_split)(jnp.zeros(shape))
  return [e.params["sharding"].spec for e in jaxpr.eqns
          if e.primitive.name == "sharding_constraint"]


def test_batch_axes_split_the_leading_dimension_only():
  (spec,) = _constraints((2, 2, 2), ("data", "fsdp", "tensor"), (8, 16, 32))
  assert spec == P(("data", "fsdp"), P.UNCONSTRAINED, P.UNCONSTRAINED)


@pytest.mark.parametrize("mesh_shape,names,shape", [
    ((2, 4), ("data", "tensor"), (8, 16)),   # no 'fsdp' axis: not the trainer's mesh
    ((1, 1, 8), ("data", "fsdp", "tensor"), (8, 16)),  # batch axes of size 1: nothing to split
    ((2, 4), ("data", "fsdp"), (6, 16)),     # 6 rows do not divide over 8 devices
])
def test_nothing_is_pinned_where_the_batch_cannot_be_split(mesh_shape, names, shape):
  assert _constraints(mesh_shape, names, shape) == []


def test_identity_without_a_mesh():
  x = jnp.arange(12.0).reshape(3, 4)
  assert batch_split(x) is x
