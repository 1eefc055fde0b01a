"""Grids as code: a grid is a list of points, a point is one pre-training config plus the
fine-tuning jobs that score its checkpoint.

A point names its pre-training run exactly as a user would on the command line
(`configs/pretrain.py:<arg>` plus `--config.<key>=<value>` overrides), so every point can be
re-run by hand, launched on a pod, or executed by experiments.runner with the same meaning.

  grid = Grid(name="demo", title="...", points=expand(
      dict(objective=["mlm", "electra"], norm=["post", "pre"]),
      lambda v: PointSpec(pretrain_arg=f"size=tiny,objective={v['objective']},norm={v['norm']}")))
  [p.name for p in grid.points]   # ['objective=mlm,norm=post', 'objective=mlm,norm=pre', ...]

FLOPs: every point carries its analytic training FLOPs per step (encoder_jax.train.flops, the
same counter the trainer logs), so grids can be set at equal compute (ELECTRA's protocol) and
reports put FLOPs, not steps, on the x-axis.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any, Callable, Mapping, Sequence


def vocab_size_of(vocab: str) -> int:
  """The number of ids of a `data.vocab` spec, without building it: "minilm" (BERT uncased)
  30,522, "demo[:<size>]" its size (default 8192), a vocab.txt path its line count."""
  # The sizes are the package's constants, imported here: experiments.run imports this module
  # before it may import JAX.
  if vocab == "minilm":
    from encoder_jax.model.config import BERT_VOCAB_SIZE
    return BERT_VOCAB_SIZE
  if vocab == "demo" or vocab.startswith("demo:"):
    from encoder_jax.data.vocab import DEMO_VOCAB_SIZE
    return int(vocab.partition(":")[2] or DEMO_VOCAB_SIZE)
  with open(vocab, encoding="utf-8") as f:
    return sum(1 for _ in f)


@dataclasses.dataclass(frozen=True)
class FinetuneJob:
  """Fine-tune the point's final checkpoint on `task` with `seeds` seeds.

  `run` is configs/finetune.py's preset (small: 2,000 training rows, 2 epochs); overrides are
  `--config.<key>=<value>` flags on top of it. `at_fraction` < 1 fine-tunes the checkpoint
  written at that fraction of the point's steps instead (a learning curve's downstream score):
  the point must save and keep it (train.checkpoint_every and train.keep; see `step_of`).
  """
  task: str
  seeds: int = 5
  run: str = "small"
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  at_fraction: float = 1.0

  def __post_init__(self):
    if not 0 < self.at_fraction <= 1:
      raise ValueError(f"FinetuneJob({self.task!r}).at_fraction={self.at_fraction}: give a "
                       "fraction of the pre-training steps in (0, 1].")

  @property
  def key(self) -> str:
    """The job's name in reports: the task, and the fraction when not the final checkpoint."""
    name = self.task.replace("/", "_")
    return name if self.at_fraction == 1 else f"{name}_at{self.at_fraction:g}"

  @property
  def dirname(self) -> str:
    return "ft_" + self.key

  def step_of(self, point: "Point") -> int:
    """The checkpoint step this job fine-tunes: 0 (the newest good one) at fraction 1, else
    `at_fraction` of the point's steps, which must be a multiple of its checkpoint_every."""
    if self.at_fraction == 1:
      return 0
    step = round(point.steps * self.at_fraction)
    every = point.overrides.get("train.checkpoint_every", 0)
    if not every or step % every:
      raise ValueError(f"point {point.name}: fine-tuning at {self.at_fraction:g} of "
                       f"{point.steps} steps needs a checkpoint at step {step}; set "
                       f"train.checkpoint_every to a divisor of it (now {every}).")
    return step


@dataclasses.dataclass(frozen=True)
class PointSpec:
  """What a grid function returns for one combination of axis values."""
  pretrain_arg: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  finetune: Sequence[FinetuneJob] = ()


@dataclasses.dataclass(frozen=True)
class Point:
  name: str  # unique in its grid; also its directory name under the grid's workdir
  labels: Mapping[str, str]  # axis -> value, in axis order (the table's first columns)
  pretrain_arg: str
  overrides: Mapping[str, Any]
  finetune: tuple[FinetuneJob, ...]
  flops_per_step: float
  steps: int

  @property
  def total_flops(self) -> float:
    return self.flops_per_step * self.steps

  def pretrain_flags(self) -> list[str]:
    """The `--config=... --config.k=v` flags of encoder_jax.main for this point."""
    return [f"--config=configs/pretrain.py:{self.pretrain_arg}"] + [
        f"--config.{k}={_flag_value(v)}" for k, v in self.overrides.items()]

  def config(self):
    """The resolved pre-training ConfigDict (what encoder_jax.main would build)."""
    return resolve_config(self.pretrain_arg, self.overrides)


