"""Grid (g): RoBERTa's large batches at equal tokens seen (its Section 4.3 and Table 3).

RoBERTa (Liu et al. 2019, arXiv 1907.11692) Table 3, BERT-base on BOOKCORPUS + WIKIPEDIA, the
same passes over the data and the same compute for every row, the learning rate tuned per
batch size (Section 3.1: the peak learning rate and the warm-up "tuned separately for each
setting"; Adam's b2 0.98 "to improve stability when training with large batch sizes"):

  batch  steps  lr    held-out MLM perplexity  MNLI-m  SST-2
  256    1M     1e-4  3.99                     84.7    92.7
  2K     125K   7e-4  3.68                     85.2    92.9
  8K     31K    1e-3  3.77                     84.6    92.8

Batch 2K beat 256 on every column; 8K still beat 256 on perplexity. The grid asks the same
question of the demo recipe: at equal tokens, the batch x1 / x8 / x64, the learning rate scaled
as the paper's was.

The learning-rate rule (LR_RATIO). The paper's ratios over its batch 256: x8 batch -> x7 lr
(1e-4 -> 7e-4), x32 -> x10 (1e-3). Between its two large batches the lr grew as
batch^0.257 (log(10/7) / log 4), far below the square-root rule (batch^0.5) and the linear
one. x64 extends that last trend one doubling past x32: 10 x 2^0.257 = 11.95, so x12. (The
square-root rule from x32 would give x14; linear scaling from x1, x64.) The demo grid thus runs
lr 2e-3 (the demo recipe's) x1, 1.4e-2 x8 and 2.4e-2 x64.

Warm-up, in tokens: the paper tuned it per setting and does not print it; here every point
warms up over the same tokens as its x1 point (the demo recipe's 100 updates of batch 16 =
102,400 tokens), i.e. ceil(100 / multiple) updates (13 at x8, 2 at x64). At base scale BERT's
10,000 updates of 256 likewise become 1,250 at 2K and 313 at 8K.

Demo scale: every point is the demo recipe it ran on (configs/pretrain.py:runlocal,block=alibi,
pinned now that the recipe's own block is ModernBERT's: tiny pre-LN, ALiBi, no dropout, the demo
8k WordPiece vocab, rows of 64, mask rate 0.2, AdamW b2 0.98, clipping at 1.0; the demo grids'
shared base) with micro-batches of 16 rows and optax.MultiSteps accumulating 1, 8 or 64 of them
per update (optim.accumulation_steps). train.steps counts micro-batches, so every point makes
DEMO_STEPS calls of the same compiled step on the same rows in the same order with the same
masks (the masks fold in the call index): the points differ only in how the gradients are
grouped into updates and in the schedule. The x64 point makes DEMO_STEPS / 64 updates. The same
32 held-out batches are scored at each quarter of the run. Accumulation is no slower per token
than a real batch on this CPU (measured 2026-12-07 on the 2-core machine: 2.6k tokens/s at 16
rows, 2.0-2.4k at 128), and keeps the held-out batches and the FLOPs per call of the x1 point.
DEMO_CONTROLS adds the large batches at other learning rates (one seed each): the x1 point's,
and x3 at x8 (about the square-root rule's sqrt(8) = 2.83): whether the learning rate or the
fewer updates decide.

Base scale: the paper's three rows, BERT-base on rows of 512, FULL-SENTENCES without NSP,
dynamic masking (Section 4's setting; `_roberta_base` in experiments.grids), b2 0.98 for all
three. A step call holds at most BASE_MICRO_BATCH rows; the 8K point accumulates 4 of them.
"""
from __future__ import annotations

import math

from experiments import grids
from experiments.grid import Grid, PointSpec, expand

ANCHOR = (
    "RoBERTa (arXiv 1907.11692) Section 4.3, Table 3: BERT-base on BOOKCORPUS + WIKIPEDIA at "
    "equal passes over the data and equal compute, the learning rate tuned per batch size; "
    "held-out MLM perplexity / MNLI-m / SST-2: batch 256, 1M steps, lr 1e-4: 3.99 / 84.7 / "
    "92.7; 2K, 125K, 7e-4: 3.68 / 85.2 / 92.9; 8K, 31K, 1e-3: 3.77 / 84.6 / 92.8. Batch 2K "
    "beat 256 on all three; 8K beat it on perplexity and matched it on the tasks.")

# Batch multiple -> learning-rate multiple of the x1 point (see the module docstring): the
# paper's x8 -> x7 and x32 -> x10 (Table 3), x64 -> x12 by its own trend between x8 and x32.
LR_RATIO = {1: 1.0, 8: 7.0, 32: 10.0, 64: 12.0}
LR_EXPONENT = math.log(LR_RATIO[32] / LR_RATIO[8]) / math.log(32 / 8)  # 0.257

