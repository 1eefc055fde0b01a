r"""Train-step tokens/s: our MLM+NSP and ELECTRA steps vs HF torch `BertForPreTraining`.

  python -m bench.train_step                    # mini (B32x128) and base (B8x128), ~5 min
  python -m bench.train_step --quick            # fewer rounds, ~2 min
  python -m bench.train_step --sizes=mini --rounds=9 --remat_policy=dots

Same work on both sides: BERT MLM on 15% of the tokens (80/10/10) + NSP, fp32, dropout 0.1
(hidden and attention probabilities), AdamW (lr 1e-4, wd 0.01) with clipping at 1.0, the same
batches of real demo-corpus text (SEGMENT-PAIR + NSP rows, BERT uncased vocab of 30,522).
HF gets the batches already corrupted by our rules; ours corrupts on device inside its step.
Every system runs in its own process (bench/systems.py), timed in interleaved rounds
(A B C, C B A, ...); the table shows medians, and "vs HF" is the median of the per-round
ratios, so drift of the shared machine cancels. tokens/s counts every slot of B x T.
"""
from __future__ import annotations

import os
import statistics
import time

from absl import app, flags

from bench import systems
from configs import pretrain as pretrain_config
from encoder_jax.train.setup import resolve_layers

# The remat policy users train scanned layers with (configs/pretrain.py's "auto" as the trainer
# resolves it for scanned layers), read rather than restated. On CPU the pre-training default
# is the "unrolled" row (unrolled layers, no remat).
_CONFIG_REMAT = resolve_layers(True, pretrain_config.model_config("base", "post").remat_policy)[1]

_SIZES = flags.DEFINE_list("sizes", ["mini", "base"], "Model sizes (encoder_jax SIZES keys).")
_BATCH = flags.DEFINE_list("batch_sizes", ["32", "8"], "Batch size per size (same order).")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved rounds (median over rounds).")
_STEPS = flags.DEFINE_integer("steps", 2, "Steps per system per round.")
_QUICK = flags.DEFINE_bool("quick", False, "3 rounds of 1 step: a smoke check, ~2 min.")
_ELECTRA = flags.DEFINE_bool("electra", True, "Also time our ELECTRA step (gen 1/4 width, RTD).")
_HF = flags.DEFINE_bool("hf", True, "Time the HF torch peer (the ratio needs it).")
_THREADS = flags.DEFINE_integer("threads", 2, "torch.set_num_threads for the HF peer.")
_LAYERS = flags.DEFINE_list(
    "layers", ["scan", "unrolled"], "Our MLM+NSP step, a row each: scan = the pre-training "
    "config's layout on TPU/GPU (nnx.scan over stacked blocks with --remat_policy; ~11 s "
    "BERT-base compile) and/or unrolled = its layout on CPU (model.scan_layers=auto resolves "
    "to False there, no remat: no [L, ...] residual/gradient stacks to copy; ~20 s compile). "
    "ELECTRA and --variant rows use the scan setting.")
_REMAT = flags.DEFINE_enum("remat_policy", _CONFIG_REMAT, ["none", "full", "dots", "dots_no_batch"],
                           "Rematerialisation policy per block of the scan row (default: the "
                           "pre-training config's).")
_ATTN_DROP = flags.DEFINE_float("attention_dropout", 0.1, "Attention-probability dropout "
                                "(both systems; BERT uses 0.1).")
_HF_ATTN = flags.DEFINE_enum("hf_attn", "sdpa", ["sdpa", "eager"], "HF attn_implementation.")
_HF_ADAMW = flags.DEFINE_enum("hf_adamw", "default", ["default", "foreach", "fused"],
                              "torch AdamW implementation for the peer.")
_PRECISIONS = flags.DEFINE_list(
    "precisions", ["fp32"], "Any of fp32, bf16, bf16_dots. The bf16 ones add rows with bf16 "
    "matmuls and fp32 parameters / optimizer state, timed against HF under "
    "torch.autocast('cpu', bfloat16) (one HF bf16 row): bf16 = ours with model.dtype=bfloat16 "
    "(configs/pretrain.py precision=bf16: bf16 activations too), bf16_dots = ours with "
    "model.dot_dtype=bfloat16 (precision=bf16_dots: fp32 activations, autocast's split). Worth "
    "it on CPUs with AVX-512 BF16 / AMX (see /proc/cpuinfo).")