@dataclasses.dataclass(frozen=True)
class Grid:
  name: str
  title: str
  points: tuple[Point, ...]
  anchor: str = ""  # the published finding the grid reproduces (markdown, for the report)
  # Metrics plotted against FLOPs, first one present per point (MLM runs log mlm_loss,
  # ELECTRA's generator gen_loss, Replace-MLM's discriminator main_loss, ...).
  curve_keys: tuple[str, ...] = ("mlm_loss",)
  facet: tuple[str, ...] = ()  # axes that split the loss plot into panels (the rest = lines)
  stall_loss: float | None = None  # final eval curve value at/above this = "stalled"
  # Report the held-out curve loss and its exp, the perplexity RoBERTa's Table 3 reports, in
  # the tables (over pre-training seeds and the differences too) and along the run in a plot.
  perplexity: bool = False

  def __post_init__(self):
    names = [p.name for p in self.points]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
      raise ValueError(f"grid {self.name!r}: duplicate point names {dup}; give the axes "
                       "distinct values.")

  def select(self, pattern: str) -> tuple[Point, ...]:
    """Points whose name matches the regular expression (search, not full match)."""
    if not pattern:
      return self.points
    out = tuple(p for p in self.points if re.search(pattern, p.name))
    if not out:
      raise ValueError(f"--only={pattern!r} matches no point of grid {self.name!r}; points: "
                       f"{[p.name for p in self.points]}")
    return out


def _flag_value(v: Any) -> str:
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, float):
    return repr(v)
  return str(v)


def resolve_config(pretrain_arg: str, overrides: Mapping[str, Any]):
  """configs/pretrain.py's ConfigDict for `pretrain_arg` with dotted overrides applied."""
  import importlib.util
  import os
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "configs", "pretrain.py")
  spec = importlib.util.spec_from_file_location("_pretrain_config", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config(pretrain_arg)
  for key, value in overrides.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    if leaf not in node:
      raise ValueError(f"override {key}={value!r}: no such config field.")
    node[leaf] = value
  return config


def flops_per_step(config, vocab_size: int | None = None) -> float:
  """Analytic training FLOPs of one step of `config` (exactly what the trainer logs); the
  vocabulary size defaults to that of `config.data.vocab`."""
  from encoder_jax.objectives.pretraining import ObjectiveConfig, default_max_predictions
  from encoder_jax.train import flops as flops_lib
  from encoder_jax.train.setup import model_config
  cfg = model_config(config, vocab_size or vocab_size_of(config.data.vocab))
  o = config.objective
  max_pred = o.max_predictions or default_max_predictions(o.objective, o.mask_rate,
                                                          config.data.max_length)
  gen = ObjectiveConfig(objective=o.objective, gen_hidden_frac=o.gen_hidden_frac,
                        gen_layers_frac=o.gen_layers_frac).generator_config(cfg)
  return flops_lib.train_flops_per_step(
      cfg, batch_size=config.data.batch_size, seq_len=config.data.max_length,
      objective=o.objective, max_predictions=max_pred, sparse_mlm=True,
      nsp=o.sentence_task != "none", generator=gen)


def steps_for_budget(config, flops_budget: float) -> int:
  """Steps of `config` that spend `flops_budget` (rounded up, as the trainer does)."""
  return math.ceil(flops_budget / flops_per_step(config))


def make_point(labels: Mapping[str, str], spec: PointSpec) -> Point:
  config = resolve_config(spec.pretrain_arg, spec.overrides)
  fps = flops_per_step(config)
  steps = config.train.steps or math.ceil(config.train.flops_budget / fps)
  name = ",".join(f"{k}={v}" for k, v in labels.items()) or "default"
  if not re.fullmatch(r"[A-Za-z0-9_.,=+-]+", name):
    raise ValueError(f"point name {name!r} must be usable as a directory name; use axis "
                     "values made of letters, digits and _ . , = + -")
  return Point(name=name, labels=dict(labels), pretrain_arg=spec.pretrain_arg,
               overrides=dict(spec.overrides), finetune=tuple(spec.finetune),
               flops_per_step=fps, steps=int(steps))


def expand(axes: Mapping[str, Sequence[Any]],
           point_fn: Callable[[dict[str, Any]], PointSpec | None]) -> tuple[Point, ...]:
  """The cartesian product of `axes` (first axis slowest), one Point per combination;
  `point_fn` may return None to leave a combination out (e.g. NSP with a no-pair format)."""
  if not axes:
    raise ValueError("a grid needs at least one axis")
  for k, values in axes.items():
    if not values:
      raise ValueError(f"axis {k!r} has no values")
  keys = list(axes)
  points = []
  for combo in itertools.product(*(axes[k] for k in keys)):
    values = dict(zip(keys, combo))
    spec = point_fn(values)
    if spec is not None:
      points.append(make_point({k: _label(v) for k, v in values.items()}, spec))
  return tuple(points)


def with_overrides(grid: Grid, extra: Mapping[str, Any], *, name: str) -> Grid:
  """The same grid with `extra` config overrides on every point (a variant of a grid: longer
  runs, another batch size, ...), named `name` so its runs and report stay apart."""
  points = tuple(make_point(p.labels, PointSpec(p.pretrain_arg, {**p.overrides, **extra},
                                                p.finetune)) for p in grid.points)
  return dataclasses.replace(grid, name=name, points=points,
                             title=f"{grid.title} ["
                                   f"{', '.join(f'{k}={v}' for k, v in extra.items())}]")


def parse_override(text: str) -> tuple[str, Any]:
  """'optim.learning_rate=1e-3' -> ('optim.learning_rate', 0.001): Python literals, else str."""
  import ast
  key, sep, value = text.partition("=")
  if not sep or not key:
    raise ValueError(f"--override={text!r}: expected KEY=VALUE, e.g. train.steps=600")
  try:
    return key, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key, value


def _label(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:g}"
  return str(v)
