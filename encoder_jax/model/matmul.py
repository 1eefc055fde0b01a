"""The model's matmuls on XLA:CPU's fast bf16 path: bf16 operands, fp32 accumulation.

On CPU, XLA runs a bf16 x bf16 dot whose *result* is bf16 without its fast kernels (measured on
an AMX / AVX-512-BF16 CPU, BERT-base's dense shapes: 0.5-1.0x the fp32 dot), while the same dot
asked for an fp32 result runs 3.6-4.3x faster than fp32 -- but only in the form its YNNPACK
kernels take (a row-major [batch, M, K] lhs and [batch, K, N] rhs); any other dot with that
type signature fails to run ("Unsupported element type for DotThunk"). So `einsum` here

  * casts both operands to bf16 and lays them out in that form itself (transposes behind an
    optimization barrier, which keeps XLA from folding them back into the dot), asks for an
    fp32 result and rounds it once, to the activation dtype or fp32 (logits);
  * has a custom VJP whose two backward dots take the same path (autodiff of the forward
    would multiply an fp32 cotangent by a bf16 operand: the slow path again);
  * runs the dots that path refuses (a side of length 1, every side < 8) in fp32.

Numerically this is what TPUs, GPU BLAS and torch's CPU autocast do: bf16 products summed in
fp32. `bf16_dots(cfg)` says whether a model takes this path: ModelConfig.dot_dtype="bfloat16"
(with fp32 activations: torch.autocast's split, the fastest on CPU, bench/README.md) on any
platform, or a bf16 model (dtype="bfloat16") on CPU, whose native bf16 dots would be slower
than fp32. fp32 models never take it: they trace exactly the ops they did before.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

BF16 = jnp.dtype(jnp.bfloat16)


@functools.cache
def cpu_has_bf16() -> bool:
  """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX-BF16, from
  /proc/cpuinfo; False where that file is missing). Without them XLA's bf16 dots are
  emulated and no faster than fp32."""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  except OSError:
    return False
  return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_dots(dot_dtype: str, dtype, backend: str | None = None) -> bool:
  """Whether a model with ModelConfig `dot_dtype` and compute `dtype` runs its matmuls through
  `einsum`'s bf16 fp32-accumulating path (module docstring): always for "bfloat16"; for "auto"
  on a CPU backend whose CPU has bf16 instructions (`cpu_has_bf16`), never elsewhere; and for a
  bf16 model on CPU, whose native bf16-result dots are slower than fp32."""
  if dot_dtype == "bfloat16":
    return True
  on_cpu = (backend or jax.default_backend()) == "cpu"
  if dot_dtype == "auto":
    return on_cpu and cpu_has_bf16()
  return jnp.dtype(dtype) == BF16 and on_cpu


def describe_dots(dot_dtype: str, dtype, backend: str | None = None) -> str:
  """One line for the start-up log: how the model's matmuls run, and why."""
  backend = backend or jax.default_backend()
  why = f"model.dot_dtype={dot_dtype!r}, dtype={jnp.dtype(dtype).name} on {backend}"
  if dot_dtype == "auto" and backend == "cpu":
    why += f", {'a' if cpu_has_bf16() else 'no'} CPU with AVX-512 BF16 / AMX-BF16"
  if bf16_dots(dot_dtype, dtype, backend):
    return f"matmuls: bf16 operands, fp32 accumulation, forward and backward ({why})"
  return f"matmuls: in {jnp.dtype(dtype).name} ({why})"


def _transpose_specs(spec: str) -> tuple[str, str]:
  """The einsum specs of the two operands' gradients (cotangent with the other operand)."""
  ins, out = spec.replace(" ", "").split("->")
  a, b = ins.split(",")
  for name, s, other in (("first", a, b), ("second", b, a)):
    # Each operand's gradient is an einsum of the cotangent with the other operand, which needs
    # every index of this operand in the output or the other operand, each once.
    lost = [i for i in s if i not in out and i not in other]
    if lost or len(set(s)) != len(s) or "." in s:
      raise ValueError(f"einsum spec {spec!r}: the {name} operand's indices {s!r} must each "
                       "appear once and also in the output or the other operand (no ellipsis)")
  return f"{out},{b}->{a}", f"{a},{out}->{b}"


