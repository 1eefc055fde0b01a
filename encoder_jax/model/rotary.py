"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer", eq. 34) and the sliding
window of local attention: the two position-dependent parts of a block that vary by layer kind.

RoPE rotates each query and key, per head, by angles proportional to its position, so the
logit q_i . k_j depends on positions only through i - j. Layout: GPT-NeoX's and HF's
"rotate half" (dimension d is paired with d + H/2, frequency index d mod H/2), not RoFormer's
interleaved pairs (2d, 2d + 1); the two are a fixed permutation of the head dimensions apart,
and this one is what HF ModernBERT checkpoints were trained with. Frequencies
theta^(-2d/H), d = 0 .. H/2 - 1, one theta per layer kind (ModernBERT: 160,000 in its global
layers, 10,000 in its local ones).

Which kind a layer is (`ModelConfig.global_layers`) is a Python bool in unrolled stacks and a
traced one inside a scan (the stack scans over it as an input), so everything here takes
either: a Python bool selects statically, a traced one through `jnp.where`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def inv_frequencies(head_dim: int, theta: float) -> np.ndarray:
  """theta^(-2d/H) for d = 0 .. H/2 - 1, [H/2] float32 (computed in float64, rounded once)."""
  return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
          ).astype(np.float32)


def select(is_global, if_global, if_local):
  """`if_global` where the layer is global: statically for a Python bool, else jnp.where."""
  if isinstance(is_global, bool):
    return if_global if is_global else if_local
  return jnp.where(is_global, if_global, if_local)


def rope_angles(positions_BxT: jax.Array, head_dim: int, thetas: tuple[float, float],
                is_global=True) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, T, H/2] in fp32 of positions x frequencies; `thetas` = (global, local)."""
  g, loc = (inv_frequencies(head_dim, t) for t in thetas)
  inv_H2 = jnp.asarray(g) if thetas[0] == thetas[1] else select(is_global, jnp.asarray(g),
                                                                jnp.asarray(loc))
  angles_BxTxH2 = positions_BxT.astype(jnp.float32)[..., None] * inv_H2[None, None, :]
  return jnp.cos(angles_BxTxH2), jnp.sin(angles_BxTxH2)


def apply_rope(x_BxTxNxH: jax.Array, cos_BxTxH2: jax.Array, sin_BxTxH2: jax.Array) -> jax.Array:
  """x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) for x = (x1, x2) halves;
  in fp32, the result in x's dtype (as HF's apply_rotary_pos_emb)."""
  h2 = x_BxTxNxH.shape[-1] // 2
  x = x_BxTxNxH.astype(jnp.float32)
  x1, x2 = x[..., :h2], x[..., h2:]
  cos, sin = cos_BxTxH2[:, :, None, :], sin_BxTxH2[:, :, None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxH.dtype)


def window_band(t: int, s: int, half: int) -> jax.Array:
  """Boolean [1, 1, T, S]: key j is within the local window of query i, |i - j| <= half
  (HF's `sliding_window_bidirectional_overlay` with sliding_window = local_attention // 2).
  By index in the row: inside one packed example that is the distance of its positions."""
  i_Tx1 = jax.lax.broadcasted_iota(jnp.int32, (t, s), 0)
  j_1xS = jax.lax.broadcasted_iota(jnp.int32, (t, s), 1)
  return (jnp.abs(i_Tx1 - j_1xS) <= half)[None, None]
