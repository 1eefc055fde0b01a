"""One device mesh ('data', 'fsdp', 'tensor') and one logical-axis rules table.

Parameters carry logical axis names as metadata (encoder_jax.model: 'vocab', 'embed',
'embed_out', 'heads', 'kv', 'mlp', 'layers'). `RULES` maps each to a mesh axis (or None =
replicated); the optimizer state inherits its parameter's sharding because optax keeps the
Variable metadata on mu/nu. The batch is split over data x fsdp.

  mesh = make_mesh((1, -1, 1))                          # FSDP over every device
  shardings = state_shardings(jax.eval_shape(init), mesh)
  state = jax.jit(init, out_shardings=shardings)()      # born sharded: no full copy anywhere

A dimension that the mesh axis does not divide is replicated instead (logged once): e.g. a
2-way-head model on a 4-way tensor axis. Each mesh axis is used at most once per array.

Optimizer state sharded over the data axis (`optim_sharding="zero1"`, ZeRO stage 1, Rajbhandari
et al. 2020): parameters stay as the rules place them (replicated under data parallelism) for
the forward and backward pass, while every optimizer-state leaf (Adam's moments, an
accumulation buffer) is split over 'data' on its largest dimension that no other axis splits
and 'data' divides, a token-id dimension only when no other can be (`zero1_spec`). The step
constrains the gradients first to the parameters' own sharding (so the backward pass is the
replicated step's: constrained straight to the split, XLA pushed the split into the backward
pass and all-gathered activations), then to those shardings (`update_shardings`); each device
updates its slice, and the new parameters are all-gathered back to their own sharding: the
fp32 AdamW update (12.9 ms of BERT-base's step on a v5e chip, estimated, replicated; 4.7 ms on
v5e-16 under ZeRO-1) shrinks with the number of data-parallel devices, and so does the
optimizer state's memory.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from encoder_jax.model.activation_sharding import BATCH_AXES  # one definition, used by both

MESH_AXES = ("data", "fsdp", "tensor")
OPTIM_SHARDINGS = ("replicated", "zero1")  # config.optim_sharding
# logical name -> mesh axis. FSDP shards the model dimension of every matrix; tensor
# parallelism shards heads, FFN width and the vocabulary (Megatron-style column/row splits).
RULES: tuple[tuple[str, str | None], ...] = (
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed_out", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
)


def mesh_shape(shape: Sequence[int], n_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with at most one -1, which takes the remaining devices."""
  shape = tuple(int(s) for s in shape)
  if len(shape) != 3:
    raise ValueError(f"mesh shape {shape} must have 3 entries (data, fsdp, tensor).")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh shape {shape}: at most one entry may be -1.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if n_devices % known:
      raise ValueError(f"mesh shape {shape} cannot fill {n_devices} devices.")
    shape = tuple(n_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != n_devices:
    raise ValueError(f"mesh shape {shape} uses {math.prod(shape)} devices but there are "
                     f"{n_devices}; make the product equal or use -1 for one axis.")
  return shape  # type: ignore[return-value]


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  dims = mesh_shape(shape, len(devices))
  return Mesh(np.asarray(devices).reshape(dims), MESH_AXES)


def mesh_from_config(spec: str, devices=None) -> Mesh:
  """`config.mesh` over `devices` (default: jax.devices()): "auto" or "data,fsdp,tensor" (one
  entry may be -1).

  "auto": every device data-parallel on accelerators (TPU/GPU); on CPU one device per
  process, data-parallel across processes (a process's further CPU devices are only the
  tests' fake ones sharing its cores).
  """
  devices = jax.devices() if devices is None else list(devices)
  if spec == "auto":
    if devices[0].platform == "cpu":
      procs = sorted({d.process_index for d in devices})
      firsts = [min((d for d in devices if d.process_index == p), key=lambda d: d.id)
                for p in procs]
      return make_mesh((len(firsts), 1, 1), devices=firsts)
    return make_mesh((-1, 1, 1), devices)
  try:
    shape = tuple(int(x) for x in spec.split(","))
  except ValueError:
    raise ValueError(f"config.mesh={spec!r}: use 'auto' or 'data,fsdp,tensor' sizes such as "
                     "'1,-1,2'.") from None
  return make_mesh(shape, devices)


def logical_to_mesh(logical: P, shape: Sequence[int], mesh: Mesh,
                    rules: Sequence[tuple[str, str | None]] = RULES) -> P:
  """Mesh PartitionSpec for one array from its logical spec and shape."""
  table: Mapping[str, str | None] = dict(rules)
  used: set[str] = set()
  out = []
  for dim, name in zip(shape, tuple(logical) + (None,) * (len(shape) - len(logical))):
    axis = table.get(name) if name is not None else None
    if name is not None and name not in table:
      raise ValueError(f"Logical axis {name!r} has no rule; add it to the sharding rules "
                       f"({[r[0] for r in rules]}).")
    size = mesh.shape[axis] if axis else 1
    if axis is None or size == 1 or axis in used:
      out.append(None)
    elif dim % size:
      logging.log_first_n(logging.INFO, "replicating logical axis %s (size %d) not divisible "
                          "by mesh axis %s (%d)", 20, name, dim, axis, size)
      out.append(None)
    else:
      out.append(axis)
      used.add(axis)
  return P(*out)


def check_optim_sharding(optim_sharding: str) -> str:
  if optim_sharding not in OPTIM_SHARDINGS:
    raise ValueError(f"config.optim_sharding={optim_sharding!r}; use one of {OPTIM_SHARDINGS} "
                     "(zero1: optimizer state and update split over the data axis).")
  return optim_sharding


def zero1_spec(spec: P, shape: Sequence[int], mesh: Mesh, axis: str = "data",
               names: P = P()) -> P:
  """`spec` with `axis` added on the largest dimension that is unsplit and that `axis`
  divides; unchanged when the axis has size 1, is already used, or divides no free dimension
  (e.g. a [2] bias on 16 devices: it stays replicated, a few bytes). `names`, the array's
  logical axes: a "vocab" dimension is split only when no other can be. The embedding lookup
  gathers the table's rows by token id and its gradient scatter-adds them by id; the padded
  table's moments split by id (its largest dimension) made BERT-base's ZeRO-1 step dearer than
  with the unpadded table, whose 30,522 ids 16 does not divide: s128, 64 rows a chip on v5e-16,
  est. 62.47 ms by id, 58.78 ms over the 768 hidden dimension, 58.07 unpadded (XLA's TPU
  cost-model estimates)."""
  n = mesh.shape[axis]
  entries = list(spec) + [None] * (len(shape) - len(spec))
  used = {a for e in entries if e is not None for a in (e if isinstance(e, tuple) else (e,))}
  if n == 1 or axis in used:
    return P(*entries)
  logical = list(names) + [None] * (len(shape) - len(names))
  free = [i for i, (dim, e) in enumerate(zip(shape, entries)) if e is None and dim % n == 0]
  if free:
    entries[max(free, key=lambda i: (logical[i] != "vocab", shape[i], -i))] = axis
  return P(*entries)


def _zero1(shardings: Any, abstract: Any, mesh: Mesh) -> Any:
  names = nnx.get_partition_spec(abstract)  # the logical axes (zero1_spec avoids "vocab")
  return jax.tree.map(
      lambda sh, leaf, logical: NamedSharding(mesh, zero1_spec(
          sh.spec, leaf.shape, mesh, names=logical if isinstance(logical, P) else P()))
      if isinstance(sh, NamedSharding) else sh, shardings, abstract, names,
      is_leaf=lambda x: isinstance(x, (NamedSharding, optax.MaskedNode)))


def state_shardings(abstract_state: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, str | None]] = RULES,
                    optim_sharding: str = "replicated") -> Any:
  """NamedSharding for every leaf of an (abstract) train state / params tree. With
  optim_sharding="zero1" a train state's `opt_state` is split over 'data' (module docstring)."""
  specs = nnx.get_partition_spec(abstract_state)
  # optax.MaskedNode (the state slot of a leaf another transform owns, e.g. a frozen encoder
  # under optax.multi_transform) holds no array: it stays itself.
  masked = lambda x: isinstance(x, optax.MaskedNode)
  out = jax.tree.map(
      lambda spec, leaf: leaf if masked(leaf) else NamedSharding(
          mesh, logical_to_mesh(spec, leaf.shape, mesh, rules)),
      specs, abstract_state, is_leaf=lambda x: isinstance(x, P) or masked(x))
  if check_optim_sharding(optim_sharding) == "zero1":
    if not hasattr(out, "opt_state"):
      raise ValueError("optim_sharding='zero1' shards a train state's opt_state; this tree "
                       "has none.")
    out = out._replace(opt_state=_zero1(out.opt_state, abstract_state.opt_state, mesh))
  return out


