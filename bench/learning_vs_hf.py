r"""Learning per second: our trainer vs HF torch `BertForMaskedLM` on the same recipe.

  python -m bench.learning_vs_hf                       # tiny, 800 steps, + demo recipe
  python -m bench.learning_vs_hf --steps=20 --warmup_steps=5 --eval_every=10 --nodemo
  python -m bench.learning_vs_hf --dry_run --out_dir=/tmp/x   # 3 steps: are the inputs equal?

1. Same recipe. Our trainer (configs/pretrain.py, post-LN, --size) and HF's BertForMaskedLM of
   the same shape start from the same weights (ours exported with
   encoder_jax.hf.bert.export_hf_bert), see the same rows (our loader's FULL-SENTENCES
   batches of the demo corpus with the demo vocab, in stream order) with the same masks (HF
   gets them corrupted on the host by our `mask_tokens`, keyed as our step keys its own:
   fold_in(key(seed), step)), and the same optimiser (AdamW 0.9/0.999/1e-6, decay 0.01 off
   LayerNorm and biases, linear warm-up then linear decay to 0, clipping at 1.0). Only the
   dropout masks differ (each framework draws its own). Both score masked-token accuracy and
   loss on the same held-out batches with the same masks (our eval step's keys) at the same
   steps, beside the unigram baseline on those positions. `--noise_seeds` more runs of ours
   with other seeds (other rows, masks, init, dropout) show how far two runs of one recipe
   drift apart; the binomial standard error shows the eval sampling noise.
2. Our demo recipe (configs/pretrain.py:runlocal, --demo_arg): trained for the wall-clock the
   HF run took, evaluated on the shared batches when its vocab and row length allow it,
   otherwise on its own held-out batches (the printout says which and how the recipes differ).

Every learner runs in its own process (bench/systems.Worker), one after the other, with the
whole machine; wall-clock counts training steps only (evaluation is untimed, our compilation
is reported apart). Writes learning_vs_hf_<date>.{txt,json,png} to --out_dir.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import sys
import tempfile
import time

from absl import app, flags
import numpy as np

from bench import learners, systems

_SIZE = flags.DEFINE_string("size", "tiny", "Model size (encoder_jax SIZES key); post-LN.")
_STEPS = flags.DEFINE_integer("steps", 800, "Training steps of the same-recipe runs (also the "
                              "decay horizon of the schedule).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Rows per step.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per row (FULL-SENTENCES rows).")
_LR = flags.DEFINE_float("lr", 1e-3, "Peak learning rate.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 100, "Linear warm-up steps (then linear to 0).")
_DROPOUT = flags.DEFINE_float("dropout", 0.1, "Hidden and attention-probability dropout.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the compared runs: init, rows, masks.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 50, "Evaluate every this many steps (and at 0).")
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", 8, "Held-out batches per evaluation.")
_NOISE = flags.DEFINE_integer("noise_seeds", 1, "Extra runs of ours with seed+1, seed+2, ...: "
                              "the run-to-run spread the ours-vs-HF gap is judged against.")
_DEMO = flags.DEFINE_bool("demo", True, "Also run our demo recipe for HF's wall-clock.")
_DEMO_ARG = flags.DEFINE_string("demo_arg", "runlocal", "configs/pretrain.py argument of the "
                                "demo recipe.")
_DEMO_EVAL_EVERY = flags.DEFINE_integer("demo_eval_every", 50, "Demo recipe: evaluate every "
                                        "this many steps.")
_DEMO_BUDGET = flags.DEFINE_float("demo_budget_s", 0.0, "Demo recipe's training wall-clock "
                                  "(0: what the HF run took).")
_TARGET = flags.DEFINE_float("target_accuracy", 0.0, "Accuracy of the headline time-to-target "
                             "(0: the highest accuracy both systems reach).")
_THREADS = flags.DEFINE_integer("threads", os.cpu_count() or 1, "torch threads for HF.")
_HF_ATTN = flags.DEFINE_enum("hf_attn", "sdpa", ["sdpa", "eager"], "HF attn_implementation.")
_OUT = flags.DEFINE_string("out_dir", os.path.join(systems.REPO, "bench", "results"),
                           "Where the .txt/.json/.png go.")
_TAG = flags.DEFINE_string("tag", "", "Suffix of the output file names.")
_DRY = flags.DEFINE_bool("dry_run", False, "3 steps of batch 4, one eval batch, no dropout, "
                         "no extra seeds or demo run: checks that both systems saw the same "
                         "inputs, start from the same loss and take the same first updates "
                         "(exit 1 if not). ~30 s.")

TOL = 1e-4  # equal fp32 computations of the same loss agree to ~1e-6 at these sizes


def same_recipe_config(seed: int):
  from configs import pretrain as pretrain_config
  # fp32 matmuls: HF's BertForMaskedLM computes in fp32, and the comparison is of the same
  # computation (precision=auto would round our matmul operands to bf16 on an AVX-512 BF16 CPU,
  # ~2e-4 apart at step 0 instead of ~1e-6).
  config = pretrain_config.get_config(f"size={_SIZE.value},norm=post,precision=fp32")
  config.seed = seed
  config.data.update(dict(vocab="demo", format="full_sentences", max_length=_SEQ.value,
                          batch_size=_BATCH.value, pack=False))
  config.model.update(dict(hidden_dropout=_DROPOUT.value, attention_dropout=_DROPOUT.value))
  # mask_frac / random_frac stay None: the MLM default, BERT's 80/10/10 (ObjectiveConfig).
  config.objective.update(dict(objective="mlm", sentence_task="none", mask_rate=0.15,
                               whole_word=False, masking="dynamic"))
  config.optim.update(dict(optimizer="adamw", learning_rate=_LR.value, b1=0.9, b2=0.999,
                           eps=1e-6, weight_decay=0.01, schedule="linear",
                           warmup_steps=_WARMUP.value, total_steps=_STEPS.value,
                           end_lr_frac=0.0, clip_grad_norm=1.0, accumulation_steps=1))
  config.train.update(dict(steps=_STEPS.value, eval_every=_EVAL_EVERY.value,
                           eval_steps=_EVAL_BATCHES.value))
  return config


def corrupt_fn(obj):
  """jit(key, ids, mask) -> (corrupted ids, [B, T] labels): `loss_and_metrics`' masking."""
  import jax
  import jax.numpy as jnp
  from encoder_jax.objectives.masking import mask_tokens
  if obj.is_electra or obj.whole_word or obj.masking != "dynamic":
    raise ValueError("the HF peer gets plain dynamic MLM masks only.")
  mask_frac, random_frac = obj.fractions

  @jax.jit
  def corrupt(key, ids_BxT, mask_BxT):
    k_mask = jax.random.split(key, 3)[0]  # loss_and_metrics: k_mask, k_drop, k_sample
    mask_BxT = mask_BxT.astype(bool)
    maskable_BxT = mask_BxT & ~jnp.isin(ids_BxT, jnp.asarray(obj.special_ids, ids_BxT.dtype))
    m = mask_tokens(k_mask, ids_BxT, maskable_BxT, vocab_size=obj.vocab_size,
                    mask_id=obj.mask_id, rate=obj.mask_rate,
                    max_predictions=obj.max_predictions, mask_frac=mask_frac,
                    random_frac=random_frac, special_ids=obj.special_ids)
    return m.ids_BxT, m.labels_BxT
  return corrupt


