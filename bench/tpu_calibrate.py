"""What XLA's TPU cost model can say about our step (`bench/tpu_aot.py --calibrate`). Every
time here is the compiler's ESTIMATE, never a measurement.

  * Its ceiling: lone bf16 matmuls of the step's shapes on one v5e chip.
  * BERT-base MLM+NSP s128 at 64 rows a chip on v5e-16 (unrolled layers, `dots` remat, the
    program the pod runs), under FSDP, data parallelism and data parallelism with the
    optimizer split over the data axis (ZeRO-1), with the token table padded or not. Beside
    each estimate: XLA's "bytes accessed" (the cost model's sum over the program's accesses,
    fusion internals included: NOT HBM traffic) and the HBM traffic of the compiled program
    (compile_check.hbm_traffic_bytes: HBM-resident operands and results of its top-level ops).
  * The optimizer update alone (the branch of the step that applies AdamW, ZeRO-1's gather
    included) for BERT-base on 4, 16 and 64 v5e chips, replicated and split.
  * Where a long-sequence layer's time goes: BERT-large's attention core at 512 tokens beside
    its FFN and projections on one v5e chip, and the gradients' fp32 all-reduce on v5e-16.
"""
from __future__ import annotations

import datetime
import pathlib

# Google Cloud's v5e spec sheet: 819 GB/s of HBM bandwidth a chip.
V5E_HBM_BYTES_S = 819e9
# The step's estimate before the vocabulary padding and the fp32 embedding gather, same
# libtpu, same config (data parallel, 64 rows a chip, dots, unrolled): the 2026-12-04
# calibration of this file's predecessor.
BEFORE_PADDING_MS = 64.00


def _matmuls(devices, peak) -> list[str]:
  import jax
  import jax.numpy as jnp
  from encoder_jax.train import compile_check as cc
  one = jax.sharding.SingleDeviceSharding(devices[0])
  lines = ["Lone bf16 matmuls (fp32 accumulation) on one v5e chip, est. MFU = 2mkn / (est x "
           "peak):"]
  for m, k, n, what in ((2048, 768, 3072, "BERT-base FFN, 16 rows x 128 a chip"),
                        (8192, 768, 3072, "BERT-base FFN, 64 rows x 128 a chip"),
                        (4096, 1024, 4096, "BERT-large FFN, 8 rows x 512 a chip"),
                        (8192, 8192, 8192, "square 8192")):
    a = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=one)
    b = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=one)
    mm = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32)
                 .astype(jnp.bfloat16)).lower(a, b).compile()
    est = cc.analyze(mm)["optimal_seconds"]
    lines.append(f"  {m}x{k}x{n} ({what}): est {est * 1e6:.1f} us, est MFU "
                 f"{2 * m * k * n / (est * peak):.3f}")
  return lines


def _layouts(devices, peak) -> list[str]:
  from configs import pretrain
  from encoder_jax.train import layout
  from encoder_jax.train import setup
  pricer = layout.Pricer(devices)
  lines = ["", "BERT-base MLM+NSP s128, 64 rows a chip (batch 1024) on v5e-16, unrolled, remat "
           f"dots. 'HBM time' = bytes / {V5E_HBM_BYTES_S / 1e9:.0f} GB/s; XLA's 'bytes "
           "accessed' is not HBM traffic (the cost model's sum over every access, fusion "
           "internals included); HBM traffic = the bytes the compiled program's top-level "
           "ops read and write:"]
  for mesh, optim, pad in (("1,-1,1", "replicated", 128), ("-1,1,1", "replicated", 128),
                           ("-1,1,1", "zero1", 128), ("-1,1,1", "zero1", 1)):
    config = pretrain.get_config("size=base,nsp=nsp")
    config.data.batch_size = 1024
    config.model.vocab_pad_multiple = pad
    lay = layout.Layout(mesh, optim, 64, "dots", False)
    p = pricer.price(config, lay)
    s = setup.build(layout.configure(config, lay, len(devices)), "tpu")
    acc, hbm = p.record.get("bytes_accessed", 0), p.record.get("hbm_traffic_bytes", 0)
    lines.append(
        f"  {lay.describe()}, vocabulary padded to a multiple of {pad}: est step "
        f"{p.est_step_s * 1e3:.2f} ms, est MFU {p.est_mfu:.3f}, {p.hbm_gib:.2f} GiB a chip; "
        f"6N FLOPs at peak {s.flops_per_step / 16 / peak * 1e3:.2f} ms; bytes accessed "
        f"{acc / 2**30:.2f} GiB ({acc / V5E_HBM_BYTES_S * 1e3:.1f} ms), HBM traffic "
        f"{hbm / 2**30:.2f} GiB ({hbm / V5E_HBM_BYTES_S * 1e3:.1f} ms)")
  lines.append(f"  (before the padding and the fp32 embedding gather, data parallel with the "
               f"optimizer replicated, same libtpu: est step {BEFORE_PADDING_MS:.2f} ms)")
  return lines


OPTIMIZER_SLICES = (("v5e:2x2", "v5e-4"), ("v5e:4x4", "v5e-16"), ("v5e:8x8", "v5e-64"))


