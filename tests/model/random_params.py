"""Random parameters for parity tests: at their initialisers' values (LayerNorm scales of 1,
zero biases) a swapped, skipped or misplaced parameter can hide; random ones show it."""
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def randomize(module: nnx.Module, seed: int,
              std: Callable[[str], float] = lambda name: 0.2) -> None:
  """Every parameter of `module` drawn from numpy's generator of `seed`, in place: norm scales
  1 + std * N(0, 1), every other parameter std * N(0, 1), `std` by the parameter's name."""
  state = nnx.state(module, nnx.Param)
  rng = np.random.default_rng(seed)

  def draw(path, x):
    name = str(path[-1])
    base = 1.0 if name == "scale" else 0.0
    return jnp.asarray(base + std(name) * rng.standard_normal(x.shape), x.dtype)

  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(
      draw, nnx.to_pure_dict(state)))
  nnx.update(module, state)