def prepare_hf(config, workdir: str, hf_dir: str) -> dict:
  """Writes HF's corrupted train and eval batches to `workdir`; the payload of HfLearner,
  which starts from the weights our run exported to `hf_dir`."""
  import jax
  from encoder_jax.train import setup
  from encoder_jax.train import step as step_lib
  s = setup.build(config)
  corrupt = corrupt_fn(s.obj)
  eval_seed = inspect.signature(step_lib.make_eval_step).parameters["eval_seed"].default
  arrays = {}
  for split, n, key_of in (
      ("train", _STEPS.value, lambda i: step_lib.step_key(config.seed, i)),
      ("eval", config.train.eval_steps, lambda i: step_lib.step_key(eval_seed, i))):
    it = iter(setup.make_loader(setup.DataSettings.of(config),
                                "train" if split == "train" else config.data.eval_split))
    cols = {k: [] for k in ("ids", "mask", "token_types", "positions", "labels")}
    for i in range(n):
      b = next(it)
      if b["segment_ids"].max() > 1:
        raise ValueError("packed rows: HF's BertForMaskedLM cannot keep examples apart.")
      ids, labels = jax.device_get(corrupt(key_of(i), b["input_ids"], b["mask"]))
      for k, v in (("ids", ids), ("mask", b["mask"]), ("token_types", b["token_types"]),
                   ("positions", b["positions"]), ("labels", labels)):
        cols[k].append(np.asarray(v, np.int32))
    arrays |= {f"{split}_{k}": np.stack(v) for k, v in cols.items()}
  data = os.path.join(workdir, "hf_batches.npz")
  np.savez(data, **arrays)
  o = config.optim
  return dict(hf_dir=hf_dir, data=data, seed=config.seed, attn=_HF_ATTN.value,
              optim=dict(lr=o.learning_rate, b1=o.b1, b2=o.b2, eps=o.eps,
                         weight_decay=o.weight_decay, warmup_steps=o.warmup_steps,
                         total_steps=o.total_steps, clip=o.clip_grad_norm))