def _optimizer(size: str = "base", slices=OPTIMIZER_SLICES) -> list[str]:
  from configs import pretrain
  from encoder_jax.train import layout
  from jax.experimental import topologies
  lines = ["", f"The optimizer update alone (AdamW on BERT-{size}'s fp32 parameters, the "
           "step's update branch: ZeRO-1's gather included), est ms:"]
  for topo, name in slices:
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topo).devices
    pricer, figures = layout.Pricer(devices), []
    for optim in ("replicated", "zero1"):
      config = pretrain.get_config(f"size={size},nsp=nsp")
      config.data.batch_size = 16 * len(devices)  # 8 rows a device x 2: the branches exist
      c = layout.configure(config, layout.Layout("-1,1,1", optim, 8, "dots", False),
                           len(devices))
      figures.append(pricer.branch_estimates(c)[0] * 1e3)  # (update, accumulate, bytes)
    lines.append(f"  {name}: replicated {figures[0]:.2f}, ZeRO-1 {figures[1]:.2f}")
  return lines


def _parts(devices, peak, *, rows=16, seq=512, heads=16, head_dim=64, ffn=4096,
           sizes=("base", "large")) -> list[str]:
  """A layer's pieces priced alone, forward + backward, on one chip (BERT-large s512 by
  default): the attention core as the explicit path computes it (scores, fp32 softmax, BERT's
  0.1 dropout with model/dropout.py's mask, weighted sum), the FFN, and the four d x d
  projections; then the gradients' fp32 all-reduce over the slice for each size."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from configs import pretrain
  from encoder_jax.model.dropout import keep_mask
  from encoder_jax.train import layout, setup
  pricer, one = layout.Pricer(devices), jax.sharding.SingleDeviceSharding(devices[0])
  d = heads * head_dim
  x = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=one)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=one)

  def attention(q, k, v, key):
    scores = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32) / head_dim ** 0.5
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    probs = jnp.where(keep_mask(key, probs.shape, 0.1), probs / 0.9, 0).astype(q.dtype)
    return jnp.einsum("bnts,bsnh->btnh", probs, v)

  def grad(f, n):  # forward + backward against a given cotangent (the gradient of a sum
    # would be a constant one, which XLA folds: its backward matmuls become reductions)
    return jax.jit(lambda ct, *a: jax.vjp(lambda *p: f(*p, *a[n:]), *a[:n])[1](ct))
  qkv, rows_d = x(rows, seq, heads, head_dim), x(rows * seq, d)
  parts = (("attention core (QK^T, softmax, dropout, PV)", grad(attention, 3),
            (qkv, qkv, qkv, qkv, key), 3 * 4 * rows * seq * seq * d),
           (f"FFN {d} -> {ffn} -> {d}, GELU", grad(lambda a, w1, w2: jax.nn.gelu(a @ w1) @ w2, 3),
            (rows_d, rows_d, x(d, ffn), x(ffn, d)), 3 * 2 * 2 * rows * seq * d * ffn),
           (f"four {d} x {d} projections (as one {d} x {4 * d})", grad(lambda a, w: a @ w, 2),
            (x(rows * seq, 4 * d), rows_d, x(d, 4 * d)), 3 * 2 * rows * seq * d * 4 * d))
  lines = ["", f"Where a layer's time goes: one layer's pieces alone, forward + backward, "
           f"{rows} rows x {seq} tokens, {heads} heads of {head_dim}, on one v5e chip "
           "(est. MFU = their matmul FLOPs / (est x peak)):"]
  for what, fn, args, flops in parts:
    est = pricer.compiled(fn.lower(*args))[0]["optimal_seconds"]
    lines.append(f"  {what}: est {est * 1e3:.3f} ms, est MFU {flops / (est * peak):.3f}")
  mesh = Mesh(np.asarray(devices), ("data",))
  lines.append(f"The gradients' fp32 all-reduce over {len(devices)} chips (data parallelism: "
               "every step; the step's own collective, priced alone):")
  for size in sizes:
    s = setup.build(pretrain.get_config(f"size={size},nsp=nsp"), "tpu")
    params = jax.tree.leaves(jax.eval_shape(s.init_fn).params)
    split = NamedSharding(mesh, P("data"))
    partial = [jax.ShapeDtypeStruct((len(devices),) + a.shape, a.dtype, sharding=split)
               for a in params]
    reduce = jax.jit(jax.shard_map(lambda *xs: [jax.lax.psum(a[0], "data") for a in xs],
                                   mesh=mesh, in_specs=P("data"), out_specs=P()))
    est = pricer.compiled(reduce.lower(*partial))[0]["optimal_seconds"]
    n = sum(int(np.prod(a.shape)) for a in params)
    lines.append(f"  BERT-{size} ({n / 1e6:.0f}M parameters): est {est * 1e3:.2f} ms")
  return lines


def calibrate(path: pathlib.Path) -> None:
  from encoder_jax.train import flops as flops_lib
  from jax.experimental import topologies
  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:4x4").devices
  peak = flops_lib.peak_flops_per_device(devices[0].device_kind)
  lines = [f"# XLA's TPU cost model, calibrated (bench/tpu_aot.py --calibrate, "
           f"{datetime.date.today()}); every time here is the COMPILER'S ESTIMATE", ""]
  lines += (_matmuls(devices, peak) + _layouts(devices, peak) + _optimizer()
            + _parts(devices, peak))
  path.write_text("\n".join(lines) + "\n")
  print(path.read_text())
