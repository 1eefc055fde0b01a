"""The ablation grids: ELECTRA vs MLM, NSP and input formats, post- vs pre-LN.

Each grid exists at two scales:
  demo  what this repo's CPU reproductions ran (experiments/results/<grid>/): a tiny encoder on
        the demo corpus, minutes per point on 2 CPU cores.
  base  the same comparison at BERT-base scale for a TPU pod or GPU cluster: the published
        recipe's batch, length and steps (../ANCHORS in the README), FLOPs from the counter,
        an estimated time on a v4-32 (`python -m experiments.run --grid=... --scale=base
        --action=plan`).

Every point's pre-training is a configs/pretrain.py argument plus `--config.*` overrides;
fine-tuning jobs score the final checkpoint on the demo tasks (demo) or GLUE + SQuAD (base).
"""
from __future__ import annotations

from typing import Callable

from experiments.grid import FinetuneJob, Grid, PointSpec, expand, resolve_config, \
    steps_for_budget

SCALES = ("demo", "base")

# Downstream jobs. demo: the two demo tasks, run=small (2,000 training rows, 2 epochs, 1,000
# dev/test rows). base: BERT's GLUE set + SQuAD v1.1 on full data, ELECTRA's many-seed medians.
_DEMO_FT_SEEDS = 5
_BASE_TASKS = ("glue/mnli", "glue/qnli", "glue/qqp", "glue/sst2", "glue/cola", "glue/stsb",
               "glue/mrpc", "glue/rte", "squad/v1.1")


def _demo_finetune(seeds: int = _DEMO_FT_SEEDS) -> tuple[FinetuneJob, ...]:
  # rows of <= 64 tokens, batch 32, lr 3e-4 (a tiny encoder wants a bigger step than BERT's 5e-5)
  return (FinetuneJob("rotten_tomatoes", seeds=seeds, run="small"),
          FinetuneJob("brown_pos", seeds=seeds, run="small"))


def _base_finetune(seeds: int = 5) -> tuple[FinetuneJob, ...]:
  return tuple(FinetuneJob(t, seeds=seeds, run="full") for t in _BASE_TASKS)


def _base_data(source: str) -> dict:
  return {"data.source": source} if source else {}


# ------------------------------------------------------------------ (a) ELECTRA vs MLM

ELECTRA_ANCHOR = (
    "ELECTRA (arXiv 2003.10555) Table 1: at equal pre-training FLOPs ELECTRA-Small 79.9 vs "
    "BERT-Small 75.1 GLUE dev; Table 5 (base): ELECTRA 85.0 > All-Tokens MLM 84.3 > Replace "
    "MLM 82.4 = ELECTRA-15% 82.4 > BERT 82.2. The gain comes from learning on every token.")


