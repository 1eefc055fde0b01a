r"""Per-layer gradient norms of post-LN and pre-LN encoders, at initialisation and early in
training: the mechanism Xiong et al. 2020 ("On Layer Normalization in the Transformer
Architecture", Figure 3 and Theorem 1) give for post-LN needing a learning-rate warm-up.

  bash run.sh python -m experiments.layer_grads                      # 6/12/24 layers, 2 seeds
  bash run.sh python -m experiments.layer_grads --depths=24 --lr=3e-3 --warmup=200 \
      --out=/tmp/layer_grads_warmup

Their claim, for the gradient of the last FFN weight W2 of each layer at initialisation: in a
post-LN Transformer it grows with the layer index (the layers next to the output get the
largest gradients, so a large learning rate without warm-up moves them most), while in a
pre-LN Transformer it is about the same in every layer and shrinks as the stack deepens
(Theorem 1: O(d sqrt(ln d)) for post-LN's last layer, O(d sqrt(ln d / L)) for pre-LN's).

Each (depth, norm, seed) builds the demo recipe's encoder with the block its committed
results ran on (configs/pretrain.py:runlocal,block=alibi: the demo corpus and vocabulary, rows
of 64 in batches of 16, ALiBi, AdamW with global-norm clipping at 1.0), narrowed to --width
with --depth layers, and trains it --steps steps with the trainer's one step
(encoder_jax.train.step.make_step, adding per-layer norms of the gradients before clipping).
Recorded: at every step in --record_at the norm of the gradient of each
layer's FFN output kernel (W2) and of the whole layer; at every step the loss and the global
gradient norm. A point whose loss turns non-finite stops there and is reported diverged.

Writes to --out: layers.csv (per layer at each recorded step), curves.csv (per step),
results.md (the ratio of the top layer's W2 gradient norm to the bottom layer's, per depth and
norm, at initialisation and at the last step; the train loss over the last 50 steps),
layer_grads.png (W2 gradient norm by layer), loss_curves.png and provenance.json (the commit,
command, flags, host and package versions). `--report` redraws the report from the CSVs.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import pathlib
import time

from absl import app, flags
import numpy as np

from experiments import provenance

# Flags are defined by `define_flags`, called only when this module is the program: the tests
# import it beside other absl programs whose flags (--steps, --out, --seeds) would collide.
FLAG_NAMES = ("depths", "norms", "seeds", "width", "steps", "lr", "warmup", "schedule_steps",
              "record_at", "initializer_range", "out")


def define_flags() -> None:
  flags.DEFINE_list("depths", ["6", "12", "24"], "Numbers of layers.")
  flags.DEFINE_list("norms", ["post", "pre"], "Layer-norm placements (post, pre).")
  flags.DEFINE_list("seeds", ["0", "1"], "Initialisation and data-order seeds.")
  flags.DEFINE_integer("width", 64, "Hidden size; the FFN is 4x, heads of 16.")
  flags.DEFINE_integer("steps", 200, "Training steps per point (0: initialisation only).")
  flags.DEFINE_float("lr", 1e-3, "Peak learning rate (AdamW, b2 0.98 as in runlocal).")
  flags.DEFINE_integer("warmup", 0, "Linear warm-up steps (0: none, the post-LN failure case).")
  flags.DEFINE_integer("schedule_steps", 2000, "Length of the linear-decay schedule the --steps "
                       "are the start of (the norm grid's 2,000).")
  flags.DEFINE_list("record_at", ["0", "10", "50", "100"], "Steps (0 = the gradient at "
                    "initialisation) at which per-layer norms are kept, besides the last step; "
                    "those past --steps are ignored.")
  flags.DEFINE_float("initializer_range", 0.02, "Std of the truncated-normal init of every "
                     "weight (BERT: 0.02; Xavier's sqrt(2 / (d + 4d)) for the FFN at width 64 "
                     "is ~0.079, the scale of Xiong et al.'s analysis).")
  flags.DEFINE_string("out", "experiments/results/layer_grads", "Report directory.")
  flags.DEFINE_bool("report", False, "Only redraw results.md and the plots from --out's CSVs "
                    "(the settings in the header come from the flags given).")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one invocation sweeps and how each point trains (the flags' values)."""
  depths: tuple[int, ...] = (6, 12, 24)
  norms: tuple[str, ...] = ("post", "pre")
  seeds: tuple[int, ...] = (0, 1)
  width: int = 64
  steps: int = 200
  lr: float = 1e-3
  warmup: int = 0
  schedule_steps: int = 2000
  record_at: tuple[int, ...] = (0, 10, 50, 100)
  initializer_range: float = 0.02

  @classmethod
  def from_flags(cls) -> "Settings":
    f = flags.FLAGS
    for n in f.norms:
      if n not in ("post", "pre"):
        raise app.UsageError(f"--norms: {n!r}; give post and/or pre.")
    return cls(tuple(map(int, f.depths)), tuple(f.norms), tuple(map(int, f.seeds)), f.width,
               f.steps, f.lr, f.warmup, f.schedule_steps, tuple(map(int, f.record_at)),
               f.initializer_range)


