"""Ours beside a pure-JAX ceiling and HF's Flax BERT, compiled for the same TPU slice, mesh and
rows a chip (`bench/tpu_aot.py --with_reference`). Every time is XLA's TPU cost-model ESTIMATE.

BERT-base MLM+NSP at 128 tokens on a v5e-16, data parallel over the 16 chips, at 32 and 256
rows a chip (one optimizer update a step, no accumulation):
  ours        the trainer's step, unrolled with dots remat, data parallel with the optimizer
              replicated and split over the data axis (ZeRO-1); `ours_ms` is the faster of
              the two, the one mesh=auto takes between them (encoder_jax/train/layout.py);
  reference   bench/reference_encoder.py: plain JAX, same shapes, dropout, sparse MLM head,
              remat and layout, optax AdamW replicated, masking done on the host;
  peer        bench/hf_flax_peer.py: HF's FlaxBertForPreTraining (transformers 4.57.6, its
              own venv) with optax.adamw, no remat, its MLM decoder dense over every position.
MFU is ours for all (train/flops.py: 6N matmul FLOPs with the sparse MLM head), so a system
doing more work for the same step (the peer's dense head) reads lower. speedup columns are
time ratios (theirs / ours): > 1 means ours is estimated faster. The peer's estimates are
cached by its pins, topology and rows (in the layout cache, as ours are by program): delete
<cache>/layouts/hf_flax_peer_*.json to recompile it.
"""
from __future__ import annotations

import csv
import json
import pathlib
import subprocess
import sys

ROWS_PER_CHIP = (32, 256)
TOPOLOGY, TOPOLOGY_NAME = "v5e-16", "v5e:4x4"
FIELDS = ("rows_per_chip", "ours_ms", "ours_layout", "ours_zero1_ms", "ours_replicated_ms",
          "reference_ms", "peer_ms", "ours_mfu", "reference_mfu", "peer_mfu", "peer_over_ours",
          "reference_over_ours", "ours_hbm_gib", "reference_hbm_gib", "peer_hbm_gib")


def _peer(rows: tuple[int, ...]) -> dict[int, dict]:
  import hashlib

  from bench import hf_flax_peer
  from encoder_jax.data.fetch import cache_root
  key = hashlib.sha256("\n".join(hf_flax_peer.PINS).encode()).hexdigest()[:12]
  cached = lambda r: cache_root() / "layouts" / f"hf_flax_peer_{TOPOLOGY}_{r}_{key}.json"
  out = {r: json.loads(cached(r).read_text()) for r in rows if cached(r).exists()}
  todo = [r for r in rows if r not in out]
  if todo:
    root = pathlib.Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "hf_flax_peer.py"),
                           f"--topology={TOPOLOGY}",
                           "--rows_per_chip=" + ",".join(map(str, todo))],
                          capture_output=True, text=True)
    if proc.returncode:
      print(f"the HF peer did not compile: {proc.stderr[-2000:]}", file=sys.stderr)
    for line in proc.stdout.splitlines():
      if line.startswith("{"):
        r = json.loads(line)
        out[r["rows_per_chip"]] = r
        cached(r["rows_per_chip"]).parent.mkdir(parents=True, exist_ok=True)
        cached(r["rows_per_chip"]).write_text(line)
  return out


def compare(out: pathlib.Path) -> list[dict]:
  from jax.experimental import topologies

  from bench import reference_encoder
  from configs import pretrain
  from encoder_jax.train import flops as flops_lib
  from encoder_jax.train import layout, setup
  devices = topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGY_NAME).devices
  n, pricer = len(devices), layout.Pricer(devices)
  peak = flops_lib.peak_flops_per_device(devices[0].device_kind)
  peers = _peer(ROWS_PER_CHIP)
  table = []
  for rows in ROWS_PER_CHIP:
    config = pretrain.get_config("size=base,nsp=nsp")
    config.data.batch_size = rows * n
    ours = {o: pricer.price(config, layout.Layout("-1,1,1", o, rows, "dots", False))
            for o in ("zero1", "replicated")}
    s = setup.build(layout.configure(config, ours["zero1"].layout, n), "tpu")
    ref, _ = pricer.compiled(reference_encoder.lower_step(
        s.model_cfg, devices, rows * n, 128, s.obj.max_predictions, scan=False, remat="dots"))
    mfu = lambda secs: round(s.flops_per_step / (secs * n * peak), 3) if secs else None
    best = min(ours, key=lambda o: ours[o].est_step_s)  # what mesh=auto takes of the two
    z, ref_s = ours[best].est_step_s, ref.get("optimal_seconds")
    peer_s = peers.get(rows, {}).get("est_step_ms", 0) / 1e3 or None
    row = dict(rows_per_chip=rows, ours_ms=round(z * 1e3, 2), ours_layout=best,
               ours_zero1_ms=round(ours["zero1"].est_step_s * 1e3, 2),
               ours_replicated_ms=round(ours["replicated"].est_step_s * 1e3, 2),
               reference_ms=ref_s and round(ref_s * 1e3, 2),
               peer_ms=peer_s and round(peer_s * 1e3, 2), ours_mfu=mfu(z),
               reference_mfu=mfu(ref_s), peer_mfu=mfu(peer_s),
               peer_over_ours=peer_s and round(peer_s / z, 3),
               reference_over_ours=ref_s and round(ref_s / z, 3),
               ours_hbm_gib=round(ours[best].hbm_gib, 2),
               reference_hbm_gib=ref.get("peak_bytes") and round(ref["peak_bytes"] / 2**30, 2),
               peer_hbm_gib=peers.get(rows, {}).get("hbm_gib"))
    print(row, flush=True)
    table.append(row)
  with out.with_suffix(".csv").open("w", newline="") as f:
    w = csv.DictWriter(f, FIELDS)
    w.writeheader()
    w.writerows(table)
  lines = [f"# Ours, a pure-JAX reference and HF's Flax BERT on a {TOPOLOGY} (bench/tpu_peers.py)",
           "", "BERT-base MLM+NSP s128, data parallel, one update a step; every figure XLA's "
           "TPU cost-model ESTIMATE (see bench/tpu_peers.py for what each system is).", "",
           "| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
  lines += ["| " + " | ".join(str(r.get(k, "")) for k in FIELDS) + " |" for r in table]
  out.with_suffix(".md").write_text("\n".join(lines) + "\n")
  return table