_XLA_FLAGS = flags.DEFINE_string("xla_flags", "", "Extra XLA_FLAGS for our workers.")
_VARIANTS = flags.DEFINE_multi_string(
    "variant", [], "LABEL:FIELD=VALUE[;FIELD=VALUE...]: adds a row of our MLM+NSP step with "
    "these bench.systems.StepSpec fields changed, timed in the same interleaved rounds (a "
    "before/after of one change). Fields: remat_policy, scan_layers, attention_dropout, dtype, "
    "xla_flags, src (a directory holding another revision's encoder_jax/, e.g. from `git "
    "archive HEAD~1 encoder_jax | tar -x -C /tmp/old`). Repeatable. Example: "
    "--variant='remat dots:remat_policy=dots' --variant='O1:xla_flags="
    "--xla_backend_optimization_level=1'")
_MFU = flags.DEFINE_bool("mfu", True, "Print MFU: model GFLOP/s over this CPU's fp32 matmul "
                         "rate, measured (2048^2, jax) before every round under the same load; "
                         "its median and range are printed.")
_MAX_FOREIGN = flags.DEFINE_float(
    "max_foreign_load", 0.1, "Share of the cores that processes other than the benchmark's own "
    "may use (measured from /proc for 3 s before the rounds and during each) before the "
    "machine counts as loaded.")
_ALLOW_LOADED = flags.DEFINE_bool(
    "allow_loaded", False, "On a loaded machine, print the 'vs HF' ratios anyway (marked '!') "
    "instead of 'loaded'. Under contention torch's thread pool loses more than XLA, so loaded "
    "ratios flatter us.")


def _flops(spec: systems.StepSpec) -> float:
  from encoder_jax.model.electra import generator_config
  from encoder_jax.train import flops
  cfg = systems.model_config(spec)
  common = dict(batch_size=spec.batch_size, seq_len=spec.seq_len)
  if spec.system == "hf":  # HF's head projects every position onto the vocabulary
    return flops.train_flops_per_step(cfg, objective="mlm", sparse_mlm=False, nsp=True, **common)
  p = systems.objective_config(spec).max_predictions  # the slots the timed step computes
  if spec.objective == "mlm":
    return flops.train_flops_per_step(cfg, objective="mlm", nsp=spec.nsp, max_predictions=p,
                                      **common)
  return flops.train_flops_per_step(cfg, objective="electra", generator=generator_config(cfg),
                                    max_predictions=p, **common)


def parse_variant(text: str) -> tuple[str, dict]:
  """'LABEL:FIELD=VALUE;FIELD=VALUE' -> (label, {field: typed value})."""
  import dataclasses
  label, _, body = text.partition(":")
  if not label or not body:
    raise app.UsageError(f"--variant={text!r}: expected LABEL:FIELD=VALUE[;FIELD=VALUE].")
  types = {f.name: type(f.default) for f in dataclasses.fields(systems.StepSpec)}
  out = {}
  for item in body.split(";"):
    key, _, value = item.partition("=")
    key = key.strip()
    if key not in types or key in ("system", "size", "batch_size", "seq_len", "tag"):
      raise app.UsageError(f"--variant field {key!r} is not a changeable StepSpec field.")
    t = types[key]
    out[key] = (value.lower() in ("1", "true", "yes") if t is bool else
                value if t in (str, type(None)) else t(value))
  return label, out


