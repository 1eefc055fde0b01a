r"""The peer: HF's Flax BERT pre-training step (FlaxBertForPreTraining, transformers 4.x; 5.x
dropped Flax) with optax AdamW, compiled for a TPU topology on this CPU with libtpu, data
parallel over the slice at the same rows a chip as ours. Every time is XLA's TPU cost-model
ESTIMATE, never a measurement.

  python bench/hf_flax_peer.py --topology=v5e-16 --rows_per_chip=32,256 \
      --venv=~/.cache/encoder_jax/hf_flax_peer --libtpu=.venv/libtpu-0.0.42.1

It runs in its own virtual environment (created at --venv on first use with PINS below; the
project's environment keeps transformers 5.x): this script, started with any Python, makes
the venv if needed and re-runs itself inside it with libtpu on the path. It prints one JSON
line a configuration and writes them to --out (bench/tpu_aot.py --with_reference reads
them into the table beside ours and the pure-JAX reference).

The step is HF's as its Flax MLM example trains it (examples/flax/language-modeling/
run_mlm_flax.py): the model in bf16 compute with fp32 parameters (`dtype=jnp.bfloat16`),
dropout 0.1 on hidden states and attention probabilities, the MLM head dense over every
position (HF has no sparse head: its decoder runs at all T positions, ours at the masked
ones only), NSP, fp32 cross-entropy over the masked positions, optax.adamw with weight decay
0.01 and no remat; the batch split over every chip, parameters and optimizer replicated.
HF's vocabulary is BERT's 30,522 ids, unpadded.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

PINS = ("transformers==4.57.6", "flax==0.12.8", "jax==0.10.2", "jaxlib==0.10.2",
        "optax==0.2.8", "numpy==2.4.6")
TOPOLOGIES = {"v5e-16": "v5e:4x4", "v5e-4": "v5e:2x2", "v5p-8": "v5p:2x2x1",
              "v4-8": "v4:2x2x1"}
SIZES = {"tiny": (2, 128, 2, 512), "base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}
UNPRICED_CUSTOM_CALLS = ("ConcatBitcast", "X64Combine")  # as encoder_jax.train.compile_check


def ensure_venv(venv: pathlib.Path) -> pathlib.Path:
  """The venv's python, created with PINS the first time (a marker file records them)."""
  python, marker = venv / "bin" / "python", venv / "encoder_jax_pins.txt"
  if not (python.exists() and marker.exists() and marker.read_text() == "\n".join(PINS)):
    print(f"creating the peer's venv at {venv} ({', '.join(PINS)})", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PINS], check=True)
    marker.write_text("\n".join(PINS))
  return python