def per_layer_norms(grads) -> dict:
  """Norms per layer (scanned layers: the leading axis of every block parameter) of the
  gradient of each layer's FFN output kernel and of all its parameters."""
  import jax
  import jax.numpy as jnp
  blocks = grads["bert"]["encoder"]["blocks"]

  def sq(x):
    x = x.astype(jnp.float32)
    return jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)))

  (w2,) = jax.tree.leaves(blocks["ffn_out"]["kernel"])
  return {"layer_grad_norm": jnp.sqrt(sum(sq(x) for x in jax.tree.leaves(blocks))),
          "w2_grad_norm": jnp.sqrt(sq(w2))}


def point_config(depth: int, norm: str, seed: int, width: int, lr: float, warmup: int,
                 schedule_steps: int, initializer_range: float = 0.02):
  from configs import pretrain
  config = pretrain.get_config(f"runlocal,block=alibi,norm={norm}")
  config.model.update(dict(num_layers=depth, hidden_size=width, ffn_size=4 * width,
                           num_heads=max(1, width // 16), scan_layers="True",
                           initializer_range=initializer_range))
  config.optim.update(dict(learning_rate=lr, warmup_steps=warmup,
                           total_steps=max(schedule_steps, 1)))
  config.train.update(dict(steps=max(schedule_steps, 1)))
  config.seed = seed
  return config


def run_point(cfg: Settings, depth: int, norm: str, seed: int) -> dict:
  """Trains one point cfg.steps steps (at least one: step 0's metrics are the gradient at
  initialisation, computed before the update); per-layer norms at cfg.record_at and at the
  last step."""
  import jax
  from encoder_jax.train import setup as setup_lib
  from encoder_jax.train import step as step_lib
  config = point_config(depth, norm, seed, cfg.width, cfg.lr, cfg.warmup, cfg.schedule_steps,
                        cfg.initializer_range)
  steps = cfg.steps
  record_at = set(cfg.record_at) | {0, max(steps, 1) - 1}  # always the first and last step
  s = setup_lib.build(config)
  tr = s.trainer
  step_fn = step_lib.make_step(lambda p, st, b: step_lib.train_loss(tr, p, st, b), tr.tx,
                               tr.schedule, grad_metrics=per_layer_norms)
  state = jax.jit(s.init_fn)()
  it = iter(setup_lib.make_loader(s.data, "train"))
  layers, curve, status = {}, [], "done"
  for i in range(max(steps, 1)):
    state, m = step_fn(state, next(it))
    m = jax.device_get(m)
    loss, gnorm = float(m["loss"]), float(m["grad_norm"])
    curve.append((i, loss, gnorm))
    if i in record_at:
      layers[i] = (np.asarray(m["w2_grad_norm"]), np.asarray(m["layer_grad_norm"]))
    if not (math.isfinite(loss) and math.isfinite(gnorm)):
      status = f"diverged at step {i}"
      break
  return {"layers": layers, "curve": curve, "status": status}


def ratio(w2: np.ndarray) -> float:
  """Top layer's W2 gradient norm over the bottom layer's."""
  return float(w2[-1] / w2[0])


LOSS_WINDOW = 50  # the report's loss: mean over the last this many steps (one batch is noisy)


def write_report(out: pathlib.Path, results: dict, cfg: Settings) -> None:
  """layers.csv and curves.csv (everything measured), then results.md and the plots."""
  with open(out / "layers.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["depth", "norm", "seed", "step", "layer", "w2_grad_norm", "layer_grad_norm"])
    for (depth, norm, seed), r in results.items():
      for step, (w2, lay) in sorted(r["layers"].items()):
        for layer in range(depth):
          w.writerow([depth, norm, seed, step, layer + 1, f"{w2[layer]:.6g}",
                      f"{lay[layer]:.6g}"])
  with open(out / "curves.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["depth", "norm", "seed", "step", "loss", "grad_norm"])
    for (depth, norm, seed), r in results.items():
      for step, loss, g in r["curve"]:
        w.writerow([depth, norm, seed, step, f"{loss:.6g}", f"{g:.6g}"])
  report(out, results, cfg)


def read_results(out: pathlib.Path) -> dict:
  """The results dict of run_point's shape, back from layers.csv and curves.csv (--report)."""
  results: dict = {}
  with open(out / "curves.csv") as f:
    for row in csv.DictReader(f):
      r = results.setdefault((int(row["depth"]), row["norm"], int(row["seed"])),
                             {"layers": {}, "curve": [], "status": "done"})
      r["curve"].append((int(row["step"]), float(row["loss"]), float(row["grad_norm"])))
  per_step: dict = {}
  with open(out / "layers.csv") as f:
    for row in csv.DictReader(f):
      key = (int(row["depth"]), row["norm"], int(row["seed"]), int(row["step"]))
      per_step.setdefault(key, []).append((int(row["layer"]), float(row["w2_grad_norm"]),
                                           float(row["layer_grad_norm"])))
  for (depth, norm, seed, step), rows in per_step.items():
    rows.sort()
    results[(depth, norm, seed)]["layers"][step] = (np.array([r[1] for r in rows]),
                                                    np.array([r[2] for r in rows]))
  for r in results.values():
    last = r["curve"][-1]
    if not (math.isfinite(last[1]) and math.isfinite(last[2])):
      r["status"] = f"diverged at step {last[0]}"
  return results


def report(out: pathlib.Path, results: dict, cfg: Settings) -> None:
  """results.md (opening with the commit of the invocation recorded in out's provenance.json)
  and the plots."""
  steps = max((len(r["curve"]) for r in results.values()), default=0)
  depths = sorted({k[0] for k in results})
  norms = [n for n in ("post", "pre") if any(k[1] == n for k in results)]
  last = max((s for r in results.values() for s in r["layers"]), default=0)
  lines = [provenance.produced_by(provenance.read(out)), "",
           f"### Per-layer gradient norms, post-LN vs pre-LN (width {cfg.width}, init std "
           f"{cfg.initializer_range:g}, lr {cfg.lr:g}, warm-up {cfg.warmup} steps, {steps} "
           "steps)",
           "",
           "W2 = each layer's FFN output kernel (Xiong et al. 2020, Figure 3). Ratio: the top "
           "layer's W2 gradient norm over the bottom layer's; median [min, max] over seeds.", "",
           "| depth | norm | seeds | top/bottom W2 at init | W2 norm at init (bottom, top) | "
           f"top/bottom W2 at step {last} | train loss, mean of the last {LOSS_WINDOW} steps | "
           "status |",
           "|---|---|---|---|---|---|---|---|"]

  def fmt(vals):
    vals = sorted(vals)
    return (f"{np.median(vals):.3g} [{vals[0]:.3g}, {vals[-1]:.3g}]" if vals else "-")

  for depth in depths:
    for norm in norms:
      rs = [r for k, r in results.items() if k[:2] == (depth, norm)]
      init = [r["layers"][0][0] for r in rs if 0 in r["layers"]]
      later = [ratio(r["layers"][last][0]) for r in rs if last in r["layers"]]
      bottom = np.median([w2[0] for w2 in init]) if init else float("nan")
      top = np.median([w2[-1] for w2 in init]) if init else float("nan")
      losses = [float(np.mean([c[1] for c in r["curve"][-LOSS_WINDOW:]])) for r in rs
                if r["curve"]]
      status = ", ".join(sorted({r["status"] for r in rs}))
      lines.append(f"| {depth} | {norm} | {len(rs)} | {fmt([ratio(w) for w in init])} | "
                   f"{bottom:.3g}, {top:.3g} | {fmt(later) if last else '-'} | "
                   f"{fmt(losses) if steps else '-'} | {status} |")
  (out / "results.md").write_text("\n".join(lines) + "\n")
  plot(out, results, depths, norms, last)
  plot_losses(out, results, depths)


def plot(out: pathlib.Path, results: dict, depths, norms, last: int) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  steps = [0] + ([last] if last else [])
  fig, axes = plt.subplots(len(steps), len(depths), figsize=(4 * len(depths), 3.2 * len(steps)),
                           squeeze=False)
  colors = {"post": "tab:red", "pre": "tab:blue"}
  for i, step in enumerate(steps):
    for j, depth in enumerate(depths):
      ax = axes[i][j]
      for (d, norm, seed), r in sorted(results.items()):
        if d != depth or step not in r["layers"]:
          continue
        w2 = r["layers"][step][0]
        ax.plot(range(1, depth + 1), w2, color=colors[norm], marker=".",
                label=f"{norm}-LN" if seed == min(k[2] for k in results if k[:2] == (d, norm))
                else None, alpha=0.8)
      ax.set_yscale("log")
      ax.set_title(f"{depth} layers, {'initialisation' if step == 0 else f'step {step}'}")
      ax.set_xlabel("layer")
      ax.set_ylabel("|grad W2| (FFN output kernel)")
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "layer_grads.png", dpi=110)
  plt.close(fig)


def plot_losses(out: pathlib.Path, results: dict, depths) -> None:
  """Train loss against step (moving average over 20 steps), one panel per depth."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(depths), figsize=(4 * len(depths), 3.2), squeeze=False)
  colors = {"post": "tab:red", "pre": "tab:blue"}
  for ax, depth in zip(axes[0], depths):
    for (d, norm, seed), r in sorted(results.items()):
      if d != depth or not r["curve"]:
        continue
      loss = np.array([c[1] for c in r["curve"]])
      k = min(20, len(loss))
      smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
      ax.plot(np.arange(k - 1, len(loss)), smooth, color=colors[norm], alpha=0.8,
              label=f"{norm}-LN seed {seed}")
    ax.set_title(f"{depth} layers")
    ax.set_xlabel("step")
    ax.set_ylabel("train MLM loss (20-step mean)")
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / "loss_curves.png", dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  provenance.pin_git_state()  # the code this process runs is the tree's now
  cfg = Settings.from_flags()
  out = pathlib.Path(flags.FLAGS.out)
  if flags.FLAGS.report:
    report(out, read_results(out), cfg)
    print((out / "results.md").read_text())
    return
  out.mkdir(parents=True, exist_ok=True)
  results, t0 = {}, time.time()
  keys = [(d, n, s) for d in cfg.depths for n in cfg.norms for s in cfg.seeds]
  for i, (depth, norm, seed) in enumerate(keys):
    t = time.time()
    r = run_point(cfg, depth, norm, seed)
    results[(depth, norm, seed)] = r
    w2 = r["layers"][0][0]
    print(f"[{i + 1}/{len(keys)}] depth {depth} {norm}-LN seed {seed}: W2 grad norm at init "
          f"bottom {w2[0]:.3g} top {w2[-1]:.3g} (x{ratio(w2):.2f}); loss at step "
          f"{r['curve'][-1][0]} {r['curve'][-1][1]:.3f}; {r['status']}  "
          f"[{time.time() - t:.0f} s, {(time.time() - t0) / 60:.1f} min in all]", flush=True)
  provenance.record_tool(out, "experiments.layer_grads",
                         {f: flags.FLAGS[f].value for f in FLAG_NAMES}, (time.time() - t0) / 60)
  write_report(out, results, cfg)  # (after the record: results.md opens with its commit)
  print((out / "results.md").read_text())
  print(f"wrote {out}/layers.csv, curves.csv, results.md, layer_grads.png, loss_curves.png, "
        "provenance.json")


if __name__ == "__main__":
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  define_flags()
  cli.run(main, "experiments.layer_grads")