def update_shardings(abstract_params: Any, params_shardings: Any, mesh: Mesh,
                     optim_sharding: str = "replicated") -> Any | None:
  """Where the step computes the optimizer update: the parameters' shardings with 'data'
  added (zero1), None when the update runs where the parameters live (replicated)."""
  if check_optim_sharding(optim_sharding) == "replicated":
    return None
  return _zero1(params_shardings, abstract_params, mesh)


def sharded_abstract_state(init_fn, mesh, optim_sharding: str = "replicated"
                           ) -> tuple[Any, Any]:
  """(the state's shapes with their shardings, the shardings): parameters and optimizer state
  follow their logical axis names on `mesh` (the optimizer state also split over 'data' with
  optim_sharding="zero1")."""
  abstract = jax.eval_shape(init_fn)
  shardings = state_shardings(abstract, mesh, optim_sharding=optim_sharding)
  return jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                      abstract, shardings), shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis over data x fsdp; everything else replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def shard_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This host's rows -> global arrays (the global batch is every host's rows in order)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def describe(shardings: Any, abstract_state: Any) -> list[tuple[str, tuple[int, ...], str]]:
  """(path, shape, mesh spec) rows, for the README's sharding table and for logs."""
  rows = []
  flat_s = jax.tree_util.tree_leaves_with_path(shardings,
                                               is_leaf=lambda x: isinstance(x, NamedSharding))
  flat_a = jax.tree.leaves(abstract_state)
  for (path, s), a in zip(flat_s, flat_a):
    # "params/blocks/0/attn/out_bias" (a list index is one more part; nnx's `.value` is none)
    name = jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")
    rows.append((name, tuple(a.shape), str(s.spec)))
  return rows