def train_curve(name: str, spec, payload, factory, steps: int, every: int,
                budget_s: float | None = None) -> dict:
  """Trains one learner in its own process; a point (eval + cumulative wall) every `every`."""
  t0 = time.perf_counter()
  with systems.Worker(spec, payload, factory=factory) as w:
    info = w.info()
    print(f"{name}: ready in {time.perf_counter() - t0:.0f} s"
          + (f" (compile {info['compile_s']:.1f} s)" if "compile_s" in info else ""), flush=True)
    tps = info["tokens_per_step"]
    points = [dict(step=0, tokens=0, wall_s=0.0, **info["eval"], train_loss=None)]
    wall = 0.0
    while info["step"] < steps and (budget_s is None or wall < budget_s):
      n = min(every, steps - info["step"])
      if budget_s is not None and info["step"]:  # stop near the budget, not a segment past it
        n = max(1, min(n, math.ceil((budget_s - wall) * info["step"] / wall)))
      dw, _ = w.run(n)
      wall += dw
      info = w.info()
      e = info["eval"]
      points.append(dict(step=info["step"], tokens=info["step"] * tps, wall_s=wall, **e,
                         train_loss=info["train_loss"]))
      eta = (wall / info["step"] * (steps - info["step"]) if budget_s is None
             else max(0.0, min(budget_s - wall, wall / info["step"] * (steps - info["step"]))))
      uni = (f" (unigram {e['unigram_accuracy']:.1%} / {e['unigram_loss']:.3f})"
             if "unigram_accuracy" in e else "")
      print(f"{name}: step {info['step']}/{steps} | {info['step'] * tps / 1e6:.2f}M tok | "
            f"{n * tps / dw:,.0f} tok/s | train loss {info['train_loss']:.3f} | eval acc "
            f"{e['accuracy']:.2%} loss {e['loss']:.3f}{uni} | {wall:.0f} s | ETA {eta:.0f} s",
            flush=True)
  return dict(name=name, points=points, first_digest=info["first_digest"],
              first_loss=info["first_loss"], compile_s=info.get("compile_s"),
              tokens_per_step=tps)


def time_to(points: list[dict], target: float, key: str) -> float | None:
  """`key` (wall_s or tokens) where accuracy first reaches `target`, linearly interpolated."""
  for a, b in zip(points, points[1:]):
    if b["accuracy"] >= target:
      if a["accuracy"] >= target:
        return a[key]
      f = (target - a["accuracy"]) / (b["accuracy"] - a["accuracy"])
      return a[key] + f * (b[key] - a[key])
  return None


def checks(ours: dict, hf: dict, dropout: float) -> list[tuple[str, bool, str]]:
  """(what, ok, detail): did the two systems see the same inputs and start equal?"""
  out = [("first batch's corrupted ids + labels", ours["first_digest"] == hf["first_digest"],
          f"sha256 ours {ours['first_digest']} HF {hf['first_digest']}")]
  d0 = abs(ours["points"][0]["loss"] - hf["points"][0]["loss"])
  out.append(("eval loss at step 0 (same weights, same masks)", d0 <= TOL,
              f"ours {ours['points'][0]['loss']:.6f} HF {hf['points'][0]['loss']:.6f} "
              f"|diff| {d0:.1e} (tolerance {TOL:g})"))
  if dropout == 0.0:  # without dropout the first step is deterministic on both sides
    d1 = abs(ours["first_loss"] - hf["first_loss"])
    out.append(("train loss of step 1 (our jitted step vs HF forward)", d1 <= TOL,
                f"ours {ours['first_loss']:.6f} HF {hf['first_loss']:.6f} |diff| {d1:.1e}"))
    last_o, last_h = ours["points"][-1], hf["points"][-1]
    dl = abs(last_o["loss"] - last_h["loss"])
    out.append((f"eval loss after {last_o['step']} updates (same optimiser)", dl <= 10 * TOL,
                f"ours {last_o['loss']:.6f} HF {last_h['loss']:.6f} |diff| {dl:.1e} "
                f"(tolerance {10 * TOL:g})"))
  return out