DEMO_MULTIPLES = (1, 8, 64)
BASE_MULTIPLES = (1, 8, 32)  # the paper's 256, 2K, 8K
DEMO_MICRO_BATCH = 16  # the demo recipe's rows of 64 per step call
# 2.1M tokens per point (2,048 calls of 16 x 64), a multiple of 64 x 4 so the x64 point's
# quarters fall on updates. Sized to the 2-core machine shared with other work: 2.5k tokens/s
# there (2026-12-07), ~15 min a point plus ~7 min of fine-tuning, 6 points in ~2.3 h. The demo
# recipe itself trains 15.4M tokens and leaves the unigram plateau within ~1M (experiments.grids).
DEMO_STEPS = 2048
# Controls: batch multiple -> other learning-rate multiples of the x1 point's it also runs at
# (one pre-training seed each), which tell a learning rate too high for the recipe from too few
# updates. Added during the first run, 2026-12-07: x8 at lr x7 ended on the unigram plateau,
# x8 at x1 (the x1 point's lr) left it but ended far above the x1 point; x3 lies between.
# The demo recipe's former block (ALiBi), which the committed points ran on.
DEMO_RECIPE = "size=tiny,objective=mlm,runlocal,block=alibi"
DEMO_CONTROLS = {8: (1.0, 3.0), 64: (1.0,)}
DEMO_EVALS = 4  # held-out evaluations per point, at each quarter
DEMO_WARMUP_TOKENS = 100 * DEMO_MICRO_BATCH * 64  # the demo recipe's warm-up: 100 updates of 16
# Rows of 512 per step call at base scale; the 8K point accumulates 4 such calls per update. On
# a v4-32 (32 devices of 16 GiB, FSDP) that is 64 rows a device: ~13 GiB by scaling
# bench/results/tpu_aot.csv's BERT-large s512 row (4.5 GiB a device for 8 rows; BERT-base holds
# ~3/8 of its activations a token). An estimate, not compiled here: lower it on smaller slices.
BASE_MICRO_BATCH = 2048
BASE_X1 = 256  # BERT-base's batch (Table 3's first row)
BASE_WARMUP_X1 = 10_000  # BERT's warm-up, in updates of 256


def lr_of(base_lr: float, multiple: int) -> float:
  """The peak learning rate of the x`multiple` point (LR_RATIO), to 6 significant digits."""
  if multiple not in LR_RATIO:
    raise ValueError(f"batch multiple {multiple}: the grid's learning-rate rule covers "
                     f"{sorted(LR_RATIO)}; add its ratio to LR_RATIO with the reason.")
  return float(f"{base_lr * LR_RATIO[multiple]:.6g}")


def large_batches(scale: str = "demo", data_source: str = "") -> Grid:
  """Batch x1 / x8 / x64 (base: the paper's x1 / x8 / x32) at equal tokens and equal FLOPs,
  the learning rate and warm-up scaled as the module docstring says; 2 pre-training seeds x 3
  fine-tuning seeds on the demo tasks (demo), GLUE + SQuAD (base)."""
  if scale == "demo":
    multiples, nseeds = DEMO_MULTIPLES, 2
    base_lr = grids.resolve_config(DEMO_RECIPE, {}).optim.learning_rate
    finetune = grids._demo_finetune()  # pylint: disable=protected-access
  elif scale == "base":
    multiples, nseeds, base_lr = BASE_MULTIPLES, 1, 1e-4
    finetune = grids._base_finetune()  # pylint: disable=protected-access
  else:
    raise ValueError(f"large_batches: scale={scale!r}; it has a demo scale (the CPU "
                     "reproduction) and a base scale (the paper's rows, for a pod).")
  x1 = DEMO_MICRO_BATCH if scale == "demo" else BASE_X1
  pairs = {(m, lr_of(base_lr, m)) for m in multiples}  # each batch at its own lr ...
  controls = ({(m, float(f"{base_lr * r:.6g}")) for m, rs in DEMO_CONTROLS.items() for r in rs}
              if scale == "demo" else set())

  def point(v):
    m = v["batch"] // x1
    if (m, v["lr"]) in controls - pairs:  # ... and the controls, on seed 0 only
      if v["seed"]:
        return None
    elif (m, v["lr"]) not in pairs:
      return None
    over = _demo_overrides(m) if scale == "demo" else _base_overrides(m, data_source)
    over["optim.learning_rate"] = v["lr"]
    if scale == "demo":
      over["seed"] = v["seed"]
      return PointSpec(DEMO_RECIPE, over, finetune)
    return PointSpec("size=base,objective=mlm", over, finetune)

  # seed slowest: every arm's first seed finishes before any second seed starts
  axes = {"seed": list(range(nseeds)), "batch": [x1 * m for m in multiples],
          "lr": sorted({lr for _, lr in pairs | controls})}
  return Grid("large_batches", "large batches at equal tokens",
              grids._drop_single_seed(expand(axes, point)),  # pylint: disable=protected-access
              anchor=ANCHOR, curve_keys=("mlm_loss",), perplexity=True)


def _demo_overrides(multiple: int) -> dict:
  warmup = math.ceil(DEMO_WARMUP_TOKENS / (DEMO_MICRO_BATCH * 64 * multiple))
  return {**grids._demo_points(DEMO_STEPS),  # pylint: disable=protected-access
          # the demo recipe's rows of 64 in micro-batches of 16 (not the older grids' 8 x 128)
          "data.max_length": 64, "data.batch_size": DEMO_MICRO_BATCH,
          "optim.accumulation_steps": multiple, "optim.warmup_steps": warmup,
          "train.eval_every": DEMO_STEPS // DEMO_EVALS}


def _base_overrides(multiple: int, data_source: str) -> dict:
  batch = BASE_X1 * multiple
  accumulation = max(1, batch // BASE_MICRO_BATCH)
  calls = 1_000_000 // multiple * accumulation  # 1M, 125k, 31,250 updates
  over = {**grids._roberta_base(data_source),  # pylint: disable=protected-access
          "data.batch_size": batch // accumulation, "optim.accumulation_steps": accumulation,
          "optim.b2": 0.98, "optim.warmup_steps": math.ceil(BASE_WARMUP_X1 / multiple),
          "train.steps": calls}
  # the periodic intervals in calls, on update boundaries
  for key in ("train.eval_every", "train.checkpoint_every", "train.log_every"):
    over[key] = max(accumulation, over[key] // multiple * accumulation)
  return over