def _plan(sx, sy, out, size):
  """Transposes that put a 2-operand einsum into XLA:CPU's fast-path form: lhs [batch, M, K],
  rhs [batch, K, N], result [batch, M, N], all row-major. Returns (bytes moved, swap, lhs perm,
  rhs perm, result perm) for the cheaper of the two operand orders."""
  batch = [i for i in out if i in sx and i in sy]
  contract = [i for i in sx if i in sy and i not in out]
  plans = []
  for swap, (sl, sr) in ((False, (sx, sy)), (True, (sy, sx))):
    fl, fr = [i for i in sl if i not in sr], [i for i in sr if i not in sl]
    lhs = [sl.index(i) for i in batch + fl + contract]
    rhs = [sr.index(i) for i in batch + contract + fr]
    res_order = batch + fl + fr
    res = [res_order.index(i) for i in out]
    cost = sum(math.prod(size[i] for i in idx)
               for idx, perm in ((sl, lhs), (sr, rhs), (out, res)) if perm != sorted(perm))
    plans.append((cost, swap, lhs, rhs, res, (batch, fl, contract, fr)))
  return min(plans, key=lambda plan: plan[0])


def _transposed(x, perm):
  if perm == sorted(perm):
    return x
  # The barrier keeps XLA from folding the transpose back into the dot's dimension numbers,
  # which would take the dot off the fast path (XLA:CPU's YNNPACK dot needs a row-major
  # [M, K] lhs and [K, N] rhs; the fallback has no bf16 x bf16 -> fp32 kernel at all).
  return jax.lax.optimization_barrier(jnp.transpose(x, perm))


def _acc(spec, x, y, dtype):
  """einsum(spec, x, y) with fp32 accumulation, rounded to `dtype`, as one canonical batched
  dot on the fast path; dots that path refuses (a vector side, all sides < 8) run in fp32."""
  ins, out = spec.split("->")
  sx, sy = ins.split(",")
  size = {**dict(zip(sx, x.shape)), **dict(zip(sy, y.shape))}
  _, swap, lhs_perm, rhs_perm, res_perm, (batch, fl, contract, fr) = _plan(sx, sy, out, size)
  prod = lambda idx: math.prod(size[i] for i in idx)
  b, m, k, n = prod(batch), prod(fl), prod(contract), prod(fr)
  if min(m, n) == 1 or max(m, k, n) < 8:
    return jnp.einsum(spec, x.astype(jnp.float32), y.astype(jnp.float32)).astype(dtype)
  lhs, rhs = (y, x) if swap else (x, y)
  lhs = _transposed(lhs, lhs_perm).reshape(b, m, k)
  rhs = _transposed(rhs, rhs_perm).reshape(b, k, n)
  res = jax.lax.dot_general(lhs, rhs, (((2,), (1,)), ((0,), (0,))),
                            preferred_element_type=jnp.float32)
  res = res.reshape([size[i] for i in batch + fl + fr])
  if res_perm != sorted(res_perm):
    res = jnp.transpose(jax.lax.optimization_barrier(res), res_perm)
  return res.astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _einsum_f32(spec: str, a: jax.Array, b: jax.Array, out_dtype) -> jax.Array:
  return _acc(spec, a, b, out_dtype)


def _einsum_f32_fwd(spec, a, b, out_dtype):
  return _acc(spec, a, b, out_dtype), (a, b)


def _einsum_f32_bwd(spec, out_dtype, res, g):
  del out_dtype
  a, b = res  # both bf16
  grad_a, grad_b = _transpose_specs(spec)
  g = g.astype(BF16)  # the cotangent of an fp32 result is rounded to bf16, as the operands
  return _acc(grad_a, g, b, a.dtype), _acc(grad_b, a, g, b.dtype)


_einsum_f32.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)


def einsum(spec: str, a: jax.Array, b: jax.Array, *, bf16: bool, out_dtype=None) -> jax.Array:
  """`jnp.einsum(spec, a, b)` (as `.astype(out_dtype)` when given), or with `bf16` the dot of
  both operands rounded to bf16 with fp32 accumulation, forward and backward (module
  docstring), its result in `out_dtype` (default `a`'s dtype, the activations')."""
  if not bf16:
    out = jnp.einsum(spec, a, b)
    return out if out_dtype is None else out.astype(out_dtype)
  _transpose_specs(spec)  # refuse a spec whose backward cannot be an einsum, at trace time
  return _einsum_f32(spec, a.astype(BF16), b.astype(BF16), jnp.dtype(out_dtype or a.dtype))


def linear_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                       out_sharding=None):
  """A `dot_general` for nnx.Linear (its `dot_general=` argument) through `einsum`'s bf16
  path: Linear contracts the input's last axis with the kernel's first, nothing else."""
  (lc, rc), (lb, rb) = dimension_numbers
  if tuple(lc) != (lhs.ndim - 1,) or tuple(rc) != (0,) or lb or rb or rhs.ndim != 2:
    raise ValueError(f"linear_dot_general: only nnx.Linear's contraction; got {dimension_numbers}")
  del precision, preferred_element_type, out_sharding  # the path fixes fp32 accumulation
  rows = "abcdefgh"[:lhs.ndim - 1]
  return einsum(f"{rows}i,io->{rows}o", lhs, rhs, bf16=True)
