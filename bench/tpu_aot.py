r"""The trainer's real step compiled ahead of time for TPU topologies, on a CPU: memory, cost
model, collectives. Every time figure here is the compiler's ESTIMATE, never a measurement.

  bash run.sh tpu python bench/tpu_aot.py --extra=best --update_readme=launch/README.md
                                     # the committed table: bench/results/tpu_aot.*
  bash run.sh tpu python bench/tpu_aot.py --rows=ci         # what CI compiles (4 programs)
  bash run.sh tpu python bench/tpu_aot.py --rows=goal --extra=best   # + the searched variants

`run.sh tpu` runs inside the project's venv with libtpu (the TPU compiler, `jax[tpu]` at the
pinned jax) on the path; no TPU is needed: `jax.experimental.topologies.get_topology_desc`
gives compile-only TPU devices to build the mesh on. What is compiled is exactly the step of
`python -m encoder_jax.main --mode=pretrain` for the same config (encoder_jax.train.
compile_check.compile_train_step), with every "auto" resolved for the TPU (bf16 compute,
scanned layers with dots remat, the attention path the TPU takes).

Per row (one config x topology x mesh x batch):
  * hbm_gib: live bytes per device at the step's peak (arguments + temporaries + outputs
    that reuse no donated buffer), from XLA's buffer assignment, against the device's HBM:
    `fits` says whether it fits with 5% headroom for the runtime.
  * xla_tflops: the compiler's FLOP count of the step (all devices); ours: the analytic 6N
    count the trainer's MFU uses (encoder_jax.train.flops; matmuls only).
  * est_step_ms: `optimal_seconds` of XLA's TPU cost model, the compiler's estimate of the
    step's time on one device. The cost model counts a while loop's body once, so for the
    scanned layers the pod runs it sees one layer of L: the estimate (and xla_tflops) come
    from the same step compiled with unrolled layers (same maths and remat recompute, other
    layout), while memory and collectives are the scanned program's. The cost model prices
    each custom call it has no model for (ConcatBitcast, X64Combine) at exactly -1 s; we
    add those back (checked: a step with k of them reads -k + a fraction of a second).
    est_tok_s_chip and est_mfu follow from it (MFU against the chip's dense bf16 peak,
    encoder_jax.train.flops).
  * collectives: all-reduce (AR), reduce-scatter (RS), all-gather (AG) counts in the
    partitioned HLO; `expected` says what the mesh should produce (data parallelism: the
    gradients' AR or RS; FSDP: the parameters' AG and the gradients' RS).
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import math
import os
import pathlib
import re
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("rows", "table", ["ci", "goal", "table", "all", "smoke"], "smoke: a tiny "
                  "BERT (2 x 128) at seq 64 on v5e-4, searched variants included with "
                  "--extra=best: the whole command in seconds (the README's CPU check of it); "
                  "ci: BERT-base MLM+NSP "
                  "and ELECTRA-base at seq 128 on v4-8 and v5e-16 (what .ci/run compiles); "
                  "goal: BERT-base s128 and BERT-large s512 on v5e-16; table (the committed "
                  "one, ~1 h on 2 cores): BERT/ELECTRA base/large x seq 128/512 on v5e-16, "
                  "BERT-base s128 on v4-8, v4-32, v5e-64, v5p-8 and BERT-large s512 on v4-32 "
                  "and v5p-8; all: every model x seq on all five slices (~2 h).")
flags.DEFINE_enum("extra", "none", ["none", "best"], "best: also the variants searched "
                  "for a higher estimated MFU (per-chip batch, dropout, attention kernel) for "
                  "the goal rows (BERT-base s128 and BERT-large s512 on v5e-16).")
flags.DEFINE_string("out", "bench/results/tpu_aot", "Writes <out>.csv (resumable: rows "
                    "already there are skipped) and <out>.md (the table).")
flags.DEFINE_string("update_readme", "", "Also replace the table between the tpu_aot markers "
                    "of this file (launch/README.md) with the launcher rows and the best "
                    "searched variant of each.")
flags.DEFINE_bool("estimate", True, "Also compile each scanned step unrolled for XLA's cost "
                  "model (it counts a loop body once); --noestimate: memory and collectives "
                  "only, half the compile time.")
flags.DEFINE_bool("calibrate", False, "Instead of the table: what XLA's TPU cost model "
                  "predicts for lone bf16 matmuls of the step's shapes on one v5e chip (the "
                  "ceiling its estimate of a whole step can reach) and for BERT-base s128 "
                  "(64 rows a chip, unrolled) under FSDP vs pure data parallelism; writes "
                  "<out>_calibration.txt.")
flags.DEFINE_bool("check", False, "Exit non-zero unless every compiled row is the TPU's "
                  "program (bf16, scanned layers) and fits in HBM (what CI asserts).")

# HBM per chip (GiB), from the vendors' spec sheets; the dense bf16 peak per chip is
# encoder_jax.train.flops.peak_flops_per_device's. A compile-only v4 topology exposes each
# TensorCore as a device (2 per chip), v5e one device per chip, v5p one per chip (megacore).
CHIP_HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5": 95, "TPU v6 lite": 32}
TOPOLOGIES = {  # name in the table -> libtpu topology name
    "v4-8": "v4:2x2x1", "v4-32": "v4:2x2x4", "v5e-16": "v5e:4x4", "v5e-64": "v5e:8x8",
    "v5p-8": "v5p:2x2x1", "v5e-4": "v5e:2x2",
}
FIELDS = ("model", "seq", "topology", "variant", "mesh_arg", "mesh", "batch", "remat", "dropout",
          "attention", "program", "compile_s", "hbm_gib", "hbm_cap_gib", "fits", "xla_tflops",
          "ours_tflops", "est_step_ms", "est_tok_s_chip", "est_mfu", "collectives", "expected",
          "error")


@dataclasses.dataclass(frozen=True)
class Row:
  model: str  # "bert-base" | "bert-large" | "electra-base" | "electra-large"
  seq: int
  topology: str
  variant: str = "launcher"  # the launcher's mesh and batch, or a searched one
  mesh: str = "1,-1,1"  # launch/README.md: FSDP over the slice
  batch: int = 256  # global; BERT's 256 sequences a step (both phases)
  remat: str = "auto"
  dropout: str = "bert"  # configs/pretrain.py dropout=: bert keeps attention dropout (explicit)
  attention: str = "auto"  # model.attention_impl; auto without attention dropout: Pallas

  def key(self) -> tuple:
    return tuple(str(getattr(self, f.name)) for f in dataclasses.fields(self))


# The goal: BERT-base s128 and BERT-large s512 on v5e at >= 55% MFU.
GOAL = (Row("bert-base", 128, "v5e-16"), Row("bert-large", 512, "v5e-16"))
SMOKE = (Row("bert-tiny", 64, "v5e-4", batch=32),)


# ELECTRA-large's unrolled twin (24 discriminator + 24 generator layers with dots remat) needs
# more than a 24 GiB host to compile (the kernel killed it): memory and collectives only.
NO_TWIN = {"electra-large"}


def config_arg(model: str, seq: int) -> str:
  size = model.split("-")[1]
  obj = "objective=electra,nsp=none" if model.startswith("electra") else "nsp=nsp"
  return f"size={size},{obj}"


def rows(which: str, extra: str) -> list[Row]:
  if which == "ci":
    base = [Row(m, 128, t) for t in ("v4-8", "v5e-16") for m in ("bert-base", "electra-base")]
  elif which == "smoke":
    base = list(SMOKE)
  elif which == "goal":
    base = list(GOAL)
  elif which == "table":  # the goal rows first: a run cut short still has them
    base = list(GOAL) + [Row(m, s, "v5e-16") for s in (128, 512)
                         for m in ("bert-base", "electra-base", "bert-large", "electra-large")
                         if Row(m, s, "v5e-16") not in GOAL]
    base += [Row("bert-base", 128, t) for t in TOPOLOGIES if t != "v5e-16"]
    base += [Row("bert-large", 512, t) for t in ("v5p-8", "v4-32")]
  else:
    base = [Row(m, s, t) for t in TOPOLOGIES for s in (128, 512)
            for m in ("bert-base", "electra-base", "bert-large", "electra-large")]
  out = []
  for r in base:
    out.append(r)
    if extra != "best" or r not in GOAL + SMOKE:
      continue
    # The launcher's 256 rows spread over a slice are few per chip; the searched variants
    # raise the per-chip batch (fixed global batch is a recipe choice, not the hardware's)
    # and compare FSDP with pure data parallelism (the model and its optimizer replicated).
    chips = _chips(r.topology)
    # no_attention (MosaicBERT's dropout: none on the probabilities) lets the TPU run the
    # Pallas flash kernel; the same with attention_impl=xla is the kernel's comparison.
    for per_chip, mesh, remat, dropout, attention in (
        (32, "-1,1,1", "auto", "bert", "auto"), (32, "1,-1,1", "auto", "bert", "auto"),
        (32, "1,-1,1", "auto", "no_attention", "auto"),
        (32, "1,-1,1", "auto", "no_attention", "xla")):
      if r.seq == 512:
        per_chip //= 4
      out.append(dataclasses.replace(r, variant="searched", mesh=mesh, batch=per_chip * chips,
                                     remat=remat, dropout=dropout, attention=attention))
  return out


def _chips(topology: str) -> int:
  name = TOPOLOGIES[topology].split(":")[1]
  chips = math.prod(int(x) for x in name.split("x"))
  return chips


def devices_of(topology: str):
  from jax.experimental import topologies
  return topologies.get_topology_desc(platform="tpu",
                                      topology_name=TOPOLOGIES[topology]).devices


def expected_collectives(mesh_shape: dict) -> str:
  want = []
  if mesh_shape["data"] > 1:
    want.append("AR/RS of gradients (data)")
  if mesh_shape["fsdp"] > 1:
    want.append("AG of params + RS of gradients (fsdp)")
  if mesh_shape["tensor"] > 1:
    want.append("AR of activations (tensor)")
  return "; ".join(want) or "none"


def compile_row(r: Row) -> dict:
  from configs import pretrain
  from encoder_jax.train import compile_check as cc
  from encoder_jax.train import flops as flops_lib

  config = pretrain.get_config(f"{config_arg(r.model, r.seq)},dropout={r.dropout}")
  # Rows of 512 as BERT's phase 2 trains them (the phase-2 config also restarts the schedule
  # from a phase-1 checkpoint, which does not change the compiled step).
  config.data.max_length = r.seq
  config.data.batch_size = r.batch
  config.mesh = r.mesh
  if r.remat != "auto":
    config.model.remat_policy = r.remat
  config.model.attention_impl = r.attention
  devices = devices_of(r.topology)
  chips = len({tuple(d.coords) for d in devices})
  compiled, s, _, _, mesh, secs = cc.compile_train_step(config, devices)
  a = cc.analyze(compiled)
  cost = a if not s.model_cfg.scan_layers else {}
  if s.model_cfg.scan_layers and FLAGS.estimate and r.model not in NO_TWIN:
    # XLA's cost model counts a while loop's body once, not once per trip: for scanned layers
    # its FLOPs and optimal_seconds cover one layer of L. The same step with unrolled layers
    # (the same maths; only the program's layout differs) gives the whole step's cost.
    config.model.scan_layers = "False"  # the config field is a string ("auto")
    config.model.remat_policy = s.model_cfg.remat_policy  # and the recompute it pays for
    cost = cc.analyze(cc.compile_train_step(config, devices)[0])
  kind = devices[0].device_kind
  per_device_share = chips / len(devices)  # a v4 device is half a chip
  hbm_cap = CHIP_HBM_GIB[kind] * per_device_share
  hbm = a["peak_bytes"] / 2**30
  est = cost.get("optimal_seconds")
  out = dict(
      program=cc.describe_program(s.model_cfg), compile_s=round(secs, 1),
      mesh=",".join(str(v) for v in mesh.shape.values()), hbm_gib=round(hbm, 2),
      hbm_cap_gib=round(hbm_cap, 1), fits=hbm <= 0.95 * hbm_cap,
      xla_tflops=round(cost["xla_flops"] * len(devices) / 1e12, 2) if cost else None,
      ours_tflops=round(s.flops_per_step / 1e12, 2),
      collectives=" ".join(f"{k[2:].replace('_', '-')}:{v}" for k, v in a.items()
                           if k.startswith("n_")) or "none",
      expected=expected_collectives(dict(mesh.shape)))
  if est is not None and est > 0:
    peak = flops_lib.peak_flops_per_device(kind)  # per chip (flops' table), also for v4
    out.update(est_step_ms=round(est * 1e3, 2),
               est_tok_s_chip=round(r.batch * r.seq / est / chips),
               est_mfu=round(s.flops_per_step / (est * chips * peak), 3))
  return out


def _out_of_memory(error: str) -> dict:
  """The compiler refuses a step that cannot fit ("Ran out of memory on HBM ... required for
  HLO temporaries (33.44G) exceeds available HBM (15.75G)"): a result, not a failure."""
  m = re.search(r"HLO temporaries \(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", error)
  if not m:
    return {}
  return dict(fits=False, hbm_gib=f">{m.group(1)}", hbm_cap_gib=m.group(2),
              program="(refused by the compiler: out of HBM)")


README_BEGIN, README_END = "<!-- tpu_aot table: begin -->", "<!-- tpu_aot table: end -->"


def launcher_summary(table: list[dict]) -> str:
  """The launcher rows and the best searched variant of each, for launch/README.md."""
  lines = ["| model | seq | slice | mesh | batch | remat, dropout, attention | HBM/device (GiB) "
           "| fits | est. MFU | est. tokens/s/chip |", "|---|---|---|---|---|---|---|---|---|---|"]
  def fmt(row):
    return (f"| {row['model']} | {row['seq']} | {row['topology']} | {row.get('mesh', '')} | "
            f"{row['batch']} | {row['remat']}, {row.get('dropout', '')}, "
            f"{row.get('attention', '')} | "
            f"{row.get('hbm_gib', '')} / {row.get('hbm_cap_gib', '')} | {row.get('fits', '')} | "
            f"{row.get('est_mfu') or '-'} | {row.get('est_tok_s_chip') or '-'} |")
  groups: dict[tuple, list[dict]] = {}
  for row in table:
    groups.setdefault((row["model"], str(row["seq"]), row["topology"]), []).append(row)
  for rows_ in groups.values():
    for row in rows_:
      if row["variant"] == "launcher":
        lines.append(fmt(row))
    fitting = [r for r in rows_ if r["variant"] != "launcher" and str(r.get("fits")) == "True"
               and r.get("est_mfu")]
    if fitting:
      best = max(fitting, key=lambda r: float(r["est_mfu"]))
      lines.append(fmt(best).replace(f"| {best['topology']} |",
                                     f"| {best['topology']} (best searched) |", 1))
  return "\n".join(lines)


def update_readme(path: pathlib.Path, table: list[dict]) -> None:
  text = path.read_text()
  if README_BEGIN not in text or README_END not in text:
    raise SystemExit(f"{path} has no {README_BEGIN} ... {README_END} block to replace.")
  head, rest = text.split(README_BEGIN, 1)
  _, tail = rest.split(README_END, 1)
  path.write_text(f"{head}{README_BEGIN}\n{launcher_summary(table)}\n{README_END}{tail}")


def write_md(path: pathlib.Path, table: list[dict]) -> None:
  cols = ("model", "seq", "topology", "variant", "mesh", "batch", "remat", "dropout",
          "attention", "program", "compile_s",
          "hbm_gib", "hbm_cap_gib", "fits", "xla_tflops", "ours_tflops", "est_step_ms",
          "est_tok_s_chip", "est_mfu", "collectives", "expected")
  lines = [f"# The pre-training step compiled for TPU topologies (bench/tpu_aot.py, "
           f"{datetime.date.today()})", "",
           "Compiled on a CPU with libtpu; no TPU ran. `est_*` columns are the COMPILER'S "
           "ESTIMATES (XLA's TPU cost model), not measurements. hbm_gib: live bytes per "
           "device at the step's peak; xla/ours_tflops: FLOPs of one step (all devices); "
           "est_mfu: our 6N FLOPs / (est_step x chips x the chip's dense bf16 peak). "
           "Scanned rows' estimates come from an unrolled twin with the same remat. "
           "collectives: ops in the partitioned HLO (a loop body counted once); on 16+ "
           "devices XLA writes FSDP's parameter all-gathers and gradient reduce-scatters "
           "inside the layers as async rings of collective-permutes (both directions), "
           "so few reduce-scatters appear by name. compile_s: wall-clock on a "
           "2-core CPU host (scanned program only). ELECTRA-large rows have no estimate: "
           "their unrolled twin does not compile within a 24 GiB host.", "",
           "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for row in table:
    if row.get("error"):
      lines.append(f"| {row['model']} | {row['seq']} | {row['topology']} | {row['variant']} | "
                   f"{row['mesh']} | {row['batch']} | {row['remat']} | error: "
                   f"{row['error'][:120]} |")
      continue
    lines.append("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
  programs = sorted({row["program"] for row in table if row.get("program")})
  lines += ["", "Programs compiled: " + "; ".join(programs)]
  path.write_text("\n".join(lines) + "\n")


def calibrate(path: pathlib.Path) -> None:
  """Where the cost model's estimate of a step goes (every figure a compiler ESTIMATE)."""
  import jax
  import jax.numpy as jnp
  from configs import pretrain
  from encoder_jax.train import compile_check as cc
  from encoder_jax.train import flops as flops_lib
  devices = devices_of("v5e-16")
  peak = flops_lib.peak_flops_per_device(devices[0].device_kind)
  one = jax.sharding.SingleDeviceSharding(devices[0])
  lines = [f"# XLA's TPU cost model, calibrated (bench/tpu_aot.py --calibrate, "
           f"{datetime.date.today()}); every time here is the COMPILER'S ESTIMATE", "",
           "Lone bf16 matmuls (fp32 accumulation) on one v5e chip, est. MFU = 2mkn / (est x "
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
  hbm_bw = 819e9  # v5e HBM bandwidth, bytes/s (Google Cloud's v5e spec sheet)
  lines += ["", "BERT-base MLM+NSP s128, batch 1024 on v5e-16 (unrolled layers); 'HBM time' = "
            "XLA's bytes accessed per chip / 819 GB/s (v5e's HBM bandwidth):"]
  for mesh, remat, dropout, attention in (
      ("1,-1,1", "dots", "bert", "auto"), ("-1,1,1", "dots", "bert", "auto"),
      ("-1,1,1", "none", "bert", "auto"), ("-1,1,1", "none", "none", "xla")):
    config = pretrain.get_config(f"size=base,nsp=nsp,dropout={dropout}")
    config.data.batch_size, config.mesh = 1024, mesh
    config.model.scan_layers = "False"  # (the cost model counts a loop body once)
    config.model.remat_policy = remat  # dots: what the scanned TPU program runs
    config.model.attention_impl = attention
    compiled, s, *_ = cc.compile_train_step(config, devices)
    a = cc.analyze(compiled)
    est = a["optimal_seconds"]
    lines.append(f"  mesh {mesh}, remat {remat}, dropout {dropout}, attention {attention}: est "
                 f"step "
                 f"{est * 1e3:.2f} ms, est MFU {s.flops_per_step / (est * 16 * peak):.3f}; 6N "
                 f"matmul FLOPs at peak {s.flops_per_step / 16 / peak * 1e3:.2f} ms; bytes "
                 f"accessed {a['bytes_accessed'] / 2**30:.2f} GiB/chip = HBM time "
                 f"{a['bytes_accessed'] / hbm_bw * 1e3:.2f} ms")
  path.write_text("\n".join(lines) + "\n")
  print(path.read_text())


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  if FLAGS.calibrate:
    calibrate(out.with_name(out.name + "_calibration.txt"))
    return
  csv_path, md_path = out.with_suffix(".csv"), out.with_suffix(".md")
  done: dict[tuple, dict] = {}
  if csv_path.exists():
    with csv_path.open() as f:
      for row in csv.DictReader(f):
        # mesh_arg: the --config.mesh asked for ("1,-1,1"); mesh: what it resolved to
        done[tuple(row["mesh_arg" if f.name == "mesh" else f.name]
                   for f in dataclasses.fields(Row))] = row
  todo = rows(FLAGS.rows, FLAGS.extra)
  table, bad = [], []
  t0 = time.perf_counter()
  for i, r in enumerate(todo):
    if r.key() in done:
      table.append(done[r.key()])
      continue
    row = dict(dataclasses.asdict(r), mesh_arg=r.mesh)
    try:
      row.update(compile_row(r))
    except Exception as err:  # noqa: BLE001 -- a row that cannot compile is a result too
      row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
      row.update(_out_of_memory(row["error"]))
    table.append(row)
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
      w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
      if new:
        w.writeheader()
      w.writerow(row)
    elapsed = time.perf_counter() - t0
    print(f"[{i + 1}/{len(todo)} {elapsed / 60:.1f} min] {r.model} s{r.seq} {r.topology} "
          f"{r.variant} mesh={row.get('mesh')} batch={r.batch}: "
          + (f"error {row['error']}" if row.get("error") else
             f"{row['hbm_gib']}/{row['hbm_cap_gib']} GiB, est {row.get('est_step_ms')} ms, "
             f"est MFU {row.get('est_mfu')}, {row['collectives']} ({row['compile_s']} s)"),
          flush=True)
  write_md(md_path, table)
  print(f"wrote {csv_path} and {md_path}")
  if FLAGS.update_readme:
    update_readme(pathlib.Path(FLAGS.update_readme), table)
    print(f"updated {FLAGS.update_readme}")
  for row in table:
    prog = row.get("program", "")
    if row.get("error") or "bfloat16" not in prog or "scanned" not in prog or (
        str(row.get("fits")) != "True" and row.get("variant") == "launcher"):
      bad.append(row)
  if FLAGS.check and bad:
    for row in bad:
      print(f"CHECK FAILED: {row}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU devices are compile-only
  app.run(main)