def electra_vs_mlm(scale: str = "demo", data_source: str = "") -> Grid:
  """MLM (BERT 80/10/10) vs ELECTRA RTD vs its ELECTRA-15% and Replace-MLM variants, each
  at the same training-FLOPs budget (generator + discriminator counted), no NSP."""
  if scale == "demo":
    # A tiny encoder (2 x 128) on rows of 64 tokens, batch 16; the budget is 700 MLM steps.
    # ELECTRA's generator is 1/4 of the discriminator's width (the repo default), lr 1e-3 for
    # all (5e-4 is the repo's small-model value; a 700-step run needs the larger one), 10%
    # warm-up, linear decay over each point's own step count.
    base = {"data.max_length": 64, "data.batch_size": 16, "optim.learning_rate": 1e-3,
            "train.log_every": 25, "train.eval_every": 0, "train.eval_steps": 8,
            "train.checkpoint_every": 200, "train.keep": 1}
    budget = steps_for_budget_ref("size=tiny,objective=mlm", base, steps=700)
    size, finetune = "tiny", _demo_finetune()
  elif scale == "base":
    # ELECTRA-Base's compute (Table 1: 6.4e19 FLOPs, BERT-Base's), seq 512, batch 256.
    base = {"data.max_length": 512, "data.batch_size": 256, "optim.learning_rate": 2e-4,
            "train.log_every": 1000, "train.eval_every": 50_000, "train.checkpoint_every": 10_000,
            **_base_data(data_source)}
    budget, size, finetune = 6.4e19, "base", _base_finetune()
  else:
    raise ValueError(f"scale={scale!r}; choose from {SCALES}")

  def point(v):
    arg = f"size={size},objective={v['objective']}"
    steps = steps_for_budget(resolve_config(arg, base), budget)
    warmup = max(1, steps // 10) if scale == "demo" else 10_000
    return PointSpec(arg, {**base, "train.steps": steps, "train.flops_budget": budget,
                           "optim.warmup_steps": warmup,
                           "train.eval_every": base.get("train.eval_every") or steps},
                     finetune)

  return Grid("electra_vs_mlm", "ELECTRA vs MLM at equal FLOPs", expand(
      {"objective": ["mlm", "electra", "electra_15", "replace_mlm"]}, point),
      anchor=ELECTRA_ANCHOR, curve_keys=("mlm_loss", "main_loss", "gen_loss"))


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
    # tiny, rows of 128 tokens, batch 8 (SENTENCE-PAIR rows are half full: batch 16), 700
    # steps, lr 1e-3 with 10% warm-up; 3 fine-tuning seeds per task.
    base = {"data.max_length": 128, "data.batch_size": 8, "optim.learning_rate": 1e-3,
            "optim.warmup_steps": 70, "train.steps": 700, "train.log_every": 25,
            "train.eval_every": 700, "train.eval_steps": 8, "train.checkpoint_every": 200,
            "train.keep": 1}
    size, finetune = "tiny", _demo_finetune(seeds=3)
  elif scale == "base":
    # RoBERTa's Table 2 setting: BERT-base, seq 512, batch 256, 1M steps, lr 1e-4.
    base = {"data.max_length": 512, "data.batch_size": 256, "optim.learning_rate": 1e-4,
            "optim.warmup_steps": 10_000, "train.steps": 1_000_000, "train.log_every": 1000,
            "train.eval_every": 50_000, "train.checkpoint_every": 10_000,
            **_base_data(data_source)}
    size, finetune = "base", _base_finetune()
  else:
    raise ValueError(f"scale={scale!r}; choose from {SCALES}")

  def point(v):
    fmt, task = _FORMATS[v["format"]]
    over = dict(base)
    if fmt == "sentence_pair":
      # Two natural sentences average ~63 WordPiece tokens on the demo corpus (~30 per
      # sentence; Wikipedia is similar): scale the batch so the real tokens per step match,
      # in rows of at most 128 (our loader pads to max_length; fairseq padded per batch, so
      # RoBERTa's 512-token limit cost it nothing).
      over["data.batch_size"] = base["data.batch_size"] * max(1, base["data.max_length"] // 64)
      over["data.max_length"] = min(128, base["data.max_length"])
    return PointSpec(f"size={size},objective=mlm,nsp={task},format={fmt}", over, finetune)

  return Grid("nsp_formats", "NSP and input formats at equal tokens", expand(
      {"format": list(_FORMATS)}, point), anchor=NSP_ANCHOR, curve_keys=("mlm_loss",))


# ------------------------------------------------------------------ (c) post-LN vs pre-LN

NORM_ANCHOR = (
    "Xiong et al. (arXiv 2002.04745): BERT-base post-LN needed a long warm-up at lr 1e-4 and "
    "diverged at 3e-4; pre-LN trained with no warm-up at 3e-4 and reached the same validation "
    "loss ~40% sooner. At demo scale (ANCHORS.md scratch run) the failure is a stall on the "
    "unigram plateau (~6.65 nats), not a NaN.")


def norm_lr_warmup(scale: str = "demo", data_source: str = "") -> Grid:
  """post-LN vs pre-LN over learning rate x warm-up (0 or 10% of the steps), 6 layers."""
  if scale == "demo":
    # 6 layers of the tiny width (d 128, 2 heads, FFN 512), rows of 64 tokens, batch 16: the
    # depth where ANCHORS.md saw post-LN stall without warm-up. The first 480 steps of a
    # 2,000-step linear schedule (optim.total_steps), as in that scratch run, so the lr stays
    # near its peak over the window where models leave the unigram plateau.
    # lr 1e-4 is left out here: 480 steps at 1e-4 leave no model off the unigram plateau, so
    # it would cost 4 of the ~30 CPU minutes and show nothing (the base grid keeps it).
    base = {"model.num_layers": 6, "data.max_length": 64, "data.batch_size": 16,
            "train.steps": 480, "optim.total_steps": 2000, "train.log_every": 20,
            "train.eval_every": 480,
            "train.eval_steps": 8, "train.checkpoint_every": 160, "train.keep": 1}
    # warm-up "10pct" = 10% of the 2,000-step schedule (200 steps; ANCHORS.md: 60 did not help)
    size, lrs, warmups = "tiny", [3e-4, 1e-3], {"0": 0, "10pct": 200}
  elif scale == "base":
    base = {"data.max_length": 128, "data.batch_size": 256, "train.steps": 300_000,
            "train.log_every": 1000, "train.eval_every": 20_000,
            "train.checkpoint_every": 10_000, **_base_data(data_source)}
    size, lrs, warmups = "base", [1e-4, 3e-4, 1e-3], {"0": 0, "10pct": 30_000}
  else:
    raise ValueError(f"scale={scale!r}; choose from {SCALES}")
  finetune = ((FinetuneJob("glue/mrpc", seeds=5, run="full"),  # Xiong et al.'s two tasks
               FinetuneJob("glue/rte", seeds=5, run="full")) if scale == "base" else ())

  def point(v):
    return PointSpec(f"size={size},objective=mlm,norm={v['norm']}",
                     {**base, "optim.learning_rate": v["lr"],
                      "optim.warmup_steps": warmups[v["warmup"]]}, finetune)

  return Grid("norm_lr_warmup", "post-LN vs pre-LN: learning rate x warm-up", expand(
      {"lr": lrs, "warmup": list(warmups), "norm": ["post", "pre"]}, point),
      anchor=NORM_ANCHOR, curve_keys=("mlm_loss",), facet=("lr", "warmup"),
      # demo: the unigram plateau sits at 6.65-7.0 nats (rows of 128 / 64 tokens); a model
      # that has not left it by the end is "stalled"
      stall_loss=6.6 if scale == "demo" else None)


GRIDS: dict[str, Callable[..., Grid]] = {
    "electra_vs_mlm": electra_vs_mlm,
    "nsp_formats": nsp_formats,
    "norm_lr_warmup": norm_lr_warmup,
}


def get_grid(name: str, scale: str = "demo", data_source: str = "") -> Grid:
  if name not in GRIDS:
    raise ValueError(f"--grid={name!r}; choose one of {sorted(GRIDS)}.")
  return GRIDS[name](scale, data_source)