def specs_for(size: str, batch: int) -> dict[str, systems.StepSpec]:
  base = dict(size=size, batch_size=batch, seq_len=_SEQ.value, threads=_THREADS.value,
              scan_layers=True, remat_policy=_REMAT.value,
              attention_dropout=_ATTN_DROP.value, hf_attn=_HF_ATTN.value,
              hf_adamw=_HF_ADAMW.value, xla_flags=_XLA_FLAGS.value)
  out = {}
  unknown = set(_PRECISIONS.value) - {"fp32", "bf16", "bf16_dots"}
  if unknown:
    raise app.UsageError(f"--precisions: unknown {sorted(unknown)}; use fp32, bf16, bf16_dots.")
  if _HF.value:
    if "fp32" in _PRECISIONS.value:
      out["hf"] = systems.StepSpec(system="hf", **base)
    if {"bf16", "bf16_dots"} & set(_PRECISIONS.value):
      out["hf_bf16"] = systems.StepSpec(system="hf", hf_autocast="bfloat16", **base)
  settings = {"scan": ({}, f" (scan, remat {_REMAT.value})"),
              "unrolled": ({"scan_layers": False, "remat_policy": "none"}, " (unrolled)")}
  for layers in _LAYERS.value:
    changes, tag = settings[layers]
    if "fp32" in _PRECISIONS.value:
      out[f"ours_mlm_{layers}"] = systems.StepSpec(system="ours", objective="mlm", nsp=True,
                                                   tag=tag, **{**base, **changes})
    if "bf16" in _PRECISIONS.value:
      out[f"ours_mlm_{layers}_bf16"] = systems.StepSpec(
          system="ours", objective="mlm", nsp=True, tag=tag + " bf16",
          **{**base, **changes, "dtype": "bfloat16"})
    if "bf16_dots" in _PRECISIONS.value:
      out[f"ours_mlm_{layers}_bf16_dots"] = systems.StepSpec(
          system="ours", objective="mlm", nsp=True, tag=tag + " bf16 dots",
          **{**base, **changes, "dot_dtype": "bfloat16"})
  if _ELECTRA.value:
    out["ours_electra"] = systems.StepSpec(system="ours", objective="electra", nsp=False,
                                           tag=" (scan)", **base)
  for text in _VARIANTS.value:
    label, changes = parse_variant(text)
    out[f"variant {label}"] = systems.StepSpec(
        system="ours", objective="mlm", nsp=True, tag=f" [{label}]", **{**base, **changes})
  return out


def peer_of(name: str, spec: systems.StepSpec) -> str:
  """The HF row a row's 'vs HF' divides by: the one of the same precision."""
  if spec.system == "hf":
    return name
  return "hf_bf16" if "bfloat16" in (spec.dtype, spec.dot_dtype) else "hf"


def run_size(size: str, batch: int, rounds: int, steps: int) -> list[dict]:
  specs = specs_for(size, batch)
  t0 = time.perf_counter()
  batches = systems.load_batches(batch, _SEQ.value, n=4)
  hf_b = (systems.hf_batches(batches, _SEQ.value)
          if any(s.system == "hf" for s in specs.values()) else None)
  workers = {}
  try:
    for name, spec in specs.items():
      workers[name] = systems.Worker(spec, hf_b if spec.system == "hf" else batches,
                                     wait=False)  # build all at once: compiles overlap
    for w in workers.values():
      w.wait_ready()
    print(f"{size} B{batch}x{_SEQ.value}: workers ready in {time.perf_counter() - t0:.0f} s; "
          f"{rounds} rounds x {steps} steps")
    load0 = systems.loadavg()
    meter = systems.ForeignLoad(lambda: [w.pid for w in workers.values()])
    time.sleep(3.0)  # our workers idle: what the rest of the machine uses
    foreign = [meter.cores()]
    peaks = []
    before = (lambda: peaks.append(systems.matmul_peak())) if _MFU.value else None
    wall, cpu = systems.interleaved(workers, rounds, steps, before=before,
                                    between=lambda: foreign.append(meter.cores()))
    infos = {n: w.info() for n, w in workers.items()}
  finally:
    for w in workers.values():
      w.close()
  rows = []
  for name, spec in specs.items():
    tps = [spec.tokens_per_step / s for s in wall[name]]
    row = dict(size=size, batch=f"{batch}x{_SEQ.value}", name=name, label=spec.label,
               step_s=statistics.median(wall[name]), tps=statistics.median(tps),
               cpu_tps=statistics.median(spec.tokens_per_step / c for c in cpu[name]),
               spread=(max(tps) - min(tps)) / statistics.median(tps), flops=_flops(spec),
               info=infos[name], load=f"{load0} -> {systems.loadavg()}",
               peak=statistics.median(peaks) if peaks else None,
               peaks=tuple(peaks), foreign=tuple(foreign))
    peer = peer_of(name, spec)
    if peer in wall:
      row["ratio"] = statistics.median(h / s for s, h in zip(wall[name], wall[peer]))
      row["cpu_ratio"] = statistics.median(h / c for c, h in zip(cpu[name], cpu[peer]))
    rows.append(row)
  return rows


