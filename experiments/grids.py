"""The ablation grids: ELECTRA vs MLM, ELECTRA's generator size, NSP and input formats, post-
vs pre-LN, static vs dynamic masking, (f) BERT's block vs ModernBERT's, and (g) large batches at
equal tokens (its own module, experiments/large_batches.py, registered here).

Each grid exists at three scales:
  demo  what this repo's CPU reproductions ran (experiments/results/<grid>/; results of an older
        recipe or code in experiments/results/history/<grid>/): a tiny encoder on the demo
        corpus, minutes per point on 2 CPU cores.
  gpu   the same comparisons on one H100/H200 (experiments/results/<grid>_gpu/): an
        ELECTRA-Small-shaped encoder (12 x 256) in bf16 on the demo corpus, all four main grids
        in about 9 minutes in one process (`bash bench/gpu_grids.sh`; sizing below, GPU_*).
  base  the same comparison at BERT-base scale for a TPU pod or GPU cluster: the published
        recipe's batch, length and steps (BERT, RoBERTa and ELECTRA papers), FLOPs from the counter,
        an estimated time on a v4-32 (`python -m experiments.run --grid=... --scale=base
        --action=plan`).

Every point's pre-training is a configs/pretrain.py argument plus `--config.*` overrides;
fine-tuning jobs score the final checkpoint on the demo tasks (demo) or GLUE + SQuAD (base).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from experiments.grid import FinetuneJob, Grid, Point, PointSpec, expand, make_point, \
    resolve_config, steps_for_budget

SCALES = ("demo", "gpu", "base")

# Downstream jobs. demo: the two demo tasks with the main job's fine-tuning (configs/finetune.py
# run=demo: masked-mean pooling, lr 1e-3, 2 epochs over 2,000 rows, 1,000 dev/test rows).
# base: BERT's GLUE set + SQuAD v1.1 on full data, ELECTRA's many-seed medians.
_DEMO_FT_SEEDS = 3

# Every demo grid starts from the demo recipe (configs/pretrain.py:runlocal: tiny pre-LN with 8
# ALiBi heads, the demo 8k WordPiece vocab, rows of 128, batch 8, mask 0.2, lr 2e-3), which
# leaves the unigram plateau within ~1M tokens on 2 CPU cores (the recipe before it did not in
# 600 steps, so no finding could show). Each point evaluates on 32 held-out batches at its end.
# Grids (b)-(e) ran with the recipe's rows of 128 tokens in batches of 8 (the demo itself now
# uses 16 x 64, the same tokens a step); pinned, so the points are still the ones that ran.
# Their committed results are history (experiments/results/history/<grid>/PROVENANCE.md: fp32
# matmuls and remat "dots" then, the recipe's precision=auto and remat "full" now).
# (a) was re-run on the main job's recipe as it is (see electra_vs_mlm).
# The demo recipe's block until 2026-12-07, pinned: grids (a)-(e) ran on 8 ALiBi heads over a
# learned position table (configs/pretrain.py ALIBI_BLOCK), and their points stay the ones that
# ran now that the recipe's own block is ModernBERT's (runlocal's default block=modern).
_ALIBI_RECIPE = ",runlocal,block=alibi"
_DEMO_RUN = {"train.log_every": 100, "train.eval_steps": 32, "train.keep": 1,
             "data.max_length": 128, "data.batch_size": 8}


def _demo_points(steps: int) -> dict:
  return {**_DEMO_RUN, "train.steps": steps, "train.eval_every": steps,
          "train.checkpoint_every": steps}
_BASE_TASKS = ("glue/mnli", "glue/qnli", "glue/qqp", "glue/sst2", "glue/cola", "glue/stsb",
               "glue/mrpc", "glue/rte", "squad/v1.1")


def _demo_finetune(seeds: int = _DEMO_FT_SEEDS, lr: float | None = 1e-3
                   ) -> tuple[FinetuneJob, ...]:
  """The main job's fine-tuning; by default at the lr 1e-3 and the 2,000 sentiment rows the
  committed results of grids (b) to (e) (experiments/results/history/) were measured with (the
  main job itself has since moved to lr 2e-3 and 4,000 sentiment rows: configs/finetune.py
  demo(); lr=None keeps the main job's)."""
  over = {} if lr is None else {"learning_rate": lr, "max_train_examples": 2000}
  return (FinetuneJob("rotten_tomatoes", seeds=seeds, run="demo", overrides=over),
          FinetuneJob("brown_pos", seeds=seeds, run="demo", overrides=over))


def _base_finetune(seeds: int = 5) -> tuple[FinetuneJob, ...]:
  return tuple(FinetuneJob(t, seeds=seeds, run="full") for t in _BASE_TASKS)


def _base_data(source: str) -> dict:
  return {"data.source": source} if source else {}


def _roberta_base(source: str) -> dict:
  """RoBERTa's BERT-base ablation setting (its Tables 1 and 2): seq 512, batch 256, 1M steps,
  lr 1e-4 with 10k warm-up steps."""
  return {"data.max_length": 512, "data.batch_size": 256, "optim.learning_rate": 1e-4,
          "optim.warmup_steps": 10_000, "train.steps": 1_000_000, "train.log_every": 1000,
          "train.eval_every": 50_000, "train.checkpoint_every": 10_000, **_base_data(source)}


# ------------------------------------------------------------------ gpu scale: one H100/H200
#
# Every gpu point is the demo recipe (runlocal: pre-LN, 8 ALiBi heads, no dropout, the 8k demo
# vocab, mask rate 0.2) on an ELECTRA-Small-shaped encoder (12 layers of 256, embeddings 128;
# ELECTRA Table 6's Small) at ELECTRA-Small's batch of 128 rows of 128 tokens (16k tokens a
# step), bf16 matmuls with fp32 parameters and optimizer state, attention_impl "auto" (cuDNN on
# GPU when it takes the shapes). lr 1e-3 with a 10% warm-up: not measured at this size (the
# demo recipe's 2e-3 was chosen at batch 8 on 2 layers; ELECTRA-Small used 5e-4 over 1M steps).
#
# Sizing. Nothing here has run on a GPU yet; the budget is an estimate from these numbers:
# The GPU the budget is sized for; its dense bf16 peak (SXM: 989 TFLOP/s) is the one in
# encoder_jax.train.flops' table (gpu_peak_flops).
GPU_DEVICE_KIND = "NVIDIA H200"
# Model FLOPs utilisation of a 12 x 256 encoder at 16k tokens a step: each matmul is a few
# GFLOP (microseconds at peak), so kernel launches and element-wise passes dominate; BERT-base
# reaches ~40-50% on such GPUs, a model this narrow far less. Assumed, not measured:
GPU_MFU = 0.12  # -> 1.2e14 FLOP/s sustained, ~9 ms per MLM step of 1.03e12 FLOPs
# Once: Python, JAX/Flax/TFDS/grain/Orbax imports, CUDA init, the grids' definitions, caches.
GPU_STARTUP_S = 40.0
# Per point, in one process: the train step compiles once per point (the seed, learning rate
# and schedule are constants of the program, so no two points share it), plus parameter
# init, the evaluation program (shared by points of one objective through XLA's persistent
# cache), 8 held-out batches and the final checkpoint.
GPU_POINT_S = 7.0
# Per fine-tuning job (one task, 3 seeds): restore the checkpoint, tokenize ~4k snippets,
# 3 x 125 steps of batch 32 (launch-bound, ~3 ms each) and the dev/test passes; its programs
# are the same for every point of one shape, so after the first point they come from the cache.
GPU_FINETUNE_S = 2.5
GPU_BUDGET_S = 540.0  # bench/gpu_grids.sh's target for the four main grids: 9 minutes
GPU_GRIDS = ("electra_vs_mlm", "nsp_formats", "norm_lr_warmup", "static_vs_dynamic")
_GPU_SIZE = "electra-small"


def _gpu_points(steps: int, warmup_of: int | None = None) -> dict:
  """The gpu recipe's overrides for `steps` steps (warm-up: 10% of `warmup_of` or `steps`)."""
  return {"model.dtype": "bfloat16", "model.param_dtype": "float32",
          "model.attention_impl": "auto", "data.batch_size": 128, "data.max_length": 128,
          "optim.learning_rate": 1e-3, "optim.warmup_steps": (warmup_of or steps) // 10,
          "train.steps": steps, "train.log_every": 25, "train.eval_every": steps,
          "train.eval_steps": 8, "train.checkpoint_every": steps, "train.keep": 1}


def gpu_peak_flops() -> float:
  """GPU_DEVICE_KIND's dense bf16 peak FLOP/s, encoder_jax.train.flops.peak_flops_per_device
  (imported here: experiments.run imports this module before it may import JAX)."""
  from encoder_jax.train import flops
  return flops.peak_flops_per_device(GPU_DEVICE_KIND)


def gpu_seconds(grid: Grid) -> float:
  """Estimated seconds of `grid` on one H100/H200 in one process (without the start-up):
  training FLOPs at GPU_MFU plus GPU_POINT_S and GPU_FINETUNE_S per job for every point."""
  flops = sum(p.total_flops for p in grid.points)
  fixed = sum(GPU_POINT_S + GPU_FINETUNE_S * len(p.finetune) for p in grid.points)
  return flops / (gpu_peak_flops() * GPU_MFU) + fixed


def _scale_error(scale: str) -> ValueError:
  return ValueError(f"scale={scale!r}; choose from {SCALES}")


# ------------------------------------------------------------------ (a) ELECTRA vs MLM

ELECTRA_ANCHOR = (
    "ELECTRA (arXiv 2003.10555) Table 1: at equal pre-training FLOPs ELECTRA-Small 79.9 vs "
    "BERT-Small 75.1 GLUE dev; Table 5 (base): ELECTRA 85.0 > All-Tokens MLM 84.3 > Replace "
    "MLM 82.4 = ELECTRA-15% 82.4 > BERT 82.2. The gain comes from learning on every token.")


# ELECTRA (arXiv 2003.10555) Appendix A, Table 6: the generator's hidden size, FFN size and
# heads are 1/4 of the discriminator's for Small and Large and 1/3 for Base (ELECTRA-Base: a
# 256-wide generator with 4 heads of 64 for the 768-wide discriminator).
GEN_FRAC_SMALL = 0.25
GEN_FRAC_BASE = 1 / 3


def electra_vs_mlm(scale: str = "demo", data_source: str = "") -> Grid:
  """MLM (BERT 80/10/10) vs ELECTRA RTD vs its ELECTRA-15%, Replace-MLM and All-Tokens MLM
  variants (ELECTRA Table 5), each at the same training-FLOPs budget (generator +
  discriminator counted), no NSP."""
  if scale == "demo":
    # The main job's recipe as it is (rows of 64 in batches of 16) and its fine-tuning; the
    # budget is 8,400 MLM steps (8.6M tokens, ~5.5 min of MLM on 2 cores). At 8,000 (the
    # second run, before the two-level sampler) one of the two ELECTRA seeds ended at 0.95 of
    # its prior (stalled); 10,000 (the third) left every arm off its plateau but took 68 min,
    # and 8,400 fits the grid's hour: 52.9 min, every arm off its plateau (2026-12-03).
    # A 2,000-step budget (the first run of this grid) ended every RTD
    # discriminator at its prior: ELECTRA alone
    # on this recipe is at 0.96 / 0.94 / 0.92 / 0.90 of its prior's entropy after 1.5k / 3k /
    # 4.5k / 7.5k steps (recall 0.001 -> 0.05; 2026-12-03), so a discriminator needs several
    # million tokens here before it reads context at all. ELECTRA's generator is 1/4 of the
    # discriminator's width (the repo default; its heads keep the discriminator's head width),
    # each point decays linearly over its own step count. Two pre-training seeds for MLM and
    # ELECTRA (the finding), one for the variants.
    base = {"train.log_every": 100, "train.eval_steps": 64, "train.keep": 1}
    budget = steps_for_budget_ref(f"size=tiny,objective=mlm{_ALIBI_RECIPE}", base, steps=8400)
    size, finetune, seeds = "tiny", _demo_finetune(lr=None), {"mlm": 2, "electra": 2}
  elif scale == "gpu":
    # The gpu recipe; the budget is 400 MLM steps (6.6M tokens, 4.1e14 FLOPs) per point,
    # ~8e14 per arm of the finding over its two seeds. The generator is ELECTRA-Small's 1/4.
    base = _gpu_points(0)
    budget = steps_for_budget_ref(f"size={_GPU_SIZE},objective=mlm{_ALIBI_RECIPE}",
                                  _gpu_points(400), steps=400)
    size, finetune, seeds = _GPU_SIZE, _demo_finetune(), {"mlm": 2, "electra": 2}
  elif scale == "base":
    # ELECTRA-Base's compute (Table 1: 6.4e19 FLOPs, BERT-Base's), seq 512, batch 256, and
    # ELECTRA-Base's 1/3-width generator (Table 6).
    base = {"data.max_length": 512, "data.batch_size": 256, "optim.learning_rate": 2e-4,
            "train.log_every": 1000, "train.eval_every": 50_000, "train.checkpoint_every": 10_000,
            "objective.gen_hidden_frac": GEN_FRAC_BASE, **_base_data(data_source)}
    budget, size, finetune, seeds = 6.4e19, "base", _base_finetune(), {}
  else:
    raise _scale_error(scale)
  objectives = ["mlm", "electra", "electra_15", "replace_mlm", "all_tokens_mlm"]
  local = scale != "base"

  def point(v):
    if v["seed"] >= seeds.get(v["objective"], 1):
      return None
    arg = f"size={size},objective={v['objective']}" + (_ALIBI_RECIPE if local else "")
    steps = steps_for_budget(resolve_config(arg, base), budget)
    over = {**base, "train.steps": steps, "train.flops_budget": budget}
    if scale == "gpu":
      over |= _gpu_points(steps)
    if local:
      over |= {"train.eval_every": steps, "train.checkpoint_every": steps, "seed": v["seed"]}
    else:
      over |= {"optim.warmup_steps": 10_000}
    return PointSpec(arg, over, finetune)

  axes = {"objective": objectives, "seed": [0, 1] if local else [0]}
  return Grid("electra_vs_mlm", "ELECTRA vs MLM at equal FLOPs", _drop_single_seed(
      expand(axes, point)),
      anchor=ELECTRA_ANCHOR, curve_keys=("mlm_loss", "main_loss", "gen_loss"))


# ------------------------------------------------------------------ (a'') ELECTRA's learning curve

CURVE_MULTIPLE = 2  # the curve's budget, in grid (a)'s equal-compute budgets (8,400 MLM steps)
CURVE_EVALS = 32  # held-out evaluations per run, evenly spaced
CURVE_FRACTIONS = (0.25, 0.5, 0.75)  # checkpoints fine-tuned on POS before the final one


def electra_curve(scale: str = "demo", data_source: str = "") -> Grid:
  """MLM vs ELECTRA along one long run each (2 pre-training seeds): the discriminator against
  its prior at CURVE_EVALS held-out evaluations, and Brown POS fine-tuned from the checkpoints
  at 1/4, 1/2 and 3/4 of the run and at its end, so the two objectives are compared at equal
  training FLOPs all along (experiments.crossing reads it: where the discriminator leaves its
  prior, and where, if anywhere, ELECTRA catches MLM). Checkpoints before the end are taken
  mid-schedule (the learning rate not yet decayed), the same fraction of the same-FLOPs
  schedule for both objectives. The final checkpoints also get the main job's sentiment
  fine-tuning, as grid (a)'s points do, so the curve's end compares with them."""
  del data_source
  if scale != "demo":
    raise ValueError(f"electra_curve: scale={scale!r}; it is a demo-scale grid (the learning "
                     "curve at CPU scale); at gpu or base scale run electra_vs_mlm.")
  base = {"train.log_every": 100, "train.eval_steps": 64}
  budget = CURVE_MULTIPLE * steps_for_budget_ref(f"size=tiny,objective=mlm{_ALIBI_RECIPE}", base,
                                                 steps=8400)
  quarters = len(CURVE_FRACTIONS) + 1

  def point(v):
    arg = f"size=tiny,objective={v['objective']}{_ALIBI_RECIPE}"
    steps = steps_for_budget(resolve_config(arg, base), budget)
    # a checkpoint at every quarter; the FLOPs budget still ends the run (ELECTRA's at 15,567
    # of its 15,568 steps, a step before the last quarter's; the newest checkpoint is its end)
    steps += -steps % quarters
    over = {**base, "train.steps": steps, "train.flops_budget": budget, "seed": v["seed"],
            "train.eval_every": steps // CURVE_EVALS,
            "train.checkpoint_every": steps // quarters,
            # + 2: a SIGTERM saves the step it stops at, which must not push the first quarter
            # out (the 2026-12-04 runs, never stopped, kept exactly the 4 quarters)
            "train.keep": quarters + 2}
    jobs = tuple(FinetuneJob("brown_pos", seeds=_DEMO_FT_SEEDS, run="demo", at_fraction=f)
                 for f in CURVE_FRACTIONS) + _demo_finetune(lr=None)
    return PointSpec(arg, over, jobs)

  # seed slowest: both objectives of seed 0 finish before seed 1 starts
  return Grid("electra_curve", "ELECTRA vs MLM along the learning curve", expand(
      {"seed": [0, 1], "objective": ["mlm", "electra"]}, point),
      anchor=ELECTRA_ANCHOR, curve_keys=("mlm_loss", "gen_loss"))


# ------------------------------------------------------------------ (a') ELECTRA generator size

GENERATOR_ANCHOR = (
    "ELECTRA (arXiv 2003.10555) Section 3.2 and Figure 3 (left): GLUE dev score against the "
    "generator's width for discriminators of width 256, 512 and 768, at equal training steps: "
    "generators 1/4-1/2 of the discriminator's width work best; an equal-size generator is "
    "worse (the discriminator faces too hard a task) and costs about twice the compute per "
    "step. Table 6 uses 1/4 for Small and Large, 1/3 for Base.")

GEN_FRACS = {"1/4": 0.25, "1/2": 0.5, "1": 1.0}  # point label (gen=...) -> gen_hidden_frac


def generator_size(scale: str = "demo", data_source: str = "") -> Grid:
  """ELECTRA's RTD with a generator of 1/4, 1/2 and 1x the discriminator's width (hidden size,
  FFN and heads scale together; depth stays), at equal steps as in the paper's Figure 3, so a
  wider generator costs more FLOPs (the report's x-axis shows them)."""
  if scale == "demo":
    # The demo recipe (2 x 128, 8 heads of 16): generators of 32 (2 heads), 64 (4) and 128 (8)
    # wide, 2,000 steps each (~2M tokens), two pre-training seeds per width.
    base = _demo_points(2000)
    size, finetune, nseeds = "tiny", _demo_finetune(), 2
  elif scale == "gpu":
    # The gpu recipe (12 x 256, 8 heads of 32): generators of 64, 128 and 256 wide, 400 steps
    # each (6.6M tokens; 4.4e14 / 5.2e14 / 8.2e14 FLOPs), one seed (not in the 9-minute set).
    base = _gpu_points(400)
    size, finetune, nseeds = _GPU_SIZE, _demo_finetune(), 1
  elif scale == "base":
    # ELECTRA-Base's setting (seq 512, batch 256, lr 2e-4, 10k warm-up), 500k steps a point.
    base = {"data.max_length": 512, "data.batch_size": 256, "optim.learning_rate": 2e-4,
            "optim.warmup_steps": 10_000, "train.steps": 500_000, "train.log_every": 1000,
            "train.eval_every": 50_000, "train.checkpoint_every": 10_000,
            **_base_data(data_source)}
    size, finetune, nseeds = "base", _base_finetune(), 1
  else:
    raise _scale_error(scale)

  def point(v):
    over = {**base, "objective.gen_hidden_frac": GEN_FRACS[v["gen"]]}
    arg = f"size={size},objective=electra"
    if scale != "base":
      arg, over["seed"] = arg + _ALIBI_RECIPE, v["seed"]
    return PointSpec(arg, over, finetune)

  # "1/4" is no directory name: the label is the width as a fraction's digits (gen=1_4).
  labels = {k.replace("/", "_"): k for k in GEN_FRACS}
  return Grid("generator_size", "ELECTRA generator size at equal steps", _drop_single_seed(
      expand({"gen": list(labels), "seed": list(range(nseeds))},
             lambda v: point({**v, "gen": labels[v["gen"]]}))),
      anchor=GENERATOR_ANCHOR, curve_keys=("gen_loss",))


def steps_for_budget_ref(arg: str, overrides: dict, *, steps: int) -> float:
  """The FLOPs of `steps` steps of the reference point (the equal-compute budget)."""
  from experiments.grid import flops_per_step
  return steps * flops_per_step(resolve_config(arg, overrides))


# ------------------------------------------------------------------ (b) NSP and input formats

NSP_ANCHOR = (
    "RoBERTa (arXiv 1907.11692) Table 2, BERT-base, SQuAD 1.1/2.0 F1 · MNLI-m · SST-2 · RACE: "
    "SEGMENT-PAIR+NSP 90.4/78.7 · 84.0 · 92.9 · 64.2; SENTENCE-PAIR+NSP 88.7/76.2 · 82.9 · "
    "92.1 · 63.0; FULL-SENTENCES 90.4/79.1 · 84.7 · 92.5 · 64.8; DOC-SENTENCES 90.6/79.7 · "
    "84.7 · 92.7 · 65.6. Single sentences hurt; dropping NSP matches or helps.")

_FORMATS = {  # point label -> (format, sentence task)
    "segment_pair+nsp": ("segment_pair", "nsp"),
    "sentence_pair+nsp": ("sentence_pair", "nsp"),
    "full_sentences": ("full_sentences", "none"),
    "doc_sentences": ("doc_sentences", "none"),
}


def nsp_formats(scale: str = "demo", data_source: str = "") -> Grid:
  """RoBERTa's four input formats at equal tokens per step (SENTENCE-PAIR gets a bigger batch
  because its rows are shorter, as in RoBERTa) and equal steps, MLM (+ NSP where it applies)."""
  if scale == "demo":
    # The demo recipe (rows of 128, batch 8; SENTENCE-PAIR rows are half full: batch 16),
    # 1,500 steps (1.5M tokens) per point, 3 fine-tuning seeds. Four pre-training seeds each:
    # with two, every arm's range overlapped the others' (2026-12-04), and the differences
    # RoBERTa reports (Table 2: ~1 point) are the size of the seeds' spread, so the grid's
    # extra compute goes to seeds rather than tokens (a 2x longer run still stays far from
    # any budget where the formats' rows, not the seeds, decide).
    base = _demo_points(1500)
    size, finetune, nseeds = "tiny", _demo_finetune(), 4
  elif scale == "gpu":
    # The gpu recipe (rows of 128, batch 128; SENTENCE-PAIR batch 256), 360 steps (5.9M
    # tokens) per point, two pre-training seeds each, 3 fine-tuning seeds.
    base = _gpu_points(360)
    size, finetune, nseeds = _GPU_SIZE, _demo_finetune(), 2
  elif scale == "base":
    # RoBERTa's Table 2 setting: BERT-base, seq 512, batch 256, 1M steps, lr 1e-4.
    base = _roberta_base(data_source)
    size, finetune, nseeds = "base", _base_finetune(), 1
  else:
    raise _scale_error(scale)

  def point(v):
    fmt, task = _FORMATS[v["format"]]
    over = dict(base)
    if scale != "base":
      over["seed"] = v["seed"]
    if fmt == "sentence_pair":
      # Two natural sentences average ~63 WordPiece tokens on the demo corpus (~30 per
      # sentence; Wikipedia is similar): scale the batch so the real tokens per step match,
      # in rows of at most 128 (our loader pads to max_length; fairseq padded per batch, so
      # RoBERTa's 512-token limit cost it nothing).
      over["data.batch_size"] = base["data.batch_size"] * max(1, base["data.max_length"] // 64)
      over["data.max_length"] = min(128, base["data.max_length"])
    arg = f"size={size},objective=mlm,nsp={task},format={fmt}"
    return PointSpec(arg + (_ALIBI_RECIPE if scale != "base" else ""), over, finetune)

  points = expand({"format": list(_FORMATS), "seed": list(range(nseeds))}, point)
  return Grid("nsp_formats", "NSP and input formats at equal tokens", _drop_single_seed(points),
              anchor=NSP_ANCHOR, curve_keys=("mlm_loss",))


# ------------------------------------------------------------------ (c) post-LN vs pre-LN

NORM_ANCHOR = (
    "Xiong et al. (arXiv 2002.04745): BERT-base post-LN needed a long warm-up at lr 1e-4 and "
    "diverged at 3e-4; pre-LN trained with no warm-up at 3e-4 and reached the same validation "
    "loss ~40% sooner. Its Figure 3 and Lemma 1: post-LN's gradient at the last layers grows "
    "with depth, so the effect needs a deep model.")


def norm_lr_warmup(scale: str = "demo", data_source: str = "") -> Grid:
  """post-LN vs pre-LN over learning rate x warm-up (0 or 10% of the schedule), 8 layers at demo
  scale, BERT-base's 12 at base scale."""
  if scale == "demo":
    # 8 layers of the demo recipe's width (d 128, 8 ALiBi heads, FFN 512): Xiong et al.'s
    # bound on post-LN's gradients near the output grows with depth, so 2-4 layers cannot
    # show the effect. The first 500 steps of a 2,000-step linear schedule
    # (optim.total_steps), where a post-LN model without warm-up diverges or stalls; lr 1e-3
    # and 3e-3 (the demo recipe trains pre-LN at 2e-3). Two pre-training seeds without
    # warm-up (the finding), one with; 3 fine-tuning seeds on both demo tasks.
    base = {**_demo_points(500), "model.num_layers": 8, "optim.total_steps": 2000}
    # warm-up "10pct" = 10% of the 2,000-step schedule (200 steps)
    size, lrs, warmups, seeds = "tiny", [1e-3, 3e-3], {"0": 0, "10pct": 200}, {"0": 2}
  elif scale == "gpu":
    # The gpu recipe's 12 layers of 256 (BERT-base's depth, where Xiong et al.'s bound on
    # post-LN's gradients is large): the first 200 steps (3.3M tokens) of an 800-step schedule
    # at batch 128, lr 1e-3 and 3e-3; two pre-training seeds without warm-up, one with.
    base = {**_gpu_points(200), "optim.total_steps": 800}
    size, lrs, warmups, seeds = _GPU_SIZE, [1e-3, 3e-3], {"0": 0, "10pct": 80}, {"0": 2}
  elif scale == "base":
    base = {"data.max_length": 128, "data.batch_size": 256, "train.steps": 300_000,
            "train.log_every": 1000, "train.eval_every": 20_000,
            "train.checkpoint_every": 10_000, **_base_data(data_source)}
    size, lrs, warmups, seeds = "base", [1e-4, 3e-4, 1e-3], {"0": 0, "10pct": 30_000}, {}
  else:
    raise _scale_error(scale)
  finetune = ((FinetuneJob("glue/mrpc", seeds=5, run="full"),  # Xiong et al.'s two tasks
               FinetuneJob("glue/rte", seeds=5, run="full")) if scale == "base"
              else _demo_finetune())

  def point(v):
    if v["seed"] >= seeds.get(v["warmup"], 1):
      return None
    over = {**base, "optim.learning_rate": v["lr"], "optim.warmup_steps": warmups[v["warmup"]]}
    arg = f"size={size},objective=mlm,norm={v['norm']}"
    if scale != "base":
      arg, over["seed"] = arg + _ALIBI_RECIPE, v["seed"]
    return PointSpec(arg, over, finetune)

  return Grid("norm_lr_warmup", "post-LN vs pre-LN: learning rate x warm-up", _drop_single_seed(
      expand({"lr": lrs, "warmup": list(warmups), "norm": ["post", "pre"],
              "seed": [0, 1] if scale != "base" else [0]}, point)),
      anchor=NORM_ANCHOR, curve_keys=("mlm_loss",), facet=("lr", "warmup"))


# ------------------------------------------------------------------ (d) static vs dynamic masking

MASKING_ANCHOR = (
    "RoBERTa (arXiv 1907.11692) Table 1, BERT-base, SQuAD 2.0 F1 / MNLI-m / SST-2: static "
    "masking (BERT's data duplicated 10 times with different masks over 40 epochs, each mask "
    "seen 4 times) 78.3 / 84.3 / 92.5, dynamic masking (a new mask every time) 78.7 / 84.0 / "
    "92.9: comparable or slightly better, and needed for longer training on more data.")


def static_vs_dynamic(scale: str = "demo", data_source: str = "") -> Grid:
  """RoBERTa's static (masks fixed per example, `dupe_factor` copies) vs dynamic masking, over
  enough epochs that static masks repeat."""
  if scale == "demo":
    # The demo recipe on Moby-Dick alone (~0.3M tokens of the demo vocab), 2,400 steps (2.5M
    # tokens, ~8 epochs): static with dupe_factor 2 sees each mask 4 times (BERT's 40 epochs /
    # 10 copies), dupe_factor 1 each mask 8 times; dynamic a new one every time. Two
    # pre-training seeds per arm; the held-out split is Moby-Dick's own validation chapters.
    base = {**_demo_points(2400), "data.source": "demo:moby_dick"}
    size, finetune, nseeds = "tiny", _demo_finetune(), 2
  elif scale == "gpu":
    # The gpu recipe on Moby-Dick alone: 400 steps of 16k tokens (6.6M tokens, ~20 epochs):
    # static with dupe_factor 5 sees each mask ~4 times (BERT's repetition), dupe_factor 1
    # every epoch the same mask.
    base = {**_gpu_points(400), "data.source": "demo:moby_dick"}
    size, finetune, nseeds = _GPU_SIZE, _demo_finetune(), 2
  elif scale == "base":
    # RoBERTa's Table 1 setting: BERT-base, seq 512, batch 256, 1M steps (40 epochs of
    # BookCorpus + Wikipedia), dupe_factor 10.
    base = _roberta_base(data_source)
    size, finetune, nseeds = "base", _base_finetune(), 1
  else:
    raise _scale_error(scale)
  arms = {"dynamic": ("dynamic", 1), "static_x2": ("static", 2), "static_x1": ("static", 1)}
  if scale == "gpu":
    arms = {"dynamic": ("dynamic", 1), "static_x5": ("static", 5), "static_x1": ("static", 1)}
  if scale == "base":
    arms = {"dynamic": ("dynamic", 1), "static_x10": ("static", 10)}

  def point(v):
    masking, dupe = arms[v["masking"]]
    over = {**base, "objective.masking": masking, "objective.dupe_factor": dupe}
    arg = f"size={size},objective=mlm"
    if scale != "base":
      arg, over["seed"] = arg + _ALIBI_RECIPE, v["seed"]
    return PointSpec(arg, over, finetune)

  return Grid("static_vs_dynamic", "static vs dynamic masking", _drop_single_seed(expand(
      {"masking": list(arms), "seed": list(range(nseeds))}, point)),
      anchor=MASKING_ANCHOR, curve_keys=("mlm_loss",))


# ------------------------------------------------------------------ (f) old vs new block

BLOCK_ANCHOR = (
    "Shazeer 2020 (arXiv 2002.05202) Table 1, T5-base at equal parameters and FLOPs (d_ff "
    "3072 for one-matrix FFNs, 2048 for gated ones): held-out log-perplexity 1.983 (GELU) vs "
    "1.942 (GEGLU) after 65,536 steps, 1.679 vs 1.633 after 524,288. RoFormer (arXiv "
    "2104.09864) Figure 3 (left): BERT's MLM loss falls faster with rotary position "
    "embeddings than with its learned position table. ModernBERT (arXiv 2412.13663) Section "
    "2.1.1 adopts both with bias-free linears and norms; the paper ablates none of them alone.")

# Both arms of (f) set every block switch explicitly (not inherited from configs/pretrain.py
# `runlocal`, whose block may move): the old arm is BERT's block (a learned position table,
# GELU FFN, LayerNorm and linears with biases, two token types), the new one ModernBERT's
# (model.config.MODERNBERT_BLOCK: RoPE, GeGLU, no biases, the embedding norm in place of layer
# 0's attention pre-norm, no token types) without its sliding windows (rows of 64-128 tokens fit
# one 128-token window anyway). Both pre-LN, as every demo point, and with the same width, depth,
# heads, objective and tokens. The old arm's position table starts sinusoidal (the demo recipe's
# choice for a learned table: 18.7% vs 18.3% held-out with BERT's normal init at 2M tokens,
# experiments/results/demo.md). RoPE's theta is 10,000 for both layer kinds (RoFormer's; the
# rows are far shorter than ModernBERT's 8,192 positions that its global 160,000 is for).
BLOCKS: dict[str, dict] = {
    "bert": {"model.position_bias": "none", "model.learned_positions": True,
             "model.position_init": "sinusoidal", "model.rope": False, "model.glu": False,
             "model.activation": "gelu", "model.norm": "layernorm", "model.norm_bias": True,
             "model.linear_bias": True, "model.first_attn_norm": True,
             "model.embedding_norm": True, "model.layer_norm_eps": 1e-12,
             "model.type_vocab_size": 2, "model.local_window": 0, "model.global_every": 1},
    "modern": {"model.position_bias": "none", "model.learned_positions": False,
               "model.position_init": "sinusoidal", "model.rope": True,
               "model.rope_theta": 10_000.0, "model.rope_theta_local": 10_000.0,
               "model.glu": True, "model.activation": "gelu", "model.norm": "layernorm",
               "model.norm_bias": False, "model.linear_bias": False,
               "model.first_attn_norm": False, "model.embedding_norm": True,
               "model.layer_norm_eps": 1e-5, "model.type_vocab_size": 0,
               "model.local_window": 0, "model.global_every": 1},
}


def old_vs_new_block(scale: str = "demo", data_source: str = "") -> Grid:
  """BERT's block vs ModernBERT's (BLOCKS) at equal FLOPs, matched by the FFN's width: the
  gated FFN gets 2/3 of the plain one's (configs/pretrain.py glu_ffn_size: 512 -> 344), as
  Shazeer 2020 matched them, so both
  arms take the same steps of the same rows (equal tokens) at the same FLOPs to within 0.5%
  (the counter's, encoder_jax.train.flops: 3 d F for a gated FFN). MLM, no NSP."""
  if scale == "demo":
    # The main job's rows (16 x 64) and fine-tuning (both demo tasks, 3 seeds; lr 2e-3, 4,000
    # sentiment snippets), 2,000 steps a point (2.0M tokens, 7.9e12 FLOPs, each on its own
    # schedule: the budget at which the demo recipe's position choices were measured,
    # experiments/results/demo.md). Sized to the shared 2-core CPU: ~5 min a point at the 7.4k
    # tokens/s of a quiet core pair in fp32, but ~0.8k tokens/s while five jobs share the cores
    # (2026-12-07): ~45 min a point. Two pre-training seeds per arm.
    base = {"train.log_every": 100, "train.eval_steps": 64, "train.keep": 1,
            "train.steps": 2000, "train.eval_every": 2000, "train.checkpoint_every": 2000}
    size, finetune, nseeds = "tiny", _demo_finetune(lr=None), 2
  elif scale == "gpu":
    # The gpu recipe (12 x 256, embeddings 128, 8 heads of 32), 400 steps (6.6M tokens) a
    # point, two pre-training seeds.
    base = _gpu_points(400)
    size, finetune, nseeds = _GPU_SIZE, _demo_finetune(), 2
  elif scale == "base":
    # BERT-base's width and depth, pre-LN, at RoBERTa's ablation setting (seq 512, batch 256,
    # 1M steps, lr 1e-4, 10k warm-up), one seed; GLUE + SQuAD.
    base = _roberta_base(data_source)
    size, finetune, nseeds = "base", _base_finetune(), 1
  else:
    raise _scale_error(scale)
  from configs.pretrain import glu_ffn_size  # (JAX: not at experiments.run's import time)
  plain_ffn = resolve_config(f"size={size},norm=pre", {}).model.ffn_size

  def point(v):
    over = {**base, **BLOCKS[v["block"]], "model.ffn_size": (
        glu_ffn_size(plain_ffn) if v["block"] == "modern" else plain_ffn)}
    arg = f"size={size},objective=mlm,norm=pre"
    if scale != "base":
      arg, over["seed"] = arg + ",runlocal", v["seed"]
    return PointSpec(arg, over, finetune)

  return Grid("old_vs_new_block", "BERT's block vs ModernBERT's at equal FLOPs",
              _drop_single_seed(expand({"block": list(BLOCKS), "seed": list(range(nseeds))},
                                       point)),
              anchor=BLOCK_ANCHOR, curve_keys=("mlm_loss",))


def _drop_single_seed(points: tuple[Point, ...]) -> tuple[Point, ...]:
  """Without a second pre-training seed the seed label is noise in every name: drop it (the
  base grids keep their historical point names)."""
  if any(p.labels.get("seed", "0") != "0" for p in points):
    return points
  out = []
  for p in points:
    labels = {k: v for k, v in p.labels.items() if k != "seed"}
    out.append(dataclasses.replace(
        p, labels=labels, name=",".join(f"{k}={v}" for k, v in labels.items()) or "default"))
  return tuple(out)


def large_batches(scale: str = "demo", data_source: str = "") -> Grid:
  """(g) RoBERTa's Table 3: batch x1 / x8 / x64 at equal tokens, the learning rate scaled with
  the batch (experiments.large_batches; demo and base scales)."""
  from experiments import large_batches as lb  # it builds on this module's helpers
  return lb.large_batches(scale, data_source)


GRIDS: dict[str, Callable[..., Grid]] = {
    "electra_vs_mlm": electra_vs_mlm,
    "electra_curve": electra_curve,
    "nsp_formats": nsp_formats,
    "norm_lr_warmup": norm_lr_warmup,
    "static_vs_dynamic": static_vs_dynamic,
    "generator_size": generator_size,
    "old_vs_new_block": old_vs_new_block,
    "large_batches": large_batches,
}


def get_grid(name: str, scale: str = "demo", data_source: str = "") -> Grid:
  if name not in GRIDS:
    raise ValueError(f"--grid={name!r}; choose one of {sorted(GRIDS)}.")
  return GRIDS[name](scale, data_source)


# ------------------------------------------------------------------ dry runs

# Every point shrunk to a CPU smoke test of its own code path: a 1 x 32 encoder (float32, XLA
# attention), 3 steps of 4 rows of 32 tokens, one held-out batch, one fine-tuning seed on 16
# rows of each task. Axes, objectives, formats, masking and schedules stay the point's own
# (a warm-up of 0 stays 0, any other becomes 1 step: no warm-up is its own schedule). A point
# that accumulates k micro-batches per update keeps k and makes 3 updates (3k calls). A point
# on the whole demo corpus reads its Moby-Dick part instead (DRY_RUN_SOURCE: the same reader
# and row builder on 0.31M of its 3.6M tokens): its first build tokenizes 12x less text (the
# four demo-corpus builds of bench/gpu_grids.sh --dry_run took 61 s of its 250 s, cold, with
# the suite running beside it); a point's own corpus (--data_source) stays.
DRY_RUN_SOURCE = {"demo": "demo:moby_dick"}
DRY_RUN_PRETRAIN = {
    "model.num_layers": 1, "model.hidden_size": 32, "model.num_heads": 2, "model.ffn_size": 64,
    "model.embedding_size": 32, "model.dtype": "float32", "model.attention_impl": "xla",
    "data.batch_size": 4, "data.max_length": 32, "train.steps": 3,
    "train.log_every": 1, "train.eval_every": 3, "train.eval_steps": 1,
    "train.checkpoint_every": 3, "train.keep": 1}
DRY_RUN_FINETUNE = {"max_train_examples": 16, "max_eval_examples": 16, "epochs": 1}


# Axes whose values change only numbers inside a point's program (the seed, the peak learning
# rate, the warm-up's length), never the code it runs: the dry run keeps the first point of each
# such family. (A schedule without warm-up is optax's other branch; tests/train/test_optim.py
# checks both.)
DRY_RUN_SHARED_AXES = ("seed", "lr", "warmup")


def dry_run(grid: Grid) -> Grid:
  """`grid` shrunk to a few CPU seconds per point (DRY_RUN_*) with one point per code path
  (points that differ only in DRY_RUN_SHARED_AXES are dropped after the first): names and
  axes unchanged, so the runner, the in-process executor and the report are exercised end to
  end. Each point costs mostly its compiles, so this keeps the whole dry run in CI time: a
  point fine-tunes one of its tasks, the next point the next task, so every task and every
  point's checkpoint is exercised at half the fine-tuning."""
  def shrink(p: Point, i: int) -> Point:
    jobs = [j for j in p.finetune if j.at_fraction == 1]  # 3 steps: one checkpoint
    finetune = tuple(dataclasses.replace(j, seeds=1, overrides={**j.overrides,
                                                                **DRY_RUN_FINETUNE})
                     for j in (jobs[i % len(jobs):][:1] if jobs else ()))
    cfg = p.config()
    warmup = min(cfg.optim.warmup_steps, 1)
    k = cfg.optim.accumulation_steps
    calls = {key: DRY_RUN_PRETRAIN[key] * k for key in (
        "train.steps", "train.log_every", "train.eval_every", "train.checkpoint_every")}
    source = cfg.data.source
    smaller = {"data.source": DRY_RUN_SOURCE[source]} if source in DRY_RUN_SOURCE else {}
    return make_point(p.labels, PointSpec(p.pretrain_arg, {
        **p.overrides, **DRY_RUN_PRETRAIN, **calls, "optim.warmup_steps": warmup, **smaller},
        finetune))
  seen, points = set(), []
  for p in grid.points:
    family = tuple((k, v) for k, v in p.labels.items() if k not in DRY_RUN_SHARED_AXES)
    if family not in seen:
      seen.add(family)
      points.append(shrink(p, len(points)))
  return dataclasses.replace(grid, points=tuple(points), title=grid.title + " [dry run]")
