r"""BERT-base train-step throughput and MFU on one GPU, bf16, cuDNN flash attention.

  bash bench/gpu.sh                        # H100/H200: seq 128 and 512, < 5 min
  python -m bench.gpu --dry_run            # the same code on CPU at tiny size, < 1 min
  python -m bench.gpu --seq_lens=512 --batch_sizes=64 --attention=xla --steps=30

What runs: our real MLM+NSP train step (encoder_jax.train.step: on-device masking, sparse MLM
head, AdamW + clipping, donated state) on BERT-base with ModelConfig(dtype="bfloat16",
param_dtype="float32"): matmuls in bf16, parameters, optimizer state, softmax and losses in
fp32. Attention-probability dropout is 0 (the fused kernels have none; hidden dropout stays
0.1), so attention goes through jax.nn.dot_product_attention. jax never picks cuDNN by itself
(implementation=None is XLA), so the model asks for it (ModelConfig.attention_impl="cudnn");
jax hands cuDNN our boolean [B, 1, T, S] mask as an additive bias. If cuDNN refuses (trace or
compile), the script prints why and measures XLA's attention instead. Batches are synthetic
full-length rows ([CLS] A [SEP] B [SEP], random ids): the machine has no network to fetch the
demo corpus, and throughput does not depend on the ids.

MFU = analytic FLOPs of the step (encoder_jax.train.flops: 6N convention, attention included,
sparse MLM head at the trainer's max_predictions, pretraining.default_max_predictions: 20 at
128 tokens, 77 at 512) / step time / the device's dense bf16 peak
(encoder_jax.train.flops.peak_flops_per_device: H100/H200 SXM 989 TFLOP/s).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
import traceback


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dry_run", action="store_true",
                 help="CPU, tiny model, 2 steps per config: checks the script end to end.")
  p.add_argument("--size", default="base", help="Model size (encoder_jax SIZES key).")
  p.add_argument("--seq_lens", default=None,
                 help="Comma-separated sequence lengths (default 128,512; dry run 128).")
  p.add_argument("--batch_sizes", default=None,
                 help="Batch size per sequence length (default 256,64: 32k tokens per step; "
                      "dry run 2).")
  p.add_argument("--steps", type=int, default=20, help="Timed steps per config.")
  p.add_argument("--warmup", type=int, default=3, help="Untimed steps after compiling.")
  p.add_argument("--attention", default="cudnn", choices=["cudnn", "xla", "auto"],
                 help="ModelConfig.attention_impl to try first (falls back to xla).")
  p.add_argument("--compare_xla", action="store_true",
                 help="Also time XLA attention for each config (about doubles the run).")
  p.add_argument("--remat_policy", default="none",
                 choices=["none", "full", "dots", "dots_no_batch"], help="Per-block remat.")
  p.add_argument("--dtype", default="bfloat16", help="Compute dtype (params stay float32).")
  p.add_argument("--budget_s", type=float, default=270.0,
                 help="Skip configs that would start after this many seconds.")
  return p.parse_args(argv)


def synthetic_batch(rng, batch_size: int, seq_len: int):
  """Full-length BERT pair rows: [CLS] A [SEP] B [SEP], ids drawn from the non-special range."""
  import numpy as np
  from encoder_jax.model.config import BERT_VOCAB_SIZE
  ids = rng.integers(1000, BERT_VOCAB_SIZE, size=(batch_size, seq_len), dtype=np.int32)
  mid = seq_len // 2
  ids[:, 0], ids[:, mid], ids[:, -1] = 101, 102, 102
  types = np.zeros_like(ids)
  types[:, mid + 1:] = 1
  return {"input_ids": ids, "mask": np.ones_like(ids, dtype=bool), "token_types": types,
          "nsp_label": rng.integers(0, 2, size=(batch_size,), dtype=np.int32)}


def objective_config(seq_len: int):
  """MLM+NSP on BERT's vocab with the trainer's prediction slots for rows of `seq_len`
  (pretraining.default_max_predictions, as encoder_jax.train.setup.objective_config)."""
  from encoder_jax.model.config import BERT_VOCAB_SIZE
  from encoder_jax.objectives import pretraining
  obj = pretraining.ObjectiveConfig(objective="mlm", sentence_task="nsp",
                                    vocab_size=BERT_VOCAB_SIZE)
  return dataclasses.replace(obj, max_predictions=pretraining.default_max_predictions(
      obj.objective, obj.mask_rate, seq_len))


def build_state(size: str, seq_len: int, args):
  """(cfg, obj, tx parts, state): the state is shared by every attention implementation."""
  import jax
  from encoder_jax.model.config import model_config_for_size
  from encoder_jax.train import optim, step as step_lib
  obj = objective_config(seq_len)
  cfg = model_config_for_size(size, vocab_size=obj.vocab_size, dtype=args.dtype,
                              param_dtype="float32", attention_dropout=0.0,
                              hidden_dropout=0.1, remat_policy=args.remat_policy,
                              max_positions=max(512, seq_len))
  parts = optim.build_optimizer(optim.OptimConfig(learning_rate=1e-4, warmup_steps=100,
                                                  total_steps=10_000))
  _, init = step_lib.create(cfg, obj, parts.tx, parts.schedule, seed=0)
  return cfg, obj, parts, jax.jit(init)()


def measure(built, batch_size, attention, args, peak):
  """Compiles and times one attention implementation; raises if it cannot run."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from encoder_jax.train import flops, step as step_lib
  cfg, obj, parts, state0 = built
  t0 = time.perf_counter()
  cfg = cfg.replace(attention_impl=attention)
  tr, _ = step_lib.create(cfg, obj, parts.tx, parts.schedule, seed=0)
  step = step_lib.make_train_step(tr)
  batch = jax.device_put(synthetic_batch(np.random.default_rng(0), batch_size, args.seq_len))
  compiled = step.lower(state0, batch).compile()
  cudnn_in_hlo = "__cudnn$fmha" in compiled.as_text()
  compile_s = time.perf_counter() - t0
  state = jax.tree.map(jnp.copy, state0)  # the step donates its input; keep state0 for others
  for _ in range(args.warmup):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  t = time.perf_counter()
  for _ in range(args.steps):
    state, metrics = compiled(state, batch)
  jax.block_until_ready(state)
  step_s = (time.perf_counter() - t) / args.steps
  loss = float(metrics["loss"])
  del state
  f = flops.train_flops_per_step(cfg, batch_size=batch_size, seq_len=args.seq_len,
                                 objective="mlm", max_predictions=obj.max_predictions, nsp=True)
  return dict(seq=args.seq_len, batch=batch_size, attention=attention,
              cudnn_in_hlo=cudnn_in_hlo, compile_s=compile_s, step_s=step_s,
              tps=batch_size * args.seq_len / step_s, tflops=f / step_s / 1e12,
              mfu=f / step_s / peak, loss=loss, mem=_peak_memory())