def worker(args) -> None:
  """Inside the venv: compile HF's step for each rows-a-chip value; print JSON lines."""
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.experimental import topologies
  from jax.sharding import NamedSharding, PartitionSpec as P
  from transformers import BertConfig, FlaxBertForPreTraining

  L, d, h, f = SIZES[args.size]
  cfg = BertConfig(vocab_size=30522, hidden_size=d, num_hidden_layers=L, num_attention_heads=h,
                   intermediate_size=f, max_position_embeddings=512)
  model = FlaxBertForPreTraining(cfg, dtype=jnp.bfloat16, _do_init=False)
  devices = topologies.get_topology_desc(platform="tpu",
                                         topology_name=TOPOLOGIES[args.topology]).devices
  chips = len({tuple(x.coords) for x in devices})
  mesh = jax.sharding.Mesh(np.asarray(devices), ("data",))
  rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  tx = optax.adamw(1e-4, weight_decay=0.01)
  T = args.seq
  params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, T)))
  state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                       (params, jax.eval_shape(tx.init, params),
                        jax.ShapeDtypeStruct((), jnp.int32)))

  def loss_fn(p, batch, key):
    out = model.module.apply({"params": p}, batch["input_ids"], batch["attention_mask"],
                             batch["token_type_ids"], batch["position_ids"], None,
                             deterministic=False, rngs={"dropout": key})
    logits = out[0].astype(jnp.float32)
    labels = batch["labels"]
    w = (labels >= 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out[1].astype(jnp.float32), batch["next_sentence_label"]).mean()
    return (ce * w).sum() / jnp.maximum(w.sum(), 1.0) + nsp

  def step(state, batch):
    p, opt, n = state
    loss, grads = jax.value_and_grad(loss_fn)(p, batch, jax.random.fold_in(
        jax.random.key(0), n))
    updates, opt = tx.update(grads, opt, p)
    return (optax.apply_updates(p, updates), opt, n + 1), loss

  shardings = jax.tree.map(lambda a: a.sharding, state)
  jitted = jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, rep))
  for rows in args.rows_per_chip:
    B = rows * chips
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32, sharding=split)
    batch = {"input_ids": i32(B, T), "attention_mask": i32(B, T), "token_type_ids": i32(B, T),
             "position_ids": i32(B, T), "labels": i32(B, T), "next_sentence_label": i32(B)}
    t0 = time.perf_counter()
    compiled = jitted.lower(state, batch).compile()
    secs = time.perf_counter() - t0
    cost, mem = compiled.cost_analysis(), compiled.memory_analysis()
    hlo = compiled.as_text()
    est = float(cost["optimal_seconds"]) + sum(
        hlo.count(f'custom_call_target="{c}"') for c in UNPRICED_CUSTOM_CALLS)
    peak = (mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
            - mem.alias_size_in_bytes)
    print(json.dumps(dict(system="hf_flax", transformers=__import__("transformers").__version__,
                          size=args.size, seq=T, topology=args.topology, rows_per_chip=rows,
                          batch=B, est_step_ms=round(est * 1e3, 2),
                          hbm_gib=round(peak / 2**30, 2), compile_s=round(secs, 1))),
          flush=True)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topology", default="v5e-16", choices=sorted(TOPOLOGIES))
  ap.add_argument("--size", default="base", choices=sorted(SIZES))
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--rows_per_chip", default="32,256",
                  type=lambda s: [int(x) for x in s.split(",")])
  ap.add_argument("--venv", default=os.environ.get("ENCODER_JAX_HF_PEER_VENV", ""),
                  help="the peer's venv (created on first use); default "
                  "<encoder_jax cache>/hf_flax_peer")
  ap.add_argument("--libtpu", default=os.environ.get("ENCODER_JAX_LIBTPU", ""),
                  help="the folder holding libtpu (run.sh's .venv/libtpu-<version>)")
  ap.add_argument("--out", default="", help="also append the JSON lines to this file")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    worker(args)
    return
  cache = pathlib.Path(os.environ.get("ENCODER_JAX_CACHE") or
                       pathlib.Path(os.environ.get("XDG_CACHE_HOME") or
                                    pathlib.Path.home() / ".cache") / "encoder_jax")
  venv = pathlib.Path(args.venv or cache / "hf_flax_peer").expanduser()
  root = pathlib.Path(__file__).resolve().parents[1]
  libtpu = pathlib.Path(args.libtpu or root / ".venv" / "libtpu-0.0.42.1").expanduser()
  if not (libtpu / "libtpu").is_dir():
    raise SystemExit(f"--libtpu={libtpu} holds no libtpu; give the folder run.sh installs "
                     "it into (.venv/libtpu-<version>).")
  python = ensure_venv(venv)
  env = dict(os.environ, PYTHONPATH=str(libtpu), JAX_PLATFORMS="cpu",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1", XLA_FLAGS="")
  cmd = [str(python), __file__, "--worker", f"--topology={args.topology}",
         f"--size={args.size}", f"--seq={args.seq}",
         "--rows_per_chip=" + ",".join(map(str, args.rows_per_chip))]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
  for ln in lines:
    print(ln)
  if args.out:
    with open(args.out, "a") as f:
      f.writelines(ln + "\n" for ln in lines)
  if proc.returncode:
    raise SystemExit(f"the peer's worker failed:\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
  main()