def comparison_table(ours: dict, hf: dict, seeds: list[dict]) -> list[str]:
  lines = [f"{'step':>5s} {'tokens':>9s} | {'ours acc':>8s} {'loss':>6s} {'wall s':>7s} | "
           f"{'HF acc':>7s} {'loss':>6s} {'wall s':>7s} | {'HF-ours':>8s} {'±2SE':>6s} "
           f"{'seed Δ':>7s} | {'unigram':>7s}"]
  lines.append("-" * len(lines[0]))
  by_step = {p["step"]: p for p in hf["points"]}
  seed_by_step = [{p["step"]: p for p in s["points"]} for s in seeds]
  for o in ours["points"]:
    h = by_step.get(o["step"])
    if h is None:
      continue
    se = 2 * math.sqrt(sum(p["accuracy"] * (1 - p["accuracy"]) / p["count"] for p in (o, h)))
    sd = [s[o["step"]]["accuracy"] - o["accuracy"] for s in seed_by_step if o["step"] in s]
    lines.append(
        f"{o['step']:5d} {o['tokens']:9,d} | {o['accuracy']:8.2%} {o['loss']:6.3f} "
        f"{o['wall_s']:7.1f} | {h['accuracy']:7.2%} {h['loss']:6.3f} {h['wall_s']:7.1f} | "
        f"{h['accuracy'] - o['accuracy']:+8.2%} {se:6.2%} "
        f"{(f'{sd[0]:+7.2%}' if sd else '      -')} | {o['unigram_accuracy']:7.2%}")
  return lines


def noise_summary(ours: dict, hf: dict, seeds: list[dict]) -> list[str]:
  hf_by = {p["step"]: p for p in hf["points"]}
  pts = [(o, hf_by[o["step"]]) for o in ours["points"][1:] if o["step"] in hf_by]
  if not pts:
    return []
  diffs = [h["accuracy"] - o["accuracy"] for o, h in pts]
  se2 = [2 * math.sqrt(sum(p["accuracy"] * (1 - p["accuracy"]) / p["count"] for p in (o, h)))
         for o, h in pts]
  mean_abs = float(np.mean(np.abs(diffs)))
  lines = [f"HF - ours at equal tokens over {len(diffs)} evals: mean {np.mean(diffs):+.2%}, "
           f"mean |.| {mean_abs:.2%}, HF ahead at {sum(d > 0 for d in diffs)}/{len(diffs)}, "
           f"outside ±2 binomial SE at {sum(abs(d) > s for d, s in zip(diffs, se2))}/"
           f"{len(diffs)} (mean 2SE {np.mean(se2):.2%})"]
  seed_abs = []
  for s in seeds:
    by = {p["step"]: p for p in s["points"]}
    seed_abs += [abs(by[o["step"]]["accuracy"] - o["accuracy"])
                 for o, _ in pts if o["step"] in by]
  noise = max(float(np.mean(se2)), float(np.mean(seed_abs)) if seed_abs else 0.0)
  if seed_abs:
    lines.append(f"ours seed+k - ours seed at the same evals: mean |.| {np.mean(seed_abs):.2%} "
                 "(run-to-run spread of one recipe)")
  lines.append(f"verdict: {'within' if mean_abs <= noise else 'OUTSIDE'} noise (rule: mean "
               f"|HF-ours| <= max(mean 2SE, mean |seed spread|) = {noise:.2%})")
  return lines