def _peak_memory():
  import jax
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return None
  return stats.get("peak_bytes_in_use")


def main(argv=None):
  args = parse_args(argv)
  t_start = time.perf_counter()
  if args.dry_run:
    # Same code path, tiny sizes: the 512 config differs only in shapes, so one length does.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    args.size, args.steps, args.warmup = "tiny", 2, 1
    args.seq_lens = args.seq_lens or "128"
    args.batch_sizes = args.batch_sizes or ",".join("2" for _ in args.seq_lens.split(","))
  args.seq_lens = args.seq_lens or "128,512"
  args.batch_sizes = args.batch_sizes or "256,64"
  import jax
  import flax
  import optax
  from encoder_jax.train import flops
  dev = jax.devices()[0]
  print(f"device: {dev.device_kind} x{jax.device_count()} ({dev.platform}); jax {jax.__version__}, "
        f"flax {flax.__version__}, optax {optax.__version__}")
  if dev.platform != "gpu" and not args.dry_run:
    print("NOTE: no GPU visible; numbers below are not GPU numbers (use --dry_run on CPU).")
  peak = flops.peak_flops_per_device(dev.device_kind)
  print(f"peak used for MFU: {peak / 1e12:.3g} TFLOP/s "
        f"({'dense bf16 spec' if dev.platform != 'cpu' else 'measured fp32 CPU matmul'})")
  seqs = [int(s) for s in args.seq_lens.split(",")]
  batches = [int(b) for b in args.batch_sizes.split(",")]
  if len(batches) != len(seqs):
    raise SystemExit("--batch_sizes needs one entry per --seq_lens entry.")
  results = []
  for seq_len, batch_size in zip(seqs, batches):
    args.seq_len = seq_len
    built = None
    impls = [args.attention] + (["xla"] if args.compare_xla and args.attention != "xla" else [])
    for impl in impls:
      if time.perf_counter() - t_start > args.budget_s:
        print(f"skip seq {seq_len} {impl}: time budget {args.budget_s:.0f} s spent")
        continue
      built = built or build_state(args.size, seq_len, args)
      try:
        r = measure(built, batch_size, impl, args, peak)
      except Exception as e:  # pylint: disable=broad-except
        if impl == "xla":
          raise
        print(f"NOTE: attention_impl={impl!r} failed at seq {seq_len} "
              f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); falling back to XLA.")
        if os.environ.get("BENCH_GPU_TRACEBACK"):
          traceback.print_exc()
        r = measure(built, batch_size, "xla", args, peak)
        r["attention"] = f"xla (fallback from {impl})"
      if impl != "xla" and not r["cudnn_in_hlo"] and not r["attention"].startswith("xla"):
        r["attention"] += " (no cuDNN fmha in HLO!)"
      results.append(r)
      print(f"  seq {seq_len} B{batch_size} {r['attention']}: {r['tps']:,.0f} tokens/s, "
            f"MFU {r['mfu']:.1%} (compile {r['compile_s']:.0f} s)", flush=True)
  title = "DRY RUN (CPU, tiny; not a measurement)" if args.dry_run else (
      f"{args.size} MLM+NSP train step, {args.dtype} compute / fp32 params, "
      f"mean of {args.steps} steps after {args.warmup} warm-up")
  print(f"\n{title} on {dev.device_kind}, {time.strftime('%Y-%m-%d')}")
  head = (f"{'seq':>4s} {'batch':>5s} {'attention':34s} {'cuDNN fmha':>10s} {'compile s':>9s} "
          f"{'step ms':>8s} {'tokens/s':>10s} {'TFLOP/s':>8s} {'MFU':>6s} {'peak GiB':>8s}")
  print(head)
  print("-" * len(head))
  for r in results:
    mem = f"{r['mem'] / 2**30:8.1f}" if r["mem"] else f"{'-':>8s}"
    print(f"{r['seq']:4d} {r['batch']:5d} {r['attention']:34s} "
          f"{'yes' if r['cudnn_in_hlo'] else 'no':>10s} {r['compile_s']:9.1f} "
          f"{r['step_s'] * 1e3:8.1f} {r['tps']:10,.0f} {r['tflops']:8.1f} {r['mfu']:6.1%} {mem}")
  print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
  main()
