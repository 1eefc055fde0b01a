r"""The trainer's real step compiled ahead of time for TPU topologies, on a CPU: the layout
mesh=auto picks, memory, cost model, collectives. Every time figure here is XLA's TPU
cost-model ESTIMATE, never a measurement (bench/measure_step.py measures, on hardware).

  bash run.sh tpu python -m bench.tpu_aot --update_readme=launch/README.md
                          # the committed tables: bench/results/tpu_aot.* (hours on 2 cores)
  bash run.sh tpu python -m bench.tpu_aot --rows=smoke   # a tiny BERT on v5e-4, minutes
  bash run.sh tpu python -m bench.tpu_aot --rows=ci --check --noestimate   # what CI compiles
  bash run.sh tpu python -m bench.tpu_aot --with_reference   # + pure-JAX ceiling and HF peer
  bash run.sh tpu python -m bench.tpu_aot --calibrate        # what the cost model can say

`run.sh tpu` runs inside the project's venv with libtpu (the TPU compiler of `jax[tpu]` at
the pinned jax) on the path; `jax.experimental.topologies.get_topology_desc` gives
compile-only TPU devices. What is compiled is exactly the step of `python -m encoder_jax.main
--mode=pretrain` for the same config (encoder_jax.train.compile_check).

Rows:
  * auto: what `config.mesh=auto` (the launcher's default, encoder_jax/train/layout.py) picks
    for the recipe's global batch on the slice, by compiling candidates (cached by program
    under <cache>/layouts: a re-run compiles only what changed). The program that runs is
    reported: unrolled layers where the depth allows, whose estimate is the whole step's.
  * fixed: a given mesh and batch (the pre-auto launcher's FSDP, CI's compile check) with the
    layer layout config.model resolves to on a TPU: scanned. XLA's cost model counts a loop
    body once, so a scanned program's estimate covers one layer of L; its est_* columns come
    from the same step compiled unrolled (same maths and remat), and scan_offset says how the
    two price the same counted work (below).
Columns (per device unless named): hbm_gib (live bytes at the step's peak, XLA's buffer
assignment; fits: <= 90% of the device's HBM, layout.HBM_MARGIN), xla_tflops (XLA's FLOPs of
one step call, all devices), ours_tflops (the analytic 6N count the trainer's MFU uses),
est_step_ms (one step call; with accumulation the average of its k micro-steps, the k-th of
which runs the optimizer), est_update_ms (k x est_step_ms: one optimizer update of the
recipe's global batch), est_tok_s_chip, est_mfu (ours_tflops / (est x chips x peak)),
scan_offset ((est / xla_flops) of the scanned program over that of the unrolled one, the same
config: > 1 means the cost model prices a scanned FLOP dearer), collectives (ops in the
partitioned HLO), note (the search's warnings).
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import pathlib
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("rows", "table", ["ci", "smoke", "recipes", "goal", "table"],
                  "smoke: a tiny BERT (2 x 128) at seq 64 on v5e-4 with mesh=auto (the README's "
                  "CPU check); ci: BERT-base MLM+NSP and ELECTRA-base at seq 128, FSDP, on v4-8 "
                  "and v5e-16 (.ci/run); "
                  "goal: mesh=auto for BERT-base s128 and BERT-large s512 at RoBERTa's global "
                  "batch (8192) on v5e-16 and v5p-8, and at BERT's (256) on v5e-16; table: goal "
                  "+ the pre-auto launcher's FSDP rows for comparison (the committed table); "
                  "recipes: recipe=roberta (base, s512) and recipe=modernbert (modernbert-base, "
                  "s1024) beside BERT-base, FSDP on v5e-16, one micro-batch of 256 / 128 and "
                  "64 rows (their recipes' global batches, 8,192 and 4,608, are accumulation of "
                  "these; "
                  "the table rows search them).")
flags.DEFINE_enum("extra", "none", ["none", "best"], "Kept for old command lines: mesh=auto "
                  "rows are the searched variants now; best adds the fixed FSDP rows to "
                  "--rows=smoke and --rows=goal.")
flags.DEFINE_string("out", "bench/results/tpu_aot", "Writes <out>.csv (resumable: rows "
                    "already there are skipped) and <out>.md.")
flags.DEFINE_string("update_readme", "", "Also replace the table and the advice between the "
                    "tpu_aot markers of this file (launch/README.md).")
flags.DEFINE_bool("estimate", True, "Compile the unrolled twin of fixed rows and the scanned "
                  "twin of auto rows (scan_offset); --noestimate: memory and collectives of "
                  "fixed rows only (CI).")
flags.DEFINE_bool("check", False, "Exit non-zero unless every fixed row compiled to the TPU's "
                  "program (bf16, scanned) and every row fits HBM (what CI asserts).")
flags.DEFINE_bool("with_reference", False, "Also compare ours with a pure-JAX encoder of the "
                  "same shapes and with HF's Flax BERT (bench/tpu_peers.py).")
flags.DEFINE_bool("from_csv", False, "Compile nothing: write <out>.md (and --update_readme's "
                  "table and advice) from the rows <out>.csv already holds, in --rows' order "
                  "(a run cut short; the rows not there are left out, and said).")
flags.DEFINE_bool("calibrate", False, "Instead: bench/tpu_calibrate.py (what XLA's TPU cost "
                  "model predicts for lone matmuls, layouts, the optimizer and the "
                  "vocabulary), written to <out>_calibration.txt.")

TOPOLOGIES = {  # name in the table -> libtpu topology name
    "v4-8": "v4:2x2x1", "v4-32": "v4:2x2x4", "v5e-4": "v5e:2x2", "v5e-16": "v5e:4x4",
    "v5e-64": "v5e:8x8", "v5p-8": "v5p:2x2x1",
}
FIELDS = ("model", "seq", "topology", "variant", "mesh_arg", "batch", "dropout", "mesh",
          "optim_sharding", "rows_device", "accumulation", "remat", "program", "compile_s",
          "hbm_gib", "hbm_cap_gib", "fits", "xla_tflops", "ours_tflops", "est_step_ms",
          "est_update_ms", "est_tok_s_chip", "est_mfu", "scan_offset", "candidates",
          "collectives", "note", "error")
ROBERTA_BATCH, BERT_BATCH, MODERNBERT_BATCH = 8192, 256, 4608


@dataclasses.dataclass(frozen=True)
class Row:
  model: str  # "bert-tiny" | "bert-base" | "bert-large" | "electra-base" | ...
  seq: int
  topology: str
  variant: str = "auto"  # auto (the layout search) | fixed (mesh and batch as given)
  mesh: str = "auto"
  batch: int = BERT_BATCH  # the recipe's global batch
  dropout: str = "bert"

  def key(self) -> tuple:
    return tuple(str(getattr(self, f.name)) for f in dataclasses.fields(self))


def rows(which: str, extra: str) -> list[Row]:
  if which == "smoke":
    out = [Row("bert-tiny", 64, "v5e-4", batch=64)]
  elif which == "ci":
    return [Row(m, 128, t, "fixed", "1,-1,1") for t in ("v4-8", "v5e-16")
            for m in ("bert-base", "electra-base")]
  elif which == "recipes":
    return [Row("bert-base", 128, "v5e-16", "fixed", "1,-1,1"),
            Row("roberta-base", 512, "v5e-16", "fixed", "1,-1,1", dropout="bert"),
            Row("modernbert-base", 1024, "v5e-16", "fixed", "1,-1,1", batch=128, dropout="none"),
            Row("modernbert-base", 1024, "v5e-16", "fixed", "1,-1,1", batch=64, dropout="none")]
  else:
    # (in the order a cut-short run should have them)
    out = [Row("bert-base", 128, "v5e-16", batch=ROBERTA_BATCH), Row("bert-base", 128, "v5e-16"),
           Row("bert-base", 128, "v5p-8", batch=ROBERTA_BATCH),
           Row("bert-large", 512, "v5p-8", batch=ROBERTA_BATCH),
           Row("bert-large", 512, "v5e-16", batch=ROBERTA_BATCH), Row("bert-large", 512, "v5e-16"),
           Row("roberta-base", 512, "v5e-16", batch=ROBERTA_BATCH),
           Row("modernbert-base", 1024, "v5e-16", batch=MODERNBERT_BATCH, dropout="none")]
  if which == "table" or extra == "best":
    out += [dataclasses.replace(r, variant="fixed", mesh="1,-1,1") for r in out
            if r.batch == BERT_BATCH]
  return out


def config_of(r: Row):
  """The row's pre-training config: BERT (MLM + NSP) or ELECTRA of a size, or the roberta /
  modernbert recipe (configs/pretrain.py recipe=...), at the row's length, batch and mesh."""
  from configs import pretrain
  family, size = r.model.split("-", 1)
  if family == "modernbert":
    arg = f"recipe=modernbert,size={r.model},dropout={r.dropout}"
  elif family == "roberta":
    arg = f"recipe=roberta,size={size},dropout={r.dropout}"
  else:
    obj = "objective=electra,nsp=none" if family == "electra" else "nsp=nsp"
    arg = f"size={size},{obj},dropout={r.dropout}"
  config = pretrain.get_config(arg)
  config.data.max_length, config.data.batch_size, config.mesh = r.seq, r.batch, r.mesh
  return config