def headline(ours: dict, hf: dict) -> list[str]:
  best = min(max(p["accuracy"] for p in ours["points"]),
             max(p["accuracy"] for p in hf["points"]))
  target = _TARGET.value or best
  t_o, t_h = time_to(ours["points"], target, "wall_s"), time_to(hf["points"], target, "wall_s")
  k_o, k_h = time_to(ours["points"], target, "tokens"), time_to(hf["points"], target, "tokens")
  fmt = lambda t, k: "not reached" if t is None else f"{t:.1f} s ({k:,.0f} tokens)"
  lines = [f"time to {target:.2%} eval accuracy ("
           f"{'--target_accuracy' if _TARGET.value else 'the highest both reach'}): ours "
           f"{fmt(t_o, k_o)}, HF {fmt(t_h, k_h)}"]
  if t_o and t_h:
    lines.append(f"HEADLINE: HF / ours wall-clock to {target:.2%} = {t_h / t_o:.2f}x"
                 + (f" (with our {ours['compile_s']:.1f} s compile: "
                    f"{t_h / (t_o + ours['compile_s']):.2f}x)" if ours["compile_s"] else ""))
  return lines


def config_diff(a, b, prefix="") -> list[str]:
  """Leaves that differ between two ConfigDicts (`a` the demo recipe, `b` the same recipe),
  after resolving the decay horizon's sentinel (optim.total_steps = 0: train.steps)."""
  da, db = a.to_dict(), b.to_dict()
  for d in (da, db):
    if not d["optim"]["total_steps"]:
      d["optim"]["total_steps"] = max(1, d["train"]["steps"] // d["optim"]["accumulation_steps"])
  out = []

  def walk(x, y, path):
    for k in sorted(set(x) | set(y)):
      u, v = x.get(k, "<absent>"), y.get(k, "<absent>")
      if isinstance(u, dict) and isinstance(v, dict):
        walk(u, v, f"{path}{k}.")
      elif u != v:
        out.append(f"{prefix}{path}{k}: {u!r} (demo) vs {v!r} (same recipe)")
  walk(da, db, "")
  return out


def run_demo(base, budget_s: float) -> tuple[dict, list[str]]:
  from configs import pretrain as pretrain_config
  config = pretrain_config.get_config(_DEMO_ARG.value)
  config.seed = base.seed
  shared = (config.data.vocab == base.data.vocab
            and config.data.max_length == base.data.max_length)
  if shared:
    eval_config = base
    note = "evaluated on the shared held-out batches and masks (same vocab and row length)"
  else:
    eval_config = config.copy_and_resolve_references()
    tokens = base.data.batch_size * base.data.max_length * base.train.eval_steps
    eval_config.train.eval_steps = max(1, round(tokens / (config.data.batch_size *
                                                          config.data.max_length)))
    note = ("evaluated on ITS OWN held-out batches and masks (vocab or row length differ from "
            "the same recipe's): its accuracy is not comparable point for point")
  steps = config.train.steps
  spec = learners.LearnSpec(system="ours", label=f"ours demo recipe ({_DEMO_ARG.value})")
  curve = train_curve(f"demo ({_DEMO_ARG.value})", spec,
                      dict(config=config, eval_config=eval_config, steps=steps),
                      learners.OursLearner, steps, _DEMO_EVAL_EVERY.value, budget_s=budget_s)
  lines = [f"Our demo recipe, configs/pretrain.py:{_DEMO_ARG.value}, for {budget_s:.0f} s of "
           f"training (HF's wall-clock) or its {steps} steps: {note}.",
           "How it differs from the same-recipe runs:"]
  lines += ["  " + x for x in config_diff(config, base) if not x.startswith("train.")]
  lines.append(f"{'step':>5s} {'tokens':>9s} {'wall s':>7s} {'acc':>7s} {'loss':>6s} "
               f"{'unigram acc':>11s}")
  for p in curve["points"]:
    lines.append(f"{p['step']:5d} {p['tokens']:9,d} {p['wall_s']:7.1f} {p['accuracy']:7.2%} "
                 f"{p['loss']:6.3f} {p['unigram_accuracy']:11.2%}")
  curve["shared_eval"] = shared
  return curve, lines


def plot(curves: list[dict], path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for c in curves:
    style = "--" if c["name"].startswith("ours seed") else "-"
    for ax, key, scale in ((axes[0], "tokens", 1e6), (axes[1], "wall_s", 1.0)):
      ax.plot([p[key] / scale for p in c["points"]], [p["accuracy"] for p in c["points"]],
              style, marker=".", label=c["name"] + ("" if c.get("shared_eval", True)
                                                     else " (own eval)"))
  uni = curves[0]["points"][0]["unigram_accuracy"]
  for ax, xlabel in ((axes[0], "training tokens (M)"), (axes[1], "training wall-clock (s)")):
    ax.axhline(uni, color="gray", lw=0.8, ls=":", label="unigram baseline (shared eval)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out masked-token accuracy")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  if _DRY.value:
    for flag, value in ((_STEPS, 3), (_BATCH, 4), (_EVAL_EVERY, 1), (_EVAL_BATCHES, 1),
                        (_WARMUP, 1), (_DROPOUT, 0.0), (_NOISE, 0), (_DEMO, False)):
      flags.FLAGS[flag.name].value = value
  if _EVAL_EVERY.value < 1 or _STEPS.value < 1:
    raise app.UsageError("--steps and --eval_every must be >= 1.")
  if not 0 <= _WARMUP.value <= _STEPS.value:
    raise app.UsageError(f"--warmup_steps={_WARMUP.value} must be in [0, --steps="
                         f"{_STEPS.value}]; e.g. --steps=20 --warmup_steps=5.")
  base = same_recipe_config(_SEED.value)
  out = [f"learning_vs_hf, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores: "
         + " ".join(sys.argv[1:]),
         f"same recipe: {_SIZE.value} post-LN, FULL-SENTENCES rows of {_SEQ.value} (demo corpus, "
         f"demo vocab), batch {_BATCH.value}, {_STEPS.value} steps, MLM 15% 80/10/10, dropout "
         f"{_DROPOUT.value}, AdamW lr {_LR.value:g} warm-up {_WARMUP.value} then linear to 0, "
         f"clip 1.0; eval {_EVAL_BATCHES.value} held-out batches every {_EVAL_EVERY.value} steps"]
  print("\n".join(out), flush=True)
  with tempfile.TemporaryDirectory() as tmp:
    hf_dir = os.path.join(tmp, "hf_init")
    ours_spec = learners.LearnSpec(system="ours", label="ours")
    ours = train_curve("ours", ours_spec, dict(config=base, eval_config=base,
                                               steps=_STEPS.value, export_dir=hf_dir),
                       learners.OursLearner, _STEPS.value, _EVAL_EVERY.value)
    hf_payload = prepare_hf(base, tmp, hf_dir)
    hf = train_curve("HF", learners.LearnSpec(system="hf", label="HF BertForMaskedLM",
                                              threads=_THREADS.value),
                     hf_payload, learners.HfLearner, _STEPS.value, _EVAL_EVERY.value)
  seeds = []
  for k in range(1, _NOISE.value + 1):
    config = same_recipe_config(_SEED.value + k)
    seeds.append(train_curve(f"ours seed {_SEED.value + k}", ours_spec,
                             dict(config=config, eval_config=base, steps=_STEPS.value),
                             learners.OursLearner, _STEPS.value, _EVAL_EVERY.value))
  results = checks(ours, hf, _DROPOUT.value)
  out += ["", "Same inputs?"] + [f"  [{'ok' if ok else 'FAIL'}] {what}: {detail}"
                                 for what, ok, detail in results]
  out += ["", "Same recipe, equal tokens (accuracy and loss on the held-out masked positions; "
          "wall s = training only; ±2SE = twice the binomial standard error of the difference; "
          "seed Δ = ours with the next seed minus ours):"]
  out += comparison_table(ours, hf, seeds)
  out += noise_summary(ours, hf, seeds) + headline(ours, hf)
  curves = [ours, hf] + seeds
  if _DEMO.value:
    budget = _DEMO_BUDGET.value or hf["points"][-1]["wall_s"]
    demo, lines = run_demo(base, budget)
    curves.append(demo)
    out += [""] + lines
  report = "\n".join(out)
  print("\n" + report)
  os.makedirs(_OUT.value, exist_ok=True)
  stem = os.path.join(_OUT.value, f"learning_vs_hf_{time.strftime('%Y-%m-%d')}{_TAG.value}")
  with open(stem + ".txt", "w") as f:
    f.write(report + "\n")
  with open(stem + ".json", "w") as f:
    json.dump(dict(curves=curves, checks=[dict(what=w, ok=ok, detail=d) for w, ok, d in results],
                   argv=sys.argv[1:]), f, indent=1)
  plot(curves, stem + ".png")
  print(f"wrote {stem}.txt, .json, .png")
  if not all(ok for _, ok, _ in results):
    print("the two systems did not see the same inputs or start from the same loss: the "
          "comparison is void (see 'Same inputs?')", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