def print_table(rows: list[dict], rounds: int, steps: int):
  print(f"\ntrain step, {time.strftime('%Y-%m-%d')}, this CPU ({os.cpu_count()} cores, shared), "
        f"{'/'.join(_PRECISIONS.value)}, dropout 0.1, AdamW + clip 1.0; median of {rounds} "
        f"interleaved rounds x {steps} steps")
  head = (f"{'size':5s} {'batch':7s} {'system':36s} {'tokens/s':>9s} {'vs HF':>6s} "
          f"{'spread':>6s} {'tok/cpu-s':>9s} {'vs HF':>6s} {'GFLOP/step':>10s} {'GFLOP/s':>8s}")
  peak = any(r["peak"] for r in rows)
  verdicts = {r["size"]: systems.quiet_verdict(list(r["foreign"]), os.cpu_count() or 1,
                                               _MAX_FOREIGN.value) for r in rows}
  if peak:
    head += f" {'MFU':>5s}"
  print(head)
  print("-" * len(head))
  for r in rows:
    ratio = f"{r['ratio']:5.2f}x" if "ratio" in r else "     -"
    cpu_ratio = f"{r['cpu_ratio']:5.2f}x" if "cpu_ratio" in r else "     -"
    if "ratio" in r and not verdicts[r["size"]][0]:  # loaded: no ratio, or a marked one
      ratio, cpu_ratio = ((ratio[:-1] + "!", cpu_ratio[:-1] + "!") if _ALLOW_LOADED.value
                          else ("loaded", "loaded"))
    gflops = r["flops"] / r["step_s"] / 1e9
    line = (f"{r['size']:5s} {r['batch']:7s} {r['label']:36s} {r['tps']:9,.0f} {ratio:>6s} "
            f"{r['spread']:6.0%} {r['cpu_tps']:9,.0f} {cpu_ratio:>6s} {r['flops'] / 1e9:10.1f} "
            f"{gflops:8.1f}")
    if r["peak"]:
      line += f" {gflops * 1e9 / r['peak']:5.0%}"
    print(line)
  for size, load, peaks in sorted({(r["size"], r["load"], r["peaks"]) for r in rows}):
    print(f"{size}: {verdicts[size][1]}; load average (1/5/15 min) {load} (counts our workers)"
          + (f"; fp32 matmul rate before each round: median {statistics.median(peaks) / 1e9:.0f} "
             f"GFLOP/s [{min(peaks) / 1e9:.0f}, {max(peaks) / 1e9:.0f}]" if peaks else ""))
  if not all(q for q, _ in verdicts.values()):
    print("LOADED: other processes used more than --max_foreign_load of the cores, so the "
          "'vs HF' ratios are " + ("marked '!'" if _ALLOW_LOADED.value else
                                   "withheld (--allow_loaded prints them)") + ".")
  print("Notes: 'vs HF' = median over rounds of the per-round ratio (wall tokens/s; then tokens "
        "per CPU-second of the\n  worker process, all its threads). Both sides do MLM on 15% of "
        "the "
        "tokens + NSP; HF projects all T positions\n  onto the 30,522-word vocabulary (its "
        "design), "
        "ours only the max_predictions masked slots (sparse prediction).\n  GFLOP/step counts each "
        "system's own matmuls (6N convention, encoder_jax.train.flops). ELECTRA = generator of\n  "
        "1/4 width + discriminator with RTD at every position, no NSP: not the same work as HF.")


def main(argv):
  del argv
  if not _LAYERS.value or set(_LAYERS.value) - {"scan", "unrolled"}:
    raise app.UsageError(f"--layers={','.join(_LAYERS.value)}: give scan and/or unrolled.")
  rounds, steps = (3, 1) if _QUICK.value else (_ROUNDS.value, _STEPS.value)
  batches = [int(b) for b in _BATCH.value]
  if len(batches) < len(_SIZES.value):
    raise app.UsageError(f"--batch_sizes needs one entry per size in --sizes={_SIZES.value}.")
  rows = []
  for size, batch in zip(_SIZES.value, batches):
    rows += run_size(size, batch, rounds, steps)
  print_table(rows, rounds, steps)
  for r in rows:
    i = r["info"]
    extra = ""
    if "compile_s" in i:
      extra = (f"compile + first step {i['compile_s']:.0f} s, state donated: {i['donated']}, "
               f"host transfers in the step: {i['host_transfer']}, host callbacks: "
               f"{i['host_callbacks']}, ")
    print(f"  {r['size']} {r['label']}: {extra}peak RSS {i['peak_rss'] / 2**30:.2f} GiB, "
          f"last loss {i['loss']:.3f}")


if __name__ == "__main__":
  app.run(main)