def devices_of(topology: str):
  from jax.experimental import topologies
  return topologies.get_topology_desc(platform="tpu",
                                      topology_name=TOPOLOGIES[topology]).devices


def _collectives(a: dict) -> str:
  return " ".join(f"{k[2:].replace('_', '-')}:{v}" for k, v in a.items()
                  if k.startswith("n_")) or "none"


def _offset(scanned: dict, unrolled: dict) -> float | None:
  """(est / xla_flops) scanned over unrolled: how the cost model prices the same counted work
  in the two layouts (it counts a scanned body once, in both its seconds and its FLOPs)."""
  try:
    return round((scanned["optimal_seconds"] / scanned["xla_flops"])
                 / (unrolled["optimal_seconds"] / unrolled["xla_flops"]), 3)
  except (KeyError, TypeError, ZeroDivisionError):
    return None


def auto_row(r: Row) -> dict:
  from encoder_jax.train import compile_check as cc
  from encoder_jax.train import layout, setup
  config, devices = config_of(r), devices_of(r.topology)
  choice = layout.search(config, devices, say=lambda m: print(f"    {m}", flush=True))
  b, lay = choice.best, choice.best.layout
  chips = layout.chips_of(devices)
  c = layout.configure(config, lay, len(devices))
  s = setup.build(c, "tpu")
  rec = b.record if b.accumulation == 1 else layout.Pricer(devices).compiled(
      cc.lower_train_step(layout.configure(config, lay, len(devices), lay.rows * len(devices)),
                          devices)[0])[0]  # (the step without accumulation: cached)
  out = dict(mesh=",".join(str(len(devices)) if x == "-1" else x for x in lay.mesh.split(",")),
             optim_sharding=lay.optim_sharding, rows_device=lay.rows,
             accumulation=b.accumulation, remat=lay.remat, program=b.program,
             compile_s=round(b.compile_s, 1), hbm_gib=round(b.hbm_gib, 2),
             hbm_cap_gib=round(b.cap_gib, 1), fits=b.fits,
             ours_tflops=round(s.flops_per_step / 1e12, 2), candidates=len(choice.priced),
             collectives=b.collectives, note=" ".join(choice.notes))
  if rec.get("xla_flops"):
    out["xla_tflops"] = round(rec["xla_flops"] * len(devices) / 1e12, 2)
  if b.est_step_s:
    out.update(est_step_ms=round(b.est_step_s * 1e3, 2),
               est_update_ms=round(b.est_update_s * 1e3, 1),
               est_tok_s_chip=round(c.data.batch_size * r.seq / b.est_step_s / chips),
               est_mfu=round(b.est_mfu, 3))
  if FLAGS.estimate and not lay.scan:  # the same layout scanned: how its estimate compares
    twin = layout.configure(config, dataclasses.replace(lay, scan=True), len(devices),
                            lay.rows * len(devices))  # (as `rec`: one micro-batch an update)
    out["scan_offset"] = _offset(layout.Pricer(devices).compiled(
        cc.lower_train_step(twin, devices)[0])[0], rec)
  return out


def fixed_row(r: Row) -> dict:
  from encoder_jax.train import compile_check as cc
  from encoder_jax.train import flops as flops_lib
  from encoder_jax.train import layout
  config, devices = config_of(r), devices_of(r.topology)
  pricer, chips = layout.Pricer(devices), layout.chips_of(devices)
  lowered, s, _, _, mesh = cc.lower_train_step(config, devices)
  a, _ = pricer.compiled(lowered)
  cap = layout.hbm_cap_gib(devices)
  out = dict(program=cc.describe_program(s.model_cfg), compile_s=round(a.get("compile_s", 0), 1),
             mesh=",".join(str(v) for v in mesh.shape.values()),
             optim_sharding=s.optim_sharding, rows_device=r.batch // len(devices),
             accumulation=1, remat=s.model_cfg.remat_policy, hbm_cap_gib=round(cap, 1),
             ours_tflops=round(s.flops_per_step / 1e12, 2), collectives=_collectives(a),
             error=a.get("error", ""))
  if "peak_bytes" in a:
    out.update(hbm_gib=round(a["peak_bytes"] / 2**30, 2),
               fits=a["peak_bytes"] / 2**30 <= layout.HBM_MARGIN * cap)
  else:
    out.update(hbm_gib=f">{a.get('oom_gib')}", fits=False)
  cost = a if not s.model_cfg.scan_layers else {}
  if s.model_cfg.scan_layers and FLAGS.estimate:
    config.model.scan_layers = "False"
    config.model.remat_policy = s.model_cfg.remat_policy
    cost, _ = pricer.compiled(cc.lower_train_step(config, devices)[0])
    out["scan_offset"] = _offset(a, cost)
  est = cost.get("optimal_seconds")
  if est:
    peak = flops_lib.peak_flops_per_device(devices[0].device_kind)
    out.update(xla_tflops=round(cost["xla_flops"] * len(devices) / 1e12, 2),
               est_step_ms=round(est * 1e3, 2), est_update_ms=round(est * 1e3, 2),
               est_tok_s_chip=round(r.batch * r.seq / est / chips),
               est_mfu=round(s.flops_per_step / (est * chips * peak), 3))
  return out


README_BEGIN, README_END = "<!-- tpu_aot table: begin -->", "<!-- tpu_aot table: end -->"
ADVICE_BEGIN, ADVICE_END = "<!-- tpu_aot advice: begin -->", "<!-- tpu_aot advice: end -->"


def _f(row, key):
  try:
    return float(row.get(key) or "nan")
  except ValueError:
    return float("nan")


def _layout_name(row) -> str:
  """"FSDP 1,4,1", "data parallel 16,1,1", ... (layout.kind_of, and the resolved mesh)."""
  from encoder_jax.train import layout
  return f"{layout.kind_of(str(row['mesh']), row.get('optim_sharding', ''))} {row['mesh']}"


def launcher_summary(table: list[dict]) -> str:
  """The auto rows (what the launcher runs) and the fixed FSDP rows they replace."""
  lines = ["| model | seq | slice | global batch | layout (mesh=auto) | rows/device x "
           "accumulation | HBM/device (GiB) | est. MFU | est. ms/update | note |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for row in table:
    if row.get("error"):
      continue
    lay = (f"{_layout_name(row)}, remat {row['remat']}, "
           f"{'scanned' if 'scanned' in row.get('program', '') else 'unrolled'}"
           + (" (fixed: the pre-auto launcher)" if row["variant"] == "fixed" else ""))
    lines.append(f"| {row['model']} | {row['seq']} | {row['topology']} | {row['batch']} | "
                 f"{lay} | {row['rows_device']} x {row['accumulation']} | "
                 f"{row.get('hbm_gib')} / {row.get('hbm_cap_gib')} | "
                 f"{row.get('est_mfu') or '-'} | {row.get('est_update_ms') or '-'} | "
                 f"{(row.get('note') or '')[:160]} |")
  return "\n".join(lines)


def advice(table: list[dict]) -> str:
  """launch/README.md's advice, from the rows (every figure a compiler estimate)."""
  auto = [r for r in table if r["variant"] == "auto" and not r.get("error")]
  fixed = {(r["model"], r["seq"], r["topology"], r["batch"]): r for r in table
           if r["variant"] == "fixed" and not r.get("error")}
  out = ["Advice from it (XLA's estimates, no TPU ran): keep the launcher's default "
         "`config.mesh=auto`; it compiles the candidates for your slice at start-up (cached) "
         "and prints the table above for your config.", ""]
  for r in auto:
    old = fixed.get((r["model"], r["seq"], r["topology"], r["batch"]))
    vs = (f" (the fixed FSDP mesh it replaces: est. MFU {old.get('est_mfu')})"
          if old and old.get("est_mfu") else "")
    out.append(f"- {r['model']} s{r['seq']} on {r['topology']} at a global batch of "
               f"{r['batch']}: {r['rows_device']} rows a device x {r['accumulation']} "
               f"micro-step(s), {_layout_name(r)}, est. MFU {r.get('est_mfu')}{vs}.")
    if r.get("note"):
      out.append("  " + r["note"][0].upper() + r["note"][1:])
  return "\n".join(out)


def _replace_between(text: str, begin: str, end: str, body: str, path) -> str:
  if begin not in text or end not in text:
    raise SystemExit(f"{path} has no {begin} ... {end} block to replace.")
  head, rest = text.split(begin, 1)
  return f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def update_readme(path: pathlib.Path, table: list[dict]) -> None:
  text = _replace_between(path.read_text(), README_BEGIN, README_END,
                          launcher_summary(table), path)
  path.write_text(_replace_between(text, ADVICE_BEGIN, ADVICE_END, advice(table), path))


def write_md(path: pathlib.Path, table: list[dict], left_out=()) -> None:
  cols = [c for c in FIELDS if c not in ("mesh_arg", "error", "note")]
  lines = [f"# The pre-training step compiled for TPU topologies (bench/tpu_aot.py, "
           f"{datetime.date.today()})", "",
           "Compiled on a CPU with libtpu; no TPU ran. Every `est_*` figure is XLA's TPU "
           "cost-model ESTIMATE, not a measurement; HBM is XLA's buffer assignment. The "
           "columns are explained in bench/tpu_aot.py's docstring.", "",
           "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for row in table:
    if row.get("error") and not row.get("hbm_gib"):
      lines.append(f"| {row['model']} | {row['seq']} | {row['topology']} | {row['variant']} | "
                   f"error: {row['error'][:160]} |")
      continue
    lines.append("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
  notes = [f"* {r['model']} s{r['seq']} {r['topology']} batch {r['batch']}: {r['note']}"
           for r in table if r.get("note")]
  lines += (["", "Warnings of the layout search:"] + notes) if notes else []
  lines += (["", "Rows of --rows not compiled in this run (written with --from_csv): "
             + "; ".join(left_out) + "."] if left_out else [])
  path.write_text("\n".join(lines) + "\n")


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  if FLAGS.calibrate:
    from bench import tpu_calibrate
    tpu_calibrate.calibrate(out.with_name(out.name + "_calibration.txt"))
    return
  csv_path, md_path = out.with_suffix(".csv"), out.with_suffix(".md")
  done = {}
  if csv_path.exists():
    with csv_path.open() as f:
      for row in csv.DictReader(f):
        done[tuple(row["mesh_arg" if k.name == "mesh" else k.name]
                   for k in dataclasses.fields(Row))] = row
  table, left_out, t0 = [], [], time.perf_counter()
  todo = rows(FLAGS.rows, FLAGS.extra)
  for i, r in enumerate(todo):
    if r.key() in done:
      table.append(done[r.key()])
      continue
    if FLAGS.from_csv:
      print(f"[{i + 1}/{len(todo)}] {r}: not in {csv_path}, left out (--from_csv)", flush=True)
      left_out.append(f"{r.model} s{r.seq} {r.topology} {r.variant} batch {r.batch}")
      continue
    print(f"[{i + 1}/{len(todo)}] {r}", flush=True)
    row = {**dataclasses.asdict(r), "mesh_arg": r.mesh}
    try:
      row.update(auto_row(r) if r.variant == "auto" else fixed_row(r))
    except Exception as err:  # noqa: BLE001 -- a row that cannot compile is a result too
      row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    table.append(row)
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
      w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
      if new:
        w.writeheader()
      w.writerow(row)
    print(f"  [{(time.perf_counter() - t0) / 60:.1f} min] " + ", ".join(
        f"{k}={row.get(k)}" for k in ("mesh", "optim_sharding", "rows_device", "accumulation",
                                      "hbm_gib", "est_mfu", "scan_offset", "error")
        if row.get(k) not in (None, "")), flush=True)
  write_md(md_path, table, left_out)
  print(f"wrote {csv_path} and {md_path}")
  if FLAGS.with_reference:
    from bench import tpu_peers
    tpu_peers.compare(out.with_name(out.name + "_peers"))
  if FLAGS.update_readme:
    update_readme(pathlib.Path(FLAGS.update_readme), table)
    print(f"updated {FLAGS.update_readme}")
  bad = [r for r in table if r.get("error") or str(r.get("fits")) != "True" or (
      r["variant"] == "fixed" and ("bfloat16" not in r.get("program", "")
                                   or "scanned" not in r.get("program", "")))]
  if FLAGS.check and bad:
    for row in bad:
      print(f"CHECK FAILED: {row}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  import os
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU devices are compile-only
  app.run(main)
